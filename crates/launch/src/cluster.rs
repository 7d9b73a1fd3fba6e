//! A whole local cluster: Redis, N nodes, a load balancer.

use std::io;
use std::path::{Path, PathBuf};
use std::process::ExitStatus;

use crate::proc::check_port_free;
use crate::{
    LbKind, LbOptions, LoadBalancer, NodeOptions, NodeProcess, RedisCluster, RedisProcess,
    RedisSentinels,
};

/// What [`LocalCluster::start`] starts.
#[derive(Debug, Clone)]
pub struct ClusterOptions {
    /// The `plaza` executable the nodes run.
    pub plaza_bin: PathBuf,
    /// How many nodes (at least 1); their ids are `node-1`, `node-2`, ….
    pub nodes: usize,
    /// nginx or HAProxy.
    pub lb: LbKind,
    /// The load balancer's port on 127.0.0.1; 0 picks a free one.
    pub listen_port: u16,
    /// Holds everything: `redis/` (data and log), `nodes/<id>.log`, `lb/` (configuration,
    /// logs). Created if needed.
    pub dir: PathBuf,
    /// Arguments appended to every node's `plaza serve` command line.
    pub node_args: Vec<String>,
    /// Start no Redis and run the nodes without `--redis`, each with its own in-memory broker:
    /// rooms are then per node, which only suits trying the load balancer's routing.
    pub embedded: bool,
    /// Instead of one Redis, a primary with two replicas watched by three Sentinels
    /// ([`RedisSentinels`]); the nodes get `--redis redis+sentinel://…`. Refused with
    /// `embedded` and with a Redis CPU quota.
    pub redis_sentinel: bool,
    /// Instead of one Redis, a Redis Cluster of this many primaries (from
    /// [`MIN_PRIMARIES`](crate::MIN_PRIMARIES) to [`MAX_PRIMARIES`](crate::MAX_PRIMARIES)),
    /// each with a replica ([`RedisCluster`]); the nodes get `--redis redis+cluster://…`
    /// listing every server. Refused with `redis_sentinel`, with `embedded` and with a Redis
    /// CPU quota.
    pub redis_cluster: Option<usize>,
    /// CPU quotas (cgroup v1) for the cluster's processes; the default: none.
    pub cpu_quotas: CpuQuotas,
    /// nginx's worker processes; `None`: `auto` (one per CPU). Refused with HAProxy.
    pub lb_workers: Option<usize>,
    /// The first node's port: node `i` (1-based) listens on `node_ports + i - 1`. The
    /// balancers place nodes on their hash ring by address, so fixed ports make the rooms land
    /// on the same nodes in every run (benchmarks). `None`: free ports.
    pub node_ports: Option<u16>,
}

/// CPU quotas, in CPUs (e.g. 0.25), for the processes of a [`LocalCluster`]: each node, Redis
/// and the load balancer get a cgroup of their own (see [`crate::CpuQuota`]), removed when the
/// cluster is dropped. `None`: no quota.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct CpuQuotas {
    /// For each node separately (not shared between nodes); kept across restarts.
    pub node: Option<f64>,
    /// For Redis.
    pub redis: Option<f64>,
    /// For the load balancer (nginx's master and workers together).
    pub lb: Option<f64>,
}

/// A running local cluster; everything in it is killed when dropped, [`stop`](Self::stop)
/// shuts it down in order.
pub struct LocalCluster {
    // Fields drop in this order: clients lose the balancer first, Redis goes last.
    lb: LoadBalancer,
    nodes: Vec<NodeProcess>,
    redis: Option<RedisProcess>,
    sentinels: Option<RedisSentinels>,
    redis_cluster: Option<RedisCluster>,
    dir: PathBuf,
}

impl LocalCluster {
    /// Starts Redis (unless `embedded`; with Sentinels if `redis_sentinel`, a Redis Cluster
    /// if `redis_cluster`), the nodes
    /// (`--redis` its URL), then the load
    /// balancer in front of them, each waited for until it is ready.
    pub fn start(opts: ClusterOptions) -> io::Result<LocalCluster> {
        if opts.nodes == 0 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "a cluster needs at least one node",
            ));
        }
        let quotas = [
            ("node", opts.cpu_quotas.node),
            ("redis", opts.cpu_quotas.redis),
            ("load balancer", opts.cpu_quotas.lb),
        ];
        for (what, cpus) in quotas {
            // Before anything starts, rather than after Redis and some nodes did.
            if let Some(cpus) = cpus.filter(|c| !(*c > 0.0 && c.is_finite())) {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!("{what} CPU quota must be positive, got {cpus}"),
                ));
            }
        }
        if let Some(first) = opts.node_ports {
            if first == 0 || usize::from(first) + opts.nodes - 1 > usize::from(u16::MAX) {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!("{} nodes from port {first}: not in 1..=65535", opts.nodes),
                ));
            }
        }
        if opts.redis_sentinel && (opts.embedded || opts.cpu_quotas.redis.is_some()) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "Redis with Sentinels goes with neither embedded nodes nor a Redis CPU quota",
            ));
        }
        if opts.redis_cluster.is_some()
            && (opts.embedded || opts.redis_sentinel || opts.cpu_quotas.redis.is_some())
        {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "a Redis Cluster goes with neither embedded nodes, Sentinels nor a Redis CPU \
                 quota",
            ));
        }
        if opts.listen_port != 0 {
            // Before anything starts: a taken port would otherwise show only at the end.
            check_port_free(opts.listen_port, &format!("{} cannot listen", opts.lb))?;
        }
        std::fs::create_dir_all(&opts.dir)?;
        let dir = opts.dir.canonicalize()?;
        let sentinels = match opts.redis_sentinel {
            true => Some(RedisSentinels::start(&dir.join("redis"))?),
            false => None,
        };
        let redis_cluster = match opts.redis_cluster {
            Some(primaries) => Some(RedisCluster::start(&dir.join("redis"), primaries)?),
            None => None,
        };
        let redis = match opts.embedded || opts.redis_sentinel || redis_cluster.is_some() {
            true => None,
            false => Some(RedisProcess::start_with_quota(
                &dir.join("redis"),
                opts.cpu_quotas.redis,
            )?),
        };
        let redis_url = match (&redis, &sentinels, &redis_cluster) {
            (Some(r), _, _) => Some(r.url()),
            (None, Some(s), _) => Some(s.url()),
            (None, None, Some(c)) => Some(c.seed_url()),
            (None, None, None) => None,
        };
        let mut nodes = Vec::with_capacity(opts.nodes);
        for i in 1..=opts.nodes {
            let node = NodeProcess::start(
                &opts.plaza_bin,
                NodeOptions {
                    redis_url: redis_url.clone(),
                    extra_args: opts.node_args.clone(),
                    log_dir: Some(dir.join("nodes")),
                    cpu_quota: opts.cpu_quotas.node,
                    // Fits: checked above.
                    port: opts.node_ports.map_or(0, |first| first + (i - 1) as u16),
                    ..NodeOptions::new(format!("node-{i}"))
                },
            )?;
            nodes.push(node);
        }
        let upstreams: Vec<_> = nodes.iter().map(NodeProcess::addr).collect();
        // Last: clients that can connect to the balancer find every node ready.
        let lb = LoadBalancer::start_with(
            opts.lb,
            opts.listen_port,
            &upstreams,
            &dir.join("lb"),
            LbOptions {
                workers: opts.lb_workers,
                cpu_quota: opts.cpu_quotas.lb,
                ..LbOptions::default()
            },
        )?;
        Ok(LocalCluster {
            lb,
            nodes,
            redis,
            sentinels,
            redis_cluster,
            dir,
        })
    }

    /// The load balancer's URL, `http://127.0.0.1:PORT`: where clients connect.
    pub fn url(&self) -> String {
        self.lb.url()
    }

    /// The directory holding data and logs.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The load balancer.
    pub fn lb(&self) -> &LoadBalancer {
        &self.lb
    }

    /// Redis (`None` in embedded mode).
    pub fn redis(&self) -> Option<&RedisProcess> {
        self.redis.as_ref()
    }

    /// Redis, to kill or restart it (`None` in embedded mode).
    pub fn redis_mut(&mut self) -> Option<&mut RedisProcess> {
        self.redis.as_mut()
    }

    /// The Redis servers and their Sentinels, when started with `redis_sentinel`.
    pub fn sentinels(&self) -> Option<&RedisSentinels> {
        self.sentinels.as_ref()
    }

    /// The Redis servers and their Sentinels, to kill a server.
    pub fn sentinels_mut(&mut self) -> Option<&mut RedisSentinels> {
        self.sentinels.as_mut()
    }

    /// The Redis Cluster, when started with `redis_cluster`.
    pub fn redis_cluster(&self) -> Option<&RedisCluster> {
        self.redis_cluster.as_ref()
    }

    /// The Redis Cluster, to kill a primary or move a slot.
    pub fn redis_cluster_mut(&mut self) -> Option<&mut RedisCluster> {
        self.redis_cluster.as_mut()
    }

    /// The nodes, in start order (`node-1` first).
    pub fn nodes(&self) -> &[NodeProcess] {
        &self.nodes
    }

    /// Node `i` (0-based). Panics if out of range.
    pub fn node(&self, i: usize) -> &NodeProcess {
        &self.nodes[i]
    }

    /// Node `i` (0-based), to signal or restart it. Panics if out of range.
    pub fn node_mut(&mut self, i: usize) -> &mut NodeProcess {
        &mut self.nodes[i]
    }

    /// SIGKILL to node `i` (0-based), waiting until it is gone.
    pub fn kill_node(&mut self, i: usize) -> io::Result<ExitStatus> {
        self.nodes[i].kill()
    }

    /// SIGTERM to node `i` (0-based), without waiting.
    pub fn terminate_node(&mut self, i: usize) -> io::Result<()> {
        self.nodes[i].terminate()
    }

    /// Starts node `i` (0-based) again on its address, stopping it first if it runs; it
    /// keeps its CPU quota (the same cgroup).
    pub fn restart_node(&mut self, i: usize) -> io::Result<()> {
        self.nodes[i].restart()
    }

    /// Shuts down in order: the load balancer, the nodes (SIGTERM to all, then each waited
    /// for), Redis. Every process is stopped even if one fails; the first error is returned.
    pub fn stop(&mut self) -> io::Result<()> {
        let mut first_err = None;
        let mut note = |r: io::Result<ExitStatus>| {
            if let Err(e) = r {
                first_err.get_or_insert(e);
            }
        };
        note(self.lb.stop());
        // All nodes drain at once rather than one shutdown grace after another.
        for n in &mut self.nodes {
            note(n.terminate().map(|()| ExitStatus::default()));
        }
        for n in &mut self.nodes {
            note(n.stop());
        }
        if let Some(r) = &mut self.redis {
            note(r.stop());
        }
        if let Some(s) = &mut self.sentinels {
            note(s.stop().map(|()| ExitStatus::default()));
        }
        if let Some(c) = &mut self.redis_cluster {
            note(c.stop().map(|()| ExitStatus::default()));
        }
        first_err.map_or(Ok(()), Err)
    }
}
