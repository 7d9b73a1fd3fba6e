use crate::support::TestServer;
use serde_json::json;

#[tokio::test]
async fn broadcast_reaches_others_and_acks_the_sender() {
    let s = TestServer::start().await;
    s.create_room(json!({"id": "r1"})).await;
    let (mut a, ja) = s.join("r1", "ann").await;
    let (mut b, jb) = s.join("r1", "bob").await;
    assert_ne!(ja["session"], jb["session"]);
    let p = a.recv_type("event").await;
    assert_eq!(p["kind"], "presence.join");
    assert_eq!(p["member"]["name"], "bob");

    a.send(
        json!({"type": "publish", "room": "r1", "event": "chat", "data": {"t": "hi"}, "id": "m1"}),
    )
    .await;
    let ack = a.recv_type("ack").await;
    let ev = b.recv_type("event").await;
    assert_eq!(ev["kind"], "message");
    assert_eq!(ev["data"], json!({"t": "hi"}));
    assert_eq!(ev["seq"], ack["seq"]);
    assert_eq!(ev["from"], ja["session"]);
    assert!(
        a.drain().await.is_empty(),
        "the sender must not get its own message"
    );
}
