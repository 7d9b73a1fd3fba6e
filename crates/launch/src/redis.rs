//! `redis-server` on loopback with AOF persistence.

use std::io::{self, Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus};
use std::time::Duration;

use crate::proc::{find_program, on_a_free_port, NotReady, Proc};
use crate::{CpuQuota, Host};

/// A `redis-server` on 127.0.0.1 with its data (the append-only file) in a directory of the
/// caller's; killed (SIGKILL) when dropped.
///
/// Its output goes to `redis.log` in that directory.
pub struct RedisProcess {
    // Dropped (killed and reaped) before its cgroup, which can only be removed once empty.
    proc: Proc,
    quota: Option<CpuQuota>,
    host: Host,
    port: u16,
    dir: PathBuf,
    /// More `redis-server` arguments (a replica's `--replicaof`), kept across restarts.
    extra: Vec<String>,
}

impl RedisProcess {
    /// Starts `redis-server --port P --bind 127.0.0.1 --dir DIR --appendonly yes --save ""
    /// --daemonize no` on a free port P and waits until it answers PING (which it does only
    /// once it has loaded its append-only file). Creates `dir` if needed.
    pub fn start(dir: &Path) -> io::Result<RedisProcess> {
        RedisProcess::start_with_quota(dir, None)
    }

    /// As [`start`](Self::start), in a cgroup of its own allowed `cpu_quota` CPUs (see
    /// [`CpuQuota`]) if given; a restarted Redis joins the same group.
    pub fn start_with_quota(dir: &Path, cpu_quota: Option<f64>) -> io::Result<RedisProcess> {
        RedisProcess::start_inner(dir, cpu_quota, Host::loopback(), |_| Ok(Vec::new()))
    }

    /// As [`start`](Self::start), bound to `host`'s address in its network namespace.
    pub fn start_on(dir: &Path, host: Host) -> io::Result<RedisProcess> {
        RedisProcess::start_inner(dir, None, host, |_| Ok(Vec::new()))
    }

    /// As [`start`](Self::start), with more `redis-server` arguments (e.g. `--replicaof HOST
    /// PORT`), kept for [`restart`](Self::restart). Ready when it answers PING, which a
    /// replica does before it has synced.
    pub fn start_with_args(dir: &Path, args: Vec<String>) -> io::Result<RedisProcess> {
        RedisProcess::start_inner(dir, None, Host::loopback(), |_| Ok(args.clone()))
    }

    /// As [`start_with_args`](Self::start_with_args), asking `args` afresh on each attempt (a
    /// new port too may be taken: a cluster node's bus port), given the port tried; the args of
    /// the attempt that succeeded are kept for [`restart`](Self::restart).
    pub(crate) fn start_with_args_per_attempt(
        dir: &Path,
        args: impl FnMut(u16) -> io::Result<Vec<String>>,
    ) -> io::Result<RedisProcess> {
        RedisProcess::start_inner(dir, None, Host::loopback(), args)
    }

    /// Polls `probe` until it answers `Ok` (see `Proc::wait_ready`).
    pub(crate) fn wait_until(
        &mut self,
        what: &str,
        probe: impl FnMut() -> Result<(), String>,
    ) -> io::Result<()> {
        self.proc.wait_ready(what, probe).map_err(io::Error::from)
    }

    /// `Ok` while it runs or after a deliberate [`kill`](Self::kill) or
    /// [`stop`](Self::stop); an error naming it and quoting its log if it exited on its own
    /// (`while` says during what).
    pub(crate) fn check_running(&mut self, while_: &str) -> io::Result<()> {
        if self.proc.pid().is_none() {
            // Reaped already: by kill or stop, or reported by an earlier call.
            return Ok(());
        }
        match self.proc.try_status()? {
            None => Ok(()),
            Some(status) => Err(self.proc.error(format!("exited ({status}) while {while_}"))),
        }
    }

    fn start_inner(
        dir: &Path,
        cpu_quota: Option<f64>,
        host: Host,
        mut extra: impl FnMut(u16) -> io::Result<Vec<String>>,
    ) -> io::Result<RedisProcess> {
        let quota = cpu_quota
            .map(|cpus| CpuQuota::create_unique("redis", cpus))
            .transpose()?;
        std::fs::create_dir_all(dir)?;
        let dir = dir.canonicalize()?;
        let mut kept = Vec::new();
        let (proc, port) = on_a_free_port(|port| {
            kept = extra(port).map_err(NotReady::Failed)?;
            launch(&dir, &host, port, quota.as_ref(), &kept)
        })?;
        Ok(RedisProcess {
            proc,
            quota,
            host,
            port,
            dir,
            extra: kept,
        })
    }

    /// `redis://IP:PORT/` (IP 127.0.0.1 unless started [on](Self::start_on) another
    /// host), for `plaza serve --redis`.
    pub fn url(&self) -> String {
        format!("redis://{}/", self.addr())
    }

    /// The port it listens on (the same after [`restart`](Self::restart)).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Its address and [`port`](Self::port).
    pub fn addr(&self) -> SocketAddr {
        self.host.addr(self.port)
    }

    /// The data directory (`--dir`).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Its process id while it has not exited.
    pub fn pid(&self) -> Option<u32> {
        self.proc.pid()
    }

    /// Its cgroup, if it runs under a CPU quota.
    pub fn cpu_quota(&self) -> Option<&CpuQuota> {
        self.quota.as_ref()
    }

    /// SIGTERM (Redis flushes its append-only file and exits) and waits for the exit; SIGKILL
    /// if it takes longer than 15 s.
    pub fn stop(&mut self) -> io::Result<ExitStatus> {
        self.proc.stop()
    }

    /// SIGKILL and waits: a crash. Writes Redis acknowledged normally survive it: Redis
    /// writes the append-only file before replying (unless a slow disk makes it postpone).
    pub fn kill(&mut self) -> io::Result<ExitStatus> {
        self.proc.kill()
    }

    /// SIGSTOP: the server hangs without closing its connections (a stalled host, a full
    /// swap); clients see no error, only no answer, until [`resume`](Self::resume).
    pub fn pause(&mut self) -> io::Result<()> {
        self.proc.pause()
    }

    /// SIGCONT: a paused server answers again.
    pub fn resume(&mut self) -> io::Result<()> {
        self.proc.resume()
    }

    /// Stops it if it still runs (as [`stop`](Self::stop)), then starts it again on the same
    /// port and directory, and waits until it answers PING, i.e. has reloaded its data.
    pub fn restart(&mut self) -> io::Result<()> {
        self.proc.stop()?;
        self.proc = launch(
            &self.dir,
            &self.host,
            self.port,
            self.quota.as_ref(),
            &self.extra,
        )?;
        Ok(())
    }
}

fn launch(
    dir: &Path,
    host: &Host,
    port: u16,
    quota: Option<&CpuQuota>,
    extra: &[String],
) -> Result<Proc, NotReady> {
    let bin = find_program("redis-server", "PLAZA_REDIS_SERVER", "redis-server")
        .map_err(NotReady::Failed)?;
    let addr = host.addr(port);
    let mut cmd = Command::new(bin);
    cmd.args([
        "--port",
        &port.to_string(),
        "--bind",
        &host.ip.to_string(),
        "--dir",
    ])
    .arg(dir)
    .args(["--appendonly", "yes", "--save", "", "--daemonize", "no"])
    .args(extra);
    if host.ip != Ipv4Addr::LOCALHOST {
        // Protected mode refuses clients from other hosts when no password is set.
        cmd.args(["--protected-mode", "no"]);
    }
    host.enter(&mut cmd).map_err(NotReady::Failed)?;
    if let Some(q) = quota {
        q.confine(&mut cmd);
    }
    let name = format!("redis-server ({addr})");
    let mut proc = Proc::spawn(name, cmd, &dir.join("redis.log")).map_err(NotReady::Failed)?;
    proc.wait_ready("answering PING", || ping(addr))?;
    Ok(proc)
}

/// One PING in RESP; `+PONG` means ready (a loading server answers `-LOADING`).
pub(crate) fn ping(addr: SocketAddr) -> Result<(), String> {
    let attempt = || -> io::Result<String> {
        let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(1))?;
        s.set_read_timeout(Some(Duration::from_secs(2)))?;
        s.write_all(b"*1\r\n$4\r\nPING\r\n")?;
        let mut buf = [0u8; 256];
        let mut got = Vec::new();
        while !got.ends_with(b"\r\n") {
            let n = s.read(&mut buf)?;
            if n == 0 {
                break;
            }
            got.extend_from_slice(&buf[..n]);
        }
        Ok(String::from_utf8_lossy(&got).trim_end().to_owned())
    };
    match attempt() {
        Ok(reply) if reply == "+PONG" => Ok(()),
        Ok(reply) => Err(format!("PING answered {reply:?}")),
        Err(e) => Err(format!("PING {addr}: {e}")),
    }
}

/// One command to the server at `addr`, on a short connection; errors name the address.
pub(crate) fn query<T: ::redis::FromRedisValue>(
    addr: SocketAddr,
    cmd: &::redis::Cmd,
) -> Result<T, String> {
    let timeout = Duration::from_secs(2);
    let client = ::redis::Client::open(format!("redis://{addr}/")).map_err(|e| e.to_string())?;
    let mut conn = client
        .get_connection_with_timeout(timeout)
        .map_err(|e| format!("{addr}: {e}"))?;
    cmd.query(&mut conn).map_err(|e| format!("{addr}: {e}"))
}
