//! Room feeds (docs/architecture.md, data path): members that follow the
//! room's feed and members that are handed their events, switching between
//! the two while the room is busy, each get every message meant for them
//! once, in seq order.

use crate::support::{Client, TestServer};
use serde_json::{json, Value};

const ROOM: &str = "feeds";
const ROUNDS: u64 = 20;

/// The seqs of the `message` events among `frames`, those inside a policy's
/// `batch` frames included.
fn message_seqs(frames: &[Value]) -> Vec<u64> {
    let mut seqs = Vec::new();
    for f in frames {
        let events = match f["type"].as_str() {
            Some("event") => vec![f.clone()],
            Some("batch") => f["events"].as_array().cloned().unwrap_or_default(),
            _ => Vec::new(),
        };
        seqs.extend(
            events
                .iter()
                .filter(|e| e["kind"] == "message")
                .filter_map(|e| e["seq"].as_u64()),
        );
    }
    seqs
}

fn assert_once_in_order(who: &str, seqs: &[u64]) {
    assert!(
        seqs.windows(2).all(|w| w[0] < w[1]),
        "{who} got messages twice or out of order: {seqs:?}"
    );
}

/// Publishes on `channel` and returns the message's seq.
async fn say(p: &mut Client, channel: &str, round: u64) -> u64 {
    p.send(
        json!({"type": "publish", "room": ROOM, "channel": channel, "event": "chat",
        "data": {"round": round}}),
    )
    .await;
    let (ack, _) = p.recv_until(|v| v["type"] == "ack").await;
    ack["seq"].as_u64().unwrap()
}

/// Every frame up to the one holding message `last`.
async fn until(c: &mut Client, last: u64) -> Vec<Value> {
    let (end, mut before) = c
        .recv_until(|v| message_seqs(std::slice::from_ref(v)).contains(&last))
        .await;
    before.push(end);
    before
}

/// Sends a request, checks it succeeded, and keeps the frames before its response.
async fn ask(c: &mut Client, got: &mut Vec<Value>, nonce: u64, op: &str, args: Value) {
    let (resp, before) = c.request(ROOM, json!(nonce), op, args).await;
    assert_eq!(resp["ok"], true, "{op}: {resp}");
    got.extend(before);
}

#[tokio::test]
async fn members_switching_policy_channels_and_connection_get_each_message_once_in_order() {
    let s = TestServer::start().await;
    s.create_room(json!({"id": ROOM})).await;
    let mut clients = s
        .join_all(ROOM, &["pub", "plain", "switcher", "chan", "mover"])
        .await;
    let (mut mover, joined_mover) = clients.pop().unwrap();
    let (mut chan, _) = clients.pop().unwrap();
    let (mut switcher, _) = clients.pop().unwrap();
    let (mut plain, _) = clients.pop().unwrap();
    let (mut publisher, _) = clients.pop().unwrap();
    let (mut got_switcher, mut got_chan) = (Vec::new(), Vec::new());
    let mut got_mover_before = Vec::new();
    let (mut main, mut xr_while_subscribed) = (Vec::new(), Vec::new());
    let mut subscribed = false;
    let mut moved_at = None;

    for round in 0..ROUNDS {
        // Each change is answered before the next message is published:
        // the room orders it between two of them.
        match round {
            3 => {
                let args = json!({"max_held": 3});
                ask(&mut switcher, &mut got_switcher, 1, "policy.update", args).await;
            }
            4 => {
                let args = json!({"channel": "xr"});
                ask(&mut chan, &mut got_chan, 2, "channel.subscribe", args).await;
                subscribed = true;
            }
            8 => {
                // The mover's connection drops; it resumes on a new one from
                // the last message it read.
                got_mover_before = mover.drain().await;
                let last_seq = got_mover_before
                    .iter()
                    .filter_map(|v| v["seq"].as_u64())
                    .max()
                    .unwrap_or(joined_mover["seq"].as_u64().unwrap());
                drop(mover);
                let (c, joined) = s
                    .join_with(json!({"type": "join", "room": ROOM, "name": "mover",
                        "resume": {"token": joined_mover["resume_token"], "last_seq": last_seq}}))
                    .await;
                assert_eq!(
                    (&joined["type"], &joined["resumed"]),
                    (&json!("joined"), &json!(true))
                );
                mover = c;
                moved_at = Some(last_seq);
            }
            12 => {
                ask(
                    &mut switcher,
                    &mut got_switcher,
                    3,
                    "policy.clear",
                    json!({}),
                )
                .await
            }
            14 => {
                let args = json!({"channel": "xr"});
                ask(&mut chan, &mut got_chan, 4, "channel.unsubscribe", args).await;
                subscribed = false;
            }
            _ => {}
        }
        main.push(say(&mut publisher, "main", round).await);
        let xr = say(&mut publisher, "xr", round).await;
        if subscribed {
            xr_while_subscribed.push(xr);
        }
    }
    let last = *main.last().unwrap();

    let got_plain = until(&mut plain, last).await;
    assert_eq!(message_seqs(&got_plain), main, "plain");

    got_switcher.extend(until(&mut switcher, last).await);
    let seqs = message_seqs(&got_switcher);
    assert_once_in_order("switcher", &seqs);
    assert_eq!(seqs, main, "switcher: every main message, held or not");

    got_chan.extend(until(&mut chan, last).await);
    let seqs = message_seqs(&got_chan);
    assert_once_in_order("chan", &seqs);
    let mut expected: Vec<u64> = main.iter().chain(&xr_while_subscribed).copied().collect();
    expected.sort_unstable();
    assert_eq!(
        seqs, expected,
        "chan: main, and xr exactly while subscribed"
    );

    let mut seqs = message_seqs(&got_mover_before);
    let resumed = until(&mut mover, last).await;
    let moved_at = moved_at.unwrap();
    seqs.extend(message_seqs(&resumed).into_iter().filter(|s| *s > moved_at));
    assert_once_in_order("mover", &seqs);
    assert_eq!(
        seqs, main,
        "mover: every main message across both connections"
    );
    assert!(
        message_seqs(&resumed).iter().all(|s| *s > moved_at),
        "the resume replayed nothing the mover had: {resumed:?}"
    );
}
