//! `plaza bench broker`: how many appends per second a Redis deployment
//! takes through Plaza's own broker ([`plaza_broker::RedisBroker`]), without
//! WebSocket clients or room logic in the way. It is what a cluster's rooms
//! do to Redis: each append is one log entry, published to the node hosting
//! its room.
//!
//! `--nodes` brokers stand for Plaza nodes (each with its own connections
//! and append task). Node `i` hosts the rooms whose index is `i` modulo the
//! node count: it subscribes to them and makes their appends, as a node does
//! for the rooms its members are in. `--in-flight` appends are outstanding
//! at any time, spread over the rooms in turn. Every acknowledged append
//! must come back to its host through the subscription: the run fails when
//! one does not.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use clap::Args;
use hdrhistogram::Histogram;
use plaza_broker::{BrokerAck, Cluster, LogNotice, RedisBroker, RedisConfig};
use serde::Serialize;

use crate::procstat::cpu_time;

/// Bounds of the numbers `plaza bench broker` takes.
const MAX_ROOMS: usize = 1_000_000;
const MAX_IN_FLIGHT: usize = 100_000;
const MAX_NODES: usize = 64;
const MAX_PAYLOAD: usize = 1 << 20;

/// Arguments of `plaza bench broker`.
#[derive(Args, Debug)]
pub struct BrokerArgs {
    /// The Redis deployment: redis://…, redis+sentinel://… or redis+cluster://…
    #[arg(long)]
    redis: String,
    /// Rooms to create and append to (1–1,000,000).
    #[arg(long, default_value_t = 1000)]
    rooms: usize,
    /// Brokers standing for Plaza nodes (1–64).
    #[arg(long, default_value_t = 4)]
    nodes: usize,
    /// Appends outstanding at once, over all nodes (1–100,000).
    #[arg(long, default_value_t = 512)]
    in_flight: usize,
    /// Bytes of each payload (0–1 MiB).
    #[arg(long, default_value_t = 100)]
    payload_bytes: usize,
    /// Seconds measured, after the warm-up.
    #[arg(long, default_value_t = 10)]
    seconds: u64,
    /// Seconds of load before measuring.
    #[arg(long, default_value_t = 2)]
    warmup_seconds: u64,
    /// When an append counts as done: primary or replicas:N.
    #[arg(long, default_value = "primary")]
    broker_ack: BrokerAck,
    /// Processes whose CPU use is reported (e.g. every redis-server), with
    /// their descendants.
    #[arg(long = "cpu-pid", value_delimiter = ',')]
    cpu_pids: Vec<u32>,
    /// Write the report as JSON to this file.
    #[arg(long)]
    out: Option<PathBuf>,
}

/// What a run measured.
#[derive(Debug, Serialize)]
pub struct BrokerReport {
    /// The deployment (without credentials).
    pub redis: String,
    /// Rooms appended to.
    pub rooms: usize,
    /// Brokers standing for nodes.
    pub nodes: usize,
    /// Appends outstanding at once.
    pub in_flight: usize,
    /// Bytes of each payload.
    pub payload_bytes: usize,
    /// When an append counted as done.
    pub broker_ack: String,
    /// Seconds measured.
    pub seconds: f64,
    /// Appends acknowledged in the measured window.
    pub appends: u64,
    /// `appends` per second of the window.
    pub appends_per_s: f64,
    /// Appends that failed in the measured window.
    pub errors: u64,
    /// Latency of acknowledged appends in the window, µs: median.
    pub p50_us: u64,
    /// 99th percentile, µs.
    pub p99_us: u64,
    /// 99.9th percentile, µs.
    pub p999_us: u64,
    /// Longest, µs.
    pub max_us: u64,
    /// CPU use of each `--cpu-pid`, in CPUs (1.0 = one core busy).
    pub cpu: Vec<(u32, f64)>,
    /// Entries acknowledged over the whole run that never reached their
    /// room's host through the subscription (must be 0).
    pub undelivered: u64,
}

/// Runs `plaza bench broker` and prints its report; exit status 0 when
/// every acknowledged append was delivered, 1 when one was not, 2 when the
/// run could not be made.
pub fn main(args: BrokerArgs) -> std::process::ExitCode {
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("plaza bench broker: {e}");
            return std::process::ExitCode::from(2);
        }
    };
    match runtime.block_on(run(args)) {
        Ok(report) => {
            println!("{}", markdown(&report));
            match report.undelivered {
                0 => std::process::ExitCode::SUCCESS,
                _ => std::process::ExitCode::from(1),
            }
        }
        Err(e) => {
            eprintln!("plaza bench broker: {e}");
            std::process::ExitCode::from(2)
        }
    }
}

/// Counts of one phase (warm-up or measured window).
#[derive(Default)]
struct Tally {
    ok: AtomicU64,
    errors: AtomicU64,
}

/// Runs the measurement and returns its report (also written to `--out`).
pub async fn run(args: BrokerArgs) -> Result<BrokerReport, String> {
    check(args.rooms, 1, MAX_ROOMS, "--rooms")?;
    check(args.nodes, 1, MAX_NODES, "--nodes")?;
    check(args.in_flight, 1, MAX_IN_FLIGHT, "--in-flight")?;
    check(args.payload_bytes, 0, MAX_PAYLOAD, "--payload-bytes")?;
    if args.seconds == 0 {
        return Err("--seconds must be at least 1".into());
    }
    let run_id = std::process::id();
    let prefix = format!("bench-{run_id}:");
    let mut nodes = Vec::with_capacity(args.nodes);
    for i in 0..args.nodes {
        let config = RedisConfig::new(&args.redis, format!("bench-{run_id}-{i}"))
            .with_key_prefix(&prefix)
            .with_ack(args.broker_ack);
        let node = RedisBroker::connect_with(config)
            .await
            .map_err(|e| format!("connecting node {i}: {e}"))?;
        nodes.push(node);
    }
    let rooms: Vec<String> = (0..args.rooms).map(|r| format!("r{r}")).collect();
    // Entries each room's host got through its subscription.
    let delivered: Arc<Vec<AtomicU64>> =
        Arc::new(rooms.iter().map(|_| AtomicU64::new(0)).collect());
    create_rooms(&nodes, &rooms, &delivered).await?;

    let payload = Bytes::from(vec![b'x'; args.payload_bytes]);
    let warmup = Arc::new(Tally::default());
    let window = Arc::new(Tally::default());
    let acked: Arc<Vec<AtomicU64>> = Arc::new(rooms.iter().map(|_| AtomicU64::new(0)).collect());
    let latencies = Arc::new(Mutex::new(
        Histogram::<u64>::new_with_bounds(1, 60_000_000, 3).map_err(|e| e.to_string())?,
    ));
    let start = Instant::now();
    let measure_from = start + Duration::from_secs(args.warmup_seconds);
    let end = measure_from + Duration::from_secs(args.seconds);
    let cpu_before = Arc::new(Mutex::new(Vec::new()));
    let next_room = Arc::new(AtomicU64::new(0));
    let mut workers = Vec::with_capacity(args.in_flight);
    for _ in 0..args.in_flight {
        let (nodes, rooms, payload) = (nodes.clone(), rooms.clone(), payload.clone());
        let (warmup, window, acked) = (warmup.clone(), window.clone(), acked.clone());
        let (latencies, next_room) = (latencies.clone(), next_room.clone());
        workers.push(tokio::spawn(async move {
            let mut local = Histogram::<u64>::new_with_bounds(1, 60_000_000, 3).expect("bounds");
            loop {
                let sent = Instant::now();
                if sent >= end {
                    break;
                }
                let r = (next_room.fetch_add(1, Ordering::Relaxed) % rooms.len() as u64) as usize;
                let host = &nodes[r % nodes.len()];
                let result = host.append(&rooms[r], payload.clone()).await;
                let done = Instant::now();
                let measured = sent >= measure_from && done <= end;
                let tally = if measured { &window } else { &warmup };
                match result {
                    Ok(_) => {
                        acked[r].fetch_add(1, Ordering::Relaxed);
                        tally.ok.fetch_add(1, Ordering::Relaxed);
                        if measured {
                            let us = done.duration_since(sent).as_micros() as u64;
                            let _ = local.record(us.max(1));
                        }
                    }
                    Err(_) => {
                        tally.errors.fetch_add(1, Ordering::Relaxed);
                        // An outage: do not spin.
                        tokio::time::sleep(Duration::from_millis(10)).await;
                    }
                }
            }
            let _ = latencies.lock().expect("latencies").add(&local);
        }));
    }
    tokio::time::sleep_until(measure_from.into()).await;
    *cpu_before.lock().expect("cpu") = args.cpu_pids.iter().map(|p| cpu_time(Some(*p))).collect();
    let window_started = Instant::now();
    tokio::time::sleep_until(end.into()).await;
    let cpu_after: Vec<Option<Duration>> =
        args.cpu_pids.iter().map(|p| cpu_time(Some(*p))).collect();
    let measured = window_started.elapsed().as_secs_f64();
    for w in workers {
        w.await.map_err(|e| e.to_string())?;
    }
    let undelivered = wait_for_delivery(&acked, &delivered).await;
    for node in &nodes {
        node.leave().await;
    }
    let cpu = args
        .cpu_pids
        .iter()
        .zip(cpu_before.lock().expect("cpu").iter().zip(cpu_after))
        .map(|(pid, (before, after))| {
            let used = match (before, after) {
                (Some(b), Some(a)) => a.saturating_sub(*b).as_secs_f64() / measured,
                _ => f64::NAN,
            };
            (*pid, used)
        })
        .collect();
    let hist = latencies.lock().expect("latencies");
    let appends = window.ok.load(Ordering::Relaxed);
    let report = BrokerReport {
        redis: without_credentials(&args.redis),
        rooms: args.rooms,
        nodes: args.nodes,
        in_flight: args.in_flight,
        payload_bytes: args.payload_bytes,
        broker_ack: args.broker_ack.to_string(),
        seconds: measured,
        appends,
        appends_per_s: appends as f64 / measured,
        errors: window.errors.load(Ordering::Relaxed),
        p50_us: hist.value_at_quantile(0.5),
        p99_us: hist.value_at_quantile(0.99),
        p999_us: hist.value_at_quantile(0.999),
        max_us: hist.max(),
        cpu,
        undelivered,
    };
    if let Some(out) = &args.out {
        let json = serde_json::to_string_pretty(&report).map_err(|e| e.to_string())?;
        std::fs::write(out, json).map_err(|e| format!("{}: {e}", out.display()))?;
    }
    Ok(report)
}

fn check(value: usize, least: usize, most: usize, name: &str) -> Result<(), String> {
    if (least..=most).contains(&value) {
        return Ok(());
    }
    Err(format!(
        "{name} must be from {least} to {most}, not {value}"
    ))
}

/// Creates every room and subscribes its host to it.
async fn create_rooms(
    nodes: &[Arc<RedisBroker>],
    rooms: &[String],
    delivered: &Arc<Vec<AtomicU64>>,
) -> Result<(), String> {
    use futures_util::StreamExt;
    let results: Vec<Result<(), String>> = futures_util::stream::iter(rooms.iter().enumerate())
        .map(|(r, room)| {
            let host = nodes[r % nodes.len()].clone();
            let delivered = delivered.clone();
            async move {
                host.create_room(room, Bytes::from_static(b"m"), Bytes::from_static(b"s"))
                    .await
                    .map_err(|e| format!("creating {room}: {e}"))?;
                let listener = Arc::new(move |notice: LogNotice| {
                    if let LogNotice::Entry(_) = notice {
                        delivered[r].fetch_add(1, Ordering::Relaxed);
                    }
                });
                host.subscribe(room, listener)
                    .await
                    .map_err(|e| format!("subscribing {room}: {e}"))
            }
        })
        .buffer_unordered(64)
        .collect()
        .await;
    results.into_iter().collect()
}

/// Waits (up to 10 s) until every room's host got at least its acknowledged
/// entries; returns how many are missing then.
async fn wait_for_delivery(acked: &[AtomicU64], delivered: &[AtomicU64]) -> u64 {
    let missing = || -> u64 {
        acked
            .iter()
            .zip(delivered)
            .map(|(a, d)| {
                a.load(Ordering::Relaxed)
                    .saturating_sub(d.load(Ordering::Relaxed))
            })
            .sum()
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut tick = tokio::time::interval(Duration::from_millis(50));
    loop {
        tick.tick().await;
        let left = missing();
        if left == 0 || Instant::now() >= deadline {
            return left;
        }
    }
}

fn without_credentials(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme), Some(at)) if at > scheme => {
            format!("{}{}", &url[..scheme + 3], &url[at + 1..])
        }
        _ => url.to_owned(),
    }
}

/// The report as a Markdown table.
pub fn markdown(r: &BrokerReport) -> String {
    let cpu: Vec<String> = r
        .cpu
        .iter()
        .map(|(pid, cpus)| format!("{pid}: {cpus:.2}"))
        .collect();
    format!(
        "| redis | rooms | nodes | in flight | payload B | broker_ack | appends/s | errors | p50 ms | p99 ms | p99.9 ms | max ms | CPU (CPUs) | undelivered |\n\
         |---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n\
         | {} | {} | {} | {} | {} | {} | {:.0} | {} | {:.2} | {:.2} | {:.2} | {:.2} | {} | {} |",
        r.redis,
        r.rooms,
        r.nodes,
        r.in_flight,
        r.payload_bytes,
        r.broker_ack,
        r.appends_per_s,
        r.errors,
        r.p50_us as f64 / 1000.0,
        r.p99_us as f64 / 1000.0,
        r.p999_us as f64 / 1000.0,
        r.max_us as f64 / 1000.0,
        cpu.join(", "),
        r.undelivered,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn credentials_are_left_out_of_the_report() {
        assert_eq!(
            without_credentials("redis+cluster://u:secret@h1:7000,h2:7000"),
            "redis+cluster://h1:7000,h2:7000"
        );
        assert_eq!(without_credentials("redis://h:6379/"), "redis://h:6379/");
    }

    #[test]
    fn numbers_out_of_bounds_are_refused() {
        assert!(check(0, 1, 10, "--rooms")
            .unwrap_err()
            .contains("from 1 to 10"));
        assert!(check(10, 1, 10, "--rooms").is_ok());
    }
}
