//! CPU time and memory of a process, read from `/proc`.

use std::time::Duration;

/// CPU time (user + system) used so far by process `pid` (`None`: this process).
pub fn cpu_time(pid: Option<u32>) -> Option<Duration> {
    let path = match pid {
        Some(p) => format!("/proc/{p}/stat"),
        None => "/proc/self/stat".into(),
    };
    let stat = std::fs::read_to_string(path).ok()?;
    // The command name (field 2) may hold spaces: fields count from its ')'.
    let rest = &stat[stat.rfind(')')? + 2..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // utime and stime are fields 14 and 15 of the line, 12 and 13 here.
    let ticks: u64 = fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?;
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    let hz = if hz > 0 { hz as u64 } else { 100 };
    Some(Duration::from_micros(ticks * 1_000_000 / hz))
}

/// Resident memory of process `pid` in KiB.
pub fn rss_kib(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_this_process() {
        let pid = std::process::id();
        assert!(rss_kib(pid).is_some_and(|k| k > 0));
        let before = cpu_time(None).unwrap();
        let mut x = 0u64;
        for i in 0..50_000_000u64 {
            x = x.wrapping_add(i * i);
        }
        std::hint::black_box(x);
        assert!(cpu_time(Some(pid)).unwrap() >= before);
        assert_eq!(cpu_time(Some(u32::MAX)), None);
    }
}
