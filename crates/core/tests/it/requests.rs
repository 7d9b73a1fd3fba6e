//! Entity and channel requests.

use crate::common::*;
use plaza_core::RoomConfig;
use plaza_protocol::client::Op;
use plaza_protocol::ErrorCode;
use serde_json::{json, Value};

fn set(id: &str, data: Value, version: Option<u64>) -> Op {
    Op::EntitySet {
        id: id.into(),
        data,
        version,
    }
}

fn patch(id: &str, data: Value, version: Option<u64>) -> Op {
    let Value::Object(map) = data else {
        panic!("patch data is an object")
    };
    Op::EntityPatch {
        id: id.into(),
        data: map,
        version,
    }
}

fn delete(id: &str, version: Option<u64>) -> Op {
    Op::EntityDelete {
        id: id.into(),
        version,
    }
}

fn two() -> plaza_core::Room<u32> {
    let mut r = room();
    join(&mut r, 1, 0);
    join(&mut r, 2, 0);
    r
}

#[test]
fn create_assigns_ids_and_version_one() {
    let mut r = two();
    let out = ok(
        &mut r,
        1,
        Op::EntityCreate {
            kind: Some("node".into()),
            data: json!({"x": 1}),
        },
        5,
    );
    assert_eq!(
        out.result,
        json!({"entity": {"id": "e1", "kind": "node", "data": {"x": 1}, "version": 1}, "seq": 3})
    );
    assert_eq!(out.events.len(), 1);
    assert_eq!(
        frame(&out.events[0]),
        json!({"type": "event", "room": "r", "seq": 3, "ts": 5, "from": "s1",
               "kind": "entity.created",
               "entity": {"id": "e1", "kind": "node", "data": {"x": 1}, "version": 1}})
    );
    let out = ok(&mut r, 2, create(json!(null)), 6);
    assert_eq!(out.result["entity"]["id"], "e2");
    assert!(out.result["entity"].get("kind").is_none());
    assert_eq!(r.entities().len(), 2);
    assert_eq!(r.entities().get("e2").unwrap().data, Value::Null);
}

#[test]
fn set_checks_the_version_when_given() {
    let mut r = two();
    ok(&mut r, 1, create(json!({"a": 1})), 1); // 3
    assert_eq!(
        err(&mut r, 2, set("e1", json!(2), Some(2)), 2),
        ErrorCode::VersionConflict
    );
    assert_eq!(
        err(&mut r, 2, set("e1", json!(2), Some(0)), 2),
        ErrorCode::VersionConflict
    );
    assert_eq!(r.seq(), 3);
    assert_eq!(r.entities().get("e1").unwrap().data, json!({"a": 1}));
    let out = ok(&mut r, 2, set("e1", json!({"b": 2}), Some(1)), 3);
    assert_eq!(
        out.result,
        json!({"entity": {"id": "e1", "data": {"b": 2}, "version": 2}, "seq": 4})
    );
    assert_eq!(kind(&out.events[0]), "entity.updated");
    assert_eq!(frame(&out.events[0])["entity"]["version"], 2);
    assert_eq!(recipients(&r, &out.events[0]), sessions(&[1]));
    // no version: last writer wins
    let out = ok(&mut r, 1, set("e1", json!([1, 2]), None), 4);
    assert_eq!(out.result["entity"]["version"], 3);
    assert_eq!(r.entities().get("e1").unwrap().data, json!([1, 2]));
    assert_eq!(r.entities().get("e1").unwrap().version, 3);
}

#[test]
fn patch_merges_top_level_fields() {
    let mut r = two();
    ok(&mut r, 1, create(json!({"a": 1, "b": {"deep": true}})), 1);
    let out = ok(
        &mut r,
        2,
        patch("e1", json!({"a": null, "b": {"new": 1}, "c": "x"}), Some(1)),
        2,
    );
    assert_eq!(
        out.result["entity"]["data"],
        json!({"b": {"new": 1}, "c": "x"})
    );
    assert_eq!(out.result["entity"]["version"], 2);
    assert_eq!(frame(&out.events[0])["kind"], "entity.updated");
    assert_eq!(
        err(&mut r, 2, patch("e1", json!({"z": 1}), Some(1)), 3),
        ErrorCode::VersionConflict
    );
    // a non-object entity becomes an object
    ok(&mut r, 1, create(json!(5)), 4);
    let out = ok(&mut r, 1, patch("e2", json!({"k": 1}), None), 5);
    assert_eq!(out.result["entity"]["data"], json!({"k": 1}));
    // an empty patch still counts as a change
    let out = ok(&mut r, 1, patch("e2", json!({}), Some(2)), 6);
    assert_eq!(out.result["entity"]["version"], 3);
    assert_eq!(out.result["entity"]["data"], json!({"k": 1}));
}

#[test]
fn delete_checks_the_version_and_ids_are_not_reused() {
    let mut r = two();
    ok(&mut r, 1, create(json!({})), 1); // e1, 3
    ok(&mut r, 1, set("e1", json!(1), None), 1); // v2, 4
    assert_eq!(
        err(&mut r, 2, delete("e1", Some(1)), 2),
        ErrorCode::VersionConflict
    );
    assert!(r.entities().get("e1").is_some());
    let out = ok(&mut r, 2, delete("e1", Some(2)), 3);
    assert_eq!(out.result, json!({"id": "e1", "version": 2, "seq": 5}));
    assert_eq!(
        frame(&out.events[0]),
        json!({"type": "event", "room": "r", "seq": 5, "ts": 3, "from": "s2",
               "kind": "entity.deleted", "id": "e1", "version": 2})
    );
    assert!(r.entities().is_empty());
    for op in [
        set("e1", json!(1), None),
        patch("e1", json!({}), None),
        delete("e1", None),
        delete("e1", Some(2)),
    ] {
        assert_eq!(err(&mut r, 1, op, 4), ErrorCode::EntityNotFound);
    }
    assert_eq!(r.seq(), 5);
    let out = ok(&mut r, 1, create(json!({})), 5);
    assert_eq!(out.result["entity"]["id"], "e2");
}

#[test]
fn unknown_entities_are_not_found() {
    let mut r = two();
    r.seed_entity(None, json!(1));
    assert_eq!(
        err(&mut r, 1, set("e2", json!(1), None), 1),
        ErrorCode::EntityNotFound
    );
    assert_eq!(
        err(&mut r, 1, patch("nope", json!({}), Some(1)), 1),
        ErrorCode::EntityNotFound
    );
    // seeded entities can be changed like any other
    let out = ok(&mut r, 1, set("e1", json!(2), Some(1)), 1);
    assert_eq!(out.result["entity"]["version"], 2);
}

#[test]
fn locks_guard_entity_changes_against_other_sessions() {
    let mut r = two();
    ok(&mut r, 1, create(json!({"n": 0})), 1); // e1
    ok(&mut r, 1, acquire("e1", Some(1_000)), 1);
    for op in [
        set("e1", json!(1), None),
        patch("e1", json!({"n": 1}), None),
        delete("e1", None),
    ] {
        assert_eq!(err(&mut r, 2, op, 2), ErrorCode::LockHeld);
    }
    let e = r.entities().get("e1").unwrap();
    assert_eq!((e.version, &e.data), (1, &json!({"n": 0})));
    // the holder may change it
    ok(&mut r, 1, set("e1", json!({"n": 1}), Some(1)), 3);
    ok(&mut r, 1, patch("e1", json!({"m": 2}), Some(2)), 3);
    assert_eq!(r.entities().get("e1").unwrap().version, 3);
    // creating other entities and touching unlocked ones is not affected
    ok(&mut r, 2, create(json!({})), 3); // e2
    ok(&mut r, 2, set("e2", json!(1), None), 3);
    // once the lease ends (even before tick) the others may write again
    assert_eq!(
        err(&mut r, 2, set("e1", json!(9), None), 1_000),
        ErrorCode::LockHeld
    );
    ok(&mut r, 2, set("e1", json!(9), None), 1_001);
    // a release frees it too
    ok(&mut r, 1, acquire("e1", Some(1_000)), 1_002);
    assert_eq!(
        err(&mut r, 2, delete("e1", None), 1_003),
        ErrorCode::LockHeld
    );
    ok(&mut r, 1, release("e1"), 1_004);
    ok(&mut r, 2, delete("e1", None), 1_005);
    assert!(r.entities().get("e1").is_none());
}

#[test]
fn a_disconnected_holder_no_longer_blocks_writes() {
    let mut r = two();
    ok(&mut r, 1, create(json!({})), 1);
    ok(&mut r, 1, acquire("e1", Some(60_000)), 1);
    assert_eq!(
        err(&mut r, 2, set("e1", json!(1), None), 2),
        ErrorCode::LockHeld
    );
    r.disconnect(&sid(1), 3);
    ok(&mut r, 2, set("e1", json!(1), None), 4);
}

#[test]
fn requests_need_a_connected_member() {
    let mut r = two();
    assert_eq!(err(&mut r, 9, create(json!({})), 1), ErrorCode::NotJoined);
    r.disconnect(&sid(2), 1);
    assert_eq!(err(&mut r, 2, create(json!({})), 2), ErrorCode::NotJoined);
    assert_eq!(err(&mut r, 2, subscribe("x"), 2), ErrorCode::NotJoined);
    assert_eq!(err(&mut r, 2, unsubscribe("main"), 2), ErrorCode::NotJoined);
    assert_eq!(err(&mut r, 2, acquire("o", None), 2), ErrorCode::NotJoined);
    assert!(r.entities().is_empty());
    assert_eq!(r.member("s2").unwrap().channels, ["main"]);
}

#[test]
fn channel_names_are_validated() {
    let mut r = two();
    assert_eq!(err(&mut r, 1, subscribe(""), 1), ErrorCode::InvalidArgs);
    let long = "c".repeat(65);
    assert_eq!(err(&mut r, 1, subscribe(&long), 1), ErrorCode::InvalidArgs);
    let max = "c".repeat(64);
    let out = ok(&mut r, 1, subscribe(&max), 1);
    assert_eq!(out.result, json!({"channels": ["main", max]}));
    assert!(out.events.is_empty());
}

#[test]
fn subscriptions_are_limited() {
    let mut r = room_with(RoomConfig {
        max_channels: 3,
        ..RoomConfig::default()
    });
    join(&mut r, 1, 0);
    ok(&mut r, 1, subscribe("a"), 1);
    ok(&mut r, 1, subscribe("b"), 1);
    assert_eq!(err(&mut r, 1, subscribe("c"), 1), ErrorCode::InvalidArgs);
    // already subscribed: fine even at the limit
    ok(&mut r, 1, subscribe("a"), 1);
    assert_eq!(r.member("s1").unwrap().channels, ["main", "a", "b"]);
    ok(&mut r, 1, unsubscribe("main"), 1);
    let out = ok(&mut r, 1, subscribe("c"), 1);
    assert_eq!(out.result, json!({"channels": ["a", "b", "c"]}));
}
