//! `plaza bench`: runs load-test scenarios (see crates/bench).

use std::net::{IpAddr, SocketAddr, ToSocketAddrs};
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
    /// Run a scenario file against a running server and report.
    ///
    /// Exit status: 0 when every expectation of the scenario held, 1 when one
    /// failed, 2 when the run could not be made.
    Run(RunArgs),
}

#[derive(Args)]
struct RunArgs {
    /// Scenario file (YAML), e.g. bench/scenarios/room-broadcast.yaml.
    file: PathBuf,
    /// The server: host:port, or a ws:// or http:// URL (its path is ignored).
    #[arg(long, default_value = "127.0.0.1:7700")]
    target: String,
    /// Protocol: plaza, broadcast (any plain relay), socketio (Socket.IO v4), centrifugo (v6 JSON).
    #[arg(long, default_value = "plaza")]
    driver: String,
    /// Override a scenario parameter, e.g. --set members=500 (repeatable).
    #[arg(long = "set", value_name = "NAME=VALUE", value_parser = parse_override)]
    overrides: Vec<(String, String)>,
    /// The server's pid: its CPU time and RSS are read from /proc.
    #[arg(long)]
    server_pid: Option<u32>,
    /// Users per room whose receipts are timestamped (latency samples).
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
}

fn parse_override(s: &str) -> Result<(String, String), String> {
    let (k, v) = s
        .split_once('=')
        .ok_or_else(|| format!("expected NAME=VALUE, got {s:?}"))?;
    Ok((k.trim().to_owned(), v.trim().to_owned()))
}

fn resolve(target: &str) -> Result<(SocketAddr, String), String> {
    let rest = target
        .strip_prefix("ws://")
        .or_else(|| target.strip_prefix("http://"))
        .unwrap_or(target);
    let host = rest.split('/').next().unwrap_or(rest);
    let addr = host
        .to_socket_addrs()
        .map_err(|e| format!("--target {target}: {e}"))?
        .next()
        .ok_or_else(|| format!("--target {target}: no address"))?;
    Ok((addr, host.to_owned()))
}

/// Runs `plaza bench ...`.
pub fn main(args: BenchArgs) -> ExitCode {
    match args.command {
        BenchCommand::Run(a) => match run(a) {
            Ok(true) => ExitCode::SUCCESS,
            Ok(false) => ExitCode::from(1),
            Err(e) => {
                eprintln!("plaza bench: {e}");
                ExitCode::from(2)
            }
        },
    }
}

fn run(a: RunArgs) -> Result<bool, String> {
    let yaml =
        std::fs::read_to_string(&a.file).map_err(|e| format!("{}: {e}", a.file.display()))?;
    let scenario = plaza_bench::Scenario::parse(&yaml, &a.overrides).map_err(|e| e.to_string())?;
    let driver = plaza_bench::driver::by_name(&a.driver).ok_or_else(|| {
        format!(
            "unknown --driver {:?} (one of: {})",
            a.driver,
            plaza_bench::driver::DRIVERS.join(", ")
        )
    })?;
    let (addr, host) = resolve(&a.target)?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(a.threads.max(1))
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    let opts = plaza_bench::RunOptions {
        addr,
        host,
        driver: Arc::from(driver),
        observers_per_room: a.observers,
        server_pid: a.server_pid,
        bind: a.bind,
        timeout: Duration::from_millis(a.timeout_ms),
    };
    let report = rt
        .block_on(plaza_bench::run(&scenario, opts))
        .map_err(|e| e.to_string())?;
    let summary = report.markdown();
    println!("{summary}");
    if let Some(dir) = &a.out {
        std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let json = serde_json::to_string_pretty(&report).map_err(|e| e.to_string())?;
        std::fs::write(dir.join("result.json"), json).map_err(|e| e.to_string())?;
        std::fs::write(dir.join("summary.md"), &summary).map_err(|e| e.to_string())?;
    }
    Ok(report.passed)
}
