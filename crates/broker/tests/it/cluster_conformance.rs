//! One behaviour suite for every [`Cluster`] implementation, written once
//! against `Arc<dyn Cluster>` and run against [`MemoryCluster`] and
//! [`plaza_broker::RedisBroker`] (each Redis test starts its own
//! `redis-server`).

use std::sync::Arc;

use crate::support::redis::RedisServer;
use crate::support::*;
use async_trait::async_trait;
use bytes::Bytes;
use futures_util::future::join_all;
use plaza_broker::{Cluster, ClusterError, LogEntry, LogNotice, MemoryCluster};
use tokio::sync::mpsc;

/// A way to run several nodes of one cluster.
#[async_trait]
trait Backend: Sized + Send + Sync + 'static {
    /// A fresh, empty cluster whose rooms keep `log_capacity` entries.
    async fn start(log_capacity: usize) -> Self;
    /// Starts node `id`.
    async fn node(&self, id: &str) -> Arc<dyn Cluster>;
}

struct Memory(Arc<MemoryCluster>);

#[async_trait]
impl Backend for Memory {
    async fn start(log_capacity: usize) -> Self {
        Memory(MemoryCluster::with_log_capacity(log_capacity))
    }

    async fn node(&self, id: &str) -> Arc<dyn Cluster> {
        self.0.node(id)
    }
}

struct Redis {
    server: RedisServer,
    log_capacity: usize,
}

#[async_trait]
impl Backend for Redis {
    async fn start(log_capacity: usize) -> Self {
        Redis {
            server: RedisServer::start(),
            log_capacity,
        }
    }

    async fn node(&self, id: &str) -> Arc<dyn Cluster> {
        redis_node(&self.server, id, self.log_capacity).await
    }
}

/// The seed URL of the Redis Cluster [`RedisCluster`] backends use: one
/// cluster runs every generic test in turn (starting six servers per test
/// would cost more than the tests).
static CLUSTER_URL: std::sync::Mutex<Option<String>> = std::sync::Mutex::new(None);

/// Nodes of the Redis Cluster at [`CLUSTER_URL`], each test under its own
/// key prefix.
struct RedisCluster {
    url: String,
    prefix: String,
    log_capacity: usize,
}

#[async_trait]
impl Backend for RedisCluster {
    async fn start(log_capacity: usize) -> Self {
        static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        RedisCluster {
            url: CLUSTER_URL
                .lock()
                .unwrap()
                .clone()
                .expect("a Redis Cluster is running"),
            prefix: format!("t{}-{n}:", std::process::id()),
            log_capacity,
        }
    }

    async fn node(&self, id: &str) -> Arc<dyn Cluster> {
        let config = plaza_broker::RedisConfig::new(&self.url, id)
            .with_log_capacity(self.log_capacity)
            .with_key_prefix(&self.prefix);
        guard(plaza_broker::RedisBroker::connect_with(config))
            .await
            .expect("connect to the test redis cluster")
    }
}

/// Generates one test per backend for each generic test below.
macro_rules! conformance {
    ($($test:ident),* $(,)?) => {
        mod memory {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $test() {
                    super::$test::<super::Memory>().await
                }
            )*
        }
        mod redis {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $test() {
                    super::$test::<super::Redis>().await
                }
            )*
        }
        mod redis_cluster {
            /// Every generic test, in turn, on one Redis Cluster of three
            /// primaries with a replica each.
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn every_behaviour_on_a_redis_cluster() {
                let dir = tempfile::tempdir().unwrap();
                let cluster = plaza_launch::RedisCluster::start(dir.path(), 3)
                    .expect("start a Redis Cluster (scripts/test.sh installs redis-server)");
                *super::CLUSTER_URL.lock().unwrap() = Some(cluster.seed_url());
                $(
                    println!("{}", stringify!($test));
                    super::$test::<super::RedisCluster>().await;
                )*
                drop(cluster);
            }
        }
    };
}

conformance!(
    registry_creates_lists_and_deletes_rooms,
    a_recreated_room_starts_afresh,
    appends_get_gap_free_positions_in_call_order,
    appends_from_several_nodes_share_one_order,
    unknown_rooms_are_not_found,
    reads_follow_after_and_limit,
    reading_before_the_trimmed_start_says_trimmed,
    newer_snapshots_win,
    member_counts_are_recorded_by_position,
    subscribers_get_every_entry_in_order,
    unsubscribing_stops_delivery,
    subscribing_again_replaces_the_listener,
    nodes_alive_tells_live_from_left_nodes,
);

async fn registry_creates_lists_and_deletes_rooms<B: Backend>() {
    let cluster = B::start(100).await;
    let a = cluster.node("a").await;
    let b = cluster.node("b").await;
    assert!(a
        .create_room("r1", data("meta1"), data("snap1"))
        .await
        .unwrap());
    assert!(!b.create_room("r1", data("other"), data("x")).await.unwrap());
    assert!(b
        .create_room("r2", data("meta2"), data("snap2"))
        .await
        .unwrap());
    assert_eq!(b.room_meta("r1").await.unwrap(), Some(data("meta1")));
    assert_eq!(b.room_meta("nope").await.unwrap(), None);
    let mut rooms = b.list_rooms().await.unwrap();
    rooms.sort();
    assert_eq!(
        rooms,
        vec![("r1".into(), data("meta1")), ("r2".into(), data("meta2"))]
    );
    assert_eq!(
        b.load_snapshot("r1").await.unwrap(),
        Some((0, data("snap1")))
    );

    assert!(b.delete_room("r1").await.unwrap());
    assert!(!a.delete_room("r1").await.unwrap());
    assert_eq!(a.room_meta("r1").await.unwrap(), None);
    assert_eq!(a.load_snapshot("r1").await.unwrap(), None);
    assert_eq!(
        a.list_rooms().await.unwrap(),
        vec![("r2".into(), data("meta2"))]
    );
}

async fn a_recreated_room_starts_afresh<B: Backend>() {
    let cluster = B::start(100).await;
    let a = cluster.node("a").await;
    a.create_room("r", data("old"), data("s0")).await.unwrap();
    a.append("r", data("x")).await.unwrap();
    a.append("r", data("y")).await.unwrap();
    a.store_snapshot("r", 2, data("s2")).await.unwrap();
    assert!(a.delete_room("r").await.unwrap());

    assert!(a
        .create_room("r", data("new"), data("fresh"))
        .await
        .unwrap());
    assert_eq!(a.append("r", data("z")).await.unwrap().n, 1);
    let entries = a.read("r", 0, 10).await.unwrap();
    assert_eq!(entries.len(), 1);
    assert_eq!(entries[0].payload, data("z"));
    assert_eq!(
        a.load_snapshot("r").await.unwrap(),
        Some((0, data("fresh")))
    );
    assert_eq!(a.room_meta("r").await.unwrap(), Some(data("new")));
}

async fn appends_get_gap_free_positions_in_call_order<B: Backend>() {
    let cluster = B::start(10_000).await;
    let a = cluster.node("a").await;
    a.create_room("r", data("m"), data("s")).await.unwrap();
    // All queued before any is awaited: the order of the calls is what counts.
    let calls: Vec<_> = (0..300)
        .map(|i| a.append("r", data(&format!("m{i}"))))
        .collect();
    let positions: Vec<_> = guard(join_all(calls))
        .await
        .into_iter()
        .map(Result::unwrap)
        .collect();
    for (i, p) in positions.iter().enumerate() {
        assert_eq!(p.n, i as u64 + 1);
    }
    assert!(positions.windows(2).all(|w| w[0].ts <= w[1].ts));

    let entries = a.read("r", 0, 1_000).await.unwrap();
    assert_eq!(entries.len(), 300);
    for (i, (e, p)) in entries.iter().zip(&positions).enumerate() {
        assert_eq!((e.n, e.ts), (p.n, p.ts));
        assert_eq!(e.payload, data(&format!("m{i}")));
    }
}

async fn appends_from_several_nodes_share_one_order<B: Backend>() {
    let cluster = B::start(10_000).await;
    let a = cluster.node("a").await;
    let b = cluster.node("b").await;
    a.create_room("r", data("m"), data("s")).await.unwrap();
    let (mut from_a, mut from_b) = (Vec::new(), Vec::new());
    for i in 0..100 {
        from_a.push(a.append("r", data(&format!("a{i}"))));
        from_b.push(b.append("r", data(&format!("b{i}"))));
    }
    let (from_a, from_b) = guard(futures_util::future::join(
        join_all(from_a),
        join_all(from_b),
    ))
    .await;
    let ns = |results: Vec<Result<plaza_broker::LogPosition, ClusterError>>| -> Vec<u64> {
        results.into_iter().map(|r| r.unwrap().n).collect()
    };
    let (ns_a, ns_b) = (ns(from_a), ns(from_b));
    // Each node's appends keep their call order...
    assert!(ns_a.windows(2).all(|w| w[0] < w[1]));
    assert!(ns_b.windows(2).all(|w| w[0] < w[1]));
    // ...within one gap-free order of the room.
    let mut all: Vec<u64> = ns_a.iter().chain(&ns_b).copied().collect();
    all.sort_unstable();
    assert_eq!(all, (1..=200).collect::<Vec<u64>>());

    let entries = b.read("r", 0, 1_000).await.unwrap();
    for (i, n) in ns_a.iter().enumerate() {
        assert_eq!(entries[*n as usize - 1].payload, data(&format!("a{i}")));
    }
    for (i, n) in ns_b.iter().enumerate() {
        assert_eq!(entries[*n as usize - 1].payload, data(&format!("b{i}")));
    }
}

async fn unknown_rooms_are_not_found<B: Backend>() {
    let cluster = B::start(100).await;
    let a = cluster.node("a").await;
    let ghost = || ClusterError::RoomNotFound("ghost".into());
    assert_eq!(a.append("ghost", data("x")).await, Err(ghost()));
    assert_eq!(a.read("ghost", 0, 10).await, Err(ghost()));
    assert_eq!(a.store_snapshot("ghost", 1, data("s")).await, Err(ghost()));
    assert_eq!(a.load_snapshot("ghost").await, Ok(None));
    assert_eq!(a.room_meta("ghost").await, Ok(None));
    assert_eq!(a.delete_room("ghost").await, Ok(false));
}

async fn reads_follow_after_and_limit<B: Backend>() {
    let cluster = B::start(100).await;
    let a = cluster.node("a").await;
    a.create_room("r", data("m"), data("s")).await.unwrap();
    for i in 1..=10 {
        a.append("r", data(&format!("e{i}"))).await.unwrap();
    }
    let ns = |entries: Vec<LogEntry>| entries.iter().map(|e| e.n).collect::<Vec<_>>();
    assert_eq!(ns(a.read("r", 0, 3).await.unwrap()), vec![1, 2, 3]);
    assert_eq!(
        ns(a.read("r", 3, 100).await.unwrap()),
        (4..=10).collect::<Vec<_>>()
    );
    assert_eq!(ns(a.read("r", 9, 1).await.unwrap()), vec![10]);
    assert_eq!(a.read("r", 10, 5).await.unwrap(), vec![]);
    assert_eq!(a.read("r", 25, 5).await.unwrap(), vec![]);
    assert_eq!(a.read("r", 0, 0).await.unwrap(), vec![]);
    assert_eq!(a.read("r", 4, 1).await.unwrap()[0].payload, data("e5"));
}

async fn reading_before_the_trimmed_start_says_trimmed<B: Backend>() {
    let cluster = B::start(5).await;
    let a = cluster.node("a").await;
    a.create_room("r", data("m"), data("s")).await.unwrap();
    // Far beyond the capacity: Redis trims whole blocks of about 100 entries.
    let calls: Vec<_> = (0..300).map(|_| a.append("r", data("e"))).collect();
    for result in guard(join_all(calls)).await {
        result.unwrap();
    }
    assert_eq!(
        a.read("r", 0, 10).await,
        Err(ClusterError::Trimmed("r".into()))
    );
    let tail = a.read("r", 295, 10).await.unwrap();
    assert_eq!(
        tail.iter().map(|e| e.n).collect::<Vec<_>>(),
        vec![296, 297, 298, 299, 300]
    );
    assert_eq!(a.read("r", 300, 10).await.unwrap(), vec![]);
}

async fn newer_snapshots_win<B: Backend>() {
    let cluster = B::start(100).await;
    let a = cluster.node("a").await;
    let b = cluster.node("b").await;
    a.create_room("r", data("m"), data("s0")).await.unwrap();
    a.store_snapshot("r", 5, data("five")).await.unwrap();
    assert_eq!(b.load_snapshot("r").await.unwrap(), Some((5, data("five"))));
    b.store_snapshot("r", 3, data("three")).await.unwrap();
    b.store_snapshot("r", 5, data("again")).await.unwrap();
    assert_eq!(a.load_snapshot("r").await.unwrap(), Some((5, data("five"))));
    b.store_snapshot("r", 7, Bytes::from_static(&[0, 255, 7]))
        .await
        .unwrap();
    assert_eq!(
        a.load_snapshot("r").await.unwrap(),
        Some((7, Bytes::from_static(&[0, 255, 7])))
    );
}

async fn member_counts_are_recorded_by_position<B: Backend>() {
    let cluster = B::start(100).await;
    let a = cluster.node("a").await;
    let b = cluster.node("b").await;
    a.create_room("r", data("m"), data("s0")).await.unwrap();
    a.create_room("quiet", data("m"), data("s0")).await.unwrap();
    let ids = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    // Nothing recorded yet, and unknown rooms: 0.
    assert_eq!(b.room_members(&ids(&["r", "nope"])).await.unwrap(), [0, 0]);
    a.set_room_members("r", 3, 10).await.unwrap();
    assert_eq!(b.room_members(&ids(&["r", "quiet"])).await.unwrap(), [3, 0]);
    // A count from an earlier (or the same) position lost a race: ignored.
    b.set_room_members("r", 1, 7).await.unwrap();
    b.set_room_members("r", 2, 10).await.unwrap();
    assert_eq!(a.room_members(&ids(&["r"])).await.unwrap(), [3]);
    b.set_room_members("r", 0, 11).await.unwrap();
    assert_eq!(a.room_members(&ids(&["r"])).await.unwrap(), [0]);
    // An unknown room is not created by a count.
    a.set_room_members("ghost", 5, 1).await.unwrap();
    assert_eq!(a.room_meta("ghost").await.unwrap(), None);
    assert_eq!(a.room_members(&[]).await.unwrap(), Vec::<u64>::new());
    // The registry is unchanged by counts.
    let mut rooms = a.list_rooms().await.unwrap();
    rooms.sort();
    assert_eq!(rooms.len(), 2);
}

async fn subscribers_get_every_entry_in_order<B: Backend>() {
    let cluster = B::start(10_000).await;
    let a = cluster.node("a").await;
    let b = cluster.node("b").await;
    a.create_room("r", data("m"), data("s")).await.unwrap();
    let (l, mut rx) = listener();
    a.subscribe("r", l).await.unwrap();

    // Binary payloads, from the subscribing node and another one.
    let payloads: Vec<Bytes> = (0..60u8)
        .map(|i| Bytes::from(vec![i, 0, 255, b'\n', i]))
        .chain([Bytes::new()])
        .collect();
    let calls: Vec<_> = payloads
        .iter()
        .enumerate()
        .map(|(i, p)| if i % 2 == 0 { &b } else { &a }.append("r", p.clone()))
        .collect();
    let positions: Vec<_> = guard(join_all(calls)).await;
    let mut expected: Vec<LogEntry> = positions
        .into_iter()
        .zip(payloads)
        .map(|(p, payload)| {
            let p = p.unwrap();
            LogEntry {
                n: p.n,
                ts: p.ts,
                payload,
            }
        })
        .collect();
    expected.sort_by_key(|e| e.n);
    for e in expected {
        assert_eq!(next(&mut rx).await, LogNotice::Entry(e));
    }
    // Exactly those: the next notice is the next entry.
    let last = b.append("r", data("last")).await.unwrap();
    assert_eq!(entry(next(&mut rx).await).n, last.n);
}

// Delivery keeps order within a room only (on a Redis Cluster two rooms
// may be on two servers), so these tests fence with the same room.

async fn unsubscribing_stops_delivery<B: Backend>() {
    let cluster = B::start(100).await;
    let a = cluster.node("a").await;
    let b = cluster.node("b").await;
    a.create_room("r", data("m"), data("s")).await.unwrap();
    let (tx, mut rx) = mpsc::unbounded_channel();
    a.subscribe("r", tagged("before", &tx)).await.unwrap();

    b.append("r", data("1")).await.unwrap();
    let (tag, notice) = next(&mut rx).await;
    assert_eq!((tag.as_str(), entry(notice).n), ("before", 1));

    a.unsubscribe("r").await;
    b.append("r", data("2")).await.unwrap();
    a.subscribe("r", tagged("after", &tx)).await.unwrap();
    b.append("r", data("3")).await.unwrap();
    // Entry 2 came while nobody listened: had it been delivered, it would
    // come before 3.
    let (tag, notice) = next(&mut rx).await;
    assert_eq!((tag.as_str(), entry(notice).n), ("after", 3));
}

async fn subscribing_again_replaces_the_listener<B: Backend>() {
    let cluster = B::start(100).await;
    let a = cluster.node("a").await;
    let b = cluster.node("b").await;
    a.create_room("r", data("m"), data("s")).await.unwrap();
    let (tx, mut rx) = mpsc::unbounded_channel();
    a.subscribe("r", tagged("old", &tx)).await.unwrap();
    a.subscribe("r", tagged("new", &tx)).await.unwrap();

    b.append("r", data("x")).await.unwrap();
    b.append("r", data("y")).await.unwrap();
    // Each entry once, to the new listener only: an entry given to the old
    // one as well would come between these two.
    for n in [1, 2] {
        let (tag, notice) = next(&mut rx).await;
        assert_eq!((tag.as_str(), entry(notice).n), ("new", n));
    }
}

async fn nodes_alive_tells_live_from_left_nodes<B: Backend>() {
    let cluster = B::start(100).await;
    let a = cluster.node("a").await;
    let b = cluster.node("b").await;
    a.create_room("r", data("m"), data("s")).await.unwrap();
    let ids = ["a".to_string(), "b".to_string(), "ghost".to_string()];
    assert_eq!(a.nodes_alive(&ids).await.unwrap(), vec![true, true, false]);
    assert_eq!(a.nodes_alive(&[]).await.unwrap(), Vec::<bool>::new());
    assert!(b.ready().await);

    guard(b.leave()).await;
    assert_eq!(a.nodes_alive(&ids).await.unwrap(), vec![true, false, false]);
    // A node that left writes nothing more: others may have taken over.
    assert!(matches!(
        b.append("r", data("zombie")).await,
        Err(ClusterError::Unavailable(_))
    ));
    assert!(matches!(
        b.read("r", 0, 10).await,
        Err(ClusterError::Unavailable(_))
    ));
    assert!(!b.ready().await);
    assert!(a.ready().await);
    assert_eq!(a.read("r", 0, 10).await.unwrap(), vec![]);
}
