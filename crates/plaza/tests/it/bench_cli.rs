//! `plaza bench run` as a user runs it: one run spread over two load
//! processes against a real `plaza serve`, with results added up.

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
