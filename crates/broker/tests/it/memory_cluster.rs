//! What only [`MemoryCluster`] does: simulated crashes and outages, and
//! listeners called within `append`.

use crate::support::*;
use plaza_broker::{ClusterError, LogNotice, MemoryCluster};

#[tokio::test]
async fn an_outage_fails_every_call_and_ends_with_resubscribed() {
    let hub = MemoryCluster::new();
    let a = hub.node("a");
    a.create_room("r", data("m"), data("s")).await.unwrap();
    let (l, mut rx) = listener();
    a.subscribe("r", l).await.unwrap();

    hub.set_available(false);
    assert!(unavailable(a.append("r", data("x")).await));
    assert!(unavailable(a.read("r", 0, 1).await));
    assert!(unavailable(a.create_room("q", data("m"), data("s")).await));
    assert!(unavailable(a.nodes_alive(&["a".into()]).await));
    assert!(!a.ready().await);

    hub.set_available(true);
    assert_eq!(rx.try_recv().unwrap(), LogNotice::Resubscribed);
    assert_eq!(a.append("r", data("x")).await.unwrap().n, 1);
    assert_eq!(entry(rx.try_recv().unwrap()).n, 1);
}

#[tokio::test]
async fn a_killed_node_is_dead_deaf_and_mute_until_started_again() {
    let hub = MemoryCluster::new();
    let a = hub.node("a");
    let b = hub.node("b");
    a.create_room("r", data("m"), data("s")).await.unwrap();
    let (lb, mut rx_b) = listener();
    b.subscribe("r", lb).await.unwrap();

    hub.kill_node("b");
    assert_eq!(a.nodes_alive(&["b".into()]).await.unwrap(), vec![false]);
    a.append("r", data("x")).await.unwrap();
    assert!(rx_b.try_recv().is_err());
    assert!(matches!(
        b.append("r", data("y")).await,
        Err(ClusterError::Unavailable(_))
    ));

    let b2 = hub.node("b");
    assert_eq!(a.nodes_alive(&["b".into()]).await.unwrap(), vec![true]);
    assert_eq!(b2.append("r", data("y")).await.unwrap().n, 2);
    // The crashed incarnation stays dead.
    assert!(b.read("r", 0, 1).await.is_err());
}

#[tokio::test]
async fn listeners_are_called_within_append() {
    let hub = MemoryCluster::with_log_capacity(3);
    let a = hub.node("a");
    let b = hub.node("b");
    a.create_room("r", data("m"), data("s")).await.unwrap();
    let (l, mut rx) = listener();
    a.subscribe("r", l).await.unwrap();
    let pending = b.append("r", data("x"));
    // Delivered before the append's future is even polled.
    assert_eq!(entry(rx.try_recv().unwrap()).n, 1);
    assert_eq!(pending.await.unwrap().n, 1);
}
