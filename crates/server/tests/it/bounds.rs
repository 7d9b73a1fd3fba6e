//! Every number a room's creator or a client gives has bounds: one past an
//! edge is refused with `400 invalid_request` (HTTP) or `invalid_args` /
//! `invalid_frame` (frames), the message naming the field and its limits;
//! the edge itself is taken.

use crate::support::TestServer;
use serde_json::{json, Value};

/// POSTs `options` as a new room's; returns (status, error code, message).
async fn create_with(s: &TestServer, options: &str) -> (u16, Value, String) {
    let (status, v) = s
        .post_raw("/v1/rooms", &format!(r#"{{"options": {options}}}"#))
        .await;
    let message = v["error"]["message"].as_str().unwrap_or("").to_owned();
    (status, v["error"]["code"].clone(), message)
}

#[tokio::test]
async fn room_options_are_refused_past_their_bounds_naming_them() {
    let s = TestServer::start().await;
    // Past the edges: the field and its limits are named.
    for (options, says) in [
        (
            r#"{"max_members": 0}"#,
            "options.max_members must be from 1 to 1000000, not 0",
        ),
        (
            r#"{"max_members": 1000001}"#,
            "options.max_members must be from 1 to 1000000, not 1000001",
        ),
        (
            r#"{"history_size": 0}"#,
            "options.history_size must be from 1 to 100000 (max_history_size), not 0",
        ),
        (
            r#"{"history_size": 100001}"#,
            "options.history_size must be from 1 to 100000 (max_history_size), not 100001",
        ),
    ] {
        let (status, code, message) = create_with(&s, options).await;
        assert_eq!((status, code), (400, json!("invalid_request")), "{options}");
        assert_eq!(message, says, "{options}");
    }
    // Not a count at all: negative, fractional, beyond u64, beyond f64, a string.
    for field in ["max_members", "history_size"] {
        for bad in ["-1", "1.5", "18446744073709551616", "1e400", "\"5\""] {
            let (status, code, message) =
                create_with(&s, &format!(r#"{{"{field}": {bad}}}"#)).await;
            assert_eq!(
                (status, code),
                (400, json!("invalid_request")),
                "{field} {bad}"
            );
            assert!(
                message.contains(&format!("options.{field}")),
                "{field} {bad}: {message}"
            );
        }
    }
    // Nothing was created.
    assert_eq!(s.get("/v1/rooms").await.1, json!({"rooms": []}));
    // The edges are taken.
    let r = s
        .create_room(json!({"id": "low", "options": {"max_members": 1, "history_size": 1}}))
        .await;
    assert_eq!(
        (r["max_members"].clone(), r["history_size"].clone()),
        (json!(1), json!(1))
    );
    let r = s
        .create_room(
            json!({"id": "high", "options": {"max_members": 1_000_000, "history_size": 100_000}}),
        )
        .await;
    assert_eq!(
        (r["max_members"].clone(), r["history_size"].clone()),
        (json!(1_000_000), json!(100_000))
    );
}

#[tokio::test]
async fn lock_ttls_are_bounded_and_cut_to_the_longest_lease() {
    let s = TestServer::start().await;
    s.create_room(json!({"id": "r"})).await;
    let (mut a, _) = s.join("r", "ann").await;
    // 0 is refused, naming the arg and its limits.
    for op in ["lock.acquire", "lock.renew"] {
        let (r, _) = a
            .request("r", json!(op), op, json!({"object": "o", "ttl_ms": 0}))
            .await;
        assert_eq!(r["ok"], false, "{r}");
        assert_eq!(r["error"]["code"], "invalid_args", "{r}");
        assert_eq!(
            r["error"]["message"],
            "ttl_ms must be from 1 to 600000 (max_lock_ttl_ms; longer is cut to it), not 0",
            "{r}"
        );
    }
    // Not a duration: negative, fractional, beyond u64, a string.
    for (i, bad) in ["-1", "1.5", "18446744073709551616", "1e400", "\"5\""]
        .into_iter()
        .enumerate()
    {
        a.send_raw(&format!(
            r#"{{"type":"request","room":"r","nonce":{i},"op":"lock.acquire","args":{{"object":"o","ttl_ms":{bad}}}}}"#
        ))
        .await;
        let r = a.recv_type("response").await;
        assert_eq!(r["nonce"], i, "{r}");
        assert_eq!(r["error"]["code"], "invalid_args", "{bad}: {r}");
        let message = r["error"]["message"].as_str().unwrap();
        assert!(
            message.starts_with("invalid args for lock.acquire: ttl_ms: "),
            "{bad}: {message}"
        );
    }
    // The low edge is taken; u64::MAX is cut to the longest lease.
    let (r, _) = a
        .request(
            "r",
            json!("one"),
            "lock.acquire",
            json!({"object": "o", "ttl_ms": 1}),
        )
        .await;
    assert_eq!(r["ok"], true, "{r}");
    let (r, _) = a
        .request(
            "r",
            json!("max"),
            "lock.acquire",
            json!({"object": "o", "ttl_ms": u64::MAX}),
        )
        .await;
    assert_eq!(r["ok"], true, "{r}");
    let expires = r["result"]["lock"]["expires_at"].as_u64().unwrap();
    let now = crate::support::now_ms();
    assert!(expires <= now + 600_000, "{expires} {now}");
    assert!(expires + 60_000 > now + 600_000, "{expires} {now}");
}

#[tokio::test]
async fn join_history_is_bounded_naming_the_field() {
    let s = TestServer::start().await;
    s.create_room(json!({"id": "r"})).await;
    let mut c = s.connect().await;
    for (i, history) in [json!({"last": 0}), json!({"last": 10_001})]
        .into_iter()
        .enumerate()
    {
        c.send(json!({"type": "join", "room": "r", "name": format!("n{i}"), "history": history}))
            .await;
        let e = c.recv_type("error").await;
        assert_eq!(e["code"], "invalid_args", "{e}");
        let m = e["message"].as_str().unwrap();
        assert!(m.contains("history.last must be 1 to 10000"), "{m}");
    }
    for bad in ["-1", "1.5", "4294967296", "1e400"] {
        c.send_raw(&format!(
            r#"{{"type":"join","room":"r","name":"ann","history":{{"last":{bad}}}}}"#
        ))
        .await;
        let e = c.recv_type("error").await;
        assert_eq!(e["code"], "invalid_frame", "{bad}: {e}");
        let m = e["message"].as_str().unwrap();
        assert!(m.contains("history.last: "), "{bad}: {m}");
    }
    for bad in ["-1", "0.5", "18446744073709551616"] {
        c.send_raw(&format!(
            r#"{{"type":"join","room":"r","name":"ann","history":{{"since":{bad}}}}}"#
        ))
        .await;
        let e = c.recv_type("error").await;
        assert_eq!(e["code"], "invalid_frame", "{bad}: {e}");
        let m = e["message"].as_str().unwrap();
        assert!(m.contains("history.since: "), "{bad}: {m}");
    }
    // The edges are taken: `since` any position, past the room's too.
    c.send(json!({"type": "join", "room": "r", "name": "ann", "history": {"last": 10_000}}))
        .await;
    c.recv_type("joined").await;
    let mut d = s.connect().await;
    d.send(json!({"type": "join", "room": "r", "name": "bob", "history": {"since": u64::MAX}}))
        .await;
    let j = d.recv_type("joined").await;
    assert_eq!(j["history"]["events"], json!([]), "{j}");
}

#[tokio::test]
async fn poll_positions_and_waits_are_bounded_naming_the_parameter() {
    let s = TestServer::start().await;
    let (status, v) = s.post("/v1/sessions", &json!({})).await;
    assert_eq!(status, 201, "{v}");
    let id = v["session"].as_str().unwrap().to_owned();
    for (query, names) in [
        ("ack=-1", "ack"),
        ("ack=1.5", "ack"),
        ("ack=18446744073709551616", "ack"),
        ("ack=0&wait_ms=-1", "wait_ms"),
        ("ack=0&wait_ms=1e400", "wait_ms"),
        ("ack=0&wait_ms=18446744073709551616", "wait_ms"),
    ] {
        let (status, v) = s.get(&format!("/v1/sessions/{id}/poll?{query}")).await;
        assert_eq!(
            (status, &v["error"]["code"]),
            (400, &json!("invalid_request")),
            "{query}: {v}"
        );
        let m = v["error"]["message"].as_str().unwrap();
        assert!(
            m.starts_with("ack must be a position and wait_ms a duration in ms, integers from 0 to 18446744073709551615"),
            "{query}: {m}"
        );
        assert!(m.contains(&format!("{names}: ")), "{query}: {m}");
    }
    // The edges: no wait at all, and the longest (cut to 25 s) once a
    // frame is there to answer at once.
    let (status, v) = s
        .get(&format!("/v1/sessions/{id}/poll?ack=0&wait_ms=0"))
        .await;
    assert_eq!((status, v["last"].clone()), (200, json!(0)), "{v}");
    let (status, _) = s
        .post(&format!("/v1/sessions/{id}/send"), &json!({"type": "ping"}))
        .await;
    assert_eq!(status, 202);
    let (status, v) = s
        .get(&format!(
            "/v1/sessions/{id}/poll?ack=0&wait_ms={}",
            u64::MAX
        ))
        .await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["frames"][0]["type"], "pong", "{v}");
}
