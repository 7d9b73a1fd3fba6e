//! Connection and node lifecycle: leave, disconnect, shutdown.

use std::time::Duration;

use crate::support::{Client, Closed, TestServer};
use serde_json::{json, Value};
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::protocol::CloseFrame;

#[tokio::test]
async fn leave_is_answered_and_seen_by_the_others() {
    let s = TestServer::start().await;
    s.create_room(json!({"id": "r"})).await;
    let mut c = s.join_all("r", &["ann", "bob"]).await;
    let (mut b, _) = c.pop().unwrap();
    let (mut a, ja) = c.pop().unwrap();
    a.request("r", json!(1), "lock.acquire", json!({"object": "o"}))
        .await;
    b.recv_event("lock.acquired").await;

    a.send(json!({"type": "leave", "room": "r"})).await;
    assert_eq!(a.recv().await, json!({"type": "left", "room": "r"}));
    // Its locks end with it, then it is seen leaving.
    let (rel, _) = b.recv_event("lock.released").await;
    assert_eq!(rel["owner"], ja["session"]);
    assert_eq!(rel["reason"], "disconnected");
    let (ev, before) = b.recv_event("presence.leave").await;
    assert!(before.is_empty(), "{before:?}");
    assert_eq!(ev["session"], ja["session"]);
    assert_eq!(ev["reason"], "left");
    assert_eq!(ev["from"], ja["session"]);
    s.wait_members("r", 1).await;

    // Out of the room: acting there is refused, joining again is a new session.
    a.send(json!({"type": "publish", "room": "r", "event": "x"}))
        .await;
    assert_eq!(a.recv_type("error").await["code"], "not_joined");
    a.send(json!({"type": "join", "room": "r", "name": "ann"}))
        .await;
    let j = a.recv_type("joined").await;
    assert_ne!(j["session"], ja["session"]);
    assert_ne!(j["resume_token"], ja["resume_token"]);
    let (ev, _) = b.recv_event("presence.join").await;
    assert_eq!(ev["member"]["session"], j["session"]);
}

#[tokio::test]
async fn a_closed_connection_is_seen_as_disconnected() {
    let s = TestServer::start().await;
    s.create_room(json!({"id": "r"})).await;
    let mut c = s.join_all("r", &["ann", "bob"]).await;
    let (mut b, _) = c.pop().unwrap();
    let (mut a, ja) = c.pop().unwrap();
    // A clean WebSocket close, which the server acknowledges.
    a.ws.close(Some(CloseFrame {
        code: CloseCode::Normal,
        reason: "bye".into(),
    }))
    .await
    .unwrap();
    assert_eq!(a.closed().await, Closed::Code(1000));
    let (ev, _) = b.recv_event("presence.leave").await;
    assert_eq!(ev["session"], ja["session"]);
    assert_eq!(ev["reason"], "disconnected");
    assert!(crate::support::wait_until(|| async { s.node.connection_count() == 1 }).await);
    s.wait_members("r", 1).await;
}

#[tokio::test]
async fn shutdown_tells_clients_to_reconnect_and_stops_serving() {
    let mut s = TestServer::start().await;
    s.create_room(json!({"id": "r"})).await;
    let mut members = s.join_all("r", &["ann", "bob"]).await;
    let mut idle = s.connect().await; // connected, in no room
    idle.assert_alive().await;
    assert_eq!(s.node.connection_count(), 3);

    s.node.shutdown();
    for (c, _) in members.iter_mut() {
        assert_eq!(c.closed().await, Closed::Code(1012));
    }
    assert_eq!(idle.closed().await, Closed::Code(1012));

    let res = tokio::time::timeout(Duration::from_secs(10), &mut s.task)
        .await
        .expect("serve did not finish");
    res.expect("serve task panicked").expect("serve failed");
    assert_eq!(s.node.connection_count(), 0);

    // Nothing is served any more.
    assert!(Client::try_connect(s.addr).await.is_err());
    assert!(s.http.get(s.url("/healthz")).send().await.is_err());
}

#[tokio::test]
async fn during_shutdown_joins_and_upgrades_are_refused() {
    // Served without graceful shutdown, so what the node answers while it
    // shuts down can be observed.
    let s = TestServer::without_graceful_shutdown(Default::default()).await;
    s.create_room(json!({"id": "r"})).await;
    let (mut a, _) = s.join("r", "ann").await;
    s.node.shutdown();
    assert_eq!(a.closed().await, Closed::Code(1012));
    match Client::try_connect(s.addr).await {
        Err(tokio_tungstenite::tungstenite::Error::Http(r)) => {
            assert_eq!(r.status(), 503);
            let body: Value = serde_json::from_slice(r.body().as_deref().unwrap_or(b"{}")).unwrap();
            assert_eq!(body["error"]["code"], "shutting_down", "{body}");
        }
        Err(e) => panic!("expected HTTP 503, got {e:?}"),
        Ok(_) => panic!("the upgrade was accepted during shutdown"),
    }
    assert!(crate::support::wait_until(|| async { s.node.connection_count() == 0 }).await);
}
