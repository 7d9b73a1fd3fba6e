//! Locks (leases) between members: exclusion, release, release on disconnect,
//! expiry, fencing tokens.

use crate::support::{now_ms, Client, TestServer};
use serde_json::{json, Value};

const ROOM: &str = "locks";

async fn two(s: &TestServer) -> ((Client, Value), (Client, Value)) {
    s.create_room(json!({"id": ROOM})).await;
    let mut c = s.join_all(ROOM, &["ann", "bob"]).await;
    let b = c.pop().unwrap();
    let a = c.pop().unwrap();
    (a, b)
}

async fn acquire(c: &mut Client, object: &str, ttl_ms: Option<u64>) -> Value {
    let mut args = json!({"object": object});
    if let Some(t) = ttl_ms {
        args["ttl_ms"] = json!(t);
    }
    c.request(ROOM, json!(format!("acq-{object}")), "lock.acquire", args)
        .await
        .0
}

#[tokio::test]
async fn a_lock_excludes_others_until_released() {
    let s = TestServer::start().await;
    let ((mut a, ja), (mut b, jb)) = two(&s).await;
    let (sa, sb) = (ja["session"].clone(), jb["session"].clone());
    a.request(ROOM, json!("c"), "entity.create", json!({"data": {"x": 0}}))
        .await;
    b.recv_event("entity.created").await;

    let before = now_ms();
    let r = acquire(&mut a, "e1", None).await;
    assert_eq!(r["ok"], true, "{r}");
    let lock = r["result"]["lock"].clone();
    assert_eq!(lock["object"], "e1");
    assert_eq!(lock["owner"], sa);
    assert_eq!(lock["token"], 1);
    // the default lease (30 s) from about now
    let expires = lock["expires_at"].as_u64().unwrap();
    assert!(
        expires >= before + 30_000 && expires <= now_ms() + 30_000,
        "{lock}"
    );
    let ev = b.recv_type("event").await;
    assert_eq!(ev["kind"], "lock.acquired");
    assert_eq!(ev["lock"], lock);
    assert_eq!(ev["seq"], r["result"]["seq"]);
    assert_eq!(ev["from"], sa);

    // B can neither take the lock nor change the locked entity.
    let (r, _) = b
        .request(ROOM, json!(1), "lock.acquire", json!({"object": "e1"}))
        .await;
    assert_eq!(r["error"]["code"], "lock_held", "{r}");
    for (op, args) in [
        ("entity.set", json!({"id": "e1", "data": 1})),
        ("entity.patch", json!({"id": "e1", "data": {"y": 1}})),
        ("entity.delete", json!({"id": "e1"})),
    ] {
        let (r, _) = b.request(ROOM, json!(op), op, args).await;
        assert_eq!(r["ok"], false, "{op}: {r}");
        assert_eq!(r["error"]["code"], "lock_held", "{op}: {r}");
    }
    // ... nor renew or release it.
    for op in ["lock.renew", "lock.release"] {
        let (r, _) = b
            .request(ROOM, json!(op), op, json!({"object": "e1"}))
            .await;
        assert_eq!(r["error"]["code"], "lock_not_held", "{op}: {r}");
    }
    assert_eq!(
        b.drain().await,
        Vec::<Value>::new(),
        "refusals make no events"
    );

    // The holder can write.
    let (r, _) = a
        .request(
            ROOM,
            json!("set"),
            "entity.set",
            json!({"id": "e1", "data": {"x": 1}}),
        )
        .await;
    assert_eq!(r["ok"], true, "{r}");
    assert_eq!(r["result"]["entity"]["version"], 2);
    assert_eq!(b.recv_type("event").await["kind"], "entity.updated");

    // Renewing keeps the token and moves the end of the lease.
    let (r, _) = a
        .request(
            ROOM,
            json!("renew"),
            "lock.renew",
            json!({"object": "e1", "ttl_ms": 60_000}),
        )
        .await;
    assert_eq!(r["ok"], true, "{r}");
    assert_eq!(r["result"]["lock"]["token"], 1);
    assert!(r["result"]["lock"]["expires_at"].as_u64().unwrap() >= expires);
    let ev = b.recv_type("event").await;
    assert_eq!(ev["kind"], "lock.acquired");
    assert_eq!(ev["lock"], r["result"]["lock"]);

    // A joining member sees the lock in its snapshot.
    let (mut c, jc) = s.join(ROOM, "cid").await;
    assert_eq!(jc["snapshot"]["locks"], json!([r["result"]["lock"]]));

    // Release: everyone is told, and B can now take it, with a newer token.
    let (r, _) = a
        .request(ROOM, json!("rel"), "lock.release", json!({"object": "e1"}))
        .await;
    assert_eq!(r["ok"], true, "{r}");
    assert_eq!(r["result"]["object"], "e1");
    assert_eq!(r["result"]["token"], 1);
    for other in [&mut b, &mut c] {
        let (ev, _) = other.recv_event("lock.released").await;
        assert_eq!(ev["object"], "e1");
        assert_eq!(ev["owner"], sa);
        assert_eq!(ev["token"], 1);
        assert_eq!(ev["reason"], "released");
        assert_eq!(ev["seq"], r["result"]["seq"]);
    }
    let r = acquire(&mut b, "e1", None).await;
    assert_eq!(r["ok"], true, "{r}");
    assert_eq!(r["result"]["lock"]["owner"], sb);
    assert_eq!(r["result"]["lock"]["token"], 2);
    // Releasing twice is refused.
    let (r, _) = a
        .request(ROOM, json!("rel2"), "lock.release", json!({"object": "e1"}))
        .await;
    assert_eq!(r["error"]["code"], "lock_not_held", "{r}");
    // Now A is the one locked out.
    let (r, _) = a
        .request(
            ROOM,
            json!("set2"),
            "entity.set",
            json!({"id": "e1", "data": 2}),
        )
        .await;
    assert_eq!(r["error"]["code"], "lock_held", "{r}");
}

#[tokio::test]
async fn a_dropped_connection_releases_its_locks() {
    let s = TestServer::start().await;
    let ((mut a, ja), (mut b, _)) = two(&s).await;
    let sa = ja["session"].clone();
    let first = acquire(&mut a, "doc", None).await;
    let second = acquire(&mut a, "pen", None).await;
    assert_eq!(first["result"]["lock"]["token"], 1);
    assert_eq!(second["result"]["lock"]["token"], 2);
    for _ in 0..2 {
        b.recv_event("lock.acquired").await;
    }

    drop(a); // the TCP connection closes without a WebSocket close

    let mut released = Vec::new();
    let (leave, before) = b.recv_event("presence.leave").await;
    for ev in before {
        assert_eq!(ev["kind"], "lock.released", "{ev}");
        released.push(ev);
    }
    assert_eq!(leave["session"], sa);
    assert_eq!(leave["reason"], "disconnected");
    released.sort_by_key(|e| e["object"].as_str().unwrap().to_owned());
    assert_eq!(released.len(), 2, "{released:?}");
    for (ev, (object, token)) in released.iter().zip([("doc", 1), ("pen", 2)]) {
        assert_eq!(ev["object"], object);
        assert_eq!(ev["token"], token);
        assert_eq!(ev["owner"], sa);
        assert_eq!(ev["reason"], "disconnected");
        assert!(ev["seq"].as_u64().unwrap() < leave["seq"].as_u64().unwrap());
    }

    let r = acquire(&mut b, "doc", None).await;
    assert_eq!(r["ok"], true, "{r}");
    assert_eq!(
        r["result"]["lock"]["token"], 3,
        "fencing tokens keep growing"
    );
}

#[tokio::test]
async fn an_expired_lease_is_announced_and_can_be_taken() {
    let s = TestServer::start().await;
    let ((mut a, ja), (mut b, jb)) = two(&s).await;
    let r = acquire(&mut a, "obj", Some(200)).await;
    assert_eq!(r["ok"], true, "{r}");
    let lock = &r["result"]["lock"];
    assert_eq!(lock["token"], 1);
    let (acq, _) = b.recv_event("lock.acquired").await;
    assert_eq!(acq["lock"], *lock);

    // Wait for the server to announce the end of the lease.
    let (ev, before) = b.recv_event("lock.released").await;
    assert!(before.is_empty(), "{before:?}");
    assert_eq!(ev["object"], "obj");
    assert_eq!(ev["owner"], ja["session"]);
    assert_eq!(ev["token"], 1);
    assert_eq!(ev["reason"], "expired");
    assert!(ev.get("from").is_none(), "the server caused it: {ev}");
    assert!(ev["ts"].as_u64().unwrap() >= lock["expires_at"].as_u64().unwrap());
    // The former holder is told as well.
    let (ev_a, _) = a.recv_event("lock.released").await;
    assert_eq!(ev_a["seq"], ev["seq"]);

    let r = acquire(&mut b, "obj", Some(10_000)).await;
    assert_eq!(r["ok"], true, "{r}");
    assert_eq!(r["result"]["lock"]["owner"], jb["session"]);
    assert_eq!(r["result"]["lock"]["token"], 2);
    // The old holder can neither renew nor write under it.
    let (r, _) = a
        .request(ROOM, json!("renew"), "lock.renew", json!({"object": "obj"}))
        .await;
    assert_eq!(r["error"]["code"], "lock_not_held", "{r}");
    let r = acquire(&mut a, "obj", None).await;
    assert_eq!(r["error"]["code"], "lock_held", "{r}");
}

#[tokio::test]
async fn reacquiring_ones_own_lock_issues_a_new_token_and_ttl_is_capped() {
    let s = TestServer::start().await;
    let ((mut a, _), _b) = two(&s).await;
    let r1 = acquire(&mut a, "o", None).await;
    let r2 = acquire(&mut a, "o", None).await;
    assert_eq!(r1["result"]["lock"]["token"], 1);
    assert_eq!(r2["result"]["lock"]["token"], 2);
    // ttl_ms above the maximum (600 s by default) is capped.
    let before = now_ms();
    let r = acquire(&mut a, "big", Some(u64::MAX / 2)).await;
    assert_eq!(r["ok"], true, "{r}");
    let expires = r["result"]["lock"]["expires_at"].as_u64().unwrap();
    assert!(
        expires >= before + 600_000 && expires <= now_ms() + 600_000,
        "{r}"
    );
}
