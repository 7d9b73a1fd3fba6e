//! A Redis primary with two replicas, watched by three Sentinels, on loopback.

use std::collections::HashMap;
use std::io;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::proc::{find_program, on_a_free_port, NotReady, Proc};
use crate::redis::{ping, query};
use crate::{Host, RedisProcess};

/// The name the Sentinels know the primary by (`sentinel monitor <name> …`).
pub const SENTINEL_MASTER_NAME: &str = "plaza";

/// Replicas and Sentinels [`RedisSentinels::start`] starts.
const REPLICAS: usize = 2;
const SENTINELS: usize = 3;

/// Sentinel's `down-after-milliseconds`: a primary silent this long is taken for down. Short,
/// for development and tests on one machine (Redis's default is 30 s).
pub const DOWN_AFTER_MS: u64 = 1000;
/// Sentinel's `failover-timeout` (Redis's default is 3 minutes): also how long a Sentinel
/// waits before trying a failover again after one that did not complete.
pub const FAILOVER_TIMEOUT_MS: u64 = 3000;

/// A primary `redis-server` with two replicas (`--replicaof`), and three `redis-server
/// --sentinel` processes watching it as [`SENTINEL_MASTER_NAME`] with a quorum of two; all on
/// 127.0.0.1, each killed when dropped. After a failover the Sentinels have rewritten the
/// servers' roles: [`primary`](Self::primary) asks them which server is the primary now.
pub struct RedisSentinels {
    // Fields drop in order: the Sentinels go before the servers they watch.
    sentinels: Vec<SentinelProcess>,
    servers: Vec<RedisProcess>,
}

impl RedisSentinels {
    /// Starts the servers (in `dir/redis-1` … `dir/redis-3`, the first the primary) and the
    /// Sentinels (`dir/sentinel-1` …), and waits until every Sentinel knows both replicas and
    /// the two other Sentinels: before that, a failover could not get its votes.
    pub fn start(dir: &Path) -> io::Result<RedisSentinels> {
        // Any server may become the primary: none waits for more replicas before sending one
        // its data (7.0's default waits 5 s), so that a replica is in sync, and WAIT counts it,
        // as soon as it can be.
        let args = |more: &[String]| {
            let mut args = vec!["--repl-diskless-sync-delay".to_owned(), "0".to_owned()];
            args.extend_from_slice(more);
            args
        };
        let primary = RedisProcess::start_with_args(&dir.join("redis-1"), args(&[]))?;
        let replica_of = [
            "--replicaof".to_owned(),
            primary.addr().ip().to_string(),
            primary.port().to_string(),
        ];
        let mut servers = vec![primary];
        for i in 0..REPLICAS {
            let dir = dir.join(format!("redis-{}", i + 2));
            servers.push(RedisProcess::start_with_args(&dir, args(&replica_of))?);
        }
        let primary_addr = servers[0].addr();
        servers[0].wait_until("have its replicas in sync", || {
            let info: String = query(primary_addr, ::redis::cmd("INFO").arg("replication"))?;
            let online = info.matches("state=online").count();
            match online == REPLICAS {
                true => Ok(()),
                false => Err(format!("{online} replicas online")),
            }
        })?;
        let mut sentinels = Vec::with_capacity(SENTINELS);
        for i in 0..SENTINELS {
            let dir = dir.join(format!("sentinel-{}", i + 1));
            sentinels.push(SentinelProcess::start(&dir, servers[0].addr())?);
        }
        for s in &mut sentinels {
            let addr = s.addr();
            s.proc
                .wait_ready("know its replicas and the other Sentinels", || {
                    let master = master_info(addr)?;
                    let count =
                        |k: &str| master.get(k).map(String::as_str).unwrap_or("?").to_owned();
                    let (replicas, others) = (count("num-slaves"), count("num-other-sentinels"));
                    if replicas == REPLICAS.to_string() && others == (SENTINELS - 1).to_string() {
                        Ok(())
                    } else {
                        Err(format!("{replicas} replicas, {others} other Sentinels"))
                    }
                })?;
        }
        Ok(RedisSentinels { sentinels, servers })
    }

    /// `redis+sentinel://127.0.0.1:P1,127.0.0.1:P2,127.0.0.1:P3/plaza`, for `plaza serve
    /// --redis`.
    pub fn url(&self) -> String {
        let addrs: Vec<String> = self
            .sentinels
            .iter()
            .map(|s| s.addr().to_string())
            .collect();
        format!(
            "redis+sentinel://{}/{SENTINEL_MASTER_NAME}",
            addrs.join(",")
        )
    }

    /// The data servers, the first started as the primary.
    pub fn servers(&self) -> &[RedisProcess] {
        &self.servers
    }

    /// The data servers, to kill or restart one.
    pub fn servers_mut(&mut self) -> &mut [RedisProcess] {
        &mut self.servers
    }

    /// The Sentinels' addresses.
    pub fn sentinel_addrs(&self) -> Vec<SocketAddr> {
        self.sentinels.iter().map(SentinelProcess::addr).collect()
    }

    /// Their process ids, for those that have not exited.
    pub fn sentinel_pids(&self) -> Vec<u32> {
        self.sentinels.iter().filter_map(|s| s.proc.pid()).collect()
    }

    /// The index in [`servers`](Self::servers) of the primary the first answering Sentinel
    /// names (`SENTINEL get-master-addr-by-name`), whether or not it is up.
    pub fn primary(&self) -> io::Result<usize> {
        let mut last = String::from("no Sentinel");
        for s in &self.sentinels {
            let named: Result<Option<(String, u16)>, String> = query(
                s.addr(),
                ::redis::cmd("SENTINEL")
                    .arg("get-master-addr-by-name")
                    .arg(SENTINEL_MASTER_NAME),
            );
            match named {
                Ok(Some((_, port))) => {
                    return self
                        .servers
                        .iter()
                        .position(|r| r.port() == port)
                        .ok_or_else(|| io::Error::other(format!("port {port} is none of ours")));
                }
                Ok(None) => last = format!("{} knows no primary", s.addr()),
                Err(e) => last = e,
            }
        }
        Err(io::Error::other(format!(
            "no Sentinel names a primary: {last}"
        )))
    }

    /// Stops the Sentinels, then the servers (SIGTERM each, waited for); the first error.
    pub fn stop(&mut self) -> io::Result<()> {
        let mut first_err = None;
        for s in &mut self.sentinels {
            if let Err(e) = s.proc.stop() {
                first_err.get_or_insert(e);
            }
        }
        for r in &mut self.servers {
            if let Err(e) = r.stop() {
                first_err.get_or_insert(e);
            }
        }
        first_err.map_or(Ok(()), Err)
    }
}

/// One `redis-server --sentinel` with its configuration file (which it rewrites) in a
/// directory of its own.
struct SentinelProcess {
    proc: Proc,
    port: u16,
    _dir: PathBuf,
}

impl SentinelProcess {
    fn start(dir: &Path, primary: SocketAddr) -> io::Result<SentinelProcess> {
        std::fs::create_dir_all(dir)?;
        let dir = dir.canonicalize()?;
        let (proc, port) = on_a_free_port(|port| launch(&dir, port, primary))?;
        Ok(SentinelProcess {
            proc,
            port,
            _dir: dir,
        })
    }

    fn addr(&self) -> SocketAddr {
        Host::loopback().addr(self.port)
    }
}

fn launch(dir: &Path, port: u16, primary: SocketAddr) -> Result<Proc, NotReady> {
    let bin = find_program("redis-server", "PLAZA_REDIS_SERVER", "redis-server")
        .map_err(NotReady::Failed)?;
    let name = SENTINEL_MASTER_NAME;
    let conf = dir.join("sentinel.conf");
    let text = format!(
        "port {port}\nbind 127.0.0.1\ndaemonize no\ndir {dir}\n\
         sentinel monitor {name} {ip} {primary_port} 2\n\
         sentinel down-after-milliseconds {name} {DOWN_AFTER_MS}\n\
         sentinel failover-timeout {name} {FAILOVER_TIMEOUT_MS}\n\
         sentinel parallel-syncs {name} 1\n",
        dir = dir.display(),
        ip = primary.ip(),
        primary_port = primary.port(),
    );
    std::fs::write(&conf, text).map_err(NotReady::Failed)?;
    let mut cmd = Command::new(bin);
    // redis-server in Sentinel mode: what Debian's redis-sentinel runs.
    cmd.arg(&conf).arg("--sentinel");
    let addr = Host::loopback().addr(port);
    let mut proc = Proc::spawn(
        format!("redis-sentinel ({addr})"),
        cmd,
        &dir.join("sentinel.log"),
    )
    .map_err(NotReady::Failed)?;
    proc.wait_ready("answering PING", || ping(addr))?;
    Ok(proc)
}

/// `SENTINEL MASTER plaza` from the Sentinel at `addr`, as field → value.
fn master_info(addr: SocketAddr) -> Result<HashMap<String, String>, String> {
    query(
        addr,
        ::redis::cmd("SENTINEL")
            .arg("master")
            .arg(SENTINEL_MASTER_NAME),
    )
}
