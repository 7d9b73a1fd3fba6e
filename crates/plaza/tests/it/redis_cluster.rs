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

/// What one publisher saw: for each publish, when it was sent and when it
/// was answered, and whether the answer was an ack.
struct Timeline {
    room: String,
    shard: usize,
    answers: Vec<(Instant, Instant, bool)>,
    member: Member,
}

/// Publishes one message at a time as `m` until `stop`, each retried (same
/// id) after `broker_unavailable` as a client would, timing every answer.
async fn publish_timed(
    mut m: Member,
    shard: usize,
    stop: watch::Receiver<bool>,
    progress: watch::Sender<usize>,
) -> Timeline {
    let mut answers = Vec::new();
    let mut i = 0;
    while !*stop.borrow() {
        let id = id(&m, i);
        i += 1;
        m.publish(&id, json!(id)).await;
        loop {
            let sent = Instant::now();
            m.pump_until(LIMIT, |m| m.all_acked() || !m.errors.is_empty())
                .await;
            let failed = !m.errors.is_empty();
            for e in m.errors.drain(..) {
                assert_eq!(e["code"], "broker_unavailable", "{}: {e}", m.name);
            }
            answers.push((sent, Instant::now(), !failed));
            if m.all_acked() {
                break;
            }
            // A client's backoff before retrying, not a synchronisation.
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            m.resend_unacked().await;
        }
        progress.send_replace(m.acked.len());
    }
    Timeline {
        room: m.room.clone(),
        shard,
        answers,
        member: m,
    }
}

/// The p-th percentile of `sorted` (milliseconds).
fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let at = ((p / 100.0) * (sorted.len() - 1) as f64).round() as usize;
    sorted[at.min(sorted.len() - 1)]
}

/// One shard's primary is SIGKILLed under publish load on rooms of every
/// shard (`replicas:1`, as deploy/README.md runs it): the rooms of the other
/// shards are never refused and lose nothing, and the failed-over shard's
/// rooms come back. Their ack latency and longest gap between acks around
/// the kill are printed (docs/benchmarks.md, "One shard's failover"), not
/// asserted: a speed is the benchmark's business.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_shards_failover_leaves_the_other_shards_rooms_serving() {
    let (mut cluster, _dir) =
        start_on_redis_cluster("rc-isolation", 2, &["--broker-ack", "replicas:1"], 3);
    let redis = cluster.redis_cluster().unwrap();
    let shards: Vec<std::ops::RangeInclusive<u16>> =
        (0..3).map(|i| redis.initial_slots(i).unwrap()).collect();
    let (stop_tx, stop) = watch::channel(false);
    let mut tasks = Vec::new();
    let mut receivers = Vec::new();
    let mut progress = Vec::new();
    for (shard, slots) in shards.iter().enumerate() {
        for k in 0..2 {
            let room = (0..)
                .map(|n| format!("s{shard}r{k}x{n}"))
                .find(|r| slots.contains(&room_slot(r)))
                .unwrap();
            let node = (shard + k) % 2;
            let publisher =
                Member::join(&ws_url(&cluster.node(node).url(), &room), &room, "p").await;
            let receiver =
                Member::join(&ws_url(&cluster.node(1 - node).url(), &room), &room, "r").await;
            receivers.push(receiver);
            let (tx, rx) = watch::channel(0usize);
            progress.push((shard, rx));
            tasks.push(tokio::spawn(publish_timed(
                publisher,
                shard,
                stop.clone(),
                tx,
            )));
        }
    }
    for (_, rx) in progress.iter_mut() {
        rx.wait_for(|&n| n >= 20).await.unwrap();
    }
    let slot = shards[0].clone().next().unwrap();
    let killed_at = Instant::now();
    let (mut cluster, old, new) = tokio::task::spawn_blocking(move || {
        let redis = cluster.redis_cluster_mut().unwrap();
        let old = redis.primary_of(slot).unwrap();
        let new = redis.kill_primary(slot).unwrap();
        (cluster, old, new)
    })
    .await
    .unwrap();
    let failed_over = killed_at.elapsed();
    // Back as the new primary's replica, so that replicas:1 is met again on
    // that shard.
    let redis = cluster.redis_cluster_mut().unwrap();
    let i = redis
        .servers()
        .iter()
        .position(|s| s.addr() == old)
        .unwrap();
    redis.servers_mut()[i].restart().unwrap();
    for (_, rx) in progress.iter_mut() {
        let now = *rx.borrow();
        rx.wait_for(|&n| n >= now + 20).await.unwrap();
    }
    stop_tx.send_replace(true);
    let mut timelines = Vec::new();
    for t in tasks {
        timelines.push(t.await.unwrap());
    }

    let window_end = killed_at + failed_over + std::time::Duration::from_secs(2);
    let mut before = Vec::new();
    let mut during = Vec::new();
    let mut longest_gap = std::time::Duration::ZERO;
    for t in timelines.iter().filter(|t| t.shard != 0) {
        let refused = t.answers.iter().filter(|a| !a.2).count();
        assert_eq!(refused, 0, "{}: a healthy shard's room was refused", t.room);
        let mut last: Option<Instant> = None;
        for &(sent, answered, _) in &t.answers {
            let ms = (answered - sent).as_secs_f64() * 1000.0;
            if answered < killed_at {
                before.push(ms);
            } else if sent < window_end {
                during.push(ms);
                if let Some(last) = last {
                    longest_gap = longest_gap.max(answered - last.max(killed_at));
                }
            }
            last = Some(answered);
        }
    }
    before.sort_by(f64::total_cmp);
    during.sort_by(f64::total_cmp);
    let failed_shard: usize = timelines
        .iter()
        .filter(|t| t.shard == 0)
        .map(|t| t.answers.iter().filter(|a| !a.2).count())
        .sum();
    println!(
        "shard failover: primary {old} killed, {new} promoted after {failed_over:?}; \
         healthy shards' acks before the kill: {} (p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms); \
         from the kill to 2 s after the promotion: {} (p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms), \
         longest gap between acks {longest_gap:?}; the failed shard's rooms: {failed_shard} \
         broker_unavailable answers retried",
        before.len(),
        percentile(&before, 50.0),
        percentile(&before, 99.0),
        before.last().copied().unwrap_or(0.0),
        during.len(),
        percentile(&during, 50.0),
        percentile(&during, 99.0),
        during.last().copied().unwrap_or(0.0),
    );
    // Every acknowledged message reached the room's other member once.
    for (t, mut r) in timelines.into_iter().zip(receivers) {
        let want = t.member.acked.len();
        r.pump_until(LIMIT, |r| r.received.len() >= want).await;
        assert_exactly_once(&[&t.member, &r]);
    }
}

/// The registry set listing `room` (the broker's layout on a Redis Cluster:
/// 16 sets, picked by FNV-1a of the id).
fn registry_part_slot(room: &str) -> u16 {
    let hash = room.bytes().fold(0x811c_9dc5_u32, |h, b| {
        (h ^ u32::from(b)).wrapping_mul(0x0100_0193)
    });
    slot_of(format!("plaza:rooms:{{{}}}", hash % 16))
}

/// `GET /v1/rooms` while one shard has no primary (killed, its replica
/// paused so that none takes over): the rooms that can be read are listed
/// and the answer says `"incomplete": true`, rather than the whole listing
/// failing with the shard.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_room_list_during_a_shard_outage_names_what_it_could_read() {
    let (mut cluster, _dir) = start_on_redis_cluster("rc-listing", 1, &[], 3);
    let redis = cluster.redis_cluster().unwrap();
    let shards: Vec<std::ops::RangeInclusive<u16>> =
        (0..3).map(|i| redis.initial_slots(i).unwrap()).collect();
    let on = |shard: usize, room: &str| shards[shard].contains(&room_slot(room));
    let healthy_part = |room: &str| !shards[0].contains(&registry_part_slot(room));
    let stuck = (0..)
        .map(|n| format!("stuck{n}"))
        .find(|r| on(0, r))
        .unwrap();
    let healthy: Vec<String> = (0..)
        .map(|n| format!("fine{n}"))
        .filter(|r| !on(0, r) && healthy_part(r))
        .take(3)
        .collect();
    let url = cluster.node(0).url();
    let mut members = Vec::new();
    for room in std::iter::once(&stuck).chain(&healthy) {
        members.push(Member::join(&ws_url(&url, room), room, "m").await);
    }
    let list = || async {
        let response = reqwest::get(format!("{url}/v1/rooms")).await.unwrap();
        assert_eq!(response.status(), 200);
        let body: serde_json::Value = response.json().await.unwrap();
        let ids: BTreeSet<String> = body["rooms"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["id"].as_str().unwrap().to_owned())
            .collect();
        (ids, body["incomplete"].clone())
    };
    let (ids, incomplete) = list().await;
    assert!(ids.contains(&stuck), "{ids:?}");
    assert!(healthy.iter().all(|r| ids.contains(r)), "{ids:?}");
    assert_eq!(
        incomplete,
        serde_json::Value::Null,
        "a full listing has no flag"
    );

    let redis = cluster.redis_cluster_mut().unwrap();
    let primary = redis.primary_of(room_slot(&stuck)).unwrap();
    let replicas = redis.replicas_of(primary).unwrap();
    for &r in &replicas {
        redis.pause(r).unwrap();
    }
    let i = redis
        .servers()
        .iter()
        .position(|s| s.addr() == primary)
        .unwrap();
    redis.servers_mut()[i].kill().unwrap();

    let (ids, incomplete) = list().await;
    assert_eq!(incomplete, json!(true));
    assert!(!ids.contains(&stuck), "{ids:?}");
    assert!(healthy.iter().all(|r| ids.contains(r)), "{ids:?}");
    let redis = cluster.redis_cluster_mut().unwrap();
    for &r in &replicas {
        redis.resume(r).unwrap();
    }
}
