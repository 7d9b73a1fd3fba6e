//! The subprotocol `plaza.v1.compact`: its negotiation, room messages as
//! arrays (live and replayed on resume) while every other frame stays v1,
//! and clients that did not ask seeing no change.

use plaza_protocol::compact::{expand, CompactKey};
use serde_json::{json, Value};

use crate::support::{Client, TestServer};

const ROOM: &str = "cmp";

/// Joins `name` over a connection offering `offer`; returns the client and its `joined`.
async fn join_offering(s: &TestServer, offer: &str, name: &str) -> (Client, Value) {
    let (mut c, chosen) = Client::connect_offering(s.addr, offer).await;
    assert!(chosen.is_some(), "no subprotocol chosen for {offer}");
    c.send(json!({"type": "join", "room": ROOM, "name": name}))
        .await;
    let joined = c.recv_type("joined").await;
    (c, joined)
}

/// The room and compact key a `joined` (or `resync`) gave.
fn key_of(joined: &Value) -> (String, CompactKey) {
    let key = serde_json::from_value(joined["compact"].clone())
        .unwrap_or_else(|e| panic!("no compact key in {joined}: {e}"));
    (joined["room"].as_str().unwrap().to_owned(), key)
}

/// The v1 event a compact frame stands for, in the room `joined` answered.
fn expanded(frame: &Value, joined: &Value) -> Value {
    assert!(frame.is_array(), "a compact message is an array: {frame}");
    expand(frame.to_string().as_bytes(), &[key_of(joined)]).unwrap()
}

#[tokio::test]
async fn the_first_offered_subprotocol_plaza_speaks_is_chosen() {
    let s = TestServer::start().await;
    for (offer, chosen) in [
        ("plaza.v1.compact", "plaza.v1.compact"),
        ("plaza.v1", "plaza.v1"),
        ("chat, plaza.v1, plaza.v1.compact", "plaza.v1"),
        ("plaza.v1.compact, plaza.v1", "plaza.v1.compact"),
    ] {
        let (_, got) = Client::connect_offering(s.addr, offer).await;
        assert_eq!(got.as_deref(), Some(chosen), "offer {offer}");
    }
}

#[tokio::test]
async fn an_offer_of_only_unknown_subprotocols_is_refused_with_a_json_error() {
    let s = TestServer::start().await;
    let resp = reqwest::Client::new()
        .get(s.url("/v1/ws"))
        .header("connection", "upgrade")
        .header("upgrade", "websocket")
        .header("sec-websocket-version", "13")
        .header("sec-websocket-key", "dGhlIHNhbXBsZSBub25jZQ==")
        .header("sec-websocket-protocol", "mqtt, plaza.v2")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 400);
    let body: Value = resp.json().await.unwrap();
    assert_eq!(body["error"]["code"], "invalid_request", "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("plaza.v1.compact"),
        "{body}"
    );
}

#[tokio::test]
async fn compact_clients_get_messages_as_arrays_and_everything_else_as_in_v1() {
    let s = TestServer::start().await;
    s.create_room(json!({"id": ROOM})).await;
    let (mut plain, _) = s.join(ROOM, "ann").await;
    let (mut compact, joined) = join_offering(&s, "plaza.v1.compact", "bob").await;
    assert!(
        joined.is_object() && joined["session"].is_string(),
        "{joined}"
    );
    let (_, key) = key_of(&joined);
    let (mut sender, sj) = s.join(ROOM, "cid").await;
    assert!(
        sj.get("compact").is_none(),
        "a v1 client's joined has no key: {sj}"
    );
    // Presence events are v1 objects for both.
    for c in [&mut plain, &mut compact] {
        let (ev, _) = c.recv_event("presence.join").await;
        if ev["member"]["name"] == "bob" {
            c.recv_event("presence.join").await;
        }
    }
    sender
        .send(json!({"type": "request", "room": ROOM, "nonce": 1,
                     "op": "channel.subscribe", "args": {"channel": "xr"}}))
        .await;
    sender.recv_type("response").await;
    compact
        .send(json!({"type": "request", "room": ROOM, "nonce": 2,
                     "op": "channel.subscribe", "args": {"channel": "xr"}}))
        .await;
    assert_eq!(compact.recv_type("response").await["nonce"], 2);
    plain
        .send(json!({"type": "request", "room": ROOM, "nonce": 3,
                     "op": "channel.subscribe", "args": {"channel": "xr"}}))
        .await;
    plain.recv_type("response").await;

    let publishes = [
        json!({"type": "publish", "room": ROOM, "event": "pose", "data": {"p": [1, 2]}}),
        json!({"type": "publish", "room": ROOM, "event": "chat", "data": "hi \"all\"",
               "topic": "t-1", "id": "m-1", "reply_to": 1}),
        json!({"type": "publish", "room": ROOM, "channel": "xr", "event": "head"}),
    ];
    for p in publishes {
        sender.send(p).await;
        let ack = sender.recv_type("ack").await;
        let v1 = plain.recv_type("event").await;
        let c = compact.recv().await;
        assert_eq!(c[0], key.alias, "{c}");
        assert_eq!(c[1], ack["seq"], "{c}");
        assert_eq!(
            c[2].as_i64().unwrap(),
            v1["ts"].as_i64().unwrap() - key.ts_base as i64,
            "{c}"
        );
        assert_eq!(c[3], sj["session"], "{c}");
        assert_eq!(expanded(&c, &joined), v1, "compact {c} against v1 {v1}");
    }
    // A message on main with nothing rare has exactly six elements.
    sender
        .send(json!({"type": "publish", "room": ROOM, "event": "e", "data": 1}))
        .await;
    let c = compact.recv().await;
    assert_eq!(c.as_array().unwrap().len(), 6, "{c}");
    assert_eq!(c[5], 1);
    // Answers and errors stay v1.
    compact
        .send(json!({"type": "publish", "room": "nowhere", "event": "e"}))
        .await;
    assert_eq!(compact.recv_type("error").await["code"], "not_joined");
}

#[tokio::test]
async fn a_compact_resume_replays_missed_messages_as_arrays() {
    let s = TestServer::start().await;
    s.create_room(json!({"id": ROOM})).await;
    let (mut sender, _) = s.join(ROOM, "ann").await;
    let (compact, joined) = join_offering(&s, "plaza.v1.compact", "bob").await;
    sender.recv_event("presence.join").await;
    drop(compact);
    let (ev, _) = sender.recv_event("presence.leave").await;
    assert_eq!(ev["reason"], "disconnected");
    let mut acks = Vec::new();
    for i in 0..3 {
        let (ack, _) = sender.publish(ROOM, "n", json!(i)).await;
        acks.push(ack["seq"].clone());
    }
    let (mut again, chosen) = Client::connect_offering(s.addr, "plaza.v1.compact").await;
    assert_eq!(chosen.as_deref(), Some("plaza.v1.compact"));
    again
        .send(json!({"type": "join", "room": ROOM, "name": "bob",
                     "resume": {"token": joined["resume_token"], "last_seq": joined["seq"]}}))
        .await;
    let rejoined = again.recv_type("joined").await;
    assert_eq!(rejoined["resumed"], true, "{rejoined}");
    // The room is still open on this node: the same key.
    assert_eq!(key_of(&rejoined), key_of(&joined));
    for (i, seq) in acks.iter().enumerate() {
        let c = again.recv().await;
        assert_eq!(&c[1], seq, "{c}");
        assert_eq!(expanded(&c, &rejoined)["data"], json!(i), "{c}");
    }
}

#[tokio::test]
async fn each_room_of_a_connection_has_its_own_alias_and_a_recreated_room_a_new_key() {
    let s = TestServer::start().await;
    let (mut c, chosen) = Client::connect_offering(s.addr, "plaza.v1.compact").await;
    assert_eq!(chosen.as_deref(), Some("plaza.v1.compact"));
    let mut keys = Vec::new();
    for room in ["cmp-a", "cmp-b"] {
        s.create_room(json!({"id": room})).await;
        c.send(json!({"type": "join", "room": room, "name": "ann"}))
            .await;
        keys.push(key_of(&c.recv_type("joined").await));
    }
    assert_ne!(keys[0].1.alias, keys[1].1.alias, "{keys:?}");
    let (mut bob_a, _) = s.join("cmp-a", "bob").await;
    let (mut bob_b, _) = s.join("cmp-b", "bob").await;
    bob_b.publish("cmp-b", "in-b", json!(2)).await;
    bob_a.publish("cmp-a", "in-a", json!(1)).await;
    let mut got = Vec::new();
    while got.len() < 2 {
        let f = c.recv().await;
        if f.is_array() {
            let e = expand(f.to_string().as_bytes(), &keys).unwrap();
            got.push((e["room"].clone(), e["event"].clone()));
        }
    }
    got.sort_by_key(|(r, _)| r.to_string());
    assert_eq!(
        got,
        [
            (json!("cmp-a"), json!("in-a")),
            (json!("cmp-b"), json!("in-b"))
        ]
    );
    // Deleted and created again: its members heard `closed`, and a join
    // gets the new room's key, under which its messages come.
    let status = reqwest::Client::new()
        .delete(s.url("/v1/rooms/cmp-a"))
        .send()
        .await
        .unwrap()
        .status();
    assert!(status.is_success(), "{status}");
    let (closed, _) = c.recv_until(|v| v["type"] == "closed").await;
    assert_eq!(closed["room"], "cmp-a");
    s.create_room(json!({"id": "cmp-a"})).await;
    c.send(json!({"type": "join", "room": "cmp-a", "name": "ann"}))
        .await;
    let fresh = key_of(&c.recv_until(|v| v["type"] == "joined").await.0);
    assert_ne!(fresh.1.alias, keys[1].1.alias, "not the open room's alias");
    let (mut cid, _) = s.join("cmp-a", "cid").await;
    cid.publish("cmp-a", "again", json!(3)).await;
    let f = loop {
        let f = c.recv().await;
        if f.is_array() {
            break f;
        }
    };
    let e = expand(f.to_string().as_bytes(), &[fresh]).unwrap();
    assert_eq!(
        (&e["room"], &e["event"]),
        (&json!("cmp-a"), &json!("again"))
    );
}
