//! The Redis broker on a real Redis Cluster while slots move: a room whose
//! slot is migrating and whose keys already moved (so that they are on the
//! importing primary, reached with `ASK`), and a subscriber that follows its
//! slot to the new primary (Redis ends a shard subscription when the slot
//! moves; the broker subscribes again and says `Resubscribed`).

use std::sync::Arc;

use crate::support::*;
use plaza_broker::{Cluster, LogNotice, RedisBroker, RedisConfig};
use plaza_launch::{slot_of, RedisCluster};
use tokio::sync::mpsc;

async fn node(cluster: &RedisCluster, id: &str) -> Arc<RedisBroker> {
    let config = RedisConfig::new(cluster.seed_url(), id);
    guard(RedisBroker::connect_with(config))
        .await
        .expect("connect to the Redis Cluster")
}

fn room_slot(room: &str) -> u16 {
    slot_of(format!("plaza:room:{{{room}}}"))
}

/// A room's keys (the broker's layout with the default prefix).
fn room_keys(room: &str) -> Vec<String> {
    ["", ":log", ":snap"]
        .iter()
        .map(|suffix| format!("plaza:room:{{{room}}}{suffix}"))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rooms_work_while_their_slot_migrates_and_subscribers_follow_it() {
    let dir = tempfile::tempdir().unwrap();
    let mut cluster = RedisCluster::start(dir.path(), 3).unwrap();
    let a = node(&cluster, "a").await;
    let b = node(&cluster, "b").await;
    let old = "old";
    let slot = room_slot(old);
    guard(a.create_room(old, data("m"), data("s")))
        .await
        .unwrap();
    let (tx, mut rx) = mpsc::unbounded_channel();
    guard(a.subscribe(old, tagged(old, &tx))).await.unwrap();
    guard(b.append(old, data("1"))).await.unwrap();

    let from = cluster.primary_of(slot).unwrap();
    let to = *cluster
        .primary_addrs()
        .unwrap()
        .iter()
        .find(|p| **p != from)
        .unwrap();
    let migration = cluster.begin_migration(slot, to).unwrap();
    // Keys still on the source: served there.
    assert_eq!(guard(b.append(old, data("2"))).await.unwrap().n, 2);
    // The keys move; the slot is still the source's: commands on them are
    // sent to the target with ASKING (the source answers ASK).
    cluster.migrate_keys(&migration, &room_keys(old)).unwrap();
    assert_eq!(guard(b.append(old, data("3"))).await.unwrap().n, 3);
    let read = guard(a.read(old, 0, 10)).await.unwrap();
    let ns: Vec<u64> = read.iter().map(|e| e.n).collect();
    assert_eq!(ns, [1, 2, 3], "read through ASK");
    assert!(guard(a.room_meta(old)).await.unwrap().is_some());

    cluster.finish_migration(migration).unwrap();
    assert_eq!(cluster.primary_of(slot).unwrap(), to);
    // After the move: appends go to the new primary (MOVED), and the
    // subscriber hears of the gap (Resubscribed) or gets the entries.
    let fourth = guard(b.append(old, data("4"))).await.unwrap();
    assert_eq!(fourth.n, 4);
    let mut got = Vec::new();
    let mut resubscribed = false;
    while !got.contains(&(old.to_owned(), 4)) {
        let (room, notice) = next(&mut rx).await;
        match notice {
            LogNotice::Entry(e) => got.push((room, e.n)),
            LogNotice::Resubscribed => {
                resubscribed = true;
                // A listener then reads the log: here, the test does.
                for e in guard(a.read(old, 0, 10)).await.unwrap() {
                    got.push((old.to_owned(), e.n));
                }
            }
        }
    }
    for n in 1..=4 {
        assert!(
            got.contains(&(old.to_owned(), n)),
            "entry {n} of {old}: {got:?}"
        );
    }
    println!("resubscribed: {resubscribed}; notices: {got:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_primary_dies_its_slots_work_on_the_promoted_replica() {
    let dir = tempfile::tempdir().unwrap();
    let mut cluster = RedisCluster::start(dir.path(), 3).unwrap();
    let a = node(&cluster, "a").await;
    let room = "doomed";
    let slot = room_slot(room);
    guard(a.create_room(room, data("m"), data("s")))
        .await
        .unwrap();
    let (tx, mut rx) = mpsc::unbounded_channel();
    guard(a.subscribe(room, tagged(room, &tx))).await.unwrap();
    assert_eq!(guard(a.append(room, data("1"))).await.unwrap().n, 1);
    let (_, first) = next(&mut rx).await;
    assert!(matches!(first, LogNotice::Entry(e) if e.n == 1));

    cluster.kill_primary(slot).unwrap();
    // A new room in the same slot, on the promoted replica: every call
    // finds it (the connections to the dead primary fail first).
    let other = (0..)
        .map(|i| format!("o{i}"))
        .find(|id| room_slot(id) == slot)
        .unwrap();
    guard(a.create_room(&other, data("m"), data("s")))
        .await
        .unwrap();
    guard(a.subscribe(&other, tagged(&other, &tx)))
        .await
        .unwrap();
    let at = guard(a.append(&other, data("x"))).await.unwrap();
    assert_eq!(at.n, 1);
    assert_eq!(guard(a.read(&other, 0, 10)).await.unwrap().len(), 1);
}
