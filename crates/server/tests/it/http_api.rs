//! The HTTP API: rooms, tickets, errors, health, readiness and metrics.

use crate::support::{now_ms, wait_until, TestServer};
use serde_json::{json, Value};

fn assert_api_error(status: u16, body: &Value, want_status: u16, code: &str) {
    assert_eq!(status, want_status, "{body}");
    assert_eq!(body["error"]["code"], code, "{body}");
    assert!(
        !body["error"]["message"].as_str().unwrap_or("").is_empty(),
        "{body}"
    );
}

#[tokio::test]
async fn rooms_are_created_listed_and_read() {
    let s = TestServer::start().await;
    let (status, v) = s.get("/v1/rooms").await;
    assert_eq!((status, v), (200, json!({"rooms": []})));

    let before = now_ms();
    let (status, r) = s
        .post("/v1/rooms", &json!({"id": "b-room", "name": "Bee"}))
        .await;
    assert_eq!(status, 201, "{r}");
    assert_eq!(r["id"], "b-room");
    assert_eq!(r["name"], "Bee");
    assert_eq!(r["members"], 0);
    let created = r["created_at"].as_u64().unwrap();
    assert!(created >= before && created <= now_ms());
    assert_eq!(r["access"], "open");
    assert_eq!(r["history_size"], 1000);
    assert_eq!(r["max_members"], 10_000);
    assert_eq!(r["presence"], true);

    // The name defaults to the id; options are applied.
    let r2 = s
        .create_room(
            json!({"id": "a.room_1", "options": {"history_size": 7, "max_members": 3, "presence": false}}),
        )
        .await;
    assert_eq!(r2["presence"], false);
    assert_eq!(r2["name"], "a.room_1");
    assert_eq!(r2["history_size"], 7);
    assert_eq!(r2["max_members"], 3);
    // Without an id the server makes one.
    let r3 = s.create_room(json!({})).await;
    let id3 = r3["id"].as_str().unwrap().to_owned();
    assert!(!id3.is_empty());
    assert_eq!(r3["name"], id3.as_str());

    let (status, list) = s.get("/v1/rooms").await;
    assert_eq!(status, 200);
    let ids: Vec<&str> = list["rooms"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["id"].as_str().unwrap())
        .collect();
    let mut want = vec!["a.room_1", "b-room", id3.as_str()];
    want.sort();
    assert_eq!(ids, want, "listed by id");

    let (status, one) = s.get("/v1/rooms/b-room").await;
    assert_eq!(status, 200);
    assert_eq!(one, r);
    let (status, v) = s.get("/v1/rooms/missing").await;
    assert_api_error(status, &v, 404, "room_not_found");
}

#[tokio::test]
async fn the_member_count_follows_joins_and_leaves() {
    let s = TestServer::start().await;
    s.create_room(json!({"id": "r"})).await;
    let (a, _) = s.join("r", "ann").await;
    s.wait_members("r", 1).await;
    let (mut b, _) = s.join("r", "bob").await;
    s.wait_members("r", 2).await;
    b.send(json!({"type": "leave", "room": "r"})).await;
    b.recv_type("left").await;
    s.wait_members("r", 1).await;
    drop(a);
    s.wait_members("r", 0).await;
    let (_, list) = s.get("/v1/rooms").await;
    assert_eq!(list["rooms"][0]["members"], 0);
}

#[tokio::test]
async fn deleting_a_room_closes_it_for_its_members() {
    let s = TestServer::start().await;
    s.create_room(json!({"id": "r"})).await;
    let mut c = s.join_all("r", &["ann", "bob"]).await;
    let (mut b, _) = c.pop().unwrap();
    let (mut a, _) = c.pop().unwrap();

    let (status, body) = s.delete("/v1/rooms/r").await;
    assert_eq!(status, 204);
    assert_eq!(body, Value::Null, "no body");
    for m in [&mut a, &mut b] {
        assert_eq!(
            m.recv().await,
            json!({"type": "closed", "room": "r", "reason": "room_deleted"})
        );
        m.assert_alive().await;
    }
    let (status, v) = s.get("/v1/rooms/r").await;
    assert_api_error(status, &v, 404, "room_not_found");
    let (status, v) = s.delete("/v1/rooms/r").await;
    assert_api_error(status, &v, 404, "room_not_found");
    assert_eq!(s.get("/v1/rooms").await.1, json!({"rooms": []}));

    // The room is gone for its former members, for every frame, not only the first.
    for i in 0..3 {
        a.send(json!({"type": "publish", "room": "r", "event": "x", "id": format!("m{i}")}))
            .await;
        let e = a.recv_type("error").await;
        assert_eq!(e["code"], "room_not_found", "publish {i}: {e}");
        assert_eq!(
            e["ref"],
            json!({"frame": "publish", "room": "r", "id": format!("m{i}")})
        );
    }
    a.send(json!({"type": "direct", "room": "r", "to": "x", "event": "hi"}))
        .await;
    assert_eq!(a.recv_type("error").await["code"], "room_not_found");
    for n in ["n1", "n2"] {
        let (r, _) = b.request("r", json!(n), "entity.create", json!({})).await;
        assert_eq!(r["ok"], false, "{r}");
        assert_eq!(r["error"]["code"], "room_not_found", "{r}");
    }
    // A leave is answered `left`, also after other frames found the room gone.
    a.send(json!({"type": "leave", "room": "r"})).await;
    assert_eq!(a.recv().await, json!({"type": "left", "room": "r"}));
    // A room this connection was never in is still `not_joined`.
    a.send(json!({"type": "publish", "room": "never", "event": "x"}))
        .await;
    assert_eq!(a.recv_type("error").await["code"], "not_joined");
    b.send(json!({"type": "join", "room": "r", "name": "bob"}))
        .await;
    assert_eq!(b.recv_type("error").await["code"], "room_not_found");

    // A room of the same id is a new room: its former members can join it.
    s.create_room(json!({"id": "r"})).await;
    for (m, name) in [(&mut a, "ann"), (&mut b, "bob")] {
        m.send(json!({"type": "join", "room": "r", "name": name}))
            .await;
        let j = m.recv_type("joined").await;
        assert_eq!(j["room"], "r");
    }
    s.wait_members("r", 2).await;
}

#[tokio::test]
async fn members_of_a_deleted_room_can_join_its_successor_and_leave_it() {
    let s = TestServer::start().await;
    s.create_room(json!({"id": "r"})).await;
    let mut c = s.join_all("r", &["ann", "bob"]).await;
    let (mut b, _) = c.pop().unwrap();
    let (mut a, _) = c.pop().unwrap();
    assert_eq!(s.delete("/v1/rooms/r").await.0, 204);
    for m in [&mut a, &mut b] {
        assert_eq!(m.recv_type("closed").await["reason"], "room_deleted");
    }

    // Leaving a deleted room is answered.
    b.send(json!({"type": "leave", "room": "r"})).await;
    assert_eq!(b.recv().await, json!({"type": "left", "room": "r"}));

    // Joining the new room of the same id works straight away.
    s.create_room(json!({"id": "r"})).await;
    a.send(json!({"type": "join", "room": "r", "name": "ann"}))
        .await;
    let j = a.recv().await;
    assert_eq!(j["type"], "joined", "{j}");
    assert_eq!(j["seq"], 1, "a new room starts its own order");
    // The deleted room no longer counts against the connection's room limit.
    s.wait_members("r", 1).await;
}

#[tokio::test]
async fn invalid_bodies_are_refused_with_400() {
    let s = TestServer::start().await;
    let bad: Vec<Value> = vec![
        json!({"id": ""}),
        json!({"id": "has space"}),
        json!({"id": "x".repeat(65)}),
        json!({"id": "ok", "name": ""}),
        json!({"id": "ok", "colour": "red"}),
        json!({"id": 5}),
        json!({"options": {"history_size": 0}}),
        json!({"options": {"history_size": 100_001}}),
        json!({"options": {"max_members": 0}}),
        json!({"options": {"access": "secret"}}),
        json!({"options": {"speed": 1}}),
        json!({"entities": [{"data": 1, "id": "e9"}]}),
        json!({"entities": {"data": 1}}),
        json!([]),
    ];
    for body in bad {
        let (status, v) = s.post("/v1/rooms", &body).await;
        assert_api_error(status, &v, 400, "invalid_request");
    }
    for raw in ["{", "", "null", "{\"id\":\"ok\",}"] {
        let (status, v) = s.post_raw("/v1/rooms", raw).await;
        assert_api_error(status, &v, 400, "invalid_request");
    }
    // Without a JSON content type.
    let r = s
        .http
        .post(s.url("/v1/rooms"))
        .body(r#"{"id":"ok"}"#)
        .send()
        .await
        .unwrap();
    let status = r.status().as_u16();
    let v: Value = r.json().await.unwrap();
    assert_api_error(status, &v, 415, "invalid_request");
    // Nothing was created.
    assert_eq!(s.get("/v1/rooms").await.1, json!({"rooms": []}));

    // Tickets: unknown room, bad bodies.
    let (status, v) = s
        .post("/v1/rooms/nope/tickets", &json!({"name": "ann"}))
        .await;
    assert_api_error(status, &v, 404, "room_not_found");
    s.create_room(json!({"id": "r"})).await;
    for body in [
        json!({}),
        json!({"name": ""}),
        json!({"name": "n".repeat(65)}),
        json!({"name": "ann", "platform": ""}),
        json!({"name": "ann", "room": "r"}),
        json!(["ann"]),
    ] {
        let (status, v) = s.post("/v1/rooms/r/tickets", &body).await;
        assert_api_error(status, &v, 400, "invalid_request");
    }
}

#[tokio::test]
async fn duplicate_ids_conflict() {
    let s = TestServer::start().await;
    let first = s.create_room(json!({"id": "r", "name": "first"})).await;
    let (status, v) = s
        .post("/v1/rooms", &json!({"id": "r", "name": "second"}))
        .await;
    assert_api_error(status, &v, 409, "room_exists");
    assert_eq!(s.get("/v1/rooms/r").await.1, first);
}

#[tokio::test]
async fn unknown_routes_are_404_not_found() {
    let s = TestServer::start().await;
    for path in ["/nope", "/v1", "/v1/rooms/r/extra", "/v2/rooms"] {
        let (status, v) = s.get(path).await;
        assert_api_error(status, &v, 404, "not_found");
    }
}

#[tokio::test]
async fn health_and_readiness() {
    let s = TestServer::start().await;
    assert_eq!(s.get("/healthz").await, (200, json!({"status": "ok"})));
    let (status, v) = s.get("/readyz").await;
    assert_eq!(status, 200);
    let node = s.node.id().to_owned();
    assert!(!node.is_empty());
    assert_eq!(
        v,
        json!({"ready": true, "broker": "memory", "node": node, "shutting_down": false})
    );
    let r = s.http.get(s.url("/readyz")).send().await.unwrap();
    assert_eq!(
        r.headers()["x-plaza-node"],
        node.as_str(),
        "every response names its node"
    );
    let (status, html) = s.get_text("/").await;
    assert_eq!(status, 200);
    assert!(html.to_lowercase().contains("<html"));
}

#[tokio::test]
async fn readiness_fails_once_shutdown_starts() {
    // Served without graceful shutdown, so the API still answers afterwards.
    let s = TestServer::without_graceful_shutdown(Default::default()).await;
    assert_eq!(s.get("/readyz").await.0, 200);
    s.node.shutdown();
    let (status, v) = s.get("/readyz").await;
    assert_eq!(status, 503);
    assert_eq!(v["ready"], false);
    assert_eq!(v["shutting_down"], true);
    assert_eq!(s.get("/healthz").await.0, 200, "alive, just not ready");
    let (status, v) = s.post("/v1/rooms", &json!({"id": "late"})).await;
    assert_api_error(status, &v, 503, "shutting_down");
}

#[tokio::test]
async fn metrics_are_exposed_in_prometheus_text() {
    let s = TestServer::start().await;
    s.create_room(json!({"id": "r"})).await;
    let mut c = s.join_all("r", &["ann", "bob"]).await;
    let (mut b, _) = c.pop().unwrap();
    let (mut a, _) = c.pop().unwrap();
    let before = s
        .metric(r#"plaza_errors_total{code="bad_json"}"#)
        .await
        .unwrap_or(0.0);
    a.send_raw("{oops").await;
    assert_eq!(a.recv_type("error").await["code"], "bad_json");
    let (ack, _) = a.publish("r", "chat", json!(1)).await;
    assert_eq!(b.recv_type("event").await["seq"], ack["seq"]);
    // Failed responses are counted too.
    let (r, _) = a
        .request("r", json!(1), "entity.set", json!({"id": "e9", "data": 0}))
        .await;
    assert_eq!(r["error"]["code"], "entity_not_found");

    let (status, text) = s.get_text("/metrics").await;
    assert_eq!(status, 200);
    for name in [
        "plaza_connections",
        "plaza_frames_in_total",
        "plaza_delivery_latency_seconds",
        "plaza_errors_total",
        "plaza_rooms",
    ] {
        assert!(text.contains(name), "{name} missing from:\n{text}");
    }
    assert_eq!(s.metric("plaza_connections").await, Some(2.0));
    assert_eq!(s.metric("plaza_rooms").await, Some(1.0));
    assert_eq!(
        s.metric(r#"plaza_errors_total{code="bad_json"}"#).await,
        Some(before + 1.0)
    );
    assert_eq!(
        s.metric(r#"plaza_errors_total{code="entity_not_found"}"#)
            .await,
        Some(1.0)
    );
    assert_eq!(
        s.metric(r#"plaza_errors_total{code="room_full"}"#).await,
        Some(0.0)
    );
    assert!(s.metric("plaza_frames_in_total").await >= Some(7.0));
    // Two joins, the publish and the request waited for the room's task:
    // each was sampled before it was applied, so before its answer came.
    assert!(s.metric("plaza_room_wait_seconds_count").await >= Some(4.0));
    // A latency sample is taken once the event is written.
    assert!(
        wait_until(|| async {
            s.metric("plaza_delivery_latency_seconds_count").await >= Some(1.0)
        })
        .await,
        "no latency sample"
    );
    drop(a);
    drop(b);
    assert!(wait_until(|| async { s.metric("plaza_connections").await == Some(0.0) }).await);
}

#[tokio::test]
async fn auto_create_rooms_creates_open_rooms_on_first_join() {
    let s = TestServer::with_config(plaza_server::ServerConfig {
        auto_create_rooms: true,
        ..Default::default()
    })
    .await;
    let (mut a, j) = s.join("fresh", "ann").await;
    assert_eq!(j["room"], "fresh");
    assert_eq!(j["seq"], 1);
    let (status, r) = s.get("/v1/rooms/fresh").await;
    assert_eq!(status, 200, "{r}");
    assert_eq!(r["access"], "open");
    s.wait_members("fresh", 1).await;
    // Ids that the HTTP API would refuse are refused here too, with its code.
    a.send(json!({"type": "join", "room": "no spaces", "name": "ann"}))
        .await;
    let e = a.recv_type("error").await;
    assert_eq!(e["code"], "invalid_request", "{e}");
    assert_eq!(e["ref"], json!({"frame": "join", "room": "no spaces"}));
    assert_eq!(
        s.get("/v1/rooms").await.1["rooms"]
            .as_array()
            .unwrap()
            .len(),
        1
    );
}

#[tokio::test]
async fn a_known_path_with_another_method_is_405_with_a_json_body() {
    let s = TestServer::start().await;
    for (method, path, allowed) in [
        (reqwest::Method::DELETE, "/v1/rooms", "GET,HEAD,POST"),
        (reqwest::Method::PUT, "/v1/rooms/lobby/tickets", "POST"),
        (reqwest::Method::POST, "/v1/status", "GET,HEAD"),
        (reqwest::Method::POST, "/", "GET,HEAD"),
    ] {
        let r = s
            .http
            .request(method.clone(), s.url(path))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 405, "{method} {path}");
        let allow = r.headers()["allow"].to_str().unwrap().replace(' ', "");
        assert_eq!(allow, allowed, "{method} {path}");
        assert!(r.headers().contains_key("x-plaza-node"));
        let body: Value = r.json().await.unwrap();
        assert_eq!(body["error"]["code"], "method_not_allowed", "{body}");
        assert_eq!(
            body["error"]["message"],
            format!("{method} is not allowed here")
        );
    }
}

#[tokio::test]
async fn with_an_api_key_management_calls_need_it_and_reads_do_not() {
    const KEY: &str = "k3y-0123456789abcdef";
    let s = TestServer::with_config(plaza_server::ServerConfig {
        api_key: KEY.into(),
        ..plaza_server::ServerConfig::default()
    })
    .await;
    let calls = [
        (
            reqwest::Method::POST,
            "/v1/rooms",
            Some(json!({"id": "kept"})),
        ),
        (
            reqwest::Method::POST,
            "/v1/rooms/kept/tickets",
            Some(json!({"name": "ann"})),
        ),
        (reqwest::Method::DELETE, "/v1/rooms/kept", None),
    ];
    // Refused without the key, with another key, and with a scheme other than Bearer.
    for auth in [
        None,
        Some("Bearer wrong-key-0123456789"),
        Some(&*format!("Basic {KEY}")),
    ] {
        for (method, path, body) in &calls {
            let mut req = s.http.request(method.clone(), s.url(path));
            if let Some(a) = auth {
                req = req.header("authorization", a);
            }
            if let Some(b) = body {
                req = req.json(b);
            }
            let r = req.send().await.unwrap();
            assert_eq!(r.status(), 401, "{method} {path} with {auth:?}");
            assert_eq!(r.headers()["www-authenticate"], "Bearer realm=\"plaza\"");
            let v: Value = r.json().await.unwrap();
            assert_eq!(v["error"]["code"], "unauthorized", "{v}");
        }
    }
    let (status, v) = s.get("/v1/rooms").await;
    assert_eq!(
        (status, v["rooms"].as_array().map(Vec::len)),
        (200, Some(0)),
        "nothing was created"
    );

    // Accepted with it, in the same order (the scheme in any case).
    let bearer = format!("bearer {KEY}");
    let mut statuses = Vec::new();
    for (method, path, body) in &calls {
        let mut req = s
            .http
            .request(method.clone(), s.url(path))
            .header("authorization", &bearer);
        if let Some(b) = body {
            req = req.json(b);
        }
        statuses.push(req.send().await.unwrap().status().as_u16());
    }
    assert_eq!(statuses, [201, 201, 204]);
    // Reads stay open.
    assert_eq!(s.get("/v1/rooms").await.0, 200);
    assert_eq!(s.get("/v1/status").await.0, 200);
}
