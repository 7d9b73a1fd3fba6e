//! `plaza bench restart`: how long `plaza serve --data-dir` takes to come back
//! with many rooms whose histories are full, and whether it comes back with
//! everything.
//!
//! It starts `plaza serve --data-dir DIR --fsync MODE`, creates `rooms` rooms
//! with `options.history_size = history` over the HTTP API, and then, once
//! per stop (`--stops term,kill` by default):
//!
//! 1. fills every room's history: `history` server-API publishes per room
//!    (`POST /v1/rooms/{id}/publish`, one room at a time per caller,
//!    `concurrency` callers), and reads every room's seq;
//! 2. stops the server (SIGTERM and waits for it to exit, or SIGKILL);
//! 3. starts it again on the same directory and times, from the spawn, the
//!    first `/readyz` 200 and the moment every room has answered
//!    `GET /v1/rooms/{id}/history?last=1` with the seq it had before the
//!    stop (a different seq is a failure: something acknowledged was lost,
//!    or something was added);
//! 4. reads every room's whole history (untimed) and checks that it holds the
//!    last `history` publishes, gap-free.
//!
//! The data directory's size on disk is taken before the stop, after it, and
//! after every room has been loaded again.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::os::unix::fs::MetadataExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use clap::{Args, ValueEnum};
use serde::Serialize;
use serde_json::{json, Value};

/// Restart-to-ready time of `plaza serve --data-dir` with full room histories.
#[derive(Args, Debug, Clone)]
pub struct RestartArgs {
    /// The data directory: must not exist yet, or be empty. Left in place
    /// afterwards (its size is in the report).
    #[arg(long)]
    pub data_dir: PathBuf,
    /// Rooms to create.
    #[arg(long, default_value_t = 1000)]
    pub rooms: usize,
    /// Each room's `options.history_size`, and the publishes per room in each
    /// round (so every history is full).
    #[arg(long, default_value_t = 1000)]
    pub history: usize,
    /// Approximate size of each publish's `data` in bytes.
    #[arg(long, default_value_t = 100)]
    pub payload_bytes: usize,
    /// `--fsync` for the server: always, interval or off.
    #[arg(long, default_value = "always")]
    pub fsync: String,
    /// Stops to measure, in order, each after a fill: term (SIGTERM, waiting
    /// for the exit) or kill (SIGKILL).
    #[arg(long, value_enum, value_delimiter = ',', default_value = "term,kill")]
    pub stops: Vec<Stop>,
    /// Where the server listens.
    #[arg(long, default_value = "127.0.0.1:7790")]
    pub listen: SocketAddr,
    /// HTTP calls in flight at once (fill and checks).
    #[arg(long, default_value_t = 64)]
    pub concurrency: usize,
    /// The plaza binary (default: this executable).
    #[arg(long)]
    pub plaza: Option<PathBuf>,
    /// Pin the server to these CPUs (e.g. 0), set at every spawn.
    #[arg(long, value_name = "LIST")]
    pub server_cpus: Option<String>,
    /// Pin this process to these CPUs (e.g. 1).
    #[arg(long, value_name = "LIST")]
    pub generator_cpus: Option<String>,
    /// Also write the report as JSON to this file.
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// More arguments for `plaza serve` (after `--`).
    #[arg(last = true)]
    pub serve_args: Vec<String>,
}

/// How the server is stopped before a restart.
#[derive(ValueEnum, Serialize, Debug, Clone, Copy, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum Stop {
    /// SIGTERM, then wait for the process to exit (a clean shutdown).
    Term,
    /// SIGKILL (a crash).
    Kill,
}

/// What one `plaza bench restart` measured.
#[derive(Serialize, Debug, Clone)]
pub struct RestartReport {
    /// Rooms created.
    pub rooms: usize,
    /// Their `history_size`, and publishes per room per round.
    pub history: usize,
    /// Approximate `data` bytes per publish.
    pub payload_bytes: usize,
    /// The server's `--fsync`.
    pub fsync: String,
    /// Spawn to the first `/readyz` 200 of the first start (empty directory), ms.
    pub first_ready_ms: f64,
    /// One per stop, in order.
    pub rounds: Vec<Round>,
    /// Whether every room came back at its seq with its whole history, every time.
    pub passed: bool,
}

/// One fill, stop and restart.
#[derive(Serialize, Debug, Clone)]
pub struct Round {
    /// How the server was stopped.
    pub stop: Stop,
    /// Publishes made in the fill.
    pub publishes: u64,
    /// The fill's duration, s.
    pub fill_s: f64,
    /// Publishes per second in the fill.
    pub fill_per_s: f64,
    /// Publish answer times in the fill, ms: p50, p99, max.
    pub fill_answer_ms: [f64; 3],
    /// Bytes on disk (allocated blocks) of the data directory before the stop.
    pub disk_before_stop: u64,
    /// The same after the process has exited.
    pub disk_after_stop: u64,
    /// The same once every room has answered after the restart.
    pub disk_after_restart: u64,
    /// Apparent size (file lengths) before the stop.
    pub apparent_before_stop: u64,
    /// From the signal to the process's exit, ms.
    pub stop_ms: f64,
    /// From the spawn to the first `/readyz` 200, ms.
    pub ready_ms: f64,
    /// From the spawn to the last room's answer with its seq, ms.
    pub all_rooms_ms: f64,
    /// The slowest single room answer after `/readyz`, ms.
    pub slowest_room_ms: f64,
    /// The directory's files once every room has answered: name, bytes on disk.
    pub files_after_restart: Vec<(String, u64)>,
    /// The server's RSS once every room has answered, KiB.
    pub rss_kib: Option<u64>,
    /// Rooms that answered another seq than before the stop.
    pub seq_mismatches: usize,
    /// Rooms whose history after the restart was not the last `history`
    /// publishes, gap-free.
    pub history_mismatches: usize,
    /// The first few problems, for the console.
    pub problems: Vec<String>,
}

/// The server process under test.
struct Server {
    child: Child,
    spawned: Instant,
}

/// What the rounds share: where and how to reach and start the server.
struct Setup {
    args: RestartArgs,
    plaza: PathBuf,
    server_cpus: Option<Vec<usize>>,
    http: reqwest::Client,
    base: String,
    api_key: Option<String>,
    room_ids: Vec<String>,
}

/// Runs `plaza bench restart` and prints its report; the exit status is 0
/// when every check held, 1 when one failed, 2 when it could not run.
pub fn main(args: RestartArgs) -> std::process::ExitCode {
    match run(args) {
        Ok(report) => {
            println!("{}", markdown(&report));
            if report.passed {
                std::process::ExitCode::SUCCESS
            } else {
                std::process::ExitCode::from(1)
            }
        }
        Err(e) => {
            eprintln!("plaza bench restart: {e}");
            std::process::ExitCode::from(2)
        }
    }
}

/// Runs the measurement (see the module's notes) and returns its report,
/// written to `--out` as JSON too.
pub fn run(args: RestartArgs) -> Result<RestartReport, String> {
    if args.rooms == 0 || args.history == 0 || args.concurrency == 0 || args.stops.is_empty() {
        return Err(
            "--rooms, --history, --concurrency and --stops must not be zero or empty".into(),
        );
    }
    if std::fs::read_dir(&args.data_dir).is_ok_and(|mut d| d.next().is_some()) {
        return Err(format!(
            "--data-dir {} is not empty: give a new directory",
            args.data_dir.display()
        ));
    }
    if let Some(list) = &args.generator_cpus {
        let cpus =
            crate::cpucap::parse_cpu_list(list).map_err(|e| format!("--generator-cpus: {e}"))?;
        crate::cpucap::set_affinity(0, &cpus)
            .map_err(|e| format!("--generator-cpus {list}: {e}"))?;
    }
    let server_cpus = args
        .server_cpus
        .as_deref()
        .map(crate::cpucap::parse_cpu_list)
        .transpose()
        .map_err(|e| format!("--server-cpus: {e}"))?;
    let plaza = match &args.plaza {
        Some(p) => p.clone(),
        None => std::env::current_exe().map_err(|e| e.to_string())?,
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(args.concurrency)
        .timeout(Duration::from_secs(60))
        .build()
        .map_err(|e| e.to_string())?;
    let setup = Setup {
        base: format!("http://{}", args.listen),
        room_ids: (0..args.rooms).map(|i| format!("restart-{i:05}")).collect(),
        api_key: std::env::var("PLAZA_API_KEY")
            .ok()
            .filter(|k| !k.is_empty()),
        plaza,
        server_cpus,
        http,
        args,
    };
    let report = rt.block_on(measure(&setup))?;
    if let Some(path) = &setup.args.out {
        let text = serde_json::to_string_pretty(&report).map_err(|e| e.to_string())?;
        std::fs::write(path, text).map_err(|e| format!("{}: {e}", path.display()))?;
    }
    Ok(report)
}

async fn measure(s: &Setup) -> Result<RestartReport, String> {
    let mut server = s.spawn()?;
    let first_ready = s.wait_ready(&mut server).await?;
    let created = s
        .for_each_room(|id| async move {
            let body = json!({"id": id, "options": {"history_size": s.args.history}});
            s.call(reqwest::Method::POST, "/v1/rooms", Some(body))
                .await
                .map(drop)
        })
        .await;
    if let Some(e) = created.into_iter().find_map(Result::err) {
        return Err(format!("creating the rooms: {e}"));
    }
    let mut rounds = Vec::new();
    for &stop in &s.args.stops {
        let (round, next) = s.round(server, stop).await?;
        server = next;
        rounds.push(round);
    }
    s.stop(server, Stop::Term).await;
    let passed = rounds
        .iter()
        .all(|r| r.seq_mismatches == 0 && r.history_mismatches == 0);
    Ok(RestartReport {
        rooms: s.args.rooms,
        history: s.args.history,
        payload_bytes: s.args.payload_bytes,
        fsync: s.args.fsync.clone(),
        first_ready_ms: ms(first_ready),
        rounds,
        passed,
    })
}

impl Setup {
    /// One fill, stop and restart; returns the restarted server.
    async fn round(&self, server: Server, stop: Stop) -> Result<(Round, Server), String> {
        let (publishes, fill, answers) = self.fill().await?;
        let before = self.seqs().await?;
        let (disk_before_stop, apparent_before_stop) = disk_usage(&self.args.data_dir);
        let stop_took = self.stop(server, stop).await;
        let (disk_after_stop, _) = disk_usage(&self.args.data_dir);

        let mut server = self.spawn()?;
        let ready = self.wait_ready(&mut server).await?;
        let now = self.seqs().await?;
        let all_rooms = server.spawned.elapsed();
        let slowest = now.iter().map(|(_, took)| *took).max().unwrap_or_default();
        let rss_kib = crate::procstat::rss_kib(server.child.id());
        let (disk_after_restart, _) = disk_usage(&self.args.data_dir);

        let mut problems = Vec::new();
        let mut seq_mismatches = 0;
        for ((id, (was, _)), (is, _)) in self.room_ids.iter().zip(&before).zip(&now) {
            if was != is {
                seq_mismatches += 1;
                problems.push(format!("{id}: seq {was} before the stop, {is} after"));
            }
        }
        let history_mismatches = self.check_histories(&before, &mut problems).await;
        problems.truncate(10);
        let ms_at = |q: f64| answers.value_at_quantile(q) as f64 / 1000.0;
        let round = Round {
            stop,
            publishes,
            fill_s: fill.as_secs_f64(),
            fill_per_s: publishes as f64 / fill.as_secs_f64().max(1e-9),
            fill_answer_ms: [ms_at(0.5), ms_at(0.99), answers.max() as f64 / 1000.0],
            disk_before_stop,
            disk_after_stop,
            disk_after_restart,
            apparent_before_stop,
            stop_ms: ms(stop_took),
            ready_ms: ms(ready),
            all_rooms_ms: ms(all_rooms),
            slowest_room_ms: ms(slowest),
            files_after_restart: files(&self.args.data_dir),
            rss_kib,
            seq_mismatches,
            history_mismatches,
            problems,
        };
        Ok((round, server))
    }

    /// `history` publishes into every room, one at a time per room; the
    /// count, the duration and the answer times (µs).
    async fn fill(&self) -> Result<(u64, Duration, hdrhistogram::Histogram<u64>), String> {
        let answers = Arc::new(Mutex::new(
            hdrhistogram::Histogram::<u64>::new(3).map_err(|e| e.to_string())?,
        ));
        let pad = "x".repeat(self.args.payload_bytes.saturating_sub(16));
        let started = Instant::now();
        let results = self
            .for_each_room(|id| {
                let (answers, pad) = (answers.clone(), pad.as_str());
                async move {
                    let path = format!("/v1/rooms/{id}/publish");
                    for i in 0..self.args.history {
                        let body = json!({"event": "fill", "data": {"i": i, "p": pad}});
                        let t = Instant::now();
                        self.call(reqwest::Method::POST, &path, Some(body)).await?;
                        let us = t.elapsed().as_micros() as u64;
                        let _ = answers
                            .lock()
                            .unwrap_or_else(|p| p.into_inner())
                            .record(us.max(1));
                    }
                    Ok::<_, String>(())
                }
            })
            .await;
        let took = started.elapsed();
        if let Some(e) = results.into_iter().find_map(Result::err) {
            return Err(format!("filling the rooms: {e}"));
        }
        let answers = std::mem::replace(
            &mut *answers.lock().unwrap_or_else(|p| p.into_inner()),
            hdrhistogram::Histogram::new(3).map_err(|e| e.to_string())?,
        );
        Ok((
            (self.room_ids.len() * self.args.history) as u64,
            took,
            answers,
        ))
    }

    /// Every room's seq (`history?last=1`), in room order, with how long
    /// its answer took.
    async fn seqs(&self) -> Result<Vec<(u64, Duration)>, String> {
        let results = self
            .for_each_room(|id| async move {
                let t = Instant::now();
                let v = self
                    .call(
                        reqwest::Method::GET,
                        &format!("/v1/rooms/{id}/history?last=1"),
                        None,
                    )
                    .await?;
                let seq = v["seq"]
                    .as_u64()
                    .ok_or_else(|| format!("{id}: no seq in {v}"))?;
                let last = v["events"][0]["seq"].as_u64();
                if last != Some(seq) {
                    return Err(format!("{id}: room seq {seq}, its last event's {last:?}"));
                }
                Ok((seq, t.elapsed()))
            })
            .await;
        results.into_iter().collect()
    }

    /// Checks that every room's history is its last `history` events, ending
    /// at the seq it had before the stop, gap-free; the rooms where not.
    async fn check_histories(
        &self,
        before: &[(u64, Duration)],
        problems: &mut Vec<String>,
    ) -> usize {
        let last = self.args.history.min(10_000);
        let found = self
            .for_each_room(|id| async move {
                let v = self
                    .call(
                        reqwest::Method::GET,
                        &format!("/v1/rooms/{id}/history?last={last}"),
                        None,
                    )
                    .await?;
                let seqs: Vec<u64> = v["events"]
                    .as_array()
                    .map(|a| a.iter().filter_map(|e| e["seq"].as_u64()).collect())
                    .unwrap_or_default();
                Ok::<_, String>(seqs)
            })
            .await;
        let mut bad = 0;
        for ((id, (was, _)), seqs) in self.room_ids.iter().zip(before).zip(found) {
            let expected: Vec<u64> = ((was + 1).saturating_sub(last as u64)..=*was).collect();
            match seqs {
                Ok(seqs) if seqs == expected => {}
                Ok(seqs) => {
                    bad += 1;
                    problems.push(format!(
                        "{id}: history has {} events, {:?}..{:?}; expected {last} ending at {was}",
                        seqs.len(),
                        seqs.first(),
                        seqs.last()
                    ));
                }
                Err(e) => {
                    bad += 1;
                    problems.push(e);
                }
            }
        }
        bad
    }

    /// Runs `work` for every room id, `concurrency` at a time; the results
    /// in room order.
    async fn for_each_room<'a, F, Fut, T>(&'a self, work: F) -> Vec<Result<T, String>>
    where
        F: Fn(&'a str) -> Fut,
        Fut: std::future::Future<Output = Result<T, String>> + 'a,
    {
        let next = AtomicUsize::new(0);
        let results: Mutex<Vec<Option<Result<T, String>>>> =
            Mutex::new((0..self.room_ids.len()).map(|_| None).collect());
        let worker = || async {
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some(id) = self.room_ids.get(i) else {
                    return;
                };
                let r = work(id).await;
                results.lock().unwrap_or_else(|p| p.into_inner())[i] = Some(r);
            }
        };
        let workers: Vec<_> = (0..self.args.concurrency).map(|_| worker()).collect();
        join_all(workers).await;
        results
            .into_inner()
            .unwrap_or_else(|p| p.into_inner())
            .into_iter()
            .map(|r| r.unwrap_or_else(|| Err("not run".into())))
            .collect()
    }

    /// One HTTP call; its JSON answer, or an error naming the call.
    async fn call(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<Value>,
    ) -> Result<Value, String> {
        let mut req = self
            .http
            .request(method.clone(), format!("{}{path}", self.base));
        if let Some(key) = &self.api_key {
            req = req.bearer_auth(key);
        }
        if let Some(body) = body {
            req = req.json(&body);
        }
        let what = || format!("{method} {path}");
        let resp = req.send().await.map_err(|e| format!("{}: {e}", what()))?;
        let status = resp.status();
        let text = resp.text().await.map_err(|e| format!("{}: {e}", what()))?;
        if !status.is_success() {
            return Err(format!("{}: {status} {text}", what()));
        }
        serde_json::from_str(&text).map_err(|e| format!("{}: {e}", what()))
    }

    /// Starts `plaza serve` on the data directory.
    fn spawn(&self) -> Result<Server, String> {
        let mut cmd = Command::new(&self.plaza);
        cmd.arg("serve")
            .arg("--listen")
            .arg(self.args.listen.to_string())
            .arg("--data-dir")
            .arg(&self.args.data_dir)
            .arg("--fsync")
            .arg(&self.args.fsync)
            .args(&self.args.serve_args)
            .env(
                "PLAZA_LOG",
                std::env::var("PLAZA_LOG").unwrap_or_else(|_| "warn".into()),
            )
            .stdin(Stdio::null())
            .stdout(Stdio::null());
        if let Some(cpus) = self.server_cpus.clone() {
            // SAFETY: only sched_setaffinity (async-signal-safe) runs between
            // fork and exec.
            unsafe {
                cmd.pre_exec(move || crate::cpucap::set_affinity(0, &cpus));
            }
        }
        let spawned = Instant::now();
        let child = cmd
            .spawn()
            .map_err(|e| format!("cannot start {}: {e}", self.plaza.display()))?;
        Ok(Server { child, spawned })
    }

    /// Polls `/readyz` until it answers 200; the time since the spawn.
    async fn wait_ready(&self, server: &mut Server) -> Result<Duration, String> {
        let url = format!("{}/readyz", self.base);
        loop {
            if let Ok(r) = self.http.get(&url).send().await {
                if r.status().is_success() {
                    return Ok(server.spawned.elapsed());
                }
            }
            if let Ok(Some(status)) = server.child.try_wait() {
                return Err(format!("plaza serve exited ({status}) before it was ready"));
            }
            if server.spawned.elapsed() > Duration::from_secs(300) {
                return Err("plaza serve was not ready within 300 s".into());
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }

    /// Stops the server; the time from the signal to its exit.
    async fn stop(&self, mut server: Server, stop: Stop) -> Duration {
        let signal = match stop {
            Stop::Term => libc::SIGTERM,
            Stop::Kill => libc::SIGKILL,
        };
        let t = Instant::now();
        // SAFETY: kill(2) on our own child, not yet reaped.
        unsafe {
            libc::kill(server.child.id() as i32, signal);
        }
        let _ = tokio::task::spawn_blocking(move || server.child.wait()).await;
        t.elapsed()
    }
}

/// Awaits every future, polled together on this task.
async fn join_all<F: std::future::Future<Output = ()>>(futures: Vec<F>) {
    let mut pending: VecDeque<_> = futures.into_iter().map(Box::pin).collect();
    std::future::poll_fn(move |cx| {
        pending.retain_mut(|f| f.as_mut().poll(cx).is_pending());
        if pending.is_empty() {
            std::task::Poll::Ready(())
        } else {
            std::task::Poll::Pending
        }
    })
    .await;
}

/// Bytes of the directory's files: allocated on disk (blocks), and apparent
/// (lengths).
pub fn disk_usage(dir: &Path) -> (u64, u64) {
    let mut on_disk = 0;
    let mut apparent = 0;
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let Ok(meta) = entry.metadata() else { continue };
        if meta.is_dir() {
            let (d, a) = disk_usage(&entry.path());
            on_disk += d;
            apparent += a;
        } else {
            on_disk += meta.blocks() * 512;
            apparent += meta.len();
        }
    }
    (on_disk, apparent)
}

/// The directory's files (not its subdirectories): name and bytes on disk, by name.
fn files(dir: &Path) -> Vec<(String, u64)> {
    let mut out: Vec<_> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let meta = e.metadata().ok().filter(|m| m.is_file())?;
            Some((
                e.file_name().to_string_lossy().into_owned(),
                meta.blocks() * 512,
            ))
        })
        .collect();
    out.sort();
    out
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

fn mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / (1024.0 * 1024.0))
}

/// The report as Markdown, for the console.
pub fn markdown(r: &RestartReport) -> String {
    use std::fmt::Write;
    let mut s = String::new();
    let _ = writeln!(
        s,
        "## plaza bench restart: {} rooms, history_size {}, ~{} bytes per publish, --fsync {}\n",
        r.rooms, r.history, r.payload_bytes, r.fsync
    );
    let _ = writeln!(
        s,
        "First start (empty directory): ready in {:.1} ms.\n",
        r.first_ready_ms
    );
    let _ = writeln!(
        s,
        "| stop | fill: publishes/s (answer p50 / p99 / max ms) | data dir before stop (apparent) | stop took | after stop | spawn → /readyz 200 | spawn → every room at its seq | slowest room | data dir after restart | RSS after | per room | seq / history mismatches |"
    );
    let _ = writeln!(s, "|---|---|---|---|---|---|---|---|---|---|---|---|");
    for x in &r.rounds {
        let _ = writeln!(
            s,
            "| {:?} | {:.0} ({:.2} / {:.2} / {:.1}) | {} ({}) | {:.0} ms | {} | {:.0} ms | {:.0} ms | {:.1} ms | {} | {} | {:.0} KiB | {} / {} |",
            x.stop,
            x.fill_per_s,
            x.fill_answer_ms[0],
            x.fill_answer_ms[1],
            x.fill_answer_ms[2],
            mib(x.disk_before_stop),
            mib(x.apparent_before_stop),
            x.stop_ms,
            mib(x.disk_after_stop),
            x.ready_ms,
            x.all_rooms_ms,
            x.slowest_room_ms,
            mib(x.disk_after_restart),
            x.rss_kib.map_or("?".into(), |k| mib(k * 1024)),
            x.disk_after_restart as f64 / 1024.0 / r.rooms as f64,
            x.seq_mismatches,
            x.history_mismatches,
        );
    }
    for x in &r.rounds {
        let files: Vec<String> = x
            .files_after_restart
            .iter()
            .map(|(name, bytes)| format!("{name} {}", mib(*bytes)))
            .collect();
        let _ = writeln!(
            s,
            "- {:?}: files after the restart: {}",
            x.stop,
            files.join(", ")
        );
    }
    for x in &r.rounds {
        for p in &x.problems {
            let _ = writeln!(s, "- {:?}: {p}", x.stop);
        }
    }
    let _ = writeln!(
        s,
        "\n{}",
        if r.passed {
            "Every room came back at its seq with its whole history."
        } else {
            "FAILED: some room came back with another seq or history."
        }
    );
    s
}
