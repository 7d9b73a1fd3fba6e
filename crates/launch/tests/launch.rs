//! plaza-launch without a plaza binary: Redis, the rendered templates, start errors.
//! (Nodes behind nginx and HAProxy are tested end to end in crates/plaza/tests/launch.rs.)

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::process::Command;
use std::time::Duration;

use plaza_launch::{
    render_config, CpuQuota, LbKind, LbOptions, LoadBalancer, NodeOptions, NodeProcess,
    RedisProcess, CPU_CGROUP,
};

/// Sends one command in RESP and returns the raw reply (no redis crate needed for three calls).
fn resp(addr: SocketAddr, args: &[&str]) -> String {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut req = format!("*{}\r\n", args.len());
    for a in args {
        req.push_str(&format!("${}\r\n{a}\r\n", a.len()));
    }
    s.write_all(req.as_bytes()).unwrap();
    let mut buf = [0u8; 512];
    let mut got = Vec::new();
    // Every reply used here is one line, or a bulk string (a header line, then the value line).
    loop {
        let n = s.read(&mut buf).unwrap();
        assert!(n > 0, "redis closed the connection after {got:?}");
        got.extend_from_slice(&buf[..n]);
        let text = String::from_utf8_lossy(&got);
        let lines = text.matches("\r\n").count();
        let want = if text.starts_with('$') && !text.starts_with("$-1") {
            2
        } else {
            1
        };
        if lines >= want {
            return text.into_owned();
        }
    }
}

fn refused(addr: SocketAddr) -> bool {
    TcpStream::connect_timeout(&addr, Duration::from_secs(1)).is_err()
}

#[test]
fn redis_starts_answers_ping_and_stops() {
    let dir = tempfile::tempdir().unwrap();
    let mut redis = RedisProcess::start(dir.path()).unwrap();
    assert_eq!(redis.url(), format!("redis://127.0.0.1:{}/", redis.port()));
    assert_eq!(resp(redis.addr(), &["PING"]), "+PONG\r\n");
    // Persistence as configured: AOF on, RDB snapshots off.
    assert!(resp(redis.addr(), &["CONFIG", "GET", "appendonly"]).contains("yes"));
    assert!(
        redis.dir().join("redis.log").is_file(),
        "its log is kept in its directory"
    );

    let status = redis.stop().unwrap();
    assert!(status.success(), "redis exited with {status} after SIGTERM");
    assert!(redis.pid().is_none());
    assert!(refused(redis.addr()), "redis still listens after stop");
}

#[test]
fn redis_restart_keeps_data_in_the_append_only_file() {
    let dir = tempfile::tempdir().unwrap();
    let mut redis = RedisProcess::start(dir.path()).unwrap();
    let port = redis.port();
    assert_eq!(resp(redis.addr(), &["SET", "plaza:k", "v1"]), "+OK\r\n");

    // A graceful restart.
    redis.restart().unwrap();
    assert_eq!(redis.port(), port);
    assert_eq!(resp(redis.addr(), &["GET", "plaza:k"]), "$2\r\nv1\r\n");

    // A crash: the acknowledged write is in the AOF already.
    assert_eq!(resp(redis.addr(), &["SET", "plaza:k", "v2"]), "+OK\r\n");
    let status = redis.kill().unwrap();
    assert!(!status.success());
    assert!(refused(redis.addr()));
    redis.restart().unwrap();
    assert_eq!(resp(redis.addr(), &["GET", "plaza:k"]), "$2\r\nv2\r\n");
    assert!(dir.path().join("appendonlydir").is_dir());
}

#[test]
fn redis_is_killed_when_dropped() {
    let dir = tempfile::tempdir().unwrap();
    let redis = RedisProcess::start(dir.path()).unwrap();
    let (addr, pid) = (redis.addr(), redis.pid().unwrap());
    drop(redis);
    assert!(refused(addr));
    // SAFETY: kill(2) with signal 0 only checks existence.
    let alive = unsafe { libc::kill(pid as libc::pid_t, 0) } == 0;
    assert!(!alive, "redis {pid} survived the drop");
}

#[test]
fn rendered_templates_are_valid_configurations() {
    let dir = tempfile::tempdir().unwrap();
    let listen: SocketAddr = "127.0.0.1:7700".parse().unwrap();
    let ups: Vec<SocketAddr> = vec![
        "127.0.0.1:7801".parse().unwrap(),
        "127.0.0.1:7802".parse().unwrap(),
        "127.0.0.1:7803".parse().unwrap(),
    ];
    for kind in [LbKind::Nginx, LbKind::Haproxy] {
        let text = render_config(kind, listen, &ups, dir.path(), None);
        let left = text
            .lines()
            .find(|l| !l.trim_start().starts_with('#') && l.contains("{{"));
        assert_eq!(left, None, "{kind}: placeholder left");
        // Backends: WebSocket, HTTP transport sessions and the rest of HTTP.
        let backends = 3;
        for up in &ups {
            assert_eq!(
                text.matches(&up.to_string()).count(),
                backends,
                "{kind}: {up}"
            );
        }
        let file = dir.path().join(format!("{kind}.conf"));
        std::fs::write(&file, &text).unwrap();
        let mut check = Command::new(kind.program().unwrap());
        match kind {
            LbKind::Nginx => check
                .arg("-p")
                .arg(dir.path())
                .arg("-e")
                .arg(dir.path().join("check.log"))
                .arg("-t")
                .arg("-c")
                .arg(&file),
            LbKind::Haproxy => check.arg("-c").arg("-f").arg(&file),
        };
        let out = check.output().unwrap();
        assert!(
            out.status.success(),
            "{kind} rejects the rendered template: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let nginx = render_config(LbKind::Nginx, listen, &ups, dir.path(), None);
    assert!(nginx.contains("hash $arg_room consistent;"));
    assert!(nginx.contains("least_conn;"));
    assert!(nginx.contains("\nworker_processes auto;\n"));
    let two = render_config(LbKind::Nginx, listen, &ups, dir.path(), Some(2));
    assert!(two.contains("\nworker_processes 2;\n"), "{two}");
    let haproxy = render_config(LbKind::Haproxy, listen, &ups, dir.path(), None);
    assert!(haproxy.contains("server node3 127.0.0.1:7803 check"));
    assert!(haproxy.contains("balance url_param room"));
}

#[test]
fn a_taken_port_is_reported_not_mistaken_for_the_balancer() {
    let dir = tempfile::tempdir().unwrap();
    let taken = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port();
    let up: SocketAddr = "127.0.0.1:9".parse().unwrap();
    let err = LoadBalancer::start(LbKind::Haproxy, port, &[up], dir.path())
        .err()
        .expect("started on a taken port");
    assert_eq!(err.kind(), std::io::ErrorKind::AddrInUse, "{err}");
}

#[test]
fn balancer_without_upstreams_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let err = LoadBalancer::start(LbKind::Nginx, 0, &[], dir.path())
        .err()
        .expect("started without upstreams");
    assert_eq!(err.kind(), std::io::ErrorKind::InvalidInput);
}

#[test]
fn a_node_that_exits_early_is_named_with_its_log() {
    let dir = tempfile::tempdir().unwrap();
    // Not plaza: `sh serve --listen …` fails at once ("cannot open serve").
    let opts = NodeOptions {
        log_dir: Some(dir.path().to_owned()),
        ..NodeOptions::new("n-early")
    };
    let err = NodeProcess::start("/bin/sh".as_ref(), opts)
        .err()
        .expect("sh became ready as a plaza node");
    let msg = err.to_string();
    assert!(msg.contains("plaza node n-early"), "{msg}");
    assert!(msg.contains("exited"), "{msg}");
    let log = dir.path().join("n-early.log");
    assert!(msg.contains(&log.display().to_string()), "{msg}");
    assert!(msg.contains("serve"), "the log's tail is missing: {msg}");

    let missing = NodeProcess::start("/nonexistent/plaza".as_ref(), NodeOptions::new("n-none"))
        .err()
        .expect("started a missing binary");
    assert_eq!(missing.kind(), std::io::ErrorKind::NotFound, "{missing}");
    assert!(missing.to_string().contains("n-none"), "{missing}");
    // Nothing ran, so no log of it is left in the temporary directory.
    let leftovers: Vec<_> = std::fs::read_dir(std::env::temp_dir())
        .unwrap()
        .filter_map(Result::ok)
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("plaza-node-n-none-"))
        .collect();
    assert_eq!(leftovers, Vec::<String>::new());
}

/// The cpu cgroup of process `pid`, as a directory under the controller's mount point.
fn cpu_cgroup_of(pid: u32) -> std::path::PathBuf {
    let text = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap();
    let path = text
        .lines()
        .find_map(|l| {
            let mut parts = l.splitn(3, ':');
            let (_, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
            controllers.split(',').any(|c| c == "cpu").then_some(path)
        })
        .unwrap_or_else(|| panic!("no cpu controller in {text}"));
    std::path::Path::new(CPU_CGROUP).join(path.trim_start_matches('/'))
}

fn read_trimmed(path: &std::path::Path) -> String {
    std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .trim()
        .to_owned()
}

fn has_cpu_controller() -> bool {
    std::path::Path::new(CPU_CGROUP)
        .join("cpu.cfs_quota_us")
        .exists()
}

#[test]
fn redis_runs_under_its_cpu_quota_across_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    if !has_cpu_controller() {
        // A host without the controller: the quota is refused, never ignored.
        let err = RedisProcess::start_with_quota(dir.path(), Some(0.3))
            .err()
            .expect("a quota without cgroups");
        assert_eq!(err.kind(), std::io::ErrorKind::Unsupported, "{err}");
        return;
    }
    let mut redis = RedisProcess::start_with_quota(dir.path(), Some(0.3)).unwrap();
    let group = redis.cpu_quota().expect("a quota").path().to_owned();
    let pid = redis.pid().unwrap();
    assert_eq!(cpu_cgroup_of(pid), group);
    assert_eq!(read_trimmed(&group.join("cpu.cfs_quota_us")), "6000");
    assert_eq!(read_trimmed(&group.join("cpu.cfs_period_us")), "20000");

    redis.restart().unwrap();
    let new_pid = redis.pid().unwrap();
    assert_ne!(new_pid, pid);
    assert_eq!(
        cpu_cgroup_of(new_pid),
        group,
        "the restarted Redis left its group"
    );
    assert_eq!(
        read_trimmed(&group.join("cgroup.procs")),
        new_pid.to_string()
    );

    drop(redis);
    assert!(!group.exists(), "{} outlived Redis", group.display());
}

#[test]
fn nginx_workers_share_the_balancers_cgroup() {
    let dir = tempfile::tempdir().unwrap();
    // nginx does not connect to its upstreams until a request comes: none needs to run.
    let up: SocketAddr = "127.0.0.1:9".parse().unwrap();
    let opts = LbOptions {
        workers: Some(1),
        cpu_quota: Some(0.5),
        ..LbOptions::default()
    };
    if !has_cpu_controller() {
        // A host without the controller: the quota is refused, never ignored.
        let err = LoadBalancer::start_with(LbKind::Nginx, 0, &[up], dir.path(), opts)
            .err()
            .expect("a quota without cgroups");
        assert_eq!(err.kind(), std::io::ErrorKind::Unsupported, "{err}");
        return;
    }
    let mut lb = LoadBalancer::start_with(LbKind::Nginx, 0, &[up], dir.path(), opts).unwrap();
    assert!(std::fs::read_to_string(lb.config_path())
        .unwrap()
        .contains("\nworker_processes 1;\n"));
    let group = lb.cpu_quota().expect("a quota").path().to_owned();
    assert_eq!(read_trimmed(&group.join("cpu.cfs_quota_us")), "10000");
    let master = lb.pid().unwrap();
    // The master forks its worker after it became ready to accept: wait for it to show.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let procs = loop {
        let procs: Vec<u32> = read_trimmed(&group.join("cgroup.procs"))
            .lines()
            .map(|l| l.parse().unwrap())
            .collect();
        if procs.len() >= 2 || std::time::Instant::now() >= deadline {
            break procs;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(procs.contains(&master), "{procs:?}");
    assert_eq!(procs.len(), 2, "the master and one worker: {procs:?}");

    lb.stop().unwrap();
    drop(lb);
    assert!(!group.exists(), "{} outlived nginx", group.display());
}

#[test]
fn a_worker_count_is_refused_for_haproxy() {
    let dir = tempfile::tempdir().unwrap();
    let up: SocketAddr = "127.0.0.1:9".parse().unwrap();
    let opts = LbOptions {
        workers: Some(2),
        ..LbOptions::default()
    };
    let err = LoadBalancer::start_with(LbKind::Haproxy, 0, &[up], dir.path(), opts)
        .err()
        .expect("HAProxy started with a worker count");
    assert_eq!(err.kind(), std::io::ErrorKind::InvalidInput, "{err}");
}

#[test]
fn a_cpu_quota_confines_a_command_from_its_start() {
    if !has_cpu_controller() {
        assert!(CpuQuota::create_unique("t", 0.5).is_err());
        return;
    }
    let quota = CpuQuota::create_unique("confine-test", 0.25).unwrap();
    assert_eq!(quota.cpus(), 0.25);
    let mut cmd = Command::new("sh");
    // The shell's child is forked inside too.
    cmd.args(["-c", "sleep 30 & wait"]);
    quota.confine(&mut cmd);
    let mut child = cmd.spawn().unwrap();
    assert_eq!(cpu_cgroup_of(child.id()), quota.path());
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let procs = loop {
        let procs = read_trimmed(&quota.path().join("cgroup.procs"));
        if procs.lines().count() >= 2 || std::time::Instant::now() >= deadline {
            break procs;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(procs.lines().count(), 2, "sh and sleep: {procs}");
    let path = quota.path().to_owned();
    // `sleep` is killed too, though nobody may reap it (its parent is gone): an exited process
    // leaves the group even before it is reaped.
    let pids: Vec<i32> = procs.lines().map(|l| l.parse().unwrap()).collect();
    for pid in pids {
        // SAFETY: kill(2) on processes this test started.
        unsafe { libc::kill(pid, libc::SIGKILL) };
    }
    child.wait().unwrap();
    drop(quota);
    assert!(!path.exists(), "{} outlived its processes", path.display());
}
