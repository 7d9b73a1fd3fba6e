//! `broker_ack = replicas:N` against real servers: an append waits for
//! `WAIT N`, fails as unavailable when no replica confirms it, and nobody
//! sees an entry before it is confirmed.

use std::time::{Duration, Instant};

use crate::support::redis::RedisServer;
use crate::support::*;
use plaza_broker::{BrokerAck, Cluster, ClusterError, RedisBroker, RedisConfig};

/// Makes `replica` a replica of `primary` and waits until `primary` counts
/// it (WAIT 1 answers 1 once the replica acknowledged the stream).
async fn attach(replica: &RedisServer, primary: &RedisServer) {
    let client = ::redis::Client::open(replica.url()).unwrap();
    let mut conn = guard(client.get_multiplexed_async_connection())
        .await
        .unwrap();
    let _: () = guard(
        ::redis::cmd("REPLICAOF")
            .arg("127.0.0.1")
            .arg(primary.port())
            .query_async(&mut conn),
    )
    .await
    .unwrap();
    let client = ::redis::Client::open(primary.url()).unwrap();
    let mut conn = guard(client.get_multiplexed_async_connection())
        .await
        .unwrap();
    // WAIT blocks until the replica acknowledges (or 100 ms pass): this loop
    // awaits the replica's sync, it does not sleep.
    let deadline = Instant::now() + GUARD;
    loop {
        let count: i64 = guard(::redis::cmd("WAIT").arg(1).arg(100).query_async(&mut conn))
            .await
            .unwrap();
        if count >= 1 {
            return;
        }
        assert!(Instant::now() < deadline, "the replica never synced");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_1_without_a_replica_fails_unavailable_after_the_wait_and_hides_the_entry() {
    let primary = RedisServer::start();
    let timeout = Duration::from_millis(600);
    let config = RedisConfig::new(primary.url(), "a")
        .with_timeout(timeout)
        .with_ack(BrokerAck::Replicas(1));
    let wait = config.ack_wait();
    let a = guard(RedisBroker::connect_with(config)).await.unwrap();
    a.create_room("r", data("m"), data("s")).await.unwrap();
    let (l, mut rx) = listener();
    a.subscribe("r", l).await.unwrap();

    let started = Instant::now();
    let refused = guard(a.append("r", data("unconfirmed"))).await;
    let took = started.elapsed();
    match &refused {
        Err(ClusterError::Unavailable(why)) => {
            assert!(why.contains("only 0 of 1 replicas"), "{why}")
        }
        other => panic!("expected unavailable, got {other:?}"),
    }
    // It waited for WAIT's timeout, and came back: no hang. (The upper
    // bound is a hang detector, not a speed: a busy machine may add seconds.)
    assert!(
        took >= wait,
        "failed after {took:?}, before WAIT's {wait:?}"
    );
    assert!(took < timeout + Duration::from_secs(15), "took {took:?}");
    // Written but unconfirmed: log reads do not return it.
    assert_eq!(guard(a.read("r", 0, 10)).await.unwrap(), Vec::new());

    // With a replica, the next append is confirmed and published; the first
    // was never published (the next notice is entry 2), and now that a later
    // entry is confirmed, reads return both (the documented outcome of a
    // failed append: it may still be in the log).
    let replica = RedisServer::start();
    attach(&replica, &primary).await;
    let p = guard(a.append("r", data("confirmed"))).await.unwrap();
    assert_eq!(p.n, 2);
    let e = entry(next(&mut rx).await);
    assert_eq!((e.n, e.payload), (2, data("confirmed")));
    let log = guard(a.read("r", 0, 10)).await.unwrap();
    let payloads: Vec<_> = log.iter().map(|e| e.payload.clone()).collect();
    assert_eq!(payloads, vec![data("unconfirmed"), data("confirmed")]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_1_entries_reach_the_replica_before_members_hear_of_them() {
    let primary = RedisServer::start();
    let replica = RedisServer::start();
    attach(&replica, &primary).await;
    let config = RedisConfig::new(primary.url(), "a").with_ack(BrokerAck::Replicas(1));
    let a = guard(RedisBroker::connect_with(config)).await.unwrap();
    // A node with the default setting in the same cluster sees one log.
    let b = redis_node(&primary, "b", 100).await;
    a.create_room("r", data("m"), data("s")).await.unwrap();
    let (l, mut rx) = listener();
    b.subscribe("r", l).await.unwrap();
    let client = ::redis::Client::open(replica.url()).unwrap();
    let mut on_replica = guard(client.get_multiplexed_async_connection())
        .await
        .unwrap();
    let log_key = "plaza:room:{r}:log";
    for i in 1..=20u64 {
        let from_a = i % 2 == 1;
        let node = if from_a { &a } else { &b };
        let p = guard(node.append("r", data(&format!("e{i}"))))
            .await
            .unwrap();
        assert_eq!(p.n, i);
        let e = entry(next(&mut rx).await);
        assert_eq!(e.n, i);
        if from_a {
            // Heard of it: the replica has it already.
            let len: u64 = guard(
                ::redis::cmd("XLEN")
                    .arg(log_key)
                    .query_async(&mut on_replica),
            )
            .await
            .unwrap();
            assert!(len >= i, "entry {i} published before the replica had it");
        }
    }
    let log = guard(b.read("r", 0, 100)).await.unwrap();
    assert_eq!(log.len(), 20);
}
