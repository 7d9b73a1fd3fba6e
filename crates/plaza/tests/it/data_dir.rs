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
    serve_with(port, dir, &[]).await
}

/// As [`serve`], with more arguments.
async fn serve_with(port: u16, dir: &std::path::Path, args: &[&str]) -> Child {
    let mut child = Command::new(env!("CARGO_BIN_EXE_plaza"))
        .args([
            "serve",
            "--listen",
            &format!("127.0.0.1:{port}"),
            "--data-dir",
        ])
        .arg(dir)
        .args(args)
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
    let acquire = |nonce: u64| json!({"type": "request", "room": "calm", "nonce": nonce, "op": "lock.acquire", "args": {"object": "pen", "ttl_ms": 600000}});
    b.send(acquire(1)).await;
    b.pump_until(LIMIT, |b| b.responses.contains_key(&1)).await;
    assert_eq!(b.responses[&1]["ok"], true, "{}", b.responses[&1]);
    let state = crate::support::http_get(&addr, "/v1/rooms/calm/state");
    assert!(state.contains(r#""object":"pen""#), "{state}");
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
    // The earlier run's sessions were disconnected, their locks released
    // (docs/protocol.md, "Data directory"): the holder takes it again.
    assert!(!state.contains(r#""object":"pen""#), "{state}");
    b.send(acquire(2)).await;
    b.pump_until(LIMIT, |b| b.responses.contains_key(&2)).await;
    assert_eq!(b.responses[&2]["ok"], true, "{}", b.responses[&2]);
    node.kill().unwrap();
    node.wait().unwrap();
}

/// Joins `room` on `addr` with `ticket` and returns the first answer:
/// `joined` or `error`.
async fn join_with_ticket(addr: &str, room: &str, ticket: &str) -> serde_json::Value {
    use futures_util::SinkExt;
    let (mut ws, _) = tokio_tungstenite::connect_async(format!("ws://{addr}/v1/ws?room={room}"))
        .await
        .unwrap();
    let join = json!({"type": "join", "ticket": ticket});
    ws.send(tokio_tungstenite::tungstenite::Message::text(
        join.to_string(),
    ))
    .await
    .unwrap();
    tokio::time::timeout(LIMIT, crate::cluster_support::next_frame(&mut ws))
        .await
        .expect("an answer to the join")
        .unwrap()
}

/// Tickets are kept with the rooms: one minted before a kill -9 is
/// redeemable after the restart, once; one redeemed before it stays used.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tickets_survive_a_kill_and_stay_single_use() {
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
        r#"{"id": "vip", "options": {"access": "ticket"}}"#,
    );
    assert!(created.starts_with("HTTP/1.1 201"), "{created}");
    let mint = |name: &str| {
        let reply = crate::support::http_post(
            &addr,
            "/v1/rooms/vip/tickets",
            &json!({ "name": name }).to_string(),
        );
        assert!(reply.starts_with("HTTP/1.1 201"), "{reply}");
        let body = reply.split("\r\n\r\n").nth(1).unwrap();
        let v: serde_json::Value = serde_json::from_str(body).unwrap();
        v["ticket"].as_str().unwrap().to_owned()
    };
    let (spent, kept) = (mint("ann"), mint("bob"));
    let joined = join_with_ticket(&addr, "vip", &spent).await;
    assert_eq!(joined["type"], "joined", "{joined}");

    node.kill().unwrap();
    node.wait().unwrap();
    let mut node = serve(port, dir.path()).await;

    let joined = join_with_ticket(&addr, "vip", &kept).await;
    assert_eq!(joined["type"], "joined", "{joined}");
    let me = joined["members"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["session"] == joined["session"])
        .cloned();
    assert_eq!(me.unwrap()["name"], "bob", "the ticket's grant: {joined}");
    let again = join_with_ticket(&addr, "vip", &kept).await;
    assert_eq!(again["code"], "ticket_used", "{again}");
    let spent_again = join_with_ticket(&addr, "vip", &spent).await;
    assert_eq!(spent_again["code"], "ticket_used", "{spent_again}");
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
    assert_eq!(out.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("--data-dir is for embedded mode"),
        "{out:?}"
    );
}

/// Publishes `id` on `ws` and returns the answer: `ack` or `error`.
async fn publish_once(
    ws: &mut crate::cluster_support::Ws,
    id: &str,
    data: &serde_json::Value,
) -> serde_json::Value {
    use futures_util::{SinkExt, StreamExt};
    let frame = json!({"type": "publish", "room": "full", "event": "m", "id": id, "data": data});
    ws.send(tokio_tungstenite::tungstenite::Message::text(
        frame.to_string(),
    ))
    .await
    .unwrap();
    loop {
        let msg = tokio::time::timeout(Duration::from_secs(20), ws.next())
            .await
            .expect("an answer")
            .expect("open")
            .expect("a frame");
        if let tokio_tungstenite::tungstenite::Message::Text(t) = msg {
            let v: serde_json::Value = serde_json::from_str(&t).unwrap();
            if v["type"] == "ack" || v["type"] == "error" {
                return v;
            }
        }
    }
}

/// A full disk (the process's file size limit, RLIMIT_FSIZE): commands that
/// need the store are refused with `broker_unavailable`, nothing is
/// corrupted, the node takes commands again once space returns, and after a
/// kill -9 every acknowledged message is there once, in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_disk_refuses_then_recovers_and_loses_nothing_acknowledged() {
    use futures_util::{SinkExt, StreamExt};
    use std::os::unix::process::CommandExt;
    let dir = tempfile::Builder::new()
        .prefix("plaza-full-")
        .tempdir()
        .unwrap();
    let port = free_port();
    let addr = format!("127.0.0.1:{port}");
    let limit: libc::rlim_t = 2 * 1024 * 1024;
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_plaza"));
    cmd.args(["serve", "--listen", &addr, "--data-dir"])
        .arg(dir.path())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    // SAFETY: only async-signal-safe calls between fork and exec.
    unsafe {
        cmd.pre_exec(move || {
            let r = libc::rlimit {
                rlim_cur: limit,
                rlim_max: libc::RLIM_INFINITY,
            };
            libc::setrlimit(libc::RLIMIT_FSIZE, &r);
            // Writes past the limit fail (EFBIG) instead of killing the process.
            libc::signal(libc::SIGXFSZ, libc::SIG_IGN);
            Ok(())
        });
    }
    let mut node = cmd.spawn().unwrap();
    for _ in 0..200 {
        if std::net::TcpStream::connect(&addr).is_ok() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let created = crate::support::http_post(&addr, "/v1/rooms", r#"{"id": "full"}"#);
    assert!(created.starts_with("HTTP/1.1 201"), "{created}");
    let (mut ws, _) = tokio_tungstenite::connect_async(format!("ws://{addr}/v1/ws"))
        .await
        .unwrap();
    let join = json!({"type": "join", "room": "full", "name": "w"});
    ws.send(tokio_tungstenite::tungstenite::Message::text(
        join.to_string(),
    ))
    .await
    .unwrap();
    while let Some(Ok(m)) = ws.next().await {
        if m.to_text().unwrap_or("").contains("\"joined\"") {
            break;
        }
    }
    let data = json!("x".repeat(8 * 1024));
    let mut acked = Vec::new();
    let mut refused = None;
    for i in 0..2000 {
        let id = format!("m{i}");
        let answer = publish_once(&mut ws, &id, &data).await;
        if answer["type"] == "ack" {
            acked.push(id);
        } else {
            refused = Some((id, answer));
            break;
        }
    }
    let (id, answer) = refused.expect("the file size limit is reached");
    assert_eq!(answer["code"], "broker_unavailable", "{answer}");
    // A ticket needs the store too: refused with the same code (HTTP 503),
    // not handed out unwritten.
    let mint = || crate::support::http_post(&addr, "/v1/rooms/full/tickets", r#"{"name": "t"}"#);
    let refused_ticket = mint();
    assert!(
        refused_ticket.starts_with("HTTP/1.1 503") && refused_ticket.contains("broker_unavailable"),
        "{refused_ticket}"
    );
    // Space returns: the same message is taken once the node has written again.
    let more = libc::rlimit {
        rlim_cur: libc::RLIM_INFINITY,
        rlim_max: libc::RLIM_INFINITY,
    };
    let pid = node.id() as libc::pid_t;
    assert_eq!(
        unsafe { libc::prlimit(pid, libc::RLIMIT_FSIZE, &more, std::ptr::null_mut()) },
        0
    );
    let mut taken = false;
    for _ in 0..50 {
        if publish_once(&mut ws, &id, &data).await["type"] == "ack" {
            taken = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(taken, "the node takes commands again once space returns");
    acked.push(id);
    let ticket = mint();
    assert!(ticket.starts_with("HTTP/1.1 201"), "{ticket}");
    node.kill().unwrap();
    node.wait().unwrap();
    let mut node = serve(port, dir.path()).await;
    let history = crate::support::http_get(&addr, "/v1/rooms/full/history?last=10000");
    let body = &history[history.find("\r\n\r\n").unwrap() + 4..];
    let v: serde_json::Value = serde_json::from_str(body).unwrap();
    let ids: Vec<&str> = v["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["id"].as_str().unwrap())
        .collect();
    let history_len = ids.len();
    assert_eq!(
        history_len,
        acked.len().min(1000),
        "the history holds what was acknowledged"
    );
    let want: Vec<&str> = acked.iter().map(String::as_str).collect();
    assert_eq!(ids, want[want.len() - history_len..], "once each, in order");
    node.kill().unwrap();
    node.wait().unwrap();
}

/// A torn tail (the write-ahead log cut short, as a crash in the middle of
/// a write leaves it): the node starts, and the room holds the messages up
/// to the last whole commit, in order, none twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_torn_tail_recovers_to_the_last_whole_commit() {
    let dir = tempfile::Builder::new()
        .prefix("plaza-torn-")
        .tempdir()
        .unwrap();
    let port = free_port();
    let addr = format!("127.0.0.1:{port}");
    let mut node = serve(port, dir.path()).await;
    let created = crate::support::http_post(&addr, "/v1/rooms", r#"{"id": "torn"}"#);
    assert!(created.starts_with("HTTP/1.1 201"), "{created}");
    let url = format!("ws://{addr}/v1/ws?room=torn");
    let mut a = Member::join(&url, "torn", "a").await;
    publish_all(&mut a, 30, |_| {}).await;
    node.kill().unwrap();
    node.wait().unwrap();
    let wal = dir.path().join(format!("{}-wal", plaza_broker::STORE_FILE));
    let len = std::fs::metadata(&wal)
        .expect("a write-ahead log after kill -9")
        .len();
    assert!(len > 1000, "{len}");
    let f = std::fs::OpenOptions::new().write(true).open(&wal).unwrap();
    f.set_len(len - 700).unwrap();
    drop(f);
    let mut node = serve(port, dir.path()).await;
    let history = crate::support::http_get(&addr, "/v1/rooms/torn/history?last=10000");
    assert!(history.starts_with("HTTP/1.1 200"), "{history}");
    let body = &history[history.find("\r\n\r\n").unwrap() + 4..];
    let v: serde_json::Value = serde_json::from_str(body).unwrap();
    let ids: Vec<String> = v["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["id"].as_str().unwrap().to_owned())
        .collect();
    let want: Vec<String> = (0..ids.len()).map(|i| format!("a-{i}")).collect();
    assert_eq!(ids, want, "a prefix of what was published, in order");
    assert!(
        ids.len() >= 20,
        "only the cut commits are gone: {}",
        ids.len()
    );
    node.kill().unwrap();
    node.wait().unwrap();
}

#[test]
fn a_corrupt_store_stops_serve_naming_the_file() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join(plaza_broker::STORE_FILE), vec![0x5a; 8192]).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_plaza"))
        .args(["serve", "--listen", "127.0.0.1:0", "--data-dir"])
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(!out.status.success());
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(said.contains(plaza_broker::STORE_FILE), "{said}");
}

/// Webhook events are queued in the data directory: those a receiver that
/// was down never got are delivered after a kill -9 and a restart, every
/// one, in order per room.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queued_webhooks_survive_a_kill() {
    use std::collections::{BTreeMap, BTreeSet};
    use std::sync::{Arc, Mutex};
    // The receiver's port, closed while the events are made.
    let hook_port = free_port();
    let dir = tempfile::Builder::new()
        .prefix("plaza-data-")
        .tempdir()
        .unwrap();
    let config = dir.path().join("plaza.toml");
    std::fs::write(
        &config,
        format!(
            "[[webhooks]]\nname = \"backend\"\nurl = \"http://127.0.0.1:{hook_port}/hook\"\n\
             secret = \"whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw\"\n\
             events = [\"message.published\"]\nchannels = [\"*\"]\n"
        ),
    )
    .unwrap();
    let data = dir.path().join("data");
    let config = config.display().to_string();
    let port = free_port();
    let addr = format!("127.0.0.1:{port}");
    let mut node = serve_with(port, &data, &["--config", &config]).await;
    let rooms = ["r1", "r2"];
    for room in rooms {
        let created =
            crate::support::http_post(&addr, "/v1/rooms", &json!({ "id": room }).to_string());
        assert!(created.starts_with("HTTP/1.1 201"), "{created}");
    }
    const EACH: u64 = 30;
    for i in 0..EACH {
        for room in rooms {
            let path = format!("/v1/rooms/{room}/publish");
            let reply = crate::support::http_post(
                &addr,
                &path,
                &json!({"event": "m", "data": i}).to_string(),
            );
            assert!(reply.starts_with("HTTP/1.1 200"), "{reply}");
        }
    }
    node.kill().unwrap();
    node.wait().unwrap();

    // Each (room, seq) the first time it arrives, in arrival order.
    type Firsts = Arc<Mutex<(BTreeSet<(String, u64)>, BTreeMap<String, Vec<u64>>)>>;
    let firsts: Firsts = Arc::default();
    let (count_tx, mut count) = tokio::sync::watch::channel(0usize);
    let app = axum::Router::new().route(
        "/hook",
        axum::routing::post({
            let firsts = firsts.clone();
            move |body: axum::body::Bytes| {
                let (firsts, count_tx) = (firsts.clone(), count_tx.clone());
                async move {
                    let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
                    let room = v["data"]["room"].as_str().unwrap().to_owned();
                    let seq = v["data"]["seq"].as_u64().unwrap();
                    let mut f = firsts.lock().unwrap();
                    if f.0.insert((room.clone(), seq)) {
                        f.1.entry(room).or_default().push(seq);
                        count_tx.send_replace(f.0.len());
                    }
                    axum::http::StatusCode::NO_CONTENT
                }
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", hook_port))
        .await
        .unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });

    let mut node = serve_with(port, &data, &["--config", &config]).await;
    let all = rooms.len() * EACH as usize;
    let arrived = tokio::time::timeout(LIMIT, count.wait_for(|n| *n >= all)).await;
    let f = firsts.lock().unwrap();
    assert!(arrived.is_ok(), "{} of {all} events: {:?}", f.0.len(), f.1);
    for room in rooms {
        let seqs = &f.1[room];
        assert_eq!(seqs.len() as u64, EACH, "{room}: {seqs:?}");
        assert!(
            seqs.windows(2).all(|w| w[0] < w[1]),
            "{room} out of order: {seqs:?}"
        );
    }
    drop(f);
    node.kill().unwrap();
    node.wait().unwrap();
}
