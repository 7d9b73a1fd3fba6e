//! Cluster mode with real processes: redis-server, three `plaza serve
//! --redis` nodes and nginx on loopback (scripts/test.sh installs the
//! packages). A node is killed, drained and Redis restarted while members
//! publish; every acknowledged message must reach every member exactly once,
//! and a delivery policy holds across nodes and survives its node's death.

use std::time::Duration;

use crate::cluster_support::{assert_exactly_once, next_frame, start_cluster, ws_url, Member};
use plaza_launch::{LbKind, LocalCluster};
use serde_json::{json, Value};

const LIMIT: Duration = Duration::from_secs(60);

fn start(nodes: usize, name: &str) -> (LocalCluster, tempfile::TempDir) {
    start_behind(nodes, LbKind::Nginx, name)
}

/// [`start`] behind the balancer `lb`.
fn start_behind(nodes: usize, lb: LbKind, name: &str) -> (LocalCluster, tempfile::TempDir) {
    start_cluster(name, nodes, lb, &[], false)
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
        // The draining node may still deliver all 20 before it closes the
        // member: the move is the event awaited, not the messages.
        m.pump_until(LIMIT, |m| m.received.len() == 20 && m.reconnects >= 1)
            .await;
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
    let (status, _, json) = http_call(addr, "POST", path, Some(body)).await;
    (status, json)
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
    // A barrier for late duplicates: a stops (a jump ends its walk, so no
    // later tick decides anything), then says something; the log orders
    // every tick before that message, and both members wait for it.
    a.send(json!({"type": "request", "room": room, "nonce": 5, "op": "space.jump", "args": {"to": [3000, 3000]}}))
        .await;
    a.pump_until(LIMIT, |m| m.responses.contains_key(&5)).await;
    a.send(json!({"type": "publish", "room": room, "event": "barrier", "data": 1, "echo": true}))
        .await;
    let heard = |m: &Member| m.received.values().any(|(_, d)| *d == json!(1));
    a.pump_until(LIMIT, heard).await;
    b.pump_until(LIMIT, heard).await;
    for (m, nonce) in [(&a, 1u64), (&b, 2), (&a, 3), (&b, 4), (&a, 5)] {
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

/// The next text frame on `ws` within `limit`; panics on a timeout or when
/// the connection ends (`what` says whose connection).
async fn frame_within(ws: &mut crate::cluster_support::Ws, limit: Duration, what: &str) -> Value {
    match tokio::time::timeout(limit, next_frame(ws)).await {
        Ok(Ok(v)) => v,
        Ok(Err(e)) => panic!("{what}: the connection ended: {e}"),
        Err(_) => panic!("{what}: no frame within {limit:?}"),
    }
}

/// Connects to `url`, sends `join` and returns the connection, the node it
/// landed on (`x-plaza-node`) and the answer; retries a failed connect (a
/// load balancer noticing a dead node) until `limit`.
async fn join_raw(
    url: &str,
    join: &Value,
    limit: Duration,
) -> (crate::cluster_support::Ws, String, Value) {
    use futures_util::SinkExt;
    use tokio_tungstenite::tungstenite::Message;
    let deadline = std::time::Instant::now() + limit;
    let mut wait = Duration::from_millis(20);
    loop {
        let attempt = async {
            let (mut ws, response) = tokio_tungstenite::connect_async(url)
                .await
                .map_err(|e| format!("connect {url}: {e}"))?;
            let node = response
                .headers()
                .get("x-plaza-node")
                .and_then(|v| v.to_str().ok())
                .unwrap_or_default()
                .to_owned();
            ws.send(Message::text(join.to_string()))
                .await
                .map_err(|e| e.to_string())?;
            let answer = next_frame(&mut ws).await?;
            Ok::<_, String>((ws, node, answer))
        };
        match tokio::time::timeout(
            deadline.saturating_duration_since(std::time::Instant::now()),
            attempt,
        )
        .await
        {
            Ok(Ok(r)) => return r,
            Ok(Err(e)) => assert!(
                std::time::Instant::now() < deadline,
                "no join through {url} within {limit:?}: {e}"
            ),
            Err(_) => panic!("no answer to the join through {url} within {limit:?}"),
        }
        // Backoff between attempts while the balancer notices the dead node.
        tokio::time::sleep(wait).await;
        wait = (wait * 2).min(Duration::from_millis(500));
    }
}

/// A member with a delivery policy (`max_held: 5`, Volume only) on the node
/// its room hashes to, fed by a publisher on another node: it gets nothing
/// until five events are held, then one `batch` of the five. Its node is
/// killed (SIGKILL) while it holds two: those never reached it, and its resume
/// through the balancer, on a live node, replays exactly them, once, as
/// events; its policy (the room's state, on every node) still holds there.
///
/// The room has `presence: false`: the node's death and the resume then add
/// no presence events, so the member's stream is exactly the publisher's
/// messages whatever the timing of the cluster noticing the death.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delivery_policy_holds_across_real_nodes_and_survives_its_nodes_death() {
    const STEP: Duration = Duration::from_secs(15);
    let (mut cluster, _dir) = start(3, "policy");
    let room = "held";
    let (status, body) = post_json(
        cluster.node(0).addr(),
        "/v1/rooms",
        &json!({"id": room, "options": {"presence": false}}),
    )
    .await;
    assert_eq!(status, 201, "{body}");
    let lb = ws_url(&cluster.url(), room);

    // h, through the balancer, lands on the room's node: the victim.
    let (mut h, h_node, joined) = join_raw(
        &lb,
        &json!({"type": "join", "room": room, "name": "h", "policy": {"max_held": 5}}),
        STEP,
    )
    .await;
    assert_eq!(joined["type"], "joined", "{joined}");
    assert_eq!(joined["resumed"], false, "{joined}");
    let h_session = joined["session"].as_str().unwrap().to_owned();
    let h_token = joined["resume_token"].clone();
    let victim = cluster
        .nodes()
        .iter()
        .position(|n| n.id() == h_node)
        .unwrap_or_else(|| panic!("h landed on {h_node:?}, not a node of the cluster"));
    let others: Vec<usize> = (0..3).filter(|&i| i != victim).collect();
    // q, without a policy, on h's node: when q has an event, h's node has
    // routed it to h too (held, or sent before q's).
    let mut q = Member::join(&ws_url(&cluster.node(victim).url(), room), room, "q").await;
    // p publishes from a second node, w listens on the third.
    let mut p = Member::join(&ws_url(&cluster.node(others[0]).url(), room), room, "p").await;
    let mut w = Member::join(&ws_url(&cluster.node(others[1]).url(), room), room, "w").await;
    assert_eq!(q.node, h_node);
    assert_eq!(p.node, cluster.node(others[0]).id());
    assert_eq!(w.node, cluster.node(others[1]).id());

    // Publishes ids `from..to` as p, one at a time, each acknowledged; returns their seqs.
    async fn publish(p: &mut Member, from: usize, to: usize) -> Vec<u64> {
        let mut seqs = Vec::new();
        for i in from..to {
            let id = format!("p-{i}");
            p.publish(&id, json!(id)).await;
            p.pump_until(STEP, |p| p.all_acked()).await;
            seqs.push(p.acked[&id]);
        }
        seqs
    }
    // The message events `seqs` in order, each p's, each carrying its id.
    let check_messages = |frames: &[Value], seqs: &[u64], first_id: usize, p_session: &str| {
        let got: Vec<u64> = frames.iter().map(|e| e["seq"].as_u64().unwrap()).collect();
        assert_eq!(got, seqs, "{frames:?}");
        for (i, e) in frames.iter().enumerate() {
            assert_eq!(e["type"], "event", "{e}");
            assert_eq!(e["room"], room, "{e}");
            assert_eq!(e["kind"], "message", "{e}");
            assert_eq!(e["from"], p_session, "{e}");
            assert_eq!(e["data"], json!(format!("p-{}", first_id + i)), "{e}");
        }
    };
    let p_session = p.session.clone();

    // 1. Three messages: w (no policy, another node) and q (no policy, h's
    // node) get each at once; h holds them.
    let first = publish(&mut p, 0, 3).await;
    assert!(
        first.windows(2).all(|s| s[1] == s[0] + 1),
        "one publisher alone in the room: consecutive seqs {first:?}"
    );
    for m in [&mut w, &mut q] {
        m.pump_until(STEP, |m| m.received.len() == 3).await;
        assert_eq!(
            m.received.keys().copied().collect::<Vec<_>>(),
            first,
            "{}",
            m.name
        );
    }
    // 2. Two more: the fifth held makes one batch of the five, in seq order.
    // It is h's first frame since `joined`: nothing went out before it.
    let second = publish(&mut p, 3, 5).await;
    let batch = frame_within(&mut h, STEP, "h").await;
    assert_eq!(
        batch["type"], "batch",
        "h's first frame is the batch: {batch}"
    );
    assert_eq!(batch["room"], room, "{batch}");
    let five: Vec<u64> = first.iter().chain(&second).copied().collect();
    check_messages(batch["events"].as_array().unwrap(), &five, 0, &p_session);
    let last_seq = five[4];

    // 3. Two more, held on h's node (q has them, so that node routed them to
    // h); then that node dies without a word.
    let held = publish(&mut p, 5, 7).await;
    q.pump_until(STEP, |m| m.received.len() == 7).await;
    w.pump_until(STEP, |m| m.received.len() == 7).await;
    cluster.kill_node(victim).unwrap();
    q.drop_connection();
    // h's connection ends with nothing more on it: the two were held.
    match tokio::time::timeout(STEP, next_frame(&mut h)).await {
        Ok(Err(_)) => {}
        Ok(Ok(v)) => panic!("h was sent {v} after its node held two and was killed"),
        Err(_) => panic!("h's connection to the killed node did not end within {STEP:?}"),
    }
    drop(h);

    // 4. h resumes through the balancer, on a live node, from the batch's
    // last seq: `joined` (resumed, same session), then exactly the two held
    // events, once, as `event` frames.
    let (mut h, node, joined) = join_raw(
        &lb,
        &json!({"type": "join", "room": room, "name": "h",
            "resume": {"token": h_token, "last_seq": last_seq}}),
        STEP,
    )
    .await;
    assert_eq!(joined["type"], "joined", "{joined}");
    assert_eq!(joined["resumed"], true, "{joined}");
    assert_eq!(joined["session"], h_session.as_str(), "{joined}");
    assert_eq!(joined["seq"], held[1], "the room's seq: {joined}");
    assert!(joined.get("snapshot").is_none(), "{joined}");
    assert_ne!(node, h_node, "h resumed on a live node");
    assert!(
        others.iter().any(|&i| cluster.node(i).id() == node),
        "h resumed on {node:?}"
    );
    let mut missed = Vec::new();
    for _ in 0..2 {
        missed.push(frame_within(&mut h, STEP, "resumed h").await);
    }
    check_messages(&missed, &held, 5, &p_session);

    // 5. Its policy holds on the new node (kept by the resume, which named
    // none): four more are held, the fifth flushes the five as one batch,
    // the next frame after the two replayed events (so nothing came twice).
    let third = publish(&mut p, 7, 11).await;
    let fifth = publish(&mut p, 11, 12).await;
    let batch = frame_within(&mut h, STEP, "resumed h").await;
    assert_eq!(batch["type"], "batch", "{batch}");
    let five: Vec<u64> = third.iter().chain(&fifth).copied().collect();
    assert_eq!(five[0], held[1] + 1, "{five:?}");
    check_messages(batch["events"].as_array().unwrap(), &five, 7, &p_session);
    // The policy as the new node has it: the join's (unset bounds and no
    // filters are left out, as protocol.md says).
    {
        use futures_util::SinkExt;
        use tokio_tungstenite::tungstenite::Message;
        let req =
            json!({"type": "request", "room": room, "nonce": 1, "op": "policy.update", "args": {}});
        h.send(Message::text(req.to_string())).await.unwrap();
    }
    let response = frame_within(&mut h, STEP, "resumed h").await;
    assert_eq!(response["type"], "response", "{response}");
    assert_eq!(response["ok"], true, "{response}");
    let policy = &response["result"]["policy"];
    assert_eq!(policy["max_held"], 5, "{response}");
    assert_eq!(policy.get("max_delay_ms"), None, "{response}");
    assert_eq!(policy["aggregate"], true, "{response}");
    assert_eq!(policy.get("filters"), None, "{response}");

    // w, without a policy, got all twelve once, in order.
    w.pump_until(STEP, |m| m.received.len() == 12).await;
    let all: Vec<u64> = p
        .acked
        .values()
        .copied()
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .collect();
    assert_eq!(w.received.keys().copied().collect::<Vec<_>>(), all);
    assert_exactly_once(&[&p, &w]);
}

/// One HTTP/1.1 request with `Connection: close`: (status, `x-plaza-node`, JSON body).
async fn http_call(
    addr: std::net::SocketAddr,
    method: &str,
    path: &str,
    body: Option<&Value>,
) -> (u16, String, Value) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let body = body.map(Value::to_string).unwrap_or_default();
    let mut tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let head = format!(
        "{method} {path} HTTP/1.1\r\nHost: plaza\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    tcp.write_all(head.as_bytes()).await.unwrap();
    tcp.write_all(body.as_bytes()).await.unwrap();
    let mut out = String::new();
    tcp.read_to_string(&mut out).await.unwrap();
    let status = out[9..12].parse().unwrap();
    let (head, json) = out.split_once("\r\n\r\n").unwrap_or((&out, ""));
    let node = head
        .lines()
        .find_map(|l| l.strip_prefix("x-plaza-node: "))
        .unwrap_or_default()
        .to_owned();
    (
        status,
        node,
        serde_json::from_str(json).unwrap_or(Value::Null),
    )
}

/// A long-polling member through the balancer: every request carries the room hint, if it
/// has one.
struct Poller {
    lb: std::net::SocketAddr,
    /// `room=<hint>&`, or nothing.
    hint: String,
    id: String,
    node: String,
    ack: u64,
    /// Frames received and not looked at yet.
    pending: std::collections::VecDeque<Value>,
}

impl Poller {
    async fn open(lb: std::net::SocketAddr, room: &str) -> Poller {
        Self::open_with_hint(lb, Some(room)).await
    }

    async fn open_with_hint(lb: std::net::SocketAddr, room: Option<&str>) -> Poller {
        let hint = room.map(|r| format!("room={r}&")).unwrap_or_default();
        let (status, node, body) =
            http_call(lb, "POST", &format!("/v1/sessions?{hint}"), None).await;
        assert_eq!(status, 201, "{body}");
        Poller {
            lb,
            hint,
            id: body["session"].as_str().unwrap().to_owned(),
            node,
            ack: 0,
            pending: Default::default(),
        }
    }

    async fn send(&self, frame: Value) -> u16 {
        let path = format!("/v1/sessions/{}/send?{}", self.id, self.hint);
        let (status, node, _) = http_call(self.lb, "POST", &path, Some(&frame)).await;
        if status == 202 {
            assert_eq!(node, self.node, "every request reaches the session's node");
        }
        status
    }

    /// Polls until a frame satisfies `f` (those after it stay for the next
    /// call); `Err(status)` when a poll fails.
    async fn until(&mut self, f: impl Fn(&Value) -> bool) -> Result<Value, u16> {
        loop {
            while let Some(v) = self.pending.pop_front() {
                if f(&v) {
                    return Ok(v);
                }
            }
            let path = format!(
                "/v1/sessions/{}/poll?{}ack={}",
                self.id, self.hint, self.ack
            );
            let (status, node, body) = http_call(self.lb, "GET", &path, None).await;
            if status != 200 {
                return Err(status);
            }
            assert_eq!(node, self.node, "every request reaches the session's node");
            self.ack = body["last"].as_u64().unwrap();
            self.pending
                .extend(body["frames"].as_array().unwrap().iter().cloned());
        }
    }
}

async fn http_sessions_stick_to_their_node_and_resume_after_its_death(lb: LbKind, name: &str) {
    let (mut cluster, _dir) = start_behind(3, lb, name);
    let room = name;
    let lb_addr: std::net::SocketAddr =
        cluster.url().trim_start_matches("http://").parse().unwrap();
    let mut ann = Poller::open(lb_addr, room).await;
    assert_eq!(
        ann.send(json!({"type": "join", "room": room, "name": "ann"}))
            .await,
        202
    );
    let joined = ann.until(|v| v["type"] == "joined").await.unwrap();
    let victim = cluster
        .nodes()
        .iter()
        .position(|n| n.id() == ann.node)
        .expect("a node of the cluster");
    // Bob, straight on another node, talks to ann across the cluster.
    let other = (victim + 1) % 3;
    let mut bob = Member::join(&ws_url(&cluster.node(other).url(), room), room, "bob").await;
    bob.publish("b-1", json!("hello")).await;
    bob.pump_until(LIMIT, |m| m.all_acked()).await;
    let hello = ann.until(|v| v["kind"] == "message").await.unwrap();
    assert_eq!(hello["data"], "hello");
    // A client that gives no room hint: its session sticks to one node all the same.
    let mut carl = Poller::open_with_hint(lb_addr, None).await;
    for i in 0..6 {
        let frame = if i == 0 {
            json!({"type": "join", "room": room, "name": "carl"})
        } else {
            json!({"type": "ping", "ts": i})
        };
        assert_eq!(carl.send(frame).await, 202, "request {i}");
        carl.until(|v| v["type"] == "joined" || v["type"] == "pong")
            .await
            .unwrap_or_else(|status| panic!("poll {i}: {status}"));
    }

    // Ann's node dies; bob says something meanwhile.
    cluster.kill_node(victim).unwrap();
    bob.publish("b-2", json!("missed")).await;
    bob.pump_until(LIMIT, |m| m.all_acked()).await;
    let missed_seq = bob.acked["b-2"];
    // The balancer now sends ann's requests elsewhere: that node has no such session.
    let lost = ann.until(|v| v["type"] == "never").await;
    assert_eq!(lost, Err(404), "the session died with its node");
    // A new session through the balancer, and a resume: nothing is lost.
    let mut again = Poller::open(lb_addr, room).await;
    assert_ne!(again.node, ann.node);
    assert_eq!(
        again
            .send(json!({"type": "join", "room": room, "name": "ann",
                "resume": {"token": joined["resume_token"], "last_seq": hello["seq"]}}))
            .await,
        202
    );
    let resumed = again.until(|v| v["type"] == "joined").await.unwrap();
    assert_eq!(resumed["resumed"], true, "{resumed}");
    assert_eq!(resumed["session"], joined["session"]);
    let missed = again.until(|v| v["kind"] == "message").await.unwrap();
    assert_eq!(missed["data"], "missed");
    assert_eq!(missed["seq"], missed_seq);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_transport_sessions_stick_to_their_node_behind_nginx_and_resume_after_its_death() {
    http_sessions_stick_to_their_node_and_resume_after_its_death(LbKind::Nginx, "http-nginx").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_transport_sessions_stick_to_their_node_behind_haproxy_and_resume_after_its_death() {
    http_sessions_stick_to_their_node_and_resume_after_its_death(LbKind::Haproxy, "http-haproxy")
        .await;
}
