//! Direct messages: to exactly one session, unsequenced, never to anyone else.

use crate::support::TestServer;
use serde_json::{json, Value};

const ROOM: &str = "dm";

#[tokio::test]
async fn a_direct_message_reaches_only_its_target() {
    let s = TestServer::start().await;
    s.create_room(json!({"id": ROOM})).await;
    let mut c = s.join_all(ROOM, &["ann", "bob", "cid"]).await;
    let (mut cc, _) = c.pop().unwrap();
    let (mut b, jb) = c.pop().unwrap();
    let (mut a, ja) = c.pop().unwrap();

    a.send(json!({
        "type": "direct", "room": ROOM, "to": jb["session"],
        "event": "rtc.offer", "data": {"sdp": "v=0"},
    }))
    .await;
    let d = b.recv_type("direct").await;
    assert_eq!(
        d,
        json!({
            "type": "direct", "room": ROOM, "from": ja["session"],
            "event": "rtc.offer", "data": {"sdp": "v=0"},
        })
    );
    assert!(d.get("seq").is_none(), "direct messages are not sequenced");
    assert_eq!(cc.drain().await, Vec::<Value>::new(), "C gets nothing");
    assert_eq!(a.drain().await, Vec::<Value>::new(), "no ack, no echo");

    // And back, without data.
    b.send(json!({"type": "direct", "room": ROOM, "to": ja["session"], "event": "rtc.answer"}))
        .await;
    let d = a.recv_type("direct").await;
    assert_eq!(d["from"], jb["session"]);
    assert_eq!(d["event"], "rtc.answer");
    assert!(d.get("data").is_none());
    assert_eq!(cc.drain().await, Vec::<Value>::new());

    // Direct messages leave no trace in the room's order.
    let (ack, _) = a.publish(ROOM, "chat", json!(1)).await;
    assert_eq!(ack["seq"].as_u64(), Some(jb["seq"].as_u64().unwrap() + 2));
}

#[tokio::test]
async fn a_direct_message_to_a_departed_session_is_refused() {
    let s = TestServer::start().await;
    s.create_room(json!({"id": ROOM})).await;
    let mut c = s.join_all(ROOM, &["ann", "bob"]).await;
    let (b, jb) = c.pop().unwrap();
    let (mut a, _) = c.pop().unwrap();
    drop(b);
    let (ev, _) = a.recv_event("presence.leave").await;
    assert_eq!(ev["session"], jb["session"]);
    a.send(json!({"type": "direct", "room": ROOM, "to": jb["session"], "event": "ping"}))
        .await;
    let e = a.recv_type("error").await;
    assert_eq!(e["code"], "session_not_found", "{e}");
    assert_eq!(e["ref"], json!({"frame": "direct", "room": ROOM}));
    a.assert_alive().await;
}
