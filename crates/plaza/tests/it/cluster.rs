//! Cluster mode with real processes: redis-server, three `plaza serve
//! --redis` nodes and nginx on loopback (scripts/test.sh installs the
//! packages). A node is killed, drained and Redis restarted while members
//! publish; every acknowledged message must reach every member exactly once.

use std::path::PathBuf;
use std::time::Duration;

use crate::cluster_support::{assert_exactly_once, next_frame, Member};
use plaza_launch::{ClusterOptions, LbKind, LocalCluster};
use serde_json::{json, Value};

const LIMIT: Duration = Duration::from_secs(60);

fn start(nodes: usize, name: &str) -> (LocalCluster, tempfile::TempDir) {
    let dir = tempfile::Builder::new()
        .prefix(&format!("plaza-{name}-"))
        .tempdir()
        .unwrap();
    let cluster = LocalCluster::start(ClusterOptions {
        plaza_bin: PathBuf::from(env!("CARGO_BIN_EXE_plaza")),
        nodes,
        lb: LbKind::Nginx,
        listen_port: 0,
        dir: dir.path().to_owned(),
        node_args: vec!["--auto-create-rooms".into()],
        embedded: false,
        cpu_quotas: Default::default(),
        lb_workers: None,
        node_ports: None,
    })
    .unwrap_or_else(|e| {
        panic!(
            "cannot start the cluster (run scripts/test.sh to install redis-server and nginx): {e}"
        )
    });
    (cluster, dir)
}

fn ws_url(http: &str, room: &str) -> String {
    format!("{}/v1/ws?room={room}", http.replacen("http://", "ws://", 1))
}

/// Publishes `count` messages as `m`, `ids` prefixed with its name, reading
/// between publishes; returns once all are acknowledged.
async fn publish_all(m: &mut Member, count: usize, on_ack: impl Fn(usize)) {
    for i in 0..count {
        let id = format!("{}-{i}", m.name);
        m.publish(&id, json!(id)).await;
        // At most one publish in flight: read (and reconnect if the node
        // is gone) until the previous one is acknowledged.
        m.pump_until(LIMIT, |m| m.acked.len() >= i).await;
        on_ack(m.acked.len());
    }
    m.pump_until(LIMIT, |m| m.all_acked()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_nodes_members_resume_elsewhere_and_nothing_acknowledged_is_lost() {
    let (mut cluster, _dir) = start(3, "kill");
    let room = "kill";
    let lb = ws_url(&cluster.url(), room);
    // Two members through the load balancer: the room hashes to one node.
    let a = Member::join(&lb, room, "a").await;
    let b = Member::join(&lb, room, "b").await;
    assert_eq!(a.node, b.node, "one room, one node behind the balancer");
    let victim = cluster
        .nodes()
        .iter()
        .position(|n| n.id() == a.node)
        .expect("a node of the cluster");
    let others: Vec<usize> = (0..3).filter(|&i| i != victim).collect();
    // One member straight on each other node, so the room spans the cluster.
    let c = Member::join(&ws_url(&cluster.node(others[0]).url(), room), room, "c").await;
    let d = Member::join(&ws_url(&cluster.node(others[1]).url(), room), room, "d").await;
    // A lock holder on the victim that never comes back.
    let mut h = Member::join(&ws_url(&cluster.node(victim).url(), room), room, "h").await;
    h.send(json!({"type": "request", "room": room, "nonce": 1, "op": "lock.acquire", "args": {"object": "obj", "ttl_ms": 600000}}))
        .await;
    h.pump_until(LIMIT, |h| h.responses.contains_key(&1)).await;
    assert_eq!(h.responses[&1]["ok"], true, "{:?}", h.responses[&1]);

    const N: usize = 30;
    let (kill_tx, mut kill_rx) = tokio::sync::watch::channel(0usize);
    let tasks: Vec<_> = [a, b, c, d]
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
    // Kill the room's node a third of the way in.
    kill_rx.wait_for(|&acked| acked >= N / 3).await.unwrap();
    cluster.kill_node(victim).unwrap();
    drop(h);
    let mut members = Vec::new();
    for t in tasks {
        members.push(t.await.unwrap());
    }
    // Everyone reads until it holds every acknowledged message of the others.
    let expected: usize = members.iter().map(|m| m.acked.len()).sum();
    assert_eq!(expected, 4 * N, "every publish was acknowledged in the end");
    for m in members.iter_mut() {
        let want = expected - m.acked.len();
        m.pump_until(LIMIT, |m| m.received.len() >= want).await;
    }
    assert!(
        members[0].reconnects >= 1 && members[1].reconnects >= 1,
        "a and b were on the killed node"
    );
    assert_ne!(
        members[0].node,
        cluster.node(victim).id(),
        "a resumed on a live node"
    );
    let refs: Vec<&Member> = members.iter().collect();
    assert_exactly_once(&refs);

    // The dead node's lock holder is gone: its lock becomes free.
    let d = &mut members[3];
    let nonce = 100;
    d.pump_until(LIMIT, |d| {
        d.events
            .iter()
            .any(|e| e["kind"] == "lock.released" && e["object"] == "obj")
    })
    .await;
    d.send(json!({"type": "request", "room": room, "nonce": nonce, "op": "lock.acquire", "args": {"object": "obj"}}))
        .await;
    d.pump_until(LIMIT, |d| d.responses.contains_key(&nonce))
        .await;
    assert_eq!(d.responses[&nonce]["ok"], true, "{:?}", d.responses[&nonce]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_restart_gives_clear_errors_then_everything_flows_again() {
    let (mut cluster, _dir) = start(2, "redis");
    let room = "rr";
    let mut a = Member::join(&ws_url(&cluster.node(0).url(), room), room, "a").await;
    let mut b = Member::join(&ws_url(&cluster.node(1).url(), room), room, "b").await;
    a.publish("a-0", json!("a-0")).await;
    a.pump_until(LIMIT, |a| a.all_acked()).await;
    b.pump_until(LIMIT, |b| b.received.len() == 1).await;

    cluster.redis_mut().unwrap().stop().unwrap();
    a.publish("a-1", json!("a-1")).await;
    a.pump_until(LIMIT, |a| !a.errors.is_empty()).await;
    let e = &a.errors[0];
    assert_eq!(e["code"], "broker_unavailable", "{e}");
    assert_eq!(e["ref"]["id"], "a-1", "{e}");

    cluster.redis_mut().unwrap().restart().unwrap();
    // The nodes reconnect and resubscribe on their own; a retry lands once.
    ack_with_retries(&mut a).await;
    b.publish("b-0", json!("b-0")).await;
    ack_with_retries(&mut b).await;
    b.pump_until(LIMIT, |b| b.received.len() == 2).await;
    a.pump_until(LIMIT, |a| a.received.len() == 1).await;
    assert_exactly_once(&[&a, &b]);
}

/// Retries `m`'s unacknowledged publishes (same ids) while the node answers
/// `broker_unavailable`, as a client would after an outage.
async fn ack_with_retries(m: &mut Member) {
    let mut attempts = 0;
    while !m.all_acked() {
        m.pump_until(LIMIT, |m| m.all_acked() || !m.errors.is_empty())
            .await;
        for e in m.errors.drain(..) {
            assert_eq!(e["code"], "broker_unavailable", "{e}");
        }
        if !m.all_acked() {
            attempts += 1;
            assert!(
                attempts < 50,
                "{}: never acknowledged after the restart",
                m.name
            );
            // A client's backoff while the node reconnects to Redis.
            tokio::time::sleep(Duration::from_millis(200)).await;
            m.resend_unacked().await;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drained_nodes_members_move_without_loss() {
    let (mut cluster, _dir) = start(2, "drain");
    let room = "drain";
    let lb = ws_url(&cluster.url(), room);
    let mut a = Member::join(&lb, room, "a").await;
    let mut b = Member::join(&lb, room, "b").await;
    let drained = cluster
        .nodes()
        .iter()
        .position(|n| n.id() == a.node)
        .unwrap();
    let other = 1 - drained;
    let mut p = Member::join(&ws_url(&cluster.node(other).url(), room), room, "p").await;
    for i in 0..10 {
        p.publish(&format!("p-{i}"), json!(format!("p-{i}"))).await;
    }
    p.pump_until(LIMIT, |p| p.all_acked()).await;
    cluster.terminate_node(drained).unwrap();
    for i in 10..20 {
        p.publish(&format!("p-{i}"), json!(format!("p-{i}"))).await;
    }
    p.pump_until(LIMIT, |p| p.all_acked()).await;
    for m in [&mut a, &mut b] {
        m.pump_until(LIMIT, |m| m.received.len() == 20).await;
        assert!(m.reconnects >= 1, "{} was moved", m.name);
        assert_eq!(
            m.node,
            cluster.node(other).id(),
            "{} resumed on the other node",
            m.name
        );
    }
    let exit = cluster
        .node_mut(drained)
        .wait_exit(Duration::from_secs(20))
        .unwrap();
    assert!(
        exit.is_some_and(|s| s.success()),
        "the drained node exits cleanly: {exit:?}"
    );
    assert_exactly_once(&[&a, &b, &p]);
}

/// A POST with a JSON body over a plain TCP connection; returns status and body.
async fn post_json(
    addr: std::net::SocketAddr,
    path: &str,
    body: &serde_json::Value,
) -> (u16, serde_json::Value) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let body = body.to_string();
    let mut tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let head = format!(
        "POST {path} HTTP/1.1\r\nHost: plaza\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    tcp.write_all(head.as_bytes()).await.unwrap();
    tcp.write_all(body.as_bytes()).await.unwrap();
    let mut out = String::new();
    tcp.read_to_string(&mut out).await.unwrap();
    let status = out[9..12].parse().unwrap();
    let json = out.split("\r\n\r\n").nth(1).unwrap_or_default();
    (
        status,
        serde_json::from_str(json).unwrap_or(serde_json::Value::Null),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tickets_and_locks_hold_across_real_nodes() {
    let (cluster, _dir) = start(2, "tickets");
    let (status, _) = post_json(
        cluster.node(0).addr(),
        "/v1/rooms",
        &json!({"id": "vip", "options": {"access": "ticket"}}),
    )
    .await;
    assert_eq!(status, 201);
    let (status, t) = post_json(
        cluster.node(0).addr(),
        "/v1/rooms/vip/tickets",
        &json!({"name": "ann"}),
    )
    .await;
    assert_eq!(status, 201, "{t}");
    // Redeemed on the other node, once.
    let url = ws_url(&cluster.node(1).url(), "vip");
    let (mut ws, _) = tokio_tungstenite::connect_async(url.as_str())
        .await
        .unwrap();
    use futures_util::SinkExt;
    use tokio_tungstenite::tungstenite::Message;
    let join = json!({"type": "join", "ticket": t["ticket"]});
    ws.send(Message::text(join.to_string())).await.unwrap();
    let joined = tokio::time::timeout(LIMIT, next_frame(&mut ws))
        .await
        .expect("an answer to the join")
        .unwrap();
    assert_eq!(joined["type"], "joined", "{joined}");
    let (mut again, _) =
        tokio_tungstenite::connect_async(ws_url(&cluster.node(0).url(), "vip").as_str())
            .await
            .unwrap();
    again.send(Message::text(join.to_string())).await.unwrap();
    let refused = tokio::time::timeout(LIMIT, next_frame(&mut again))
        .await
        .expect("an answer to the join")
        .unwrap();
    assert_eq!(refused["code"], "ticket_used", "{refused}");

    // Two members on two nodes race for one lock: exactly one gets it.
    let room = "locks";
    let mut a = Member::join(&ws_url(&cluster.node(0).url(), room), room, "a").await;
    let mut b = Member::join(&ws_url(&cluster.node(1).url(), room), room, "b").await;
    for (m, nonce) in [(&mut a, 1u64), (&mut b, 2u64)] {
        m.send(json!({"type": "request", "room": room, "nonce": nonce, "op": "lock.acquire", "args": {"object": "o"}}))
            .await;
    }
    a.pump_until(LIMIT, |m| m.responses.contains_key(&1)).await;
    b.pump_until(LIMIT, |m| m.responses.contains_key(&2)).await;
    let (ra, rb) = (&a.responses[&1], &b.responses[&2]);
    assert_eq!(
        [ra, rb].iter().filter(|r| r["ok"] == true).count(),
        1,
        "{ra} {rb}"
    );
    let loser = if ra["ok"] == true { rb } else { ra };
    assert_eq!(loser["error"]["code"], "lock_held", "{loser}");
}

/// A spatial room with its members on two real nodes over real Redis: every
/// replica reaches the same decisions, so both members get the one
/// `proximity.enter` (same pair, same initiator) and the one `proximity.leave`,
/// both decided on ticks while someone walks (between messages).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spatial_rooms_decide_proximity_once_across_real_nodes() {
    let (cluster, _dir) = start(2, "spatial");
    let room = "plaza-space";
    let (status, body) = post_json(
        cluster.node(0).addr(),
        "/v1/rooms",
        &json!({"id": room, "options": {"space": {"min_dwell_ms": 0, "tick_ms": 20, "width": 100000, "height": 100000}}}),
    )
    .await;
    assert_eq!(status, 201, "{body}");
    let kind_of = |m: &Member, kind: &str| -> Option<Value> {
        m.events.iter().find(|e| e["kind"] == kind).cloned()
    };
    let mut a = Member::join(&ws_url(&cluster.node(0).url(), room), room, "a").await;
    // a steps into a corner; b joins in the middle, out of sight.
    a.send(json!({"type": "request", "room": room, "nonce": 1, "op": "space.jump", "args": {"to": [10, 10]}}))
        .await;
    a.pump_until(LIMIT, |m| m.responses.contains_key(&1)).await;
    let mut b = Member::join(&ws_url(&cluster.node(1).url(), room), room, "b").await;
    assert_ne!(a.node, b.node, "one member on each node");
    b.send(json!({"type": "request", "room": room, "nonce": 4, "op": "space.jump", "args": {"to": [5000, 5000]}}))
        .await;
    b.pump_until(LIMIT, |m| m.responses.contains_key(&4)).await;
    // b walks to a: the replicas see them come close on a tick.
    b.send(json!({"type": "request", "room": room, "nonce": 2, "op": "space.move", "args": {"to": [20, 10], "speed": 10000}}))
        .await;
    a.pump_until(LIMIT, |m| kind_of(m, "proximity.enter").is_some())
        .await;
    b.pump_until(LIMIT, |m| kind_of(m, "proximity.enter").is_some())
        .await;
    let (ea, eb) = (
        kind_of(&a, "proximity.enter").unwrap(),
        kind_of(&b, "proximity.enter").unwrap(),
    );
    assert_eq!(ea, eb, "one frame for both, from two replicas");
    let initiator = a.session.clone().min(b.session.clone());
    assert_eq!(ea["initiator"], initiator.as_str());
    // a walks away: the pair leaves proximity on a tick, once, for both.
    a.send(json!({"type": "request", "room": room, "nonce": 3, "op": "space.move", "args": {"to": [3000, 3000], "speed": 3000}}))
        .await;
    a.pump_until(LIMIT, |m| kind_of(m, "proximity.leave").is_some())
        .await;
    b.pump_until(LIMIT, |m| kind_of(m, "proximity.leave").is_some())
        .await;
    for (m, nonce) in [(&a, 1u64), (&b, 2), (&a, 3), (&b, 4)] {
        assert_eq!(m.responses[&nonce]["ok"], true, "{}", m.responses[&nonce]);
    }
    let (la, lb) = (
        kind_of(&a, "proximity.leave").unwrap(),
        kind_of(&b, "proximity.leave").unwrap(),
    );
    assert_eq!(la, lb);
    assert_eq!(la["pair"], ea["pair"]);
    for m in [&a, &b] {
        let leaves = m
            .events
            .iter()
            .filter(|e| e["kind"] == "proximity.leave")
            .count();
        assert_eq!(leaves, 1, "{}: {:?}", m.name, m.events);
    }
}
