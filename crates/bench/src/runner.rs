//! Runs a scenario against a target: virtual users arrive on schedule, run
//! their flows, and every received message is counted; observers (the first
//! few users of each room) also time what they receive.

use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use hdrhistogram::Histogram;
use tokio::sync::{oneshot, Notify};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::driver::{first_timestamp, Driver, Inbound, JoinSpec};
use crate::procstat;
use crate::raw::{histogram, RawRun};
use crate::report::Report;
use crate::scenario::{Scenario, Step};
use crate::schedule::Schedule;
use crate::session;
use crate::wsclient::{Incoming, WsReader, WsWriter};

/// Where and how to run.
pub struct RunOptions {
    /// The server's address (WebSocket and HTTP).
    pub addr: SocketAddr,
    /// Host header value.
    pub host: String,
    /// The protocol.
    pub driver: Arc<dyn Driver>,
    /// Users per room whose receipts are timestamped.
    pub observers_per_room: u64,
    /// The server's pid, for CPU and memory figures.
    pub server_pid: Option<u32>,
    /// Local addresses to connect from, round robin (empty: the default).
    pub bind: Vec<IpAddr>,
    /// Longest wait for a connect, handshake or response.
    pub timeout: Duration,
    /// Called about once a second with the run's progress.
    pub progress: Option<ProgressFn>,
    /// This process's part when several load processes share the run.
    pub shard: Option<Shard>,
}

/// One of several load processes sharing a run: it runs the users whose
/// index `vu` has `vu % count == index`, on a schedule that starts at the same
/// wall-clock instant in every process. Only joining needs the others: a
/// coordinator adds up the processes' joined counts and says when everyone
/// has joined.
#[derive(Debug, Clone)]
pub struct Shard {
    /// This process's index, `0..count`.
    pub index: u64,
    /// How many processes share the run.
    pub count: u64,
    /// Unix time (ms) at which every process's schedule starts.
    pub start_at_unix_ms: u64,
    /// This process's joined users, as it changes (for the coordinator).
    pub joined: tokio::sync::watch::Sender<u64>,
    /// Becomes true when the users of every process have joined.
    pub everyone_joined: tokio::sync::watch::Receiver<bool>,
}

impl Shard {
    fn runs(&self, vu: u64) -> bool {
        vu % self.count == self.index
    }
}

/// A progress callback.
pub type ProgressFn = Arc<dyn Fn(&Progress) + Send + Sync>;

/// Where a run is, for a live display.
#[derive(Debug, Clone)]
pub struct Progress {
    /// Current phase (`drain` after the last).
    pub phase: String,
    /// Time since the first arrival.
    pub elapsed: Duration,
    /// Length of the whole schedule (drain not included).
    pub total: Duration,
    /// Users joined so far.
    pub joined: u64,
    /// Users scheduled.
    pub users: u64,
    /// Deliveries counted so far.
    pub deliveries: u64,
    /// Errors so far.
    pub errors: u64,
}

/// Why a run could not be carried out at all.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// A setup call failed.
    #[error("setup: {0}")]
    Setup(String),
}

/// Counters shared by every task of a run.
struct Shared {
    opts: RunOptions,
    rooms: u64,
    room_sizes: Vec<u64>,
    /// The phases by name, and how many have started (set after the
    /// recording flag, so a user woken by a phase start acts inside it).
    phase_index: HashMap<String, usize>,
    phases_started: tokio::sync::watch::Sender<usize>,
    /// Per room: how many of its users join each non-main channel.
    channel_sizes: Vec<HashMap<String, u64>>,
    users: u64,
    /// Cancelled when the last phase ends: flows stop acting (no more
    /// publishes), while receivers go on counting what is in flight.
    ending: CancellationToken,
    /// Cancelled after the drain: receivers stop too.
    stop: CancellationToken,
    recording: AtomicBool,
    joined: AtomicU64,
    all_joined: Notify,
    /// Set once every user of the run (of every process) has joined.
    everyone_joined: AtomicBool,
    deliveries: AtomicU64,
    deliveries_rec: AtomicU64,
    expected: AtomicU64,
    expected_rec: AtomicU64,
    bytes_in_rec: AtomicU64,
    bytes_out_rec: AtomicU64,
    publishes: AtomicU64,
    publishes_rec: AtomicU64,
    acks: AtomicU64,
    requests_ok: AtomicU64,
    requests_failed: AtomicU64,
    next_nonce: AtomicU64,
    errors: Mutex<BTreeMap<String, u64>>,
    latency: Mutex<Histogram<u64>>,
    request_rt: Mutex<Histogram<u64>>,
    http_rt: Mutex<Histogram<u64>>,
    http_ok: AtomicU64,
    http_failed: AtomicU64,
    http_calls_rec: AtomicU64,
    http_bytes_out: AtomicU64,
    http_bytes_in: AtomicU64,
    /// Unix µs; `u64::MAX` until the first request.
    http_first_sent: AtomicU64,
    /// Unix µs; 0 until a call ends.
    http_last_done: AtomicU64,
    /// Unix µs; `u64::MAX` until the first publish or request.
    ws_first_sent: AtomicU64,
    /// Unix µs; 0 until a receiver that got messages ends.
    ws_last_received: AtomicU64,
    /// A monotonic instant and the unix time (µs) at that instant.
    anchor: (Instant, u64),
    /// Users of this process whose flows have ended.
    flows_done: tokio::sync::watch::Sender<u64>,
    /// One HTTP client (and connection pool) for every user's calls.
    http: reqwest::Client,
    pending: Mutex<HashMap<u64, oneshot::Sender<bool>>>,
}

impl Shared {
    fn error(&self, kind: impl Into<String>) {
        *self
            .errors
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(kind.into())
            .or_default() += 1;
    }

    fn recording(&self) -> bool {
        self.recording.load(Ordering::Relaxed)
    }

    /// `t` in unix µs, the clock every load process shares. Converted from
    /// the monotonic clock so that a step of the wall clock during the run
    /// does not bend spans.
    fn unix_us(&self, t: Instant) -> u64 {
        let (at, unix) = self.anchor;
        unix + t.saturating_duration_since(at).as_micros() as u64
    }

    /// Notes a WebSocket publish or request about to be sent.
    fn ws_sending(&self) {
        // Only the first send matters; after it this is a plain load rather
        // than a write to a line every sender shares.
        if self.ws_first_sent.load(Ordering::Relaxed) == u64::MAX {
            self.ws_first_sent
                .fetch_min(self.unix_us(Instant::now()), Ordering::Relaxed);
        }
    }

    /// Waits until `at` unless the flows must end first (then false).
    async fn pause_until(&self, at: Instant) -> bool {
        tokio::select! {
            _ = self.ending.cancelled() => false,
            _ = tokio::time::sleep_until(at) => true,
        }
    }
}

fn unix_micros() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64)
}

/// Runs `scenario` and reports what happened.
pub async fn run(scenario: &Scenario, opts: RunOptions) -> Result<Report, RunError> {
    Ok(run_raw(scenario, opts).await?.report(scenario))
}

/// Runs `scenario` and returns this process's counts (for a run shared by
/// several load processes, [`RawRun::merge`] adds them up).
pub async fn run_raw(scenario: &Scenario, opts: RunOptions) -> Result<RawRun, RunError> {
    let schedule = Schedule::new(&scenario.phases);
    let users = schedule.arrivals.len() as u64;
    let mine = |vu: u64| opts.shard.as_ref().is_none_or(|s| s.runs(vu));
    let my_users = (0..users).filter(|&vu| mine(vu)).count() as u64;
    let rooms = scenario.rooms;
    let mut room_sizes = vec![0u64; rooms as usize];
    let mut channel_sizes = vec![HashMap::new(); rooms as usize];
    for vu in 0..users {
        let room = (vu % rooms) as usize;
        room_sizes[room] += 1;
        for ch in joined_channels(&scenario.flow_of(vu / rooms).steps) {
            *channel_sizes[room].entry(ch.clone()).or_insert(0) += 1;
        }
    }
    setup(&opts, scenario).await?;
    // The target is addressed directly: a proxy from the environment would
    // add a hop to what is measured and change the request line counted.
    let http = reqwest::Client::builder()
        .no_proxy()
        .build()
        .map_err(|e| RunError::Setup(format!("HTTP client: {e}")))?;

    let shared = Arc::new(Shared {
        opts,
        rooms,
        room_sizes,
        phase_index: schedule
            .phases
            .iter()
            .enumerate()
            .map(|(i, p)| (p.name.clone(), i))
            .collect(),
        phases_started: tokio::sync::watch::Sender::new(0),
        channel_sizes,
        users,
        ending: CancellationToken::new(),
        stop: CancellationToken::new(),
        recording: AtomicBool::new(false),
        joined: AtomicU64::new(0),
        all_joined: Notify::new(),
        everyone_joined: AtomicBool::new(false),
        deliveries: AtomicU64::new(0),
        deliveries_rec: AtomicU64::new(0),
        expected: AtomicU64::new(0),
        expected_rec: AtomicU64::new(0),
        bytes_in_rec: AtomicU64::new(0),
        bytes_out_rec: AtomicU64::new(0),
        publishes: AtomicU64::new(0),
        publishes_rec: AtomicU64::new(0),
        acks: AtomicU64::new(0),
        requests_ok: AtomicU64::new(0),
        requests_failed: AtomicU64::new(0),
        next_nonce: AtomicU64::new(1),
        errors: Mutex::new(BTreeMap::new()),
        latency: Mutex::new(histogram()),
        request_rt: Mutex::new(histogram()),
        http_rt: Mutex::new(histogram()),
        http_ok: AtomicU64::new(0),
        http_failed: AtomicU64::new(0),
        http_calls_rec: AtomicU64::new(0),
        http_bytes_out: AtomicU64::new(0),
        http_bytes_in: AtomicU64::new(0),
        http_first_sent: AtomicU64::new(u64::MAX),
        http_last_done: AtomicU64::new(0),
        ws_first_sent: AtomicU64::new(u64::MAX),
        ws_last_received: AtomicU64::new(0),
        anchor: (Instant::now(), unix_micros()),
        flows_done: tokio::sync::watch::Sender::new(0),
        http,
        pending: Mutex::new(HashMap::new()),
    });

    let start = match &shared.opts.shard {
        Some(s) => {
            let wait = s.start_at_unix_ms.saturating_sub(unix_micros() / 1000);
            Instant::now() + Duration::from_millis(wait)
        }
        None => Instant::now(),
    };
    if let Some(s) = &shared.opts.shard {
        let (shared, mut everyone) = (shared.clone(), s.everyone_joined.clone());
        tokio::spawn(async move {
            if everyone.wait_for(|&all| all).await.is_ok() {
                shared.everyone_joined.store(true, Ordering::Release);
                shared.all_joined.notify_waiters();
            }
        });
    }
    let scenario = Arc::new(scenario.clone());
    let arrivals = {
        let shared = shared.clone();
        let scenario = scenario.clone();
        let times = schedule.arrivals.clone();
        tokio::spawn(async move {
            let mut tasks = Vec::with_capacity(times.len());
            for (vu, at) in times.into_iter().enumerate() {
                if !shared.opts.shard.as_ref().is_none_or(|s| s.runs(vu as u64)) {
                    continue;
                }
                if !shared.pause_until(start + at).await {
                    break;
                }
                let (shared, scenario) = (shared.clone(), scenario.clone());
                tasks.push(tokio::spawn(async move {
                    virtual_user(shared, scenario, vu as u64).await;
                }));
            }
            tasks
        })
    };

    // Phases switch recording on and off; CPU readings are taken at the
    // edges of the recorded stretch (from its first recorded phase to its
    // last, unrecorded phases between them included).
    let pid = shared.opts.server_pid;
    let recorded = schedule.recorded();
    let mut rec_len: Duration = schedule
        .phases
        .iter()
        .filter(|p| p.record)
        .map(|p| p.end - p.start)
        .sum();
    let mut rss_max = 0u64;
    let mut at_start = CpuReading::default();
    let mut resources = ResourceUse {
        server_rss_start_kib: pid.and_then(procstat::rss_kib),
        ..ResourceUse::default()
    };
    let mut current = String::from("start");
    for edge in schedule
        .phases
        .iter()
        .map(|p| (p.start, Some(p)))
        .chain([(schedule.end(), None)])
    {
        let (t, phase) = edge;
        let clock = (start, schedule.end());
        // The end of an `until_done` last phase comes when this process's
        // flows have all ended, if before its bound.
        let until_done = schedule
            .phases
            .last()
            .filter(|p| phase.is_none() && p.until_done);
        let done = until_done.map(|_| (shared.flows_done.subscribe(), my_users));
        if wait_sampling(start + t, &shared, &current, clock, &mut rss_max, done).await {
            let cut = (start + t).saturating_duration_since(Instant::now());
            tracing::info!(
                phase = %current,
                early_s = cut.as_secs_f64(),
                "every flow has ended: phase over"
            );
            if until_done.is_some_and(|p| p.record) {
                rec_len = rec_len.saturating_sub(cut);
            }
        }
        if recorded.is_some_and(|(_, to)| to == t) {
            let now = CpuReading::take(pid);
            resources.server_cpu = now
                .server
                .zip(at_start.server)
                .map(|(a, b)| a.saturating_sub(b));
            resources.generator_cpu = now.own.zip(at_start.own).map(|(a, b)| a.saturating_sub(b));
            resources.server_rss_kib = pid.and_then(procstat::rss_kib);
            resources.server_rss_max_kib = pid.map(|_| rss_max);
        }
        if recorded.is_some_and(|(from, _)| from == t) {
            at_start = CpuReading::take(pid);
        }
        let record = phase.is_some_and(|p| p.record);
        if let Some(p) = phase {
            tracing::info!(phase = %p.name, record, "phase");
            current.clone_from(&p.name);
        }
        shared.recording.store(record, Ordering::Relaxed);
        if phase.is_some() {
            shared.phases_started.send_modify(|n| *n += 1);
        }
    }

    // Flows end; let in-flight messages arrive before counting.
    shared.ending.cancel();
    let drain_start = Instant::now();
    let mut last = shared.deliveries.load(Ordering::Relaxed);
    let mut last_change = Instant::now();
    let mut told = Instant::now();
    while drain_start.elapsed() < Duration::from_millis(scenario.drain.max_ms) {
        tokio::time::sleep(Duration::from_millis(50)).await;
        if told.elapsed() >= Duration::from_secs(1) {
            told = Instant::now();
            tell_progress(&shared, "drain", (start, schedule.end()));
        }
        let now = shared.deliveries.load(Ordering::Relaxed);
        if now != last {
            last = now;
            last_change = Instant::now();
        } else if last_change.elapsed() >= Duration::from_millis(scenario.drain.quiet_ms) {
            break;
        }
    }
    shared.stop.cancel();
    if let Ok(tasks) = arrivals.await {
        for t in tasks {
            let _ = tokio::time::timeout(Duration::from_secs(5), t).await;
        }
    }

    let s = &shared;
    let latency = s.latency.lock().unwrap_or_else(|p| p.into_inner()).clone();
    let request_rt = s
        .request_rt
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .clone();
    let errors = s.errors.lock().unwrap_or_else(|p| p.into_inner()).clone();
    let http_rt = s.http_rt.lock().unwrap_or_else(|p| p.into_inner()).clone();
    let micros = |d: Option<Duration>| d.map(|d| d.as_micros() as u64);
    let first = |a: &AtomicU64| Some(a.load(Ordering::Relaxed)).filter(|&v| v != u64::MAX);
    let last = |a: &AtomicU64| Some(a.load(Ordering::Relaxed)).filter(|&v| v != 0);
    Ok(RawRun {
        driver: shared.opts.driver.name().to_owned(),
        users: my_users,
        joined: s.joined.load(Ordering::Relaxed),
        recorded_us: rec_len.as_micros() as u64,
        deliveries_total: s.deliveries.load(Ordering::Relaxed),
        expected_total: s.expected.load(Ordering::Relaxed),
        deliveries: s.deliveries_rec.load(Ordering::Relaxed),
        expected: s.expected_rec.load(Ordering::Relaxed),
        publishes_total: s.publishes.load(Ordering::Relaxed),
        publishes: s.publishes_rec.load(Ordering::Relaxed),
        acks: s.acks.load(Ordering::Relaxed),
        requests_ok: s.requests_ok.load(Ordering::Relaxed),
        requests_failed: s.requests_failed.load(Ordering::Relaxed),
        bytes_in: s.bytes_in_rec.load(Ordering::Relaxed),
        bytes_out: s.bytes_out_rec.load(Ordering::Relaxed),
        errors,
        latency,
        request_rt,
        http_rt,
        http_ok: s.http_ok.load(Ordering::Relaxed),
        http_failed: s.http_failed.load(Ordering::Relaxed),
        http_calls_rec: s.http_calls_rec.load(Ordering::Relaxed),
        http_bytes_out: s.http_bytes_out.load(Ordering::Relaxed),
        http_bytes_in: s.http_bytes_in.load(Ordering::Relaxed),
        http_first_sent_unix_us: first(&s.http_first_sent),
        http_last_done_unix_us: last(&s.http_last_done),
        ws_first_sent_unix_us: first(&s.ws_first_sent),
        ws_last_received_unix_us: last(&s.ws_last_received),
        server_cpu_us: micros(resources.server_cpu),
        generator_cpu_us: micros(resources.generator_cpu),
        generator_threads: tokio::runtime::Handle::current().metrics().num_workers() as u64,
        server_rss_kib: resources.server_rss_kib,
        server_rss_max_kib: resources.server_rss_max_kib,
        server_rss_start_kib: resources.server_rss_start_kib,
    })
}

/// CPU and memory readings over the recorded stretch.
#[derive(Debug, Clone, Default)]
struct ResourceUse {
    server_cpu: Option<Duration>,
    server_rss_kib: Option<u64>,
    server_rss_start_kib: Option<u64>,
    server_rss_max_kib: Option<u64>,
    generator_cpu: Option<Duration>,
}

/// CPU time used so far by the server and by this process.
#[derive(Default)]
struct CpuReading {
    server: Option<Duration>,
    own: Option<Duration>,
}

impl CpuReading {
    fn take(server_pid: Option<u32>) -> CpuReading {
        CpuReading {
            server: server_pid.and_then(|pid| procstat::cpu_time(Some(pid))),
            own: procstat::cpu_time(None),
        }
    }
}

/// Sleeps until `at`, sampling the server's RSS and telling progress every
/// second meanwhile. `clock` is the run's start and the schedule's length.
/// With `done` (the count of ended flows, and how many there are), returns
/// early, with true, once every flow has ended.
async fn wait_sampling(
    at: Instant,
    shared: &Shared,
    phase: &str,
    clock: (Instant, Duration),
    rss_max: &mut u64,
    mut done: Option<(tokio::sync::watch::Receiver<u64>, u64)>,
) -> bool {
    loop {
        if let Some(rss) = shared.opts.server_pid.and_then(procstat::rss_kib) {
            *rss_max = (*rss_max).max(rss);
        }
        tell_progress(shared, phase, clock);
        let now = Instant::now();
        if now >= at {
            return false;
        }
        let next = at.min(now + Duration::from_secs(1));
        match &mut done {
            Some((ended, flows)) => {
                let flows = *flows;
                tokio::select! {
                    Ok(_) = ended.wait_for(|&n| n >= flows) => return true,
                    _ = tokio::time::sleep_until(next) => {}
                }
            }
            None => tokio::time::sleep_until(next).await,
        }
    }
}

fn tell_progress(shared: &Shared, phase: &str, (start, total): (Instant, Duration)) {
    let Some(tell) = &shared.opts.progress else {
        return;
    };
    let errors = shared
        .errors
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .values()
        .sum();
    tell(&Progress {
        phase: phase.to_owned(),
        elapsed: start.elapsed(),
        total,
        joined: shared.joined.load(Ordering::Relaxed),
        users: shared.users,
        deliveries: shared.deliveries.load(Ordering::Relaxed),
        errors,
    });
}

async fn setup(opts: &RunOptions, scenario: &Scenario) -> Result<(), RunError> {
    let room_ids: Vec<String> = (0..scenario.rooms)
        .flat_map(|r| rooms_joined(scenario, r))
        .collect();
    let calls = opts.driver.setup(&room_ids, &scenario.room_options);
    if calls.is_empty() {
        return Ok(());
    }
    let client = reqwest::Client::new();
    for c in calls {
        let url = format!("http://{}{}", opts.addr, c.path);
        let method = reqwest::Method::from_bytes(c.method.as_bytes())
            .map_err(|e| RunError::Setup(e.to_string()))?;
        let mut req = client.request(method, &url);
        if let Some(b) = &c.body {
            req = req.json(b);
        }
        let resp = req
            .send()
            .await
            .map_err(|e| RunError::Setup(format!("{url}: {e}")))?;
        let status = resp.status();
        if !status.is_success() && !c.also_ok.contains(&status.as_u16()) {
            let body = resp.text().await.unwrap_or_default();
            return Err(RunError::Setup(format!(
                "{} {url}: {status} {body}",
                c.method
            )));
        }
    }
    Ok(())
}

/// Room ids the flows join (the first `join` step of each flow), for room `r`.
fn rooms_joined(scenario: &Scenario, r: u64) -> Vec<String> {
    let mut out: Vec<String> = scenario
        .flows
        .iter()
        .filter_map(|f| {
            f.steps.iter().find_map(|s| match s {
                Step::Join { room, .. } => Some(expand(room, 0, r, &f.name)),
                _ => None,
            })
        })
        .collect();
    out.sort();
    out.dedup();
    out
}

/// The channels (besides the main one) a flow's first join subscribes.
fn joined_channels(steps: &[Step]) -> &[String] {
    steps
        .iter()
        .find_map(|s| match s {
            Step::Join { channels, .. } => Some(channels.as_slice()),
            _ => None,
        })
        .unwrap_or(&[])
}

/// The room template of the first join in `steps` (depth first).
fn first_join(steps: &[Step]) -> Option<&str> {
    steps.iter().find_map(|step| match step {
        Step::Join { room, .. } => Some(room.as_str()),
        Step::Loop { steps, .. } => first_join(steps),
        Step::Parallel(branches) => branches.iter().find_map(|b| first_join(b)),
        _ => None,
    })
}

/// Expands `{vu}`, `{room}` and `{flow}`.
fn expand(template: &str, vu: u64, room: u64, flow: &str) -> String {
    template
        .replace("{vu}", &vu.to_string())
        .replace("{room}", &room.to_string())
        .replace("{flow}", flow)
}

/// One user's connection once joined.
struct Joined {
    writer: Arc<tokio::sync::Mutex<WsWriter>>,
    room: String,
    /// The channels joined besides the main one.
    channels: Vec<String>,
    /// The receiving task; `None` in a parallel branch's copy.
    reader: Option<tokio::task::JoinHandle<()>>,
}

impl Joined {
    /// What a parallel branch acts through: the same writer and room.
    fn share(&self) -> Joined {
        Joined {
            writer: self.writer.clone(),
            room: self.room.clone(),
            channels: self.channels.clone(),
            reader: None,
        }
    }
}

/// What a user has while running its flow.
struct UserState {
    vu: u64,
    room_index: u64,
    flow: String,
    /// The room of the flow's first join, expanded: named in the WebSocket
    /// URL for a cluster's load balancer (`Driver::ws_path_for`).
    first_room: Option<String>,
    conn: Option<(WsReader, WsWriter)>,
    joined: Option<Joined>,
    out: String,
}

async fn virtual_user(shared: Arc<Shared>, scenario: Arc<Scenario>, vu: u64) {
    // Flows are mixed within each room: the member index picks the flow.
    let flow = scenario.flow_of(vu / shared.rooms);
    let mut st = UserState {
        vu,
        room_index: vu % shared.rooms,
        flow: flow.name.clone(),
        first_room: first_join(&flow.steps)
            .map(|room| expand(room, vu, vu % shared.rooms, &flow.name)),
        conn: None,
        joined: None,
        out: String::with_capacity(256),
    };
    run_steps(&shared, &mut st, &flow.steps).await;
    shared.flows_done.send_modify(|n| *n += 1);
    // A flow that ends early stays connected until the run ends: leaving
    // early would change what the others receive.
    shared.stop.cancelled().await;
    if let Some(j) = st.joined.take() {
        // The reader ends on the stop signal and hands in its latency
        // samples: wait for it rather than abort it.
        if let Some(reader) = j.reader {
            let _ = tokio::time::timeout(Duration::from_secs(5), reader).await;
        }
        let _ = j.writer.lock().await.close(1000).await;
    }
}

type StepFuture<'a> = Pin<Box<dyn Future<Output = bool> + Send + 'a>>;

/// Runs `steps`; false when the user must stop (run over or failure).
fn run_steps<'a>(
    shared: &'a Arc<Shared>,
    st: &'a mut UserState,
    steps: &'a [Step],
) -> StepFuture<'a> {
    Box::pin(async move {
        for step in steps {
            if shared.ending.is_cancelled() || !run_step(shared, st, step).await {
                return false;
            }
        }
        true
    })
}

async fn run_step(shared: &Arc<Shared>, st: &mut UserState, step: &Step) -> bool {
    match step {
        Step::Connect => {
            let o = &shared.opts;
            let bind = (!o.bind.is_empty()).then(|| o.bind[(st.vu as usize) % o.bind.len()]);
            let room = st.first_room.as_deref();
            let fut = session::connect_for(o.addr, &o.host, o.driver.as_ref(), room, bind);
            match tokio::time::timeout(o.timeout, fut).await {
                Ok(Ok(c)) => {
                    st.conn = Some(c);
                    true
                }
                Ok(Err(e)) => {
                    shared.error(format!("connect: {}", e.kind()));
                    false
                }
                Err(_) => {
                    shared.error("connect: timeout");
                    false
                }
            }
        }
        Step::Join {
            room,
            channels,
            platform,
        } => join(shared, st, room, channels, platform.as_deref()).await,
        Step::Publish {
            channel,
            event,
            bytes,
        } => {
            publish(
                shared,
                st,
                channel.as_deref(),
                event.as_deref().unwrap_or("b"),
                *bytes,
            )
            .await
        }
        Step::Request { op, args } => request(shared, st, op, args.as_ref()).await,
        Step::Http {
            method,
            path,
            body,
            status,
        } => http_call(shared, st, method, path, body.as_ref(), *status).await,
        Step::Think { ms } => {
            shared
                .pause_until(Instant::now() + Duration::from_millis(*ms))
                .await
        }
        Step::Loop {
            count,
            every_ms,
            steps,
        } => {
            let mut i = 0u64;
            // Users keep the cadence but not in step: each starts at its own
            // offset within the period (golden-ratio spread), as real
            // clients would, instead of all publishing in the same instant.
            let offset = every_ms.map_or(Duration::ZERO, |every| {
                let frac = (st.vu as f64 * 0.618_033_988_749_895).fract();
                Duration::from_secs_f64(every as f64 / 1000.0 * frac)
            });
            let mut next = Instant::now() + offset;
            while count.is_none_or(|c| i < c) {
                if let Some(every) = every_ms {
                    if !shared.pause_until(next).await {
                        return false;
                    }
                    next += Duration::from_millis(*every);
                }
                if !run_steps(shared, st, steps).await {
                    return false;
                }
                i += 1;
            }
            true
        }
        Step::Parallel(branches) => {
            let Some(j) = &st.joined else {
                shared.error("parallel: not joined");
                return false;
            };
            let tasks: Vec<_> = branches
                .iter()
                .map(|steps| {
                    let mut branch = UserState {
                        vu: st.vu,
                        room_index: st.room_index,
                        flow: st.flow.clone(),
                        first_room: st.first_room.clone(),
                        conn: None,
                        joined: Some(j.share()),
                        out: String::with_capacity(256),
                    };
                    let (shared, steps) = (shared.clone(), steps.clone());
                    tokio::spawn(async move { run_steps(&shared, &mut branch, &steps).await })
                })
                .collect();
            let mut all = true;
            for t in tasks {
                all &= t.await.unwrap_or(false);
            }
            all
        }
        Step::WaitPhase(name) => match shared.phase_index.get(name) {
            Some(&i) => {
                let mut started = shared.phases_started.subscribe();
                tokio::select! {
                    _ = shared.ending.cancelled() => false,
                    r = started.wait_for(|&n| n > i) => r.is_ok(),
                }
            }
            None => {
                shared.error(format!("wait_phase: no phase {name:?}"));
                false
            }
        },
        Step::Leader(steps) => {
            if st.vu / shared.rooms == 0 {
                run_steps(shared, st, steps).await
            } else {
                true
            }
        }
        Step::WaitAllJoined => loop {
            let notified = shared.all_joined.notified();
            if shared.everyone_joined.load(Ordering::Acquire) {
                return true;
            }
            tokio::select! {
                _ = shared.ending.cancelled() => return false,
                _ = notified => {}
            }
        },
        Step::Idle => {
            shared.ending.cancelled().await;
            false
        }
        Step::Disconnect => {
            if let Some(j) = st.joined.take() {
                let _ = j.writer.lock().await.close(1000).await;
                if let Some(reader) = j.reader {
                    reader.abort();
                }
            }
            st.conn = None;
            true
        }
    }
}

async fn join(
    shared: &Arc<Shared>,
    st: &mut UserState,
    room: &str,
    channels: &[String],
    platform: Option<&str>,
) -> bool {
    let Some((mut reader, mut writer)) = st.conn.take() else {
        shared.error("join: not connected");
        return false;
    };
    let spec = JoinSpec {
        room: expand(room, st.vu, st.room_index, &st.flow),
        name: format!("u{}", st.vu),
        platform: platform.unwrap_or("browser").to_owned(),
        channels: channels.to_vec(),
    };
    let handshake = session::join(&mut reader, &mut writer, shared.opts.driver.as_ref(), &spec);
    let early = match tokio::time::timeout(shared.opts.timeout, handshake).await {
        Ok(Ok(early)) => early,
        Ok(Err(e)) => {
            shared.error(format!("join: {e}"));
            return false;
        }
        Err(_) => {
            shared.error("join: timeout");
            return false;
        }
    };
    let writer = Arc::new(tokio::sync::Mutex::new(writer));
    let observer = st.vu / shared.rooms < shared.opts.observers_per_room;
    let reader = tokio::spawn(receive(
        shared.clone(),
        reader,
        writer.clone(),
        observer,
        early,
    ));
    st.joined = Some(Joined {
        writer,
        room: spec.room,
        channels: spec.channels,
        reader: Some(reader),
    });
    let joined = shared.joined.fetch_add(1, Ordering::AcqRel) + 1;
    match &shared.opts.shard {
        Some(s) => {
            s.joined.send_replace(joined);
        }
        None if joined >= shared.users => {
            shared.everyone_joined.store(true, Ordering::Release);
            shared.all_joined.notify_waiters();
        }
        None => {}
    }
    true
}

/// What one receiver counts between two flushes into the shared counters.
struct Tally {
    /// The observer's latency samples (µs) since the last flush; `None` for
    /// other users. A short buffer rather than a histogram per observer: a
    /// histogram is ~100 KB, and every user observes in idle-capacity runs.
    latency: Option<Vec<u64>>,
    /// Receipt time (unix µs) and recording flag of the current read, taken
    /// once, when its first message is handled: after the read, not before
    /// it waited for data.
    stamp: Option<(u64, bool)>,
    deliveries: u64,
    acks: u64,
    replies: Vec<String>,
    /// Whether the current read held a message (not only pings).
    got_message: bool,
}

impl Tally {
    fn message(&mut self, shared: &Shared, msg: &[u8]) {
        self.got_message = true;
        match shared.opts.driver.classify(msg, &mut self.replies) {
            Inbound::Deliveries(n) => {
                self.deliveries += n as u64;
                if let Some(h) = self.latency.as_mut() {
                    let (now, recording) = *self
                        .stamp
                        .get_or_insert_with(|| (unix_micros(), shared.recording()));
                    if let (true, Some(sent)) = (recording, first_timestamp(msg)) {
                        h.push(now.saturating_sub(sent).max(1));
                    }
                }
            }
            Inbound::Ack => self.acks += 1,
            Inbound::Response { nonce, ok } => {
                let waiter = shared
                    .pending
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .remove(&nonce);
                if let Some(w) = waiter {
                    let _ = w.send(ok);
                }
            }
            Inbound::Error(e) => shared.error(format!("server: {e}")),
            Inbound::Other => {}
        }
    }

    /// Adds what was counted since the last flush to the shared counters.
    fn flush(&mut self, shared: &Shared, bytes: u64) {
        let recording = match self.stamp.take() {
            Some((_, r)) => r,
            None => shared.recording(),
        };
        let deliveries = std::mem::take(&mut self.deliveries);
        shared.deliveries.fetch_add(deliveries, Ordering::Relaxed);
        if recording {
            shared
                .deliveries_rec
                .fetch_add(deliveries, Ordering::Relaxed);
            shared.bytes_in_rec.fetch_add(bytes, Ordering::Relaxed);
        }
        let acks = std::mem::take(&mut self.acks);
        if acks > 0 {
            shared.acks.fetch_add(acks, Ordering::Relaxed);
        }
        if let Some(samples) = self.latency.as_mut().filter(|s| !s.is_empty()) {
            let mut h = shared.latency.lock().unwrap_or_else(|p| p.into_inner());
            for v in samples.drain(..) {
                let _ = h.record(v);
            }
        }
    }
}

/// When a receiver last got a message. Handed to the run's latest when the
/// receiver ends, however it ends: dropping covers a receiver aborted by a
/// `disconnect` step too. One shared write per receiver, not per read.
struct LastReceipt<'a> {
    shared: &'a Shared,
    at: Option<Instant>,
}

impl Drop for LastReceipt<'_> {
    fn drop(&mut self) {
        if let Some(at) = self.at {
            self.shared
                .ws_last_received
                .fetch_max(self.shared.unix_us(at), Ordering::Relaxed);
        }
    }
}

/// Receives until the run stops: counts deliveries, times them if this user
/// observes, routes responses, answers pings. `early` holds messages that
/// arrived with the end of the join handshake.
async fn receive(
    shared: Arc<Shared>,
    mut reader: WsReader,
    writer: Arc<tokio::sync::Mutex<WsWriter>>,
    observer: bool,
    early: Vec<Vec<u8>>,
) {
    let mut tally = Tally {
        latency: observer.then(Vec::new),
        stamp: None,
        deliveries: 0,
        acks: 0,
        replies: Vec::new(),
        got_message: false,
    };
    for m in &early {
        tally.message(&shared, m);
    }
    tally.flush(&shared, 0);
    let mut last = LastReceipt {
        shared: &shared,
        at: None,
    };
    let mut pongs: Vec<Vec<u8>> = Vec::new();
    loop {
        let mut closed = None;
        let read = tokio::select! {
            _ = shared.stop.cancelled() => break,
            r = reader.read_some(|m| match m {
                Incoming::Message(b) => tally.message(&shared, b),
                Incoming::Ping(p) => pongs.push(p.to_vec()),
                Incoming::Close(c) => closed = Some(c),
            }) => r,
        };
        match read {
            Ok(0) => {
                shared.error("closed by server");
                break;
            }
            Ok(n) => {
                if std::mem::take(&mut tally.got_message) {
                    last.at = Some(Instant::now());
                }
                tally.flush(&shared, n as u64);
            }
            Err(e) => {
                shared.error(format!("read: {}", e.kind()));
                break;
            }
        }
        if let Some(code) = closed {
            shared.error(format!("closed by server: {code:?}"));
            break;
        }
        if !tally.replies.is_empty() || !pongs.is_empty() {
            let mut w = writer.lock().await;
            for r in tally.replies.drain(..) {
                let _ = w.send_text(r.as_bytes()).await;
            }
            for p in pongs.drain(..) {
                let _ = w.pong(&p).await;
            }
        }
    }
}

/// One HTTP call: timed while recording; a transport error or an
/// unexpected status counts as a failed call and an error, and the user goes
/// on (a load test of an API wants every call made). Its bytes and its
/// place in the run's HTTP span are counted whatever the recording flag.
async fn http_call(
    shared: &Arc<Shared>,
    st: &UserState,
    method: &str,
    path: &str,
    body: Option<&serde_json::Value>,
    status: Option<u16>,
) -> bool {
    use reqwest::header::{ACCEPT, CONTENT_LENGTH, CONTENT_TYPE, HOST};
    let Ok(method) = reqwest::Method::from_bytes(method.as_bytes()) else {
        shared.error(format!("http: bad method {method:?}"));
        return false;
    };
    let path = expand(path, st.vu, st.room_index, &st.flow);
    let url = format!("http://{}{}", shared.opts.addr, path);
    // Every header is set here so that what the client writes is known:
    // reqwest adds `accept`, and hyper `host` and `content-length`, only
    // where they are missing.
    let mut req = shared
        .http
        .request(method, &url)
        .timeout(shared.opts.timeout)
        .header(HOST, shared.opts.addr.to_string())
        .header(ACCEPT, "*/*");
    if let Some(b) = body {
        let json = expand_json(b.clone(), st.vu, st.room_index, &st.flow);
        let bytes = match serde_json::to_vec(&json) {
            Ok(b) => b,
            Err(e) => {
                shared.error(format!("http: request body: {e}"));
                return false;
            }
        };
        req = req
            .header(CONTENT_TYPE, "application/json")
            .header(CONTENT_LENGTH, bytes.len())
            .body(bytes);
    }
    let sent = Instant::now();
    shared
        .http_first_sent
        .fetch_min(shared.unix_us(sent), Ordering::Relaxed);
    let outcome = match req.build() {
        Ok(req) => {
            let out = request_len(&req);
            match shared.http.execute(req).await {
                Ok(resp) => {
                    // A response means the whole request went out.
                    shared.http_bytes_out.fetch_add(out, Ordering::Relaxed);
                    let head = response_head_len(&resp);
                    let code = resp.status();
                    // Read the body: the call is over when the response is.
                    let read = resp.bytes().await;
                    let body = read.as_ref().map_or(0, |b| b.len() as u64);
                    shared
                        .http_bytes_in
                        .fetch_add(head + body, Ordering::Relaxed);
                    match (status, read) {
                        (_, Err(e)) => Err(format!("http: body: {}", short(&e))),
                        (Some(want), Ok(_)) if code.as_u16() != want => {
                            Err(format!("http: status {code}"))
                        }
                        (None, Ok(_)) if !code.is_success() => Err(format!("http: status {code}")),
                        _ => Ok(()),
                    }
                }
                Err(e) => Err(format!("http: {}", short(&e))),
            }
        }
        Err(e) => Err(format!("http: {}", short(&e))),
    };
    let done = Instant::now();
    shared
        .http_last_done
        .fetch_max(shared.unix_us(done), Ordering::Relaxed);
    let took = (done - sent).as_micros() as u64;
    let recording = shared.recording();
    if recording {
        shared.http_calls_rec.fetch_add(1, Ordering::Relaxed);
    }
    match outcome {
        Ok(()) => {
            shared.http_ok.fetch_add(1, Ordering::Relaxed);
            if recording {
                let _ = shared
                    .http_rt
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .record(took.max(1));
            }
        }
        Err(kind) => {
            shared.http_failed.fetch_add(1, Ordering::Relaxed);
            shared.error(kind);
        }
    }
    true
}

/// The bytes of `req` as HTTP/1.1 writes them: request line, headers, the
/// blank line, body (the client speaks HTTP/1.1 only: no HTTP/2 feature).
fn request_len(req: &reqwest::Request) -> u64 {
    let url = req.url();
    // The origin form: path and query, never the fragment.
    let target = url.path().len() + url.query().map_or(0, |q| q.len() + 1);
    let line = req.method().as_str().len() + 1 + target + " HTTP/1.1\r\n".len();
    let body = req.body().and_then(|b| b.as_bytes()).map_or(0, <[u8]>::len);
    (line + headers_len(req.headers()) + body) as u64
}

/// The bytes of a response's head as HTTP/1.1 writes it, from what the
/// client kept of it: the standard reason phrase and `name: value` lines are
/// assumed.
fn response_head_len(resp: &reqwest::Response) -> u64 {
    let reason = resp.status().canonical_reason().map_or(0, str::len);
    // `HTTP/1.1 200 OK\r\n`: version, space, code, space, reason, CRLF.
    let line = "HTTP/1.1 ".len() + 3 + 1 + reason + 2;
    (line + headers_len(resp.headers())) as u64
}

/// `name: value\r\n` per header, and the blank line that ends them.
fn headers_len(h: &reqwest::header::HeaderMap) -> usize {
    h.iter()
        .map(|(k, v)| k.as_str().len() + 2 + v.len() + 2)
        .sum::<usize>()
        + 2
}

/// An error kind without the URL (so that errors group by kind).
fn short(e: &reqwest::Error) -> &'static str {
    if e.is_timeout() {
        "timeout"
    } else if e.is_connect() {
        "connect"
    } else if e.is_body() || e.is_decode() {
        "body"
    } else {
        "request"
    }
}

async fn publish(
    shared: &Arc<Shared>,
    st: &mut UserState,
    channel: Option<&str>,
    event: &str,
    bytes: usize,
) -> bool {
    let Some(j) = &st.joined else {
        shared.error("publish: not joined");
        return false;
    };
    let sent = unix_micros();
    let head = format!(r#"{{"bt":{sent},"vu":{},"p":""#, st.vu);
    let pad = bytes.saturating_sub(head.len() + 2);
    let mut payload = head;
    payload.extend(std::iter::repeat_n('x', pad));
    payload.push_str("\"}");
    st.out.clear();
    shared
        .opts
        .driver
        .publish(&j.room, channel, event, &payload, &mut st.out);
    let len = st.out.len() as u64;
    shared.ws_sending();
    if let Err(e) = j.writer.lock().await.send_text(st.out.as_bytes()).await {
        shared.error(format!("publish: {}", e.kind()));
        return false;
    }
    let room = st.room_index as usize;
    // Members subscribed to the channel, and whether the publisher is one.
    let (subscribers, subscribed) = match channel {
        None | Some("main") => (shared.room_sizes[room], true),
        Some(ch) => (
            shared.channel_sizes[room].get(ch).copied().unwrap_or(0),
            j.channels.iter().any(|c| c == ch),
        ),
    };
    let recipients = if subscribed && !shared.opts.driver.echoes_sender() {
        subscribers.saturating_sub(1)
    } else {
        subscribers
    };
    shared.publishes.fetch_add(1, Ordering::Relaxed);
    shared.expected.fetch_add(recipients, Ordering::Relaxed);
    if shared.recording() {
        shared.publishes_rec.fetch_add(1, Ordering::Relaxed);
        shared.expected_rec.fetch_add(recipients, Ordering::Relaxed);
        shared.bytes_out_rec.fetch_add(len, Ordering::Relaxed);
    }
    true
}

async fn request(
    shared: &Arc<Shared>,
    st: &mut UserState,
    op: &str,
    args: Option<&serde_json::Value>,
) -> bool {
    let Some(j) = &st.joined else {
        shared.error("request: not joined");
        return false;
    };
    let nonce = shared.next_nonce.fetch_add(1, Ordering::Relaxed);
    let args = args.cloned().unwrap_or(serde_json::json!({}));
    let args = expand_json(args, st.vu, st.room_index, &st.flow);
    st.out.clear();
    if !shared
        .opts
        .driver
        .request(&j.room, nonce, op, &args, &mut st.out)
    {
        shared.error(format!(
            "request: {} has no requests",
            shared.opts.driver.name()
        ));
        return false;
    }
    let (tx, rx) = oneshot::channel();
    shared
        .pending
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .insert(nonce, tx);
    shared.ws_sending();
    let sent = Instant::now();
    if let Err(e) = j.writer.lock().await.send_text(st.out.as_bytes()).await {
        shared.error(format!("request: {}", e.kind()));
        return false;
    }
    let answer = tokio::select! {
        _ = shared.ending.cancelled() => return false,
        a = tokio::time::timeout(shared.opts.timeout, rx) => a,
    };
    let rt = sent.elapsed();
    match answer {
        Ok(Ok(ok)) => {
            if ok {
                shared.requests_ok.fetch_add(1, Ordering::Relaxed);
            } else {
                shared.requests_failed.fetch_add(1, Ordering::Relaxed);
                shared.error(format!("request {op}: refused"));
            }
            if shared.recording() {
                let _ = shared
                    .request_rt
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .record((rt.as_micros() as u64).max(1));
            }
            true
        }
        _ => {
            shared
                .pending
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .remove(&nonce);
            shared.requests_failed.fetch_add(1, Ordering::Relaxed);
            shared.error(format!("request {op}: no response"));
            true
        }
    }
}

fn expand_json(v: serde_json::Value, vu: u64, room: u64, flow: &str) -> serde_json::Value {
    use serde_json::Value;
    match v {
        Value::String(s) => Value::String(expand(&s, vu, room, flow)),
        Value::Array(a) => Value::Array(
            a.into_iter()
                .map(|x| expand_json(x, vu, room, flow))
                .collect(),
        ),
        Value::Object(o) => Value::Object(
            o.into_iter()
                .map(|(k, x)| (k, expand_json(x, vu, room, flow)))
                .collect(),
        ),
        other => other,
    }
}
