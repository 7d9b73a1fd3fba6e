//! One run spread over several load processes, for more connections than
//! one process may open (20,000 files per process on these machines) or more
//! traffic than one generator thread receives.
//!
//! The parent starts `count` copies of `plaza bench run` with `--shard I/N`
//! and a common start instant. Each child runs its share of the users (see
//! [`Shard`]) and talks to the parent in lines: on stdout
//! `plaza-bench-joined N` whenever its joined count changes and, at the end,
//! `plaza-bench-result {json}` ([`RawRun`]); on stdin the parent writes
//! `everyone-joined` once the children's joined counts add up to every user,
//! which releases their `wait_all_joined` steps. The parent adds up the
//! results.

use std::ffi::OsString;
use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::raw::RawRun;
use crate::runner::Shard;

/// Prefix of a child's joined-count line.
pub const JOINED: &str = "plaza-bench-joined ";
/// Prefix of a child's result line.
pub const RESULT: &str = "plaza-bench-result ";
/// What the parent writes when every user has joined.
pub const EVERYONE_JOINED: &str = "everyone-joined";

/// Child side: the [`Shard`] for the run's options, and a future that
/// forwards this process's joined count to stdout (run it beside the run).
pub fn child_shard(
    index: u64,
    count: u64,
    start_at_unix_ms: u64,
) -> (Shard, impl std::future::Future<Output = ()>) {
    let (joined_tx, mut joined_rx) = tokio::sync::watch::channel(0u64);
    let (all_tx, all_rx) = tokio::sync::watch::channel(false);
    std::thread::spawn(move || {
        for line in std::io::stdin().lock().lines() {
            match line {
                Ok(l) if l.trim() == EVERYONE_JOINED => {
                    all_tx.send_replace(true);
                }
                Ok(_) => {}
                Err(_) => return,
            }
        }
    });
    let forward = async move {
        while joined_rx.changed().await.is_ok() {
            let n = *joined_rx.borrow_and_update();
            println!("{JOINED}{n}");
            // At most 50 lines a second: the parent only needs the total.
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    let shard = Shard {
        index,
        count,
        start_at_unix_ms,
        joined: joined_tx,
        everyone_joined: all_rx,
    };
    (shard, forward)
}

/// Child side: the result line.
pub fn print_result(raw: &RawRun) -> Result<(), String> {
    let json = serde_json::to_string(raw).map_err(|e| e.to_string())?;
    println!("{RESULT}{json}");
    Ok(())
}

/// Parses `I/N`.
pub fn parse_shard(s: &str) -> Result<(u64, u64), String> {
    let (i, n) = s
        .split_once('/')
        .ok_or_else(|| format!("expected I/N, got {s:?}"))?;
    let (i, n) = (
        i.trim().parse::<u64>().map_err(|e| format!("{s:?}: {e}"))?,
        n.trim().parse::<u64>().map_err(|e| format!("{s:?}: {e}"))?,
    );
    if n == 0 || i >= n {
        return Err(format!("{s:?}: need 0 ≤ I < N"));
    }
    Ok((i, n))
}

enum News {
    Joined(usize, u64),
    Result(usize, Box<RawRun>),
}

/// Parent side: runs `exe` with `args` (a `bench run` command line without
/// `--shard`) as `count` processes sharing `users` users, and adds up their
/// results. Children start their schedules together, `lead` from now.
pub fn run_processes(
    exe: &Path,
    args: &[OsString],
    count: u64,
    users: u64,
    lead: Duration,
) -> Result<RawRun, String> {
    let now_ms = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    let start_at = now_ms + lead.as_millis() as u64;
    let (tx, rx) = mpsc::channel::<News>();
    let mut children = Vec::new();
    let mut stdins = Vec::new();
    let mut readers = Vec::new();
    for i in 0..count {
        let mut child = Command::new(exe)
            .args(args)
            .arg("--shard")
            .arg(format!("{i}/{count}"))
            .arg("--start-at-ms")
            .arg(start_at.to_string())
            .arg("--quiet")
            .env("PLAZA_LOG", "warn")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .map_err(|e| format!("cannot start load process {i}: {e}"))?;
        let out = child.stdout.take().ok_or("no stdout")?;
        stdins.push(child.stdin.take().ok_or("no stdin")?);
        children.push(child);
        let tx = tx.clone();
        let index = i as usize;
        readers.push(std::thread::spawn(move || {
            for line in BufReader::new(out).lines() {
                let Ok(line) = line else { return };
                if let Some(n) = line.strip_prefix(JOINED) {
                    if let Ok(n) = n.trim().parse() {
                        let _ = tx.send(News::Joined(index, n));
                    }
                } else if let Some(json) = line.strip_prefix(RESULT) {
                    match serde_json::from_str::<RawRun>(json) {
                        Ok(raw) => {
                            let _ = tx.send(News::Result(index, Box::new(raw)));
                        }
                        Err(e) => eprintln!("load process {index}: bad result line: {e}"),
                    }
                } else {
                    println!("[{index}] {line}");
                }
            }
        }));
    }
    drop(tx);
    let mut joined = vec![0u64; count as usize];
    let mut results: Vec<Option<RawRun>> = vec![None; count as usize];
    let mut told = false;
    // Ends when every child's stdout has closed.
    for news in rx {
        match news {
            News::Joined(i, n) => {
                joined[i] = n;
                if !told && joined.iter().sum::<u64>() >= users {
                    told = true;
                    for stdin in &mut stdins {
                        let _ = writeln!(stdin, "{EVERYONE_JOINED}");
                        let _ = stdin.flush();
                    }
                }
            }
            News::Result(i, raw) => results[i] = Some(*raw),
        }
    }
    for r in readers {
        let _ = r.join();
    }
    let mut merged: Option<RawRun> = None;
    for (i, (mut child, result)) in children.into_iter().zip(results).enumerate() {
        let status = child.wait().map_err(|e| e.to_string())?;
        let raw = result.ok_or_else(|| format!("load process {i} gave no result ({status})"))?;
        match &mut merged {
            Some(m) => m.merge(&raw),
            None => merged = Some(raw),
        }
    }
    merged.ok_or_else(|| "no load process ran".to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shards() {
        assert_eq!(parse_shard("0/2"), Ok((0, 2)));
        assert_eq!(parse_shard(" 3 / 4 "), Ok((3, 4)));
        assert!(parse_shard("2/2").is_err());
        assert!(parse_shard("0/0").is_err());
        assert!(parse_shard("1").is_err());
        assert!(parse_shard("a/2").is_err());
    }

    #[test]
    fn load_processes_that_give_no_result_are_an_error() {
        // `false` ignores its arguments and exits at once without a result line.
        let err = run_processes(Path::new("false"), &[], 2, 10, Duration::ZERO).unwrap_err();
        assert!(err.contains("load process 0 gave no result"), "{err}");
        let err =
            run_processes(Path::new("/nonexistent/plaza"), &[], 1, 1, Duration::ZERO).unwrap_err();
        assert!(err.contains("cannot start load process 0"), "{err}");
    }
}
