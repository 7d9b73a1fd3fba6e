//! A room's admin calls over HTTP: list members, kick one (with a message),
//! delete the room; with the API key, an admin token, or neither on a
//! development node.

use jsonwebtoken::{encode, Algorithm, EncodingKey, Header};
use plaza_server::ServerConfig;
use serde_json::{json, Value};

use crate::support::{now_ms, TestServer};

const SECRET: &str = "admin-test-secret-of-at-least-32-bytes";
const KEY: &str = "admin-test-api-key-0123";

fn token(sub: &str, rooms: Value) -> String {
    let claims = json!({"sub": sub, "exp": now_ms() / 1000 + 600, "rooms": rooms});
    encode(
        &Header::new(Algorithm::HS256),
        &claims,
        &EncodingKey::from_secret(SECRET.as_bytes()),
    )
    .unwrap()
}

/// `method path` with `Authorization: Bearer <bearer>` (if any) and `body`.
async fn call(
    s: &TestServer,
    method: reqwest::Method,
    path: &str,
    bearer: Option<&str>,
    body: Option<&str>,
) -> (u16, Value) {
    let mut r = s.http.request(method, s.url(path));
    if let Some(b) = bearer {
        r = r.bearer_auth(b);
    }
    if let Some(b) = body {
        r = r
            .header("content-type", "application/json")
            .body(b.to_owned());
    }
    let res = r.send().await.unwrap();
    let status = res.status().as_u16();
    let text = res.text().await.unwrap();
    (status, serde_json::from_str(&text).unwrap_or(Value::Null))
}

fn sessions(list: &Value) -> Vec<&str> {
    list["members"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["session"].as_str().unwrap())
        .collect()
}

#[tokio::test]
async fn a_kicked_member_hears_why_the_others_see_it_leave_and_it_cannot_resume() {
    let s = TestServer::start().await;
    s.create_room(json!({"id": "r"})).await;
    let mut joined = s.join_all("r", &["ann", "bob"]).await;
    let (mut bob, bj) = joined.pop().unwrap();
    let (mut ann, aj) = joined.pop().unwrap();
    let post = reqwest::Method::POST;

    let (status, list) = s.get("/v1/rooms/r/members").await;
    assert_eq!(status, 200, "{list}");
    assert_eq!(list["room"], "r");
    let mut expected = vec![
        aj["session"].as_str().unwrap(),
        bj["session"].as_str().unwrap(),
    ];
    expected.sort_unstable();
    assert_eq!(sessions(&list), expected);
    assert_eq!(list["members"][0]["platform"], "browser");

    let bob_session = bj["session"].as_str().unwrap();
    let kick = format!("/v1/rooms/r/members/{bob_session}/kick");
    let (status, body) = call(
        &s,
        post.clone(),
        &kick,
        None,
        Some(r#"{"message": "be nice"}"#),
    )
    .await;
    assert_eq!(status, 204, "{body}");
    let closed = bob.recv_type("closed").await;
    assert_eq!(
        closed,
        json!({"type": "closed", "room": "r", "reason": "kicked", "message": "be nice"})
    );
    let (leave, _) = ann.recv_event("presence.leave").await;
    assert_eq!(leave["session"], bob_session);
    assert_eq!(leave["reason"], "kicked");
    let (_, list) = s.get("/v1/rooms/r/members").await;
    assert_eq!(sessions(&list), vec![aj["session"].as_str().unwrap()]);

    // Out for good: its frames are refused, its resume starts a new session.
    bob.send(json!({"type": "publish", "room": "r", "event": "x", "id": "m1"}))
        .await;
    assert_eq!(bob.recv_type("error").await["code"], "not_joined");
    bob.send(json!({"type": "join", "room": "r", "name": "bob",
        "resume": {"token": bj["resume_token"], "last_seq": bj["seq"]}}))
        .await;
    let again = bob.recv().await;
    assert_eq!(again["type"], "resync", "{again}");
    assert_eq!(again["reason"], "session_expired");
    assert_ne!(again["session"], bj["session"]);

    // Without a body too; then the session is gone.
    let ann_session = aj["session"].as_str().unwrap();
    let kick_ann = format!("/v1/rooms/r/members/{ann_session}/kick");
    assert_eq!(call(&s, post.clone(), &kick_ann, None, None).await.0, 204);
    // (after the presence.join of bob's new session)
    let (closed, _) = ann.recv_until(|v| v["type"] == "closed").await;
    assert_eq!(
        closed,
        json!({"type": "closed", "room": "r", "reason": "kicked"})
    );
    let (status, e) = call(&s, post.clone(), &kick_ann, None, None).await;
    assert_eq!(
        (status, &e["error"]["code"]),
        (404, &json!("session_not_found"))
    );
}

#[tokio::test]
async fn bad_admin_calls_get_clear_errors() {
    let s = TestServer::start().await;
    s.create_room(json!({"id": "r"})).await;
    let (_c, j) = s.join("r", "ann").await;
    let me = j["session"].as_str().unwrap();
    let post = reqwest::Method::POST;
    let kick = format!("/v1/rooms/r/members/{me}/kick");
    for (body, says) in [
        (r#"["x"]"#, "JSON object"),
        (r#"{"message": 7}"#, "invalid request body"),
        (r#"{"reason": "x"}"#, "unknown field"),
        ("{", "invalid request body"),
    ] {
        let (status, e) = call(&s, post.clone(), &kick, None, Some(body)).await;
        assert_eq!(status, 400, "{body}: {e}");
        assert_eq!(e["error"]["code"], "invalid_request");
        assert!(
            e["error"]["message"].as_str().unwrap().contains(says),
            "{e}"
        );
    }
    let long = json!({"message": "x".repeat(201)}).to_string();
    assert_eq!(
        call(&s, post.clone(), &kick, None, Some(&long)).await.0,
        400
    );
    let (status, e) = call(
        &s,
        post.clone(),
        "/v1/rooms/nope/members/x/kick",
        None,
        None,
    )
    .await;
    assert_eq!(
        (status, &e["error"]["code"]),
        (404, &json!("room_not_found"))
    );
    let (status, e) = s.get("/v1/rooms/nope/members").await;
    assert_eq!(
        (status, &e["error"]["code"]),
        (404, &json!("room_not_found"))
    );
    // Nothing happened to the member.
    let (_, list) = s.get("/v1/rooms/r/members").await;
    assert_eq!(sessions(&list), vec![me]);
}

#[tokio::test]
async fn admin_calls_need_the_api_key_or_a_token_with_the_admin_right() {
    let s = TestServer::with_config(ServerConfig {
        api_key: KEY.into(),
        jwt_secret: SECRET.into(),
        ..ServerConfig::default()
    })
    .await;
    for id in ["r", "other"] {
        let (status, _) = call(
            &s,
            reqwest::Method::POST,
            "/v1/rooms",
            Some(KEY),
            Some(&json!({"id": id}).to_string()),
        )
        .await;
        assert_eq!(status, 201);
    }
    let get = reqwest::Method::GET;
    let members = "/v1/rooms/r/members";
    let (status, e) = call(&s, get.clone(), members, None, None).await;
    assert_eq!((status, &e["error"]["code"]), (401, &json!("unauthorized")));
    let (status, e) = call(&s, get.clone(), members, Some("not-a-token"), None).await;
    assert_eq!(
        (status, &e["error"]["code"]),
        (401, &json!("token_invalid")),
        "{e}"
    );
    let member = token("u-m", json!({"*": ["join", "publish"]}));
    let (status, e) = call(&s, get.clone(), members, Some(&member), None).await;
    assert_eq!(
        (status, &e["error"]["code"]),
        (403, &json!("forbidden")),
        "{e}"
    );
    let admin_elsewhere = token("u-a", json!({"other": ["admin"]}));
    assert_eq!(
        call(&s, get.clone(), members, Some(&admin_elsewhere), None)
            .await
            .0,
        403
    );

    let admin = token("u-a", json!({"r": ["admin"]}));
    assert_eq!(
        call(&s, get.clone(), members, Some(&admin), None).await.0,
        200
    );
    assert_eq!(call(&s, get.clone(), members, Some(KEY), None).await.0, 200);
    // The admin token deletes its room, not another.
    let delete = reqwest::Method::DELETE;
    assert_eq!(
        call(&s, delete.clone(), "/v1/rooms/other", Some(&admin), None)
            .await
            .0,
        403
    );
    assert_eq!(
        call(&s, delete.clone(), "/v1/rooms/other", None, None)
            .await
            .0,
        401
    );
    assert_eq!(
        call(&s, delete.clone(), "/v1/rooms/r", Some(&admin), None)
            .await
            .0,
        204
    );
    assert_eq!(
        call(&s, delete, "/v1/rooms/other", Some(KEY), None).await.0,
        204
    );
}

#[tokio::test]
async fn the_demo_token_route_signs_member_tokens_only_when_enabled() {
    let off = TestServer::with_config(ServerConfig {
        jwt_secret: SECRET.into(),
        ..ServerConfig::default()
    })
    .await;
    let (status, _) = off.post("/v1/demo/token", &json!({"name": "Ann"})).await;
    assert_eq!(status, 404);
    // The status says so, for the demo page to know before asking.
    assert_eq!(off.get("/v1/status").await.1["demo_tokens"], false);
    let without_secret = TestServer::with_config(ServerConfig {
        demo_tokens: true,
        ..ServerConfig::default()
    })
    .await;
    assert_eq!(
        without_secret.get("/v1/status").await.1["demo_tokens"],
        false
    );

    let s = TestServer::with_config(ServerConfig {
        jwt_secret: SECRET.into(),
        demo_tokens: true,
        ..ServerConfig::default()
    })
    .await;
    assert_eq!(s.get("/v1/status").await.1["demo_tokens"], true);
    s.create_room(json!({"id": "r"})).await;
    let (status, t) = s.post("/v1/demo/token", &json!({"name": "Ann"})).await;
    assert_eq!(status, 200, "{t}");
    let user = t["user"].as_str().unwrap();
    assert!(user.starts_with("demo-"), "{t}");
    assert!(t["expires_at"].as_u64().unwrap() > now_ms() + 500_000);
    let mut c = s.connect().await;
    c.send(json!({"type": "auth", "token": t["token"]})).await;
    let authed = c.recv().await;
    assert_eq!(
        (&authed["user"], &authed["name"]),
        (&json!(user), &json!("Ann"))
    );
    c.send(json!({"type": "join", "room": "r"})).await;
    let j = c.recv_type("joined").await;
    assert_eq!(j["members"][0]["user"], user);
    // A refresh for the same user; no admin right.
    let (_, again) = s
        .post("/v1/demo/token", &json!({"name": "Ann", "user": user}))
        .await;
    assert_eq!(again["user"], user);
    let get = reqwest::Method::GET;
    let demo_token = again["token"].as_str().unwrap();
    assert_eq!(
        call(&s, get, "/v1/rooms/r/members", Some(demo_token), None)
            .await
            .0,
        403
    );
    for bad in [
        json!({"name": ""}),
        json!({"name": "a", "user": "admin"}),
        json!([1]),
    ] {
        let (status, e) = s.post("/v1/demo/token", &bad).await;
        assert_eq!(status, 400, "{bad}: {e}");
    }
}
