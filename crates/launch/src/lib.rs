//! Starts the processes of a Plaza cluster on loopback — `redis-server` (alone, a primary
//! with replicas watched by Sentinels, or a Redis Cluster), `plaza serve` nodes and
//! nginx or HAProxy in front — for development (`plaza cluster up`), tests and benchmarks.
//!
//! Every process runs in the foreground as a child of the caller, in its own process group (so
//! that a Ctrl-C in a terminal reaches only the caller, which then stops them in order, and so
//! that killing a load balancer also kills its workers), with its stdout and stderr appended to
//! a log file. A handle kills its process when dropped. None of these programs reports
//! readiness, so `start` polls (a Redis PING, `GET /readyz`, a TCP connect) until a deadline
//! and, on failure, names the process and quotes the end of its log.
//!
//! Each process may run under a CPU quota of its own ([`CpuQuota`], cgroup v1), joined before
//! it execs, so that benchmarks can give every node a fixed share of a small machine.
//!
//! Programs are looked up on `PATH` and in the `sbin` directories (where Debian puts nginx and
//! HAProxy); `PLAZA_REDIS_SERVER`, `PLAZA_NGINX` and `PLAZA_HAPROXY` override the lookup.
#![warn(missing_docs)]

mod cgroup;
mod cluster;
mod host;
mod http;
mod lb;
mod node;
mod proc;
mod redis;
mod redis_cluster;
mod sentinel;

pub use cgroup::{CpuQuota, CPU_CGROUP};
pub use cluster::{ClusterOptions, CpuQuotas, LocalCluster};
pub use host::Host;
pub use http::{http_get, HttpResponse};
pub use lb::{render_config, LbKind, LbOptions, LoadBalancer};
pub use node::{NodeOptions, NodeProcess};
pub use proc::tie_children_to_this_thread;
pub use redis::RedisProcess;
pub use redis_cluster::{
    slot_of, Migration, RedisCluster, CLUSTER_SLOTS, FAILOVER_TIMEOUT, MAX_PRIMARIES,
    MIN_PRIMARIES, NODE_TIMEOUT_MS,
};
pub use sentinel::{RedisSentinels, DOWN_AFTER_MS, FAILOVER_TIMEOUT_MS, SENTINEL_MASTER_NAME};

use std::io;
use std::net::{Ipv4Addr, TcpListener};

/// A TCP port on 127.0.0.1 that was free a moment ago: bound to port 0, read, released.
///
/// Another process may take it before the caller binds it; the `start` functions of this crate
/// retry with a new port when the process they start exits before it is ready.
pub fn free_port() -> io::Result<u16> {
    Ok(TcpListener::bind((Ipv4Addr::LOCALHOST, 0))?
        .local_addr()?
        .port())
}
