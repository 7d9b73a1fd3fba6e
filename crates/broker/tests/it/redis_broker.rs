//! What only [`RedisBroker`] has: tickets, its key layout, its connections,
//! and real outages of a `redis-server` started by the test.

use std::time::Duration;

use crate::support::redis::{free_port, RedisServer};
use crate::support::*;
use futures_util::future::join_all;
use plaza_broker::{Cluster, ClusterError, LogNotice, RedisBroker, RedisConfig, TicketStore};
use plaza_core::TicketGrant;
use plaza_protocol::ErrorCode;
use tokio::sync::mpsc;

fn grant() -> TicketGrant {
    TicketGrant {
        room: "r".into(),
        name: "ann".into(),
        platform: "xr".into(),
    }
}

async fn raw(server: &RedisServer) -> ::redis::aio::MultiplexedConnection {
    let client = ::redis::Client::open(server.url()).unwrap();
    guard(client.get_multiplexed_async_connection())
        .await
        .unwrap()
}

async fn cmd<T: ::redis::FromRedisValue>(
    conn: &mut ::redis::aio::MultiplexedConnection,
    args: &[&str],
) -> T {
    let mut c = ::redis::cmd(args[0]);
    for a in &args[1..] {
        c.arg(*a);
    }
    guard(c.query_async(conn)).await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tickets_redeem_once_and_expire() {
    let server = RedisServer::start();
    let a = redis_node(&server, "a", 100).await;
    let b = redis_node(&server, "b", 100).await;
    assert_eq!(a.kind(), "redis");
    assert!(TicketStore::ready(&*a).await);

    let t = a.issue_ticket(grant(), 30_000, 1_000).await.unwrap();
    assert_eq!(t.expires_at, 31_000);
    // Issued on one node, redeemed on another.
    assert_eq!(b.redeem_ticket(&t.ticket, 2_000).await.unwrap(), grant());
    assert_eq!(
        a.redeem_ticket(&t.ticket, 2_000).await.unwrap_err().code,
        ErrorCode::TicketUsed
    );
    let t2 = a.issue_ticket(grant(), 30_000, 1_000).await.unwrap();
    assert_eq!(
        b.redeem_ticket(&t2.ticket, 31_000).await.unwrap_err().code,
        ErrorCode::TicketExpired
    );
    assert_eq!(
        b.redeem_ticket("forged", 0).await.unwrap_err().code,
        ErrorCode::TicketInvalid
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ticket_raced_from_two_nodes_admits_once() {
    let server = RedisServer::start();
    let a = redis_node(&server, "a", 100).await;
    let b = redis_node(&server, "b", 100).await;
    let t = a.issue_ticket(grant(), 30_000, 0).await.unwrap();
    let tries = (0..20).map(|i| {
        let (node, ticket) = (if i % 2 == 0 { &a } else { &b }, t.ticket.clone());
        async move { node.redeem_ticket(&ticket, 1).await }
    });
    let results = guard(join_all(tries)).await;
    assert_eq!(results.iter().filter(|r| r.is_ok()).count(), 1);
    assert!(results
        .iter()
        .filter_map(|r| r.as_ref().err())
        .all(|e| e.code == ErrorCode::TicketUsed));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connecting_without_redis_fails_at_once() {
    let url = format!("redis://127.0.0.1:{}/", free_port());
    let result = guard(RedisBroker::connect(&url, "a")).await;
    assert!(matches!(result, Err(ClusterError::Unavailable(_))));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_follow_the_documented_layout() {
    let server = RedisServer::start();
    let config = RedisConfig::new(server.url(), "n1")
        .with_key_prefix("t1:")
        .with_log_capacity(50);
    let a = guard(RedisBroker::connect_with(config)).await.unwrap();
    a.create_room("lobby", data("meta"), data("snap"))
        .await
        .unwrap();
    a.append("lobby", data("hello")).await.unwrap();
    let ticket = a.issue_ticket(grant(), 30_000, 0).await.unwrap();

    let mut r = raw(&server).await;
    let kind = |key: &str| ["TYPE", key].map(str::to_owned);
    for (key, expected) in [
        ("t1:room:{lobby}", "hash"),
        ("t1:room:{lobby}:log", "stream"),
        ("t1:room:{lobby}:snap", "hash"),
        ("t1:rooms", "set"),
        ("t1:node:n1", "string"),
    ] {
        let k = kind(key);
        let t: String = cmd(&mut r, &[&k[0], &k[1]]).await;
        assert_eq!(t, expected, "{key}");
    }
    let n: u64 = cmd(&mut r, &["HGET", "t1:room:{lobby}", "n"]).await;
    assert_eq!(n, 1);
    // [[id, [field, value, …]]]: one entry, id 1-0, payload under `p`.
    let log: Vec<(String, Vec<Vec<u8>>)> =
        cmd(&mut r, &["XRANGE", "t1:room:{lobby}:log", "-", "+"]).await;
    assert_eq!(log[0].0, "1-0");
    assert_eq!(log[0].1[2..], [b"p".to_vec(), b"hello".to_vec()]);
    let ticket_key = format!("t1:ticket:{}", ticket.ticket);
    let ttl: i64 = cmd(&mut r, &["PTTL", &ticket_key]).await;
    assert!(
        ttl > 30_000 + 3_000_000,
        "an expired ticket is kept an hour: {ttl}"
    );
    let node_ttl: i64 = cmd(&mut r, &["PTTL", "t1:node:n1"]).await;
    assert!(node_ttl > 0 && node_ttl <= 5_000);
    // Nothing outside the prefix.
    let all: Vec<String> = cmd(&mut r, &["KEYS", "*"]).await;
    assert!(all.iter().all(|k| k.starts_with("t1:")), "{all:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropping_the_broker_closes_its_connections() {
    let server = RedisServer::start();
    let mut r = raw(&server).await;
    let clients = |info: String| -> usize {
        info.lines()
            .find_map(|l| l.strip_prefix("connected_clients:"))
            .and_then(|n| n.trim().parse().ok())
            .expect("connected_clients in INFO")
    };
    let before = clients(cmd(&mut r, &["INFO", "clients"]).await);
    let a = redis_node(&server, "a", 100).await;
    let with = clients(cmd(&mut r, &["INFO", "clients"]).await);
    assert_eq!(with, before + 3, "commands, appends and pub/sub");

    drop(a);
    // Redis has no event for a closed client: poll, with a deadline.
    let deadline = tokio::time::Instant::now() + GUARD;
    while clients(cmd(&mut r, &["INFO", "clients"]).await) != before {
        assert!(tokio::time::Instant::now() < deadline, "connections leaked");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_outage_fails_fast_and_the_subscriber_comes_back_by_itself() {
    let mut server = RedisServer::start();
    let a = redis_node(&server, "a", 100).await;
    let b = redis_node(&server, "b", 100).await;
    let rooms = ["r1", "r2", "r3"];
    let (tx, mut rx) = mpsc::unbounded_channel();
    for room in rooms {
        a.create_room(room, data("m"), data("s")).await.unwrap();
        a.subscribe(room, tagged(room, &tx)).await.unwrap();
    }
    b.append("r1", data("before")).await.unwrap();
    let (room, notice) = next(&mut rx).await;
    assert_eq!((room.as_str(), entry(notice).n), ("r1", 1));

    server.stop();
    // Each call fails on its own, promptly.
    assert!(unavailable(fast(b.append("r1", data("lost"))).await));
    assert!(unavailable(fast(b.read("r1", 0, 10)).await));
    assert!(unavailable(fast(a.nodes_alive(&["a".into()])).await));
    assert!(unavailable(
        fast(b.create_room("q", data("m"), data("s"))).await
    ));
    let ticket = fast(b.issue_ticket(grant(), 1_000, 0)).await;
    assert_eq!(ticket.unwrap_err().code, ErrorCode::BrokerUnavailable);
    assert!(!fast(Cluster::ready(&*b)).await);

    server.restart();
    // Without any call from here, every subscription comes back.
    let mut resubscribed: Vec<String> = Vec::new();
    while resubscribed.len() < rooms.len() {
        let (room, notice) = next(&mut rx).await;
        assert_eq!(notice, LogNotice::Resubscribed, "{room}");
        resubscribed.push(room);
    }
    resubscribed.sort();
    assert_eq!(resubscribed, rooms);

    // The log survived (append-only file) and goes on where it was.
    let p = guard(b.append("r1", data("after"))).await.unwrap();
    assert_eq!(p.n, 2);
    let (room, notice) = next(&mut rx).await;
    assert_eq!((room.as_str(), entry(notice).n), ("r1", 2));
    let log = guard(a.read("r1", 0, 10)).await.unwrap();
    let payloads: Vec<_> = log.iter().map(|e| e.payload.clone()).collect();
    assert_eq!(payloads, vec![data("before"), data("after")]);
    assert_eq!(guard(a.list_rooms()).await.unwrap().len(), 3);

    // Heartbeats resume; Redis has no event for that, so poll.
    let deadline = tokio::time::Instant::now() + GUARD;
    let ids = ["a".to_string(), "b".to_string()];
    while guard(a.nodes_alive(&ids)).await.ok() != Some(vec![true, true]) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "heartbeats did not resume"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_to_a_hung_redis_time_out_and_work_again_after() {
    let server = RedisServer::start();
    let config = RedisConfig::new(server.url(), "a").with_timeout(Duration::from_millis(500));
    let a = guard(RedisBroker::connect_with(config)).await.unwrap();
    a.create_room("r", data("m"), data("s")).await.unwrap();
    let (l, mut rx) = listener();
    a.subscribe("r", l).await.unwrap();

    server.pause();
    assert!(unavailable(fast(a.append("r", data("maybe"))).await));
    assert!(unavailable(fast(a.read("r", 0, 10)).await));
    assert!(unavailable(fast(a.list_rooms()).await));
    server.resume();

    // The timed-out append may still have run ("nothing is known to have
    // been done"); either way the log stays gap-free and delivered.
    let p = guard(a.append("r", data("sure"))).await.unwrap();
    assert!(p.n == 1 || p.n == 2, "{p:?}");
    let mut seen = Vec::new();
    while seen.last() != Some(&p.n) {
        seen.push(entry(next(&mut rx).await).n);
    }
    assert_eq!(seen, (1..=p.n).collect::<Vec<_>>());
    assert_eq!(guard(a.read("r", 0, 10)).await.unwrap().len() as u64, p.n);
}
