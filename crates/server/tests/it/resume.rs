//! Resume after a dropped connection: replay of exactly the missed events,
//! idempotent publish, resync when the history is too short or the session
//! unknown, and resuming while the old connection is still open.

use crate::support::{of_kind, Client, TestServer};
use serde_json::{json, Value};

const ROOM: &str = "res";

/// The highest seq in a list of frames (events, and `joined`/`resync`).
fn max_seq(frames: &[Value]) -> u64 {
    frames
        .iter()
        .filter(|v| v["type"] == "event" || v["type"] == "joined" || v["type"] == "resync")
        .filter_map(|v| v["seq"].as_u64())
        .max()
        .unwrap_or(0)
}

fn resume_frame(joined: &Value, name: &str, last_seq: u64) -> Value {
    json!({
        "type": "join", "room": joined["room"], "name": name,
        "resume": {"token": joined["resume_token"], "last_seq": last_seq},
    })
}

/// Waits until `c` sees `session` leave with `reason`; returns the frames before.
async fn await_leave(c: &mut Client, session: &Value, reason: &str) -> Vec<Value> {
    let (ev, before) = c
        .recv_until(|v| v["type"] == "event" && v["kind"] == "presence.leave")
        .await;
    assert_eq!(ev["session"], *session, "{ev}");
    assert_eq!(ev["reason"], reason, "{ev}");
    before
}

#[tokio::test]
async fn resume_replays_exactly_the_missed_events() {
    let s = TestServer::start().await;
    s.create_room(json!({"id": ROOM})).await;
    let mut c = s.join_all(ROOM, &["ann", "bob"]).await;
    let (mut b, _) = c.pop().unwrap();
    let (mut a, ja) = c.pop().unwrap();
    let sa = ja["session"].clone();

    // A records every event it gets.
    let mut seen: Vec<Value> = vec![ja.clone()];
    let mut acks = Vec::new();
    for i in 0..3 {
        let (ack, _) = b.publish(ROOM, "chat", json!({"n": i})).await;
        acks.push(ack["seq"].as_u64().unwrap());
        let ev = a.recv_type("event").await;
        assert_eq!(ev["seq"], ack["seq"]);
        seen.push(ev);
    }
    let last_seq = max_seq(&seen);
    assert_eq!(last_seq, *acks.last().unwrap());

    // A's connection dies abruptly; B keeps publishing, before and after the
    // server notices.
    drop(a);
    let mut missed_acks = Vec::new();
    let mut leave_seen = false;
    for i in 3..5 {
        let (ack, before) = b.publish(ROOM, "chat", json!({"n": i})).await;
        leave_seen |= !of_kind(&before, "presence.leave").is_empty();
        missed_acks.push(ack["seq"].as_u64().unwrap());
    }
    if !leave_seen {
        await_leave(&mut b, &sa, "disconnected").await;
    }
    for i in 5..8 {
        let (ack, before) = b.publish(ROOM, "chat", json!({"n": i})).await;
        assert!(before.is_empty(), "{before:?}");
        missed_acks.push(ack["seq"].as_u64().unwrap());
    }

    // A comes back with its token and the last seq it saw.
    let (mut a2, j) = s.join_with(resume_frame(&ja, "ann", last_seq)).await;
    assert_eq!(j["type"], "joined", "{j}");
    assert_eq!(j["resumed"], true);
    assert_eq!(j["session"], sa);
    assert_eq!(j["resume_token"], ja["resume_token"]);
    assert_eq!(j["epoch"], ja["epoch"]);
    assert!(j.get("snapshot").is_none(), "no snapshot on a resume: {j}");
    assert!(j.get("reason").is_none());
    let (back, _) = b.recv_event("presence.join").await;
    assert_eq!(back["member"]["session"], sa);
    assert_eq!(j["seq"], back["seq"]);

    // Exactly the missed messages follow, in order: none lost, none twice.
    let mut replay = Vec::new();
    for _ in 0..missed_acks.len() {
        replay.push(a2.recv_type("event").await);
    }
    assert_eq!(a2.drain().await, Vec::<Value>::new(), "nothing more");
    let seqs: Vec<u64> = replay.iter().map(|e| e["seq"].as_u64().unwrap()).collect();
    assert_eq!(seqs, missed_acks);
    for (e, n) in replay.iter().zip(3..) {
        assert_eq!(e["kind"], "message");
        assert_eq!(e["data"], json!({"n": n}));
    }

    // Then live events.
    let (ack, _) = b.publish(ROOM, "chat", json!({"n": 8})).await;
    let live = a2.recv_type("event").await;
    assert_eq!(live["seq"], ack["seq"]);
    assert_eq!(live["data"], json!({"n": 8}));
    s.wait_members(ROOM, 2).await;
}

#[tokio::test]
async fn a_replay_longer_than_the_send_queue_is_read_in_full_not_cut_off() {
    // The room keeps 200 events, a connection queues 8 frames: a resume that
    // missed 100 is still handed every one (the replay is shared history,
    // not a backlog), and the client that reads them is no slow consumer.
    let s = TestServer::with_config(plaza_server::ServerConfig {
        send_queue_frames: 8,
        ..Default::default()
    })
    .await;
    s.create_room(json!({"id": ROOM, "options": {"history_size": 200}}))
        .await;
    let mut c = s.join_all(ROOM, &["ann", "bob"]).await;
    let (mut b, _) = c.pop().unwrap();
    let (a, ja) = c.pop().unwrap();
    drop(a);
    await_leave(&mut b, &ja["session"], "disconnected").await;
    let mut acks = Vec::new();
    for i in 0..100 {
        let (ack, _) = b.publish(ROOM, "chat", json!({"n": i})).await;
        acks.push(ack["seq"].as_u64().unwrap());
    }
    let (mut a2, j) = s
        .join_with(resume_frame(&ja, "ann", ja["seq"].as_u64().unwrap()))
        .await;
    assert_eq!(
        (&j["type"], &j["resumed"]),
        (&json!("joined"), &json!(true)),
        "{j}"
    );
    let mut seqs = Vec::new();
    while seqs.len() < acks.len() {
        let e = a2.recv_type("event").await;
        if e["kind"] == "message" {
            seqs.push(e["seq"].as_u64().unwrap());
        }
    }
    assert_eq!(seqs, acks);
    // Still connected, and live.
    let (ack, _) = b.publish(ROOM, "chat", json!("live")).await;
    assert_eq!(a2.recv_type("event").await["seq"], ack["seq"]);
}

#[tokio::test]
async fn a_retried_publish_is_acked_as_duplicate_and_delivered_once() {
    let s = TestServer::start().await;
    s.create_room(json!({"id": ROOM})).await;
    let mut c = s.join_all(ROOM, &["ann", "bob"]).await;
    let (mut b, _) = c.pop().unwrap();
    let (mut a, ja) = c.pop().unwrap();

    // Case 1: the ack was read before the connection dropped.
    a.send(json!({"type": "publish", "room": ROOM, "event": "chat", "data": "one", "id": "m1"}))
        .await;
    let ack = a.recv_type("ack").await;
    assert_eq!(ack["id"], "m1");
    assert!(ack.get("duplicate").is_none());
    let ev = b.recv_type("event").await;
    assert_eq!(
        (ev["id"].clone(), ev["seq"].clone()),
        (json!("m1"), ack["seq"].clone())
    );
    let last_seq = ack["seq"].as_u64().unwrap();
    drop(a);
    await_leave(&mut b, &ja["session"], "disconnected").await;

    let (mut a, j) = s.join_with(resume_frame(&ja, "ann", last_seq)).await;
    assert_eq!(j["resumed"], true, "{j}");
    b.recv_event("presence.join").await;
    a.send(json!({"type": "publish", "room": ROOM, "event": "chat", "data": "one", "id": "m1"}))
        .await;
    let (dup, before) = a.recv_until(|v| v["type"] == "ack").await;
    assert!(before.is_empty(), "{before:?}");
    assert_eq!(dup["duplicate"], true, "{dup}");
    assert_eq!(dup["seq"], ack["seq"]);
    assert_eq!(dup["id"], "m1");

    // Case 2: the connection dropped before the ack was read.
    a.send(json!({"type": "publish", "room": ROOM, "event": "chat", "data": "two", "id": "m2"}))
        .await;
    let ev2 = b.recv_type("event").await; // ordered: the ack is on its way to A
    assert_eq!(ev2["id"], "m2");
    let last_seq = j["seq"].as_u64().unwrap();
    drop(a);
    await_leave(&mut b, &ja["session"], "disconnected").await;

    let (mut a, j) = s.join_with(resume_frame(&ja, "ann", last_seq)).await;
    assert_eq!(j["resumed"], true, "{j}");
    b.recv_event("presence.join").await;
    // A's own message is not replayed to it (no echo), nothing else happened.
    assert_eq!(a.drain().await, Vec::<Value>::new());
    a.send(json!({"type": "publish", "room": ROOM, "event": "chat", "data": "two", "id": "m2"}))
        .await;
    let dup = a.recv_type("ack").await;
    assert_eq!(dup["duplicate"], true, "{dup}");
    assert_eq!(dup["seq"], ev2["seq"]);

    // B got each message exactly once.
    let rest = b.drain().await;
    assert_eq!(of_kind(&rest, "message").len(), 0, "{rest:?}");
    // A new id is a new message.
    let (ack3, _) = a.publish(ROOM, "chat", json!("three")).await;
    assert!(ack3["seq"].as_u64().unwrap() > ev2["seq"].as_u64().unwrap());
    assert!(ack3.get("duplicate").is_none());
    assert_eq!(b.recv_type("event").await["seq"], ack3["seq"]);
}

#[tokio::test]
async fn resume_past_the_history_gets_a_resync_with_a_snapshot() {
    let s = TestServer::start().await;
    s.create_room(json!({"id": ROOM, "options": {"history_size": 5}}))
        .await;
    let mut c = s.join_all(ROOM, &["ann", "bob"]).await;
    let (mut b, jb) = c.pop().unwrap();
    let (mut a, ja) = c.pop().unwrap();
    b.request(ROOM, json!(1), "entity.create", json!({"data": {"v": 1}}))
        .await;
    let ev = a.recv_event("entity.created").await.0;
    let last_seq = ev["seq"].as_u64().unwrap();
    drop(a);
    await_leave(&mut b, &ja["session"], "disconnected").await;

    // More than 5 events happen meanwhile.
    b.request(
        ROOM,
        json!(2),
        "entity.set",
        json!({"id": "e1", "data": {"v": 2}}),
    )
    .await;
    let mut last = 0;
    for i in 0..6 {
        last = b.publish(ROOM, "chat", json!(i)).await.0["seq"]
            .as_u64()
            .unwrap();
    }

    let (mut a, j) = s.join_with(resume_frame(&ja, "ann", last_seq)).await;
    assert_eq!(j["type"], "resync", "{j}");
    assert_eq!(j["reason"], "history_truncated");
    assert_eq!(j["resumed"], false);
    assert_eq!(j["session"], ja["session"], "the session itself continues");
    assert_eq!(j["room"], ROOM);
    assert_eq!(
        j["seq"].as_u64(),
        Some(last + 1),
        "up to A's own presence.join"
    );
    assert_eq!(
        j["snapshot"],
        json!({"entities": [{"id": "e1", "data": {"v": 2}, "version": 2}], "locks": []})
    );
    let sessions: Vec<&Value> = j["members"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| &m["session"])
        .collect();
    assert!(sessions.contains(&&ja["session"]) && sessions.contains(&&jb["session"]));
    assert_eq!(sessions.len(), 2);
    // No replay after a resync; live events continue.
    assert_eq!(a.drain().await, Vec::<Value>::new());
    let (back, _) = b.recv_event("presence.join").await;
    assert_eq!(back["seq"], j["seq"]);
    let (ack, _) = b.publish(ROOM, "chat", json!("live")).await;
    assert_eq!(a.recv_type("event").await["seq"], ack["seq"]);
}

#[tokio::test]
async fn an_unknown_token_starts_a_new_session() {
    let s = TestServer::start().await;
    s.create_room(json!({"id": ROOM})).await;
    let (mut b, _) = s.join(ROOM, "bob").await;
    let (mut a, j) = s
        .join_with(json!({
            "type": "join", "room": ROOM, "name": "ann",
            "resume": {"token": "no-such-token", "last_seq": 1},
        }))
        .await;
    assert_eq!(j["type"], "resync", "{j}");
    assert_eq!(j["reason"], "session_expired");
    assert_eq!(j["resumed"], false);
    assert!(!j["session"].as_str().unwrap().is_empty());
    assert_ne!(j["resume_token"], "no-such-token");
    assert_eq!(j["snapshot"], json!({"entities": [], "locks": []}));
    let (ev, _) = b.recv_event("presence.join").await;
    assert_eq!(ev["member"]["session"], j["session"]);
    assert_eq!(ev["member"]["name"], "ann");
    assert_eq!(j["seq"], ev["seq"]);
    // The new session works like any other, and its token resumes it.
    let (ack, _) = a.publish(ROOM, "chat", json!(1)).await;
    assert_eq!(b.recv_type("event").await["seq"], ack["seq"]);
    drop(a);
    await_leave(&mut b, &j["session"], "disconnected").await;
    let (_a, j2) = s
        .join_with(resume_frame(&j, "ann", ack["seq"].as_u64().unwrap()))
        .await;
    assert_eq!(j2["type"], "joined", "{j2}");
    assert_eq!(j2["resumed"], true);
    assert_eq!(j2["session"], j["session"]);
}

#[tokio::test]
async fn a_token_after_leave_no_longer_resumes() {
    let s = TestServer::start().await;
    s.create_room(json!({"id": ROOM})).await;
    let (mut a, ja) = s.join(ROOM, "ann").await;
    a.send(json!({"type": "leave", "room": ROOM})).await;
    assert_eq!(a.recv_type("left").await["room"], ROOM);
    a.send(resume_frame(&ja, "ann", ja["seq"].as_u64().unwrap()))
        .await;
    let j = a.recv().await;
    assert_eq!(j["type"], "resync", "{j}");
    assert_eq!(j["reason"], "session_expired");
    assert_ne!(j["session"], ja["session"]);
}

#[tokio::test]
async fn resume_while_the_old_connection_is_open_replaces_it() {
    let s = TestServer::start().await;
    s.create_room(json!({"id": ROOM})).await;
    let mut c = s.join_all(ROOM, &["ann", "bob"]).await;
    let (mut b, _) = c.pop().unwrap();
    let (mut a1, ja) = c.pop().unwrap();
    let (ack, _) = b.publish(ROOM, "chat", json!(1)).await;
    assert_eq!(a1.recv_type("event").await["seq"], ack["seq"]);

    let (mut a2, j) = s
        .join_with(resume_frame(&ja, "ann", ack["seq"].as_u64().unwrap()))
        .await;
    assert_eq!(j["type"], "joined", "{j}");
    assert_eq!(j["resumed"], true);
    assert_eq!(j["session"], ja["session"]);
    let closed = a1.recv_type("closed").await;
    assert_eq!(
        closed,
        json!({"type": "closed", "room": ROOM, "reason": "resumed_elsewhere"})
    );
    assert_eq!(j["members"].as_array().unwrap().len(), 2, "{j}");
    s.wait_members(ROOM, 2).await;

    // Nothing to replay; the others saw no one leave or join.
    assert_eq!(a2.drain().await, Vec::<Value>::new());
    assert_eq!(b.drain().await, Vec::<Value>::new());

    // Events now go to the new connection only.
    let (ack, _) = b.publish(ROOM, "chat", json!(2)).await;
    assert_eq!(a2.recv_type("event").await["seq"], ack["seq"]);
    assert_eq!(a1.drain().await, Vec::<Value>::new());
    // The old connection no longer acts for the session.
    a1.send(json!({"type": "publish", "room": ROOM, "event": "chat", "data": 3}))
        .await;
    let e = a1.recv_type("error").await;
    assert_eq!(e["code"], "not_joined", "{e}");
    // Its end does not end the session.
    drop(a1);
    assert!(crate::support::wait_until(|| async { s.node.connection_count() == 2 }).await);
    let (ack, before) = b.publish(ROOM, "chat", json!(4)).await;
    assert!(before.is_empty(), "B saw {before:?}");
    assert_eq!(a2.recv_type("event").await["seq"], ack["seq"]);
    s.wait_members(ROOM, 2).await;
}

#[tokio::test]
async fn last_seq_ahead_of_the_room_resyncs() {
    let s = TestServer::start().await;
    s.create_room(json!({"id": ROOM})).await;
    let mut c = s.join_all(ROOM, &["ann", "bob"]).await;
    let (mut b, _) = c.pop().unwrap();
    let (a, ja) = c.pop().unwrap();
    drop(a);
    await_leave(&mut b, &ja["session"], "disconnected").await;
    let (_a, j) = s.join_with(resume_frame(&ja, "ann", 1_000)).await;
    assert_eq!(j["type"], "resync", "{j}");
    assert_eq!(j["reason"], "epoch_changed");
    assert_eq!(j["session"], ja["session"]);
    assert!(j["snapshot"].is_object());
}

#[tokio::test]
async fn a_recreated_room_does_not_know_old_tokens() {
    let s = TestServer::start().await;
    s.create_room(json!({"id": ROOM})).await;
    let (a, ja) = s.join(ROOM, "ann").await;
    drop(a);
    s.wait_members(ROOM, 0).await;
    assert_eq!(s.delete(&format!("/v1/rooms/{ROOM}")).await.0, 204);
    // Gone: the resume finds no room.
    let (mut a, e) = s.join_with(resume_frame(&ja, "ann", 1)).await;
    assert_eq!(e["type"], "error", "{e}");
    assert_eq!(e["code"], "room_not_found");
    // Recreated: the token is unknown there, and the epoch is new.
    s.create_room(json!({"id": ROOM})).await;
    a.send(resume_frame(&ja, "ann", 1)).await;
    let j = a.recv().await;
    assert_eq!(j["type"], "resync", "{j}");
    assert_eq!(j["reason"], "session_expired");
    assert_ne!(j["session"], ja["session"]);
    assert_ne!(j["epoch"], ja["epoch"]);
    assert_eq!(j["seq"], 1);
}

#[tokio::test]
async fn a_connection_whose_session_was_taken_over_can_join_again() {
    let s = TestServer::with_config(plaza_server::ServerConfig {
        max_rooms_per_connection: 1,
        ..Default::default()
    })
    .await;
    s.create_room(json!({"id": ROOM})).await;
    let (mut a1, ja) = s.join(ROOM, "ann").await;
    let (_a2, j) = s
        .join_with(resume_frame(&ja, "ann", ja["seq"].as_u64().unwrap()))
        .await;
    assert_eq!(j["resumed"], true);
    assert_eq!(a1.recv_type("closed").await["reason"], "resumed_elsewhere");
    // The old connection is out of the room: neither `already_joined` nor
    // `too_many_rooms` (the limit is one room) stops a new join.
    a1.send(json!({"type": "join", "room": ROOM, "name": "ann again"}))
        .await;
    let again = a1.recv_type("joined").await;
    assert_ne!(again["session"], ja["session"]);
}

#[tokio::test]
async fn a_drop_in_the_middle_of_a_replay_loses_nothing_when_last_seq_follows_the_events() {
    let s = TestServer::start().await;
    s.create_room(json!({"id": ROOM})).await;
    let mut c = s.join_all(ROOM, &["ann", "bob"]).await;
    let (mut b, _) = c.pop().unwrap();
    let (a, ja) = c.pop().unwrap();
    let sa = ja["session"].clone();
    let last_seq = ja["seq"].as_u64().unwrap();
    drop(a);
    await_leave(&mut b, &sa, "disconnected").await;
    let mut missed = Vec::new();
    for i in 0..5 {
        let (ack, _) = b.publish(ROOM, "chat", json!({"n": i})).await;
        missed.push(ack["seq"].as_u64().unwrap());
    }

    // Ann resumes and gets two of the five missed messages before dropping again.
    let (mut a2, j) = s.join_with(resume_frame(&ja, "ann", last_seq)).await;
    assert_eq!(j["resumed"], true, "{j}");
    // The resumed joined's seq is the room's position, past everything still to come:
    // counting it would skip what the drop cuts off.
    assert!(j["seq"].as_u64().unwrap() > *missed.last().unwrap(), "{j}");
    // (What came before the drop: bob's arrival, then messages.)
    let mut got = Vec::new();
    let mut last_seen = last_seq;
    while got.len() < 2 {
        let ev = a2.recv_type("event").await;
        last_seen = ev["seq"].as_u64().unwrap();
        if ev["kind"] == "message" {
            got.push(last_seen);
        }
    }
    drop(a2);
    await_leave(&mut b, &sa, "disconnected").await;

    // The rule in docs/protocol.md: last_seq is the last event seen, not the joined's seq.
    let (mut a3, j) = s.join_with(resume_frame(&ja, "ann", last_seen)).await;
    assert_eq!(j["resumed"], true, "{j}");
    let mut messages = Vec::new();
    while messages.len() < missed.len() - got.len() {
        let ev = a3.recv_type("event").await;
        if ev["kind"] == "message" {
            messages.push(ev["seq"].as_u64().unwrap());
        }
    }
    got.extend(messages);
    assert_eq!(got, missed, "every missed message once, in order");
}
