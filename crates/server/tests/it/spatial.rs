//! Spatial rooms over the wire: moves, areas of interest and proximity
//! decided by the server (embedded mode, and with every node in cluster mode
//! under TEST_PLAZA_CLUSTER).

use crate::support::{Client, TestServer};
use serde_json::{json, Value};

const ROOM: &str = "plaza";

/// A plane so large that members, who appear at scattered points, start far
/// apart; the tests then place them.
const SIDE: f64 = 100_000.0;

async fn spatial_room(s: &TestServer) {
    s.create_room(json!({
        "id": ROOM,
        "options": {"space": {"min_dwell_ms": 0, "tick_ms": 10, "width": SIDE, "height": SIDE}}
    }))
    .await;
}

async fn request(c: &mut Client, nonce: u64, op: &str, args: Value) -> (Value, Vec<Value>) {
    c.request(ROOM, json!(nonce), op, args).await
}

/// Waits for the next `kind` event and returns it; the frames before it too.
async fn event(c: &mut Client, kind: &str) -> (Value, Vec<Value>) {
    c.recv_event(kind).await
}

/// The first `kind` event among `frames` (received before a response), or the next one.
async fn event_in(c: &mut Client, frames: &[Value], kind: &str) -> Value {
    match frames
        .iter()
        .find(|f| f["type"] == "event" && f["kind"] == kind)
    {
        Some(f) => f.clone(),
        None => event(c, kind).await.0,
    }
}

fn kinds(frames: &[Value]) -> Vec<String> {
    frames
        .iter()
        .filter(|f| f["type"] == "event")
        .map(|f| f["kind"].as_str().unwrap().to_owned())
        .collect()
}

#[tokio::test]
async fn the_server_decides_who_sees_whom_and_who_calls() {
    let s = TestServer::start().await;
    spatial_room(&s).await;
    let (mut ann, joined) = s.join(ROOM, "ann").await;
    let ann_id = joined["session"].as_str().unwrap().to_owned();
    let space = &joined["space"];
    assert_eq!(space["proximity_radius"], 150.0);
    let start = &space["movements"][&ann_id]["to"];
    assert!(
        start[0].as_f64().unwrap() <= SIDE && start[1].as_f64().unwrap() <= SIDE,
        "a member starts somewhere in the plane: {space}"
    );
    // ann goes to a corner, out of sight of the middle.
    let (r, _) = request(&mut ann, 1, "space.jump", json!({"to": [100, 100]})).await;
    assert_eq!(r["ok"], true, "{r}");
    assert_eq!(r["result"]["movement"]["to"], json!([100.0, 100.0]));
    assert_eq!(r["result"]["clamped"], false);

    let (mut bob, joined_b) = s.join(ROOM, "bob").await;
    let bob_id = joined_b["session"].as_str().unwrap().to_owned();
    let (r, _) = request(&mut bob, 1, "space.jump", json!({"to": [1000, 1000]})).await;
    assert_eq!(r["ok"], true, "{r}");
    assert_eq!(
        joined_b["space"]["movements"][&ann_id]["to"],
        json!([100.0, 100.0]),
        "a joiner gets every movement"
    );
    let (mut carol, joined_c) = s.join(ROOM, "carol").await;
    let carol_id = joined_c["space"]["movements"]
        .as_object()
        .unwrap()
        .keys()
        .find(|k| **k != ann_id && **k != bob_id)
        .unwrap()
        .clone();
    assert!(joined_c["space"]["pairs"].as_array().unwrap().is_empty());
    // carol steps next to bob: one pair, one initiator, the same frame to both.
    let (r, before) = request(&mut carol, 1, "space.jump", json!({"to": [1000, 1010]})).await;
    assert_eq!(r["ok"], true, "{r}");
    let at_carol = event_in(&mut carol, &before, "proximity.enter").await;
    let (at_bob, _) = event(&mut bob, "proximity.enter").await;
    assert_eq!(at_bob, at_carol, "the same frame for both");
    let initiator = bob_id.clone().min(carol_id.clone());
    assert_eq!(at_bob["initiator"], initiator.as_str());
    assert_eq!(at_bob["a"], initiator.as_str());
    let pair = at_bob["pair"].clone();

    // ann walks to the middle: bob and carol do not hear of the move (out of
    // their area of interest when it starts); the server then sees her come
    // near and tells each pair.
    let (r, _) = request(
        &mut ann,
        2,
        "space.move",
        json!({"to": [990, 1000], "speed": 5000}),
    )
    .await;
    assert_eq!(r["ok"], true, "{r}");
    let (enter, before) = event(&mut bob, "proximity.enter").await;
    assert!(
        !kinds(&before).contains(&"space.moved".to_owned()),
        "bob was out of sight when ann started: {before:?}"
    );
    assert!(
        kinds(&before).contains(&"interest.enter".to_owned()),
        "{before:?}"
    );
    let ann_bob = [
        ann_id.clone().min(bob_id.clone()),
        ann_id.clone().max(bob_id.clone()),
    ];
    assert_eq!(
        (enter["a"].as_str().unwrap(), enter["b"].as_str().unwrap()),
        (ann_bob[0].as_str(), ann_bob[1].as_str())
    );

    // carol is in a call with ann too (that pair may start a tick after
    // ann and bob's: ann passes bob first) before she leaves.
    let (with_ann, _) = event(&mut carol, "proximity.enter").await;
    assert!(
        with_ann["a"] == ann_id.as_str() || with_ann["b"] == ann_id.as_str(),
        "{with_ann}"
    );

    // carol jumps to the far corner: both her pairs end, told to each side.
    let (r, before) = request(&mut carol, 3, "space.jump", json!({"to": [5000, 5000]})).await;
    assert_eq!(r["ok"], true, "{r}");
    let mut ended: Vec<Value> = before
        .iter()
        .filter(|f| f["type"] == "event" && f["kind"] == "proximity.leave")
        .map(|f| f["pair"].clone())
        .collect();
    while ended.len() < 2 {
        let (left, _) = event(&mut carol, "proximity.leave").await;
        ended.push(left["pair"].clone());
    }
    assert!(ended.contains(&pair), "{ended:?}");
    let (left, _) = event(&mut bob, "proximity.leave").await;
    assert_eq!(left["pair"], pair);

    // bob moves: ann (near) hears of it, carol (far) does not.
    let (r, _) = request(
        &mut bob,
        4,
        "space.move",
        json!({"to": [1000, 1010], "speed": 10}),
    )
    .await;
    assert_eq!(r["ok"], true, "{r}");
    let (moved, _) = event(&mut ann, "space.moved").await;
    assert_eq!(moved["session"], bob_id.as_str());
    assert_eq!(moved["movement"], r["result"]["movement"]);
    bob.publish(ROOM, "barrier", json!(1)).await;
    let (_, before) = carol
        .recv_until(|v| v["type"] == "event" && v["kind"] == "message")
        .await;
    assert!(
        !kinds(&before).contains(&"space.moved".to_owned()),
        "carol is out of sight: {before:?}"
    );
}

#[tokio::test]
async fn bad_moves_get_clear_errors_and_targets_are_clamped() {
    let s = TestServer::start().await;
    spatial_room(&s).await;
    s.create_room(json!({"id": "flat"})).await;
    let (mut ann, _) = s.join(ROOM, "ann").await;
    for (nonce, args) in [
        (1, json!({"to": [1, 2], "speed": 0})),
        (2, json!({"to": [1, 2], "speed": -5})),
        (3, json!({"to": [1], "speed": 5})),
        (4, json!({"to": "here", "speed": 5})),
        (5, json!({"to": [1, 2]})),
    ] {
        let (r, _) = request(&mut ann, nonce, "space.move", args.clone()).await;
        assert_eq!(r["ok"], false, "{args}: {r}");
        assert_eq!(r["error"]["code"], "invalid_args", "{args}: {r}");
    }
    let (r, _) = request(&mut ann, 6, "space.jump", json!({"to": [-5, 999_999]})).await;
    assert_eq!(r["result"]["clamped"], true, "{r}");
    assert_eq!(r["result"]["movement"]["to"], json!([0.0, SIDE]));
    // A room without a space.
    let (mut bob, _) = s.join("flat", "bob").await;
    let (r, _) = bob
        .request(
            "flat",
            json!(1),
            "space.move",
            json!({"to": [1, 2], "speed": 5}),
        )
        .await;
    assert_eq!(r["error"]["code"], "invalid_args");
    assert!(
        r["error"]["message"].as_str().unwrap().contains("no space"),
        "{r}"
    );
    // Bad space options are refused when the room is created.
    let (status, body) = s
        .post(
            "/v1/rooms",
            &json!({"id": "bad", "options": {"space": {"hysteresis": 0.5}}}),
        )
        .await;
    assert_eq!(status, 400, "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("space.hysteresis"),
        "{body}"
    );
    let (status, body) = s
        .post(
            "/v1/rooms",
            &json!({"id": "bad", "options": {"space": {"radius": 5}}}),
        )
        .await;
    assert_eq!(status, 400, "{body}");
    // The room summary shows the space.
    let (_, summary) = s.get(&format!("/v1/rooms/{ROOM}")).await;
    assert_eq!(summary["space"]["tick_ms"], 10, "{summary}");
}

#[tokio::test]
async fn a_member_whose_connection_drops_ends_its_pairs_and_a_resume_puts_it_back() {
    let s = TestServer::start().await;
    spatial_room(&s).await;
    let (mut ann, joined) = s.join(ROOM, "ann").await;
    let token = joined["resume_token"].as_str().unwrap().to_owned();
    let seq = joined["seq"].as_u64().unwrap();
    let (r, _) = request(&mut ann, 1, "space.jump", json!({"to": [500, 500]})).await;
    assert_eq!(r["ok"], true);
    let (mut bob, _) = s.join(ROOM, "bob").await;
    let (r, before) = request(&mut bob, 1, "space.jump", json!({"to": [520, 500]})).await;
    assert_eq!(r["ok"], true);
    let enter = event_in(&mut bob, &before, "proximity.enter").await;
    drop(ann);
    let (left, _) = event(&mut bob, "proximity.leave").await;
    assert_eq!(left["pair"], enter["pair"]);
    // The resume places ann where she stood: the pair starts again.
    let mut again = s.connect().await;
    again
        .send(json!({"type": "join", "room": ROOM, "name": "ann", "resume": {"token": token, "last_seq": seq}}))
        .await;
    let joined = again.recv_type("joined").await;
    let me = joined["session"].as_str().unwrap();
    assert_eq!(
        joined["space"]["movements"][me]["to"],
        json!([500.0, 500.0]),
        "{joined}"
    );
    let (enter_again, _) = event(&mut bob, "proximity.enter").await;
    assert_ne!(enter_again["pair"], enter["pair"], "a new pair id");
}

#[tokio::test]
async fn direct_messages_can_be_limited_to_pairs_in_proximity() {
    let s = TestServer::start().await;
    s.create_room(json!({
        "id": ROOM,
        "options": {"space": {"min_dwell_ms": 0, "direct_in_proximity_only": true, "width": SIDE, "height": SIDE}}
    }))
    .await;
    let (mut ann, _) = s.join(ROOM, "ann").await;
    let (r, _) = request(&mut ann, 1, "space.jump", json!({"to": [100, 100]})).await;
    assert_eq!(r["ok"], true);
    let (mut bob, joined) = s.join(ROOM, "bob").await;
    let bob_id = joined["session"].as_str().unwrap().to_owned();
    assert_eq!(joined["space"]["direct_in_proximity_only"], true);
    let (r, _) = request(&mut bob, 1, "space.jump", json!({"to": [1000, 1000]})).await;
    assert_eq!(r["ok"], true);
    // A stranger cannot ring.
    ann.send(json!({"type": "direct", "room": ROOM, "to": bob_id, "event": "rtc.offer", "data": {"sdp": "x"}}))
        .await;
    let (e, _) = ann.recv_until(|v| v["type"] == "error").await;
    assert_eq!(e["code"], "not_in_proximity", "{e}");
    assert_eq!(e["ref"], json!({"frame": "direct", "room": ROOM}));
    // In proximity, the offer passes.
    let (r, before) = request(&mut ann, 2, "space.jump", json!({"to": [1000, 1010]})).await;
    assert_eq!(r["ok"], true);
    let enter = event_in(&mut ann, &before, "proximity.enter").await;
    assert!(
        enter["a"] == bob_id.as_str() || enter["b"] == bob_id.as_str(),
        "{enter}"
    );
    ann.send(json!({"type": "direct", "room": ROOM, "to": bob_id, "event": "rtc.offer", "data": {"sdp": "x"}}))
        .await;
    let (offer, _) = bob.recv_until(|v| v["type"] == "direct").await;
    assert_eq!(offer["event"], "rtc.offer");
}

/// Each bound of `options.space` (docs/protocol.md, "Settings and their
/// bounds"): one value past it refused with 400 `invalid_request` naming the
/// field and its limits, the edge itself accepted.
#[tokio::test]
async fn every_space_setting_is_bounded_and_its_edges_are_accepted() {
    let s = TestServer::start().await;
    let refused: Vec<(Value, &str)> = vec![
        (
            json!({"width": 1e308, "height": 1e308, "aoi_radius": 1e308}),
            "space.width must be a number greater than 0 and at most 1e9",
        ),
        (json!({"width": 0}), "space.width"),
        (
            json!({"height": 1.000001e9}),
            "space.height must be a number greater than 0 and at most 1e9",
        ),
        (json!({"proximity_radius": 0}), "space.proximity_radius"),
        (json!({"proximity_radius": -1}), "space.proximity_radius"),
        (
            json!({"aoi_radius": 2e9}),
            "space.aoi_radius must be a number greater than 0 and at most 1e9",
        ),
        (
            json!({"hysteresis": 0.99}),
            "space.hysteresis must be from 1 to 4",
        ),
        (
            json!({"hysteresis": 4.01, "aoi_radius": 1000}),
            "space.hysteresis must be from 1 to 4",
        ),
        (
            json!({"aoi_radius": 179}),
            "must be at least proximity_radius × hysteresis",
        ),
        (json!({"width": 1e9, "height": 1e9}), "cells"),
        (
            json!({"tick_ms": 9}),
            "space.tick_ms must be an integer from 10 to 10000",
        ),
        (
            json!({"tick_ms": 10001}),
            "space.tick_ms must be an integer from 10 to 10000",
        ),
        (
            json!({"tick_ms": 50.5}),
            "space.tick_ms must be an integer from 10 to 10000, not 50.5",
        ),
        (
            json!({"min_dwell_ms": 600001}),
            "space.min_dwell_ms must be an integer from 0 to 600000",
        ),
        (
            json!({"min_dwell_ms": -1}),
            "space.min_dwell_ms must be an integer from 0 to 600000, not -1",
        ),
    ];
    for (space, names) in refused {
        let (status, v) = s
            .post(
                "/v1/rooms",
                &json!({"id": "bad", "options": {"space": space}}),
            )
            .await;
        assert_eq!(status, 400, "{space}: {v}");
        assert_eq!(v["error"]["code"], "invalid_request", "{space}: {v}");
        let message = v["error"]["message"].as_str().unwrap();
        assert!(message.contains(names), "{space}: {message}");
    }
    let (status, v) = s
        .post(
            "/v1/rooms",
            &json!({"id": "bad", "options": {"max_members": 2001, "space": {}}}),
        )
        .await;
    assert_eq!(status, 400, "{v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("options.max_members must be from 1 to 2000"),
        "{v}"
    );
    assert_eq!(
        s.get("/v1/rooms").await.1,
        json!({"rooms": []}),
        "nothing was created"
    );

    let accepted = [
        json!({"width": 1e9, "height": 1e9, "proximity_radius": 1e5, "aoi_radius": 1e5, "hysteresis": 1}),
        json!({"width": 1e7, "height": 1e7, "aoi_radius": 1000, "hysteresis": 1}),
        json!({"hysteresis": 4, "aoi_radius": 600, "tick_ms": 10, "min_dwell_ms": 0}),
        json!({"tick_ms": 10000, "min_dwell_ms": 600000}),
    ];
    for (i, space) in accepted.into_iter().enumerate() {
        let (status, v) = s
            .post(
                "/v1/rooms",
                &json!({"id": format!("ok{i}"), "options": {"max_members": 2000, "space": space}}),
            )
            .await;
        assert_eq!(status, 201, "{space}: {v}");
    }
    // A spatial room's default member bound is 2000, not the node's 10000.
    let (_, room) = s.get("/v1/rooms/ok3").await;
    assert_eq!(room["max_members"], 2000, "{room}");
}

/// `speed` is required, greater than 0 and at most the plane's diagonal per
/// tick; `joined.space` has exactly the documented fields.
#[tokio::test]
async fn a_move_faster_than_the_plane_per_tick_is_refused() {
    let s = TestServer::start().await;
    s.create_room(json!({
        "id": ROOM,
        "options": {"space": {"width": 300, "height": 400, "tick_ms": 100,
            "proximity_radius": 10, "aoi_radius": 20}}
    }))
    .await;
    let (mut ann, joined) = s.join(ROOM, "ann").await;
    let mut fields: Vec<&str> = joined["space"]
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    fields.sort_unstable();
    assert_eq!(
        fields,
        [
            "aoi_radius",
            "direct_in_proximity_only",
            "height",
            "hysteresis",
            "min_dwell_ms",
            "movements",
            "pairs",
            "proximity_radius",
            "tick_ms",
            "width"
        ]
    );
    // The diagonal is 500: 5000 units/s at most.
    for (nonce, speed) in [
        (1, json!(5000.001)),
        (2, json!(0)),
        (3, json!(-3)),
        (4, Value::Null),
    ] {
        let (r, _) = request(
            &mut ann,
            nonce,
            "space.move",
            json!({"to": [1, 1], "speed": speed}),
        )
        .await;
        assert_eq!(r["error"]["code"], "invalid_args", "{speed}: {r}");
    }
    let (r, _) = request(&mut ann, 5, "space.move", json!({"to": [1, 1]})).await;
    assert_eq!(r["error"]["code"], "invalid_args", "speed is required: {r}");
    let (r, _) = request(
        &mut ann,
        6,
        "space.move",
        json!({"to": [1, 1], "speed": 5000}),
    )
    .await;
    assert_eq!(r["ok"], true, "the edge is allowed: {r}");
    let (r, _) = request(&mut ann, 7, "space.jump", json!({"to": [10, 20]})).await;
    assert_eq!(
        r["result"]["movement"],
        json!({"from": [10.0, 20.0], "to": [10.0, 20.0], "t0": r["result"]["movement"]["t0"], "speed": 0.0}),
        "a jump's movement starts and ends at its target: {r}"
    );
}
