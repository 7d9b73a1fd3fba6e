//! plaza-launch without a plaza binary: Redis, the rendered templates, start errors.
//! (Nodes behind nginx and HAProxy are tested end to end in crates/plaza/tests/launch.rs.)

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::process::Command;
use std::time::Duration;

use plaza_launch::{render_config, LbKind, LoadBalancer, NodeOptions, NodeProcess, RedisProcess};

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
    assert!(redis.log_path().starts_with(redis.dir()));

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
        let text = render_config(kind, listen, &ups, dir.path());
        let left = text
            .lines()
            .find(|l| !l.trim_start().starts_with('#') && l.contains("{{"));
        assert_eq!(left, None, "{kind}: placeholder left");
        for up in &ups {
            // Two backends (WebSocket, HTTP), each with every node.
            assert_eq!(text.matches(&up.to_string()).count(), 2, "{kind}: {up}");
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
    let nginx = render_config(LbKind::Nginx, listen, &ups, dir.path());
    assert!(nginx.contains("hash $arg_room consistent;"));
    assert!(nginx.contains("least_conn;"));
    let haproxy = render_config(LbKind::Haproxy, listen, &ups, dir.path());
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
}
