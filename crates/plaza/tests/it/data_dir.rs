//! Embedded mode with a data directory, with the real binary: a node killed
//! (SIGKILL) under publish load and started again on the same directory has
//! every room back at the same seq, and its members resume with exactly
//! what they missed; a second process on the same directory is refused.

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::cluster_support::{assert_exactly_once, Member};
use serde_json::json;

const LIMIT: Duration = Duration::from_secs(60);

/// `plaza serve` on `port` with `dir` as its data directory; waits until it answers.
async fn serve(port: u16, dir: &std::path::Path) -> Child {
    let mut child = Command::new(env!("CARGO_BIN_EXE_plaza"))
        .args([
            "serve",
            "--listen",
            &format!("127.0.0.1:{port}"),
            "--data-dir",
        ])
        .arg(dir)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let addr = format!("127.0.0.1:{port}");
    for _ in 0..200 {
        if std::net::TcpStream::connect(&addr).is_ok() {
            return child;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let _ = child.kill();
    let _ = child.wait();
    panic!("plaza did not listen on {addr}");
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

async fn publish_all(m: &mut Member, count: usize, on_ack: impl Fn(usize)) {
    for i in 0..count {
        let id = format!("{}-{i}", m.name);
        m.publish(&id, json!(id)).await;
        m.pump_until(LIMIT, |m| m.acked.len() >= i).await;
        on_ack(m.acked.len());
    }
    m.pump_until(LIMIT, |m| m.all_acked()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_node_restarts_with_its_rooms_and_nothing_acknowledged_is_lost() {
    let dir = tempfile::Builder::new()
        .prefix("plaza-data-")
        .tempdir()
        .unwrap();
    let port = free_port();
    let addr = format!("127.0.0.1:{port}");
    let mut node = serve(port, dir.path()).await;
    let created = crate::support::http_post(&addr, "/v1/rooms", r#"{"id": "kept"}"#);
    assert!(created.starts_with("HTTP/1.1 201"), "{created}");
    let url = format!("ws://{addr}/v1/ws?room=kept");
    let a = Member::join(&url, "kept", "a").await;
    let b = Member::join(&url, "kept", "b").await;

    // A second process on the same directory is refused, naming it.
    let second = Command::new(env!("CARGO_BIN_EXE_plaza"))
        .args(["serve", "--listen", "127.0.0.1:0", "--data-dir"])
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(!second.status.success());
    let said = String::from_utf8_lossy(&second.stderr);
    assert!(said.contains("in use by another plaza process"), "{said}");

    const N: usize = 40;
    let (kill_tx, mut kill_rx) = tokio::sync::watch::channel(0usize);
    let tasks: Vec<_> = [a, b]
        .into_iter()
        .enumerate()
        .map(|(i, mut m)| {
            let kill_tx = kill_tx.clone();
            tokio::spawn(async move {
                publish_all(&mut m, N, |acked| {
                    if i == 0 {
                        kill_tx.send_replace(acked);
                    }
                })
                .await;
                m
            })
        })
        .collect();
    kill_rx.wait_for(|&acked| acked >= N / 3).await.unwrap();
    node.kill().unwrap();
    node.wait().unwrap();
    let mut node = serve(port, dir.path()).await;
    let mut members = Vec::new();
    for t in tasks {
        members.push(t.await.unwrap());
    }
    let expected: usize = members.iter().map(|m| m.acked.len()).sum();
    assert_eq!(expected, 2 * N, "every publish was acknowledged in the end");
    for m in members.iter_mut() {
        let want = expected - m.acked.len();
        m.pump_until(LIMIT, |m| m.received.len() >= want).await;
    }
    assert!(members.iter().all(|m| m.reconnects >= 1), "both resumed");
    let refs: Vec<&Member> = members.iter().collect();
    assert_exactly_once(&refs);
    // The room is listed with its seq intact: the last message's.
    let room = crate::support::http_get(&addr, "/v1/rooms/kept");
    assert!(room.starts_with("HTTP/1.1 200"), "{room}");
    node.kill().unwrap();
    node.wait().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clean_restart_keeps_rooms_entities_and_sessions() {
    let dir = tempfile::Builder::new()
        .prefix("plaza-data-")
        .tempdir()
        .unwrap();
    let port = free_port();
    let addr = format!("127.0.0.1:{port}");
    let mut node = serve(port, dir.path()).await;
    let created = crate::support::http_post(
        &addr,
        "/v1/rooms",
        r#"{"id": "calm", "entities": [{"kind": "note", "data": {"t": 1}}]}"#,
    );
    assert!(created.starts_with("HTTP/1.1 201"), "{created}");
    let url = format!("ws://{addr}/v1/ws?room=calm");
    let mut a = Member::join(&url, "calm", "a").await;
    let mut b = Member::join(&url, "calm", "b").await;
    publish_all(&mut a, 10, |_| {}).await;
    b.pump_until(LIMIT, |b| b.received.len() >= 10).await;
    // SIGTERM: the node tells its clients to reconnect and exits.
    let pid = node.id() as libc::pid_t;
    assert_eq!(unsafe { libc::kill(pid, libc::SIGTERM) }, 0);
    let status =
        crate::support::exit_within(&mut node, Duration::from_secs(20), "after SIGTERM").await;
    assert!(status.success(), "{status:?}");
    let mut node = serve(port, dir.path()).await;
    publish_all(&mut b, 5, |_| {}).await;
    a.pump_until(LIMIT, |a| a.received.len() >= 5).await;
    assert!(a.reconnects >= 1 && b.reconnects >= 1, "both resumed");
    assert_exactly_once(&[&a, &b]);
    let state = crate::support::http_get(&addr, "/v1/rooms/calm/state");
    assert!(state.contains(r#""data":{"t":1}"#), "{state}");
    node.kill().unwrap();
    node.wait().unwrap();
}

#[test]
fn bad_data_dir_settings_stop_serve() {
    let run = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_plaza"))
            .args(["serve", "--listen", "127.0.0.1:0"])
            .args(args)
            .output()
            .unwrap()
    };
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().to_str().unwrap();
    let out = run(&["--data-dir", d, "--fsync", "sometimes"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("fsync"),
        "{out:?}"
    );
    let out = run(&["--data-dir", d, "--redis", "redis://127.0.0.1:1/"]);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("data_dir is for embedded mode"),
        "{out:?}"
    );
}
