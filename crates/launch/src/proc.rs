//! A child process with a log file, signals to its process group, and waits with deadlines.

use std::cell::Cell;
use std::fs::OpenOptions;
use std::io::{self, Read, Seek, SeekFrom};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// How often wait loops look again: these processes give no readiness event.
pub(crate) const POLL: Duration = Duration::from_millis(20);
/// How long a process may take to become ready. Generous: tests run in parallel on 2 cores.
pub(crate) const READY_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a process may take to exit after SIGTERM before it gets SIGKILL.
pub(crate) const STOP_TIMEOUT: Duration = Duration::from_secs(15);
/// How many fresh ports `start` tries when a process exits before it is ready (the port picked
/// by [`crate::free_port`] may have been taken in between).
pub(crate) const START_ATTEMPTS: usize = 3;

/// Runs `launch` on a free port, trying a fresh one (up to
/// [`START_ATTEMPTS`]) when the process exits before it is ready.
pub(crate) fn on_a_free_port(
    mut launch: impl FnMut(u16) -> Result<Proc, NotReady>,
) -> std::io::Result<(Proc, u16)> {
    let mut attempt = 0;
    loop {
        attempt += 1;
        let port = crate::free_port()?;
        match launch(port) {
            Ok(proc) => return Ok((proc, port)),
            Err(NotReady::Exited(_)) if attempt < START_ATTEMPTS => continue,
            Err(e) => return Err(e.into()),
        }
    }
}

thread_local! {
    /// Whether processes this thread starts die with it (see [`tie_children_to_this_thread`]).
    static TIED: Cell<bool> = const { Cell::new(false) };
}

/// From now on, every process this thread starts gets SIGTERM when this thread ends (Linux's
/// parent-death signal), so that a launcher killed with SIGKILL leaves nothing running.
///
/// Call it from a thread that outlives the processes it starts, such as the main thread of
/// `plaza cluster up`; never from a pool thread, which may end while its processes should run
/// on (the signal follows the thread, not the process).
pub fn tie_children_to_this_thread() {
    TIED.with(|t| t.set(true));
}

/// Why a process did not become ready.
pub(crate) enum NotReady {
    /// It exited first (often: its port was taken meanwhile); worth a retry on a new port.
    Exited(io::Error),
    /// Anything else.
    Failed(io::Error),
}

impl From<NotReady> for io::Error {
    fn from(e: NotReady) -> io::Error {
        match e {
            NotReady::Exited(e) | NotReady::Failed(e) => e,
        }
    }
}

/// A running (or exited, not yet restarted) child process.
pub(crate) struct Proc {
    /// Names the process in errors, e.g. "plaza node node-1 (127.0.0.1:40123)".
    name: String,
    child: Child,
    /// Set once the child was reaped: its pid may then belong to someone else.
    status: Option<ExitStatus>,
    log: PathBuf,
}

impl Proc {
    /// Spawns `cmd` in a new process group, stdin from /dev/null, stdout and stderr appended
    /// to `log`.
    pub(crate) fn spawn(name: String, mut cmd: Command, log: &Path) -> io::Result<Proc> {
        let existed = log.exists();
        let out = OpenOptions::new().create(true).append(true).open(log)?;
        cmd.stdin(Stdio::null())
            .stdout(out.try_clone()?)
            .stderr(out)
            .process_group(0);
        if TIED.with(Cell::get) {
            let launcher = std::process::id() as libc::pid_t;
            // SAFETY: between fork and exec only prctl(2) and getppid(2) run, which are
            // async-signal-safe.
            unsafe {
                cmd.pre_exec(move || {
                    if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM) != 0 {
                        return Err(io::Error::last_os_error());
                    }
                    // The launcher may have died before the prctl: nothing would signal then.
                    if libc::getppid() != launcher {
                        // No allocation between fork and exec: a plain errno.
                        return Err(io::Error::from_raw_os_error(libc::ESRCH));
                    }
                    Ok(())
                });
            }
        }
        let child = cmd.spawn().map_err(|e| {
            // Nothing ran: a log made for it would only be left behind, empty.
            if !existed {
                let _ = std::fs::remove_file(log);
            }
            io::Error::new(
                e.kind(),
                format!("cannot start {name} ({:?}): {e}", cmd.get_program()),
            )
        })?;
        Ok(Proc {
            name,
            child,
            status: None,
            log: log.to_owned(),
        })
    }

    /// The pid while the child has not been reaped.
    pub(crate) fn pid(&self) -> Option<u32> {
        self.status.is_none().then(|| self.child.id())
    }

    /// The exit status if the child has exited (reaping it), `None` while it runs.
    pub(crate) fn try_status(&mut self) -> io::Result<Option<ExitStatus>> {
        if self.status.is_none() {
            self.status = self.child.try_wait()?;
        }
        Ok(self.status)
    }

    /// Sends `sig` to the child alone (a no-op once it was reaped).
    pub(crate) fn signal(&mut self, sig: libc::c_int) -> io::Result<()> {
        match self.pid() {
            Some(pid) => send(pid as libc::pid_t, sig),
            None => Ok(()),
        }
    }

    /// Sends `sig` to the child's whole process group (its workers, for nginx).
    fn signal_group(&mut self, sig: libc::c_int) -> io::Result<()> {
        match self.pid() {
            // The group is named by the leader's pid, which stays reserved until it is reaped.
            Some(pid) => send(-(pid as libc::pid_t), sig),
            None => Ok(()),
        }
    }

    /// Waits up to `timeout` for the child to exit.
    pub(crate) fn wait_timeout(&mut self, timeout: Duration) -> io::Result<Option<ExitStatus>> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(s) = self.try_status()? {
                return Ok(Some(s));
            }
            if Instant::now() >= deadline {
                return Ok(None);
            }
            std::thread::sleep(POLL);
        }
    }

    /// SIGKILL to the process group, then reaps the child.
    pub(crate) fn kill(&mut self) -> io::Result<ExitStatus> {
        self.signal_group(libc::SIGKILL)?;
        if let Some(s) = self.status {
            return Ok(s);
        }
        let s = self.child.wait()?;
        self.status = Some(s);
        Ok(s)
    }

    /// SIGSTOP to the group: the process hangs with its sockets open (the kernel still accepts
    /// connections and takes bytes), as a stalled host would.
    pub(crate) fn pause(&mut self) -> io::Result<()> {
        self.signal_group(libc::SIGSTOP)
    }

    /// SIGCONT to the group: a paused process runs again.
    pub(crate) fn resume(&mut self) -> io::Result<()> {
        self.signal_group(libc::SIGCONT)
    }

    /// SIGTERM, up to [`STOP_TIMEOUT`] to exit, then SIGKILL. Whatever is left of the process
    /// group (say, a worker the master lost) is killed too.
    pub(crate) fn stop(&mut self) -> io::Result<ExitStatus> {
        self.signal(libc::SIGTERM)?;
        if self.status.is_none() {
            let pid = self.child.id();
            match self.wait_timeout(STOP_TIMEOUT)? {
                Some(_) => {
                    // The leader is reaped: its group id may be reused only once the group is
                    // empty, so a SIGKILL that finds nobody (ESRCH) is the normal case.
                    let _ = send(-(pid as libc::pid_t), libc::SIGKILL);
                }
                None => {
                    self.kill()?;
                }
            }
        }
        Ok(self.status.expect("reaped above"))
    }

    /// Polls `probe` until it answers `Ok`, the child exits, or [`READY_TIMEOUT`] passes.
    /// `probe` returns `Err(description)` of what it saw last, quoted on timeout.
    pub(crate) fn wait_ready(
        &mut self,
        what: &str,
        mut probe: impl FnMut() -> Result<(), String>,
    ) -> Result<(), NotReady> {
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            let last = match probe() {
                Ok(()) => return Ok(()),
                Err(e) => e,
            };
            if let Some(status) = self.try_status().map_err(NotReady::Failed)? {
                return Err(NotReady::Exited(
                    self.error(format!("exited ({status}) before {what}")),
                ));
            }
            if Instant::now() >= deadline {
                return Err(NotReady::Failed(self.error(format!(
                    "did not {what} within {}s (last: {last})",
                    READY_TIMEOUT.as_secs()
                ))));
            }
            std::thread::sleep(POLL);
        }
    }

    /// An error naming the process and its log, with the log's last lines.
    pub(crate) fn error(&self, what: String) -> io::Error {
        io::Error::other(format!(
            "{} {what}; log {}:\n{}",
            self.name,
            self.log.display(),
            log_tail(&self.log)
        ))
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.kill();
    }
}

fn send(pid: libc::pid_t, sig: libc::c_int) -> io::Result<()> {
    // SAFETY: kill(2) has no memory-safety preconditions.
    if unsafe { libc::kill(pid, sig) } == 0 {
        return Ok(());
    }
    let e = io::Error::last_os_error();
    if e.raw_os_error() == Some(libc::ESRCH) {
        // Already gone (or a group already empty): what the signal was for.
        return Ok(());
    }
    Err(e)
}

/// The last ~20 lines of a log file, indented, for error messages.
fn log_tail(path: &Path) -> String {
    const MAX: u64 = 4096;
    let Ok(mut f) = std::fs::File::open(path) else {
        return "  (no log)".into();
    };
    let len = f.metadata().map(|m| m.len()).unwrap_or(0);
    let _ = f.seek(SeekFrom::Start(len.saturating_sub(MAX)));
    let mut buf = Vec::new();
    let _ = f.read_to_end(&mut buf);
    let text = String::from_utf8_lossy(&buf);
    let lines: Vec<&str> = text.lines().collect();
    let tail = &lines[lines.len().saturating_sub(20)..];
    if tail.is_empty() {
        return "  (empty)".into();
    }
    tail.iter()
        .map(|l| format!("  {l}"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Finds a program: the `env` variable if set, else `PATH`, else the sbin directories (which a
/// non-root `PATH` often lacks, and where Debian puts nginx and HAProxy).
pub(crate) fn find_program(name: &str, env: &str, package: &str) -> io::Result<PathBuf> {
    if let Some(p) = std::env::var_os(env) {
        return Ok(PathBuf::from(p));
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    let sbin = ["/usr/local/sbin", "/usr/sbin", "/sbin"].map(PathBuf::from);
    std::env::split_paths(&path)
        .chain(sbin)
        .map(|d| d.join(name))
        .find(|p| p.is_file())
        .ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::NotFound,
                format!(
                    "{name} not found on PATH nor in /usr/sbin: install it \
                     (apt-get install {package}) or set {env}"
                ),
            )
        })
}

/// Whether something accepts TCP connections at `addr`.
pub(crate) fn accepts(addr: std::net::SocketAddr) -> Result<(), String> {
    std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(1))
        .map(drop)
        .map_err(|e| format!("connect {addr}: {e}"))
}

/// Fails with `AddrInUse` when `port` on 127.0.0.1 cannot be bound: a process that bound it
/// already would answer the readiness probe in place of the one being started.
pub(crate) fn check_port_free(port: u16, what: &str) -> io::Result<()> {
    std::net::TcpListener::bind((std::net::Ipv4Addr::LOCALHOST, port))
        .map(drop)
        .map_err(|e| io::Error::new(e.kind(), format!("{what}: 127.0.0.1:{port}: {e}")))
}
