//! Limits: frame size, rooms per connection, room size, rate limit, slow
//! consumers. Each refusal has its code; nobody else is affected.

use crate::support::{wait_until, Client, Closed, TestServer};
use futures_util::SinkExt;
use plaza_server::ServerConfig;
use serde_json::{json, Value};
use tokio_tungstenite::tungstenite::Message;

const ROOM: &str = "lim";

async fn pair(s: &TestServer) -> ((Client, Value), (Client, Value)) {
    s.create_room(json!({"id": ROOM})).await;
    let mut c = s.join_all(ROOM, &["ann", "bob"]).await;
    let b = c.pop().unwrap();
    let a = c.pop().unwrap();
    (a, b)
}

/// A publish frame of exactly `len` bytes.
fn publish_of_len(len: usize) -> String {
    let head = format!(r#"{{"type":"publish","room":"{ROOM}","event":"big","data":""#);
    let tail = r#""}"#;
    let pad = len - head.len() - tail.len();
    let s = format!("{head}{}{tail}", "x".repeat(pad));
    assert_eq!(s.len(), len);
    s
}

#[tokio::test]
async fn frames_over_max_frame_bytes_are_refused() {
    let s = TestServer::with_config(ServerConfig {
        max_frame_bytes: 1024,
        ..Default::default()
    })
    .await;
    let ((mut a, _), (mut b, _)) = pair(&s).await;

    // At the limit: fine.
    a.send_raw(&publish_of_len(1024)).await;
    let ack = a.recv_type("ack").await;
    assert_eq!(b.recv_type("event").await["seq"], ack["seq"]);

    // Above it (and up to 4×): refused with an error, the connection stays.
    for len in [1025, 3000, 4096] {
        a.send_raw(&publish_of_len(len)).await;
        let e = a.recv_type("error").await;
        assert_eq!(e["code"], "frame_too_large", "{len}: {e}");
        assert!(e["message"].as_str().unwrap().contains(&len.to_string()));
        a.assert_alive().await;
    }
    assert_eq!(b.drain().await, Vec::<Value>::new());
    let (ack, _) = a.publish(ROOM, "chat", json!(1)).await;
    assert_eq!(b.recv_type("event").await["seq"], ack["seq"]);
    assert!(
        s.metric(r#"plaza_errors_total{code="frame_too_large"}"#)
            .await
            >= Some(3.0)
    );
}

#[tokio::test]
async fn frames_over_four_times_the_limit_close_the_connection() {
    let s = TestServer::with_config(ServerConfig {
        max_frame_bytes: 1024,
        ..Default::default()
    })
    .await;
    let ((mut a, ja), (mut b, _)) = pair(&s).await;
    a.send_raw(&publish_of_len(4097)).await;
    assert_eq!(a.closed().await, Closed::Code(1009));
    let (ev, _) = b.recv_event("presence.leave").await;
    assert_eq!(ev["session"], ja["session"]);
    assert_eq!(ev["reason"], "disconnected");
    b.assert_alive().await;
    let (mut c, _) = s.join(ROOM, "cid").await;
    let (ack, _) = c.publish(ROOM, "chat", json!(1)).await;
    let (ev, _) = b.recv_event("message").await;
    assert_eq!(ev["seq"], ack["seq"]);
}

#[tokio::test]
async fn a_connection_joins_a_limited_number_of_rooms() {
    let s = TestServer::with_config(ServerConfig {
        max_rooms_per_connection: 2,
        ..Default::default()
    })
    .await;
    for id in ["r1", "r2", "r3"] {
        s.create_room(json!({"id": id})).await;
    }
    let mut c = s.connect().await;
    for id in ["r1", "r2"] {
        c.send(json!({"type": "join", "room": id, "name": "ann"}))
            .await;
        assert_eq!(c.recv_type("joined").await["room"], id);
    }
    c.send(json!({"type": "join", "room": "r3", "name": "ann"}))
        .await;
    let e = c.recv_type("error").await;
    assert_eq!(e["code"], "too_many_rooms", "{e}");
    assert_eq!(e["ref"], json!({"frame": "join", "room": "r3"}));
    c.assert_alive().await;
    s.wait_members("r3", 0).await;

    // Leaving one makes room for another; the joined rooms still work.
    c.send(json!({"type": "leave", "room": "r1"})).await;
    assert_eq!(
        c.recv_type("left").await,
        json!({"type": "left", "room": "r1"})
    );
    c.send(json!({"type": "join", "room": "r3", "name": "ann"}))
        .await;
    assert_eq!(c.recv_type("joined").await["room"], "r3");
    for id in ["r2", "r3"] {
        let (ack, _) = c.publish(id, "chat", json!(1)).await;
        assert_eq!(ack["room"], id);
    }
}

#[tokio::test]
async fn a_full_room_refuses_members() {
    let s = TestServer::start().await;
    let summary = s
        .create_room(json!({"id": ROOM, "options": {"max_members": 2}}))
        .await;
    assert_eq!(summary["max_members"], 2);
    let mut c = s.join_all(ROOM, &["ann", "bob"]).await;
    let (mut b, _) = c.pop().unwrap();
    let (mut a, _) = c.pop().unwrap();

    let (mut x, e) = s
        .join_with(json!({"type": "join", "room": ROOM, "name": "xan"}))
        .await;
    assert_eq!(e["type"], "error", "{e}");
    assert_eq!(e["code"], "room_full");
    assert_eq!(e["ref"], json!({"frame": "join", "room": ROOM}));
    assert_eq!(
        b.drain().await,
        Vec::<Value>::new(),
        "no presence for a refused join"
    );

    // Once a member leaves there is a place again.
    a.send(json!({"type": "leave", "room": ROOM})).await;
    a.recv_type("left").await;
    x.send(json!({"type": "join", "room": ROOM, "name": "xan"}))
        .await;
    let j = x.recv_type("joined").await;
    assert_eq!(j["members"].as_array().unwrap().len(), 2, "{j}");
    b.recv_event("presence.join").await;
}

#[tokio::test]
async fn frames_above_the_rate_limit_are_dropped_with_an_error() {
    let s = TestServer::with_config(ServerConfig {
        rate_limit_per_sec: 20,
        rate_limit_burst: 5,
        ..Default::default()
    })
    .await;
    s.create_room(json!({"id": ROOM})).await;
    let (mut b, _) = s.join(ROOM, "bob").await;
    let mut a = s.connect().await;

    // 30 pings back to back: the burst passes, then frames are dropped.
    const N: u64 = 30;
    for i in 0..N {
        a.send(json!({"type": "ping", "ts": i})).await;
    }
    let mut pongs = Vec::new();
    let mut limited = 0;
    for _ in 0..N {
        let v = a.recv().await;
        match v["type"].as_str() {
            Some("pong") => pongs.push(v["ts"].as_f64().unwrap() as u64),
            Some("error") => {
                assert_eq!(v["code"], "rate_limited", "{v}");
                assert!(v.get("ref").is_none());
                limited += 1;
            }
            _ => panic!("unexpected {v}"),
        }
    }
    assert!(limited > 0, "nothing was rate limited");
    assert_eq!(pongs.len() as u64 + limited, N);
    assert_eq!(
        pongs[..5],
        [0, 1, 2, 3, 4],
        "the burst goes through in order"
    );
    assert!(pongs.windows(2).all(|w| w[0] < w[1]));

    // Tokens come back with time: poll until a frame passes again.
    let start = std::time::Instant::now();
    let mut ts = 100;
    loop {
        ts += 1;
        a.send(json!({"type": "ping", "ts": ts})).await;
        let v = a.recv().await;
        if v["type"] == "pong" {
            assert_eq!(v["ts"], ts as f64);
            break;
        }
        assert_eq!(v["code"], "rate_limited", "{v}");
        assert!(
            start.elapsed() < crate::support::WAIT,
            "the rate limit never let a frame through again"
        );
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }

    // The limit is per connection: B was never limited.
    for i in 0..5 {
        let (ack, _) = b.publish(ROOM, "chat", json!(i)).await;
        assert_eq!(ack["type"], "ack");
    }
    assert!(s.metric(r#"plaza_errors_total{code="rate_limited"}"#).await >= Some(limited as f64));
}

#[tokio::test]
async fn a_client_that_does_not_read_is_closed_as_slow_consumer() {
    let s = TestServer::with_config(ServerConfig {
        send_queue_frames: 8,
        rate_limit_per_sec: 1_000_000,
        rate_limit_burst: 1_000_000,
        ..Default::default()
    })
    .await;
    s.create_room(json!({"id": ROOM})).await;
    s.create_room(json!({"id": "calm"})).await;
    let mut c = s.join_all(ROOM, &["flood", "slow"]).await;
    let (mut slow, jslow) = c.pop().unwrap();
    let (mut flood, _) = c.pop().unwrap();
    let mut calm = s.join_all("calm", &["x", "y"]).await;

    // The flooder publishes (reading its acks) until the server reports the
    // slow member gone; the slow client reads nothing meanwhile.
    let data = "x".repeat(32 * 1024);
    let mut gone = false;
    for _ in 0..20_000 {
        let (_, before) = flood.publish(ROOM, "blob", json!(data)).await;
        if before
            .iter()
            .any(|v| v["kind"] == "presence.leave" && v["session"] == jslow["session"])
        {
            gone = true;
            break;
        }
    }
    assert!(gone, "the slow consumer was never dropped");

    // The slow client finds the close code at the end of what it was sent.
    assert_eq!(slow.closed().await, Closed::Code(4002));

    // Everyone else goes on.
    let (ack, before) = flood.publish(ROOM, "chat", json!("after")).await;
    assert!(before.is_empty(), "{before:?}");
    assert_eq!(ack["type"], "ack");
    let after = ack["seq"].as_u64().unwrap();

    // The slow client resumes on a new connection and catches up: every
    // event after its last seq, in order, up to the last message.
    let mut back = s.connect().await;
    back.send(json!({"type": "join", "room": ROOM, "name": "slow",
        "resume": {"token": jslow["resume_token"], "last_seq": jslow["seq"]}}))
        .await;
    let r = back.recv().await;
    assert_eq!(
        (&r["type"], &r["resumed"]),
        (&json!("joined"), &json!(true)),
        "{r}"
    );
    assert_eq!(r["session"], jslow["session"]);
    let (last, missed) = back.recv_until(|v| v["seq"].as_u64() == Some(after)).await;
    let mut seqs: Vec<u64> = missed.iter().filter_map(|v| v["seq"].as_u64()).collect();
    seqs.push(last["seq"].as_u64().unwrap());
    assert!(seqs.windows(2).all(|w| w[0] < w[1]), "{seqs:?}");
    assert!(seqs[0] > jslow["seq"].as_u64().unwrap(), "{seqs:?}");
    let (mut y, _) = calm.pop().unwrap();
    let (mut x, _) = calm.pop().unwrap();
    let (ack, _) = x.publish("calm", "chat", json!(1)).await;
    assert_eq!(y.recv_type("event").await["seq"], ack["seq"]);
    s.wait_members(ROOM, 2).await;
    assert!(
        wait_until(|| async { s.metric("plaza_slow_consumers_total").await >= Some(1.0) }).await
    );
}

#[tokio::test]
async fn a_client_that_ignores_the_rate_limit_is_closed_with_4003() {
    let s = TestServer::with_config(ServerConfig {
        rate_limit_per_sec: 1,
        rate_limit_burst: 5,
        ..Default::default()
    })
    .await;
    let (mut other, _) = {
        s.create_room(json!({"id": ROOM})).await;
        s.join(ROOM, "bob").await
    };
    let mut a = s.connect().await;
    // burst 5, then 10 × burst (at least 100) refusals in a row are tolerated
    for i in 0..200 {
        // the server may close mid-way: later sends are allowed to fail
        let ping = json!({"type": "ping", "ts": i}).to_string();
        if a.ws.send(Message::text(ping)).await.is_err() {
            break;
        }
    }
    assert_eq!(a.closed().await, Closed::Code(4003));
    // nobody else is affected
    assert_eq!(other.drain().await, Vec::<Value>::new());
}

/// The status and JSON body of a WebSocket upgrade the server answered
/// without upgrading.
fn refusal(e: tokio_tungstenite::tungstenite::Error) -> (u16, Value) {
    match e {
        tokio_tungstenite::tungstenite::Error::Http(resp) => {
            let body = resp.body().clone().unwrap_or_default();
            (
                resp.status().as_u16(),
                serde_json::from_slice(&body).unwrap_or(Value::Null),
            )
        }
        other => panic!("expected an HTTP answer, got {other}"),
    }
}

#[tokio::test]
async fn beyond_max_connections_a_new_connection_gets_503_server_full_and_the_held_ones_go_on() {
    let s = TestServer::with_config(ServerConfig {
        max_connections: 3,
        ..Default::default()
    })
    .await;
    // The test's HTTP client keeps its connection open: one of the three.
    let ((mut a, _), (mut b, _)) = pair(&s).await;

    let refused = Client::try_connect(s.addr)
        .await
        .err()
        .expect("the node is full");
    let (status, body) = refusal(refused);
    assert_eq!(status, 503);
    assert_eq!(body["error"]["code"], "server_full", "{body}");
    // A plain HTTP request is refused the same way, whole, then closed.
    let mut raw = tokio::net::TcpStream::connect(s.addr).await.unwrap();
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    raw.write_all(b"GET /v1/rooms HTTP/1.1\r\nhost: x\r\n\r\n")
        .await
        .unwrap();
    let mut answer = String::new();
    raw.read_to_string(&mut answer).await.unwrap();
    assert!(answer.starts_with("HTTP/1.1 503 "), "{answer}");
    assert!(answer.contains("retry-after: 5"), "{answer}");
    assert!(
        answer.contains(&format!("x-plaza-node: {}", s.node.config().node_id)),
        "{answer}"
    );
    assert!(answer.ends_with("}"), "the JSON body is whole: {answer}");

    // The members it holds are not touched.
    let (ack, _) = a.publish(ROOM, "still", json!({"n": 1})).await;
    assert_eq!(ack["type"], "ack");
    let (ev, _) = b.recv_event("message").await;
    assert_eq!(
        (&ev["event"], &ev["data"]["n"]),
        (&json!("still"), &json!(1))
    );
    assert_eq!(s.metric("plaza_connections_refused_total").await, Some(2.0));
    // A full node can still be watched: /metrics and /healthz are answered (and closed),
    // here from new connections.
    for path in ["/metrics", "/healthz", "/readyz?full=1"] {
        let mut raw = tokio::net::TcpStream::connect(s.addr).await.unwrap();
        raw.write_all(format!("GET {path} HTTP/1.1\r\nhost: x\r\n\r\n").as_bytes())
            .await
            .unwrap();
        let mut answer = String::new();
        raw.read_to_string(&mut answer).await.unwrap();
        assert!(answer.starts_with("HTTP/1.1 200 "), "{path}: {answer}");
        if path == "/metrics" {
            assert!(
                answer.contains("plaza_connections_refused_total 2"),
                "{answer}"
            );
        }
        if path.starts_with("/readyz") {
            // A balancer must not take a full node out: it serves what it holds.
            assert!(answer.contains(r#""full":true"#), "{answer}");
            assert!(answer.contains(r#""ready":true"#), "{answer}");
        }
        assert!(!answer.contains("retry-after"), "{answer}");
    }

    // A connection that ends gives its place back.
    drop(b);
    assert!(
        wait_until(|| async { Client::try_connect(s.addr).await.is_ok() }).await,
        "a place came free"
    );
}

#[tokio::test]
async fn only_allowed_origins_open_websockets_and_transport_sessions() {
    let s = TestServer::with_config(ServerConfig {
        allowed_origins: vec!["https://app.example.org".into()],
        ..Default::default()
    })
    .await;
    s.create_room(json!({"id": ROOM})).await;
    let ws = |origin: Option<&'static str>| {
        let addr = s.addr;
        async move {
            use tokio_tungstenite::tungstenite::client::IntoClientRequest;
            let mut req = format!("ws://{addr}/v1/ws").into_client_request().unwrap();
            if let Some(o) = origin {
                req.headers_mut().insert("origin", o.parse().unwrap());
            }
            tokio_tungstenite::connect_async(req).await
        }
    };
    // A page of another site is refused, with the documented JSON error.
    let (status, body) = refusal(ws(Some("https://evil.example")).await.expect_err("refused"));
    assert_eq!(status, 403);
    assert_eq!(body["error"]["code"], "origin_not_allowed", "{body}");
    // The app's page and clients that are no web page get in.
    assert!(ws(Some("https://app.example.org")).await.is_ok());
    assert!(ws(None).await.is_ok());
    // The same for the HTTP transports.
    let open = |origin: &'static str| {
        s.http
            .post(s.url("/v1/sessions"))
            .header("origin", origin)
            .send()
    };
    let r = open("https://evil.example").await.unwrap();
    assert_eq!(r.status(), 403);
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["error"]["code"], "origin_not_allowed");
    assert_eq!(open("https://app.example.org").await.unwrap().status(), 201);
}

/// One `GET path` with `Connection: close` from local address `from`: the whole answer.
async fn get_from(s: &TestServer, from: &str, path: &str) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.bind(format!("{from}:0").parse().unwrap()).unwrap();
    let mut tcp = socket.connect(s.addr).await.unwrap();
    tcp.write_all(
        format!("GET {path} HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n").as_bytes(),
    )
    .await
    .unwrap();
    let mut out = String::new();
    tcp.read_to_string(&mut out).await.unwrap();
    out
}

#[tokio::test]
async fn one_address_holds_at_most_max_connections_per_ip_and_others_are_not_affected() {
    let s = TestServer::with_config(ServerConfig {
        max_connections_per_ip: 3,
        ..Default::default()
    })
    .await;
    // 127.0.0.1 holds three: the test's HTTP client and two members.
    let ((mut a, _), (b, _)) = pair(&s).await;
    let refused = get_from(&s, "127.0.0.1", "/v1/rooms").await;
    assert!(refused.starts_with("HTTP/1.1 429 "), "{refused}");
    assert!(
        refused.contains(r#""code":"too_many_connections""#),
        "{refused}"
    );
    // Another address is not affected, nor are the members held.
    let other = get_from(&s, "127.0.0.2", "/v1/rooms").await;
    assert!(other.starts_with("HTTP/1.1 200 "), "{other}");
    let (ack, _) = a.publish(ROOM, "still", json!(1)).await;
    assert_eq!(ack["type"], "ack");
    // A connection that ends gives its address's place back.
    drop(b);
    assert!(
        wait_until(|| async {
            get_from(&s, "127.0.0.1", "/healthz")
                .await
                .starts_with("HTTP/1.1 200 ")
                && get_from(&s, "127.0.0.1", "/v1/rooms")
                    .await
                    .starts_with("HTTP/1.1 200 ")
        })
        .await
    );
}

/// A WebSocket to `s` from local address `from`.
async fn ws_from(
    s: &TestServer,
    from: &str,
) -> tokio_tungstenite::WebSocketStream<tokio::net::TcpStream> {
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.bind(format!("{from}:0").parse().unwrap()).unwrap();
    let tcp = socket.connect(s.addr).await.unwrap();
    tokio_tungstenite::client_async(format!("ws://{}/v1/ws", s.addr), tcp)
        .await
        .unwrap()
        .0
}

/// Sends a join of `room` on `ws` and returns the answer (`joined` or `error`).
async fn join_on(
    ws: &mut tokio_tungstenite::WebSocketStream<tokio::net::TcpStream>,
    room: &str,
    name: &str,
) -> Value {
    use futures_util::StreamExt;
    ws.send(Message::text(
        json!({"type": "join", "room": room, "name": name}).to_string(),
    ))
    .await
    .unwrap();
    loop {
        if let Message::Text(t) = ws.next().await.unwrap().unwrap() {
            let v: Value = serde_json::from_str(&t).unwrap();
            if v["type"] == "joined" || v["type"] == "error" {
                return v;
            }
        }
    }
}

#[tokio::test]
async fn one_address_joins_at_most_max_joins_per_ip_per_sec() {
    // One a second: what follows takes milliseconds, well inside the second.
    let s = TestServer::with_config(ServerConfig {
        max_joins_per_ip_per_sec: 1,
        ..Default::default()
    })
    .await;
    for r in ["j1", "j3"] {
        s.create_room(json!({"id": r})).await;
    }
    let mut a = ws_from(&s, "127.0.0.1").await;
    assert_eq!(join_on(&mut a, "j1", "ann").await["type"], "joined");
    // The next join within the second, from the same address (another connection too).
    let mut b = ws_from(&s, "127.0.0.1").await;
    let refused = join_on(&mut b, "j3", "bob").await;
    assert_eq!(refused["code"], "rate_limited", "{refused}");
    assert_eq!(refused["ref"], json!({"frame": "join", "room": "j3"}));
    // And over an HTTP transport from that address.
    let (status, opened) = s.post("/v1/sessions", &json!({})).await;
    assert_eq!(status, 201);
    let id = opened["session"].as_str().unwrap();
    let (status, _) = s
        .post(
            &format!("/v1/sessions/{id}/send"),
            &json!({"type": "join", "room": "j3", "name": "cat"}),
        )
        .await;
    assert_eq!(status, 202);
    let (_, polled) = s.get(&format!("/v1/sessions/{id}/poll?ack=0")).await;
    assert_eq!(polled["frames"][0]["code"], "rate_limited", "{polled}");
    // Another address is not affected.
    let mut c = ws_from(&s, "127.0.0.2").await;
    assert_eq!(join_on(&mut c, "j3", "cat").await["type"], "joined");
}

/// Issue 44, item 5: in a busy room exactly the members that stopped reading
/// are closed as slow consumers (4002), and every member that reads gets every
/// message. Nothing here depends on how fast anything runs: the next message
/// is published only once every reader has the last one, so a reader is never
/// more than one frame behind however the machine schedules it, while a
/// stalled member (a small receive buffer, never read) falls further behind
/// with every message until its send queue is full.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exactly_the_stalled_members_are_closed_as_slow_consumers_and_the_readers_get_everything() {
    const READERS: usize = 6;
    const STALLED: usize = 3;
    let s = TestServer::with_config(ServerConfig {
        send_queue_frames: 16,
        rate_limit_per_sec: 1_000_000,
        rate_limit_burst: 1_000_000,
        // However long a busy machine takes, a stalled member must end as a
        // slow consumer, not as silent (it answers no pings).
        heartbeat_interval_ms: 3_600_000,
        idle_timeout_ms: 7_200_000,
        ..Default::default()
    })
    .await;
    s.create_room(json!({"id": ROOM})).await;
    let mut stalled = Vec::new();
    for i in 0..STALLED {
        let mut c = Client::connect_with_receive_buffer(s.addr, 4096).await;
        c.send(json!({"type": "join", "room": ROOM, "name": format!("stalled{i}")}))
            .await;
        let joined = c.recv_type("joined").await;
        stalled.push((c, joined["session"].clone()));
    }
    let names: Vec<String> = (0..READERS).map(|i| format!("reader{i}")).collect();
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    let mut readers = s.join_all(ROOM, &names).await;
    let (mut publisher, _) = readers.pop().unwrap();
    let reader_sessions: Vec<Value> = readers.iter().map(|(_, j)| j["session"].clone()).collect();
    let stalled_sessions: Vec<Value> = stalled.iter().map(|(_, s)| s.clone()).collect();

    // Large messages, so that the stalled members' kernel buffers hold few.
    let data = "x".repeat(16 * 1024);
    let mut published = Vec::new();
    let mut left = Vec::new();
    let mut received = vec![Vec::new(); readers.len()];
    let mut all_left = false;
    for _ in 0..20_000 {
        let (ack, before) = publisher.publish(ROOM, "blob", json!(data)).await;
        assert_eq!(ack["type"], "ack", "{ack}");
        let seq = ack["seq"].as_u64().unwrap();
        published.push(seq);
        for v in &before {
            if v["kind"] == "presence.leave" {
                left.push(v["session"].clone());
            }
        }
        for ((reader, _), got) in readers.iter_mut().zip(&mut received) {
            let (last, before) = reader
                .recv_until(|v| v["type"] == "event" && v["seq"].as_u64() == Some(seq))
                .await;
            got.extend(
                before
                    .iter()
                    .chain([&last])
                    .filter(|v| v["event"] == "blob")
                    .map(|v| v["seq"].as_u64().unwrap()),
            );
        }
        if left.len() >= STALLED {
            all_left = true;
            break;
        }
    }
    assert!(
        all_left,
        "after {} messages only {left:?} of the stalled members were closed",
        published.len()
    );
    left.sort_by_key(|v| v.to_string());
    let mut expected_left = stalled_sessions.clone();
    expected_left.sort_by_key(|v| v.to_string());
    assert_eq!(left, expected_left, "only the stalled members left");
    for (got, session) in received.iter().zip(&reader_sessions) {
        assert_eq!(
            got, &published,
            "reader {session} got every message, in order"
        );
    }

    // Each stalled member, reading at last, finds 4002 after what it was sent.
    for (mut c, session) in stalled {
        assert_eq!(c.closed().await, Closed::Code(4002), "stalled {session}");
    }
    assert!(
        wait_until(|| async {
            s.metric("plaza_slow_consumers_total").await == Some(STALLED as f64)
        })
        .await,
        "{:?}",
        s.metric("plaza_slow_consumers_total").await
    );
    // The readers are all still members and still served.
    let (ack, before) = publisher.publish(ROOM, "blob", json!("after")).await;
    assert!(before.is_empty(), "{before:?}");
    for (reader, _) in readers.iter_mut() {
        assert_eq!(reader.recv_type("event").await["seq"], ack["seq"]);
    }
    s.wait_members(ROOM, READERS as u64).await;
}
