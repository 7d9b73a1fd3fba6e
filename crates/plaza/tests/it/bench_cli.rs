//! `plaza bench` as a user runs it: one run spread over two load processes
//! against a real `plaza serve`, with results added up; and `plaza bench
//! restart`, which starts, stops and restarts `plaza serve --data-dir` itself.

use std::process::Command;

use crate::support::start;

const SCENARIO: &str = r#"
name: two-processes
rooms: 1
phases:
  - { name: join, arrival_rate: 100, users: 6 }
  - { name: publish, duration_s: 0.5, record: true }
flows:
  - name: member
    steps:
      - connect
      - join: { room: "mp-{room}" }
      - wait_all_joined
      - loop: { count: 2, every_ms: 20, steps: [ { publish: { bytes: 100 } } ] }
      - idle
expect: { delivery_ratio: 1.0, error_rate: 0.0 }
drain: { quiet_ms: 300, max_ms: 10000 }
"#;

#[test]
fn a_run_over_two_load_processes_counts_every_delivery_once() {
    let server = start(&[], &[("PLAZA_LOG", "warn")]);
    let addr = server.addr.clone();
    let dir = std::env::temp_dir().join(format!("plaza-bench-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("two.yaml");
    std::fs::write(&file, SCENARIO).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_plaza"))
        .args(["bench", "run"])
        .arg(&file)
        .args(["--target", &addr, "--processes", "2", "--quiet", "--out"])
        .arg(dir.join("out"))
        .output()
        .unwrap();
    drop(server);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("(2 load processes)"), "{stdout}");
    let result: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join("out/result.json")).unwrap()).unwrap();
    // 6 users over two processes, 2 publishes each, 5 other members.
    assert_eq!(result["users"], 6);
    assert_eq!(result["joined"], 6);
    assert_eq!(result["publishes_total"], 12);
    assert_eq!(result["deliveries_total"], 60, "{result:#}");
    assert_eq!(result["expected_deliveries_total"], 60);
    let _ = std::fs::remove_dir_all(dir);
}

/// `plaza bench restart` on a few small rooms: it fills them, stops the
/// server (SIGTERM, then SIGKILL), starts it again, and every room answers
/// with the seq it had before the stop and its whole history.
#[test]
fn restart_brings_every_room_back_at_its_seq() {
    let dir = tempfile::Builder::new()
        .prefix("plaza-bench-restart")
        .tempdir()
        .unwrap();
    let data = dir.path().join("data");
    let json = dir.path().join("restart.json");
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let out = Command::new(env!("CARGO_BIN_EXE_plaza"))
        .args(["bench", "restart", "--rooms", "5", "--history", "20"])
        .args([
            "--payload-bytes",
            "50",
            "--fsync",
            "always",
            "--concurrency",
            "3",
        ])
        .args(["--listen", &format!("127.0.0.1:{port}"), "--data-dir"])
        .arg(&data)
        .arg("--out")
        .arg(&json)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("spawn → /readyz 200"), "{stdout}");
    let r: serde_json::Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    assert_eq!(r["passed"], true, "{r:#}");
    let rounds = r["rounds"].as_array().unwrap();
    assert_eq!(rounds.len(), 2);
    for (round, stop) in rounds.iter().zip(["term", "kill"]) {
        assert_eq!(round["stop"], stop);
        assert_eq!(round["publishes"], 5 * 20);
        assert_eq!(round["seq_mismatches"], 0, "{round:#}");
        assert_eq!(round["history_mismatches"], 0, "{round:#}");
        assert!(round["all_rooms_ms"].as_f64().unwrap() >= round["ready_ms"].as_f64().unwrap());
        assert!(round["disk_after_restart"].as_u64().unwrap() > 0);
    }
    // A second run refuses the directory the first one left.
    let again = Command::new(env!("CARGO_BIN_EXE_plaza"))
        .args(["bench", "restart", "--data-dir"])
        .arg(&data)
        .output()
        .unwrap();
    assert_eq!(again.status.code(), Some(2));
}
