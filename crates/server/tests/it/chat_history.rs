//! History on join over a real WebSocket: the last messages of a channel or
//! those since a seq arrive in `joined`, exactly as they were sent live.

use crate::support::{Client, TestServer};
use serde_json::{json, Value};

const ROOM: &str = "chat";

/// Bob publishes `text` on `channel` (with `topic`) and returns the ack's seq
/// and the event frame a live subscriber received for it.
async fn say(bob: &mut Client, watcher: &mut Client, channel: &str, text: &str) -> (u64, Value) {
    bob.send(
        json!({"type": "publish", "room": ROOM, "channel": channel, "event": "chat",
        "data": {"text": text}, "topic": "irc"}),
    )
    .await;
    let (ack, _) = bob.recv_until(|v| v["type"] == "ack").await;
    let seq = ack["seq"].as_u64().unwrap();
    let (live, _) = watcher.recv_until(|v| v["seq"] == seq).await;
    (seq, live)
}

fn history_of(joined: &Value) -> (Vec<Value>, bool) {
    let h = &joined["history"];
    (
        h["events"].as_array().expect("history.events").clone(),
        h["complete"].as_bool().expect("history.complete"),
    )
}

#[tokio::test]
async fn a_join_gets_the_last_messages_of_its_channel_as_they_were_sent() {
    let s = TestServer::start().await;
    s.create_room(json!({"id": ROOM})).await;
    let (mut bob, _) = s
        .join_with(json!({"type": "join", "room": ROOM, "name": "bob", "channels": ["side"]}))
        .await;
    let (mut watcher, _) = s
        .join_with(json!({"type": "join", "room": ROOM, "name": "w", "channels": ["side"]}))
        .await;
    let mut main = Vec::new();
    for i in 0..5 {
        main.push(
            say(&mut bob, &mut watcher, "main", &format!("m{i}"))
                .await
                .1,
        );
        say(&mut bob, &mut watcher, "side", &format!("s{i}")).await;
    }
    let (mut ann, joined) = s
        .join_with(json!({"type": "join", "room": ROOM, "name": "ann",
            "history": {"last": 3}}))
        .await;
    assert_eq!(joined["type"], "joined", "{joined}");
    let (events, complete) = history_of(&joined);
    // Exactly the frames the live subscriber got: same seq, ts, body.
    assert_eq!(events, main[2..].to_vec());
    assert!(complete);
    assert!(events
        .iter()
        .all(|e| e["seq"].as_u64() <= joined["seq"].as_u64()));

    // `since` on another channel: only the side messages after it.
    let since = main[3]["seq"].as_u64().unwrap();
    let (_, joined) = s
        .join_with(
            json!({"type": "join", "room": ROOM, "name": "cy", "channels": ["side"],
            "history": {"channel": "side", "since": since}}),
        )
        .await;
    let (events, complete) = history_of(&joined);
    let texts: Vec<&str> = events
        .iter()
        .map(|e| e["data"]["text"].as_str().unwrap())
        .collect();
    assert_eq!(texts, ["s3", "s4"]);
    assert!(complete);

    // History is not part of the live stream: ann's next frame is new.
    let (seq, _) = say(&mut bob, &mut watcher, "main", "after").await;
    let (ev, _) = ann.recv_until(|v| v["kind"] == "message").await;
    assert_eq!(ev["seq"], seq);
}

#[tokio::test]
async fn history_says_when_the_room_no_longer_reaches_back() {
    let s = TestServer::start().await;
    // No presence: only the messages take history slots.
    s.create_room(json!({"id": ROOM, "options": {"history_size": 4, "presence": false}}))
        .await;
    let (mut bob, _) = s.join(ROOM, "bob").await;
    let (mut watcher, _) = s.join(ROOM, "w").await;
    let mut live = Vec::new();
    for i in 0..6 {
        live.push(
            say(&mut bob, &mut watcher, "main", &format!("m{i}"))
                .await
                .1,
        );
    }
    let seq = |i: usize| live[i]["seq"].as_u64().unwrap();
    let history = |h: Value| {
        let s = &s;
        async move {
            let (_, joined) = s
                .join_with(json!({"type": "join", "room": ROOM, "name": "ann", "history": h}))
                .await;
            history_of(&joined)
        }
    };
    assert_eq!(
        history(json!({"last": 4})).await,
        (live[2..].to_vec(), true)
    );
    assert_eq!(
        history(json!({"last": 10})).await,
        (live[2..].to_vec(), false),
        "six were sent, four are left"
    );
    assert_eq!(
        history(json!({"since": seq(1)})).await,
        (live[2..].to_vec(), true)
    );
    assert_eq!(
        history(json!({"since": seq(0)})).await,
        (live[2..].to_vec(), false)
    );
    assert_eq!(
        history(json!({"since": seq(2), "last": 2})).await,
        (live[4..].to_vec(), true)
    );
}

#[tokio::test]
async fn bad_history_requests_are_refused_and_join_nobody() {
    let s = TestServer::start().await;
    s.create_room(json!({"id": ROOM})).await;
    let (mut bob, _) = s.join(ROOM, "bob").await;
    for (history, code) in [
        (json!({}), "invalid_args"),
        (json!({"last": 0}), "invalid_args"),
        (json!({"last": 10001}), "invalid_args"),
        (json!({"channel": "side", "last": 5}), "invalid_args"),
        (json!({"last": -1}), "invalid_frame"),
        (json!({"count": 5}), "invalid_frame"),
    ] {
        let (mut c, answer) = s
            .join_with(json!({"type": "join", "room": ROOM, "name": "ann", "history": history}))
            .await;
        assert_eq!(answer["type"], "error", "{history}: {answer}");
        assert_eq!(answer["code"], code, "{history}: {answer}");
        c.assert_alive().await;
    }
    // Nobody joined: bob saw no presence event, and a good join still works.
    assert_eq!(bob.drain().await, Vec::<Value>::new());
    let (_, joined) = s
        .join_with(json!({"type": "join", "room": ROOM, "name": "ann", "history": {"last": 5}}))
        .await;
    assert_eq!(history_of(&joined), (vec![], true));
}
