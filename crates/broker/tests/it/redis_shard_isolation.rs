//! One shard of a Redis Cluster that hangs or dies delays only its own rooms.
//!
//! The shard under test is made unable to serve for as long as the test
//! likes: its primary is paused (SIGSTOP, a hang) or killed, and its replica
//! is paused too, so that no failover ends the outage early. The node's
//! Redis call timeout is set long (far beyond [`GUARD`]), so that a call to
//! that shard stays unanswered for the whole test. Meanwhile the rooms on
//! the other shards must go on: each call on them is answered while the
//! first call to the stuck shard is still unanswered. That is an order of
//! events, not a speed: a broker in which anything shared (a batch, a
//! connection, a lock) waits on the stuck shard answers nothing on the
//! others until the stuck call ends.

use std::sync::Arc;
use std::time::Duration;

use crate::support::*;
use plaza_broker::{Cluster, LogNotice, RedisBroker, RedisConfig};
use plaza_launch::{slot_of, RedisCluster};
use tokio::sync::mpsc;

/// The node's Redis call timeout here: a call to the stuck shard stays
/// unanswered past every [`GUARD`]ed call on the others.
const LONG_TIMEOUT: Duration = Duration::from_secs(60);

/// How a shard is made to stop serving.
#[derive(Clone, Copy, Debug)]
enum Outage {
    /// Its primary hangs (SIGSTOP): connections stay open, nothing answers.
    Hang,
    /// Its primary dies (SIGKILL): connections are refused.
    Kill,
}

/// A room id whose slot is among primary `i`'s initial slots.
fn room_on(cluster: &RedisCluster, i: usize, name: &str) -> String {
    let slots = cluster.initial_slots(i).unwrap();
    (0..)
        .map(|k| format!("{name}{k}"))
        .find(|id| slots.contains(&slot_of(format!("plaza:room:{{{id}}}"))))
        .unwrap()
}

async fn shard_outage_leaves_the_other_shards_serving(outage: Outage) {
    let dir = tempfile::tempdir().unwrap();
    let mut cluster = RedisCluster::start(dir.path(), 3).unwrap();
    let config = RedisConfig::new(cluster.seed_url(), "a").with_timeout(LONG_TIMEOUT);
    let a: Arc<RedisBroker> = guard(RedisBroker::connect_with(config)).await.unwrap();
    let stuck = room_on(&cluster, 0, "stuck");
    let healthy = [room_on(&cluster, 1, "one"), room_on(&cluster, 2, "two")];
    let (tx, mut rx) = mpsc::unbounded_channel();
    for room in std::iter::once(&stuck).chain(&healthy) {
        guard(a.create_room(room, data("m"), data("s")))
            .await
            .unwrap();
        guard(a.subscribe(room, tagged(room, &tx))).await.unwrap();
    }
    guard(a.append(&stuck, data("before"))).await.unwrap();
    assert!(matches!(next(&mut rx).await.1, LogNotice::Entry(e) if e.n == 1));

    let primary = cluster
        .primary_of(slot_of(format!("plaza:room:{{{stuck}}}")))
        .unwrap();
    let replicas = cluster.replicas_of(primary).unwrap();
    assert!(!replicas.is_empty());
    for &r in &replicas {
        cluster.pause(r).unwrap();
    }
    match outage {
        Outage::Hang => cluster.pause(primary).unwrap(),
        Outage::Kill => {
            let i = cluster
                .servers()
                .iter()
                .position(|s| s.addr() == primary)
                .unwrap();
            cluster.servers_mut()[i].kill().unwrap();
        }
    }

    // Queued first: in a broker that batches across shards, every later
    // call would wait behind it.
    let stuck_append = tokio::spawn({
        let a = a.clone();
        let stuck = stuck.clone();
        async move { a.append(&stuck, data("during")).await }
    });
    let stuck_read = tokio::spawn({
        let a = a.clone();
        let stuck = stuck.clone();
        async move { a.read(&stuck, 0, 10).await }
    });
    let mut delivered = 0;
    for k in 0..20u64 {
        let room = &healthy[k as usize % 2];
        let at = guard(a.append(room, data(&format!("h{k}")))).await.unwrap();
        assert_eq!(at.n, k / 2 + 1, "{room}");
        let read = guard(a.read(room, 0, 100)).await.unwrap();
        assert_eq!(read.len() as u64, at.n, "{room} reads back its log");
        assert!(guard(a.room_meta(room)).await.unwrap().is_some());
        assert!(
            !stuck_append.is_finished() && !stuck_read.is_finished(),
            "{outage:?}: the stuck shard answered before the healthy ones were served"
        );
    }
    // The healthy rooms' entries reached their subscriber, and a room
    // created and subscribed now, on a healthy shard, works too.
    while delivered < 20 {
        let (room, notice) = next(&mut rx).await;
        if let LogNotice::Entry(_) = notice {
            assert_ne!(room, stuck);
            delivered += 1;
        }
    }
    let fresh = room_on(&cluster, 1, "fresh");
    guard(a.create_room(&fresh, data("m"), data("s")))
        .await
        .unwrap();
    guard(a.subscribe(&fresh, tagged(&fresh, &tx)))
        .await
        .unwrap();
    assert_eq!(guard(a.append(&fresh, data("x"))).await.unwrap().n, 1);
    assert_eq!(guard(a.read(&fresh, 0, 10)).await.unwrap().len(), 1);
    assert!(
        matches!(next(&mut rx).await, (room, LogNotice::Entry(e)) if room == fresh && e.n == 1)
    );
    assert!(
        !stuck_append.is_finished(),
        "{outage:?}: the stuck shard answered before the healthy ones were served"
    );

    // The shard comes back (the hung primary thaws; the dead one's replica
    // takes over): its room works again.
    for &r in &replicas {
        cluster.resume(r).unwrap();
    }
    if let Outage::Hang = outage {
        cluster.resume(primary).unwrap();
    }
    let _ = stuck_append.await.unwrap();
    let _ = stuck_read.await.unwrap();
    let mut tries = 0;
    loop {
        match tokio::time::timeout(GUARD, a.append(&stuck, data("after"))).await {
            Ok(Ok(_)) => break,
            other => {
                tries += 1;
                assert!(
                    tries < 20,
                    "{outage:?}: the shard never came back: {other:?}"
                );
                // A client's backoff while the failover completes.
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_shard_delays_only_its_own_rooms() {
    shard_outage_leaves_the_other_shards_serving(Outage::Hang).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_shard_delays_only_its_own_rooms() {
    shard_outage_leaves_the_other_shards_serving(Outage::Kill).await;
}
