//! `plaza cluster up`: a whole cluster on this machine (Redis, N nodes, nginx or HAProxy), for
//! development. Production runs the same pieces as services: deploy/README.md.

use std::io::Write;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Subcommand};
use plaza_launch::{ClusterOptions, LbKind, LocalCluster};

/// `plaza cluster …`
#[derive(Args)]
pub struct ClusterArgs {
    #[command(subcommand)]
    command: ClusterCommand,
}

#[derive(Subcommand)]
enum ClusterCommand {
    /// Start Redis, N nodes (`plaza serve --redis …`) and a load balancer on loopback, print
    /// their addresses, and run until Ctrl-C or SIGTERM, then stop them all.
    Up(UpArgs),
}

#[derive(Args)]
struct UpArgs {
    /// How many nodes.
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u16).range(1..))]
    nodes: u16,
    /// The load balancer: nginx or haproxy (configured from deploy/).
    #[arg(long, default_value = "nginx")]
    lb: LbKind,
    /// Where the load balancer listens (an address on 127.0.0.1).
    #[arg(long, default_value = "127.0.0.1:7700")]
    listen: SocketAddr,
    /// Directory for Redis's data and every log, kept on exit [default: a new directory in
    /// the system's temporary directory, removed after a clean stop].
    #[arg(long)]
    dir: Option<PathBuf>,
    /// No Redis, and nodes without --redis, each with rooms of its own: only for trying the
    /// load balancer's routing.
    #[arg(long)]
    embedded: bool,
    /// Arguments for every node's `plaza serve`, after `--` (e.g. `-- --auto-create-rooms`).
    #[arg(last = true)]
    node_args: Vec<String>,
}

/// Runs `plaza cluster …`.
pub fn main(args: ClusterArgs) -> ExitCode {
    match args.command {
        ClusterCommand::Up(up) => match run_up(up) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("plaza cluster up: {e}");
                ExitCode::FAILURE
            }
        },
    }
}

fn run_up(args: UpArgs) -> Result<(), String> {
    if args.listen.ip() != std::net::Ipv4Addr::LOCALHOST {
        return Err(format!(
            "--listen {}: the local cluster listens on 127.0.0.1 only",
            args.listen
        ));
    }
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("tokio runtime: {e}"))?;
    // The handlers go in before the first child starts: the children have process groups of
    // their own, so a signal that killed this process during start-up would leave them behind.
    let mut stop_signals = {
        let _rt = rt.enter();
        StopSignals::new().map_err(|e| format!("signal handlers: {e}"))?
    };

    let (dir, temporary) = match args.dir {
        Some(d) => (d, false),
        None => {
            let d = std::env::temp_dir().join(format!("plaza-cluster-{}", std::process::id()));
            // A leftover of an earlier process with this pid: nobody else owns it.
            let _ = std::fs::remove_dir_all(&d);
            (d, true)
        }
    };
    let plaza_bin = std::env::current_exe().map_err(|e| format!("own executable: {e}"))?;
    let mut cluster = LocalCluster::start(ClusterOptions {
        plaza_bin,
        nodes: usize::from(args.nodes),
        lb: args.lb,
        listen_port: args.listen.port(),
        dir: dir.clone(),
        node_args: args.node_args,
        embedded: args.embedded,
    })
    .map_err(|e| format!("{e}\n(data and logs in {})", dir.display()))?;
    print_cluster(&cluster);

    rt.block_on(stop_signals.recv());
    eprintln!("plaza cluster up: stopping");
    if let Err(e) = cluster.stop() {
        return Err(format!(
            "while stopping: {e}\n(data and logs in {})",
            cluster.dir().display()
        ));
    }
    drop(cluster);
    if temporary {
        let _ = std::fs::remove_dir_all(&dir);
    }
    Ok(())
}

fn print_cluster(c: &LocalCluster) {
    let pid = |p: Option<u32>| p.map_or(String::new(), |p| format!("  (pid {p})"));
    let lb = c.lb();
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "Plaza cluster is up; Ctrl-C stops it.");
    let _ = writeln!(
        out,
        "  load balancer  {:<8} {}/  ws://{}/v1/ws?room=ID{}",
        lb.kind(),
        lb.url(),
        lb.addr(),
        pid(lb.pid())
    );
    match c.redis() {
        Some(r) => {
            let _ = writeln!(out, "  redis          {}{}", r.url(), pid(r.pid()));
        }
        None => {
            let _ = writeln!(out, "  redis          none (embedded nodes)");
        }
    }
    for n in c.nodes() {
        let _ = writeln!(out, "  {:<14} {}{}", n.id(), n.url(), pid(n.pid()));
    }
    let _ = writeln!(out, "  data and logs  {}", c.dir().display());
    let _ = out.flush();
}

/// SIGTERM or SIGINT (Ctrl-C).
struct StopSignals {
    term: tokio::signal::unix::Signal,
    int: tokio::signal::unix::Signal,
}

impl StopSignals {
    fn new() -> std::io::Result<StopSignals> {
        use tokio::signal::unix::{signal, SignalKind};
        Ok(StopSignals {
            term: signal(SignalKind::terminate())?,
            int: signal(SignalKind::interrupt())?,
        })
    }

    async fn recv(&mut self) {
        tokio::select! {
            _ = self.term.recv() => {}
            _ = self.int.recv() => {}
        }
    }
}
