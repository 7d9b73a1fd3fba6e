//! CPU quotas through cgroup v1's CPU controller (`cpu.cfs_quota_us`), for the benchmarks'
//! "this process gets 0.25 CPU" and for the processes of a local cluster.

use std::ffi::CString;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// The cgroup v1 CPU controller's mount point.
pub const CPU_CGROUP: &str = "/sys/fs/cgroup/cpu";
/// The quota period: 20 ms, not the kernel's default 100 ms. A process that used its quota
/// waits for the next period; with small quotas (0.08 CPU a node in the scaling runs) a 100 ms
/// period would add up to 92 ms to a message's latency, and the benchmarks would measure the
/// throttling rather than the server. 20 ms still leaves the smallest quota (0.05 CPU) at the
/// kernel's minimum of 1 ms.
pub const PERIOD_US: u64 = 20_000;
/// How long removal waits for processes that were just killed to leave the group.
const REMOVE_WAIT: Duration = Duration::from_millis(500);

/// A cgroup whose processes share a CPU quota; removed when dropped (once its processes have
/// exited).
///
/// The group is a direct child of the controller's root, so it does not nest under the
/// caller's own group: a process moved into it leaves any quota the caller has.
#[derive(Debug)]
pub struct CpuQuota {
    dir: PathBuf,
    cpus: f64,
    /// `DIR/cgroup.procs`, ready for a child to open between fork and exec (no allocation
    /// there).
    procs: CString,
}

impl CpuQuota {
    /// Creates (or reuses) cgroup `name` under [`CPU_CGROUP`], allowed `cpus` CPUs' worth of
    /// time per period (e.g. 0.25, 1.0), with no process in it yet.
    pub fn create(name: &str, cpus: f64) -> io::Result<CpuQuota> {
        if !(cpus > 0.0 && cpus.is_finite()) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("CPU quota must be positive, got {cpus}"),
            ));
        }
        let root = Path::new(CPU_CGROUP);
        if !root.join("cpu.cfs_quota_us").exists() {
            return Err(io::Error::new(
                io::ErrorKind::Unsupported,
                format!("{CPU_CGROUP} is not a cgroup v1 CPU controller"),
            ));
        }
        let dir = root.join(name);
        std::fs::create_dir_all(&dir).map_err(|e| annotate(e, &dir))?;
        let procs = CString::new(dir.join("cgroup.procs").as_os_str().as_bytes())
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
        let quota = CpuQuota { dir, cpus, procs };
        // The kernel's minimum quota is 1 ms.
        let quota_us = ((cpus * PERIOD_US as f64).round() as u64).max(1000);
        quota.write("cpu.cfs_period_us", &PERIOD_US.to_string())?;
        quota.write("cpu.cfs_quota_us", &quota_us.to_string())?;
        Ok(quota)
    }

    /// A new group named `plaza-<this pid>-<n>-<label>` (`n` counts this process's groups),
    /// so that groups of concurrent callers and of several clusters never collide.
    pub fn create_unique(label: &str, cpus: f64) -> io::Result<CpuQuota> {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        CpuQuota::create(&format!("plaza-{}-{n}-{label}", std::process::id()), cpus)
    }

    /// Puts process `pid` (all its threads) in a new group `plaza-bench-<pid>` allowed `cpus`
    /// CPUs. Processes it forks later are inside too; ones it forked before are not.
    pub fn apply(pid: u32, cpus: f64) -> io::Result<CpuQuota> {
        let quota = CpuQuota::create(&format!("plaza-bench-{pid}"), cpus)?;
        quota.add(pid)?;
        Ok(quota)
    }

    /// Moves process `pid` (every thread) into this group.
    pub fn add(&self, pid: u32) -> io::Result<()> {
        self.write("cgroup.procs", &pid.to_string())
    }

    /// Makes the process `cmd` spawns join this group before it execs, so that it and
    /// everything it forks (nginx's workers) run under the quota from their first instruction.
    pub fn confine(&self, cmd: &mut Command) {
        let procs = self.procs.clone();
        // SAFETY: between fork and exec only open(2), write(2) and close(2) run, which are
        // async-signal-safe; the path was allocated before the fork.
        unsafe {
            cmd.pre_exec(move || {
                let fd = libc::open(procs.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
                if fd < 0 {
                    return Err(io::Error::last_os_error());
                }
                // "0" names the writing process itself.
                let written = libc::write(fd, b"0".as_ptr().cast(), 1);
                let err = io::Error::last_os_error();
                libc::close(fd);
                if written != 1 {
                    return Err(err);
                }
                Ok(())
            });
        }
    }

    /// The group's directory, e.g. `/sys/fs/cgroup/cpu/plaza-bench-123`.
    pub fn path(&self) -> &Path {
        &self.dir
    }

    /// The CPUs it allows.
    pub fn cpus(&self) -> f64 {
        self.cpus
    }

    fn write(&self, file: &str, value: &str) -> io::Result<()> {
        let path = self.dir.join(file);
        std::fs::write(&path, value).map_err(|e| annotate(e, &path))
    }
}

impl Drop for CpuQuota {
    fn drop(&mut self) {
        // rmdir fails (EBUSY) while a process is inside. Processes killed just before (nginx's
        // workers after a SIGKILL to their group) leave within moments; a process that keeps
        // running (a server given to `plaza bench --server-pid`) keeps the group, which the
        // next `create` of the same name reuses.
        let deadline = Instant::now() + REMOVE_WAIT;
        while let Err(e) = std::fs::remove_dir(&self.dir) {
            if e.raw_os_error() != Some(libc::EBUSY) || Instant::now() >= deadline {
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

fn annotate(e: io::Error, path: &Path) -> io::Error {
    io::Error::new(e.kind(), format!("{}: {e}", path.display()))
}
