//! Cluster mode with several nodes in one process over the in-memory cluster:
//! a room's members on different nodes see one room. (The same with real
//! processes, Redis and a load balancer: crates/plaza/tests/cluster.rs.)

use std::sync::Arc;

use crate::support::{wait_until, Client, Closed, TestServer};
use plaza_broker::{MemoryCluster, MemoryTicketStore};
use plaza_server::ServerConfig;
use serde_json::{json, Value};

struct Cluster {
    hub: Arc<MemoryCluster>,
    nodes: Vec<TestServer>,
}

async fn cluster(n: usize) -> Cluster {
    cluster_with(n, ServerConfig::default()).await
}

async fn cluster_with(n: usize, config: ServerConfig) -> Cluster {
    cluster_on(MemoryCluster::new(), n, config).await
}

async fn cluster_on(hub: Arc<MemoryCluster>, n: usize, config: ServerConfig) -> Cluster {
    let broker = Arc::new(MemoryTicketStore::new());
    let mut nodes = Vec::new();
    for i in 0..n {
        let id = format!("node-{i}");
        nodes.push(TestServer::clustered(config.clone(), broker.clone(), hub.node(&id)).await);
    }
    Cluster { hub, nodes }
}

#[tokio::test]
async fn a_room_created_on_one_node_is_listed_and_joinable_on_every_node() {
    let c = cluster(2).await;
    c.nodes[0]
        .create_room(json!({"id": "shared", "name": "Shared", "entities": [{"kind": "box", "data": {"x": 1}}]}))
        .await;
    let (status, v) = c.nodes[1].get("/v1/rooms/shared").await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["name"], "Shared");
    let (status, list) = c.nodes[1].get("/v1/rooms").await;
    assert_eq!(status, 200);
    assert_eq!(list["rooms"][0]["id"], "shared");
    let (status, _) = c.nodes[1].post("/v1/rooms", &json!({"id": "shared"})).await;
    assert_eq!(status, 409, "the id is taken cluster-wide");
    let (_, joined) = c.nodes[1].join("shared", "bea").await;
    let entities = &joined["snapshot"]["entities"];
    assert_eq!(entities[0]["data"]["x"], 1, "{joined}");
    let (r, n) = node_header(&c.nodes[1]).await;
    assert_eq!((r, n.as_str()), (200, "node-1"));
}

async fn node_header(s: &TestServer) -> (u16, String) {
    let r = s.http.get(s.url("/readyz")).send().await.unwrap();
    let node = r.headers()["x-plaza-node"].to_str().unwrap().to_owned();
    (r.status().as_u16(), node)
}

/// Joins `name` on `node`, then waits until `others` saw it join.
async fn join_seen(
    node: &TestServer,
    room: &str,
    name: &str,
    others: &mut [&mut Client],
) -> (Client, Value) {
    let (c, joined) = node.join(room, name).await;
    for o in others.iter_mut() {
        let (ev, _) = o.recv_event("presence.join").await;
        assert_eq!(ev["member"]["session"], joined["session"]);
    }
    (c, joined)
}

#[tokio::test]
async fn members_on_different_nodes_share_messages_presence_and_order() {
    let c = cluster(3).await;
    c.nodes[0].create_room(json!({"id": "r"})).await;
    let (mut ann, _) = c.nodes[0].join("r", "ann").await;
    let (mut bob, bob_joined) = join_seen(&c.nodes[1], "r", "bob", &mut [&mut ann]).await;
    let (mut cid, cid_joined) = join_seen(&c.nodes[2], "r", "cid", &mut [&mut ann, &mut bob]).await;
    let names: Vec<&str> = cid_joined["members"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["name"].as_str().unwrap())
        .collect();
    assert_eq!(names.len(), 3, "{cid_joined}");
    assert!(bob_joined["members"].as_array().unwrap().len() == 2);

    // Three senders on three nodes: every member sees one order.
    for i in 0..5 {
        ann.send(json!({"type": "publish", "room": "r", "event": "m", "data": format!("a{i}")}))
            .await;
        bob.send(json!({"type": "publish", "room": "r", "event": "m", "data": format!("b{i}")}))
            .await;
        cid.send(json!({"type": "publish", "room": "r", "event": "m", "data": format!("c{i}")}))
            .await;
    }
    let mut seen: Vec<Vec<(u64, String)>> = Vec::new();
    for client in [&mut ann, &mut bob, &mut cid] {
        let mut events = Vec::new();
        let mut acks = 0;
        while acks < 5 || events.len() < 10 {
            let v = client.recv().await;
            match v["type"].as_str().unwrap() {
                "ack" => acks += 1,
                "event" => events.push((
                    v["seq"].as_u64().unwrap(),
                    v["data"].as_str().unwrap().to_owned(),
                )),
                other => panic!("unexpected {other}: {v}"),
            }
        }
        seen.push(events);
    }
    // Each saw the 10 messages of the others, in rising seq.
    for events in &seen {
        assert!(events.windows(2).all(|w| w[0].0 < w[1].0), "{events:?}");
    }
    // Where two members saw the same message, they saw the same seq.
    let all: std::collections::HashMap<String, u64> = seen
        .iter()
        .flatten()
        .map(|(seq, d)| (d.clone(), *seq))
        .collect();
    assert_eq!(all.len(), 15);
    for (seq, d) in seen.iter().flatten() {
        assert_eq!(all[d], *seq);
    }
    // A member's own messages keep their order.
    let ann_seqs: Vec<u64> = (0..5).map(|i| all[&format!("a{i}")]).collect();
    assert!(ann_seqs.windows(2).all(|w| w[0] < w[1]), "{ann_seqs:?}");
}

#[tokio::test]
async fn locks_are_exclusive_across_nodes_and_requests_are_answered_where_asked() {
    let c = cluster(2).await;
    c.nodes[0].create_room(json!({"id": "l"})).await;
    let (mut ann, _) = c.nodes[0].join("l", "ann").await;
    let (mut bob, _) = join_seen(&c.nodes[1], "l", "bob", &mut [&mut ann]).await;
    ann.send(json!({"type": "request", "room": "l", "nonce": 1, "op": "lock.acquire", "args": {"object": "o"}}))
        .await;
    bob.send(json!({"type": "request", "room": "l", "nonce": 2, "op": "lock.acquire", "args": {"object": "o"}}))
        .await;
    let (ra, _) = ann.recv_until(|v| v["type"] == "response").await;
    let (rb, _) = bob.recv_until(|v| v["type"] == "response").await;
    assert_eq!(ra["nonce"], 1);
    assert_eq!(rb["nonce"], 2);
    let oks = [&ra, &rb].iter().filter(|r| r["ok"] == true).count();
    assert_eq!(oks, 1, "exactly one holder: {ra} {rb}");
    let loser = if ra["ok"] == true { &rb } else { &ra };
    assert_eq!(loser["error"]["code"], "lock_held", "{loser}");
    let token = if ra["ok"] == true { &ra } else { &rb }["result"]["lock"]["token"].clone();
    assert!(token.as_u64().unwrap() >= 1);
}

#[tokio::test]
async fn a_ticket_from_one_node_is_redeemed_on_another_once() {
    let c = cluster(2).await;
    c.nodes[0]
        .create_room(json!({"id": "t", "options": {"access": "ticket"}}))
        .await;
    let ticket = c.nodes[0].ticket("t", "tia", "xr").await;
    let (mut tia, joined) = c.nodes[1]
        .join_with(json!({"type": "join", "ticket": ticket}))
        .await;
    assert_eq!(joined["type"], "joined", "{joined}");
    assert_eq!(joined["members"][0]["platform"], "xr");
    tia.assert_alive().await;
    let (_, again) = c.nodes[0]
        .join_with(json!({"type": "join", "ticket": ticket}))
        .await;
    assert_eq!(again["code"], "ticket_used", "{again}");
}

#[tokio::test]
async fn direct_messages_cross_nodes() {
    let c = cluster(2).await;
    c.nodes[0].create_room(json!({"id": "d"})).await;
    let (mut ann, _) = c.nodes[0].join("d", "ann").await;
    let (mut bob, bob_joined) = join_seen(&c.nodes[1], "d", "bob", &mut [&mut ann]).await;
    ann.send(json!({"type": "direct", "room": "d", "to": bob_joined["session"], "event": "rtc.offer", "data": {"sdp": "x"}}))
        .await;
    let (d, _) = bob.recv_until(|v| v["type"] == "direct").await;
    assert_eq!(d["event"], "rtc.offer");
    assert_eq!(d["data"]["sdp"], "x");
    ann.send(json!({"type": "direct", "room": "d", "to": "nobody", "event": "x"}))
        .await;
    let (e, _) = ann.recv_until(|v| v["type"] == "error").await;
    assert_eq!(e["code"], "session_not_found", "{e}");
}

#[tokio::test]
async fn a_member_resumes_on_another_node_with_every_missed_event_once() {
    let c = cluster(2).await;
    c.nodes[0].create_room(json!({"id": "res"})).await;
    let (mut ann, _) = c.nodes[0].join("res", "ann").await;
    let (bob, bob_joined) = join_seen(&c.nodes[0], "res", "bob", &mut [&mut ann]).await;
    let token = bob_joined["resume_token"].clone();
    let last_seq = bob_joined["seq"].as_u64().unwrap();
    drop(bob);
    let (left, _) = ann.recv_event("presence.leave").await;
    assert_eq!(left["reason"], "disconnected");
    let mut acked = Vec::new();
    for i in 0..3 {
        let (ack, _) = ann.publish("res", "m", json!(i)).await;
        acked.push(ack["seq"].as_u64().unwrap());
    }
    let (mut bob, resumed) = c.nodes[1]
        .join_with(json!({"type": "join", "room": "res", "name": "bob", "resume": {"token": token, "last_seq": last_seq}}))
        .await;
    assert_eq!(resumed["type"], "joined", "{resumed}");
    assert_eq!(resumed["resumed"], true, "{resumed}");
    assert_eq!(resumed["session"], bob_joined["session"]);
    let mut got = Vec::new();
    while got.len() < 3 {
        let v = bob.recv().await;
        if v["type"] == "event" && v["kind"] == "message" {
            got.push(v["seq"].as_u64().unwrap());
        }
    }
    assert_eq!(got, acked, "every missed message once, in order");
    assert_eq!(bob.drain().await, Vec::<Value>::new(), "and nothing twice");
}

#[tokio::test]
async fn a_dead_nodes_members_leave_and_their_locks_free() {
    let c = cluster(2).await;
    c.nodes[0].create_room(json!({"id": "k"})).await;
    let (mut ann, _) = c.nodes[0].join("k", "ann").await;
    let (mut bob, bob_joined) = join_seen(&c.nodes[1], "k", "bob", &mut [&mut ann]).await;
    bob.send(json!({"type": "request", "room": "k", "nonce": 1, "op": "lock.acquire", "args": {"object": "o", "ttl_ms": 600000}}))
        .await;
    let (r, _) = bob.recv_until(|v| v["type"] == "response").await;
    assert_eq!(r["ok"], true, "{r}");
    // node-1 stops renewing its heartbeat (as if it crashed).
    c.hub.kill_node("node-1");
    let (unlocked, _) = ann.recv_event("lock.released").await;
    assert_eq!(unlocked["object"], "o");
    let (left, _) = ann.recv_event("presence.leave").await;
    assert_eq!(left["session"], bob_joined["session"]);
    ann.send(json!({"type": "request", "room": "k", "nonce": 2, "op": "lock.acquire", "args": {"object": "o"}}))
        .await;
    let (r, _) = ann.recv_until(|v| v["type"] == "response").await;
    assert_eq!(r["ok"], true, "the lock is free again: {r}");
}

#[tokio::test]
async fn during_a_broker_outage_publishes_fail_clearly_and_nothing_is_lost_after() {
    let c = cluster(2).await;
    c.nodes[0].create_room(json!({"id": "o"})).await;
    let (mut ann, _) = c.nodes[0].join("o", "ann").await;
    let (mut bob, _) = join_seen(&c.nodes[1], "o", "bob", &mut [&mut ann]).await;
    c.hub.set_available(false);
    ann.send(json!({"type": "publish", "room": "o", "event": "m", "data": 1, "id": "m1"}))
        .await;
    let (e, _) = ann.recv_until(|v| v["type"] == "error").await;
    assert_eq!(e["code"], "broker_unavailable", "{e}");
    assert_eq!(e["ref"]["id"], "m1", "{e}");
    c.hub.set_available(true);
    // The retry with the same id is applied once.
    let (ack, _) = {
        ann.send(json!({"type": "publish", "room": "o", "event": "m", "data": 1, "id": "m1"}))
            .await;
        ann.recv_until(|v| v["type"] == "ack").await
    };
    assert_ne!(
        ack["duplicate"], true,
        "the failed publish was not applied: {ack}"
    );
    let (m, _) = bob.recv_event("message").await;
    assert_eq!(m["seq"], ack["seq"]);
    assert_eq!(bob.drain().await, Vec::<Value>::new());
}

#[tokio::test]
async fn deleting_a_room_closes_it_on_every_node() {
    let c = cluster(2).await;
    c.nodes[0].create_room(json!({"id": "del"})).await;
    let (mut ann, _) = c.nodes[0].join("del", "ann").await;
    let (mut bob, _) = join_seen(&c.nodes[1], "del", "bob", &mut [&mut ann]).await;
    let (status, _) = c.nodes[1].delete("/v1/rooms/del").await;
    assert_eq!(status, 204);
    for client in [&mut ann, &mut bob] {
        let (closed, _) = client.recv_until(|v| v["type"] == "closed").await;
        assert_eq!(closed["reason"], "room_deleted");
    }
    let (status, _) = c.nodes[0].get("/v1/rooms/del").await;
    assert_eq!(status, 404);
}

#[tokio::test]
async fn a_node_stops_hosting_a_room_its_members_left_and_hosts_it_again_on_a_join() {
    let config = ServerConfig {
        room_linger_ms: 50,
        ..ServerConfig::default()
    };
    let c = cluster_with(2, config).await;
    c.nodes[0].create_room(json!({"id": "h"})).await;
    let (mut ann, _) = c.nodes[0].join("h", "ann").await;
    let (bob, _) = join_seen(&c.nodes[1], "h", "bob", &mut [&mut ann]).await;
    assert_eq!(c.nodes[1].node.hosted_rooms(), 1);
    drop(bob);
    ann.recv_event("presence.leave").await;
    // Nothing announces the end of hosting: poll, bounded.
    let start = std::time::Instant::now();
    while c.nodes[1].node.hosted_rooms() != 0 {
        assert!(
            start.elapsed() < crate::support::WAIT,
            "node-1 still hosts the room"
        );
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    assert_eq!(c.nodes[0].node.hosted_rooms(), 1, "ann is still on node-0");
    // Meanwhile the room goes on; a new member on node-1 sees all of it.
    ann.send(json!({"type": "request", "room": "h", "nonce": 1, "op": "entity.create", "args": {"data": {"v": 7}}}))
        .await;
    ann.recv_until(|v| v["type"] == "response").await;
    let (mut cid, joined) = c.nodes[1].join("h", "cid").await;
    assert_eq!(
        joined["snapshot"]["entities"][0]["data"]["v"], 7,
        "{joined}"
    );
    let (ack, _) = ann.publish("h", "m", json!(1)).await;
    let (m, _) = cid.recv_event("message").await;
    assert_eq!(m["seq"], ack["seq"]);
}

#[tokio::test]
async fn a_late_replica_starts_from_a_snapshot_when_the_log_was_trimmed() {
    // A log of 300 entries (just above the snapshot interval of 256): most of
    // the room's 700 events are only in snapshots.
    let config = ServerConfig {
        rate_limit_per_sec: 10_000,
        rate_limit_burst: 10_000,
        ..ServerConfig::default()
    };
    let c = cluster_on(MemoryCluster::with_log_capacity(300), 2, config).await;
    c.nodes[0].create_room(json!({"id": "s"})).await;
    let (mut ann, _) = c.nodes[0].join("s", "ann").await;
    let mut last = Value::Null;
    for i in 0..700 {
        ann.send(json!({"type": "publish", "room": "s", "event": "m", "data": i}))
            .await;
    }
    for _ in 0..700 {
        let (ack, _) = ann.recv_until(|v| v["type"] == "ack").await;
        last = ack["seq"].clone();
    }
    let (mut bob, joined) = c.nodes[1].join("s", "bob").await;
    assert_eq!(joined["type"], "joined");
    // bob's join is the event after ann's last message, on both replicas.
    assert_eq!(
        joined["seq"].as_u64(),
        last.as_u64().map(|s| s + 1),
        "{joined}"
    );
    let (ack, _) = ann.publish("s", "m", json!("after")).await;
    let (m, _) = bob.recv_event("message").await;
    assert_eq!(m["seq"], ack["seq"]);
    assert_eq!(m["data"], "after");
}

#[tokio::test]
async fn a_join_during_an_outage_is_refused_clearly_and_works_once_the_broker_is_back() {
    let c = cluster(2).await;
    c.nodes[0].create_room(json!({"id": "out"})).await;
    c.hub.set_available(false);
    // node-1 does not host the room yet: it cannot load it.
    let (_, refused) = c.nodes[1]
        .join_with(json!({"type": "join", "room": "out", "name": "bea"}))
        .await;
    assert_eq!(refused["code"], "broker_unavailable", "{refused}");
    let (status, body) = c.nodes[1].get("/v1/rooms").await;
    assert_eq!(status, 503, "{body}");
    assert_eq!(body["error"]["code"], "broker_unavailable");
    assert_eq!(
        c.nodes[1].node.hosted_rooms(),
        0,
        "the failed replica left the node"
    );
    c.hub.set_available(true);
    let (_, joined) = c.nodes[1].join("out", "bea").await;
    assert_eq!(joined["type"], "joined");
}

#[tokio::test]
async fn a_replica_that_skips_to_a_snapshot_restarts_connections_waiting_for_answers() {
    // node-0 misses the notices of 300 entries in a log that keeps 300: it
    // can only catch up from a snapshot, past the record of a request it
    // has not answered. That answer would never come, so the connection is
    // told to reconnect (1012), and the resume replays the change it made.
    let config = ServerConfig {
        rate_limit_per_sec: 10_000,
        rate_limit_burst: 10_000,
        ..ServerConfig::default()
    };
    let c = cluster_on(MemoryCluster::with_log_capacity(300), 2, config).await;
    c.nodes[0].create_room(json!({"id": "lag"})).await;
    let (mut ann, ann_joined) = c.nodes[0].join("lag", "ann").await;
    let (mut cid, _) = c.nodes[0].join("lag", "cid").await;
    let (mut bob, _) = c.nodes[1].join("lag", "bob").await;
    let (ping, _) = ann.publish("lag", "m", json!("before")).await;
    let resume = json!({"token": ann_joined["resume_token"], "last_seq": ping["seq"]});
    bob.recv_event("message").await;

    c.hub.set_deaf("node-0", true);
    ann.send(
        json!({"type": "request", "room": "lag", "nonce": 1, "op": "entity.create",
                    "args": {"kind": "note", "data": {"by": "ann"}}}),
    )
    .await;
    let (created, _) = bob.recv_event("entity.created").await;
    for i in 0..300 {
        bob.send(json!({"type": "publish", "room": "lag", "event": "m", "data": i}))
            .await;
    }
    for _ in 0..300 {
        bob.recv_until(|v| v["type"] == "ack").await;
    }
    c.hub.set_deaf("node-0", false);
    // The next entry shows node-0 the gap, which only a snapshot now covers:
    // cid's request on node-0, whose record comes after the snapshot.
    let (r, _) = cid
        .request("lag", json!(7), "lock.acquire", json!({"object": "x"}))
        .await;
    assert_eq!(
        r["ok"], true,
        "a command after the skipped entries is answered: {r}"
    );
    assert_eq!(ann.closed().await, crate::support::Closed::Code(1012));
    // cid's connection carries on.
    let (ack, _) = cid.publish("lag", "m", json!("still here")).await;
    assert_eq!(ack["type"], "ack");

    // ann resumes (anywhere) and learns of its own change among the missed events.
    let mut again = c.nodes[1].connect().await;
    again
        .send(json!({"type": "join", "room": "lag", "name": "ann", "resume": resume}))
        .await;
    let joined = again.recv_type("joined").await;
    assert_eq!(joined["resumed"], true, "{joined}");
    let (mine, _) = again.recv_event("entity.created").await;
    assert_eq!(mine["seq"], created["seq"]);
    assert_eq!(mine["entity"]["data"], json!({"by": "ann"}));
}

#[tokio::test]
async fn one_node_asks_for_each_tick() {
    // Members on three nodes: every replica knows when a lease runs out, but
    // only the node with the smallest id (among those with members) appends
    // the tick; the others would only after a fallback delay.
    let c = cluster(3).await;
    c.nodes[0].create_room(json!({"id": "t"})).await;
    let (_ann, _) = c.nodes[2].join("t", "ann").await;
    let (mut bob, _) = c.nodes[1].join("t", "bob").await;
    let (mut cid, _) = c.nodes[0].join("t", "cid").await;
    for (object, ttl) in [("short", 300), ("long", 3_000)] {
        let (r, _) = bob
            .request(
                "t",
                json!(object),
                "lock.acquire",
                json!({"object": object, "ttl_ms": ttl}),
            )
            .await;
        assert_eq!(r["ok"], true, "{r}");
    }
    // The second expiry comes after the first one's fallback delay (2 s).
    for object in ["short", "long"] {
        let (e, _) = cid.recv_event("lock.released").await;
        assert_eq!(
            (e["object"].as_str(), e["reason"].as_str()),
            (Some(object), Some("expired"))
        );
    }
    let log = c.hub.node("observer").read("t", 0, 10_000).await.unwrap();
    let tickers: Vec<String> = log
        .iter()
        .map(|e| serde_json::from_slice::<Value>(&e.payload).unwrap())
        .filter(|r| r["intent"] == "tick")
        .map(|r| r["node"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(tickers, ["node-0", "node-0"], "one tick per deadline");
}

#[tokio::test]
async fn a_node_restarted_under_its_id_disconnects_its_earlier_members() {
    // node-0 comes back (same id) before anyone declared it dead: the room
    // still counts ann connected on node-0, on a connection the new process
    // never had. Hosting the room again, it disconnects her itself.
    let config = ServerConfig {
        rate_limit_per_sec: 10_000,
        rate_limit_burst: 10_000,
        ..ServerConfig::default()
    };
    let c = cluster_with(2, config).await;
    c.nodes[0].create_room(json!({"id": "re"})).await;
    let (ann, ann_joined) = c.nodes[0].join("re", "ann").await;
    let (mut bob, _) = c.nodes[1].join("re", "bob").await;
    // Past the snapshot interval (256): the new node-0 starts from a
    // snapshot in which ann's join is already applied.
    for i in 0..300 {
        bob.send(json!({"type": "publish", "room": "re", "event": "m", "data": i}))
            .await;
    }
    for _ in 0..300 {
        bob.recv_until(|v| v["type"] == "ack").await;
    }
    let broker = Arc::new(MemoryTicketStore::new());
    let again = TestServer::clustered(ServerConfig::default(), broker, c.hub.node("node-0")).await;
    let (_cid, joined) = again.join("re", "cid").await;
    assert_eq!(joined["type"], "joined", "{joined}");
    let (left, _) = bob.recv_event("presence.leave").await;
    assert_eq!(left["session"], ann_joined["session"], "{left}");
    assert_eq!(left["reason"], "disconnected");
    drop(ann);
}

#[tokio::test]
async fn nodes_that_do_not_host_a_room_report_its_member_count() {
    let c = cluster(2).await;
    c.nodes[0].create_room(json!({"id": "count"})).await;
    let (_ann, _) = c.nodes[1].join("count", "ann").await;
    let (bob, _) = c.nodes[1].join("count", "bob").await;
    assert_eq!(
        c.nodes[0].node.hosted_rooms(),
        0,
        "node-0 has no member there"
    );
    let node0 = &c.nodes[0];
    let listed = || async { node0.get("/v1/rooms").await.1["rooms"][0]["members"].as_u64() };
    assert!(wait_until(|| async { listed().await == Some(2) }).await);
    let (status, one) = node0.get("/v1/rooms/count").await;
    assert_eq!((status, one["members"].as_u64()), (200, Some(2)));
    drop(bob);
    assert!(wait_until(|| async { listed().await == Some(1) }).await);
}

#[tokio::test]
async fn leaves_and_disconnects_during_an_outage_land_once_the_broker_is_back() {
    // A leave or a dropped connection must reach the room even if the
    // broker was away then: else the member stays "connected" for good.
    let c = cluster(2).await;
    c.nodes[0].create_room(json!({"id": "gone"})).await;
    let (mut ann, _) = c.nodes[0].join("gone", "ann").await;
    let (bob, bob_joined) = join_seen(&c.nodes[1], "gone", "bob", &mut [&mut ann]).await;
    let (mut cid, cid_joined) = join_seen(&c.nodes[1], "gone", "cid", &mut [&mut ann]).await;
    c.hub.set_available(false);
    cid.send(json!({"type": "leave", "room": "gone"})).await;
    let left = cid.recv_type("left").await;
    assert_eq!(
        left["room"], "gone",
        "the leaver is answered at once: {left}"
    );
    drop(bob);
    c.hub.set_available(true);
    let mut leaves = Vec::new();
    for _ in 0..2 {
        let (e, _) = ann.recv_event("presence.leave").await;
        leaves.push(format!("{} {}", e["session"], e["reason"]));
    }
    leaves.sort();
    let mut want = vec![
        format!("{} \"disconnected\"", bob_joined["session"]),
        format!("{} \"left\"", cid_joined["session"]),
    ];
    want.sort();
    assert_eq!(leaves, want);
    let (status, room) = c.nodes[0].get("/v1/rooms/gone").await;
    assert_eq!((status, room["members"].as_u64()), (200, Some(1)));
}

#[tokio::test]
async fn a_delivery_policy_holds_on_its_members_node_and_a_resume_elsewhere_loses_nothing() {
    let c = cluster(2).await;
    c.nodes[0].create_room(json!({"id": "pol"})).await;
    let (mut bob, _) = c.nodes[0].join("pol", "bob").await;
    // ann on node 1 holds up to 3 messages or 500 ms.
    let (mut ann, joined) = c.nodes[1]
        .join_with(json!({"type": "join", "room": "pol", "name": "ann",
            "policy": {"max_held": 3, "max_delay_ms": 500}}))
        .await;
    assert_eq!(joined["type"], "joined", "{joined}");
    bob.recv_event("presence.join").await;
    let seq = |v: &Value| v["seq"].as_u64().unwrap();
    let mut sent = Vec::new();
    for i in 0..3 {
        let (ack, _) = bob.publish("pol", "m", json!(i)).await;
        sent.push(seq(&ack));
    }
    // Volume, on ann's node, for messages ordered on bob's.
    let batch = ann.recv_type("batch").await;
    let got: Vec<u64> = batch["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(seq)
        .collect();
    assert_eq!(got, sent);
    // Time, by ann's node's own timer.
    let (ack, _) = bob.publish("pol", "m", json!(3)).await;
    let alone = ann.recv_type("event").await;
    assert_eq!(seq(&alone), seq(&ack));
    let last_seq = seq(&alone);
    // Held on node 1 when ann's connection drops: her resume on node 0
    // replays it from the shared history, once.
    let (ack, _) = bob.publish("pol", "m", json!(4)).await;
    let held = seq(&ack);
    assert_eq!(ann.drain().await, Vec::<Value>::new());
    drop(ann);
    bob.recv_event("presence.leave").await;
    let (mut ann, resumed) = c.nodes[0]
        .join_with(json!({"type": "join", "room": "pol", "name": "ann",
            "resume": {"token": joined["resume_token"], "last_seq": last_seq}}))
        .await;
    assert_eq!(resumed["resumed"], true, "{resumed}");
    assert_eq!(seq(&ann.recv_type("event").await), held);
    assert_eq!(ann.drain().await, Vec::<Value>::new(), "nothing twice");
    // Her policy is the room's, known on every node: held on node 0 now.
    bob.publish("pol", "m", json!(5)).await;
    assert_eq!(ann.drain().await, Vec::<Value>::new());
}

#[tokio::test]
async fn an_admin_on_one_node_kicks_a_member_on_another() {
    let c = cluster(2).await;
    c.nodes[0].create_room(json!({"id": "k"})).await;
    let (mut ann, aj) = c.nodes[0].join("k", "ann").await;
    let (mut bob, bj) = join_seen(&c.nodes[1], "k", "bob", &mut [&mut ann]).await;
    let bob_session = bj["session"].as_str().unwrap();
    let (status, body) = c.nodes[0]
        .post(
            &format!("/v1/rooms/k/members/{bob_session}/kick"),
            &json!({"message": "bye"}),
        )
        .await;
    assert_eq!(status, 204, "{body}");
    let closed = bob.recv_type("closed").await;
    assert_eq!(
        (&closed["reason"], &closed["message"]),
        (&json!("kicked"), &json!("bye"))
    );
    let (leave, _) = ann.recv_event("presence.leave").await;
    assert_eq!(
        (&leave["session"], &leave["reason"]),
        (&json!(bob_session), &json!("kicked"))
    );
    // Every node lists the same members.
    for node in &c.nodes {
        let listed = wait_until(|| async {
            let (_, list) = node.get("/v1/rooms/k/members").await;
            list["members"] == json!([aj["members"][0]])
        })
        .await;
        assert!(listed, "node {} still lists bob", node.node.id());
    }
}

/// Joins `room` as `name` over a compact connection to `node` (resuming when
/// `resume` is given); returns the client and its `joined`.
async fn join_compact(
    node: &TestServer,
    room: &str,
    name: &str,
    resume: Option<Value>,
) -> (Client, Value) {
    let (mut c, chosen) = Client::connect_offering(node.addr, "plaza.v1.compact").await;
    assert_eq!(chosen.as_deref(), Some("plaza.v1.compact"));
    let mut join = json!({"type": "join", "room": room, "name": name});
    if let Some(r) = resume {
        join["resume"] = r;
    }
    c.send(join).await;
    let (joined, _) = c.recv_until(|v| v["type"] == "joined").await;
    (c, joined)
}

#[tokio::test]
async fn a_compact_member_resumes_on_a_node_that_loads_the_room_from_a_snapshot_and_reads_it_by_that_nodes_key(
) {
    // The log keeps 300 entries: node-1 starts the room from a snapshot, so
    // most of what it replays comes from the snapshot's history.
    let config = ServerConfig {
        rate_limit_per_sec: 10_000,
        rate_limit_burst: 10_000,
        ..ServerConfig::default()
    };
    let c = cluster_on(MemoryCluster::with_log_capacity(300), 2, config).await;
    c.nodes[0].create_room(json!({"id": "k"})).await;
    let (mut ann, _) = c.nodes[0].join("k", "ann").await;
    let (bob, bob_joined) = join_compact(&c.nodes[0], "k", "bob", None).await;
    assert!(bob_joined["compact"]["alias"].is_u64(), "{bob_joined}");
    ann.recv_event("presence.join").await;
    drop(bob);
    ann.recv_event("presence.leave").await;
    for i in 0..400 {
        ann.send(json!({"type": "publish", "room": "k", "event": "m", "data": i}))
            .await;
    }
    let mut acked = Vec::new();
    for _ in 0..400 {
        let (ack, _) = ann.recv_until(|v| v["type"] == "ack").await;
        acked.push(ack["seq"].clone());
    }
    let resume = json!({"token": bob_joined["resume_token"], "last_seq": bob_joined["seq"]});
    let (mut bob, resumed) = join_compact(&c.nodes[1], "k", "bob", Some(resume)).await;
    assert_eq!(resumed["resumed"], true, "{resumed}");
    let key: plaza_protocol::compact::CompactKey =
        serde_json::from_value(resumed["compact"].clone()).unwrap();
    let rooms = [("k".to_owned(), key)];
    let mut got = Vec::new();
    while got.len() < acked.len() {
        let f = bob.recv().await;
        assert!(f.is_array(), "every missed message is compact: {f}");
        let e = plaza_protocol::compact::expand(f.to_string().as_bytes(), &rooms).unwrap();
        assert_eq!(e["room"], "k");
        assert_eq!(e["data"], json!(got.len()), "{e}");
        got.push(e["seq"].clone());
    }
    assert_eq!(got, acked, "every missed message once, in order");
    // And live ones by the same key.
    let (ack, _) = ann.publish("k", "m", json!("live")).await;
    let f = bob.recv().await;
    let e = plaza_protocol::compact::expand(f.to_string().as_bytes(), &rooms).unwrap();
    assert_eq!((&e["seq"], &e["data"]), (&ack["seq"], &json!("live")));
}

/// The records of `room`'s log whose join is one let through only to
/// resume (`resume_only`).
async fn resume_only_records(c: &Cluster, room: &str) -> usize {
    let log = c.hub.node("observer").read(room, 0, 10_000).await.unwrap();
    log.iter()
        .map(|e| serde_json::from_slice::<Value>(&e.payload).unwrap())
        .filter(|r| !r["intent"]["join"]["resume_only"].is_null())
        .count()
}

/// A join let through only to resume (keys, no token, no ticket) is written
/// to the log only when the node's replica holds the session it resumes, a
/// session without a user: a node of an earlier version, which does not
/// know `resume_only`, would apply any other such record as a new member.
/// A token of the wrong form is refused before any room is hosted for it.
#[tokio::test]
async fn a_join_only_to_resume_is_written_only_for_a_session_it_resumes() {
    use crate::auth::{claims, hs256, SECRET};
    let config = ServerConfig {
        jwt_secret: SECRET.into(),
        ..ServerConfig::default()
    };
    let c = cluster_with(2, config).await;
    c.nodes[0].create_room(json!({"id": "g"})).await;
    c.nodes[0]
        .create_room(json!({"id": "vip", "options": {"access": "ticket"}}))
        .await;
    let ticket = c.nodes[0].ticket("g", "guest", "xr").await;
    let mut guest = c.nodes[0].connect().await;
    guest.send(json!({"type": "join", "ticket": ticket})).await;
    let j = guest.recv_type("joined").await;
    let mut ann = c.nodes[0].connect().await;
    ann.send(json!({"type": "auth", "token": hs256(&claims("u-ann", json!({"g": ["*"]})))}))
        .await;
    assert_eq!(ann.recv().await["type"], "authed");
    ann.send(json!({"type": "join", "room": "g", "name": "ann"}))
        .await;
    let aj = ann.recv_type("joined").await;
    let resume = |room: &str, token: &Value| json!({"type": "join", "room": room, "resume": {"token": token, "last_seq": 0}});

    // A token of the wrong form: refused, and node-1 hosts no room for it.
    let mut c1 = c.nodes[1].connect().await;
    for junk in [
        json!("junk"),
        json!("A".repeat(33)),
        json!(format!("{}!", "A".repeat(31))),
    ] {
        c1.send(resume("g", &junk)).await;
        assert_eq!(c1.recv().await["code"], "token_required", "{junk}");
    }
    assert_eq!(c.nodes[1].node.hosted_rooms(), 0);
    // A token of the right form naming no session, and a user's session:
    // refused by node-1's replica, no record written.
    c1.send(resume("g", &json!("A".repeat(32)))).await;
    assert_eq!(c1.recv().await["code"], "token_required");
    c1.send(resume("g", &aj["resume_token"])).await;
    assert_eq!(c1.recv().await["code"], "token_required");
    // A ticket-only room: the room's own answer.
    c1.send(resume("vip", &json!("A".repeat(32)))).await;
    assert_eq!(c1.recv().await["code"], "ticket_required");
    assert_eq!(resume_only_records(&c, "g").await, 0);
    assert_eq!(resume_only_records(&c, "vip").await, 0);

    // The guest's session: written, and resumed on node-1, as ann sees.
    drop(guest);
    c1.send(resume("g", &j["resume_token"])).await;
    let r = c1.recv_type("joined").await;
    assert_eq!(
        (&r["resumed"], &r["session"]),
        (&json!(true), &j["session"]),
        "{r}"
    );
    assert_eq!(resume_only_records(&c, "g").await, 1);
    let members = r["members"].as_array().unwrap();
    assert_eq!(members.len(), 2, "no one else: {r}");
    // What it missed since seq 0: ann's join, nothing else.
    let missed = c1.drain().await;
    assert_eq!(missed.len(), 1, "{missed:?}");
    assert_eq!(missed[0]["member"]["user"], "u-ann", "{missed:?}");
}

/// The server API on any node: a publish on a node that hosts nothing
/// reaches members on the others once; a user is messaged and disconnected
/// on every node by a call to one.
#[tokio::test]
async fn the_server_api_acts_on_every_node() {
    let secret = "cluster-server-api-secret-of-32-bytes-or-more";
    let config = ServerConfig {
        jwt_secret: secret.into(),
        ..Default::default()
    };
    let c = cluster_with(3, config).await;
    c.nodes[0].create_room(json!({"id": "r"})).await;
    let token = |sub: &str| {
        let claims = json!({"sub": sub, "exp": crate::support::now_ms() / 1000 + 600,
            "rooms": {"*": ["join", "publish"]}});
        jsonwebtoken::encode(
            &jsonwebtoken::Header::new(jsonwebtoken::Algorithm::HS256),
            &claims,
            &jsonwebtoken::EncodingKey::from_secret(secret.as_bytes()),
        )
        .unwrap()
    };
    let mut members = Vec::new();
    for (node, sub) in [(0, "u1"), (1, "u1"), (1, "u2")] {
        let mut m = c.nodes[node].connect().await;
        m.send(json!({"type": "auth", "token": token(sub)})).await;
        m.recv_type("authed").await;
        m.send(json!({"type": "join", "room": "r", "name": sub}))
            .await;
        m.recv_type("joined").await;
        members.push(m);
    }
    // Everyone saw everyone join.
    members[0].recv_event("presence.join").await;
    members[0].recv_event("presence.join").await;
    members[1].recv_event("presence.join").await;

    // The room's calls take an admin token on a node with keys and no API key.
    let admin_claims = json!({"sub": "backend", "exp": crate::support::now_ms() / 1000 + 600,
        "rooms": {"r": ["admin"]}});
    let admin = jsonwebtoken::encode(
        &jsonwebtoken::Header::new(jsonwebtoken::Algorithm::HS256),
        &admin_claims,
        &jsonwebtoken::EncodingKey::from_secret(secret.as_bytes()),
    )
    .unwrap();
    let as_admin = |node: usize, path: &str, body: Value| {
        let s = &c.nodes[node];
        let req = s.http.post(s.url(path)).bearer_auth(&admin).json(&body);
        async move {
            let r = req.send().await.unwrap();
            (r.status().as_u16(), r.json::<Value>().await.unwrap())
        }
    };
    let body = json!({"event": "news", "data": 1, "idempotency_key": "k"});
    let (status, v) = as_admin(2, "/v1/rooms/r/publish", body.clone()).await;
    assert_eq!(status, 200, "{v}");
    let (status, again) = as_admin(1, "/v1/rooms/r/publish", body).await;
    assert_eq!(
        (status, &again["seq"], &again["duplicate"]),
        (200, &v["seq"], &json!(true))
    );
    for m in members.iter_mut() {
        let (ev, _) = m.recv_event("message").await;
        assert_eq!((&ev["seq"], &ev["from"]), (&v["seq"], &json!("@server")));
    }
    for m in members.iter_mut() {
        assert_eq!(m.drain().await, Vec::<Value>::new(), "delivered once");
    }

    let (status, _) = c.nodes[2]
        .post("/v1/users/u1/direct", &json!({"event": "ping"}))
        .await;
    assert_eq!(status, 202);
    for m in members[..2].iter_mut() {
        let d = m.recv_type("direct").await;
        assert_eq!(
            (&d["from"], &d["event"]),
            (&json!("@server"), &json!("ping"))
        );
    }
    let (status, _) = c.nodes[0]
        .post("/v1/users/u1/disconnect", &json!({"reason": "bye"}))
        .await;
    assert_eq!(status, 202);
    for m in members[..2].iter_mut() {
        let (closed, _) = m.recv_until(|f| f["type"] == "closed").await;
        assert_eq!(
            (&closed["reason"], &closed["message"]),
            (&json!("kicked"), &json!("bye"))
        );
    }
    // u2 is left, and sees the two leave.
    for _ in 0..2 {
        let (leave, _) = members[2].recv_event("presence.leave").await;
        assert_eq!(leave["reason"], "kicked");
    }
    let frames = members[2].drain().await;
    assert!(
        !frames
            .iter()
            .any(|f| f["type"] == "direct" || f["type"] == "closed"),
        "{frames:?}"
    );
}

/// The entities of a `joined` or `resync` frame's snapshot, by kind and data.
fn entities(frame: &Value) -> Vec<(Value, Value)> {
    let mut v: Vec<(Value, Value)> = frame["snapshot"]["entities"]
        .as_array()
        .unwrap_or_else(|| panic!("no entities: {frame}"))
        .iter()
        .map(|e| (e["kind"].clone(), e["data"].clone()))
        .collect();
    v.sort_by_key(|e| e.1.to_string());
    v
}

/// Checks that `a` and `b`, members on two nodes, see the room at the same
/// seqs: `a` publishes `tag`, `b` gets it at the seq of `a`'s ack.
async fn same_seqs(room: &str, tag: &str, a: &mut Client, b: &mut Client) {
    let (ack, _) = a.publish(room, "m", json!(tag)).await;
    let (ev, _) = b
        .recv_until(|v| v["type"] == "event" && v["kind"] == "message" && v["data"] == tag)
        .await;
    assert_eq!(ev["seq"], ack["seq"], "{ev} {ack}");
}

/// The names in a `joined` or `resync` frame's `members`, sorted.
fn names(frame: &Value) -> Vec<String> {
    let mut v: Vec<String> = frame["members"]
        .as_array()
        .unwrap_or_else(|| panic!("no members: {frame}"))
        .iter()
        .map(|m| m["name"].as_str().unwrap().to_owned())
        .collect();
    v.sort();
    v
}

#[tokio::test]
async fn a_log_that_went_back_closes_its_nodes_connections_with_4005_and_they_follow_the_new_history(
) {
    // A broker failover loses the last entries of a room's log (issue 38,
    // "the log going back"), after node-0 and node-1 applied them and their
    // members saw them. The log goes on with other entries at the same
    // positions, hence under the same seqs: both nodes tell it from the
    // first of them, close their members' connections with 4005 (join
    // again, do not resume) and rebuild the room from the broker.
    let c = cluster(3).await;
    c.nodes[0].create_room(json!({"id": "rw"})).await;
    let (mut ann, ann_joined) = c.nodes[0].join("rw", "ann").await;
    let (mut bob, _) = join_seen(&c.nodes[1], "rw", "bob", &mut [&mut ann]).await;
    ann.publish("rw", "m", json!("kept")).await;
    bob.recv_event("message").await;
    let k = c.hub.log_end("rw").unwrap();

    // Entries after k: applied by both nodes, seen by both members, lost.
    let (r, _) = ann
        .request(
            "rw",
            json!(1),
            "entity.create",
            json!({"kind": "note", "data": {"history": "lost"}}),
        )
        .await;
    assert_eq!(r["ok"], true, "{r}");
    bob.recv_event("entity.created").await;
    let (lost, _) = ann.publish("rw", "m", json!("lost")).await;
    bob.recv_event("message").await;
    c.hub.rewind_log("rw", k);

    // The new history, from node-2 (which never hosted the room): cid's
    // join takes position k + 1.
    let (mut cid, cid_joined) = c.nodes[2].join("rw", "cid").await;
    assert_eq!(entities(&cid_joined), vec![], "{cid_joined}");
    assert_eq!(ann.closed().await, Closed::Code(4005));
    assert_eq!(bob.closed().await, Closed::Code(4005));
    // Their sessions left the room (they were in the new history too).
    for _ in 0..2 {
        let (left, _) = cid.recv_event("presence.leave").await;
        assert_eq!(left["reason"], "left", "{left}");
    }
    let (r, _) = cid
        .request(
            "rw",
            json!(2),
            "entity.create",
            json!({"kind": "note", "data": {"history": "new"}}),
        )
        .await;
    assert_eq!(r["ok"], true, "{r}");
    for (i, n) in [(0, 1.0), (1, 1.0), (2, 0.0)] {
        assert_eq!(
            c.nodes[i].metric("plaza_log_regressions_total").await,
            Some(n),
            "node-{i}"
        );
    }

    // A client that resumes anyway is told: its session is gone.
    let (mut ann, resync) = c.nodes[0]
        .join_with(json!({"type": "join", "room": "rw", "name": "ann",
            "resume": {"token": ann_joined["resume_token"], "last_seq": lost["seq"]}}))
        .await;
    assert_eq!(resync["type"], "resync", "{resync}");
    assert_eq!(resync["reason"], "session_expired", "{resync}");
    let new = vec![(json!("note"), json!({"history": "new"}))];
    assert_eq!(entities(&resync), new, "{resync}");
    // node-0 and node-1 now hold the new history: the same state and seqs
    // as node-2, which only ever knew that one.
    let (mut dan, dan_joined) = c.nodes[1].join("rw", "dan").await;
    assert_eq!(entities(&dan_joined), new, "{dan_joined}");
    let (mut eve, eve_joined) = c.nodes[2].join("rw", "eve").await;
    assert_eq!(entities(&eve_joined), new, "{eve_joined}");
    assert_eq!(names(&dan_joined), ["ann", "cid", "dan"]);
    assert_eq!(names(&eve_joined), ["ann", "cid", "dan", "eve"]);
    same_seqs("rw", "1", &mut eve, &mut ann).await;
    same_seqs("rw", "2", &mut ann, &mut dan).await;
    same_seqs("rw", "3", &mut dan, &mut cid).await;
}

#[tokio::test]
async fn a_log_that_went_back_in_a_room_nobody_publishes_in_is_caught_when_the_nodes_subscribe_again(
) {
    // The failover loses the room's last entries and nothing is appended
    // afterwards: no entry ever reaches a lost position. The nodes tell
    // from the log's end, before the last entry they applied, on the
    // catch-up that follows their subscribing again.
    let c = cluster(2).await;
    c.nodes[0].create_room(json!({"id": "rw"})).await;
    let (mut ann, _) = c.nodes[0].join("rw", "ann").await;
    let (mut bob, _) = join_seen(&c.nodes[1], "rw", "bob", &mut [&mut ann]).await;
    ann.publish("rw", "m", json!("kept")).await;
    bob.recv_event("message").await;
    let k = c.hub.log_end("rw").unwrap();
    ann.publish("rw", "m", json!("lost")).await;
    bob.recv_event("message").await;
    c.hub.set_available(false);
    c.hub.rewind_log("rw", k);
    c.hub.set_available(true);
    assert_eq!(ann.closed().await, Closed::Code(4005));
    assert_eq!(bob.closed().await, Closed::Code(4005));
    for node in &c.nodes {
        assert_eq!(node.metric("plaza_log_regressions_total").await, Some(1.0));
    }
    // Both rebuilt the room from the new history: their sessions left it.
    let (cid, cid_joined) = c.nodes[1].join("rw", "cid").await;
    assert_eq!(names(&cid_joined), ["cid"], "{cid_joined}");
    drop(cid);
}

#[tokio::test]
async fn a_log_that_went_back_and_on_past_a_node_is_caught_on_its_catch_up() {
    // node-0 hears nothing while the log goes back and on past what it
    // applied: entries after its position would apply on top of the lost
    // ones. Its catch-up reads from the last entry it applied and finds
    // another one there.
    let c = cluster(2).await;
    c.nodes[0].create_room(json!({"id": "rw"})).await;
    let (mut ann, _) = c.nodes[0].join("rw", "ann").await;
    ann.publish("rw", "m", json!("kept")).await;
    let k = c.hub.log_end("rw").unwrap();
    ann.publish("rw", "m", json!("lost 1")).await;
    ann.publish("rw", "m", json!("lost 2")).await;
    c.hub.set_deaf("node-0", true);
    c.hub.rewind_log("rw", k);
    let (mut bob, _) = c.nodes[1].join("rw", "bob").await;
    for i in 0..3 {
        bob.publish("rw", "m", json!(i)).await;
    }
    c.hub.set_deaf("node-0", false);
    // The next entry shows node-0 a gap.
    bob.publish("rw", "m", json!(3)).await;
    assert_eq!(ann.closed().await, Closed::Code(4005));
    assert_eq!(
        c.nodes[0].metric("plaza_log_regressions_total").await,
        Some(1.0)
    );
    let (left, _) = bob.recv_event("presence.leave").await;
    assert_eq!(left["reason"], "left", "{left}");
    let (mut cid, cid_joined) = c.nodes[0].join("rw", "cid").await;
    assert_eq!(names(&cid_joined), ["bob", "cid"], "{cid_joined}");
    bob.recv_event("presence.join").await;
    same_seqs("rw", "1", &mut bob, &mut cid).await;
    same_seqs("rw", "2", &mut cid, &mut bob).await;
}
