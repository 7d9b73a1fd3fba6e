//! Cluster mode on a Redis Cluster with real processes: three primaries
//! with a replica each (`plaza cluster up --redis-cluster 3`), two
//! `plaza serve --redis redis+cluster://…` nodes, members on both.
//!
//! - A busy room's slot moves to another primary while its members publish
//!   (held in the migrating state meanwhile, so that a room created then
//!   lives on the importing primary, reached with `ASK`).
//! - The primary of a busy room's slot is SIGKILLed: with `--broker-ack
//!   replicas:1` nothing acknowledged may be lost; with `primary`, what was
//!   lost is reported.
//!
//! Each checks that every acknowledged event reached every member exactly
//! once, in order (the members check order and duplicates as frames come).

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::time::Instant;

use crate::cluster_support::{
    assert_exactly_once, count_id, finish, id, log_payloads, publish_all_retrying,
    publish_from_all, start_on_redis_cluster, ws_url, Member, LIMIT,
};
use plaza_launch::{slot_of, LocalCluster};
use serde_json::json;
use tokio::sync::watch;

/// The slot of a room's keys (`plaza:room:{id}…`: the id is the hash tag).
fn room_slot(room: &str) -> u16 {
    slot_of(format!("plaza:room:{{{room}}}"))
}

/// Two members of `room` on each node, in order a (node 0), b (node 1), …
async fn members_of(cluster: &LocalCluster, room: &str, names: &[&str]) -> Vec<Member> {
    let mut members = Vec::new();
    for (i, name) in names.iter().enumerate() {
        let url = ws_url(&cluster.node(i % 2).url(), room);
        members.push(Member::join(&url, room, name).await);
    }
    members
}

/// A room's keys in Redis.
fn room_keys(room: &str) -> Vec<String> {
    ["", ":log", ":snap"]
        .iter()
        .map(|suffix| format!("plaza:room:{{{room}}}{suffix}"))
        .collect()
}

/// A room id other than `room` whose keys are in the same slot.
pub(crate) fn neighbour_of(room: &str) -> String {
    let slot = room_slot(room);
    (0..)
        .map(|i| format!("n{i}"))
        .find(|id| room_slot(id) == slot)
        .expect("some id shares the slot")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_busy_room_loses_nothing_while_its_slot_moves_to_another_primary() {
    let (mut cluster, _dir) = start_on_redis_cluster("rc-migrate", 2, &[], 3);
    let room = "busy";
    let slot = room_slot(room);
    let members = members_of(&cluster, room, &["a", "b", "c", "d"]).await;
    const N: usize = 60;
    let (progress, mut acked) = watch::channel(0usize);
    let tasks = publish_from_all(members, N, progress);

    acked.wait_for(|&n| n >= N / 4).await.unwrap();
    let redis = cluster.redis_cluster_mut().unwrap();
    let from = redis.primary_of(slot).unwrap();
    let to: SocketAddr = *redis
        .primary_addrs()
        .unwrap()
        .iter()
        .find(|a| **a != from)
        .unwrap();
    let migration = redis.begin_migration(slot, to).unwrap();
    acked.wait_for(|&n| n >= N / 3).await.unwrap();
    // The room's keys move while the slot is still the source's: until the
    // migration ends, its appends and reads go to the target with ASKING.
    cluster
        .redis_cluster()
        .unwrap()
        .migrate_keys(&migration, &room_keys(room))
        .unwrap();
    acked.wait_for(|&n| n >= N / 2).await.unwrap();
    let moved = cluster
        .redis_cluster_mut()
        .unwrap()
        .finish_migration(migration)
        .unwrap();
    assert_eq!(
        cluster.redis_cluster().unwrap().primary_of(slot).unwrap(),
        to,
        "the slot moved"
    );
    let errors = finish(tasks, N).await;
    println!(
        "slot {slot} moved from {from} to {to} with {moved} keys under publish load; \
         {errors} broker_unavailable answers retried"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_primary_killed_under_load_with_replicas_1_loses_nothing_acknowledged() {
    let (mut cluster, _dir) =
        start_on_redis_cluster("rc-kill", 2, &["--broker-ack", "replicas:1"], 3);
    let room = "failover";
    let slot = room_slot(room);
    let members = members_of(&cluster, room, &["a", "b", "c", "d"]).await;
    const N: usize = 40;
    let (progress, mut acked) = watch::channel(0usize);
    let tasks = publish_from_all(members, N, progress);
    acked.wait_for(|&n| n >= N / 3).await.unwrap();
    let killed_at = Instant::now();
    let redis = cluster.redis_cluster_mut().unwrap();
    let old = redis.primary_of(slot).unwrap();
    let new = redis.kill_primary(slot).unwrap();
    // The promoted replica has no replica of its own: until one is back,
    // WAIT 1 cannot be met and writes to its slots are refused. The killed
    // server comes back as an operator would restart it, and rejoins as
    // the new primary's replica.
    let killed = redis
        .servers()
        .iter()
        .position(|s| s.addr() == old)
        .unwrap();
    redis.servers_mut()[killed].restart().unwrap();
    let errors = finish(tasks, N).await;
    println!(
        "replicas:1: primary {old} of slot {slot} killed, {new} promoted; every publish \
         acknowledged {:?} after the kill, {errors} broker_unavailable answers retried",
        killed_at.elapsed()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_primary_killed_with_primary_acks_reports_what_was_lost() {
    let (mut cluster, _dir) =
        start_on_redis_cluster("rc-lossy", 2, &["--broker-ack", "primary"], 3);
    let room = "lossy";
    let slot = room_slot(room);
    let mut publishers = members_of(&cluster, room, &["a", "b"]).await;
    // Bursts from both nodes, all in flight at once: the primary dies while
    // busy with them, which is when its replica lags most.
    const N: usize = 400;
    for m in publishers.iter_mut() {
        for i in 0..N {
            let id = id(m, i);
            m.publish(&id, json!(id)).await;
        }
    }
    publishers[0]
        .pump_until(LIMIT, |a| a.acked.len() >= N / 8)
        .await;
    let redis = cluster.redis_cluster_mut().unwrap();
    let old = redis.primary_of(slot).unwrap();
    let new = redis.kill_primary(slot).unwrap();
    // Every publish is answered, acknowledged or failed, except those that
    // landed on the old primary only: nothing answers those. Ten seconds
    // after the promotion, what is still unanswered counts as such.
    // A member closed with 4005 (the failover lost entries it saw) is done too.
    let answered = |m: &Member| m.history_rewritten || m.acked.len() + m.errors.len() >= N;
    for m in publishers.iter_mut() {
        let _ = tokio::time::timeout(
            std::time::Duration::from_secs(10),
            m.pump_until(LIMIT, answered),
        )
        .await;
        for e in &m.errors {
            assert_eq!(e["code"], "broker_unavailable", "{e}");
        }
    }
    // What the promoted primary's log holds of the acknowledged publishes.
    let payloads = log_payloads(&format!("redis://{new}/"), room);
    let in_log = |id: &str| count_id(&payloads, id);
    let acked: BTreeSet<&String> = publishers.iter().flat_map(|m| m.acked.keys()).collect();
    let failed: usize = publishers.iter().map(|m| m.errors.len()).sum();
    let lost: Vec<&&String> = acked.iter().filter(|id| in_log(id) == 0).collect();
    let rewritten: Vec<&str> = publishers
        .iter()
        .filter(|m| m.history_rewritten)
        .map(|m| m.name.as_str())
        .collect();
    println!(
        "primary: {old} killed, {new} promoted; of {} publishes {} were acknowledged, {failed} \
         failed (broker_unavailable); acknowledged but missing from the new primary's log: {} {lost:?}; closed with 4005: {rewritten:?}",
        2 * N,
        acked.len(),
        lost.len()
    );
    for id in &acked {
        assert!(in_log(id) <= 1, "{id} is in the log twice");
    }
    // Guaranteed: the cluster works again. A fresh room in the same slot,
    // on the promoted primary.
    let room = neighbour_of("lossy");
    let mut b = Member::join(&ws_url(&cluster.node(0).url(), &room), &room, "b").await;
    let mut c = Member::join(&ws_url(&cluster.node(1).url(), &room), &room, "c").await;
    publish_all_retrying(&mut b, 5, |_| {}).await;
    publish_all_retrying(&mut c, 5, |_| {}).await;
    b.pump_until(LIMIT, |b| b.received.len() == 5).await;
    c.pump_until(LIMIT, |c| c.received.len() == 5).await;
    assert_exactly_once(&[&b, &c]);
}
