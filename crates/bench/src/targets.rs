//! Targets files: the servers one `plaza bench run --targets FILE` compares,
//! each started (pinned or capped) before its runs and stopped after.
//!
//! ```yaml
//! targets:
//!   - name: plaza
//!     driver: plaza
//!     address: 127.0.0.1:7700
//!     start: [target/release/plaza, serve, --listen, 127.0.0.1:7700]
//!   - name: centrifugo
//!     driver: centrifugo
//!     address: 127.0.0.1:8000
//!     start: ["${CENTRIFUGO_BIN}", -c, bench/peers/centrifugo.json]
//! ```
//!
//! `${VAR}` in `start` and `cwd` is taken from the environment, and
//! `${VAR:-default}` too, with `default` when the variable is unset or empty
//! (as in the shell); a target whose variable is unset (without a default),
//! or whose program does not exist, is skipped with a reason rather than
//! failing the whole comparison. A target without `start` is a server that is
//! already running.

use std::collections::BTreeMap;
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde::Deserialize;

use crate::cpucap::{self, CpuQuota};

/// A targets file.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TargetsFile {
    /// The servers, in the order they are run.
    pub targets: Vec<TargetSpec>,
}

/// One server to compare.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct TargetSpec {
    /// Name in reports and charts.
    pub name: String,
    /// Protocol driver (`plaza`, `broadcast`, `socketio`, `centrifugo`).
    pub driver: String,
    /// Where it listens (host:port).
    pub address: String,
    /// Program and arguments that start it; absent: already running.
    #[serde(default)]
    pub start: Option<Vec<String>>,
    /// Working directory for `start` (default: the current one).
    #[serde(default)]
    pub cwd: Option<String>,
    /// Extra environment for `start`.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Longest wait for the address to accept connections, in seconds.
    #[serde(default = "default_ready_s")]
    pub ready_timeout_s: u64,
}

fn default_ready_s() -> u64 {
    30
}

impl TargetsFile {
    /// Parses a targets file.
    pub fn parse(yaml: &str) -> Result<Self, String> {
        let file: Self = serde_norway::from_str(yaml).map_err(|e| e.to_string())?;
        if file.targets.is_empty() {
            return Err("no targets".into());
        }
        let mut names = std::collections::HashSet::new();
        for t in &file.targets {
            if !names.insert(&t.name) {
                return Err(format!("target {:?} appears twice", t.name));
            }
            if t.start.as_ref().is_some_and(Vec::is_empty) {
                return Err(format!("target {:?}: start is empty", t.name));
            }
        }
        Ok(file)
    }
}

/// Replaces `${VAR}` with the variable's value from `lookup`, and
/// `${VAR:-default}` with it or, if it is unset or empty, with `default`
/// (which cannot hold a `}`).
pub fn expand_env(s: &str, lookup: impl Fn(&str) -> Option<String>) -> Result<String, String> {
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(at) = rest.find("${") {
        out.push_str(&rest[..at]);
        let end = rest[at..]
            .find('}')
            .ok_or_else(|| format!("unclosed ${{ in {s:?}"))?;
        let inner = &rest[at + 2..at + end];
        let value = match inner.split_once(":-") {
            Some((name, default)) => lookup(name)
                .filter(|v| !v.is_empty())
                .unwrap_or_else(|| default.to_owned()),
            None => lookup(inner).ok_or_else(|| format!("${{{inner}}} is not set"))?,
        };
        out.push_str(&value);
        rest = &rest[at + end + 1..];
    }
    out.push_str(rest);
    Ok(out)
}

/// How the started server is confined.
#[derive(Debug, Clone, Default)]
pub struct ServerCaps {
    /// CPUs it may run on.
    pub cpus: Option<Vec<usize>>,
    /// CPU time it may use, in CPUs (cgroup v1 quota).
    pub quota: Option<f64>,
}

/// A server this process started: stopped (SIGTERM, then SIGKILL) on drop.
#[derive(Debug)]
pub struct RunningServer {
    child: Child,
    _quota: Option<CpuQuota>,
    /// Its pid.
    pub pid: u32,
    /// Where it listens.
    pub addr: SocketAddr,
}

/// The `host:port` of a target given as `host:port` or as a `ws://` or
/// `http://` URL (whose path is ignored).
pub fn address_of(target: &str) -> &str {
    let rest = target
        .strip_prefix("ws://")
        .or_else(|| target.strip_prefix("http://"))
        .unwrap_or(target);
    rest.split('/').next().unwrap_or(rest)
}

/// Resolves a target (see [`address_of`]) to a socket address.
pub fn resolve(target: &str) -> Result<SocketAddr, String> {
    let address = address_of(target);
    address
        .to_socket_addrs()
        .map_err(|e| format!("{target}: {e}"))?
        .next()
        .ok_or_else(|| format!("{target}: no address"))
}

impl TargetSpec {
    /// Starts the server (if it has a `start`), confined by `caps`, and
    /// waits until its address accepts connections. `log` receives its
    /// output. `Ok(None)` for a server that is already running.
    pub fn launch(&self, caps: &ServerCaps, log: &Path) -> Result<Option<RunningServer>, String> {
        let Some(start) = &self.start else {
            return Ok(None);
        };
        let env = |v: &str| std::env::var(v).ok();
        let argv: Vec<String> = start
            .iter()
            .map(|a| expand_env(a, env))
            .collect::<Result<_, _>>()?;
        let cwd = self
            .cwd
            .as_deref()
            .map(|c| expand_env(c, env))
            .transpose()?
            .map(PathBuf::from);
        let addr = resolve(&self.address)?;
        if TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok() {
            return Err(format!(
                "{} is already in use: stop what listens there first",
                self.address
            ));
        }
        let out = std::fs::File::create(log).map_err(|e| format!("{}: {e}", log.display()))?;
        let err = out.try_clone().map_err(|e| e.to_string())?;
        let mut cmd = Command::new(&argv[0]);
        cmd.args(&argv[1..])
            .envs(&self.env)
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err);
        if let Some(dir) = &cwd {
            cmd.current_dir(dir);
        }
        if let Some(cpus) = caps.cpus.clone() {
            // SAFETY: only sched_setaffinity (async-signal-safe) runs between
            // fork and exec.
            unsafe {
                cmd.pre_exec(move || cpucap::set_affinity(0, &cpus));
            }
        }
        let child = cmd
            .spawn()
            .map_err(|e| format!("{}: cannot start {:?}: {e}", self.name, argv[0]))?;
        let pid = child.id();
        let mut server = RunningServer {
            child,
            _quota: None,
            pid,
            addr,
        };
        if let Some(cpus) = caps.quota {
            server._quota =
                Some(CpuQuota::apply(pid, cpus).map_err(|e| format!("CPU quota {cpus}: {e}"))?);
        }
        server.wait_ready(Duration::from_secs(self.ready_timeout_s), log)?;
        Ok(Some(server))
    }
}

impl RunningServer {
    /// Polls the address until it accepts a connection (the server has no
    /// other way to say it is ready), or the process exits.
    fn wait_ready(&mut self, limit: Duration, log: &Path) -> Result<(), String> {
        let until = Instant::now() + limit;
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Err(format!(
                    "server exited ({status}) before listening; see {}",
                    log.display()
                ));
            }
            if TcpStream::connect_timeout(&self.addr, Duration::from_millis(200)).is_ok() {
                return Ok(());
            }
            if Instant::now() >= until {
                return Err(format!(
                    "{} did not accept connections within {limit:?}; see {}",
                    self.addr,
                    log.display()
                ));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Stops the server: SIGTERM, up to 15 s to exit (Centrifugo drains for
    /// a few seconds), then SIGKILL.
    pub fn stop(mut self) {
        self.stop_now();
    }

    fn stop_now(&mut self) {
        if let Ok(Some(_)) = self.child.try_wait() {
            return;
        }
        // SAFETY: kill(2) on our own child's pid.
        unsafe {
            libc::kill(self.pid as i32, libc::SIGTERM);
        }
        let until = Instant::now() + Duration::from_secs(15);
        while Instant::now() < until {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for RunningServer {
    fn drop(&mut self) {
        self.stop_now();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_targets_and_refuses_duplicates() {
        let f = TargetsFile::parse(
            "targets:\n  - {name: a, driver: plaza, address: '127.0.0.1:1', start: [x, y]}\n  - {name: b, driver: broadcast, address: '127.0.0.1:2'}\n",
        )
        .unwrap();
        assert_eq!(f.targets.len(), 2);
        assert_eq!(
            f.targets[0].start.as_deref(),
            Some(&["x".to_owned(), "y".to_owned()][..])
        );
        assert_eq!(f.targets[1].start, None);
        assert_eq!(f.targets[1].ready_timeout_s, 30);
        assert!(TargetsFile::parse("targets: []").is_err());
        assert!(TargetsFile::parse(
            "targets:\n  - {name: a, driver: plaza, address: x}\n  - {name: a, driver: plaza, address: y}\n"
        )
        .unwrap_err()
        .contains("twice"));
        assert!(
            TargetsFile::parse("targets:\n  - {name: a, driver: p, address: x, typo: 1}\n")
                .is_err()
        );
        assert!(
            TargetsFile::parse("targets:\n  - {name: a, driver: p, address: x, start: []}\n")
                .is_err()
        );
    }

    #[test]
    fn addresses_from_urls_and_host_ports() {
        assert_eq!(address_of("127.0.0.1:7700"), "127.0.0.1:7700");
        assert_eq!(
            address_of("ws://localhost:8000/connection/websocket"),
            "localhost:8000"
        );
        assert_eq!(address_of("http://127.0.0.1:3000"), "127.0.0.1:3000");
        assert_eq!(
            resolve("ws://127.0.0.1:9/x").unwrap(),
            "127.0.0.1:9".parse().unwrap()
        );
        assert!(resolve("no-port").is_err());
    }

    #[test]
    fn environment_expansion() {
        let env = |v: &str| (v == "BIN").then(|| "/opt/c".to_owned());
        assert_eq!(
            expand_env("${BIN}/centrifugo", env).unwrap(),
            "/opt/c/centrifugo"
        );
        assert_eq!(expand_env("plain", env).unwrap(), "plain");
        assert!(expand_env("${NOPE}", env).unwrap_err().contains("NOPE"));
        assert!(expand_env("${BIN", env).is_err());
        // Defaults: for an unset or empty variable only.
        assert_eq!(expand_env("${NOPE:-0.2}", env).unwrap(), "0.2");
        assert_eq!(expand_env("${BIN:-/usr}/c", env).unwrap(), "/opt/c/c");
        let empty = |v: &str| (v == "E").then(String::new);
        assert_eq!(expand_env("q=${E:-1}", empty).unwrap(), "q=1");
        assert_eq!(expand_env("${NOPE:-}x", env).unwrap(), "x");
        assert_eq!(
            expand_env("${A:-1} ${B:-2}", |v| (v == "B").then(|| "b".into())).unwrap(),
            "1 b"
        );
    }

    #[test]
    fn launches_waits_for_the_port_and_stops() {
        // A reference-free server: python's http.server on a free port.
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let spec = TargetSpec {
            name: "py".into(),
            driver: "broadcast".into(),
            address: format!("127.0.0.1:{port}"),
            start: Some(vec![
                "python3".into(),
                "-m".into(),
                "http.server".into(),
                "--bind".into(),
                "127.0.0.1".into(),
                port.to_string(),
            ]),
            cwd: None,
            env: BTreeMap::new(),
            ready_timeout_s: 30,
        };
        let log = std::env::temp_dir().join(format!("plaza-bench-target-{port}.log"));
        let caps = ServerCaps {
            cpus: Some(vec![0]),
            quota: None,
        };
        let server = spec.launch(&caps, &log).unwrap().expect("started");
        let status = std::fs::read_to_string(format!("/proc/{}/status", server.pid)).unwrap();
        assert!(status.contains("Cpus_allowed_list:\t0\n"), "{status}");
        assert!(TcpStream::connect(server.addr).is_ok());
        let addr = server.addr;
        // Starting a second one on the same address is refused.
        assert!(spec.launch(&caps, &log).unwrap_err().contains("in use"));
        server.stop();
        assert!(TcpStream::connect(addr).is_err(), "stopped");
        let _ = std::fs::remove_file(log);
    }

    #[test]
    fn a_server_that_exits_at_once_is_reported() {
        let spec = TargetSpec {
            name: "f".into(),
            driver: "plaza".into(),
            address: "127.0.0.1:9".into(),
            start: Some(vec!["false".into()]),
            cwd: None,
            env: BTreeMap::new(),
            ready_timeout_s: 30,
        };
        let log = std::env::temp_dir().join("plaza-bench-target-false.log");
        let err = spec.launch(&ServerCaps::default(), &log).unwrap_err();
        assert!(err.contains("exited"), "{err}");
        let _ = std::fs::remove_file(log);
    }
}
