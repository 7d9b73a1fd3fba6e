//! CPU quotas of a local cluster's nodes (`plaza cluster up --node-cpu-quota`, cgroup v1):
//! each node in a cgroup of its own, kept across a restart, removed when the cluster stops.
//!
//! The nodes run in embedded mode: the quota is what is tested here, not the broker.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use plaza_launch::{ClusterOptions, CpuQuotas, LbKind, LocalCluster, CPU_CGROUP};

const PLAZA: &str = env!("CARGO_BIN_EXE_plaza");

fn has_cpu_controller() -> bool {
    Path::new(CPU_CGROUP).join("cpu.cfs_quota_us").exists()
}

/// The cpu cgroup of process `pid`, as a directory under the controller's mount point.
fn cpu_cgroup_of(pid: u32) -> PathBuf {
    let text = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap();
    let path = text
        .lines()
        .find_map(|l| {
            let mut parts = l.splitn(3, ':');
            let (_, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
            controllers.split(',').any(|c| c == "cpu").then_some(path)
        })
        .unwrap_or_else(|| panic!("no cpu controller in {text}"));
    Path::new(CPU_CGROUP).join(path.trim_start_matches('/'))
}

/// `cpu.cfs_quota_us` and `cpu.cfs_period_us` of a cgroup.
fn quota_of(group: &Path) -> (String, String) {
    let read = |f: &str| {
        std::fs::read_to_string(group.join(f))
            .unwrap_or_else(|e| panic!("{}/{f}: {e}", group.display()))
            .trim()
            .to_owned()
    };
    (read("cpu.cfs_quota_us"), read("cpu.cfs_period_us"))
}

/// A free port whose successor was free a moment ago too.
fn two_free_ports() -> u16 {
    loop {
        let p = plaza_launch::free_port().unwrap();
        if p < u16::MAX && std::net::TcpListener::bind(("127.0.0.1", p + 1)).is_ok() {
            return p;
        }
    }
}

/// Kills the process groups `plaza cluster up` printed if the test fails half-way.
struct Groups(Vec<i32>);

impl Drop for Groups {
    fn drop(&mut self) {
        for pid in &self.0 {
            // SAFETY: kill(2) has no memory-safety preconditions.
            unsafe { libc::kill(-pid, libc::SIGKILL) };
        }
    }
}

#[test]
fn cluster_up_caps_each_node_and_removes_the_cgroups_after_sigterm() {
    let dir = tempfile::tempdir().unwrap();
    if !has_cpu_controller() {
        // A host without the controller: the quota stops `cluster up`, naming the
        // controller, rather than being ignored.
        let out = Command::new(PLAZA)
            .args(["cluster", "up", "--nodes", "1", "--listen", "127.0.0.1:0"])
            .args(["--node-cpu-quota", "0.5", "--embedded", "--dir"])
            .arg(dir.path())
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{err}");
        assert!(err.contains(CPU_CGROUP), "{err}");
        return;
    }
    let first = two_free_ports();
    // Port 0: the launcher picks the balancer's port, and picks again if it was taken meanwhile
    // (a port chosen here could be, by another test of this binary).
    let mut child = Command::new(PLAZA)
        .args(["cluster", "up", "--nodes", "2", "--listen", "127.0.0.1:0"])
        .args(["--node-cpu-quota", "0.5", "--lb-workers", "1", "--embedded"])
        .args(["--node-ports", &first.to_string()])
        .arg("--dir")
        .arg(dir.path())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut groups = Groups(Vec::new());

    // The report, read on a thread so that a hang fails the test instead of blocking it.
    let (tx, rx) = mpsc::channel();
    let stdout = child.stdout.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            if tx.send(line.unwrap()).is_err() {
                break;
            }
        }
    });
    let mut report = Vec::new();
    loop {
        let line = rx
            .recv_timeout(Duration::from_secs(90))
            .unwrap_or_else(|e| panic!("plaza cluster up printed {report:#?}, then {e:?}"));
        let done = line.trim_start().starts_with("data and logs");
        report.push(line);
        if done {
            break;
        }
    }
    let text = report.join("\n");
    let pid_of = |line: &str| -> i32 {
        let p = line
            .split("(pid ")
            .nth(1)
            .unwrap_or_else(|| panic!("{text}"));
        p.trim_end_matches(')').parse().unwrap()
    };
    groups.0 = report
        .iter()
        .filter(|l| l.contains("(pid "))
        .map(|l| pid_of(l))
        .collect();
    let nodes: Vec<&String> = report
        .iter()
        .filter(|l| l.trim_start().starts_with("node-"))
        .collect();
    assert_eq!(nodes.len(), 2, "{text}");

    // --node-ports: node-1 on the first port, node-2 on the next.
    for (line, port) in nodes.iter().zip([first, first + 1]) {
        assert!(
            line.contains(&format!("http://127.0.0.1:{port} ")),
            "{line}"
        );
    }
    let mut node_groups = Vec::new();
    for line in &nodes {
        assert!(line.contains("cpu quota 0.5"), "{line}");
        let group = cpu_cgroup_of(pid_of(line) as u32);
        assert_eq!(
            quota_of(&group),
            ("10000".to_owned(), "20000".to_owned()),
            "{}",
            group.display()
        );
        node_groups.push(group);
    }
    assert_ne!(
        node_groups[0], node_groups[1],
        "each node has a group of its own"
    );
    // No --lb-cpu-quota: the balancer stays where the launcher is.
    let lb_line = report.iter().find(|l| l.contains("load balancer")).unwrap();
    assert!(!lb_line.contains("cpu quota"), "{lb_line}");
    assert_eq!(
        cpu_cgroup_of(pid_of(lb_line) as u32),
        cpu_cgroup_of(child.id())
    );

    // SAFETY: kill(2) has no memory-safety preconditions.
    assert_eq!(unsafe { libc::kill(child.id() as i32, libc::SIGTERM) }, 0);
    let (done_tx, done_rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = done_tx.send(child.wait());
    });
    let status = done_rx
        .recv_timeout(Duration::from_secs(60))
        .expect("plaza cluster up ignored SIGTERM")
        .unwrap();
    assert!(status.success(), "plaza cluster up exited with {status}");
    for group in &node_groups {
        assert!(!group.exists(), "{} outlived the cluster", group.display());
    }
}

#[test]
fn a_restarted_node_keeps_its_quota() {
    let dir = tempfile::tempdir().unwrap();
    let opts = ClusterOptions {
        plaza_bin: PathBuf::from(PLAZA),
        nodes: 1,
        lb: LbKind::Nginx,
        listen_port: 0,
        dir: dir.path().to_owned(),
        node_args: Vec::new(),
        embedded: true,
        cpu_quotas: CpuQuotas {
            node: Some(0.25),
            redis: None,
            lb: Some(0.5),
        },
        lb_workers: Some(1),
        node_ports: None,
        redis_sentinel: false,
        redis_cluster: None,
    };
    if !has_cpu_controller() {
        let err = LocalCluster::start(opts)
            .err()
            .expect("a quota without cgroups");
        assert_eq!(err.kind(), std::io::ErrorKind::Unsupported, "{err}");
        return;
    }
    let mut cluster = LocalCluster::start(opts).unwrap();
    let group = cluster.node(0).cpu_quota().unwrap().path().to_owned();
    let lb_group = cluster.lb().cpu_quota().unwrap().path().to_owned();
    let first = cluster.node(0).pid().unwrap();
    assert_eq!(cpu_cgroup_of(first), group);
    assert_eq!(cpu_cgroup_of(cluster.lb().pid().unwrap()), lb_group);
    assert_eq!(quota_of(&lb_group).0, "10000");

    cluster.restart_node(0).unwrap();
    let second = cluster.node(0).pid().unwrap();
    assert_ne!(first, second);
    assert_eq!(
        cpu_cgroup_of(second),
        group,
        "the restarted node left its group"
    );
    assert_eq!(quota_of(&group).0, "5000");

    cluster.stop().unwrap();
    drop(cluster);
    assert!(!group.exists(), "{} outlived the node", group.display());
    assert!(!lb_group.exists(), "{} outlived nginx", lb_group.display());
}
