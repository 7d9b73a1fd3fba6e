//! Runs a scenario against a target: virtual users arrive on schedule, run
//! their flows, and every received message is counted; observers (a few users
//! of each room, spread over its order of joining) also time what they
//! receive.

mod chat;
mod http;
mod receive;
mod user;
mod webhook;
mod ws_ops;

use std::collections::{BTreeMap, HashMap};
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use hdrhistogram::Histogram;
use tokio::sync::{oneshot, Notify};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::counts::AtomicCounts;
use crate::driver::Driver;
use crate::procstat;
use crate::raw::{histogram, RawRun, RssSample, RSS_SERIES_EVERY_S};
use crate::report::Report;
use crate::scenario::Scenario;
use crate::schedule::Schedule;
use crate::transport::{SocketTally, Transport};
use user::{joined_channels, rooms_joined, virtual_user};

/// Where and how to run.
pub struct RunOptions {
    /// The server's address (WebSocket and HTTP).
    pub addr: SocketAddr,
    /// Host header value.
    pub host: String,
    /// The protocol.
    pub driver: Arc<dyn Driver>,
    /// Users per room whose receipts are timestamped, spread evenly over the
    /// room's order of joining.
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
    /// When the run's schedule starts (arrival offsets count from here).
    start: Instant,
    /// Arrival offsets; user `i` arrives at `arrivals[i]`.
    arrivals: Vec<Duration>,
    /// Users offer permessage-deflate.
    compression: bool,
    /// What users connect over.
    transport: Transport,
    /// Bytes at the users' sockets, HTTP transport requests.
    socket: Arc<SocketTally>,
    /// Per room: users of this process that have joined it.
    room_joined: Vec<AtomicU64>,
    opts: RunOptions,
    rooms: u64,
    room_sizes: Vec<u64>,
    /// Per room: its users whose flow joins it (server-API publishes reach
    /// these; `room_sizes` counts every user of the room).
    room_members: Vec<u64>,
    /// Users of the run whose flow joins (all of them but server-API
    /// callers and HTTP-only users): `wait_all_joined` waits for these.
    members: u64,
    /// The run's webhook receiver, if the scenario has one.
    webhooks: Option<webhook::WebhookTally>,
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
    /// What is counted (see [`AtomicCounts`]).
    counts: AtomicCounts,
    all_joined: Notify,
    /// Set once every user of the run (of every process) has joined.
    everyone_joined: AtomicBool,
    next_nonce: AtomicU64,
    errors: Mutex<BTreeMap<String, u64>>,
    latency: Mutex<Histogram<u64>>,
    request_rt: Mutex<Histogram<u64>>,
    http_rt: Mutex<Histogram<u64>>,
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
    /// Chat replays only: the seq of each acknowledged chat message, by id,
    /// for the replies that answer it.
    chat_seqs: Option<Mutex<HashMap<String, u64>>>,
    /// Chat replies: from the reply's send to its receipt by the author of
    /// the message it answers (µs).
    reply_latency: Mutex<Histogram<u64>>,
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

    /// Counts a webhook event to come for a message on `channel` (`None`:
    /// main), if the run's receiver wants that channel.
    fn webhook_expect(&self, channel: Option<&str>) {
        if self.webhooks.as_ref().is_some_and(|w| w.wants(channel)) {
            self.counts
                .webhooks_expected_total
                .fetch_add(1, Ordering::Relaxed);
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
    Ok(Report::build(scenario, &run_raw(scenario, opts).await?))
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
    let mut room_members = vec![0u64; rooms as usize];
    for vu in 0..users {
        let room = (vu % rooms) as usize;
        room_sizes[room] += 1;
        if scenario.flow_of(vu / rooms).joins() {
            room_members[room] += 1;
        }
        for ch in joined_channels(&scenario.flow_of(vu / rooms).steps) {
            *channel_sizes[room].entry(ch.clone()).or_insert(0) += 1;
        }
    }
    if scenario.transport != Transport::WebSocket && opts.driver.sessions_path_for(None).is_none() {
        return Err(RunError::Setup(format!(
            "{} has no {} transport (WebSocket only)",
            opts.driver.name(),
            scenario.transport.name()
        )));
    }
    // The receiver listens before anything could be sent to it (in a run
    // over several load processes, the first one's; the others count
    // what they expect).
    let receiver = match &scenario.webhook_receiver {
        Some(r) if opts.shard.as_ref().is_none_or(|s| s.index == 0) => {
            Some(webhook::bind(&r.listen).await?)
        }
        _ => None,
    };
    setup(&opts, scenario).await?;
    // The target is addressed directly: a proxy from the environment would
    // add a hop to what is measured and change the request line counted.
    let http = reqwest::Client::builder()
        .no_proxy()
        .build()
        .map_err(|e| RunError::Setup(format!("HTTP client: {e}")))?;

    let start = match &opts.shard {
        Some(s) => {
            let wait = s.start_at_unix_ms.saturating_sub(unix_micros() / 1000);
            Instant::now() + Duration::from_millis(wait)
        }
        None => Instant::now(),
    };
    let shared = Arc::new(Shared {
        start,
        arrivals: schedule.arrivals.clone(),
        room_joined: (0..rooms).map(|_| AtomicU64::new(0)).collect(),
        compression: scenario.compression,
        transport: scenario.transport,
        socket: Arc::new(SocketTally::default()),
        opts,
        rooms,
        room_sizes,
        room_members,
        members: scenario.members(users),
        webhooks: scenario
            .webhook_receiver
            .as_ref()
            .map(|r| webhook::WebhookTally::new(r.channels.clone())),
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
        counts: AtomicCounts::default(),
        all_joined: Notify::new(),
        everyone_joined: AtomicBool::new(false),
        next_nonce: AtomicU64::new(1),
        errors: Mutex::new(BTreeMap::new()),
        latency: Mutex::new(histogram()),
        request_rt: Mutex::new(histogram()),
        http_rt: Mutex::new(histogram()),
        http_first_sent: AtomicU64::new(u64::MAX),
        http_last_done: AtomicU64::new(0),
        ws_first_sent: AtomicU64::new(u64::MAX),
        ws_last_received: AtomicU64::new(0),
        anchor: (Instant::now(), unix_micros()),
        flows_done: tokio::sync::watch::Sender::new(0),
        http,
        pending: Mutex::new(HashMap::new()),
        chat_seqs: scenario
            .flows
            .iter()
            .any(|f| chat::replays(&f.steps))
            .then(|| Mutex::new(HashMap::new())),
        reply_latency: Mutex::new(histogram()),
    });

    let start = shared.start;
    if shared.members == 0 && shared.opts.shard.is_none() {
        // Nobody joins: nobody to wait for.
        shared.everyone_joined.store(true, Ordering::Release);
    }
    if let Some(listener) = receiver {
        tokio::spawn(webhook::serve(shared.clone(), listener));
    }
    if let Some(s) = &shared.opts.shard {
        let (shared, mut everyone) = (shared.clone(), s.everyone_joined.clone());
        tokio::spawn(async move {
            if everyone.wait_for(|&all| all).await.is_ok() {
                shared.everyone_joined.store(true, Ordering::Release);
                shared.all_joined.notify_waiters();
            }
        });
    }
    // The phase that starts with the run records (or not) from its first
    // user on: set here, not at its edge below, which the runtime may reach
    // after the first users' calls were answered (they were counted but not
    // timed on a loaded machine).
    let first_records = schedule
        .phases
        .first()
        .is_some_and(|p| p.start.is_zero() && p.record);
    shared.recording.store(first_records, Ordering::Relaxed);
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
    let mut rss = RssWatch::default();
    let mut at_start = CpuReading::default();
    let mut stages_at_start = None;
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
        if wait_sampling(start + t, &shared, &current, clock, &mut rss, done).await {
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
            resources.loopback = now
                .loopback
                .zip(at_start.loopback)
                .map(|((b, p), (b0, p0))| (b.saturating_sub(b0), p.saturating_sub(p0)));
            let (read, written, requests) = shared.socket.load();
            let c = &shared.counts;
            c.socket_bytes_in
                .store(read - at_start.socket.0, Ordering::Relaxed);
            c.socket_bytes_out
                .store(written - at_start.socket.1, Ordering::Relaxed);
            c.transport_requests
                .store(requests - at_start.socket.2, Ordering::Relaxed);
            resources.server_rss_kib = pid.and_then(procstat::rss_kib);
            resources.server_rss_max_kib = pid.map(|_| rss.max);
            resources.server_stages = stages_at_start
                .zip(server_stages(&shared).await)
                .map(|(a, b)| crate::plaza_metrics::StageMeans::between(&a, &b));
        }
        if recorded.is_some_and(|(from, _)| from == t) {
            at_start = CpuReading::take(pid);
            at_start.socket = shared.socket.load();
            stages_at_start = server_stages(&shared).await;
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
    // Deliveries to members and webhook requests alike.
    let arrived = |s: &Shared| {
        s.counts.deliveries_total.load(Ordering::Relaxed)
            + s.counts.webhooks_received_total.load(Ordering::Relaxed)
    };
    let mut last = arrived(&shared);
    let mut last_change = Instant::now();
    let mut told = Instant::now();
    while drain_start.elapsed() < Duration::from_millis(scenario.drain.max_ms) {
        tokio::time::sleep(Duration::from_millis(50)).await;
        if told.elapsed() >= Duration::from_secs(1) {
            told = Instant::now();
            tell_progress(&shared, "drain", (start, schedule.end()));
        }
        let now = arrived(&shared);
        if now != last {
            last = now;
            last_change = Instant::now();
        } else if last_change.elapsed() >= Duration::from_millis(scenario.drain.quiet_ms) {
            break;
        }
    }
    // The server's own account of its webhook deliveries, after the drain.
    let server_webhook_metrics = match &shared.webhooks {
        Some(_) => crate::plaza_metrics::page(&shared.http, shared.opts.addr, &shared.opts.host)
            .await
            .map(|p| webhook::server_metrics(&p))
            .unwrap_or_default(),
        None => BTreeMap::new(),
    };
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
    let reply_latency = s
        .reply_latency
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .clone();
    let micros = |d: Option<Duration>| d.map(|d| d.as_micros() as u64);
    let rss_series = std::mem::take(&mut rss.series);
    let first = |a: &AtomicU64| Some(a.load(Ordering::Relaxed)).filter(|&v| v != u64::MAX);
    let last = |a: &AtomicU64| Some(a.load(Ordering::Relaxed)).filter(|&v| v != 0);
    Ok(RawRun {
        driver: shared.opts.driver.name().to_owned(),
        transport: shared.transport.name(),
        users: my_users,
        counts: s.counts.load(),
        recorded_us: rec_len.as_micros() as u64,
        errors,
        latency,
        request_rt,
        http_rt,
        reply_latency,
        webhook_latency: s
            .webhooks
            .as_ref()
            .and_then(|w| w.latency.lock().unwrap_or_else(|p| p.into_inner()).take())
            .unwrap_or_else(histogram),
        webhook_types: s.webhooks.as_ref().map_or_else(BTreeMap::new, |w| {
            w.types.lock().unwrap_or_else(|p| p.into_inner()).clone()
        }),
        server_webhook_metrics,
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
        server_rss_series: rss_series,
        server_stages: resources.server_stages,
        loopback_bytes: resources
            .loopback
            .filter(|_| shared.opts.addr.ip().is_loopback())
            .map(|l| l.0),
        loopback_packets: resources
            .loopback
            .filter(|_| shared.opts.addr.ip().is_loopback())
            .map(|l| l.1),
    })
}

/// The server's RSS as sampled during the run: its largest, and a reading
/// every [`RSS_SERIES_EVERY_S`] seconds.
#[derive(Debug, Default)]
struct RssWatch {
    max: u64,
    series: Vec<RssSample>,
}

/// CPU and memory readings over the recorded stretch.
#[derive(Debug, Clone, Default)]
struct ResourceUse {
    server_cpu: Option<Duration>,
    /// Loopback bytes and packets while recording.
    loopback: Option<(u64, u64)>,
    server_rss_kib: Option<u64>,
    server_rss_start_kib: Option<u64>,
    server_rss_max_kib: Option<u64>,
    generator_cpu: Option<Duration>,
    /// Where events spent their time inside the server (Plaza only).
    server_stages: Option<crate::plaza_metrics::StageMeans>,
}

/// The server's own stage totals (see [`crate::plaza_metrics`]), for a
/// server this run watches (its pid given) that reports them.
async fn server_stages(shared: &Shared) -> Option<crate::plaza_metrics::StageTotals> {
    shared.opts.server_pid?;
    let page =
        crate::plaza_metrics::page(&shared.http, shared.opts.addr, &shared.opts.host).await?;
    crate::plaza_metrics::stages(&page)
}

/// CPU time used so far by the server and by this process.
#[derive(Default)]
struct CpuReading {
    server: Option<Duration>,
    own: Option<Duration>,
    loopback: Option<(u64, u64)>,
    /// The users' socket bytes read and written, and transport requests.
    socket: (u64, u64, u64),
}

impl CpuReading {
    fn take(server_pid: Option<u32>) -> CpuReading {
        CpuReading {
            server: server_pid.and_then(|pid| procstat::cpu_time(Some(pid))),
            own: procstat::cpu_time(None),
            loopback: procstat::loopback(),
            socket: (0, 0, 0),
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
    rss: &mut RssWatch,
    mut done: Option<(tokio::sync::watch::Receiver<u64>, u64)>,
) -> bool {
    loop {
        if let Some(kib) = shared.opts.server_pid.and_then(procstat::rss_kib) {
            rss.max = rss.max.max(kib);
            let at_s = clock.0.elapsed().as_secs_f64();
            if rss
                .series
                .last()
                .is_none_or(|s| at_s - s.at_s >= RSS_SERIES_EVERY_S)
            {
                let recorded = shared.recording();
                let page =
                    crate::plaza_metrics::page(&shared.http, shared.opts.addr, &shared.opts.host)
                        .await;
                let gauges = page.as_deref().and_then(crate::plaza_metrics::parse);
                rss.series.push(RssSample {
                    at_s,
                    kib,
                    recorded,
                    heap_kib: gauges.map(|g| g.heap_kib),
                    allocator_resident_kib: gauges.map(|g| g.resident_kib),
                });
            }
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
        joined: shared.counts.joined.load(Ordering::Relaxed),
        users: shared.users,
        deliveries: shared.counts.deliveries_total.load(Ordering::Relaxed),
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
    // Straight to the target, as the run's own calls (a proxy from the environment would be
    // another hop, and one that may not reach a loopback target at all).
    let client = reqwest::Client::builder()
        .no_proxy()
        .build()
        .map_err(|e| RunError::Setup(format!("HTTP client: {e}")))?;
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
