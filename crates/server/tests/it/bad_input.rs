//! Bad input: every refusal carries its stable code, and the connection (and
//! everyone else in the room) carries on.

use crate::support::{Client, Closed, TestServer};
use serde_json::{json, Value};

const ROOM: &str = "bad";

async fn setup(s: &TestServer) -> ((Client, Value), (Client, Value)) {
    s.create_room(json!({"id": ROOM})).await;
    s.create_room(json!({"id": "other"})).await;
    let mut c = s.join_all(ROOM, &["ann", "bob"]).await;
    let b = c.pop().unwrap();
    let a = c.pop().unwrap();
    (a, b)
}

/// A and B still talk to each other, and B saw nothing of A's mistakes.
async fn room_still_works(a: &mut Client, b: &mut Client) {
    assert_eq!(b.drain().await, Vec::<Value>::new(), "B saw something");
    let (ack, before) = a.publish(ROOM, "chat", json!("still here")).await;
    assert!(before.is_empty(), "{before:?}");
    let ev = b.recv_type("event").await;
    assert_eq!(ev["seq"], ack["seq"]);
    assert_eq!(ev["data"], "still here");
}

#[tokio::test]
async fn malformed_frames_get_their_error_code() {
    let s = TestServer::start().await;
    let ((mut a, _), (mut b, _)) = setup(&s).await;
    let cases: &[(&str, &str, Option<&str>)] = &[
        ("{", "bad_json", None),
        ("not json", "bad_json", None),
        ("", "bad_json", None),
        (r#"{"type":"ping"} trailing"#, "bad_json", None),
        // non-object JSON
        ("[1,2]", "bad_json", None),
        (r#"["ping"]"#, "bad_json", None),
        (r#"["leave"]"#, "bad_json", None),
        (r#""ping""#, "bad_json", None),
        ("42", "bad_json", None),
        ("null", "bad_json", None),
        // no or unknown type
        (r#"{"type":7}"#, "bad_json", None),
        (r#"{"type":"ping","type":"ping"}"#, "bad_json", None),
        (r#"{"room":"bad"}"#, "unknown_type", None),
        (r#"{"type":null}"#, "unknown_type", None),
        (r#"{"type":"dance"}"#, "unknown_type", Some("dance")),
        // known type, missing or mistyped fields
        (
            r#"{"type":"publish","room":"bad"}"#,
            "invalid_frame",
            Some("publish"),
        ),
        (
            r#"{"type":"publish","room":"bad","event":5}"#,
            "invalid_frame",
            Some("publish"),
        ),
        (
            r#"{"type":"publish","event":"x"}"#,
            "invalid_frame",
            Some("publish"),
        ),
        (r#"{"type":"leave"}"#, "invalid_frame", Some("leave")),
        (
            r#"{"type":"direct","room":"bad","event":"x"}"#,
            "invalid_frame",
            Some("direct"),
        ),
        (
            r#"{"type":"request","room":"bad","op":"entity.create"}"#,
            "invalid_frame",
            Some("request"),
        ),
        (
            r#"{"type":"request","room":"bad","nonce":null,"op":"x"}"#,
            "invalid_frame",
            Some("request"),
        ),
        (
            r#"{"type":"request","room":"bad","nonce":{},"op":"x"}"#,
            "invalid_frame",
            Some("request"),
        ),
        (
            r#"{"type":"request","room":"bad","nonce":true,"op":"x"}"#,
            "invalid_frame",
            Some("request"),
        ),
        (
            r#"{"type":"ping","ts":"now"}"#,
            "invalid_frame",
            Some("ping"),
        ),
        // null is refused for channel, channels and echo
        (
            r#"{"type":"publish","room":"bad","event":"x","channel":null}"#,
            "invalid_frame",
            Some("publish"),
        ),
        (
            r#"{"type":"publish","room":"bad","event":"x","echo":null}"#,
            "invalid_frame",
            Some("publish"),
        ),
        (
            r#"{"type":"join","room":"bad","name":"x","channels":null}"#,
            "invalid_frame",
            Some("join"),
        ),
        (
            r#"{"type":"join","room":"bad","name":"x","resume":{"token":"t"}}"#,
            "invalid_frame",
            Some("join"),
        ),
    ];
    for (text, code, frame) in cases {
        a.send_raw(text).await;
        let e = a.recv().await;
        assert_eq!(e["type"], "error", "{text:?}: {e}");
        assert_eq!(e["code"], *code, "{text:?}: {e}");
        assert!(!e["message"].as_str().unwrap().is_empty());
        match frame {
            Some(f) => assert_eq!(e["ref"]["frame"], *f, "{text:?}: {e}"),
            None => assert!(e.get("ref").is_none(), "{text:?}: {e}"),
        }
        a.assert_alive().await;
    }
    // Unknown fields are tolerated.
    a.send(json!({"type": "ping", "ts": 5, "future": [1]}))
        .await;
    assert_eq!(a.recv_type("pong").await["ts"], 5.0);
    room_still_works(&mut a, &mut b).await;
    // Errors are counted by code.
    assert!(s.metric(r#"plaza_errors_total{code="bad_json"}"#).await >= Some(12.0));
    assert!(
        s.metric(r#"plaza_errors_total{code="invalid_frame"}"#)
            .await
            >= Some(14.0)
    );
}

#[tokio::test]
async fn bad_joins_get_their_error_code() {
    let s = TestServer::start().await;
    let ((mut a, _), (mut b, _)) = setup(&s).await;
    let long = "n".repeat(65);
    let cases: Vec<(Value, &str, Value)> = vec![
        // already a member
        (
            json!({"type": "join", "room": ROOM, "name": "ann"}),
            "already_joined",
            json!({"frame": "join", "room": ROOM}),
        ),
        (
            json!({"type": "join", "room": "nope", "name": "ann"}),
            "room_not_found",
            json!({"frame": "join", "room": "nope"}),
        ),
        // neither room nor ticket, or no name
        (
            json!({"type": "join"}),
            "invalid_frame",
            json!({"frame": "join"}),
        ),
        (
            json!({"type": "join", "name": "ann"}),
            "invalid_frame",
            json!({"frame": "join"}),
        ),
        (
            json!({"type": "join", "room": "other"}),
            "invalid_frame",
            json!({"frame": "join", "room": "other"}),
        ),
        (
            json!({"type": "join", "room": "other", "name": ""}),
            "invalid_frame",
            json!({"frame": "join", "room": "other"}),
        ),
        (
            json!({"type": "join", "room": "other", "name": long}),
            "invalid_frame",
            json!({"frame": "join", "room": "other"}),
        ),
        (
            json!({"type": "join", "room": "other", "name": "ann", "platform": ""}),
            "invalid_frame",
            json!({"frame": "join", "room": "other"}),
        ),
        (
            json!({"type": "join", "room": "other", "name": "ann", "channels": [""]}),
            "invalid_args",
            json!({"frame": "join", "room": "other"}),
        ),
    ];
    for (frame, code, reference) in cases {
        a.send(frame.clone()).await;
        let e = a.recv_type("error").await;
        assert_eq!(e["code"], code, "{frame}: {e}");
        assert_eq!(e["ref"], reference, "{frame}: {e}");
        a.assert_alive().await;
    }
    // None of that touched A's membership.
    room_still_works(&mut a, &mut b).await;
    s.wait_members(ROOM, 2).await;
    s.wait_members("other", 0).await;
}

#[tokio::test]
async fn acting_in_a_room_not_joined_is_refused() {
    let s = TestServer::start().await;
    let ((mut a, _), (mut b, _)) = setup(&s).await;

    a.send(json!({"type": "publish", "room": "other", "event": "x", "id": "p1"}))
        .await;
    let e = a.recv_type("error").await;
    assert_eq!(e["code"], "not_joined");
    assert_eq!(
        e["ref"],
        json!({"frame": "publish", "room": "other", "id": "p1"})
    );

    let (r, _) = a
        .request("other", json!("q"), "entity.create", json!({}))
        .await;
    assert_eq!(r["ok"], false);
    assert_eq!(r["error"]["code"], "not_joined");

    a.send(json!({"type": "direct", "room": "other", "to": "x", "event": "x"}))
        .await;
    let e = a.recv_type("error").await;
    assert_eq!(e["code"], "not_joined");
    assert_eq!(e["ref"], json!({"frame": "direct", "room": "other"}));

    a.send(json!({"type": "leave", "room": "other"})).await;
    let e = a.recv_type("error").await;
    assert_eq!(e["code"], "not_joined");
    assert_eq!(e["ref"], json!({"frame": "leave", "room": "other"}));

    // A connection that joined nothing at all.
    let mut c = s.connect().await;
    c.send(json!({"type": "publish", "room": ROOM, "event": "x"}))
        .await;
    assert_eq!(c.recv_type("error").await["code"], "not_joined");
    c.assert_alive().await;
    room_still_works(&mut a, &mut b).await;
}

#[tokio::test]
async fn bad_publishes_and_directs_are_refused() {
    let s = TestServer::start().await;
    let ((mut a, _), (mut b, _)) = setup(&s).await;
    let (ack, _) = a.publish(ROOM, "chat", json!(1)).await;
    b.recv_type("event").await;
    let seq = ack["seq"].as_u64().unwrap();

    // reply_to must name an earlier seq
    for reply_to in [seq + 1, seq + 100, 0] {
        a.send(json!({"type": "publish", "room": ROOM, "event": "re", "reply_to": reply_to, "id": "r"}))
            .await;
        let e = a.recv_type("error").await;
        assert_eq!(e["code"], "invalid_frame", "reply_to {reply_to}: {e}");
        assert_eq!(
            e["ref"],
            json!({"frame": "publish", "room": ROOM, "id": "r"})
        );
        a.assert_alive().await;
    }
    // ... an earlier one is fine
    a.send(json!({"type": "publish", "room": ROOM, "event": "re", "reply_to": seq}))
        .await;
    a.recv_type("ack").await;
    assert_eq!(b.recv_type("event").await["reply_to"], seq);

    // channel names have 1 to 64 bytes
    for channel in [String::new(), "c".repeat(65)] {
        a.send(
            json!({"type": "publish", "room": ROOM, "channel": channel, "event": "x", "id": "c"}),
        )
        .await;
        let e = a.recv_type("error").await;
        assert_eq!(e["code"], "invalid_frame", "channel {channel:?}: {e}");
        assert_eq!(
            e["ref"],
            json!({"frame": "publish", "room": ROOM, "id": "c"})
        );
    }

    // direct to a session that is not in the room
    a.send(json!({"type": "direct", "room": ROOM, "to": "nobody", "event": "x"}))
        .await;
    let e = a.recv_type("error").await;
    assert_eq!(e["code"], "session_not_found", "{e}");
    assert_eq!(e["ref"], json!({"frame": "direct", "room": ROOM}));
    a.assert_alive().await;

    // an invalid refused publish id can be used again: it was never ordered
    a.send(json!({"type": "publish", "room": ROOM, "event": "re", "id": "r"}))
        .await;
    let ack = a.recv_type("ack").await;
    assert!(ack.get("duplicate").is_none(), "{ack}");
    assert_eq!(b.recv_type("event").await["id"], "r");
    room_still_works(&mut a, &mut b).await;
}

#[tokio::test]
async fn invalid_utf8_closes_only_that_connection() {
    let s = TestServer::start().await;
    let ((mut a, ja), (mut b, _)) = setup(&s).await;
    let (mut c, _) = s.join(ROOM, "cid").await;
    a.recv_event("presence.join").await;
    b.recv_event("presence.join").await;

    c.send_text_bytes(b"{\"type\":\"ping\",\"x\":\"\xff\xfe\"}")
        .await;
    assert_eq!(c.closed().await, Closed::Code(1007));
    let (ev, _) = b.recv_event("presence.leave").await;
    assert_eq!(ev["reason"], "disconnected");
    assert_ne!(ev["session"], ja["session"]);
    a.recv_event("presence.leave").await;
    room_still_works(&mut a, &mut b).await;
    // and the server takes new connections
    let (mut d, _) = s.join(ROOM, "dee").await;
    d.assert_alive().await;
}

#[tokio::test]
async fn binary_frames_are_read_like_text() {
    let s = TestServer::start().await;
    let ((mut a, _), (mut b, _)) = setup(&s).await;
    let frame = json!({"type": "publish", "room": ROOM, "event": "bin", "data": 1});
    a.send_message(tokio_tungstenite::tungstenite::Message::binary(
        frame.to_string().into_bytes(),
    ))
    .await;
    let ack = a.recv_type("ack").await;
    assert_eq!(b.recv_type("event").await["seq"], ack["seq"]);
    a.send_message(tokio_tungstenite::tungstenite::Message::binary(
        b"\xff\xfe".to_vec(),
    ))
    .await;
    assert_eq!(a.recv_type("error").await["code"], "bad_json");
    // Invalid UTF-8 inside a string of an object is not JSON text either, wherever it is
    // (a payload the server would otherwise pass on unread, a field it reads): bad_json,
    // no ref, nothing published.
    let head = format!(r#"{{"type":"publish","room":"{ROOM}","#);
    for (inside, tail) in [
        (r#""event":"e","data":""#, &b"\xff\"}"[..]),
        (r#""data":1,"event":""#, &b"\xc3\x28\"}"[..]),
    ] {
        let mut bytes = format!("{head}{inside}").into_bytes();
        bytes.extend_from_slice(tail);
        a.send_message(tokio_tungstenite::tungstenite::Message::binary(bytes))
            .await;
        let err = a.recv_type("error").await;
        assert_eq!(err["code"], "bad_json", "{err}");
        assert!(err.get("ref").is_none(), "{err}");
    }
    room_still_works(&mut a, &mut b).await;
}

#[tokio::test]
async fn a_publish_that_fails_to_decode_is_named_by_its_room_and_id() {
    let s = TestServer::start().await;
    let ((mut a, _), (mut b, _)) = setup(&s).await;
    a.send(json!({"type": "publish", "room": ROOM, "event": 5, "data": 1, "id": "m-5"}))
        .await;
    let err = a.recv_type("error").await;
    assert_eq!(err["code"], "invalid_frame");
    assert_eq!(
        err["ref"],
        json!({"frame": "publish", "room": ROOM, "id": "m-5"})
    );
    // Names that are not strings are left out, not guessed.
    a.send(json!({"type": "publish", "room": 7, "event": "e", "id": ["x"]}))
        .await;
    let err = a.recv_type("error").await;
    assert_eq!(err["ref"], json!({"frame": "publish"}), "{err}");
    room_still_works(&mut a, &mut b).await;
}

#[tokio::test]
async fn a_request_to_v1_ws_that_is_no_websocket_upgrade_gets_a_json_error() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let s = TestServer::start().await;
    let ask = |head: &'static str| async move {
        let mut tcp = tokio::net::TcpStream::connect(s.addr).await.unwrap();
        tcp.write_all(head.as_bytes()).await.unwrap();
        let mut out = String::new();
        tcp.read_to_string(&mut out).await.unwrap();
        out
    };
    let plain = ask("GET /v1/ws HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n").await;
    assert!(plain.starts_with("HTTP/1.1 400 "), "{plain}");
    assert!(plain.contains(r#""code":"invalid_request""#), "{plain}");
    let old = ask(
        "GET /v1/ws HTTP/1.1\r\nhost: x\r\nconnection: upgrade, close\r\nupgrade: websocket\r\n\
         sec-websocket-version: 8\r\nsec-websocket-key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n",
    )
    .await;
    assert!(old.starts_with("HTTP/1.1 426 "), "{old}");
    assert!(old.contains("sec-websocket-version: 13"), "{old}");
    assert!(old.contains(r#""code":"invalid_request""#), "{old}");
}
