//! CPU time and memory of a server, read from `/proc`: of its whole process tree, so that a
//! server made of several processes (`plaza cluster up`: the launcher, its nodes, Redis,
//! nginx's master and workers) is measured whole. A server of one process is its own tree.
//!
//! The tree is found afresh at every reading by walking the parent links of every process in
//! `/proc` (`/proc/PID/stat` field 4): a few hundred small reads, well under a millisecond per
//! second of sampling.
//!
//! **Processes that end.** A process's CPU time stays counted after it exits: the time of a
//! child that its parent has reaped is in the parent's `cutime`/`cstime` (stat fields 16-17,
//! the children's time including theirs), which the tree's CPU time includes; an exited child
//! not yet reaped (a zombie) still shows its own times. So the tree's CPU time does not go back
//! when a node is killed, restarted, or nginx replaces a worker, and needs no memory of earlier
//! readings. One reading is consistent too: children are read before their parents, so a child
//! reaped before its parent is read is counted once, in the parent; and a reading in which a
//! process vanished after it was read (its time may then be in its parent's as well) is taken
//! again. What it misses: processes reaped by something outside the tree (orphans, adopted by
//! init when their parent died first), which does not happen while a cluster runs.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

/// CPU time (user + system) used so far: with `None`, by this process alone (its own threads,
/// not its children, which include the servers it started); with `Some(pid)`, by process
/// `pid` and all its descendants, including those that have exited (see the module's notes).
pub fn cpu_time(pid: Option<u32>) -> Option<Duration> {
    match pid {
        None => {
            let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
            Some(ticks_to_duration(Stat::parse(&stat)?.own_ticks))
        }
        Some(pid) => tree_usage(pid).map(|t| t.cpu),
    }
}

/// Bytes and packets the loopback interface has carried so far (its
/// receive counters in `/proc/net/dev`: on `lo` every packet sent is
/// received once). They count IP and TCP headers, ACKs and every other
/// process's loopback traffic: traffic at the socket as a network would see
/// it, on a machine where the run is all that uses loopback.
pub fn loopback() -> Option<(u64, u64)> {
    parse_loopback(&std::fs::read_to_string("/proc/net/dev").ok()?)
}

fn parse_loopback(dev: &str) -> Option<(u64, u64)> {
    let line = dev
        .lines()
        .find_map(|l| l.trim_start().strip_prefix("lo:"))?;
    let mut fields = line.split_whitespace().map(|f| f.parse::<u64>().ok());
    Some((fields.next()??, fields.next()??))
}

/// Resident memory of process `pid` and its descendants, in KiB: the sum of their RSS. Pages
/// they share (nginx's workers and master, copy-on-write) are counted once per process, so a
/// tree's sum overstates what it holds by that much.
pub fn rss_kib(pid: u32) -> Option<u64> {
    tree_usage(pid).map(|t| t.rss_kib)
}

/// A process tree's resources at one reading.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TreeUsage {
    /// How many processes it has now (the root included).
    pub processes: usize,
    /// CPU time (user + system) of its processes and of their reaped descendants.
    pub cpu: Duration,
    /// Sum of its processes' resident memory, KiB.
    pub rss_kib: u64,
}

/// The resources of process `root` and its descendants; `None` when `root` does not exist.
pub fn tree_usage(root: u32) -> Option<TreeUsage> {
    let members = tree(root)?;
    let mut usage = TreeUsage {
        processes: 0,
        cpu: Duration::ZERO,
        rss_kib: 0,
    };
    let mut ticks = 0u64;
    for (pid, s) in &members {
        usage.processes += 1;
        ticks += s.own_ticks + s.children_ticks;
        // VmRSS rather than stat's RSS field, which newer kernels give from approximate
        // per-CPU counters: a one-process tree reads exactly what the bench always read. A
        // process that ended since its stat was read adds nothing.
        usage.rss_kib += vm_rss_kib(*pid).unwrap_or(0);
    }
    usage.cpu = ticks_to_duration(ticks);
    Some(usage)
}

/// The processes of `root`'s tree, read so that none vanished meanwhile (see the module's notes
/// on reaping); `None` when `root` does not exist.
fn tree(root: u32) -> Option<Vec<(u32, Stat)>> {
    // A retry is rare (a process of the tree ended during a reading); after a few in a row
    // (a tree that forks and reaps without pause) the last reading is good enough.
    let mut members = read_tree(root)?;
    for _ in 0..4 {
        if members
            .iter()
            .all(|(pid, _)| std::path::Path::new(&format!("/proc/{pid}")).exists())
        {
            break;
        }
        members = read_tree(root)?;
    }
    Some(members)
}

/// One reading of `root`'s tree: pids and stats, descendants before their ancestors, `root`
/// last; `None` when `root` does not exist.
fn read_tree(root: u32) -> Option<Vec<(u32, Stat)>> {
    let mut children: HashMap<u32, Vec<u32>> = HashMap::new();
    for entry in std::fs::read_dir("/proc").ok()?.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        // A process that ended since the directory was listed has no stat: skip it.
        if let Some(stat) = read_stat(pid) {
            children.entry(stat.ppid).or_default().push(pid);
        }
    }
    // Breadth first from the root.
    let mut order = vec![root];
    let mut seen: HashSet<u32> = HashSet::from([root]);
    let mut i = 0;
    while i < order.len() {
        if let Some(kids) = children.get(&order[i]) {
            // `seen` guards against a cycle, which only a pid reused mid-listing could fake.
            order.extend(kids.iter().filter(|k| seen.insert(**k)));
        }
        i += 1;
    }
    // The listing read parents before their children (lower pids first): the figures are
    // read again, children first, so that a child reaped meanwhile is found in its parent.
    let mut members = Vec::with_capacity(order.len());
    for pid in order.into_iter().rev() {
        match read_stat(pid) {
            Some(stat) => members.push((pid, stat)),
            None if pid == root => return None,
            None => {}
        }
    }
    Some(members)
}

/// The fields of `/proc/PID/stat` used here.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Stat {
    ppid: u32,
    /// utime + stime, in clock ticks.
    own_ticks: u64,
    /// cutime + cstime: reaped children's (and their reaped children's) time, in ticks.
    children_ticks: u64,
}

impl Stat {
    fn parse(stat: &str) -> Option<Stat> {
        // The command name (field 2) may hold spaces and parentheses: fields count from the
        // last ')'.
        let rest = stat.get(stat.rfind(')')? + 2..)?;
        let fields: Vec<&str> = rest.split_whitespace().collect();
        // Field N of the line is fields[N - 3] here.
        let num = |n: usize| fields.get(n - 3)?.parse::<u64>().ok();
        Some(Stat {
            ppid: u32::try_from(num(4)?).ok()?,
            own_ticks: num(14)? + num(15)?,
            // cutime and cstime are signed in the kernel's format, never negative in practice.
            children_ticks: num(16).unwrap_or(0) + num(17).unwrap_or(0),
        })
    }
}

fn read_stat(pid: u32) -> Option<Stat> {
    Stat::parse(&std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?)
}

fn ticks_to_duration(ticks: u64) -> Duration {
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    let hz = if hz > 0 { hz as u64 } else { 100 };
    Duration::from_micros(ticks * 1_000_000 / hz)
}

/// Resident memory of one process (VmRSS), KiB; `None` for a process that has ended (or a
/// zombie, which has no memory and no VmRSS line).
fn vm_rss_kib(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
}

#[cfg(test)]
mod tests {

    #[test]
    fn loopback_counters_are_read_from_proc_net_dev() {
        let dev = "Inter-|   Receive                                                |  Transmit\n \
                   face |bytes    packets errs drop fifo frame compressed multicast|bytes\n  \
                   eth0: 999 9 0 0 0 0 0 0 999 9 0 0 0 0 0 0\n    \
                   lo: 123456 789 0 0 0 0 0 0 123456 789 0 0 0 0 0 0\n";
        assert_eq!(parse_loopback(dev), Some((123_456, 789)));
        assert_eq!(parse_loopback("eth0: 1 2 3"), None);
        assert!(
            loopback().is_some(),
            "this machine has a loopback interface"
        );
    }

    use super::*;
    use std::process::{Child, Command, Stdio};
    use std::time::Instant;

    /// The own CPU time (utime + stime) of one process.
    fn own_cpu(pid: u32) -> Option<Duration> {
        read_stat(pid).map(|s| ticks_to_duration(s.own_ticks))
    }

    /// A shell whose children burn CPU; killed (its group) on drop.
    struct Busy(Child);

    impl Busy {
        /// `sh -c 'busy & busy & wait'`, in a process group of its own.
        fn spawn(script: &str) -> Busy {
            use std::os::unix::process::CommandExt;
            let child = Command::new("sh")
                .args(["-c", script])
                .stdout(Stdio::null())
                .process_group(0)
                .spawn()
                .expect("sh");
            Busy(child)
        }

        fn pid(&self) -> u32 {
            self.0.id()
        }
    }

    impl Drop for Busy {
        fn drop(&mut self) {
            // SAFETY: kill(2) on the group this test created.
            unsafe { libc::kill(-(self.0.id() as libc::pid_t), libc::SIGKILL) };
            let _ = self.0.wait();
        }
    }

    /// Polls (the kernel gives no event for "has used CPU") until `f` holds, or panics.
    fn eventually(what: &str, mut f: impl FnMut() -> bool) {
        let deadline = Instant::now() + Duration::from_secs(20);
        while !f() {
            assert!(Instant::now() < deadline, "timed out waiting until {what}");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

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
        assert!(cpu_time(None).unwrap() > before);
        assert!(cpu_time(Some(pid)).unwrap() >= before);
        assert_eq!(cpu_time(Some(u32::MAX)), None);
        assert_eq!(rss_kib(u32::MAX), None);
    }

    #[test]
    fn a_process_without_children_is_its_own_tree() {
        let mut sleeper = Command::new("sleep").arg("30").spawn().expect("sleep");
        let pid = sleeper.id();
        // Once it sleeps, its figures hold still between the reads compared below.
        eventually("sleep sleeps", || {
            std::fs::read_to_string(format!("/proc/{pid}/stat"))
                .is_ok_and(|s| s.contains("(sleep) S "))
        });
        let usage = tree_usage(pid).unwrap();
        let (rss, own) = (vm_rss_kib(pid), own_cpu(pid));
        sleeper.kill().ok();
        sleeper.wait().ok();
        assert_eq!(usage.processes, 1);
        assert_eq!(Some(usage.rss_kib), rss, "the same figure as VmRSS");
        assert_eq!(Some(usage.cpu), own);
    }

    #[test]
    fn parses_names_with_spaces_and_parentheses() {
        let line = "42 (a b) c)) S 7 42 42 0 -1 4194560 100 0 0 0 250 50 30 20 20 0 1 0 \
                    12345 10000000 321 18446744073709551615";
        assert_eq!(
            Stat::parse(line),
            Some(Stat {
                ppid: 7,
                own_ticks: 300,
                children_ticks: 50,
            })
        );
        assert_eq!(Stat::parse("42 (x"), None);
    }

    /// Two busy children of a shell: the tree's CPU is theirs too, far above the shell's own,
    /// and its RSS adds up the three processes.
    #[test]
    fn a_tree_sums_its_descendants() {
        let busy = Busy::spawn("while :; do :; done & while :; do :; done & wait");
        let pid = busy.pid();
        eventually("the shell has two children", || {
            tree_usage(pid).is_some_and(|u| u.processes == 3)
        });
        eventually("the tree used 300 ms of CPU", || {
            cpu_time(Some(pid)).is_some_and(|c| c >= Duration::from_millis(300))
        });
        let tree_cpu = cpu_time(Some(pid)).unwrap();
        let shell_cpu = own_cpu(pid).unwrap();
        assert!(
            tree_cpu >= shell_cpu + Duration::from_millis(250),
            "tree {tree_cpu:?}, shell alone {shell_cpu:?}"
        );
        let usage = tree_usage(pid).unwrap();
        let shell_rss = vm_rss_kib(pid).unwrap();
        assert!(
            usage.rss_kib > shell_rss,
            "tree {} KiB, shell alone {shell_rss} KiB",
            usage.rss_kib
        );
    }

    /// A child that burned CPU and was reaped still counts (in its parent's cutime): the tree's
    /// CPU does not go back when a process of it ends.
    #[test]
    fn an_ended_child_keeps_counting() {
        // The child counts in shell arithmetic (no processes of its own) for about a second
        // of CPU and exits; `wait` reaps it; the shell then becomes `sleep` (same pid, same
        // times: exec keeps them).
        let busy = Busy::spawn(
            "sh -c 'i=0; while [ $i -lt 400000 ]; do i=$((i+1)); done' & wait; exec sleep 30",
        );
        let pid = busy.pid();
        let mut last = Duration::ZERO;
        let mut saw_child = false;
        eventually("the busy child has ended", || {
            let usage = tree_usage(pid).expect("the shell runs");
            assert!(usage.cpu >= last, "went back: {last:?} -> {:?}", usage.cpu);
            last = usage.cpu;
            saw_child |= usage.processes == 2;
            let exec_done = std::fs::read_to_string(format!("/proc/{pid}/comm"))
                .is_ok_and(|c| c.trim() == "sleep");
            saw_child && usage.processes == 1 && exec_done
        });
        let after = cpu_time(Some(pid)).unwrap();
        let own = own_cpu(pid).unwrap();
        assert!(after >= last, "went back: {last:?} -> {after:?}");
        assert!(
            after >= own + Duration::from_millis(200),
            "tree {after:?}, shell alone {own:?}: the reaped child's time is missing"
        );
    }
}
