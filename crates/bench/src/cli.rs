//! `plaza bench`'s command line: its arguments (clap) and the orchestration of
//! a run (targets, sweeps, CPU pinning and quotas, load processes, progress).
//! The `plaza` binary only embeds [`BenchArgs`] and calls [`main`].

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use clap::{Args, Subcommand};

/// Load tests of Plaza and its peers.
#[derive(Args)]
pub struct BenchArgs {
    #[command(subcommand)]
    command: BenchCommand,
}

#[derive(Subcommand)]
enum BenchCommand {
    /// Run a scenario against a server (or every server of a targets file)
    /// and report; with --find-max, find the largest passing value.
    ///
    /// Exit status: 0 when every expectation of the scenario held, 1 when one
    /// failed, 2 when the run could not be made.
    Run(Box<RunArgs>),
    /// Run the reference fan-out server: every message a client sends goes
    /// to every other client (no rooms, no features). Drive it with
    /// `--driver broadcast`; it is this machine's practical ceiling.
    ReferenceServer(ReferenceArgs),
    /// Draw latency and throughput charts (SVG, PNG) from the comparison.json
    /// files of earlier sweeps, one line per target; a target in a later
    /// file replaces one of the same name in an earlier file.
    Chart(ChartArgs),
    /// Restart-to-ready time of `plaza serve --data-dir` with N rooms whose
    /// histories are full: fill, stop (SIGTERM, SIGKILL), start again, time
    /// /readyz and every room's answer, check every seq and history, and
    /// report the data directory's size.
    ///
    /// Exit status: 0 when every room came back whole, 1 when one did not,
    /// 2 when the run could not be made.
    Restart(Box<crate::restart::RestartArgs>),
    /// Appends per second a Redis deployment (one server, Sentinels or a
    /// Redis Cluster) takes through Plaza's broker, with their latency and
    /// the CPU of the Redis processes: N rooms, M brokers standing for
    /// nodes, each append delivered to its room's host.
    ///
    /// Exit status: 0 when every acknowledged append was delivered, 1 when
    /// one was not, 2 when the run could not be made.
    Broker(Box<crate::broker_load::BrokerArgs>),
}

#[derive(Args)]
struct ChartArgs {
    /// comparison.json files written by `bench run --find-max --out DIR`.
    #[arg(required = true)]
    files: Vec<PathBuf>,
    /// Directory for latency.svg/png and throughput.svg/png.
    #[arg(long)]
    out: PathBuf,
}

#[derive(Args)]
struct ReferenceArgs {
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1:7800")]
    listen: SocketAddr,
    /// Write coalescing window in ms (0: write at once). Counted from when the
    /// connection's writer runs (after the frame that woke it), and from the
    /// last write while frames keep coming: a frame waits longer than with
    /// Plaza's `write_coalesce_ms` of the same value, which counts from the
    /// frame's event.
    #[arg(long, default_value_t = 2)]
    coalesce_ms: u64,
}

#[derive(Args)]
struct RunArgs {
    /// Scenario file (YAML), e.g. bench/scenarios/room-broadcast.yaml.
    file: PathBuf,
    /// The server: host:port, or a ws:// or http:// URL (its path is ignored).
    #[arg(long, default_value = "127.0.0.1:7700")]
    target: String,
    /// Protocol: plaza, plaza-compact (Plaza with compact messages, plaza.v1.compact), broadcast
    /// (any plain relay), socketio (Socket.IO v4), centrifugo (v6 JSON).
    #[arg(long, default_value = "plaza")]
    driver: String,
    /// Override a scenario parameter, e.g. --set members=500 (repeatable).
    #[arg(long = "set", value_name = "NAME=VALUE", value_parser = parse_override)]
    overrides: Vec<(String, String)>,
    /// The server's pid: its CPU time and RSS are read from /proc.
    #[arg(long)]
    server_pid: Option<u32>,
    /// Users per room whose receipts are timestamped (latency samples),
    /// spread evenly over the room's order of joining.
    #[arg(long, default_value_t = 20)]
    observers: u64,
    /// Threads of the load generator.
    #[arg(long, default_value_t = 1)]
    threads: usize,
    /// Local addresses to connect from, round robin (e.g. 127.0.0.2,127.0.0.3),
    /// for more connections than one source address has ports.
    #[arg(long, value_delimiter = ',')]
    bind: Vec<IpAddr>,
    /// Write result.json and summary.md into this directory.
    #[arg(long)]
    out: Option<PathBuf>,
    /// Longest wait for a connect, a join or a response, in ms.
    #[arg(long, default_value_t = 10_000)]
    timeout_ms: u64,
    /// Run against every server of this targets file (YAML; see
    /// bench/targets.yaml), starting and stopping the ones it has a `start`
    /// for — a fresh server for every run. Replaces --target and --driver.
    #[arg(long)]
    targets: Option<PathBuf>,
    /// With --targets: only these targets (comma-separated names).
    #[arg(long, value_delimiter = ',')]
    only: Vec<String>,
    /// Step a parameter until a run fails, e.g. members=100..3000/100; report
    /// the largest value whose run passed (every expectation held).
    #[arg(long, value_name = "PARAM=FROM..TO/STEP")]
    find_max: Option<String>,
    /// With --find-max: bisect between the last pass and the first failure
    /// until they are this close (default: the step, no bisection).
    #[arg(long)]
    resolution: Option<u64>,
    /// Pin the server to these CPUs (e.g. 0 or 0-1): servers started from a
    /// targets file at launch, a --server-pid server on every thread.
    #[arg(long, value_name = "LIST")]
    server_cpus: Option<String>,
    /// Cap the server's CPU time to this many CPUs (e.g. 1, 0.25) with a
    /// cgroup v1 CPU quota (needs a writable /sys/fs/cgroup/cpu).
    #[arg(long, value_name = "CPUS")]
    server_cpu_quota: Option<f64>,
    /// Pin this load generator to these CPUs (e.g. 1).
    #[arg(long, value_name = "LIST")]
    generator_cpus: Option<String>,
    /// No live progress (it is also off when stderr is not a terminal).
    #[arg(long)]
    quiet: bool,
    /// Spread the users over this many load processes (copies of this
    /// command started by it), for more connections than one process may
    /// open; results are added up. Not with --targets or --find-max.
    #[arg(long, default_value_t = 1)]
    processes: u64,
    /// Internal: this process's share of a multi-process run, I/N.
    #[arg(long, hide = true)]
    shard: Option<String>,
    /// Internal: unix time (ms) at which the shards start their schedules.
    #[arg(long, hide = true)]
    start_at_ms: Option<u64>,
}

fn parse_override(s: &str) -> Result<(String, String), String> {
    let (k, v) = s
        .split_once('=')
        .ok_or_else(|| format!("expected NAME=VALUE, got {s:?}"))?;
    Ok((k.trim().to_owned(), v.trim().to_owned()))
}

/// Runs `plaza bench ...`.
/// Runs a `plaza bench` command; the exit status as documented per subcommand.
pub fn main(args: BenchArgs) -> ExitCode {
    match args.command {
        BenchCommand::Run(a) => match run(*a) {
            Ok(true) => ExitCode::SUCCESS,
            Ok(false) => ExitCode::from(1),
            Err(e) => {
                eprintln!("plaza bench: {e}");
                ExitCode::from(2)
            }
        },
        BenchCommand::Chart(a) => match chart(a) {
            Ok(paths) => {
                for p in paths {
                    println!("{}", p.display());
                }
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("plaza bench chart: {e}");
                ExitCode::from(2)
            }
        },
        BenchCommand::Restart(a) => crate::restart::main(*a),
        BenchCommand::Broker(a) => crate::broker_load::main(*a),
        BenchCommand::ReferenceServer(a) => match reference_server(a) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("plaza bench reference-server: {e}");
                ExitCode::from(2)
            }
        },
    }
}

fn chart(a: ChartArgs) -> Result<Vec<PathBuf>, String> {
    let mut title = String::new();
    let mut all: Vec<crate::chart::Series> = Vec::new();
    for f in &a.files {
        let text = std::fs::read(f).map_err(|e| format!("{}: {e}", f.display()))?;
        let v: serde_json::Value =
            serde_json::from_slice(&text).map_err(|e| format!("{}: {e}", f.display()))?;
        let (name, series) = crate::compare::series_from_json(&v);
        title = name;
        for s in series {
            all.retain(|old| old.target != s.target);
            all.push(s);
        }
    }
    crate::chart::draw_sweep_charts(&title, &all, &a.out).map_err(|e| e.to_string())
}

/// One thread: the server under test gets one core in every comparison.
fn reference_server(a: ReferenceArgs) -> Result<(), String> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    let config = crate::reference::ReferenceConfig {
        coalesce: Duration::from_millis(a.coalesce_ms),
    };
    rt.block_on(crate::reference::bind_and_serve(a.listen, config, |addr| {
        println!("reference server listening on {addr}")
    }))
    .map_err(|e| format!("{}: {e}", a.listen))
}

fn run(a: RunArgs) -> Result<bool, String> {
    use crate::{compare, cpucap, sweep, targets};

    let yaml =
        std::fs::read_to_string(&a.file).map_err(|e| format!("{}: {e}", a.file.display()))?;
    // Parsed up front so that a bad file or --set fails before anything starts.
    crate::Scenario::parse(&yaml, &a.overrides).map_err(|e| e.to_string())?;
    if let Some(list) = &a.generator_cpus {
        let cpus = cpucap::parse_cpu_list(list).map_err(|e| format!("--generator-cpus: {e}"))?;
        // Before the runtime exists: its threads inherit the affinity.
        cpucap::set_affinity(0, &cpus).map_err(|e| format!("--generator-cpus {list}: {e}"))?;
    }
    let caps = targets::ServerCaps {
        cpus: a
            .server_cpus
            .as_deref()
            .map(cpucap::parse_cpu_list)
            .transpose()
            .map_err(|e| format!("--server-cpus: {e}"))?,
        quota: a.server_cpu_quota,
    };
    let sweep = a
        .find_max
        .as_deref()
        .map(|spec| {
            let (param, range) = spec
                .split_once('=')
                .ok_or_else(|| format!("--find-max {spec}: expected PARAM=FROM..TO/STEP"))?;
            let (from, to, step) =
                sweep::parse_range(range).map_err(|e| format!("--find-max: {e}"))?;
            let step = step.unwrap_or(from.max(1));
            Ok::<_, String>(sweep::SweepSpec {
                param: param.trim().to_owned(),
                from,
                step,
                to,
                resolution: a.resolution.unwrap_or(step),
            })
        })
        .transpose()?;
    let target_list = match &a.targets {
        Some(path) => {
            let text =
                std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
            let file = targets::TargetsFile::parse(&text)
                .map_err(|e| format!("{}: {e}", path.display()))?;
            let picked: Vec<_> = file
                .targets
                .into_iter()
                .filter(|t| a.only.is_empty() || a.only.contains(&t.name))
                .collect();
            if picked.is_empty() {
                return Err(format!("--only {:?}: no such target", a.only.join(",")));
            }
            picked
        }
        None => {
            targets::resolve(&a.target)?;
            vec![targets::TargetSpec {
                name: a.driver.clone(),
                driver: a.driver.clone(),
                address: targets::address_of(&a.target).to_owned(),
                start: None,
                cwd: None,
                env: Default::default(),
                ready_timeout_s: 30,
            }]
        }
    };
    // A running server given by pid is confined here; started ones at launch.
    let _quota = match a.server_pid {
        Some(pid) if a.targets.is_none() => {
            if let Some(cpus) = &caps.cpus {
                cpucap::pin_process(pid, cpus).map_err(|e| format!("--server-cpus: {e}"))?;
            }
            caps.quota
                .map(|q| cpucap::CpuQuota::apply(pid, q))
                .transpose()
                .map_err(|e| format!("--server-cpu-quota: {e}"))?
        }
        _ => None,
    };
    if a.shard.is_some() || a.processes > 1 {
        if a.targets.is_some() || a.find_max.is_some() {
            return Err("--processes works with one --target, without --find-max".into());
        }
        return match &a.shard {
            Some(shard) => run_shard(&a, shard, &yaml),
            None => run_processes(&a, &yaml),
        };
    }
    let rt = generator_runtime(a.threads)?;
    let live = progress_display(a.quiet);
    // A plain run (one running server, no sweep) writes its report into DIR
    // itself; comparisons write one directory per target and point.
    let plain = a.targets.is_none() && sweep.is_none();
    let plan = compare::Plan {
        scenario_yaml: yaml,
        overrides: a.overrides.clone(),
        sweep,
        targets: target_list,
        caps,
        server_pid: a.server_pid,
        observers_per_room: a.observers,
        bind: a.bind.clone(),
        timeout: Duration::from_millis(a.timeout_ms),
        out: if plain { None } else { a.out.clone() },
        say: live.say,
        progress: live.progress,
    };
    let comparison = compare::run_plan(&plan, &rt)?;
    live.bar.finish_and_clear();
    if plain {
        let t = &comparison.targets[0];
        if let Some(why) = &t.skipped {
            return Err(why.clone());
        }
        let report = &t.points[0].report;
        println!("{}", report.markdown());
        if let Some(dir) = &a.out {
            report.write_to(dir)?;
        }
        return Ok(report.passed);
    }
    println!("{}", compare::markdown(&comparison));
    if plan.sweep.is_some() {
        // A sweep passes when every target had a passing value.
        Ok(comparison
            .targets
            .iter()
            .all(|t| t.skipped.is_none() && t.max_passing.is_some()))
    } else {
        Ok(comparison
            .targets
            .iter()
            .all(|t| t.skipped.is_none() && t.points.iter().all(|p| p.passed)))
    }
}

/// The load generator's runtime: its worker threads inherit the affinity
/// set by --generator-cpus.
fn generator_runtime(threads: usize) -> Result<tokio::runtime::Runtime, String> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(threads.max(1))
        .enable_all()
        .build()
        .map_err(|e| e.to_string())
}

fn single_options(a: &RunArgs) -> Result<crate::RunOptions, String> {
    use crate::targets;
    Ok(crate::RunOptions {
        addr: targets::resolve(&a.target)?,
        host: targets::address_of(&a.target).to_owned(),
        driver: crate::driver::by_name(&a.driver)?,
        observers_per_room: a.observers,
        server_pid: a.server_pid,
        bind: a.bind.clone(),
        timeout: Duration::from_millis(a.timeout_ms),
        progress: None,
        shard: None,
    })
}

/// A child of a multi-process run: its share of the users; the result goes
/// to stdout for the parent.
fn run_shard(a: &RunArgs, shard: &str, yaml: &str) -> Result<bool, String> {
    use crate::multiproc;
    let (index, count) = multiproc::parse_shard(shard).map_err(|e| format!("--shard: {e}"))?;
    let start_at = a.start_at_ms.ok_or("--shard needs --start-at-ms")?;
    let scenario = crate::Scenario::parse(yaml, &a.overrides).map_err(|e| e.to_string())?;
    let mut opts = single_options(a)?;
    let rt = generator_runtime(a.threads)?;
    let raw = rt.block_on(async {
        let (link, forward) = multiproc::child_shard(index, count, start_at);
        opts.shard = Some(link);
        tokio::spawn(forward);
        crate::run_raw(&scenario, opts).await
    });
    let raw = raw.map_err(|e| e.to_string())?;
    multiproc::print_result(&raw)?;
    Ok(true)
}

/// The parent of a multi-process run: starts the shards, adds up their
/// counts and reports like a single run.
fn run_processes(a: &RunArgs, yaml: &str) -> Result<bool, String> {
    let scenario = crate::Scenario::parse(yaml, &a.overrides).map_err(|e| e.to_string())?;
    single_options(a)?;
    let users = crate::Schedule::new(&scenario.phases).arrivals.len() as u64;
    // The users whose joins the coordinator waits for (server-API callers
    // never join).
    let users = scenario.members(users);
    let mut args: Vec<std::ffi::OsString> = vec![
        "bench".into(),
        "run".into(),
        a.file.clone().into(),
        "--target".into(),
        a.target.clone().into(),
        "--driver".into(),
        a.driver.clone().into(),
        "--observers".into(),
        a.observers.to_string().into(),
        "--threads".into(),
        a.threads.to_string().into(),
        "--timeout-ms".into(),
        a.timeout_ms.to_string().into(),
    ];
    for (k, v) in &a.overrides {
        args.push("--set".into());
        args.push(format!("{k}={v}").into());
    }
    if let Some(pid) = a.server_pid {
        args.push("--server-pid".into());
        args.push(pid.to_string().into());
    }
    if !a.bind.is_empty() {
        let list: Vec<String> = a.bind.iter().map(ToString::to_string).collect();
        args.push("--bind".into());
        args.push(list.join(",").into());
    }
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let raw =
        crate::multiproc::run_processes(&exe, &args, a.processes, users, Duration::from_secs(2))?;
    let report = crate::report::Report::build(&scenario, &raw);
    println!("{}", report.markdown());
    println!("({} load processes)", a.processes);
    if let Some(dir) = &a.out {
        report.write_to(dir)?;
    }
    Ok(report.passed)
}

/// Live progress on a terminal: a bar with the phase and counts, and news
/// lines printed above it. Off the terminal, news lines go to stderr only.
struct LiveDisplay {
    bar: indicatif::ProgressBar,
    say: Arc<dyn Fn(&str) + Send + Sync>,
    progress: Option<crate::ProgressFn>,
}

fn progress_display(quiet: bool) -> LiveDisplay {
    use std::io::IsTerminal;
    if quiet || !std::io::stderr().is_terminal() {
        return LiveDisplay {
            bar: indicatif::ProgressBar::hidden(),
            say: Arc::new(|line| eprintln!("{line}")),
            progress: None,
        };
    }
    let bar = indicatif::ProgressBar::new(1);
    bar.set_style(
        indicatif::ProgressStyle::with_template(
            "{spinner} [{elapsed_precise}] {bar:30} {pos}/{len} s  {msg}",
        )
        .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );
    let say_bar = bar.clone();
    let tell_bar = bar.clone();
    let last = std::sync::Mutex::new((std::time::Instant::now(), 0u64));
    LiveDisplay {
        bar,
        say: Arc::new(move |line| say_bar.println(line)),
        progress: Some(Arc::new(move |p: &crate::Progress| {
            let mut last = last.lock().unwrap_or_else(|e| e.into_inner());
            let dt = last.0.elapsed().as_secs_f64().max(1e-3);
            let rate = p.deliveries.saturating_sub(last.1) as f64 / dt;
            *last = (std::time::Instant::now(), p.deliveries);
            tell_bar.set_length(p.total.as_secs().max(1));
            tell_bar.set_position(p.elapsed.as_secs().min(p.total.as_secs()));
            tell_bar.set_message(format!(
                "{}: joined {}/{}, {:.0} deliveries/s, {} errors",
                p.phase, p.joined, p.users, rate, p.errors
            ));
        })),
    }
}
