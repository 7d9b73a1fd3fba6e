//! Requests: one response per nonce, entities with version checks, errors,
//! and the snapshot a joining member gets.

use std::collections::{BTreeMap, BTreeSet};

use crate::support::{of_kind, Client, TestServer};
use serde_json::{json, Value};

const ROOM: &str = "req";

async fn two(s: &TestServer) -> ((Client, Value), (Client, Value)) {
    s.create_room(json!({"id": ROOM})).await;
    let mut c = s.join_all(ROOM, &["ann", "bob"]).await;
    let b = c.pop().unwrap();
    let a = c.pop().unwrap();
    (a, b)
}

/// The nonce of request `i`: strings and numbers, with `"1"` and `1` both used.
fn nonce(i: usize) -> Value {
    match i {
        49 => json!("1"),
        _ if i.is_multiple_of(2) => json!(format!("n{i}")),
        _ => json!(i),
    }
}

#[tokio::test]
async fn concurrent_requests_get_exactly_one_response_each() {
    const N: usize = 50;
    let s = TestServer::start().await;
    let ((mut a, ja), (mut b, _)) = two(&s).await;

    // Fire everything at once: creations, unknown ops and bad arguments mixed.
    for i in 0..N {
        let (op, args) = match i % 5 {
            3 => ("entity.fly", json!({})),
            4 => ("entity.set", json!({"data": 1})),
            _ => ("entity.create", json!({"kind": "node", "data": {"i": i}})),
        };
        a.send(json!({"type": "request", "room": ROOM, "nonce": nonce(i), "op": op, "args": args}))
            .await;
    }
    let mut responses: Vec<Value> = Vec::new();
    while responses.len() < N {
        let v = a.recv().await;
        assert_eq!(
            v["type"], "response",
            "the requester gets responses only: {v}"
        );
        responses.push(v);
    }
    assert_eq!(a.drain().await, Vec::<Value>::new(), "no extra response");

    // Exactly one response per nonce, the nonce echoed with its JSON type.
    let mut by_nonce: BTreeMap<String, Value> = BTreeMap::new();
    for r in responses {
        let key = r["nonce"].to_string();
        assert!(by_nonce.insert(key, r).is_none(), "duplicate response");
    }
    let expected: BTreeSet<String> = (0..N).map(|i| nonce(i).to_string()).collect();
    assert_eq!(by_nonce.keys().cloned().collect::<BTreeSet<_>>(), expected);
    assert!(by_nonce.contains_key("\"1\"") && by_nonce.contains_key("1"));

    let mut created: BTreeMap<u64, Value> = BTreeMap::new();
    for i in 0..N {
        let r = &by_nonce[&nonce(i).to_string()];
        assert_eq!(r["room"], ROOM);
        match i % 5 {
            3 => {
                assert_eq!(r["ok"], false, "{r}");
                assert_eq!(r["error"]["code"], "unknown_op");
                assert!(r.get("result").is_none());
            }
            4 => {
                assert_eq!(r["ok"], false, "{r}");
                assert_eq!(r["error"]["code"], "invalid_args");
            }
            _ => {
                assert_eq!(r["ok"], true, "{r}");
                assert!(r.get("error").is_none());
                let e = &r["result"]["entity"];
                assert_eq!(e["kind"], "node");
                assert_eq!(e["data"], json!({"i": i}));
                assert_eq!(e["version"], 1);
                let seq = r["result"]["seq"].as_u64().unwrap();
                assert!(created.insert(seq, e.clone()).is_none());
            }
        }
    }
    // Ids are assigned by the server, unique and in creation (seq) order.
    let ids: Vec<String> = created
        .values()
        .map(|e| e["id"].as_str().unwrap().to_owned())
        .collect();
    let want: Vec<String> = (1..=created.len()).map(|n| format!("e{n}")).collect();
    assert_eq!(ids, want);

    // The other member saw every creation, once, in order, and nothing else.
    let mut events = Vec::new();
    while events.len() < created.len() {
        events.push(b.recv_type("event").await);
    }
    assert_eq!(b.drain().await, Vec::<Value>::new());
    let got: Vec<(u64, Value)> = events
        .iter()
        .map(|e| {
            assert_eq!(e["kind"], "entity.created");
            assert_eq!(e["from"], ja["session"]);
            (e["seq"].as_u64().unwrap(), e["entity"].clone())
        })
        .collect();
    assert_eq!(got, created.into_iter().collect::<Vec<_>>());
}

#[tokio::test]
async fn nonces_are_echoed_verbatim() {
    let s = TestServer::start().await;
    let ((mut a, _), _b) = two(&s).await;
    for n in [
        "1e3",
        "-5",
        "2.50",
        "18446744073709551616",
        r#""ü\u00fc""#,
        r#""""#,
    ] {
        a.send_raw(&format!(
            r#"{{"type":"request","room":"{ROOM}","nonce":{n},"op":"channel.subscribe","args":{{"channel":"c"}}}}"#
        ))
        .await;
        let raw = a.recv_text().await;
        assert!(
            raw.contains(&format!(r#""nonce":{n}"#)),
            "nonce {n} not echoed verbatim: {raw}"
        );
    }
}

#[tokio::test]
async fn entities_change_with_version_checks() {
    let s = TestServer::start().await;
    let ((mut a, ja), (mut b, _)) = two(&s).await;
    let me = ja["session"].clone();

    let (r, _) = a
        .request(
            ROOM,
            json!(1),
            "entity.create",
            json!({"kind": "node", "data": {"x": 1}}),
        )
        .await;
    let e1 = json!({"id": "e1", "kind": "node", "data": {"x": 1}, "version": 1});
    assert_eq!(r["result"]["entity"], e1, "{r}");
    let ev = b.recv_type("event").await;
    assert_eq!(ev["kind"], "entity.created");
    assert_eq!(ev["entity"], e1);
    assert_eq!(ev["seq"], r["result"]["seq"]);
    assert_eq!(ev["from"], me);

    // set with the right version
    let (r, _) = a
        .request(
            ROOM,
            json!(2),
            "entity.set",
            json!({"id": "e1", "data": {"y": 2}, "version": 1}),
        )
        .await;
    let e1v2 = json!({"id": "e1", "kind": "node", "data": {"y": 2}, "version": 2});
    assert_eq!(r["result"]["entity"], e1v2, "{r}");
    let ev = b.recv_type("event").await;
    assert_eq!(
        (ev["kind"].clone(), ev["entity"].clone()),
        (json!("entity.updated"), e1v2)
    );

    // stale versions are refused, for set, patch and delete alike
    for (op, args) in [
        ("entity.set", json!({"id": "e1", "data": 0, "version": 1})),
        (
            "entity.patch",
            json!({"id": "e1", "data": {"z": 0}, "version": 3}),
        ),
        ("entity.delete", json!({"id": "e1", "version": 1})),
    ] {
        let (r, _) = a.request(ROOM, json!(op), op, args).await;
        assert_eq!(r["ok"], false, "{r}");
        assert_eq!(r["error"]["code"], "version_conflict", "{op}: {r}");
        assert!(r["error"]["message"].as_str().unwrap().contains("version"));
    }

    // patch merges top-level fields, null removes one; no version means "any"
    let (r, _) = a
        .request(
            ROOM,
            json!(3),
            "entity.patch",
            json!({"id": "e1", "data": {"z": 3, "y": null}}),
        )
        .await;
    let e1v3 = json!({"id": "e1", "kind": "node", "data": {"z": 3}, "version": 3});
    assert_eq!(r["result"]["entity"], e1v3, "{r}");
    assert_eq!(b.recv_type("event").await["entity"], e1v3);

    // delete
    let (r, _) = a
        .request(
            ROOM,
            json!(4),
            "entity.delete",
            json!({"id": "e1", "version": 3}),
        )
        .await;
    assert_eq!(r["ok"], true, "{r}");
    assert_eq!(r["result"]["id"], "e1");
    assert_eq!(r["result"]["version"], 3);
    let ev = b.recv_type("event").await;
    assert_eq!(ev["kind"], "entity.deleted");
    assert_eq!(ev["id"], "e1");
    assert_eq!(ev["version"], 3);
    assert_eq!(ev["seq"], r["result"]["seq"]);

    // gone
    for (op, args) in [
        ("entity.set", json!({"id": "e1", "data": 0})),
        ("entity.patch", json!({"id": "e1", "data": {}})),
        ("entity.delete", json!({"id": "e1"})),
        ("entity.set", json!({"id": "nope", "data": 0, "version": 1})),
    ] {
        let (r, _) = a.request(ROOM, json!(op), op, args).await;
        assert_eq!(r["error"]["code"], "entity_not_found", "{op}: {r}");
    }

    // ids are never reused; kind is optional and then absent
    let (r, _) = a
        .request(ROOM, json!(5), "entity.create", json!({"data": [1]}))
        .await;
    assert_eq!(
        r["result"]["entity"],
        json!({"id": "e2", "data": [1], "version": 1})
    );

    // refused requests made no events
    let rest = b.drain().await;
    assert_eq!(rest.len(), 1, "{rest:?}");
    assert_eq!(rest[0]["kind"], "entity.created");
    assert_eq!(rest[0]["entity"]["id"], "e2");
}

#[tokio::test]
async fn unknown_ops_and_bad_args_are_answered_with_their_nonce() {
    let s = TestServer::start().await;
    let ((mut a, _), (mut b, _)) = two(&s).await;

    let (r, before) = a.request(ROOM, json!("x"), "entity.fly", json!({})).await;
    assert!(before.is_empty());
    assert_eq!(r["ok"], false);
    assert_eq!(r["room"], ROOM);
    assert_eq!(r["error"]["code"], "unknown_op");
    assert!(r["error"]["message"]
        .as_str()
        .unwrap()
        .contains("entity.fly"));
    assert!(r.get("result").is_none());

    for (i, (op, args)) in [
        ("entity.set", json!({})), // missing id and data
        ("entity.create", json!({"data": 1, "colour": "red"})), // unknown field
        ("entity.patch", json!({"id": "e1", "data": 5})), // data not an object
        ("entity.delete", json!({"id": 5})), // wrong type
        ("lock.acquire", json!({"object": "o", "ttl_ms": -1})), // negative ttl
        ("lock.acquire", json!({"object": "o", "ttl_ms": 0})), // zero ttl
        ("lock.release", json!([])), // not an object
        ("channel.subscribe", json!({"channel": ""})), // empty channel
        ("channel.subscribe", json!({"channel": "x".repeat(65)})), // too long
        ("channel.unsubscribe", json!(null)), // null args
    ]
    .into_iter()
    .enumerate()
    {
        let (r, _) = a.request(ROOM, json!(i), op, args.clone()).await;
        assert_eq!(r["ok"], false, "{op} {args}: {r}");
        assert_eq!(r["error"]["code"], "invalid_args", "{op} {args}: {r}");
        assert_eq!(r["nonce"], i);
    }
    // Requests without args use {}.
    let (r, _) = a
        .send_and_response(
            json!({"type": "request", "room": ROOM, "nonce": "na", "op": "entity.create"}),
        )
        .await;
    assert_eq!(r["ok"], true, "{r}");
    assert_eq!(r["result"]["entity"]["data"], Value::Null);

    // Requests in a room the connection has not joined are answered too.
    let (r, _) = a
        .request("elsewhere", json!("nj"), "entity.create", json!({}))
        .await;
    assert_eq!(r["ok"], false);
    assert_eq!(r["room"], "elsewhere");
    assert_eq!(r["error"]["code"], "not_joined");

    // Only the one successful creation reached the other member.
    let rest = b.drain().await;
    assert_eq!(of_kind(&rest, "entity.created").len(), 1, "{rest:?}");
    assert_eq!(rest.len(), 1, "{rest:?}");
}

#[tokio::test]
async fn a_joining_member_gets_the_state_in_its_snapshot() {
    let s = TestServer::start().await;
    let summary = s
        .create_room(json!({
            "id": ROOM,
            "entities": [
                {"kind": "node", "data": {"x": 1}},
                {"data": "plain"},
                {"kind": "empty"},
            ],
        }))
        .await;
    assert_eq!(summary["id"], ROOM);

    // Initial entities are in the first member's snapshot, without events.
    let (mut a, ja) = s.join(ROOM, "ann").await;
    assert_eq!(ja["seq"], 1, "only ann's own presence.join was ordered");
    assert_eq!(
        ja["snapshot"],
        json!({
            "entities": [
                {"id": "e1", "kind": "node", "data": {"x": 1}, "version": 1},
                {"id": "e2", "data": "plain", "version": 1},
                {"id": "e3", "kind": "empty", "data": null, "version": 1},
            ],
            "locks": [],
        })
    );
    assert_eq!(ja["resumed"], false);
    assert_eq!(ja["channels"], json!(["main"]));
    assert!(!ja["resume_token"].as_str().unwrap().is_empty());
    assert_eq!(
        ja["members"],
        json!([{"session": ja["session"], "name": "ann", "platform": "browser"}])
    );

    // Changes made since are in a later member's snapshot.
    a.request(ROOM, json!(1), "entity.create", json!({"data": {"n": 4}}))
        .await;
    a.request(
        ROOM,
        json!(2),
        "entity.patch",
        json!({"id": "e1", "data": {"x": 2}}),
    )
    .await;
    a.request(ROOM, json!(3), "entity.delete", json!({"id": "e2"}))
        .await;
    let (lock, _) = a
        .request(ROOM, json!(4), "lock.acquire", json!({"object": "e4"}))
        .await;
    let (last, _) = a.publish(ROOM, "chat", json!("hi")).await;

    let (mut b, jb) = s
        .join_with(json!({"type": "join", "room": ROOM, "name": "bob", "platform": "xr"}))
        .await;
    assert_eq!(jb["type"], "joined", "{jb}");
    assert_eq!(
        jb["snapshot"]["entities"],
        json!([
            {"id": "e1", "kind": "node", "data": {"x": 2}, "version": 2},
            {"id": "e3", "kind": "empty", "data": null, "version": 1},
            {"id": "e4", "data": {"n": 4}, "version": 1},
        ])
    );
    assert_eq!(jb["snapshot"]["locks"], json!([lock["result"]["lock"]]));
    // The snapshot is the state at `seq`: everything up to bob's own presence.join.
    assert_eq!(jb["seq"].as_u64(), Some(last["seq"].as_u64().unwrap() + 1));
    let mut members = vec![
        json!({"session": ja["session"], "name": "ann", "platform": "browser"}),
        json!({"session": jb["session"], "name": "bob", "platform": "xr"}),
    ];
    members.sort_by_key(|m| m["session"].as_str().unwrap().to_owned());
    assert_eq!(jb["members"], Value::Array(members));
    // Nothing from before the join is replayed to bob.
    assert_eq!(b.drain().await, Vec::<Value>::new());
    let (ev, _) = a.recv_event("presence.join").await;
    assert_eq!(ev["seq"], jb["seq"]);
}
