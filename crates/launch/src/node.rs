//! `plaza serve` nodes on loopback.

use std::io;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus};
use std::time::Duration;

use crate::proc::{check_port_free, NotReady, Proc, START_ATTEMPTS};
use crate::{CpuQuota, Host};

/// How a [`NodeProcess`] is started. `NodeOptions::new(id)` gives the defaults.
#[derive(Debug, Clone)]
pub struct NodeOptions {
    /// `--node-id`: the id in the node's `x-plaza-node` header and `/readyz`.
    pub node_id: String,
    /// `--redis URL` (cluster mode); `None` runs the node in embedded mode.
    pub redis_url: Option<String>,
    /// Port on `host`; 0 picks a free one.
    pub port: u16,
    /// The address it listens on and its network namespace; the default: 127.0.0.1 here.
    pub host: Host,
    /// Further arguments after `plaza serve …`, e.g. `["--auto-create-rooms"]`.
    pub extra_args: Vec<String>,
    /// Environment variables set for the node (e.g. `PLAZA_LOG`).
    pub env: Vec<(String, String)>,
    /// Directory of the log file `<node_id>.log` (stdout and stderr); `None`: the system
    /// temporary directory, as `plaza-node-<node_id>-<port>.log`.
    pub log_dir: Option<PathBuf>,
    /// Run the node in a cgroup of its own allowed this many CPUs (cgroup v1 CPU quota,
    /// [`CpuQuota`]); a restarted node joins the same group. `None`: no quota.
    pub cpu_quota: Option<f64>,
}

impl NodeOptions {
    /// Embedded mode, a free port, no extra arguments, the log in the temporary directory.
    pub fn new(node_id: impl Into<String>) -> NodeOptions {
        NodeOptions {
            node_id: node_id.into(),
            redis_url: None,
            port: 0,
            host: Host::loopback(),
            extra_args: Vec::new(),
            env: Vec::new(),
            log_dir: None,
            cpu_quota: None,
        }
    }
}

/// A running `plaza serve`, killed (SIGKILL) when dropped.
pub struct NodeProcess {
    // Dropped (killed and reaped) before its cgroup, which can only be removed once empty.
    proc: Proc,
    quota: Option<CpuQuota>,
    plaza_bin: PathBuf,
    opts: NodeOptions,
    addr: SocketAddr,
}

impl NodeProcess {
    /// Spawns `plaza serve --listen IP:P [--redis URL] --node-id ID EXTRA…` and waits
    /// until `GET /readyz` answers 200 from this node (its `x-plaza-node` header is `ID`).
    /// With a `cpu_quota`, the node runs in a new cgroup from its first instruction on.
    pub fn start(plaza_bin: &Path, opts: NodeOptions) -> io::Result<NodeProcess> {
        let quota = opts
            .cpu_quota
            .map(|cpus| CpuQuota::create_unique(&opts.node_id, cpus))
            .transpose()?;
        let mut attempt = 0;
        loop {
            attempt += 1;
            let port = match opts.port {
                0 => crate::free_port()?,
                // Another namespace's ports are not this one's.
                p if opts.host.netns.is_some() => p,
                p => {
                    check_port_free(p, &format!("plaza node {}", opts.node_id))?;
                    p
                }
            };
            let addr = opts.host.addr(port);
            match launch(plaza_bin, &opts, addr, quota.as_ref()) {
                Ok(proc) => {
                    return Ok(NodeProcess {
                        proc,
                        quota,
                        plaza_bin: plaza_bin.to_owned(),
                        opts,
                        addr,
                    })
                }
                Err(NotReady::Exited(_)) if opts.port == 0 && attempt < START_ATTEMPTS => continue,
                Err(e) => return Err(e.into()),
            }
        }
    }

    /// Where it listens (the same after [`restart`](Self::restart)).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://ADDR`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Its node id.
    pub fn id(&self) -> &str {
        &self.opts.node_id
    }

    /// Its process id while it has not been reaped.
    pub fn pid(&self) -> Option<u32> {
        self.proc.pid()
    }

    /// Its cgroup, if it runs under a CPU quota.
    pub fn cpu_quota(&self) -> Option<&CpuQuota> {
        self.quota.as_ref()
    }

    /// SIGKILL and waits: a crash, no goodbye to clients.
    pub fn kill(&mut self) -> io::Result<ExitStatus> {
        self.proc.kill()
    }

    /// Sends SIGTERM (the node drains: it tells clients to reconnect and exits within its
    /// shutdown grace) and returns at once; see [`wait_exit`](Self::wait_exit).
    pub fn terminate(&mut self) -> io::Result<()> {
        self.proc.signal(libc::SIGTERM)
    }

    /// Waits up to `timeout` for it to exit; `None` if it still runs.
    pub fn wait_exit(&mut self, timeout: Duration) -> io::Result<Option<ExitStatus>> {
        self.proc.wait_timeout(timeout)
    }

    /// SIGTERM, then SIGKILL if it has not exited within 15 s.
    pub fn stop(&mut self) -> io::Result<ExitStatus> {
        self.proc.stop()
    }

    /// Stops it if it still runs (as [`stop`](Self::stop)) and starts it again with the same
    /// options, address and CPU quota (the same cgroup), waiting until it is ready.
    pub fn restart(&mut self) -> io::Result<()> {
        self.proc.stop()?;
        self.proc = launch(&self.plaza_bin, &self.opts, self.addr, self.quota.as_ref())?;
        Ok(())
    }
}

fn launch(
    plaza_bin: &Path,
    opts: &NodeOptions,
    addr: SocketAddr,
    quota: Option<&CpuQuota>,
) -> Result<Proc, NotReady> {
    let mut cmd = Command::new(plaza_bin);
    opts.host.enter(&mut cmd).map_err(NotReady::Failed)?;
    cmd.args(["serve", "--listen", &addr.to_string()]);
    if let Some(url) = &opts.redis_url {
        cmd.args(["--redis", url]);
    }
    cmd.args(["--node-id", &opts.node_id])
        .args(&opts.extra_args);
    // The log is a file: no colour escapes in it (tracing-subscriber honours NO_COLOR).
    cmd.env("NO_COLOR", "1");
    cmd.envs(opts.env.iter().map(|(k, v)| (k, v)));
    if let Some(q) = quota {
        q.confine(&mut cmd);
    }
    let log = match &opts.log_dir {
        Some(dir) => {
            std::fs::create_dir_all(dir).map_err(NotReady::Failed)?;
            dir.join(format!("{}.log", opts.node_id))
        }
        None => {
            std::env::temp_dir().join(format!("plaza-node-{}-{}.log", opts.node_id, addr.port()))
        }
    };
    let name = format!("plaza node {} ({addr})", opts.node_id);
    let mut proc = Proc::spawn(name, cmd, &log).map_err(NotReady::Failed)?;
    proc.wait_ready("answering GET /readyz with 200", || {
        let r = crate::http_get(addr, "/readyz", Duration::from_secs(2))
            .map_err(|e| format!("GET /readyz: {e}"))?;
        let node = r.header("x-plaza-node").unwrap_or("");
        if r.status == 200 && node == opts.node_id {
            Ok(())
        } else {
            Err(format!(
                "GET /readyz: {} from node {node:?}: {}",
                r.status,
                r.text()
            ))
        }
    })?;
    Ok(proc)
}
