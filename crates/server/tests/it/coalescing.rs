//! Write coalescing: a quiet connection gets a frame at once; a connection
//! that has just written holds a new frame for one window.

use std::time::{Duration, Instant};

use crate::support::TestServer;
use plaza_server::ServerConfig;
use serde_json::json;

const WINDOW: Duration = Duration::from_millis(600);

#[tokio::test]
async fn frames_after_a_write_wait_for_the_window_and_a_quiet_connection_does_not() {
    let s = TestServer::with_config(ServerConfig {
        write_coalesce_ms: WINDOW.as_millis() as u64,
        ..Default::default()
    })
    .await;
    s.create_room(json!({"id": "co"})).await;
    let mut clients = s.join_all("co", &["a", "b"]).await;
    let (mut b, _) = clients.pop().unwrap();
    let (mut a, _) = clients.pop().unwrap();

    // The scenario needs b quiet for longer than the window.
    tokio::time::sleep(WINDOW + Duration::from_millis(100)).await;
    let sent = Instant::now();
    a.publish("co", "m1", json!(1)).await;
    let m1 = b.recv_type("event").await;
    let first = Instant::now();
    assert_eq!(m1["event"], "m1");
    assert!(
        first - sent < WINDOW * 3 / 4,
        "a quiet connection was held: {:?}",
        first - sent
    );

    // b wrote just now, so it is busy: the next frame waits a full window
    // from its arrival (measured from m1's receipt, which came first).
    a.publish("co", "m2", json!(2)).await;
    a.publish("co", "m3", json!(3)).await;
    let m2 = b.recv_type("event").await;
    let waited = first.elapsed();
    assert_eq!(m2["event"], "m2");
    assert!(waited >= WINDOW * 3 / 4, "m2 came after only {waited:?}");
    let m3 = b.recv_type("event").await;
    assert_eq!(m3["event"], "m3");
    assert_eq!(m3["seq"].as_u64(), m2["seq"].as_u64().map(|s| s + 1));
}
