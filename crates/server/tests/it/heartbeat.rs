//! Heartbeats: silence closes a connection (4001); answering the server's
//! WebSocket pings keeps it alive; application pings are answered.

use crate::support::{Closed, TestServer};
use futures_util::StreamExt;
use plaza_server::ServerConfig;
use serde_json::{json, Value};
use tokio_tungstenite::tungstenite::Message;

#[tokio::test]
async fn a_silent_client_is_closed_and_one_answering_pings_is_not() {
    // Server pings every 50 ms; 300 ms without any frame from a client drops it.
    let s = TestServer::with_config(ServerConfig {
        idle_timeout_ms: 300,
        heartbeat_interval_ms: 50,
        ..Default::default()
    })
    .await;
    s.create_room(json!({"id": "hb"})).await;
    let (mut watcher, _) = s.join("hb", "watcher").await;
    // The silent client joins, then sends nothing, not even the pongs
    // tungstenite would answer the server's pings with.
    let (mut silent, js) = s.join("hb", "silent").await;
    silent.mute();

    // The watcher only reads; tungstenite answers each server ping with a
    // pong, which is all the server hears from it.
    let (ev, before) = watcher.recv_event("presence.leave").await;
    assert_eq!(before.len(), 1, "{before:?}");
    assert_eq!(before[0]["kind"], "presence.join");
    assert_eq!(ev["session"], js["session"]);
    assert_eq!(ev["reason"], "disconnected");

    // The silent client finds the heartbeat close code.
    assert_eq!(silent.closed().await, Closed::Code(4001));
    // The watcher outlived the idle timeout on pongs alone and still works.
    watcher.assert_alive().await;
    s.wait_members("hb", 1).await;
}

#[tokio::test]
async fn a_client_that_never_sends_is_closed_with_4001() {
    let s = TestServer::with_config(ServerConfig {
        idle_timeout_ms: 300,
        ..Default::default()
    })
    .await;
    let mut c = s.connect().await;
    assert_eq!(c.closed().await, Closed::Code(4001));
    assert!(crate::support::wait_until(|| async { s.node.connection_count() == 0 }).await);
}

#[tokio::test]
async fn the_server_pings_and_counts_pongs_as_life() {
    let s = TestServer::with_config(ServerConfig {
        idle_timeout_ms: 300,
        heartbeat_interval_ms: 50,
        ..Default::default()
    })
    .await;
    let mut c = s.connect().await;
    // Read (and so answer) server pings until well past the idle timeout.
    let mut pings = 0;
    while pings < 12 {
        let msg = tokio::time::timeout(crate::support::WAIT, c.ws.next())
            .await
            .expect("no server ping")
            .expect("connection ended")
            .expect("websocket error");
        match msg {
            Message::Ping(_) => pings += 1,
            other => panic!("unexpected {other:?}"),
        }
    }
    c.assert_alive().await;
}

#[tokio::test]
async fn application_pings_get_pongs_with_the_same_ts() {
    let s = TestServer::start().await;
    let mut c = s.connect().await;
    for ts in [
        json!(0),
        json!(1_700_000_000_123u64),
        json!(12.75),
        json!(-3),
        json!(9_007_199_254_740_993u64),
    ] {
        c.send(json!({"type": "ping", "ts": ts})).await;
        let p = c.recv_type("pong").await;
        // echoed exactly: integers stay integers, even above 2^53
        assert_eq!(p["ts"], ts, "{p}");
    }
    c.send(json!({"type": "ping"})).await;
    assert_eq!(c.recv().await, json!({"type": "pong"}));
    // Pings need no room.
    assert_eq!(c.drain().await, Vec::<Value>::new());
}
