//! Network chaos with real processes: Redis, two `plaza serve --redis`
//! nodes and nginx, each in a network namespace of its own (see
//! [`crate::netlab`]; needs root), the clients in this process. A node is cut
//! off from Redis, a node is cut off from its clients, and the path between
//! the clients and the balancer loses packets and holds them 200 ms each
//! way — while members publish. Every acknowledged message must reach every
//! member exactly once, and the cut node must come back serving.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use crate::cluster_support::{assert_exactly_once, Member};
use crate::netlab::Lab;
use plaza_launch::{LbKind, LbOptions, LoadBalancer, NodeOptions, NodeProcess, RedisProcess};
use serde_json::{json, Value};

const LIMIT: Duration = Duration::from_secs(60);
/// How long a member waits on a silent connection before it pings, and
/// again before it takes the connection for dead.
const LIVENESS: Duration = Duration::from_secs(1);

/// Redis, two nodes and nginx, each on a leaf of the lab.
struct Chaos {
    // Fields drop in order: the balancer, the nodes, Redis, then the network.
    lb: LoadBalancer,
    nodes: Vec<NodeProcess>,
    _redis: RedisProcess,
    lab: Lab,
    _dir: tempfile::TempDir,
}

/// The nodes' leaves in the lab, in order.
const NODES: [&str; 2] = ["node1", "node2"];

/// How often the nodes ping their clients, and how long they wait for a
/// sign of life before dropping one.
#[derive(Clone, Copy)]
enum Heartbeats {
    /// Every second; a client silent for 3 s is dropped: connections cut by
    /// the test end within it.
    Fast,
    /// The defaults (25 s, 30 s): a slow path must not look like a dead one.
    Default,
}

impl Chaos {
    fn start(name: &str, heartbeats: Heartbeats) -> Chaos {
        let dir = tempfile::Builder::new()
            .prefix(&format!("plaza-chaos-{name}-"))
            .tempdir()
            .unwrap();
        let lab = Lab::new(&["redis", NODES[0], NODES[1], "lb"]);
        let fail = |what: &str, e: std::io::Error| -> ! {
            panic!("chaos lab: cannot start {what} (scripts/test.sh installs redis-server and nginx): {e}")
        };
        let redis = RedisProcess::start_on(&dir.path().join("redis"), lab.host("redis"))
            .unwrap_or_else(|e| fail("redis-server", e));
        let nodes: Vec<NodeProcess> = NODES
            .iter()
            .enumerate()
            .map(|(i, leaf)| {
                NodeProcess::start(
                    &PathBuf::from(env!("CARGO_BIN_EXE_plaza")),
                    NodeOptions {
                        redis_url: Some(redis.url()),
                        host: lab.host(leaf),
                        port: 7000,
                        extra_args: match heartbeats {
                            Heartbeats::Fast => &[
                                "--auto-create-rooms",
                                "--heartbeat-interval-ms",
                                "1000",
                                "--idle-timeout-ms",
                                "3000",
                            ][..],
                            Heartbeats::Default => &["--auto-create-rooms"][..],
                        }
                        .iter()
                        .map(|a| a.to_string())
                        .collect(),
                        log_dir: Some(dir.path().join("nodes")),
                        ..NodeOptions::new(format!("node-{}", i + 1))
                    },
                )
                .unwrap_or_else(|e| fail(leaf, e))
            })
            .collect();
        let upstreams: Vec<_> = nodes.iter().map(NodeProcess::addr).collect();
        let lb = LoadBalancer::start_with(
            LbKind::Nginx,
            8080,
            &upstreams,
            &dir.path().join("lb"),
            LbOptions {
                host: lab.host("lb"),
                ..LbOptions::default()
            },
        )
        .unwrap_or_else(|e| fail("nginx", e));
        Chaos {
            lb,
            nodes,
            _redis: redis,
            lab,
            _dir: dir,
        }
    }

    /// The lab leaf of the node with this id.
    fn leaf_of(&self, node_id: &str) -> &'static str {
        let i = self
            .nodes
            .iter()
            .position(|n| n.id() == node_id)
            .unwrap_or_else(|| panic!("no node {node_id}"));
        NODES[i]
    }

    fn ws_url(http: &str, room: &str) -> String {
        format!("{}/v1/ws?room={room}", http.replacen("http://", "ws://", 1))
    }

    fn lb_url(&self, room: &str) -> String {
        Chaos::ws_url(&self.lb.url(), room)
    }

    fn node_url(&self, i: usize, room: &str) -> String {
        Chaos::ws_url(&self.nodes[i].url(), room)
    }

    /// `GET /readyz` on node `i`: its status.
    fn readyz(&self, i: usize) -> u16 {
        plaza_launch::http_get(self.nodes[i].addr(), "/readyz", Duration::from_secs(5))
            .map_or(0, |r| r.status)
    }
}

/// Polls node `i`'s `/readyz` until it answers `status` (nothing announces
/// readiness: a probe is what a balancer would do too).
async fn await_readyz(c: &Chaos, i: usize, status: u16) {
    let deadline = Instant::now() + LIMIT;
    loop {
        if c.readyz(i) == status {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "node {i}'s /readyz never answered {status}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Publishes `id` as `m` and reads until it is acknowledged, sending it again
/// (same id) after each refusal, with a short backoff.
async fn publish_until_acked(m: &mut Member, id: &str) {
    m.publish(id, json!(id)).await;
    let deadline = Instant::now() + LIMIT;
    while !m.all_acked() {
        let errors = m.errors.len();
        m.pump_until(LIMIT, |m| m.all_acked() || m.errors.len() > errors)
            .await;
        if !m.all_acked() {
            assert!(
                Instant::now() < deadline,
                "{}: {id} never acknowledged",
                m.name
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
            m.resend_unacked().await;
        }
    }
}

/// Reads until every member holds every acknowledged message of the others,
/// then checks that each came exactly once.
async fn all_delivered(members: &mut [&mut Member]) {
    let expected: usize = members.iter().map(|m| m.acked.len()).sum();
    for m in members.iter_mut() {
        let want = expected - m.acked.len();
        m.pump_until(LIMIT, |m| m.received.len() >= want).await;
    }
    let refs: Vec<&Member> = members.iter().map(|m| &**m).collect();
    assert_exactly_once(&refs);
}

/// Joins `room` through `url` as a new member, expecting an error: the error.
async fn refused_join(url: &str, room: &str) -> Value {
    use futures_util::SinkExt;
    use tokio_tungstenite::tungstenite::Message;
    let (mut ws, _) = tokio_tungstenite::connect_async(url).await.unwrap();
    let join = json!({"type": "join", "room": room, "name": "late"});
    ws.send(Message::text(join.to_string())).await.unwrap();
    let frame = tokio::time::timeout(LIMIT, crate::cluster_support::next_frame(&mut ws))
        .await
        .expect("an answer to the join")
        .expect("a frame");
    assert_eq!(frame["type"], "error", "the join was not refused: {frame}");
    frame
}

fn has_error(m: &Member, code: &str) -> bool {
    m.errors.iter().any(|e| e["code"] == code)
}

fn left(m: &Member, session: &str) -> bool {
    m.events
        .iter()
        .any(|e: &Value| e["kind"] == "presence.leave" && e["session"] == session)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_cut_off_from_redis_refuses_writes_then_comes_back_clean() {
    let c = Chaos::start("redis-cut", Heartbeats::Fast);
    let room = "cut";
    // a and b on node 1, which will lose Redis; d on node 2.
    let mut a = Member::join(&c.node_url(0, room), room, "a").await;
    let mut b = Member::join(&c.node_url(0, room), room, "b").await;
    let mut d = Member::join(&c.node_url(1, room), room, "d").await;
    publish_until_acked(&mut a, "a-0").await;
    publish_until_acked(&mut d, "d-0").await;

    c.lab.cut(NODES[0], "redis");
    // A write node 1 cannot log is refused, with the documented code.
    a.publish("a-1", json!("a-1")).await;
    a.pump_until(LIMIT, |a| has_error(a, "broker_unavailable"))
        .await;
    assert!(!a.all_acked(), "a-1 was acknowledged without Redis");
    // So is a join, which must be logged too.
    let refused = refused_join(&c.node_url(0, room), room).await;
    assert_eq!(refused["code"], "broker_unavailable", "{refused}");
    await_readyz(&c, 0, 503).await;
    // Node 2 goes on; its members see node 1's members leave once node 1's
    // heartbeat in Redis lapses.
    for i in 1..=5 {
        publish_until_acked(&mut d, &format!("d-{i}")).await;
    }
    let (sa, sb) = (a.session.clone(), b.session.clone());
    d.pump_until(LIMIT, |d| left(d, &sa) && left(d, &sb)).await;

    c.lab.heal(NODES[0]);
    await_readyz(&c, 0, 200).await;
    // Node 1 learns it was taken for dead: its members are told to
    // reconnect, resume, and a's refused write goes through once.
    publish_until_acked(&mut a, "a-1").await;
    publish_until_acked(&mut b, "b-0").await;
    publish_until_acked(&mut d, "d-6").await;
    all_delivered(&mut [&mut a, &mut b, &mut d]).await;
    assert!(
        a.reconnects >= 1 && b.reconnects >= 1,
        "node 1 closed its members"
    );
    assert_eq!(a.acked.len(), 2);
    // Presence is whole again: d sees a and b back.
    let back = |d: &Member, s: &str| {
        d.events
            .iter()
            .any(|e| e["kind"] == "presence.join" && e["member"]["session"] == s)
    };
    d.pump_until(LIMIT, |d| back(d, &sa) && back(d, &sb)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn members_cut_off_from_their_node_resume_on_the_other_and_nothing_acknowledged_is_lost() {
    let c = Chaos::start("client-cut", Heartbeats::Fast);
    let room = "split";
    let lb = c.lb_url(room);
    let mut a = Member::with_liveness(&lb, room, "a", LIVENESS).await;
    let mut b = Member::with_liveness(&lb, room, "b", LIVENESS).await;
    assert_eq!(a.node, b.node, "one room, one node behind the balancer");
    let victim = c.leaf_of(&a.node);
    let other = c.nodes.iter().position(|n| n.id() != a.node).unwrap();
    // One member straight on the other node: it never loses its path.
    let mut d = Member::with_liveness(&c.node_url(other, room), room, "d", LIVENESS).await;

    const N: usize = 20;
    for i in 0..N {
        if i == N / 3 {
            // The balancer can no longer reach the room's node, nor it the
            // balancer; the node itself still reaches Redis.
            c.lab.cut(victim, "lb");
        }
        for m in [&mut a, &mut b, &mut d] {
            let id = format!("{}-{i}", m.name);
            publish_until_acked(m, &id).await;
        }
    }
    all_delivered(&mut [&mut a, &mut b, &mut d]).await;
    assert!(
        a.reconnects >= 1 && b.reconnects >= 1,
        "a and b noticed the silence"
    );
    assert_eq!(a.node, c.nodes[other].id(), "a resumed on the other node");
    assert_eq!(b.node, c.nodes[other].id(), "b resumed on the other node");

    // The cut node comes back clean: a new member joins on it and the room
    // goes on across both nodes, nothing twice.
    c.lab.heal(victim);
    let victim_index = 1 - other;
    let mut e = Member::join(&c.node_url(victim_index, room), room, "e").await;
    publish_until_acked(&mut e, "e-0").await;
    publish_until_acked(&mut a, "a-last").await;
    let last_a = a.acked["a-last"];
    e.pump_until(LIMIT, |e| e.received.contains_key(&last_a))
        .await;
    assert_eq!(e.received[&last_a].1, json!("a-last"));
    assert_eq!(e.received.len(), 1, "e got only what came after its join");
    let seq = e.acked["e-0"];
    let sent = a.acked.len() + b.acked.len() + d.acked.len();
    for m in [&mut a, &mut b, &mut d] {
        m.pump_until(LIMIT, |m| {
            m.received.contains_key(&seq) && (m.name == "a" || m.received.contains_key(&last_a))
        })
        .await;
        assert_eq!(m.received[&seq].1, json!("e-0"));
        // The others' messages and e's, each once (a seq seen twice fails
        // on arrival).
        assert_eq!(m.received.len(), sent - m.acked.len() + 1, "{}", m.name);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lossy_slow_path_to_the_balancer_loses_nothing_acknowledged() {
    let mut c = Chaos::start("lossy", Heartbeats::Default);
    // 5 % of the packets lost, the others held 200 ms, each way.
    c.lab.degrade("lb", 0.05, Duration::from_millis(200));
    let room = "lossy";
    let lb = c.lb_url(room);
    let mut a = Member::join(&lb, room, "a").await;
    let mut b = Member::join(&lb, room, "b").await;
    let mut d = Member::join(&lb, room, "d").await;
    // The delay is real: a ping's round trip through the balancer takes at
    // least the two holds.
    let sent = Instant::now();
    a.send(json!({"type": "ping", "ts": 1})).await;
    a.pump_until(LIMIT, |a| a.pongs > 0).await;
    assert!(
        sent.elapsed() >= Duration::from_millis(400),
        "a round trip of {:?} through a 200 ms path",
        sent.elapsed()
    );
    const N: usize = 12;
    for i in 0..N {
        for m in [&mut a, &mut b, &mut d] {
            let id = format!("{}-{i}", m.name);
            publish_until_acked(m, &id).await;
        }
    }
    all_delivered(&mut [&mut a, &mut b, &mut d]).await;
    assert!(
        c.lab.delayed_packets() > 0,
        "packets went through the delay"
    );
}
