//! Real `plaza serve` nodes behind real nginx and HAProxy (configured from deploy/), started
//! with plaza-launch; and `plaza cluster up` as a process.
//!
//! The nodes run in embedded mode (no --redis): routing is what is tested here, not the broker.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use plaza_launch::{http_get, LbKind, LoadBalancer, NodeOptions, NodeProcess};

const PLAZA: &str = env!("CARGO_BIN_EXE_plaza");
/// Polling interval where nothing signals the awaited state (a balancer noticing a dead node).
const POLL: Duration = Duration::from_millis(50);

/// Upgrades to a WebSocket at `/v1/ws?room=ROOM` through `lb` and returns the node that
/// answered the 101 (its `x-plaza-node` header).
fn landing_node(
    rt: &tokio::runtime::Runtime,
    lb: SocketAddr,
    room: &str,
) -> Result<String, String> {
    rt.block_on(async {
        let url = format!("ws://{lb}/v1/ws?room={room}");
        let connect = tokio_tungstenite::connect_async(url);
        let (mut ws, resp) = tokio::time::timeout(Duration::from_secs(10), connect)
            .await
            .map_err(|_| format!("upgrade for room {room} timed out"))?
            .map_err(|e| format!("upgrade for room {room}: {e}"))?;
        // Closed cleanly, to the server's end: HAProxy hashes with bounded loads
        // (deploy/haproxy/plaza.cfg, hash-balance-factor), and connections it
        // still counted would send the next room elsewhere.
        let _ = tokio::time::timeout(Duration::from_secs(5), async {
            use futures_util::StreamExt;
            let _ = ws.close(None).await;
            while let Some(Ok(_)) = ws.next().await {}
        })
        .await;
        resp.headers()
            .get("x-plaza-node")
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
            .ok_or_else(|| format!("101 for room {room} without x-plaza-node"))
    })
}

fn two_nodes_behind(kind: LbKind) {
    let dir = tempfile::tempdir().unwrap();
    let ids = [format!("{kind}-a"), format!("{kind}-b")];
    let mut nodes: Vec<NodeProcess> = ids
        .iter()
        .map(|id| {
            let opts = NodeOptions {
                log_dir: Some(dir.path().join("nodes")),
                ..NodeOptions::new(id.clone())
            };
            NodeProcess::start(Path::new(PLAZA), opts).unwrap()
        })
        .collect();
    let upstreams: Vec<SocketAddr> = nodes.iter().map(NodeProcess::addr).collect();
    let lb = LoadBalancer::start(kind, 0, &upstreams, &dir.path().join("lb")).unwrap();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();

    // (a) /readyz through the balancer: 200, from one of the two nodes.
    let ready = http_get(lb.addr(), "/readyz", Duration::from_secs(10)).unwrap();
    assert_eq!(ready.status, 200, "{kind}: /readyz: {}", ready.text());
    let body: serde_json::Value = serde_json::from_slice(&ready.body).unwrap();
    assert_eq!(body["ready"], true);
    let node = body["node"].as_str().unwrap();
    assert!(
        ids.iter().any(|id| id == node),
        "{kind}: /readyz from {node}"
    );
    assert_eq!(ready.header("x-plaza-node"), Some(node));

    // (b) One room: every upgrade lands on the same node.
    let same: Vec<String> = (0..10)
        .map(|_| landing_node(&rt, lb.addr(), "same").unwrap())
        .collect();
    assert!(
        same.iter().all(|n| *n == same[0]),
        "{kind}: room `same` spread over {same:?}"
    );

    // (c) Many rooms: both nodes get some.
    let mut rooms_of: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for i in 0..40 {
        let room = format!("room-{i}");
        let node = landing_node(&rt, lb.addr(), &room).unwrap();
        rooms_of.entry(node).or_default().push(room);
    }
    assert_eq!(
        rooms_of.keys().collect::<Vec<_>>(),
        ids.iter().collect::<Vec<_>>(),
        "{kind}: 40 rooms landed on {rooms_of:?}"
    );
    // The hash is stable: a room comes back to the node it landed on.
    let (first_node, first_rooms) = rooms_of.iter().next().unwrap();
    assert_eq!(
        &landing_node(&rt, lb.addr(), &first_rooms[0]).unwrap(),
        first_node
    );

    // (d) SIGKILL the node of some rooms: a new upgrade for one of them lands on the other.
    let victim = 0;
    let survivor = &ids[1];
    let moved_room = &rooms_of[&ids[victim]][0];
    nodes[victim].kill().unwrap();
    let killed = Instant::now();
    let deadline = killed + Duration::from_secs(15);
    let mut attempts = 0;
    let landed = loop {
        attempts += 1;
        match landing_node(&rt, lb.addr(), moved_room) {
            Ok(node) => break node,
            Err(e) if Instant::now() < deadline => {
                eprintln!("{kind}: after the kill: {e}");
                std::thread::sleep(POLL);
            }
            Err(e) => panic!("{kind}: no failover within 15 s: {e}"),
        }
    };
    assert_eq!(&landed, survivor, "{kind}: room {moved_room}");
    eprintln!(
        "{kind}: room {moved_room} moved to {landed} after {attempts} attempt(s), {:?}",
        killed.elapsed()
    );
    // Plain HTTP fails over too.
    let ready = http_get(lb.addr(), "/readyz", Duration::from_secs(10)).unwrap();
    assert_eq!(ready.status, 200, "{kind}: /readyz after the kill");
    assert_eq!(ready.header("x-plaza-node"), Some(survivor.as_str()));
}

#[test]
fn nginx_routes_rooms_by_hash_and_fails_over() {
    two_nodes_behind(LbKind::Nginx);
}

#[test]
fn haproxy_routes_rooms_by_hash_and_fails_over() {
    two_nodes_behind(LbKind::Haproxy);
}

/// `plaza cluster up` and the process groups it printed; on drop (a failed test) everything
/// is killed, so that nothing outlives the test.
struct ClusterUp {
    child: Child,
    pids: Vec<i32>,
}

impl Drop for ClusterUp {
    fn drop(&mut self) {
        for pid in &self.pids {
            // SAFETY: kill(2) has no memory-safety preconditions.
            unsafe { libc::kill(-pid, libc::SIGKILL) };
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Whether any process of the group `pgid` is alive (reaped or not).
fn group_alive(pgid: i32) -> bool {
    // SAFETY: signal 0 only checks for existence.
    unsafe { libc::kill(-pgid, 0) == 0 }
}

/// What `plaza cluster up` printed, up to its last line ("data and logs …"), read on a thread
/// so that a silent child fails the test instead of blocking it.
fn read_report(child: &mut Child) -> Vec<String> {
    let (tx, rx) = mpsc::channel();
    let stdout = child.stdout.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            if tx.send(line.unwrap()).is_err() {
                break;
            }
        }
    });
    let deadline = Instant::now() + Duration::from_secs(90);
    let mut report = Vec::new();
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let line = rx
            .recv_timeout(left)
            .unwrap_or_else(|e| panic!("plaza cluster up printed {report:#?}, then {e:?}"));
        let done = line.trim_start().starts_with("data and logs");
        report.push(line);
        if done {
            return report;
        }
    }
}

/// The balancer's address in the report ("load balancer  nginx  http://ADDR/ …").
fn balancer_of(report: &[String]) -> SocketAddr {
    report
        .iter()
        .find(|l| l.trim_start().starts_with("load balancer"))
        .and_then(|l| l.split("http://").nth(1))
        .and_then(|rest| rest.split('/').next())
        .and_then(|addr| addr.parse().ok())
        .unwrap_or_else(|| panic!("no balancer address in {report:#?}"))
}

#[test]
fn cluster_up_runs_until_sigterm_and_stops_its_children() {
    let dir = tempfile::tempdir().unwrap();
    // Port 0: the launcher picks the balancer's port (and picks again if it was taken
    // meanwhile, as a port chosen here could be by another test of this binary).
    let child = Command::new(PLAZA)
        .args(["cluster", "up", "--nodes", "2", "--listen", "127.0.0.1:0"])
        .arg("--dir")
        .arg(dir.path())
        // Embedded nodes: --redis is being built elsewhere and must not decide this test.
        .arg("--embedded")
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut up = ClusterUp {
        child,
        pids: Vec::new(),
    };

    let report = read_report(&mut up.child);
    let text = report.join("\n");
    let lb = balancer_of(&report);
    for id in ["node-1", "node-2"] {
        assert!(text.contains(id), "{text}");
    }
    up.pids = report
        .iter()
        .filter_map(|l| l.split("(pid ").nth(1))
        .map(|p| p.trim_end_matches(')').parse().unwrap())
        .collect();
    // The balancer and two nodes (no Redis: embedded).
    assert_eq!(up.pids.len(), 3, "{text}");
    let node_addrs: Vec<SocketAddr> = report
        .iter()
        .filter(|l| l.trim_start().starts_with("node-"))
        .map(|l| {
            let url = l.split_whitespace().nth(1).unwrap();
            url.trim_start_matches("http://").parse().unwrap()
        })
        .collect();
    assert_eq!(node_addrs.len(), 2, "{text}");

    let ready = http_get(lb, "/readyz", Duration::from_secs(10)).unwrap();
    assert_eq!(ready.status, 200, "{}", ready.text());

    // SAFETY: kill(2) has no memory-safety preconditions.
    assert_eq!(
        unsafe { libc::kill(up.child.id() as i32, libc::SIGTERM) },
        0
    );
    assert!(
        exits_within(up.child.id() as i32, Duration::from_secs(60)),
        "plaza cluster up ignored SIGTERM"
    );
    let status = up.child.wait().unwrap();
    assert!(status.success(), "plaza cluster up exited with {status}");
    for pid in &up.pids {
        assert!(
            !group_alive(*pid),
            "process group {pid} outlived cluster up"
        );
    }
    for addr in node_addrs.iter().chain([&lb]) {
        assert!(
            TcpStream::connect_timeout(addr, Duration::from_secs(1)).is_err(),
            "{addr} still accepts connections"
        );
    }
    // A --dir given by the user is kept: the logs are there.
    assert!(dir.path().join("nodes/node-1.log").is_file());
}

/// Waits until process `pid` (not a child of ours) has exited, or `timeout` passed; returns
/// whether it exited. A pidfd becomes readable when its process exits.
fn exits_within(pid: i32, timeout: Duration) -> bool {
    // SAFETY: pidfd_open(2) takes a pid and flags and returns a new fd or -1.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) } as i32;
    if fd < 0 {
        // ESRCH: it is gone already.
        return std::io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH);
    }
    let mut pfd = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd; the fd is ours and closed right after.
    let ready = unsafe { libc::poll(&mut pfd, 1, timeout.as_millis() as i32) };
    unsafe { libc::close(fd) };
    ready == 1
}

#[test]
fn cluster_up_killed_outright_takes_its_children_along() {
    // Its own directory: killed outright, it cannot remove a temporary one.
    let dir = tempfile::tempdir().unwrap();
    let child = Command::new(PLAZA)
        .args([
            "cluster",
            "up",
            "--nodes",
            "1",
            "--embedded",
            "--listen",
            "127.0.0.1:0",
        ])
        .arg("--dir")
        .arg(dir.path())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut up = ClusterUp {
        child,
        pids: Vec::new(),
    };
    let report = read_report(&mut up.child);
    let lb = balancer_of(&report);
    up.pids = report
        .iter()
        .filter_map(|l| l.split("(pid ").nth(1))
        .map(|p| p.trim_end_matches(')').parse().unwrap())
        .collect();
    assert_eq!(up.pids.len(), 2, "the balancer and one node: {report:#?}");

    // SIGKILL: no handler runs, nothing is stopped in order.
    up.child.kill().unwrap();
    up.child.wait().unwrap();
    for pid in &up.pids {
        assert!(
            exits_within(*pid, Duration::from_secs(30)),
            "{pid} outlived a killed cluster up"
        );
    }
    assert!(
        TcpStream::connect_timeout(&lb, Duration::from_secs(1)).is_err(),
        "{lb} still accepts connections"
    );
}
