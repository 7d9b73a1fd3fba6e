//! Resource caps for the server under test (and the generator itself): CPU
//! affinity, and a CPU quota through cgroup v1's `cpu.cfs_quota_us`, so that
//! "1 CPU" runs mirror the source documents' container limits.

use std::io;

/// A cgroup holding the server under a CPU quota, removed on drop (once its processes have
/// ended); shared with `plaza cluster up`, which caps each node with it.
pub use plaza_launch::CpuQuota;

/// Parses a CPU list such as `0`, `0,1` or `0-3,6`.
pub fn parse_cpu_list(s: &str) -> Result<Vec<usize>, String> {
    let mut cpus = Vec::new();
    for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let num = |v: &str| {
            v.trim()
                .parse::<usize>()
                .map_err(|e| format!("CPU {v:?} in {s:?}: {e}"))
        };
        match part.split_once('-') {
            Some((a, b)) => {
                let (a, b) = (num(a)?, num(b)?);
                if a > b {
                    return Err(format!("{part:?} in {s:?}: range runs backwards"));
                }
                cpus.extend(a..=b);
            }
            None => cpus.push(num(part)?),
        }
    }
    if cpus.is_empty() {
        return Err(format!("no CPU in {s:?}"));
    }
    if let Some(&c) = cpus.iter().find(|&&c| c >= libc::CPU_SETSIZE as usize) {
        return Err(format!("CPU {c} is out of range"));
    }
    cpus.sort_unstable();
    cpus.dedup();
    Ok(cpus)
}

/// Restricts thread `tid` (0: the calling thread) to `cpus`.
pub fn set_affinity(tid: i32, cpus: &[usize]) -> io::Result<()> {
    // SAFETY: cpu_set_t is plain data; CPU_ZERO/CPU_SET write inside it (cpus
    // are checked against CPU_SETSIZE by parse_cpu_list, and CPU_SET ignores
    // larger ones), and sched_setaffinity reads it.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_ZERO(&mut set);
        for &c in cpus {
            libc::CPU_SET(c, &mut set);
        }
        if libc::sched_setaffinity(tid, std::mem::size_of::<libc::cpu_set_t>(), &set) != 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

/// Restricts every thread of process `pid` to `cpus` (threads it starts
/// later inherit the affinity of the thread that starts them).
pub fn pin_process(pid: u32, cpus: &[usize]) -> io::Result<()> {
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task"))?;
    for task in tasks {
        let tid = task?
            .file_name()
            .to_string_lossy()
            .parse::<i32>()
            .map_err(io::Error::other)?;
        match set_affinity(tid, cpus) {
            Ok(()) => {}
            // The thread ended meanwhile.
            Err(e) if e.raw_os_error() == Some(libc::ESRCH) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use plaza_launch::CPU_CGROUP;
    use std::path::Path;

    #[test]
    fn cpu_lists() {
        assert_eq!(parse_cpu_list("0"), Ok(vec![0]));
        assert_eq!(parse_cpu_list("1,0"), Ok(vec![0, 1]));
        assert_eq!(parse_cpu_list("0-2,6,2"), Ok(vec![0, 1, 2, 6]));
        assert!(parse_cpu_list("").is_err());
        assert!(parse_cpu_list("2-1").is_err());
        assert!(parse_cpu_list("x").is_err());
        assert!(parse_cpu_list("100000").is_err());
    }

    #[test]
    fn pinning_a_process_is_visible_in_proc() {
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .expect("sleep");
        pin_process(child.id(), &[0]).unwrap();
        let status = std::fs::read_to_string(format!("/proc/{}/status", child.id())).unwrap();
        let allowed = status
            .lines()
            .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
            .map(str::trim);
        child.kill().ok();
        child.wait().ok();
        assert_eq!(allowed, Some("0"));
    }

    /// These machines have a writable cgroup v1 CPU controller (the
    /// project's CI runs as root on the same kind); elsewhere the quota must
    /// be refused with a clear error, not half applied.
    #[test]
    fn a_quota_moves_the_process_into_its_cgroup_and_is_removed_after() {
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .expect("sleep");
        let pid = child.id();
        let applied = CpuQuota::apply(pid, 0.25);
        if !Path::new(CPU_CGROUP).join("cpu.cfs_quota_us").exists() {
            child.kill().ok();
            child.wait().ok();
            let e = applied.unwrap_err();
            assert_eq!(e.kind(), io::ErrorKind::Unsupported, "{e}");
            return;
        }
        let quota = applied.expect("quota applied");
        let dir = Path::new(CPU_CGROUP).join(format!("plaza-bench-{pid}"));
        let set = std::fs::read_to_string(dir.join("cpu.cfs_quota_us")).unwrap();
        let cgroup = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap();
        child.kill().ok();
        child.wait().ok();
        drop(quota);
        assert_eq!(set.trim(), "5000", "0.25 of a 20 ms period");
        assert!(cgroup.contains(&format!("plaza-bench-{pid}")), "{cgroup}");
        assert!(
            !dir.exists(),
            "the cgroup is removed once its process ended"
        );
    }

    #[test]
    fn a_bad_quota_is_refused() {
        assert!(CpuQuota::apply(std::process::id(), 0.0).is_err());
        assert!(CpuQuota::apply(std::process::id(), f64::NAN).is_err());
    }
}
