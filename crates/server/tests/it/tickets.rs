//! Tickets: single use, short-lived, fixing the member's identity; rooms that
//! admit ticket holders only.

use crate::support::{now_ms, wait_until, TestServer};
use plaza_server::ServerConfig;
use serde_json::{json, Value};

#[tokio::test]
async fn a_ticket_admits_once_with_its_name_and_platform() {
    let s = TestServer::start().await;
    s.create_room(json!({"id": "r1"})).await;
    let (mut b, _) = s.join("r1", "bob").await;

    let before = now_ms();
    let (status, t) = s
        .post(
            "/v1/rooms/r1/tickets",
            &json!({"name": "tina", "platform": "xr"}),
        )
        .await;
    assert_eq!(status, 201, "{t}");
    let ticket = t["ticket"].as_str().unwrap().to_owned();
    assert!(ticket.len() >= 32, "tickets are unguessable: {ticket}");
    let expires = t["expires_at"].as_u64().unwrap();
    assert!(
        expires >= before + 30_000 && expires <= now_ms() + 30_000,
        "{t}"
    );

    // The join's own name and platform are ignored: the ticket fixes them.
    let (mut a, j) = s
        .join_with(
            json!({"type": "join", "ticket": ticket, "name": "mallory", "platform": "browser"}),
        )
        .await;
    assert_eq!(j["type"], "joined", "{j}");
    assert_eq!(j["room"], "r1");
    let me: Vec<&Value> = j["members"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["session"] == j["session"])
        .collect();
    assert_eq!(
        me,
        vec![&json!({"session": j["session"], "name": "tina", "platform": "xr"})]
    );
    let (ev, _) = b.recv_event("presence.join").await;
    assert_eq!(ev["member"]["name"], "tina");
    assert_eq!(ev["member"]["platform"], "xr");
    a.assert_alive().await;

    // Used: refused, on any connection.
    let (mut c, e) = s.join_with(json!({"type": "join", "ticket": ticket})).await;
    assert_eq!(e["type"], "error", "{e}");
    assert_eq!(e["code"], "ticket_used");
    assert_eq!(e["ref"]["frame"], "join");
    c.assert_alive().await;

    // The platform defaults to browser.
    let t2 = s.ticket("r1", "tom", "browser").await;
    let (status, t3) = s
        .post("/v1/rooms/r1/tickets", &json!({"name": "tim"}))
        .await;
    assert_eq!(status, 201);
    for (t, name) in [
        (t2, "tom"),
        (t3["ticket"].as_str().unwrap().to_owned(), "tim"),
    ] {
        c.send(json!({"type": "join", "ticket": t})).await;
        let j = c.recv_type("joined").await;
        let m = j["members"]
            .as_array()
            .unwrap()
            .iter()
            .find(|m| m["session"] == j["session"])
            .unwrap()
            .clone();
        assert_eq!(
            (m["name"].clone(), m["platform"].clone()),
            (json!(name), json!("browser"))
        );
        c.send(json!({"type": "leave", "room": "r1"})).await;
        c.recv_type("left").await;
    }
}

#[tokio::test]
async fn forged_and_misdirected_tickets_are_refused() {
    let s = TestServer::start().await;
    s.create_room(json!({"id": "r1"})).await;
    s.create_room(json!({"id": "r2"})).await;
    let mut c = s.connect().await;
    c.send(json!({"type": "join", "ticket": "forged-ticket"}))
        .await;
    let e = c.recv_type("error").await;
    assert_eq!(e["code"], "ticket_invalid", "{e}");
    c.assert_alive().await;

    // A ticket names its room: joining another room with it is refused.
    let t = s.ticket("r1", "tina", "xr").await;
    c.send(json!({"type": "join", "room": "r2", "ticket": t}))
        .await;
    let e = c.recv_type("error").await;
    assert_eq!(e["code"], "invalid_frame", "{e}");
    assert_eq!(e["ref"]["room"], "r2");
    // ... and the ticket is spent all the same.
    c.send(json!({"type": "join", "ticket": t})).await;
    assert_eq!(c.recv_type("error").await["code"], "ticket_used");

    // A ticket whose room was deleted leads nowhere.
    let t = s.ticket("r2", "tina", "xr").await;
    assert_eq!(s.delete("/v1/rooms/r2").await.0, 204);
    c.send(json!({"type": "join", "ticket": t})).await;
    let e = c.recv_type("error").await;
    assert_eq!(e["code"], "room_not_found", "{e}");
    c.assert_alive().await;
}

#[tokio::test]
async fn an_expired_ticket_is_refused() {
    let s = TestServer::with_config(ServerConfig {
        ticket_ttl_ms: 1,
        ..Default::default()
    })
    .await;
    s.create_room(json!({"id": "r1"})).await;
    let (status, t) = s
        .post("/v1/rooms/r1/tickets", &json!({"name": "tina"}))
        .await;
    assert_eq!(status, 201);
    let expires = t["expires_at"].as_u64().unwrap();
    // Time has to pass: poll the clock.
    assert!(wait_until(|| async { now_ms() > expires }).await);
    let (mut c, e) = s
        .join_with(json!({"type": "join", "ticket": t["ticket"]}))
        .await;
    assert_eq!(e["type"], "error", "{e}");
    assert_eq!(e["code"], "ticket_expired");
    assert_eq!(e["ref"]["frame"], "join");
    c.assert_alive().await;
}

#[tokio::test]
async fn a_ticket_room_refuses_joins_without_a_ticket() {
    let s = TestServer::start().await;
    let summary = s
        .create_room(json!({"id": "vip", "options": {"access": "ticket"}}))
        .await;
    assert_eq!(summary["access"], "ticket");

    let (mut c, e) = s
        .join_with(json!({"type": "join", "room": "vip", "name": "ann"}))
        .await;
    assert_eq!(e["type"], "error", "{e}");
    assert_eq!(e["code"], "ticket_required");
    assert_eq!(e["ref"], json!({"frame": "join", "room": "vip"}));

    // The same connection gets in with a ticket.
    let t = s.ticket("vip", "ann", "xr").await;
    c.send(json!({"type": "join", "ticket": t})).await;
    let j = c.recv_type("joined").await;
    assert_eq!(j["room"], "vip");
    s.wait_members("vip", 1).await;

    // A resume with a fresh ticket continues the session.
    drop(c);
    s.wait_members("vip", 0).await;
    let t = s.ticket("vip", "ann", "xr").await;
    let (_c, j2) = s
        .join_with(json!({
            "type": "join", "ticket": t,
            "resume": {"token": j["resume_token"], "last_seq": j["seq"]},
        }))
        .await;
    assert_eq!(j2["type"], "joined", "{j2}");
    assert_eq!(j2["resumed"], true);
    assert_eq!(j2["session"], j["session"]);
}

/// Refusals that need no ticket come before redemption: they do not spend it.
#[tokio::test]
async fn a_join_refused_before_redemption_keeps_the_ticket() {
    let s = TestServer::with_config(ServerConfig {
        max_rooms_per_connection: 1,
        ..Default::default()
    })
    .await;
    s.create_room(json!({"id": "r1"})).await;
    s.create_room(json!({"id": "r2"})).await;
    let (mut c, _) = s.join("r1", "ann").await;
    let t1 = s.ticket("r1", "tina", "xr").await;
    c.send(json!({"type": "join", "room": "r1", "ticket": t1}))
        .await;
    assert_eq!(c.recv_type("error").await["code"], "too_many_rooms");
    let t2 = s.ticket("r2", "tina", "xr").await;
    c.send(json!({"type": "join", "ticket": t2})).await;
    assert_eq!(c.recv_type("error").await["code"], "too_many_rooms");
    // both tickets still work on another connection
    let mut d = s.connect().await;
    d.send(json!({"type": "join", "ticket": t2})).await;
    assert_eq!(d.recv_type("joined").await["room"], "r2");
    let mut e = s.connect().await;
    e.send(json!({"type": "join", "ticket": t1})).await;
    assert_eq!(e.recv_type("joined").await["room"], "r1");
}
