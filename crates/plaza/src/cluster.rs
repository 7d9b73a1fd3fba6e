//! `plaza cluster up`: a whole cluster on this machine (Redis, N nodes, nginx or HAProxy), for
//! development. Production runs the same pieces as services: deploy/README.md.

use std::io::Write;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Subcommand};
use plaza_launch::{ClusterOptions, CpuQuota, CpuQuotas, LbKind, LocalCluster};

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
    /// Instead of one Redis: a primary, two replicas and three Sentinels (redis-server
    /// --sentinel) on loopback, the nodes given --redis redis+sentinel://…; a primary silent
    /// for 1 s is failed over. Try `-- --broker-ack replicas:1` with it.
    #[arg(long, conflicts_with = "embedded")]
    redis_sentinel: bool,
    /// Instead of one Redis: a Redis Cluster of N primaries (3 to 16; failover needs a majority
    /// of at least 3), each with a replica, on loopback, the nodes given --redis
    /// redis+cluster://… listing every server; a primary silent for 1 s is failed over.
    #[arg(
        long,
        value_name = "N",
        value_parser = clap::value_parser!(u16).range(3..=16),
        conflicts_with_all = ["embedded", "redis_sentinel", "redis_cpu_quota"]
    )]
    redis_cluster: Option<u16>,
    /// Run each node in a cgroup of its own capped at this many CPUs (e.g. 0.25; cgroup v1
    /// CPU quota, needs a writable /sys/fs/cgroup/cpu). The cgroups are removed on exit.
    #[arg(long, value_name = "CPUS", value_parser = parse_cpus)]
    node_cpu_quota: Option<f64>,
    /// Cap Redis at this many CPUs, as --node-cpu-quota.
    #[arg(long, value_name = "CPUS", value_parser = parse_cpus)]
    redis_cpu_quota: Option<f64>,
    /// Cap the load balancer (nginx's master and workers together) at this many CPUs, as
    /// --node-cpu-quota.
    #[arg(long, value_name = "CPUS", value_parser = parse_cpus)]
    lb_cpu_quota: Option<f64>,
    /// nginx's worker processes [default: auto, one per CPU]. For benchmarks, where nginx
    /// shares the machine with the nodes and the load generator.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u16).range(1..))]
    lb_workers: Option<u16>,
    /// The first node's port on 127.0.0.1; node-2 gets the next, and so on [default: free
    /// ports]. The balancer hashes rooms onto nodes by address: fixed ports put the same rooms
    /// on the same nodes in every run.
    #[arg(long, value_name = "PORT", value_parser = clap::value_parser!(u16).range(1..))]
    node_ports: Option<u16>,
    /// Arguments for every node's `plaza serve`, after `--` (e.g. `-- --auto-create-rooms`).
    #[arg(last = true)]
    node_args: Vec<String>,
}

fn parse_cpus(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(c) if c > 0.0 && c.is_finite() => Ok(c),
        _ => Err(format!("expected a positive number of CPUs, got {s:?}")),
    }
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
    if args.lb_workers.is_some() && args.lb != LbKind::Nginx {
        return Err("--lb-workers is an nginx setting: HAProxy's template has none".into());
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
    // This (main) thread lives as long as the command: if the command is killed outright, the
    // children are told to stop too, instead of holding their ports.
    plaza_launch::tie_children_to_this_thread();
    let mut cluster = LocalCluster::start(ClusterOptions {
        plaza_bin,
        nodes: usize::from(args.nodes),
        lb: args.lb,
        listen_port: args.listen.port(),
        dir: dir.clone(),
        node_args: args.node_args,
        embedded: args.embedded,
        redis_sentinel: args.redis_sentinel,
        redis_cluster: args.redis_cluster.map(usize::from),
        cpu_quotas: CpuQuotas {
            node: args.node_cpu_quota,
            redis: args.redis_cpu_quota,
            lb: args.lb_cpu_quota,
        },
        lb_workers: args.lb_workers.map(usize::from),
        node_ports: args.node_ports,
    })
    .map_err(|e| format!("{e}\n(data and logs in {})", dir.display()))?;
    print_cluster(&cluster);

    rt.block_on(stop_signals.recv());
    eprintln!("plaza cluster up: stopping");
    // The cgroups of CPU quotas go with the cluster (dropped below, every process reaped).
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
    // The quota goes before the pid: scripts (and tests) read the pid from the line's end.
    let pid = |p: Option<u32>, q: Option<&CpuQuota>| {
        let quota = q.map_or(String::new(), |q| format!("  cpu quota {}", q.cpus()));
        let pid = p.map_or(String::new(), |p| format!("  (pid {p})"));
        quota + &pid
    };
    let lb = c.lb();
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "Plaza cluster is up; Ctrl-C stops it.");
    let _ = writeln!(
        out,
        "  load balancer  {:<8} {}/  ws://{}/v1/ws?room=ID{}",
        lb.kind(),
        lb.url(),
        lb.addr(),
        pid(lb.pid(), lb.cpu_quota())
    );
    match (c.redis(), c.sentinels()) {
        (Some(r), _) => {
            let _ = writeln!(
                out,
                "  redis          {}{}",
                r.url(),
                pid(r.pid(), r.cpu_quota())
            );
        }
        (None, Some(s)) => {
            let _ = writeln!(out, "  redis          {}", s.url());
            for (i, r) in s.servers().iter().enumerate() {
                let role = if i == 0 { "primary" } else { "replica" };
                let _ = writeln!(out, "    {role:<12} {}{}", r.url(), pid(r.pid(), None));
            }
            let pids = s.sentinel_pids();
            for (i, addr) in s.sentinel_addrs().iter().enumerate() {
                let p = pid(pids.get(i).copied(), None);
                let _ = writeln!(out, "    sentinel     {addr}{p}");
            }
        }
        (None, None) => match c.redis_cluster() {
            Some(rc) => {
                let _ = writeln!(out, "  redis          {}", rc.seed_url());
                for (i, r) in rc.servers().iter().enumerate() {
                    let role = match rc.initial_slots(i) {
                        Some(slots) => format!(
                            "primary      {}  slots {}-{}",
                            r.url(),
                            slots.start(),
                            slots.end()
                        ),
                        None => format!("replica      {}", r.url()),
                    };
                    let _ = writeln!(out, "    {role}{}", pid(r.pid(), None));
                }
            }
            None => {
                let _ = writeln!(out, "  redis          none (embedded nodes)");
            }
        },
    }
    for n in c.nodes() {
        let _ = writeln!(
            out,
            "  {:<14} {}{}",
            n.id(),
            n.url(),
            pid(n.pid(), n.cpu_quota())
        );
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
