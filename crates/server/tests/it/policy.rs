//! Delivery policies over a real WebSocket: holding, the aggregated flush,
//! what goes out at once, policy changes, resume, and refusals.

use crate::support::{Client, TestServer};
use serde_json::{json, Value};

const ROOM: &str = "quiet";

fn seqs(events: &[Value]) -> Vec<u64> {
    events.iter().map(|e| e["seq"].as_u64().unwrap()).collect()
}

/// Joins ann with `policy` and bob without one; both see each other joined.
async fn ann_with(s: &TestServer, policy: Value) -> (Client, Value, Client) {
    s.create_room(json!({"id": ROOM})).await;
    let (mut bob, _) = s.join(ROOM, "bob").await;
    let (ann, joined) = s
        .join_with(json!({"type": "join", "room": ROOM, "name": "ann", "policy": policy}))
        .await;
    assert_eq!(joined["type"], "joined", "{joined}");
    bob.recv_event("presence.join").await;
    (ann, joined, bob)
}

/// Bob publishes on `topic` and returns the message's seq.
async fn say(bob: &mut Client, topic: &str, extra: Value) -> u64 {
    let mut frame = json!({"type": "publish", "room": ROOM, "event": "chat",
        "data": {"text": topic}, "topic": topic});
    if let (Some(f), Some(x)) = (frame.as_object_mut(), extra.as_object()) {
        f.extend(x.clone());
    }
    bob.send(frame).await;
    let (ack, _) = bob.recv_until(|v| v["type"] == "ack").await;
    ack["seq"].as_u64().unwrap()
}

#[tokio::test]
async fn volume_holds_then_flushes_one_batch_in_seq_order() {
    let s = TestServer::start().await;
    let (mut ann, _, mut bob) = ann_with(&s, json!({"max_held": 3})).await;
    let s1 = say(&mut bob, "irc", json!({})).await;
    let s2 = say(&mut bob, "irc", json!({})).await;
    // Acked, hence ordered and routed: held, not sent.
    assert_eq!(ann.drain().await, Vec::<Value>::new());
    let s3 = say(&mut bob, "irc", json!({})).await;
    let batch = ann.recv_type("batch").await;
    assert_eq!(batch["room"], ROOM);
    let events = batch["events"].as_array().unwrap();
    assert_eq!(seqs(events), [s1, s2, s3]);
    for e in events {
        assert_eq!(e["type"], "event");
        assert_eq!(e["kind"], "message");
        assert!(e["ts"].as_u64().is_some());
    }
    assert_eq!(ann.drain().await, Vec::<Value>::new(), "nothing twice");
}

#[tokio::test]
async fn a_filter_match_goes_at_once_after_what_was_held() {
    let s = TestServer::start().await;
    let policy = json!({"max_held": 100, "filters": [
        {"id": "mine", "field": "topic", "op": {"equals": "xmpp"}}]});
    let (mut ann, _, mut bob) = ann_with(&s, policy).await;
    let held = say(&mut bob, "irc", json!({})).await;
    let now = say(&mut bob, "xmpp", json!({})).await;
    let batch = ann.recv_type("batch").await;
    assert_eq!(seqs(batch["events"].as_array().unwrap()), [held, now]);
    // Nothing held: a match goes out as a plain event.
    let alone = say(&mut bob, "xmpp", json!({})).await;
    let e = ann.recv_type("event").await;
    assert_eq!(e["seq"], alone);
    say(&mut bob, "irc", json!({})).await;
    assert_eq!(ann.drain().await, Vec::<Value>::new());
}

#[tokio::test]
async fn own_echo_and_replies_to_own_messages_go_at_once() {
    let s = TestServer::start().await;
    let (mut ann, _, mut bob) = ann_with(&s, json!({"max_held": 100})).await;
    // Ann's own message, echoed, comes back at once (before its ack).
    ann.send(json!({"type": "publish", "room": ROOM, "event": "chat",
        "data": {"q": "anyone?"}, "echo": true}))
        .await;
    let echo = ann.recv_type("event").await;
    let ack = ann.recv_type("ack").await;
    assert_eq!(echo["seq"], ack["seq"]);
    let question = ack["seq"].as_u64().unwrap();
    bob.recv_event("message").await;
    // A message for someone else is held; a reply to ann's message is not,
    // and the held one goes first.
    let other = say(&mut bob, "irc", json!({})).await;
    let answer = say(&mut bob, "irc", json!({"reply_to": question})).await;
    let batch = ann.recv_type("batch").await;
    assert_eq!(seqs(batch["events"].as_array().unwrap()), [other, answer]);
    assert_eq!(batch["events"][1]["reply_to"], question);
}

#[tokio::test]
async fn time_bound_flushes_without_anything_else_happening() {
    let s = TestServer::start().await;
    let (mut ann, _, mut bob) = ann_with(&s, json!({"max_delay_ms": 1000})).await;
    let before = std::time::Instant::now();
    let s1 = say(&mut bob, "irc", json!({})).await;
    let s2 = say(&mut bob, "irc", json!({})).await;
    assert_eq!(ann.drain().await, Vec::<Value>::new(), "held for up to 1 s");
    // Nothing else happens in the room: the node's timer flushes them.
    let batch = ann.recv_type("batch").await;
    let held = before.elapsed();
    assert_eq!(seqs(batch["events"].as_array().unwrap()), [s1, s2]);
    // Held for the bound: not sooner (less a millisecond clock's rounding).
    // That the timer fired at all is the batch's arrival; how late a busy
    // machine makes it is no behaviour (issue 44), and a timer that never
    // fired fails recv_type.
    assert!(
        held >= std::time::Duration::from_millis(995),
        "flushed after {held:?}, before its 1 s"
    );
}

#[tokio::test]
async fn without_aggregation_held_events_go_out_as_separate_frames() {
    let s = TestServer::start().await;
    let policy = json!({"max_held": 2, "aggregate": false});
    let (mut ann, _, mut bob) = ann_with(&s, policy).await;
    let s1 = say(&mut bob, "irc", json!({})).await;
    let s2 = say(&mut bob, "irc", json!({})).await;
    let a = ann.recv_type("event").await;
    let b = ann.recv_type("event").await;
    assert_eq!((a["seq"].as_u64(), b["seq"].as_u64()), (Some(s1), Some(s2)));
}

#[tokio::test]
async fn policy_changes_keep_the_rest_and_flush_what_becomes_wanted() {
    let s = TestServer::start().await;
    let (mut ann, _, mut bob) = ann_with(&s, json!({"max_held": 100})).await;
    let held = say(&mut bob, "irc", json!({})).await;
    // Adding a filter that the held message matches sends it before the response.
    let (resp, before) = ann
        .request(
            ROOM,
            json!(1),
            "policy.update",
            json!({"add": [
            {"id": "irc", "field": "topic", "op": {"equals": "irc"}}]}),
        )
        .await;
    assert_eq!(resp["ok"], true, "{resp}");
    assert_eq!(resp["result"]["policy"]["max_held"], 100, "kept: {resp}");
    assert_eq!(before.len(), 1, "{before:?}");
    assert_eq!(before[0]["seq"], held);
    // Switched off, the filter lets messages wait again.
    let (resp, _) = ann
        .request(ROOM, json!(2), "policy.update", json!({"disable": ["irc"]}))
        .await;
    assert_eq!(resp["result"]["policy"]["filters"][0]["enabled"], false);
    let again = say(&mut bob, "irc", json!({})).await;
    assert_eq!(ann.drain().await, Vec::<Value>::new());
    // A lower volume bound that is already reached flushes.
    let (resp, before) = ann
        .request(ROOM, json!(3), "policy.update", json!({"max_held": 1}))
        .await;
    assert_eq!(resp["ok"], true);
    assert_eq!(seqs(&before), [again]);
    // Cleared: everything at once.
    let (resp, _) = ann.request(ROOM, json!(4), "policy.clear", json!({})).await;
    assert_eq!(resp["result"]["policy"], Value::Null);
    let live = say(&mut bob, "irc", json!({})).await;
    assert_eq!(ann.recv_type("event").await["seq"], live);
}

#[tokio::test]
async fn a_resume_delivers_what_was_held_once_and_keeps_the_policy() {
    let s = TestServer::start().await;
    let (ann, joined, mut bob) = ann_with(&s, json!({"max_held": 100})).await;
    let last_seq = joined["seq"].as_u64().unwrap();
    let mut held = Vec::new();
    for _ in 0..3 {
        held.push(say(&mut bob, "irc", json!({})).await);
    }
    drop(ann);
    bob.recv_event("presence.leave").await;
    let missed = say(&mut bob, "irc", json!({})).await;
    let (mut ann, j) = s
        .join_with(json!({"type": "join", "room": ROOM, "name": "ann",
            "resume": {"token": joined["resume_token"], "last_seq": last_seq}}))
        .await;
    assert_eq!(j["resumed"], true, "{j}");
    let mut replay = Vec::new();
    for _ in 0..4 {
        replay.push(ann.recv_type("event").await);
    }
    held.push(missed);
    assert_eq!(seqs(&replay), held, "held and missed, once each, in order");
    assert_eq!(ann.drain().await, Vec::<Value>::new());
    // The session kept its policy.
    say(&mut bob, "irc", json!({})).await;
    assert_eq!(ann.drain().await, Vec::<Value>::new());
}

#[tokio::test]
async fn events_about_to_leave_the_history_are_flushed_first() {
    let s = TestServer::start().await;
    s.create_room(json!({"id": ROOM, "options": {"history_size": 4}}))
        .await;
    let (mut bob, _) = s.join(ROOM, "bob").await;
    let (mut ann, _) = s
        .join_with(json!({"type": "join", "room": ROOM, "name": "ann",
            "policy": {"max_held": 1000, "max_delay_ms": 300000}}))
        .await;
    bob.recv_event("presence.join").await;
    let mut sent = Vec::new();
    for _ in 0..3 {
        sent.push(say(&mut bob, "irc", json!({})).await);
    }
    assert_eq!(
        ann.drain().await,
        Vec::<Value>::new(),
        "held while the history keeps them"
    );
    sent.push(say(&mut bob, "irc", json!({})).await);
    // The history holds 4 events (seqs 3-6, the messages): the next event
    // would push the oldest held message out, so everything held went out.
    let mut got = Vec::new();
    for f in ann.drain().await {
        match f["type"].as_str() {
            Some("batch") => got.extend(seqs(f["events"].as_array().unwrap())),
            Some("event") => got.push(f["seq"].as_u64().unwrap()),
            _ => panic!("{f}"),
        }
    }
    assert_eq!(got, sent, "everything held, in order");
}

#[tokio::test]
async fn bad_policies_are_refused_and_change_nothing() {
    let s = TestServer::start().await;
    s.create_room(json!({"id": ROOM})).await;
    let (_c, e) = s
        .join_with(json!({"type": "join", "room": ROOM, "name": "x", "policy": {"filters": []}}))
        .await;
    assert_eq!(e["type"], "error", "{e}");
    assert_eq!(e["code"], "invalid_frame");
    assert!(
        e["message"].as_str().unwrap().contains("max_delay_ms"),
        "{e}"
    );
    let (_c, e) = s
        .join_with(json!({"type": "join", "room": ROOM, "name": "x", "policy": {"max_held": 0}}))
        .await;
    assert_eq!(e["code"], "invalid_frame", "{e}");

    let (mut ann, _) = s
        .join_with(json!({"type": "join", "room": ROOM, "name": "ann", "policy": {"max_held": 2}}))
        .await;
    let (r, _) = ann
        .request(ROOM, json!(1), "policy.update", json!({"enable": ["nope"]}))
        .await;
    assert_eq!(r["ok"], false);
    assert_eq!(r["error"]["code"], "invalid_args", "{r}");
    let (r, _) = ann
        .request(ROOM, json!(2), "policy.update", json!({"max_held": null}))
        .await;
    assert_eq!(r["error"]["code"], "invalid_args", "{r}");
    let (r, _) = ann
        .request(
            ROOM,
            json!(3),
            "policy.update",
            json!({"filters": [
            {"id": "p", "field": {"payload": "no-slash"}, "op": "exists"}]}),
        )
        .await;
    assert_eq!(r["error"]["code"], "invalid_args", "{r}");
    let (r, _) = ann
        .request(ROOM, json!(5), "policy.clear", json!({"all": true}))
        .await;
    assert_eq!(r["error"]["code"], "invalid_args", "{r}");
    // The policy is as it was.
    let (r, _) = ann
        .request(ROOM, json!(4), "policy.update", json!({}))
        .await;
    assert_eq!(r["result"]["policy"]["max_held"], 2, "{r}");
    ann.assert_alive().await;
}

/// RFC 6901 allows `~` only as `~0` or `~1`: a payload pointer with another
/// escape is refused in a join (`invalid_frame`) and in `policy.update`
/// (`invalid_args`); the escapes it allows are taken.
#[tokio::test]
async fn payload_pointers_with_bad_escapes_are_refused() {
    let s = TestServer::start().await;
    s.create_room(json!({"id": ROOM})).await;
    let filter = |pointer: &str| json!({"id": "p", "field": {"payload": pointer}, "op": "exists"});
    for bad in ["/a~2b", "/a~", "/~x"] {
        let (_c, e) = s
            .join_with(json!({"type": "join", "room": ROOM, "name": "x",
                "policy": {"filters": [filter(bad)], "max_held": 5}}))
            .await;
        assert_eq!(e["type"], "error", "{bad}: {e}");
        assert_eq!(e["code"], "invalid_frame", "{bad}: {e}");
        assert!(
            e["message"].as_str().unwrap().contains("JSON pointer"),
            "{e}"
        );
    }
    let (mut ann, joined) = s
        .join_with(json!({"type": "join", "room": ROOM, "name": "ann",
            "policy": {"filters": [filter("/a~0b~1c")], "max_held": 5}}))
        .await;
    assert_eq!(joined["type"], "joined", "{joined}");
    for (nonce, bad) in ["/a~2b", "/a~", "/~x"].into_iter().enumerate() {
        for args in [
            json!({"add": [filter(bad)]}),
            json!({"filters": [filter(bad)], "max_held": 7}),
        ] {
            let (r, _) = ann.request(ROOM, json!(nonce), "policy.update", args).await;
            assert_eq!(r["ok"], false, "{bad}: {r}");
            assert_eq!(r["error"]["code"], "invalid_args", "{bad}: {r}");
            assert!(
                r["error"]["message"]
                    .as_str()
                    .unwrap()
                    .contains("JSON pointer"),
                "{r}"
            );
        }
    }
    // The policy is as it was.
    let (r, _) = ann
        .request(ROOM, json!(9), "policy.update", json!({}))
        .await;
    assert_eq!(
        r["result"]["policy"]["filters"][0]["field"]["payload"], "/a~0b~1c",
        "{r}"
    );
    assert_eq!(r["result"]["policy"]["max_held"], 5, "{r}");
    ann.assert_alive().await;
}

#[tokio::test]
async fn holding_never_makes_a_resume_fall_back_to_a_resync() {
    let s = TestServer::start().await;
    s.create_room(json!({"id": ROOM, "options": {"history_size": 4}}))
        .await;
    let (mut bob, _) = s.join(ROOM, "bob").await;
    let (mut ann, joined) = s
        .join_with(json!({"type": "join", "room": ROOM, "name": "ann",
            "policy": {"max_held": 1000}}))
        .await;
    bob.recv_event("presence.join").await;
    // Messages on a channel ann does not hear: not for her, but her resume
    // from her last seq needs them in the history.
    let side = json!({"channel": "side"});
    for _ in 0..2 {
        say(&mut bob, "irc", side.clone()).await;
    }
    let held = say(&mut bob, "irc", json!({})).await;
    assert_eq!(ann.drain().await, Vec::<Value>::new());
    // The history (4 events) now starts right after her last seq: before
    // the next event pushes it further, what she holds goes out.
    say(&mut bob, "irc", side).await;
    let got = ann.drain().await;
    assert_eq!(seqs(&got), [held], "{got:?}");
    drop(ann);
    bob.recv_event("presence.leave").await;
    let (_ann, j) = s
        .join_with(json!({"type": "join", "room": ROOM, "name": "ann",
            "resume": {"token": joined["resume_token"], "last_seq": held}}))
        .await;
    assert_eq!(j["type"], "joined", "a resume, not a resync: {j}");
    assert_eq!(j["resumed"], true);
}

/// The server API's messages are routed under members' policies like any
/// other: held, and flushed with a match.
#[tokio::test]
async fn server_messages_are_held_and_matched_as_any_other() {
    let s = TestServer::start().await;
    let policy = json!({"max_held": 100, "filters": [
        {"id": "urgent", "field": "topic", "op": {"equals": "alert"}}]});
    let (mut ann, _, mut bob) = ann_with(&s, policy).await;
    let publish = |topic: &str| json!({"event": "news", "topic": topic});
    let (status, held) = s
        .post(&format!("/v1/rooms/{ROOM}/publish"), &publish("digest"))
        .await;
    assert_eq!(status, 200, "{held}");
    bob.recv_event("message").await;
    assert_eq!(ann.drain().await, Vec::<Value>::new(), "held by the policy");
    let (_, now) = s
        .post(&format!("/v1/rooms/{ROOM}/publish"), &publish("alert"))
        .await;
    let batch = ann.recv_type("batch").await;
    let events = batch["events"].as_array().unwrap();
    assert_eq!(
        seqs(events),
        [held["seq"].as_u64().unwrap(), now["seq"].as_u64().unwrap()]
    );
    assert!(events.iter().all(|e| e["from"] == "@server"), "{batch}");
}
