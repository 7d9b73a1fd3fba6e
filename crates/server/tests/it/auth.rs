//! Identities from signed tokens: who a client is, what it may do in which
//! room, and every way a token can be bad, each refused with its code.

use std::path::PathBuf;
use std::time::Duration;

use base64::Engine;
use jsonwebtoken::{encode, Algorithm, EncodingKey, Header};
use plaza_server::ServerConfig;
use serde_json::{json, Value};

use crate::http_transports::Poller;
use crate::support::{now_ms, wait_until, Client, Closed, TestServer};

pub(crate) const SECRET: &str = "test-secret-of-at-least-32-bytes-0123456789";

fn keys_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/it/keys")
}

fn in_seconds(s: i64) -> i64 {
    (now_ms() / 1000) as i64 + s
}

/// Claims for `sub` with `rooms`, valid for ten minutes.
pub(crate) fn claims(sub: &str, rooms: Value) -> Value {
    json!({"sub": sub, "exp": in_seconds(600), "rooms": rooms})
}

pub(crate) fn hs256(claims: &Value) -> String {
    sign_hs(claims, SECRET.as_bytes())
}

fn sign_hs(claims: &Value, secret: &[u8]) -> String {
    encode(
        &Header::new(Algorithm::HS256),
        claims,
        &EncodingKey::from_secret(secret),
    )
    .unwrap()
}

/// Signs with a private key of `keys/` (`rsa.pem`, `ec.pem`, `ed.pem`, ...).
fn sign_pem(alg: Algorithm, file: &str, kid: Option<&str>, claims: &Value) -> String {
    let pem = std::fs::read(keys_dir().join(file)).unwrap();
    let key = match alg {
        Algorithm::RS256 | Algorithm::PS256 => EncodingKey::from_rsa_pem(&pem),
        Algorithm::ES256 => EncodingKey::from_ec_pem(&pem),
        Algorithm::EdDSA => EncodingKey::from_ed_pem(&pem),
        other => panic!("no test key for {other:?}"),
    }
    .unwrap();
    let mut header = Header::new(alg);
    header.kid = kid.map(str::to_owned);
    encode(&header, claims, &key).unwrap()
}

fn b64(v: &Value) -> String {
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(v.to_string())
}

async fn server_with(config: ServerConfig) -> TestServer {
    let s = TestServer::with_config(config).await;
    for room in ["lobby", "elsewhere"] {
        s.create_room(json!({"id": room})).await;
    }
    s
}

async fn server() -> TestServer {
    server_with(ServerConfig {
        jwt_secret: SECRET.into(),
        ..ServerConfig::default()
    })
    .await
}

/// Sends `auth` with `token` and returns the answer.
async fn auth(c: &mut Client, token: &str) -> Value {
    c.send(json!({"type": "auth", "token": token})).await;
    c.recv().await
}

async fn authed(s: &TestServer, token: &str) -> Client {
    let mut c = s.connect().await;
    let a = auth(&mut c, token).await;
    assert_eq!(a["type"], "authed", "{a}");
    c
}

fn me(joined: &Value) -> Value {
    joined["members"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["session"] == joined["session"])
        .cloned()
        .unwrap()
}

#[tokio::test]
async fn a_token_on_connect_or_in_auth_gives_the_identity_presence_shows() {
    let s = server().await;
    let mut ann_claims = claims("u-ann", json!({"lobby": ["*"]}));
    ann_claims["name"] = json!("Ann");
    let token = hs256(&ann_claims);
    let mut a = Client::connect_to(s.addr, &format!("/v1/ws?token={token}")).await;
    let answer = a.recv().await;
    assert_eq!(
        answer,
        json!({"type": "authed", "user": "u-ann", "name": "Ann", "expires_at": ann_claims["exp"].as_i64().unwrap() * 1000})
    );
    // The token's name wins over the join's.
    a.send(json!({"type": "join", "room": "lobby", "name": "mallory"}))
        .await;
    let j = a.recv_type("joined").await;
    assert_eq!(
        me(&j),
        json!({"session": j["session"], "name": "Ann", "platform": "browser", "user": "u-ann"})
    );

    // Without a name in the token, the join's name stands; a prefix grants.
    let mut b = authed(&s, &hs256(&claims("u-bob", json!({"lob*": ["join"]})))).await;
    b.send(json!({"type": "join", "room": "lobby", "name": "bobby", "platform": "xr"}))
        .await;
    let jb = b.recv_type("joined").await;
    assert_eq!(me(&jb)["name"], "bobby");
    let (ev, _) = a.recv_event("presence.join").await;
    assert_eq!(
        ev["member"],
        json!({"session": jb["session"], "name": "bobby", "platform": "xr", "user": "u-bob"})
    );
}

#[tokio::test]
async fn without_a_token_a_join_needs_a_ticket() {
    let s = server().await;
    let mut c = s.connect().await;
    c.send(json!({"type": "join", "room": "lobby", "name": "eve"}))
        .await;
    let e = c.recv().await;
    assert_eq!(e["code"], "token_required", "{e}");
    assert_eq!(e["ref"], json!({"frame": "join", "room": "lobby"}));
    // Tickets stay for anonymous flows: no user in presence.
    let ticket = s.ticket("lobby", "guest", "browser").await;
    c.send(json!({"type": "join", "ticket": ticket})).await;
    let j = c.recv_type("joined").await;
    assert_eq!(
        me(&j),
        json!({"session": j["session"], "name": "guest", "platform": "browser"})
    );
}

#[tokio::test]
async fn rights_are_checked_on_every_frame_and_a_refresh_changes_them() {
    let s = server().await;
    let (mut other, oj) = {
        let mut c = authed(&s, &hs256(&claims("u-o", json!({"*": ["join"]})))).await;
        c.send(json!({"type": "join", "room": "lobby", "name": "o"}))
            .await;
        let j = c.recv_type("joined").await;
        (c, j)
    };
    let narrow = claims("u-n", json!({"lobby": ["join", "publish:chat"]}));
    let mut c = authed(&s, &hs256(&narrow)).await;
    c.send(json!({"type": "join", "room": "lobby", "name": "n", "channels": ["chat"]}))
        .await;
    c.recv_type("joined").await;
    other.recv_event("presence.join").await;

    c.send(json!({"type": "publish", "room": "lobby", "event": "x", "data": 1, "id": "m1"}))
        .await;
    let e = c.recv().await;
    assert_eq!(e["code"], "forbidden", "{e}");
    assert_eq!(
        e["ref"],
        json!({"frame": "publish", "room": "lobby", "id": "m1"})
    );
    c.send(json!({"type": "publish", "room": "lobby", "channel": "chat", "event": "x", "data": 1, "id": "m2"}))
        .await;
    assert_eq!(c.recv_type("ack").await["id"], "m2");

    for (op, args) in [
        ("entity.create", json!({"data": {}})),
        ("lock.acquire", json!({"object": "o1"})),
    ] {
        let (r, _) = c.request("lobby", json!(op), op, args).await;
        assert_eq!(r["ok"], false, "{r}");
        assert_eq!(r["error"]["code"], "forbidden", "{r}");
    }
    // Subscribing is a member's own business.
    let (r, _) = c
        .request(
            "lobby",
            json!(3),
            "channel.subscribe",
            json!({"channel": "xr"}),
        )
        .await;
    assert_eq!(r["ok"], true, "{r}");
    c.send(json!({"type": "direct", "room": "lobby", "to": oj["session"], "event": "hi"}))
        .await;
    let e = c.recv().await;
    assert_eq!(
        (&e["code"], &e["ref"]["frame"]),
        (&json!("forbidden"), &json!("direct")),
        "{e}"
    );
    c.send(json!({"type": "join", "room": "elsewhere", "name": "n"}))
        .await;
    let e = c.recv().await;
    assert_eq!(e["code"], "forbidden", "{e}");
    assert_eq!(e["ref"], json!({"frame": "join", "room": "elsewhere"}));

    // A refreshed token with more rights applies in the room already joined.
    let wide = claims("u-n", json!({"lobby": ["*"]}));
    assert_eq!(auth(&mut c, &hs256(&wide)).await["type"], "authed");
    let (r, _) = c
        .request("lobby", json!(4), "entity.create", json!({"data": {}}))
        .await;
    assert_eq!(r["ok"], true, "{r}");
    c.send(json!({"type": "direct", "room": "lobby", "to": oj["session"], "event": "hi"}))
        .await;
    let (d, _) = other.recv_until(|v| v["type"] == "direct").await;
    assert_eq!(d["event"], "hi");
    // And one with fewer takes them away again.
    assert_eq!(auth(&mut c, &hs256(&narrow)).await["type"], "authed");
    let (r, _) = c
        .request("lobby", json!(5), "entity.create", json!({"data": {}}))
        .await;
    assert_eq!(r["error"]["code"], "forbidden", "{r}");
}

#[tokio::test]
async fn bad_tokens_are_refused_each_with_its_code() {
    let s = server().await;
    let good = claims("u-1", json!({"lobby": ["*"]}));
    let signed = hs256(&good);
    let mut parts = signed.split('.');
    let (h, _, sig) = (
        parts.next().unwrap(),
        parts.next().unwrap(),
        parts.next().unwrap(),
    );
    let forged_payload = b64(&claims("u-admin", json!({"*": ["*"]})));
    let mut huge = good.clone();
    huge["pad"] = json!("x".repeat(9000));
    let cases: Vec<(&str, String, &str, &str)> = vec![
        (
            "forged claims",
            format!("{h}.{forged_payload}.{sig}"),
            "token_invalid",
            "signature",
        ),
        (
            "another secret",
            sign_hs(&good, b"another-secret-of-at-least-32-bytes!!"),
            "token_invalid",
            "signature",
        ),
        (
            "alg none",
            format!(
                "{}.{}.",
                b64(&json!({"alg": "none", "typ": "JWT"})),
                b64(&good)
            ),
            "token_invalid",
            "not a signed token",
        ),
        (
            "expired",
            hs256(&json!({"sub": "u-1", "exp": in_seconds(-5)})),
            "token_expired",
            "expired",
        ),
        ("oversized", hs256(&huge), "token_invalid", "bytes"),
        (
            "not a token",
            "abc".into(),
            "token_invalid",
            "not a signed token",
        ),
        (
            "sub of the wrong type",
            hs256(&json!({"sub": 7, "exp": in_seconds(60)})),
            "token_invalid",
            "invalid claims",
        ),
        (
            "rooms of the wrong type",
            hs256(&json!({"sub": "u", "exp": in_seconds(60), "rooms": ["lobby"]})),
            "token_invalid",
            "invalid claims",
        ),
        (
            "exp of the wrong type",
            hs256(&json!({"sub": "u", "exp": "soon"})),
            "token_invalid",
            "invalid type: string \"soon\", expected f64",
        ),
        (
            "no exp",
            hs256(&json!({"sub": "u"})),
            "token_invalid",
            "exp",
        ),
        (
            "no sub",
            hs256(&json!({"exp": in_seconds(60)})),
            "token_invalid",
            "sub",
        ),
        (
            "unknown right",
            hs256(&claims("u", json!({"lobby": ["joim"]}))),
            "token_invalid",
            "joim",
        ),
        (
            "not valid yet",
            hs256(&json!({"sub": "u", "exp": in_seconds(600), "nbf": in_seconds(300)})),
            "token_invalid",
            "not valid before",
        ),
        (
            "an algorithm without a key",
            sign_pem(Algorithm::RS256, "rsa.pem", None, &good),
            "token_invalid",
            "no configured key",
        ),
    ];
    let mut c = s.connect().await;
    for (what, token, code, says) in &cases {
        let e = auth(&mut c, token).await;
        assert_eq!(e["type"], "error", "{what}: {e}");
        assert_eq!(e["code"], *code, "{what}: {e}");
        assert_eq!(e["ref"], json!({"frame": "auth"}), "{what}: {e}");
        assert!(e["message"].as_str().unwrap().contains(says), "{what}: {e}");
    }
    // None of them gave the connection an identity, nor closed it.
    c.send(json!({"type": "join", "room": "lobby", "name": "x"}))
        .await;
    assert_eq!(c.recv().await["code"], "token_required");
    // On connect, the refusal is the first frame and the connection stays.
    let expired = &cases[3].1;
    let mut c = Client::connect_to(s.addr, &format!("/v1/ws?token={expired}")).await;
    assert_eq!(c.recv().await["code"], "token_expired");
    assert_eq!(auth(&mut c, &signed).await["type"], "authed");
}

#[tokio::test]
async fn audience_and_issuer_are_required_when_configured() {
    let s = server_with(ServerConfig {
        jwt_secret: SECRET.into(),
        jwt_audience: "plaza".into(),
        jwt_issuer: "https://app.example.org".into(),
        ..ServerConfig::default()
    })
    .await;
    let mut ok = claims("u", json!({"lobby": ["join"]}));
    ok["aud"] = json!("plaza");
    ok["iss"] = json!("https://app.example.org");
    let mut c = s.connect().await;
    for (field, value, says) in [
        ("aud", json!("another"), "audience"),
        ("iss", json!("https://evil.example"), "issuer"),
        ("aud", Value::Null, "aud"),
    ] {
        let mut bad = ok.clone();
        if value.is_null() {
            bad.as_object_mut().unwrap().remove(field);
        } else {
            bad[field] = value;
        }
        let e = auth(&mut c, &hs256(&bad)).await;
        assert_eq!(e["code"], "token_invalid", "{field}: {e}");
        assert!(e["message"].as_str().unwrap().contains(says), "{e}");
    }
    assert_eq!(auth(&mut c, &hs256(&ok)).await["type"], "authed");
}

#[tokio::test]
async fn public_keys_verify_rs256_ps256_es256_and_eddsa_and_nothing_else() {
    for (public, private, algs) in [
        (
            "rsa.pub.pem",
            "rsa.pem",
            vec![Algorithm::RS256, Algorithm::PS256],
        ),
        ("ec.pub.pem", "ec.pem", vec![Algorithm::ES256]),
        ("ed.pub.pem", "ed.pem", vec![Algorithm::EdDSA]),
    ] {
        let s = server_with(ServerConfig {
            jwt_public_key_file: Some(keys_dir().join(public)),
            ..ServerConfig::default()
        })
        .await;
        let good = claims("u-pk", json!({"lobby": ["join"]}));
        for alg in algs {
            let mut c = authed(&s, &sign_pem(alg, private, None, &good)).await;
            c.send(json!({"type": "join", "room": "lobby", "name": "pk"}))
                .await;
            assert_eq!(me(&c.recv_type("joined").await)["user"], "u-pk");
        }
        // The public key used as an HMAC secret (key confusion) does not pass,
        // nor does a token of another key of the same kind.
        let pem = std::fs::read(keys_dir().join(public)).unwrap();
        let mut c = s.connect().await;
        let e = auth(&mut c, &sign_hs(&good, &pem)).await;
        assert_eq!(e["code"], "token_invalid", "{public}: {e}");
        if public == "rsa.pub.pem" {
            let e = auth(&mut c, &sign_pem(Algorithm::RS256, "rsa2.pem", None, &good)).await;
            assert_eq!(e["code"], "token_invalid", "{e}");
            assert!(e["message"].as_str().unwrap().contains("signature"), "{e}");
        }
    }
}

fn jwk(public_pem: &str, kid: &str) -> Value {
    use jsonwebtoken::jwk::Jwk;
    use jsonwebtoken::DecodingKey;
    let pem = std::fs::read(keys_dir().join(public_pem)).unwrap();
    let key = DecodingKey::from_rsa_pem(&pem).unwrap();
    let mut jwk = Jwk::from_decoding_key(&key, Some(Algorithm::RS256)).unwrap();
    jwk.common.key_id = Some(kid.into());
    serde_json::to_value(jwk).unwrap()
}

#[tokio::test]
async fn jwks_keys_are_picked_by_kid_and_a_changed_file_is_reloaded() {
    let dir = std::env::temp_dir().join(format!("plaza-jwks-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("jwks.json");
    std::fs::write(
        &file,
        json!({"keys": [jwk("rsa.pub.pem", "k1")]}).to_string(),
    )
    .unwrap();
    let s = server_with(ServerConfig {
        jwt_jwks_file: Some(file.clone()),
        ..ServerConfig::default()
    })
    .await;
    let good = claims("u-j", json!({"lobby": ["join"]}));
    authed(
        &s,
        &sign_pem(Algorithm::RS256, "rsa.pem", Some("k1"), &good),
    )
    .await;
    let rotated = sign_pem(Algorithm::RS256, "rsa2.pem", Some("k2"), &good);
    let mut c = s.connect().await;
    let e = auth(&mut c, &rotated).await;
    assert_eq!(e["code"], "token_invalid", "{e}");
    assert!(e["message"].as_str().unwrap().contains("k2"), "{e}");
    // A token naming k1 but signed by the other key does not pass either.
    let e = auth(
        &mut c,
        &sign_pem(Algorithm::RS256, "rsa2.pem", Some("k1"), &good),
    )
    .await;
    assert_eq!(e["code"], "token_invalid", "{e}");

    // The backend publishes its new key: no restart needed.
    let both = json!({"keys": [jwk("rsa.pub.pem", "k1"), jwk("rsa2.pub.pem", "k2")]});
    std::fs::write(&file, both.to_string()).unwrap();
    let reloaded = wait_until(|| {
        let (addr, token) = (s.addr, rotated.clone());
        async move {
            let mut c = Client::connect(addr).await;
            auth(&mut c, &token).await["type"] == "authed"
        }
    })
    .await;
    assert!(reloaded, "the new key was not picked up");
    assert!(s.metric("plaza_jwks_reloads_total").await >= Some(1.0));
    // A broken file keeps the keys in use.
    std::fs::write(&file, "{not json").unwrap();
    let seen =
        wait_until(|| async { s.metric("plaza_jwks_reload_failures_total").await == Some(1.0) })
            .await;
    assert!(seen, "the broken file was not noticed");
    authed(&s, &rotated).await;
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn an_expired_connection_is_closed_with_4004_and_resumes_with_a_fresh_token() {
    let s = server().await;
    let rooms = json!({"lobby": ["*"]});
    let soon = json!({"sub": "u-e", "exp": (now_ms() + 1500) as f64 / 1000.0, "rooms": rooms});
    let mut c = authed(&s, &hs256(&soon)).await;
    c.send(json!({"type": "join", "room": "lobby", "name": "e"}))
        .await;
    let j = c.recv_type("joined").await;
    let e = c.recv().await;
    assert_eq!(e["code"], "token_expired", "{e}");
    assert!(matches!(c.closed().await, Closed::Code(4004)));

    let resume = json!({"type": "join", "room": "lobby", "name": "e",
        "resume": {"token": j["resume_token"], "last_seq": j["seq"]}});
    // Someone else's token cannot take the session over.
    let mut thief = authed(&s, &hs256(&claims("u-thief", rooms.clone()))).await;
    thief.send(resume.clone()).await;
    assert_eq!(thief.recv().await["code"], "forbidden");
    let mut back = authed(&s, &hs256(&claims("u-e", rooms))).await;
    back.send(resume).await;
    let r = back.recv_type("joined").await;
    assert_eq!(r["resumed"], true, "{r}");
    assert_eq!(r["session"], j["session"]);
}

/// A session joined with a ticket and no token has no user: on a node with
/// keys its resume token alone resumes it, on a connection without a token
/// or with anyone's token (whatever that grants), and it keeps a ticket's
/// rights. Nothing else is admitted that way: an unknown resume token or a
/// user's session gets `token_required` without a token, and a ticket-only
/// room still wants a ticket.
#[tokio::test]
async fn a_ticket_session_is_resumed_by_its_resume_token_alone() {
    let s = server().await;
    let ticket = s.ticket("lobby", "guest", "xr").await;
    let mut c = s.connect().await;
    c.send(json!({"type": "join", "ticket": ticket})).await;
    let j = c.recv_type("joined").await;
    let guest = json!({"session": j["session"], "name": "guest", "platform": "xr"});
    assert_eq!(me(&j), guest);
    drop(c);
    let resume = |seq: &Value| {
        json!({"type": "join", "room": "lobby",
            "resume": {"token": j["resume_token"], "last_seq": seq}})
    };

    // No token, no ticket, no name: resumed, as it was.
    let mut c = s.connect().await;
    c.send(resume(&j["seq"])).await;
    let r = c.recv_type("joined").await;
    assert_eq!(
        (&r["resumed"], &r["session"]),
        (&json!(true), &j["session"]),
        "{r}"
    );
    assert_eq!(me(&r), guest);
    let (ack, _) = c.publish("lobby", "chat", json!("back")).await;
    assert_eq!(ack["type"], "ack", "{ack}");
    let seq = ack["seq"].clone();
    drop(c);

    // On a token connection, of a token granting no publish here: the
    // session stays user-less, with a ticket's rights.
    let mut t = authed(&s, &hs256(&claims("u-t", json!({"lobby": ["join"]})))).await;
    t.send(resume(&seq)).await;
    let r = t.recv_type("joined").await;
    assert_eq!(
        (&r["resumed"], &r["session"]),
        (&json!(true), &j["session"]),
        "{r}"
    );
    assert_eq!(me(&r), guest, "no user: the token's is not taken on");
    let (ack, _) = t.publish("lobby", "chat", json!("still a guest")).await;
    assert_eq!(ack["type"], "ack", "{ack}");
    let seq = ack["seq"].clone();
    drop(t);
    // And with a token granting nothing in the room.
    let mut n = authed(&s, &hs256(&claims("u-n", json!({"elsewhere": ["*"]})))).await;
    n.send(resume(&seq)).await;
    let r = n.recv_type("joined").await;
    assert_eq!(r["session"], j["session"], "{r}");

    // Nothing else gets in without a token: an unknown resume token makes
    // no new session, and a user's session needs its user's token.
    let mut c = s.connect().await;
    c.send(json!({"type": "join", "room": "lobby", "name": "eve",
        "resume": {"token": "A".repeat(32), "last_seq": 0}}))
        .await;
    let e = c.recv().await;
    assert_eq!(
        (&e["type"], &e["code"]),
        (&json!("error"), &json!("token_required")),
        "{e}"
    );
    let mut u = authed(&s, &hs256(&claims("u-e", json!({"lobby": ["*"]})))).await;
    u.send(json!({"type": "join", "room": "lobby", "name": "e"}))
        .await;
    let uj = u.recv_type("joined").await;
    drop(u);
    c.send(json!({"type": "join", "room": "lobby",
        "resume": {"token": uj["resume_token"], "last_seq": uj["seq"]}}))
        .await;
    assert_eq!(c.recv().await["code"], "token_required");
    // With a ticket and no token, a user's session is forbidden.
    let ticket = s.ticket("lobby", "eve", "browser").await;
    c.send(json!({"type": "join", "ticket": ticket,
        "resume": {"token": uj["resume_token"], "last_seq": uj["seq"]}}))
        .await;
    assert_eq!(c.recv().await["code"], "forbidden");
    // With a token granting no join in the room, anything but a user-less
    // session is forbidden, as a new member would be.
    let mut n2 = authed(&s, &hs256(&claims("u-n", json!({"elsewhere": ["*"]})))).await;
    n2.send(json!({"type": "join", "room": "lobby",
        "resume": {"token": "A".repeat(32), "last_seq": 0}}))
        .await;
    assert_eq!(n2.recv().await["code"], "forbidden");
    // A room that does not exist (any more) is not found, and not created.
    c.send(json!({"type": "join", "room": "gone",
        "resume": {"token": j["resume_token"], "last_seq": 0}}))
        .await;
    assert_eq!(c.recv().await["code"], "room_not_found");
    // A ticket-only room admits no one without a ticket, resumes included.
    s.create_room(json!({"id": "vip", "options": {"access": "ticket"}}))
        .await;
    let ticket = s.ticket("vip", "guest", "browser").await;
    let mut v = s.connect().await;
    v.send(json!({"type": "join", "ticket": ticket})).await;
    let vj = v.recv_type("joined").await;
    drop(v);
    c.send(json!({"type": "join", "room": "vip",
        "resume": {"token": vj["resume_token"], "last_seq": vj["seq"]}}))
        .await;
    assert_eq!(c.recv().await["code"], "ticket_required");
    c.assert_alive().await;

    // With auto_create_rooms too, such a join creates no room.
    let s = server_with(ServerConfig {
        jwt_secret: SECRET.into(),
        auto_create_rooms: true,
        ..ServerConfig::default()
    })
    .await;
    let mut c = s.connect().await;
    c.send(json!({"type": "join", "room": "ghost",
        "resume": {"token": "A".repeat(32), "last_seq": 0}}))
        .await;
    assert_eq!(c.recv().await["code"], "room_not_found");
    assert_eq!(s.get("/v1/rooms/ghost").await.0, 404);
}

/// A join let through only to resume, whose resume token names a session
/// without a user that has expired (its resume window passed): refused as a
/// new member would be (`token_required`), and no session is made (no
/// `presence.join`, the room's member count unchanged).
#[tokio::test]
async fn an_expired_ticket_session_is_not_resumed_by_its_resume_token_alone() {
    let s = server_with(ServerConfig {
        jwt_secret: SECRET.into(),
        resume_window_ms: 100,
        ..ServerConfig::default()
    })
    .await;
    let mut ann = authed(&s, &hs256(&claims("u-ann", json!({"lobby": ["*"]})))).await;
    ann.send(json!({"type": "join", "room": "lobby", "name": "ann"}))
        .await;
    ann.recv_type("joined").await;
    let ticket = s.ticket("lobby", "guest", "xr").await;
    let mut c = s.connect().await;
    c.send(json!({"type": "join", "ticket": ticket})).await;
    let j = c.recv_type("joined").await;
    ann.recv_event("presence.join").await;
    drop(c);
    let (leave, _) = ann.recv_event("presence.leave").await;
    assert_eq!(
        (&leave["session"], &leave["reason"]),
        (&j["session"], &json!("disconnected")),
        "{leave}"
    );
    // Past the resume window.
    tokio::time::sleep(Duration::from_millis(250)).await;
    let mut c = s.connect().await;
    c.send(json!({"type": "join", "room": "lobby",
        "resume": {"token": j["resume_token"], "last_seq": j["seq"]}}))
        .await;
    let e = c.recv().await;
    assert_eq!(
        (&e["type"], &e["code"]),
        (&json!("error"), &json!("token_required")),
        "{e}"
    );
    c.assert_alive().await;
    let seen = ann.drain().await;
    assert!(
        seen.iter().all(|v| v["kind"] != "presence.join"),
        "no new member: {seen:?}"
    );
    let (_, room) = s.get("/v1/rooms/lobby").await;
    assert_eq!(room["members"], 1, "ann only: {room}");
}

#[tokio::test]
async fn a_refreshed_token_keeps_the_connection_past_the_first_expiry() {
    let s = server().await;
    let first_exp = now_ms() + 1500;
    let soon = json!({"sub": "u-r", "exp": first_exp as f64 / 1000.0, "rooms": {"lobby": ["*"]}});
    let mut c = authed(&s, &hs256(&soon)).await;
    // Another user's token is no refresh: refused, the identity stays.
    let e = auth(&mut c, &hs256(&claims("u-other", json!({})))).await;
    assert_eq!(e["code"], "forbidden", "{e}");
    let a = auth(&mut c, &hs256(&claims("u-r", json!({"lobby": ["*"]})))).await;
    assert_eq!(a["type"], "authed", "{a}");
    // The time itself is what is tested here.
    let past = first_exp + 500 - now_ms().min(first_exp + 500);
    tokio::time::sleep(Duration::from_millis(past)).await;
    c.send(json!({"type": "ping", "ts": 1})).await;
    assert_eq!(c.recv().await, json!({"type": "pong", "ts": 1}));
}

#[tokio::test]
async fn development_mode_trusts_joins_and_says_it_checks_no_token() {
    let s = server_with(ServerConfig::default()).await;
    let mut c = s.connect().await;
    let e = auth(&mut c, &hs256(&claims("u", json!({})))).await;
    assert_eq!(e["code"], "token_invalid", "{e}");
    assert!(
        e["message"].as_str().unwrap().contains("no jwt_* key"),
        "{e}"
    );
    c.send(json!({"type": "join", "room": "lobby", "name": "dev"}))
        .await;
    assert_eq!(me(&c.recv_type("joined").await)["name"], "dev");
}

#[tokio::test]
async fn keys_that_do_not_load_fail_closed() {
    let config = ServerConfig {
        jwt_public_key_file: Some(keys_dir().join("missing.pem")),
        ..ServerConfig::default()
    };
    let e = plaza_server::check_token_keys(&config).unwrap_err();
    assert!(e.contains("missing.pem"), "{e}");
    let short = ServerConfig {
        jwt_secret: "short".into(),
        ..ServerConfig::default()
    };
    assert!(plaza_server::check_token_keys(&short)
        .unwrap_err()
        .contains("32"));
    let s = server_with(config).await;
    let mut c = s.connect().await;
    c.send(json!({"type": "join", "room": "lobby", "name": "x"}))
        .await;
    assert_eq!(c.recv().await["code"], "token_required");
    let e = auth(&mut c, &hs256(&claims("u", json!({"lobby": ["*"]})))).await;
    assert_eq!(e["code"], "token_invalid", "{e}");
}

#[tokio::test]
async fn http_transports_take_the_token_on_open() {
    let s = server().await;
    let token = hs256(&claims("u-h", json!({"lobby": ["join"]})));
    let mut p = Poller::open_at(&s, &format!("/v1/sessions?token={token}")).await;
    let a = p.until(|v| v["type"] == "authed").await;
    assert_eq!(a["user"], "u-h");
    p.send(json!({"type": "join", "room": "lobby", "name": "h"}))
        .await;
    let j = p.until(|v| v["type"] == "joined").await;
    assert_eq!(me(&j)["user"], "u-h");
}
