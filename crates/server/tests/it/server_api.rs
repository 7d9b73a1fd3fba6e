//! The server API: the application's backend publishes into rooms (one or
//! many), messages a session or a user, reads and changes a room's state,
//! reads its history and disconnects a user; with bad input and credentials
//! refused as the admin calls are.

use jsonwebtoken::{encode, Algorithm, EncodingKey, Header};
use plaza_server::ServerConfig;
use serde_json::{json, Value};

use crate::support::{now_ms, TestServer};

const SECRET: &str = "server-api-test-secret-of-32-bytes-or-more";
const KEY: &str = "server-api-test-key-0123";

fn token(sub: &str) -> String {
    let claims =
        json!({"sub": sub, "exp": now_ms() / 1000 + 600, "rooms": {"*": ["join", "publish"]}});
    encode(
        &Header::new(Algorithm::HS256),
        &claims,
        &EncodingKey::from_secret(SECRET.as_bytes()),
    )
    .unwrap()
}

/// `method path` with `headers` and a raw `body`: the status and the JSON answer.
async fn call(
    s: &TestServer,
    method: reqwest::Method,
    path: &str,
    headers: &[(&str, &str)],
    body: Option<&str>,
) -> (u16, Value) {
    let mut r = s.http.request(method, s.url(path));
    for (k, v) in headers {
        r = r.header(*k, *v);
    }
    if let Some(b) = body {
        r = r
            .header("content-type", "application/json")
            .body(b.to_owned());
    }
    let res = r.send().await.unwrap();
    let status = res.status().as_u16();
    let text = res.text().await.unwrap();
    (status, serde_json::from_str(&text).unwrap_or(Value::Null))
}

fn post() -> reqwest::Method {
    reqwest::Method::POST
}

fn error_code(v: &Value) -> &str {
    v["error"]["code"].as_str().unwrap_or("")
}

#[tokio::test]
async fn a_server_message_reaches_members_once_per_key_as_no_member() {
    let s = TestServer::start().await;
    s.create_room(json!({"id": "r"})).await;
    let mut joined = s.join_all("r", &["ann", "bob"]).await;
    let (mut bob, _) = joined.pop().unwrap();
    let (mut ann, _) = joined.pop().unwrap();

    let body = r#"{"channel": "main", "event": "welcome", "data": {"text": "hi"}, "topic": "greet", "idempotency_key": "k1"}"#;
    let (status, first) = call(&s, post(), "/v1/rooms/r/publish", &[], Some(body)).await;
    assert_eq!(status, 200, "{first}");
    assert_eq!(first["room"], "r");
    assert_eq!(first["duplicate"], false);
    let seq = first["seq"].as_u64().unwrap();
    for c in [&mut ann, &mut bob] {
        let (ev, _) = c.recv_event("message").await;
        assert_eq!(ev["seq"], seq);
        assert_eq!(ev["from"], "@server");
        assert_eq!(ev["event"], "welcome");
        assert_eq!(ev["data"], json!({"text": "hi"}));
        assert_eq!(ev["topic"], "greet");
        assert_eq!(ev["id"], "k1");
    }

    // A retry gets the same seq and is delivered to nobody.
    let (status, again) = call(&s, post(), "/v1/rooms/r/publish", &[], Some(body)).await;
    assert_eq!(status, 200, "{again}");
    assert_eq!(
        (again["seq"].as_u64(), &again["duplicate"]),
        (Some(seq), &json!(true))
    );
    // The same key with another body is a conflict.
    let other = r#"{"event": "welcome", "data": {"text": "bye"}, "idempotency_key": "k1"}"#;
    let (status, e) = call(&s, post(), "/v1/rooms/r/publish", &[], Some(other)).await;
    assert_eq!(
        (status, error_code(&e)),
        (409, "idempotency_conflict"),
        "{e}"
    );
    // Nothing reached the members after the first message.
    assert_eq!(ann.drain().await, Vec::<Value>::new());
    assert_eq!(bob.drain().await, Vec::<Value>::new());

    // Without a key every call is a new message; reply_to names an earlier one.
    let reply = format!(r#"{{"event": "thread", "reply_to": {seq}}}"#);
    let (status, r2) = call(&s, post(), "/v1/rooms/r/publish", &[], Some(&reply)).await;
    assert_eq!(status, 200, "{r2}");
    assert_eq!(r2["seq"].as_u64(), Some(seq + 1));
    let (ev, _) = ann.recv_event("message").await;
    assert_eq!(ev["reply_to"].as_u64(), Some(seq));

    // The server is in nobody's presence.
    let (_, members) = s.get("/v1/rooms/r/members").await;
    assert_eq!(members["members"].as_array().unwrap().len(), 2);
    assert!(!members.to_string().contains("@server"));
}

/// A retry that another JSON library wrote again (keys re-ordered, other
/// spacing, other escapes, `1.0` for `1`) is the same message: the first
/// seq and `"duplicate": true`, in a publish and in each room of a
/// broadcast; one value changed is still a conflict.
#[tokio::test]
async fn a_retry_rewritten_by_another_json_library_is_a_duplicate() {
    let s = TestServer::start().await;
    for id in ["r", "a", "b"] {
        s.create_room(json!({"id": id})).await;
    }
    let first = r#"{"event": "e", "data": {"text": "café", "path": "x/y", "n": 1, "list": [1, 2.5]}, "idempotency_key": "k"}"#;
    let rewritten = [
        r#"{"idempotency_key":"k","data":{"list":[1,2.5],"n":1,"path":"x/y","text":"café"},"event":"e"}"#,
        "{\n  \"event\" : \"e\",\n  \"data\" : { \"text\" : \"caf\\u00e9\", \"path\" : \"x\\/y\", \"n\" : 1.0, \"list\" : [ 1e0, 25e-1 ] },\n  \"idempotency_key\" : \"k\"\n}",
    ];
    let changed = r#"{"event": "e", "data": {"text": "café", "path": "x/y", "n": 2, "list": [1, 2.5]}, "idempotency_key": "k"}"#;

    let (status, v) = call(&s, post(), "/v1/rooms/r/publish", &[], Some(first)).await;
    assert_eq!((status, &v["duplicate"]), (200, &json!(false)), "{v}");
    let seq = v["seq"].clone();
    for body in rewritten {
        let (status, v) = call(&s, post(), "/v1/rooms/r/publish", &[], Some(body)).await;
        assert_eq!(status, 200, "{body}: {v}");
        assert_eq!((&v["seq"], &v["duplicate"]), (&seq, &json!(true)), "{body}");
    }
    let (status, v) = call(&s, post(), "/v1/rooms/r/publish", &[], Some(changed)).await;
    assert_eq!(
        (status, error_code(&v)),
        (409, "idempotency_conflict"),
        "{v}"
    );

    let in_rooms = |body: &str| body.replacen('{', r#"{"rooms": ["a", "b"], "#, 1);
    let (status, v) = call(&s, post(), "/v1/broadcast", &[], Some(&in_rooms(first))).await;
    assert_eq!(status, 200, "{v}");
    let seqs: Vec<Value> = (0..2).map(|i| v["results"][i]["seq"].clone()).collect();
    for body in rewritten {
        let (_, v) = call(&s, post(), "/v1/broadcast", &[], Some(&in_rooms(body))).await;
        for (i, seq) in seqs.iter().enumerate() {
            assert_eq!(v["results"][i]["seq"], *seq, "{body}: {v}");
            assert_eq!(v["results"][i]["duplicate"], true, "{body}: {v}");
        }
    }
    let (_, v) = call(&s, post(), "/v1/broadcast", &[], Some(&in_rooms(changed))).await;
    for i in 0..2 {
        assert_eq!(
            v["results"][i]["error"]["code"], "idempotency_conflict",
            "{v}"
        );
    }
}

#[tokio::test]
async fn a_channel_message_reaches_only_its_subscribers() {
    let s = TestServer::start().await;
    s.create_room(json!({"id": "r"})).await;
    let mut xr = s.connect().await;
    xr.send(json!({"type": "join", "room": "r", "name": "xr", "channels": ["main", "xr"]}))
        .await;
    xr.recv_type("joined").await;
    let (mut plain, _) = s.join("r", "plain").await;
    xr.recv_event("presence.join").await;
    let (status, v) = call(
        &s,
        post(),
        "/v1/rooms/r/publish",
        &[],
        Some(r#"{"channel": "xr", "event": "pose"}"#),
    )
    .await;
    assert_eq!(status, 200, "{v}");
    let (ev, _) = xr.recv_event("message").await;
    assert_eq!(ev["channel"], "xr");
    assert_eq!(plain.drain().await, Vec::<Value>::new());
}

#[tokio::test]
async fn a_broadcast_answers_every_room_in_order() {
    let s = TestServer::start().await;
    s.create_room(json!({"id": "a"})).await;
    s.create_room(json!({"id": "b"})).await;
    let (mut in_a, _) = s.join("a", "ann").await;
    let (mut in_b, _) = s.join("b", "bob").await;
    let body = r#"{"rooms": ["a", "missing", "b"], "event": "news", "data": [1], "idempotency_key": "n1"}"#;
    let (status, v) = call(&s, post(), "/v1/broadcast", &[], Some(body)).await;
    assert_eq!(status, 200, "{v}");
    let results = v["results"].as_array().unwrap();
    assert_eq!(results.len(), 3);
    assert_eq!(results[0]["room"], "a");
    assert!(results[0]["seq"].as_u64().is_some(), "{v}");
    assert_eq!(results[1]["room"], "missing");
    assert_eq!(results[1]["error"]["code"], "room_not_found");
    assert_eq!(results[2]["room"], "b");
    for c in [&mut in_a, &mut in_b] {
        let (ev, _) = c.recv_event("message").await;
        assert_eq!((&ev["event"], &ev["data"]), (&json!("news"), &json!([1])));
    }
    // A retry is answered as duplicates, delivered to nobody.
    let (_, again) = call(&s, post(), "/v1/broadcast", &[], Some(body)).await;
    assert_eq!(again["results"][0]["duplicate"], true);
    assert_eq!(again["results"][0]["seq"], results[0]["seq"]);
    assert_eq!(in_a.drain().await, Vec::<Value>::new());

    for (bad, says) in [
        (r#"{"rooms": [], "event": "x"}"#, "1 to 1000"),
        (r#"{"rooms": ["a", "a"], "event": "x"}"#, "named twice"),
        (r#"{"rooms": ["a"]}"#, "event"),
        (
            r#"{"rooms": ["a"], "event": "x", "extra": 1}"#,
            "unknown field",
        ),
    ] {
        let (status, e) = call(&s, post(), "/v1/broadcast", &[], Some(bad)).await;
        assert_eq!(
            (status, error_code(&e)),
            (400, "invalid_request"),
            "{bad}: {e}"
        );
        assert!(
            e["error"]["message"].as_str().unwrap().contains(says),
            "{bad}: {e}"
        );
    }
}

#[tokio::test]
async fn a_direct_reaches_one_session_from_the_server() {
    let s = TestServer::start().await;
    s.create_room(json!({"id": "r"})).await;
    let mut joined = s.join_all("r", &["ann", "bob"]).await;
    let (mut bob, _) = joined.pop().unwrap();
    let (mut ann, aj) = joined.pop().unwrap();
    let ann_session = aj["session"].as_str().unwrap();
    let path = format!("/v1/rooms/r/members/{ann_session}/direct");
    let (status, v) = call(
        &s,
        post(),
        &path,
        &[],
        Some(r#"{"event": "offer", "data": {"sdp": "x"}}"#),
    )
    .await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["session"], ann_session);
    let d = ann.recv_type("direct").await;
    assert_eq!(
        d,
        json!({"type": "direct", "room": "r", "from": "@server", "event": "offer", "data": {"sdp": "x"}})
    );
    assert_eq!(bob.drain().await, Vec::<Value>::new());
    let (status, e) = call(
        &s,
        post(),
        "/v1/rooms/r/members/nobody/direct",
        &[],
        Some(r#"{"event": "x"}"#),
    )
    .await;
    assert_eq!((status, error_code(&e)), (404, "session_not_found"), "{e}");
}

#[tokio::test]
async fn the_state_is_read_and_changed_with_version_checks() {
    let s = TestServer::start().await;
    s.create_room(json!({"id": "r"})).await;
    let (mut ann, aj) = s.join("r", "ann").await;

    let (status, created) = call(
        &s,
        post(),
        "/v1/rooms/r/entities",
        &[],
        Some(r#"{"kind": "note", "data": {"text": "a"}}"#),
    )
    .await;
    assert_eq!(status, 201, "{created}");
    let id = created["entity"]["id"].as_str().unwrap().to_owned();
    assert_eq!(created["entity"]["version"], 1);
    let (ev, _) = ann.recv_event("entity.created").await;
    assert_eq!(
        (&ev["from"], &ev["entity"]["id"]),
        (&json!("@server"), &json!(id))
    );

    let (status, state) = s.get("/v1/rooms/r/state").await;
    assert_eq!(status, 200, "{state}");
    assert_eq!(state["room"], "r");
    assert_eq!(state["seq"], ev["seq"]);
    assert_eq!(state["entities"][0]["data"], json!({"text": "a"}));
    assert_eq!(state["members"][0]["session"], aj["session"]);
    assert_eq!(state["locks"], json!([]));
    assert!(state["epoch"].as_u64().is_some());

    let path = format!("/v1/rooms/r/entities/{id}");
    let put = reqwest::Method::PUT;
    let set = r#"{"data": {"text": "b"}}"#;
    // A stale version is refused, and nothing changes.
    let (status, e) = call(&s, put.clone(), &path, &[("if-match", "\"7\"")], Some(set)).await;
    assert_eq!((status, error_code(&e)), (412, "version_conflict"), "{e}");
    let (status, e) = call(&s, put.clone(), &path, &[("if-match", "seven")], Some(set)).await;
    assert_eq!((status, error_code(&e)), (400, "invalid_request"), "{e}");
    let (status, v) = call(&s, put.clone(), &path, &[("if-match", "1")], Some(set)).await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["entity"]["version"], 2);
    let (ev, _) = ann.recv_event("entity.updated").await;
    assert_eq!(ev["entity"]["data"], json!({"text": "b"}));

    // A member's lock holds the server off too.
    let (res, _) = ann
        .request("r", json!(1), "lock.acquire", json!({"object": id}))
        .await;
    assert_eq!(res["ok"], true, "{res}");
    let (status, e) = call(&s, put.clone(), &path, &[], Some(set)).await;
    assert_eq!((status, error_code(&e)), (409, "lock_held"), "{e}");
    let (res, _) = ann
        .request("r", json!(2), "lock.release", json!({"object": id}))
        .await;
    assert_eq!(res["ok"], true, "{res}");

    let del = reqwest::Method::DELETE;
    let (status, v) = call(&s, del.clone(), &path, &[("if-match", "2")], None).await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["id"], id.as_str());
    let (ev, _) = ann.recv_event("entity.deleted").await;
    assert_eq!(ev["id"], id.as_str());
    let (status, e) = call(&s, del, &path, &[], None).await;
    assert_eq!((status, error_code(&e)), (404, "entity_not_found"), "{e}");
    let (status, e) = s.get("/v1/rooms/none/state").await;
    assert_eq!((status, error_code(&e)), (404, "room_not_found"), "{e}");
}

#[tokio::test]
async fn history_reads_a_channel_as_a_join_does() {
    let s = TestServer::start().await;
    s.create_room(json!({"id": "r"})).await;
    let mut seqs = Vec::new();
    for i in 0..4 {
        let body = format!(r#"{{"event": "m", "data": {i}}}"#);
        let (status, v) = call(&s, post(), "/v1/rooms/r/publish", &[], Some(&body)).await;
        assert_eq!(status, 200, "{v}");
        seqs.push(v["seq"].as_u64().unwrap());
    }
    let (status, h) = s.get("/v1/rooms/r/history?last=2").await;
    assert_eq!(status, 200, "{h}");
    let events = h["events"].as_array().unwrap();
    let got: Vec<u64> = events.iter().map(|e| e["seq"].as_u64().unwrap()).collect();
    assert_eq!(got, seqs[2..].to_vec());
    assert_eq!(events[1]["data"], 3);
    assert_eq!(h["complete"], true);
    let (_, h) = s
        .get(&format!("/v1/rooms/r/history?since={}", seqs[0]))
        .await;
    assert_eq!(h["events"].as_array().unwrap().len(), 3);
    let (_, h) = s.get("/v1/rooms/r/history?channel=other").await;
    assert_eq!(h["events"], json!([]));
    for bad in ["last=0", "last=10001", "since=-1", "colour=red"] {
        let (status, e) = s.get(&format!("/v1/rooms/r/history?{bad}")).await;
        assert_eq!(
            (status, error_code(&e)),
            (400, "invalid_request"),
            "{bad}: {e}"
        );
    }
}

#[tokio::test]
async fn bad_bodies_get_clear_errors_and_change_nothing() {
    let config = ServerConfig {
        max_frame_bytes: 1024,
        ..Default::default()
    };
    let s = TestServer::with_config(config).await;
    s.create_room(json!({"id": "r"})).await;
    let (mut ann, _) = s.join("r", "ann").await;
    for (body, status, code) in [
        ("{", 400, "invalid_request"),
        ("[1]", 400, "invalid_request"),
        (r#"{"event": "x", "colour": 1}"#, 400, "invalid_request"),
        (r#"{"data": 1}"#, 400, "invalid_request"),
        (r#"{"event": ""}"#, 400, "invalid_request"),
        (r#"{"event": "x", "channel": ""}"#, 400, "invalid_request"),
        (r#"{"event": "x", "reply_to": 99}"#, 400, "invalid_request"),
        (
            r#"{"event": "x", "idempotency_key": ""}"#,
            400,
            "invalid_request",
        ),
    ] {
        let (got, e) = call(&s, post(), "/v1/rooms/r/publish", &[], Some(body)).await;
        assert_eq!((got, error_code(&e)), (status, code), "{body}: {e}");
    }
    let big = format!(r#"{{"event": "x", "data": "{}"}}"#, "a".repeat(2000));
    let (status, e) = call(&s, post(), "/v1/rooms/r/publish", &[], Some(&big)).await;
    assert_eq!((status, error_code(&e)), (413, "payload_too_large"), "{e}");
    let (status, e) = call(
        &s,
        post(),
        "/v1/rooms/none/publish",
        &[],
        Some(r#"{"event": "x"}"#),
    )
    .await;
    assert_eq!((status, error_code(&e)), (404, "room_not_found"), "{e}");
    assert_eq!(ann.drain().await, Vec::<Value>::new());
}

#[tokio::test]
async fn calls_need_the_api_key_or_an_admin_token_of_the_room() {
    let config = ServerConfig {
        api_key: KEY.into(),
        jwt_secret: SECRET.into(),
        ..Default::default()
    };
    let s = TestServer::with_config(config).await;
    let auth = format!("Bearer {KEY}");
    let (status, _) = call(
        &s,
        post(),
        "/v1/rooms",
        &[("authorization", &auth)],
        Some(r#"{"id": "r"}"#),
    )
    .await;
    assert_eq!(status, 201);
    let publish = r#"{"event": "x"}"#;
    let (status, e) = call(&s, post(), "/v1/rooms/r/publish", &[], Some(publish)).await;
    assert_eq!((status, error_code(&e)), (401, "unauthorized"), "{e}");
    let (status, e) = call(
        &s,
        post(),
        "/v1/rooms/r/publish",
        &[("authorization", "Bearer wrong-key-wrong-key")],
        Some(publish),
    )
    .await;
    assert_eq!(status, 401, "{e}");
    // A member's token grants no admin.
    let member = format!("Bearer {}", token("u1"));
    let (status, e) = call(
        &s,
        post(),
        "/v1/rooms/r/publish",
        &[("authorization", &member)],
        Some(publish),
    )
    .await;
    assert_eq!((status, error_code(&e)), (403, "forbidden"), "{e}");
    // Calls across rooms take the API key only.
    for path in [
        "/v1/broadcast",
        "/v1/users/u1/direct",
        "/v1/users/u1/disconnect",
    ] {
        let (status, e) = call(
            &s,
            post(),
            path,
            &[("authorization", &member)],
            Some(r#"{"rooms": ["r"], "event": "x"}"#),
        )
        .await;
        assert_eq!(
            (status, error_code(&e)),
            (401, "unauthorized"),
            "{path}: {e}"
        );
    }
    let (status, v) = call(
        &s,
        post(),
        "/v1/rooms/r/publish",
        &[("authorization", &auth)],
        Some(publish),
    )
    .await;
    assert_eq!(status, 200, "{v}");
    let (status, _) = call(&s, reqwest::Method::GET, "/v1/rooms/r/state", &[], None).await;
    assert_eq!(status, 401);
}

/// Joins `room` as user `sub`.
async fn join_as(s: &TestServer, room: &str, sub: &str) -> crate::support::Client {
    let mut c = s.connect().await;
    c.send(json!({"type": "auth", "token": token(sub)})).await;
    assert_eq!(c.recv_type("authed").await["user"], sub);
    c.send(json!({"type": "join", "room": room, "name": sub}))
        .await;
    let joined = c.recv_type("joined").await;
    assert_eq!(joined["room"], room);
    c
}

#[tokio::test]
async fn a_user_is_messaged_and_disconnected_in_every_room() {
    let config = ServerConfig {
        api_key: KEY.into(),
        jwt_secret: SECRET.into(),
        ..Default::default()
    };
    let s = TestServer::with_config(config).await;
    let auth = format!("Bearer {KEY}");
    let headers = [("authorization", auth.as_str())];
    for id in ["a", "b"] {
        let body = format!(r#"{{"id": "{id}"}}"#);
        assert_eq!(
            call(&s, post(), "/v1/rooms", &headers, Some(&body)).await.0,
            201
        );
    }
    let mut u1_a = join_as(&s, "a", "u1").await;
    let mut u1_b = join_as(&s, "b", "u1").await;
    let mut u2_a = join_as(&s, "a", "u2").await;
    u1_a.recv_event("presence.join").await;

    let (status, v) = call(
        &s,
        post(),
        "/v1/users/u1/direct",
        &headers,
        Some(r#"{"event": "notice", "data": {"n": 1}}"#),
    )
    .await;
    assert_eq!(status, 202, "{v}");
    for (c, room) in [(&mut u1_a, "a"), (&mut u1_b, "b")] {
        let d = c.recv_type("direct").await;
        assert_eq!(
            d,
            json!({"type": "direct", "room": room, "from": "@server", "event": "notice", "data": {"n": 1}})
        );
    }
    assert_eq!(u2_a.drain().await, Vec::<Value>::new());

    let (status, v) = call(
        &s,
        post(),
        "/v1/users/u1/disconnect",
        &headers,
        Some(r#"{"reason": "banned"}"#),
    )
    .await;
    assert_eq!(status, 202, "{v}");
    for (c, room) in [(&mut u1_a, "a"), (&mut u1_b, "b")] {
        let closed = c.recv_type("closed").await;
        assert_eq!(
            closed,
            json!({"type": "closed", "room": room, "reason": "kicked", "message": "banned"})
        );
    }
    let (leave, _) = u2_a.recv_event("presence.leave").await;
    assert_eq!(leave["reason"], "kicked");
    let (_, members) = call(
        &s,
        reqwest::Method::GET,
        "/v1/rooms/a/members",
        &headers,
        None,
    )
    .await;
    assert_eq!(members["members"].as_array().unwrap().len(), 1, "{members}");
    let frames = u2_a.drain().await;
    assert!(!frames.iter().any(|f| f["type"] == "closed"), "{frames:?}");
}
