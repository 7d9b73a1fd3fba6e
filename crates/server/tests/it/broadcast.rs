//! Broadcast: fan-out to every other member, once and in seq order; echo;
//! channels; payloads relayed untouched.

use std::collections::{BTreeMap, BTreeSet};

use crate::support::{of_kind, TestServer};
use serde_json::{json, Value};

const ROOM: &str = "fan";

#[tokio::test]
async fn every_other_member_gets_each_message_once_in_seq_order() {
    const CLIENTS: usize = 5;
    const PER_CLIENT: usize = 10;
    let s = TestServer::start().await;
    s.create_room(json!({"id": ROOM})).await;
    let names: Vec<String> = (0..CLIENTS).map(|i| format!("c{i}")).collect();
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    let mut clients = s.join_all(ROOM, &names).await;
    let sessions: Vec<Value> = clients.iter().map(|(_, j)| j["session"].clone()).collect();
    let seq_before = clients.last().unwrap().1["seq"].as_u64().unwrap();

    // Every client fires all its messages without waiting for anything.
    for (i, (c, _)) in clients.iter_mut().enumerate() {
        for k in 0..PER_CLIENT {
            c.send(json!({
                "type": "publish", "room": ROOM, "event": "chat",
                "data": {"from": i, "k": k}, "id": format!("c{i}-m{k}"),
            }))
            .await;
        }
    }

    // Each sender collects its acks (other frames arrive interleaved).
    let mut acks: Vec<Vec<Value>> = Vec::new();
    let mut received: Vec<Vec<Value>> = Vec::new();
    for (c, _) in clients.iter_mut() {
        let mut mine = Vec::new();
        let mut others = Vec::new();
        while mine.len() < PER_CLIENT {
            let v = c.recv().await;
            if v["type"] == "ack" {
                mine.push(v);
            } else {
                others.push(v);
            }
        }
        acks.push(mine);
        received.push(others);
    }
    // Every message is acked, hence ordered and queued to every recipient:
    // a ping round trip now flushes everything still in flight.
    for (i, (c, _)) in clients.iter_mut().enumerate() {
        received[i].extend(c.drain().await);
    }

    // The acks: one per message, in send order, carrying the message id; all
    // seqs together are exactly the next CLIENTS × PER_CLIENT seqs.
    let mut seq_of: BTreeMap<(usize, usize), u64> = BTreeMap::new();
    for (i, mine) in acks.iter().enumerate() {
        for (k, ack) in mine.iter().enumerate() {
            assert_eq!(ack["room"], ROOM);
            assert_eq!(ack["id"], format!("c{i}-m{k}"));
            assert!(ack.get("duplicate").is_none(), "{ack}");
            seq_of.insert((i, k), ack["seq"].as_u64().unwrap());
        }
        let seqs: Vec<u64> = mine.iter().map(|a| a["seq"].as_u64().unwrap()).collect();
        assert!(
            seqs.windows(2).all(|w| w[0] < w[1]),
            "acks out of order: {seqs:?}"
        );
    }
    let all: BTreeSet<u64> = seq_of.values().copied().collect();
    let total = (CLIENTS * PER_CLIENT) as u64;
    assert_eq!(all, (seq_before + 1..=seq_before + total).collect());

    // The deliveries: every member got every other member's messages, each
    // exactly once, in seq order, and none of its own.
    for (i, got) in received.iter().enumerate() {
        for v in got {
            assert_eq!(v["type"], "event", "client {i} got an unexpected frame {v}");
            assert_eq!(v["kind"], "message", "client {i} got {v}");
        }
        let seqs: Vec<u64> = got.iter().map(|v| v["seq"].as_u64().unwrap()).collect();
        assert!(
            seqs.windows(2).all(|w| w[0] < w[1]),
            "client {i}: not in seq order or duplicated: {seqs:?}"
        );
        let expected: BTreeSet<u64> = seq_of
            .iter()
            .filter(|((from, _), _)| *from != i)
            .map(|(_, s)| *s)
            .collect();
        assert_eq!(seqs.iter().copied().collect::<BTreeSet<_>>(), expected);
        assert_eq!(seqs.len(), expected.len());
        for v in got {
            let from = v["data"]["from"].as_u64().unwrap() as usize;
            let k = v["data"]["k"].as_u64().unwrap() as usize;
            assert_ne!(from, i, "client {i} got its own message {v}");
            assert_eq!(v["seq"], seq_of[&(from, k)], "{v}");
            assert_eq!(v["from"], sessions[from]);
            assert_eq!(v["room"], ROOM);
            assert_eq!(v.get("channel"), None, "main is not named: {v}");
            assert_eq!(v["event"], "chat");
            assert_eq!(v["id"], format!("c{from}-m{k}"));
            assert!(v["ts"].as_u64().unwrap() > 0);
        }
    }
}

#[tokio::test]
async fn echo_delivers_to_the_sender_too() {
    let s = TestServer::start().await;
    s.create_room(json!({"id": ROOM})).await;
    let mut c = s.join_all(ROOM, &["ann", "bob"]).await;
    let (mut b, _) = c.pop().unwrap();
    let (mut a, ja) = c.pop().unwrap();

    a.send(json!({"type": "publish", "room": ROOM, "event": "note", "data": 1, "echo": true}))
        .await;
    // Exactly one echoed copy, and it comes before the ack.
    let (ack, mine) = a.recv_until(|v| v["type"] == "ack").await;
    assert_eq!(mine.len(), 1, "{mine:?}");
    assert_eq!(a.drain().await, Vec::<Value>::new());
    assert_eq!(mine[0]["kind"], "message");
    assert_eq!(mine[0]["seq"], ack["seq"]);
    assert_eq!(mine[0]["from"], ja["session"]);
    assert_eq!(mine[0]["data"], 1);
    let ev = b.recv_type("event").await;
    assert_eq!(ev["seq"], ack["seq"]);
    assert_eq!(b.drain().await, Vec::<Value>::new());

    // Without echo the sender gets the ack only.
    let (ack2, before) = a.publish(ROOM, "note", json!(2)).await;
    assert!(before.is_empty(), "{before:?}");
    assert_eq!(a.drain().await, Vec::<Value>::new());
    assert_eq!(ack2["seq"].as_u64(), Some(ack["seq"].as_u64().unwrap() + 1));
    assert_eq!(b.recv_type("event").await["seq"], ack2["seq"]);
}

#[tokio::test]
async fn payload_topic_reply_to_and_id_are_relayed_untouched() {
    let s = TestServer::start().await;
    s.create_room(json!({"id": ROOM})).await;
    let mut c = s.join_all(ROOM, &["ann", "bob"]).await;
    let (mut b, _) = c.pop().unwrap();
    let (mut a, _) = c.pop().unwrap();

    let (first, _) = a.publish(ROOM, "q", json!("question")).await;
    b.recv_type("event").await;
    // Odd spacing and number formats must reach the other side byte for byte.
    let data = r#"{"b": [1, 2.50, "x\u0041"] ,  "a":null, "n": 1e3}"#;
    let frame = format!(
        r#"{{"type":"publish","room":"{ROOM}","event":"answer","data":{data},"topic":"t1","reply_to":{},"id":"m-2"}}"#,
        first["seq"]
    );
    a.send_raw(&frame).await;
    let ack = a.recv_type("ack").await;
    assert_eq!(ack["id"], "m-2");
    let raw = b.recv_text().await;
    assert!(
        raw.contains(&format!(r#""data":{data}"#)),
        "payload not relayed verbatim: {raw}"
    );
    let ev: Value = serde_json::from_str(&raw).unwrap();
    assert_eq!(ev["type"], "event");
    assert_eq!(ev["kind"], "message");
    assert_eq!(ev["seq"], ack["seq"]);
    assert_eq!(ev["event"], "answer");
    assert_eq!(ev["topic"], "t1");
    assert_eq!(ev["reply_to"], first["seq"]);
    assert_eq!(ev["id"], "m-2");

    // Optional fields are absent, not null, when not given; so is data.
    a.send(json!({"type": "publish", "room": ROOM, "event": "bare"}))
        .await;
    let ack = a.recv_type("ack").await;
    assert!(ack.get("id").is_none(), "{ack}");
    let ev = b.recv_type("event").await;
    for field in ["data", "topic", "reply_to", "id"] {
        assert!(ev.get(field).is_none(), "{field} should be absent: {ev}");
    }
}

#[tokio::test]
async fn channels_reach_only_their_subscribers() {
    let s = TestServer::start().await;
    s.create_room(json!({"id": ROOM})).await;
    let mut c = s.join_all(ROOM, &["pub", "yan", "zed"]).await;
    let (mut z, jz) = c.pop().unwrap();
    let (mut y, _) = c.pop().unwrap();
    let (mut p, _) = c.pop().unwrap();

    // X subscribes at join time.
    let (mut x, jx) = s
        .join_with(json!({"type": "join", "room": ROOM, "name": "xan", "channels": ["xr"]}))
        .await;
    assert_eq!(jx["type"], "joined", "{jx}");
    assert_eq!(jx["channels"], json!(["main", "xr"]));
    for other in [&mut p, &mut y, &mut z] {
        let (ev, _) = other.recv_event("presence.join").await;
        assert_eq!(ev["member"]["session"], jx["session"]);
    }
    // Y subscribes with a request.
    let (r, _) = y
        .request(
            ROOM,
            json!("sub"),
            "channel.subscribe",
            json!({"channel": "xr"}),
        )
        .await;
    assert_eq!(r["ok"], true, "{r}");
    assert_eq!(r["result"]["channels"], json!(["main", "xr"]));
    // Subscribing twice changes nothing.
    let (r, _) = y
        .request(
            ROOM,
            json!("sub2"),
            "channel.subscribe",
            json!({"channel": "xr"}),
        )
        .await;
    assert_eq!(r["result"]["channels"], json!(["main", "xr"]));

    let publish_on = |channel: &str, n: i64| json!({"type": "publish", "room": ROOM, "channel": channel, "event": "pose", "data": n});
    p.send(publish_on("xr", 1)).await;
    let ack1 = p.recv_type("ack").await;
    for sub in [&mut x, &mut y] {
        let ev = sub.recv_type("event").await;
        assert_eq!(ev["channel"], "xr");
        assert_eq!(ev["seq"], ack1["seq"]);
        assert_eq!(ev["data"], 1);
    }
    assert_eq!(z.drain().await, Vec::<Value>::new(), "zed is not on xr");

    // main still reaches everyone.
    p.send(publish_on("main", 2)).await;
    let ack2 = p.recv_type("ack").await;
    for m in [&mut x, &mut y, &mut z] {
        let ev = m.recv_type("event").await;
        // On main, so not named.
        assert_eq!(
            (ev.get("channel"), ev["seq"].clone()),
            (None, ack2["seq"].clone())
        );
    }

    // Unsubscribing stops the channel.
    let (r, _) = y
        .request(
            ROOM,
            json!(9),
            "channel.unsubscribe",
            json!({"channel": "xr"}),
        )
        .await;
    assert_eq!(r["ok"], true, "{r}");
    assert_eq!(r["nonce"], 9);
    assert_eq!(r["result"]["channels"], json!(["main"]));
    p.send(publish_on("xr", 3)).await;
    let ack3 = p.recv_type("ack").await;
    assert_eq!(x.recv_type("event").await["seq"], ack3["seq"]);
    assert_eq!(
        y.drain().await,
        Vec::<Value>::new(),
        "yan unsubscribed from xr"
    );
    assert_eq!(z.drain().await, Vec::<Value>::new());

    // Leaving main stops main messages, but room-wide events still arrive.
    let (r, _) = x
        .request(
            ROOM,
            json!("um"),
            "channel.unsubscribe",
            json!({"channel": "main"}),
        )
        .await;
    assert_eq!(r["result"]["channels"], json!(["xr"]));
    p.send(publish_on("main", 4)).await;
    let ack4 = p.recv_type("ack").await;
    assert_eq!(y.recv_type("event").await["seq"], ack4["seq"]);
    assert_eq!(z.recv_type("event").await["seq"], ack4["seq"]);
    assert_eq!(x.drain().await, Vec::<Value>::new(), "xan left main");
    z.send(json!({"type": "leave", "room": ROOM})).await;
    z.recv_type("left").await;
    let (ev, before) = x.recv_event("presence.leave").await;
    assert!(before.is_empty(), "{before:?}");
    assert_eq!(ev["session"], jz["session"]);
    assert_eq!(ev["reason"], "left");

    // Nothing else reached the publisher: only acks.
    let rest = p.drain().await;
    assert_eq!(of_kind(&rest, "message").len(), 0, "{rest:?}");
}

#[tokio::test]
async fn a_room_without_presence_announces_no_joins_and_lists_only_the_joiner() {
    let s = TestServer::start().await;
    s.create_room(json!({"id": "quiet", "options": {"presence": false}}))
        .await;
    let (mut a, joined_a) = s.join("quiet", "ann").await;
    let (mut b, joined_b) = s.join("quiet", "bob").await;
    assert_eq!(joined_a["members"].as_array().map(Vec::len), Some(1));
    assert_eq!(joined_b["members"].as_array().map(Vec::len), Some(1));
    assert_eq!(joined_b["members"][0]["name"], "bob");
    // The first thing ann receives is bob's message, not bob's join.
    b.publish("quiet", "hello", json!(1)).await;
    let first = a.recv().await;
    assert_eq!(first["kind"], "message", "{first}");
    assert_eq!(first["event"], "hello");
    // A bad value is refused with the usual error.
    let (status, body) = s
        .post(
            "/v1/rooms",
            &json!({"id": "bad", "options": {"presence": "no"}}),
        )
        .await;
    assert_eq!(status, 400, "{body}");
}
