//! Cluster mode on Sentinel with real processes: a Redis primary, two
//! replicas and three Sentinels (`plaza cluster up --redis-sentinel`), two
//! `plaza serve --redis redis+sentinel://…` nodes. The primary is SIGKILLed
//! under publish load; the Sentinels promote a replica and the nodes follow.
//!
//! With `--broker-ack replicas:1` every acknowledged event must reach every
//! member exactly once, in order, and publishing resumes. With `primary`,
//! what the failover lost is reported: only the recovery is guaranteed. And
//! `replicas:1` with no replica at all refuses writes promptly.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use crate::cluster_support::{
    assert_exactly_once, count_id, finish, id, log_payloads, next_frame, publish_all_retrying,
    publish_from_all, start_cluster, ws_url, Member, LIMIT,
};
use plaza_launch::{LbKind, LocalCluster};
use serde_json::json;

fn start(name: &str, ack: &str) -> (LocalCluster, tempfile::TempDir) {
    start_with(name, ack, true)
}

/// [`start`], on Sentinels or (`sentinel` false) one Redis without replicas.
fn start_with(name: &str, ack: &str, sentinel: bool) -> (LocalCluster, tempfile::TempDir) {
    start_cluster(name, 2, LbKind::Nginx, &["--broker-ack", ack], sentinel)
}

/// Waits until the Sentinels name a primary other than server `old`.
pub(crate) async fn promoted(cluster: &LocalCluster, old: usize) -> usize {
    let deadline = Instant::now() + LIMIT;
    loop {
        if let Ok(now) = cluster.sentinels().unwrap().primary() {
            if now != old {
                return now;
            }
        }
        assert!(Instant::now() < deadline, "no replica was promoted");
        // Sentinel has no event to wait on from here: poll it.
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// SIGKILLs the server the Sentinels name as primary; its index.
pub(crate) fn kill_primary(cluster: &mut LocalCluster) -> usize {
    let sentinels = cluster.sentinels_mut().unwrap();
    let primary = sentinels.primary().unwrap();
    sentinels.servers_mut()[primary].kill().unwrap();
    primary
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sentinel_failover_with_replicas_1_loses_nothing_acknowledged() {
    let (mut cluster, _dir) = start("sentinel-ack", "replicas:1");
    let room = "failover";
    // Two members on each node: the room spans the cluster.
    let mut members = Vec::new();
    for (name, node) in [("a", 0), ("b", 1), ("c", 0), ("d", 1)] {
        let url = ws_url(&cluster.node(node).url(), room);
        members.push(Member::join(&url, room, name).await);
    }
    const N: usize = 40;
    let (progress, mut acked) = tokio::sync::watch::channel(0usize);
    let tasks = publish_from_all(members, N, progress);
    acked.wait_for(|&n| n >= N / 3).await.unwrap();
    let killed_at = Instant::now();
    let old = kill_primary(&mut cluster);
    let errors = finish(tasks, N).await;
    let new = promoted(&cluster, old).await;
    println!(
        "replicas:1: server {old} killed, server {new} promoted; every publish acknowledged \
         {:?} after the kill, {errors} broker_unavailable answers retried",
        killed_at.elapsed()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sentinel_failover_with_primary_acks_reports_what_was_lost() {
    let (mut cluster, _dir) = start("sentinel-primary", "primary");
    let room = "lossy";
    let mut publishers = Vec::new();
    for (name, node) in [("a", 0), ("b", 1)] {
        let url = ws_url(&cluster.node(node).url(), room);
        publishers.push(Member::join(&url, room, name).await);
    }
    // Bursts from both nodes, all in flight at once (within the rate
    // limit's burst): the primary dies while Redis is busy with them, which
    // is when a replica lags most.
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
    let acked_before = publishers[0].acked.len();
    let old = kill_primary(&mut cluster);
    // Every publish is answered, acknowledged or failed (broker_unavailable),
    // except those that landed on the old primary only and were lost with
    // it: nothing answers those. Ten seconds after the promotion, what is
    // still unanswered counts as such.
    let new = promoted(&cluster, old).await;
    // A member closed with 4005 (the failover lost entries it saw) is done too.
    let answered = |m: &Member| m.history_rewritten || m.acked.len() + m.errors.len() >= N;
    for m in publishers.iter_mut() {
        let _ = tokio::time::timeout(Duration::from_secs(10), m.pump_until(LIMIT, answered)).await;
        for e in &m.errors {
            assert_eq!(e["code"], "broker_unavailable", "{e}");
        }
    }

    // What the promoted replica's log holds of the acknowledged publishes.
    let server = &cluster.sentinels().unwrap().servers()[new];
    let payloads = log_payloads(&server.url(), room);
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
        "primary: server {old} killed when a had {acked_before} of its {N} acknowledgements, \
         server {new} promoted; of {} publishes {} were acknowledged, {failed} failed \
         (broker_unavailable), {} unanswered; acknowledged but missing from the new \
         primary's log: {} {lost:?}; closed with 4005: {rewritten:?}",
        2 * N,
        acked.len(),
        (2 * N).saturating_sub(acked.len() + failed),
        lost.len()
    );
    // No entry is in the log twice, lost or not.
    for id in &acked {
        assert!(in_log(id) <= 1, "{id} is in the log twice");
    }

    // Guaranteed: the cluster works again on the new primary. A fresh room,
    // so that its log cannot have gone back (that is issue 38's item 4).
    let room = "after";
    let mut b = Member::join(&ws_url(&cluster.node(0).url(), room), room, "b").await;
    let mut c = Member::join(&ws_url(&cluster.node(1).url(), room), room, "c").await;
    let e = publish_all_retrying(&mut b, 5, |_| {}).await;
    let f = publish_all_retrying(&mut c, 5, |_| {}).await;
    println!("primary: the fresh room needed {} retries", e + f);
    b.pump_until(LIMIT, |b| b.received.len() == 5).await;
    c.pump_until(LIMIT, |c| c.received.len() == 5).await;
    assert_exactly_once(&[&b, &c]);
}

/// `replicas:1` on a Redis without replicas: a client's first write, its
/// join, is refused with `broker_unavailable` once WAIT's second is up,
/// rather than left waiting.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_1_without_a_replica_refuses_with_broker_unavailable_rather_than_hanging() {
    use futures_util::SinkExt;
    use tokio_tungstenite::tungstenite::Message;
    let (cluster, _dir) = start_with("no-replica", "replicas:1", false);
    let room = "alone";
    let (mut ws, _) = tokio_tungstenite::connect_async(ws_url(&cluster.node(0).url(), room))
        .await
        .unwrap();
    let started = Instant::now();
    let join = json!({"type": "join", "room": room, "name": "a"});
    ws.send(Message::text(join.to_string())).await.unwrap();
    let answer = tokio::time::timeout(Duration::from_secs(10), next_frame(&mut ws))
        .await
        .expect("an answer, not a hang")
        .unwrap();
    let took = started.elapsed();
    assert_eq!(answer["type"], "error", "{answer}");
    assert_eq!(answer["code"], "broker_unavailable", "{answer}");
    let message = answer["message"].as_str().unwrap();
    assert!(message.contains("only 0 of 1 replicas"), "{answer}");
    // WAIT's timeout is 1 s (Redis checks it ten times a second).
    assert!(
        took >= Duration::from_millis(900),
        "answered after {took:?}"
    );
}
