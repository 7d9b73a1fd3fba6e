//! nginx or HAProxy in front of the nodes, configured from the templates in `deploy/`.

use std::fmt;
use std::io;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus};
use std::str::FromStr;

use crate::proc::{accepts, check_port_free, find_program, NotReady, Proc, START_ATTEMPTS};
use crate::{CpuQuota, Host};

const NGINX_TEMPLATE: &str = include_str!("../../../deploy/nginx/plaza.conf");
const HAPROXY_TEMPLATE: &str = include_str!("../../../deploy/haproxy/plaza.cfg");

/// Which load balancer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LbKind {
    /// nginx, configured from `deploy/nginx/plaza.conf`.
    Nginx,
    /// HAProxy, configured from `deploy/haproxy/plaza.cfg`.
    Haproxy,
}

impl LbKind {
    /// `"nginx"` or `"haproxy"`: the program's name (and what [`FromStr`] accepts).
    pub fn name(self) -> &'static str {
        match self {
            LbKind::Nginx => "nginx",
            LbKind::Haproxy => "haproxy",
        }
    }

    /// The configuration template embedded from `deploy/`.
    pub(crate) fn template(self) -> &'static str {
        match self {
            LbKind::Nginx => NGINX_TEMPLATE,
            LbKind::Haproxy => HAPROXY_TEMPLATE,
        }
    }

    /// Finds the executable: `PLAZA_NGINX` or `PLAZA_HAPROXY` if set, else on `PATH` or in
    /// the sbin directories.
    pub fn program(self) -> io::Result<PathBuf> {
        let env = match self {
            LbKind::Nginx => "PLAZA_NGINX",
            LbKind::Haproxy => "PLAZA_HAPROXY",
        };
        find_program(self.name(), env, self.name())
    }

    fn config_file(self) -> &'static str {
        match self {
            LbKind::Nginx => "plaza.conf",
            LbKind::Haproxy => "plaza.cfg",
        }
    }

    fn log_file(self) -> &'static str {
        match self {
            // The same file as the template's error_log: one place to look.
            LbKind::Nginx => "error.log",
            LbKind::Haproxy => "haproxy.log",
        }
    }
}

impl fmt::Display for LbKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(self.name())
    }
}

impl FromStr for LbKind {
    type Err = String;

    fn from_str(s: &str) -> Result<LbKind, String> {
        match s {
            "nginx" => Ok(LbKind::Nginx),
            "haproxy" => Ok(LbKind::Haproxy),
            _ => Err(format!("unknown load balancer {s:?}: nginx or haproxy")),
        }
    }
}

/// How a [`LoadBalancer`] runs besides its address and upstreams; the default is what the
/// templates say.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LbOptions {
    /// nginx's `worker_processes` (`{{workers}}` in the template); `None`: `auto`, one per
    /// CPU. HAProxy's template has no such setting: it is refused there.
    pub workers: Option<usize>,
    /// Run the balancer (nginx's master and workers) in a cgroup of its own allowed this many
    /// CPUs ([`CpuQuota`]). `None`: no quota.
    pub cpu_quota: Option<f64>,
    /// The address it listens on and its network namespace; the default: 127.0.0.1 here.
    pub host: Host,
}

/// Fills a `deploy/` template: `{{listen}}`, `{{runtime_dir}}` and `{{workers}}` (`workers`,
/// or `auto`) everywhere, and each line holding `{{server}}` once per upstream, with
/// `{{server}}` its address and `{{name}}` `node1`, `node2`, …. Comment lines are copied as
/// they are.
pub fn render_config(
    kind: LbKind,
    listen: SocketAddr,
    upstreams: &[SocketAddr],
    runtime_dir: &Path,
    workers: Option<usize>,
) -> String {
    let listen = listen.to_string();
    let runtime_dir = runtime_dir.display().to_string();
    let workers = workers.map_or_else(|| "auto".to_owned(), |n| n.to_string());
    let mut out = String::new();
    for line in kind.template().lines() {
        if line.trim_start().starts_with('#') {
            // Comments document the placeholders: left as they are.
            out.push_str(line);
            out.push('\n');
        } else if line.contains("{{server}}") {
            for (i, up) in upstreams.iter().enumerate() {
                out.push_str(
                    &line
                        .replace("{{server}}", &up.to_string())
                        .replace("{{name}}", &format!("node{}", i + 1)),
                );
                out.push('\n');
            }
        } else {
            out.push_str(
                &line
                    .replace("{{listen}}", &listen)
                    .replace("{{runtime_dir}}", &runtime_dir)
                    .replace("{{workers}}", &workers),
            );
            out.push('\n');
        }
    }
    out
}

/// nginx or HAProxy running in the foreground (on 127.0.0.1 unless [`LbOptions::host`] says
/// otherwise), in front of some nodes; killed
/// (with its workers) when dropped.
pub struct LoadBalancer {
    kind: LbKind,
    // Dropped (killed and reaped) before its cgroup, which can only be removed once empty.
    proc: Proc,
    quota: Option<CpuQuota>,
    addr: SocketAddr,
    dir: PathBuf,
}

impl LoadBalancer {
    /// Writes the rendered template to `dir` (created if needed; it also holds the pid file,
    /// logs and temporary files), starts the balancer (`nginx -p DIR -e DIR/error.log -c
    /// DIR/plaza.conf -g 'daemon off;'` or `haproxy -db -f DIR/plaza.cfg`) and waits until
    /// its port accepts connections. `listen_port` 0 picks a free port.
    pub fn start(
        kind: LbKind,
        listen_port: u16,
        upstreams: &[SocketAddr],
        dir: &Path,
    ) -> io::Result<LoadBalancer> {
        LoadBalancer::start_with(kind, listen_port, upstreams, dir, LbOptions::default())
    }

    /// As [`start`](Self::start), with nginx's worker count and a CPU quota from `opts`.
    pub fn start_with(
        kind: LbKind,
        listen_port: u16,
        upstreams: &[SocketAddr],
        dir: &Path,
        opts: LbOptions,
    ) -> io::Result<LoadBalancer> {
        if upstreams.is_empty() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "a load balancer needs at least one upstream",
            ));
        }
        match (kind, opts.workers) {
            (LbKind::Haproxy, Some(_)) => {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    "a worker count is an nginx setting: HAProxy's template has none",
                ))
            }
            (_, Some(0)) => {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    "nginx needs at least one worker",
                ))
            }
            _ => {}
        }
        let quota = opts
            .cpu_quota
            .map(|cpus| CpuQuota::create_unique(kind.name(), cpus))
            .transpose()?;
        std::fs::create_dir_all(dir)?;
        let dir = dir.canonicalize()?;
        let bin = kind.program()?;
        let mut attempt = 0;
        loop {
            attempt += 1;
            let port = match listen_port {
                0 => crate::free_port()?,
                // Another namespace's ports are not this one's.
                p if opts.host.netns.is_some() => p,
                p => {
                    check_port_free(p, &format!("{kind} cannot listen"))?;
                    p
                }
            };
            let addr = opts.host.addr(port);
            match launch(kind, &bin, addr, upstreams, &dir, &opts, quota.as_ref()) {
                Ok(proc) => {
                    return Ok(LoadBalancer {
                        kind,
                        proc,
                        quota,
                        addr,
                        dir,
                    })
                }
                Err(NotReady::Exited(_)) if listen_port == 0 && attempt < START_ATTEMPTS => {
                    continue
                }
                Err(e) => return Err(e.into()),
            }
        }
    }

    /// Where clients connect.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://ADDR`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// nginx or HAProxy.
    pub fn kind(&self) -> LbKind {
        self.kind
    }

    /// The rendered configuration file.
    pub fn config_path(&self) -> PathBuf {
        self.dir.join(self.kind.config_file())
    }

    /// Its (master's) process id while it has not been reaped; its process group has this id.
    pub fn pid(&self) -> Option<u32> {
        self.proc.pid()
    }

    /// Its cgroup (master and workers), if it runs under a CPU quota.
    pub fn cpu_quota(&self) -> Option<&CpuQuota> {
        self.quota.as_ref()
    }

    /// SIGTERM (both exit at once, closing open connections) and waits; SIGKILL to the whole
    /// process group if that takes longer than 15 s.
    pub fn stop(&mut self) -> io::Result<ExitStatus> {
        self.proc.stop()
    }
}

fn launch(
    kind: LbKind,
    bin: &Path,
    addr: SocketAddr,
    upstreams: &[SocketAddr],
    dir: &Path,
    opts: &LbOptions,
    quota: Option<&CpuQuota>,
) -> Result<Proc, NotReady> {
    let config = dir.join(kind.config_file());
    let text = render_config(kind, addr, upstreams, dir, opts.workers);
    std::fs::write(&config, text).map_err(NotReady::Failed)?;
    let log = dir.join(kind.log_file());
    let mut cmd = Command::new(bin);
    opts.host.enter(&mut cmd).map_err(NotReady::Failed)?;
    match kind {
        LbKind::Nginx => {
            // -e: nginx opens its default error log (/var/log/nginx) before reading the
            // configuration, which fails when not root.
            cmd.arg("-p")
                .arg(dir)
                .arg("-e")
                .arg(&log)
                .arg("-c")
                .arg(&config)
                .args(["-g", "daemon off;"]);
        }
        LbKind::Haproxy => {
            cmd.arg("-db").arg("-f").arg(&config);
        }
    }
    if let Some(q) = quota {
        // Before exec: the workers nginx forks at once are then inside too.
        q.confine(&mut cmd);
    }
    let mut proc = Proc::spawn(format!("{kind} ({addr})"), cmd, &log).map_err(NotReady::Failed)?;
    proc.wait_ready("accepting connections", || accepts(addr))?;
    Ok(proc)
}
