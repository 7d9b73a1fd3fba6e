//! Checks the protocol examples in `protocol/vectors/` against this crate and
//! against `docs/protocol.md`:
//!
//! 1. every client vector decodes with [`client::decode`] into a frame holding
//!    the vector's values, or fails with exactly the vector's `error` code
//!    (`unknown_op` and `invalid_args` come from [`client::Request::op`]);
//! 2. every server vector is exactly the encoding of a typed [`ServerFrame`]
//!    built here for it;
//! 3. every vector is shown in the doc, and every `<!-- vector: ... -->` block
//!    of the doc equals its vector; every frame example of the doc is a vector;
//! 4. the doc's error table lists every [`ErrorCode`] and [`HttpErrorCode`], and its close code table
//!    every [`CloseCode`].

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

use plaza_protocol::client::{self, ClientFrame, Op};
use plaza_protocol::compact::{compact_message, expand, CompactKey};
use plaza_protocol::server::{
    ClosedReason, EntityInfo, ErrorBody, ErrorRef, Event, EventBody, JoinHistory, Joined,
    LeaveReason, LockInfo, MemberInfo, Outcome, ResyncReason, ServerFrame, Snapshot, UnlockReason,
};
use plaza_protocol::{CloseCode, ErrorCode, HttpErrorCode};
use serde_json::value::RawValue;
use serde_json::{json, Value};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn vectors_dir() -> PathBuf {
    root().join("protocol/vectors")
}

fn doc_text() -> String {
    let path = root().join("docs/protocol.md");
    fs::read_to_string(&path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()))
}

/// One vector file: its name relative to `protocol/vectors` and its content.
struct Vector {
    name: String,
    frame: Value,
    error: Option<String>,
    /// For a compact form: the server vector it stands for.
    v1: Option<String>,
}

/// Every vector file, by name (`client/publish.json`, ...).
fn vectors() -> BTreeMap<String, Vector> {
    let dir = vectors_dir();
    let mut out = BTreeMap::new();
    for entry in fs::read_dir(&dir).unwrap_or_else(|e| panic!("reading {}: {e}", dir.display())) {
        let entry = entry.unwrap();
        let side = entry.file_name().into_string().unwrap();
        assert!(
            ["client", "server", "http", "compact"].contains(&side.as_str()),
            "protocol/vectors/{side}: only client/, server/, http/ and compact/ belong here"
        );
        for file in fs::read_dir(entry.path()).unwrap() {
            let file = file.unwrap();
            let file_name = file.file_name().into_string().unwrap();
            let name = format!("{side}/{file_name}");
            assert!(
                file_name.ends_with(".json") && file.path().is_file(),
                "{name}: vectors are .json files"
            );
            let text = fs::read_to_string(file.path()).unwrap();
            let v: Value =
                serde_json::from_str(&text).unwrap_or_else(|e| panic!("{name}: not JSON: {e}"));
            let obj = v
                .as_object()
                .unwrap_or_else(|| panic!("{name}: not an object"));
            // An HTTP exchange (http/): a request and its response, shown as
            // they are in the doc; the server's tests replay them.
            let keys: &[&str] = if side == "http" {
                &["description", "request", "response"]
            } else if side == "compact" {
                // A compact form (`frame`) and the server vector it stands for (`v1`).
                &["description", "frame", "v1"]
            } else {
                &["description", "frame", "error"]
            };
            for key in obj.keys() {
                assert!(
                    keys.contains(&key.as_str()),
                    "{name}: unexpected key {key:?}"
                );
            }
            let description = obj.get("description").and_then(Value::as_str);
            assert!(
                description.is_some_and(|d| !d.trim().is_empty()),
                "{name}: needs a description"
            );
            let frame = if side == "http" {
                let part = |k: &str| {
                    obj.get(k)
                        .cloned()
                        .unwrap_or_else(|| panic!("{name}: needs a {k}"))
                };
                json!({"request": part("request"), "response": part("response")})
            } else {
                obj.get("frame")
                    .cloned()
                    .unwrap_or_else(|| panic!("{name}: needs a frame"))
            };
            let error = obj.get("error").map(|e| {
                assert_eq!(side, "client", "{name}: only client vectors have an error");
                e.as_str()
                    .unwrap_or_else(|| panic!("{name}: error must be a string"))
                    .to_owned()
            });
            let v1 = obj.get("v1").map(|n| {
                n.as_str()
                    .unwrap_or_else(|| panic!("{name}: v1 names a server vector"))
                    .to_owned()
            });
            assert_eq!(
                side == "compact",
                v1.is_some(),
                "{name}: v1 is for compact/ only"
            );
            out.insert(
                name.clone(),
                Vector {
                    name,
                    frame,
                    error,
                    v1,
                },
            );
        }
    }
    assert!(!out.is_empty(), "no vectors in {}", dir.display());
    out
}

// ---------------------------------------------------------------- client ---

fn opt_str(v: &Value, key: &str) -> Option<String> {
    v.get(key).and_then(Value::as_str).map(str::to_owned)
}

fn req_str(v: &Value, key: &str) -> String {
    opt_str(v, key).unwrap_or_else(|| panic!("vector lacks string {key:?}"))
}

/// A raw payload as a value; an absent or `null` payload is `None`.
fn raw_value(raw: &Option<Box<RawValue>>) -> Option<Value> {
    raw.as_ref()
        .map(|r| serde_json::from_str(r.get()).expect("raw values are JSON"))
}

fn payload(v: &Value, key: &str) -> Option<Value> {
    v.get(key).filter(|d| !d.is_null()).cloned()
}

/// The operation a request vector's `op` and `args` describe.
fn expected_op(op: &str, args: &Value) -> Op {
    let s = |k: &str| opt_str(args, k);
    let id = || req_str(args, "id");
    let u = |k: &str| args.get(k).and_then(Value::as_u64);
    match op {
        "entity.create" => Op::EntityCreate {
            kind: s("kind"),
            data: args.get("data").cloned().unwrap_or(Value::Null),
        },
        "entity.set" => Op::EntitySet {
            id: id(),
            data: args["data"].clone(),
            version: u("version"),
        },
        "entity.patch" => Op::EntityPatch {
            id: id(),
            data: args["data"].as_object().expect("patch data").clone(),
            version: u("version"),
        },
        "entity.delete" => Op::EntityDelete {
            id: id(),
            version: u("version"),
        },
        "lock.acquire" => Op::LockAcquire {
            object: req_str(args, "object"),
            ttl_ms: u("ttl_ms"),
        },
        "lock.renew" => Op::LockRenew {
            object: req_str(args, "object"),
            ttl_ms: u("ttl_ms"),
        },
        "lock.release" => Op::LockRelease {
            object: req_str(args, "object"),
        },
        "channel.subscribe" => Op::ChannelSubscribe {
            channel: req_str(args, "channel"),
        },
        "channel.unsubscribe" => Op::ChannelUnsubscribe {
            channel: req_str(args, "channel"),
        },
        "space.move" => Op::SpaceMove {
            to: serde_json::from_value(args["to"].clone()).expect("to: [x, y]"),
            speed: args["speed"].as_f64().expect("speed"),
        },
        "space.jump" => Op::SpaceJump {
            to: serde_json::from_value(args["to"].clone()).expect("to: [x, y]"),
        },
        "policy.update" => Op::PolicyUpdate(serde_json::from_value(args.clone()).expect("update")),
        "policy.clear" => Op::PolicyClear,
        other => panic!("no expectation for op {other:?}"),
    }
}

/// Checks that a decoded frame holds the values of its vector.
fn check_client_fields(name: &str, decoded: &ClientFrame, f: &Value) {
    let ty = f["type"].as_str().unwrap_or_default();
    match decoded {
        ClientFrame::Join(j) => {
            assert_eq!(ty, "join", "{name}");
            assert_eq!(j.room, opt_str(f, "room"), "{name}: room");
            assert_eq!(j.ticket, opt_str(f, "ticket"), "{name}: ticket");
            assert_eq!(j.name, opt_str(f, "name"), "{name}: name");
            assert_eq!(j.platform, opt_str(f, "platform"), "{name}: platform");
            let channels: Vec<String> = f
                .get("channels")
                .map(|c| serde_json::from_value(c.clone()).unwrap())
                .unwrap_or_default();
            assert_eq!(j.channels, channels, "{name}: channels");
            match (&j.resume, f.get("resume")) {
                (None, None) => {}
                (Some(r), Some(v)) => {
                    assert_eq!(r.token, req_str(v, "token"), "{name}: resume.token");
                    assert_eq!(Some(r.last_seq), v["last_seq"].as_u64(), "{name}: last_seq");
                }
                (r, v) => panic!("{name}: resume {r:?} vs {v:?}"),
            }
            let policy = f
                .get("policy")
                .map(|p| serde_json::from_value(p.clone()).unwrap());
            assert_eq!(j.policy, policy, "{name}: policy");
            if let Some(p) = &j.policy {
                p.validate().unwrap_or_else(|e| panic!("{name}: {e}"));
            }
            let history = f
                .get("history")
                .map(|h| serde_json::from_value(h.clone()).unwrap());
            assert_eq!(j.history, history, "{name}: history");
            if let Some(h) = &j.history {
                h.validate().unwrap_or_else(|e| panic!("{name}: {e}"));
            }
        }
        ClientFrame::Leave(l) => {
            assert_eq!(ty, "leave", "{name}");
            assert_eq!(l.room, req_str(f, "room"), "{name}: room");
        }
        ClientFrame::Publish(p) => {
            assert_eq!(ty, "publish", "{name}");
            assert_eq!(p.room, req_str(f, "room"), "{name}: room");
            let channel = opt_str(f, "channel").unwrap_or_else(|| "main".into());
            assert_eq!(p.channel, channel, "{name}: channel");
            assert_eq!(p.event, req_str(f, "event"), "{name}: event");
            assert_eq!(raw_value(&p.data), payload(f, "data"), "{name}: data");
            assert_eq!(p.id, opt_str(f, "id"), "{name}: id");
            assert_eq!(p.topic, opt_str(f, "topic"), "{name}: topic");
            assert_eq!(p.reply_to, f.get("reply_to").and_then(Value::as_u64));
            let echo = f.get("echo").and_then(Value::as_bool).unwrap_or(false);
            assert_eq!(p.echo, echo, "{name}: echo");
        }
        ClientFrame::Request(r) => {
            assert_eq!(ty, "request", "{name}");
            assert_eq!(r.room, req_str(f, "room"), "{name}: room");
            let nonce: Value = serde_json::from_str(r.nonce.get()).unwrap();
            assert_eq!(nonce, f["nonce"], "{name}: nonce");
            assert_eq!(r.op, req_str(f, "op"), "{name}: op");
            assert_eq!(raw_value(&r.args), payload(f, "args"), "{name}: args");
            let args = payload(f, "args").unwrap_or_else(|| json!({}));
            let op = r
                .op()
                .unwrap_or_else(|e| panic!("{name}: op() failed: {e:?}"));
            assert_eq!(op, expected_op(&r.op, &args), "{name}: op()");
        }
        ClientFrame::Direct(d) => {
            assert_eq!(ty, "direct", "{name}");
            assert_eq!(d.room, req_str(f, "room"), "{name}: room");
            assert_eq!(d.to, req_str(f, "to"), "{name}: to");
            assert_eq!(d.event, req_str(f, "event"), "{name}: event");
            assert_eq!(raw_value(&d.data), payload(f, "data"), "{name}: data");
        }
        ClientFrame::Auth(a) => {
            assert_eq!(ty, "auth", "{name}");
            assert_eq!(a.token, req_str(f, "token"), "{name}: token");
        }
        ClientFrame::Ping(p) => {
            assert_eq!(ty, "ping", "{name}");
            assert_eq!(
                p.ts,
                f.get("ts").and_then(|v| v.as_number().cloned()),
                "{name}: ts"
            );
        }
    }
}

#[test]
fn client_vectors_decode_or_fail_with_their_code() {
    let mut ops_shown = BTreeSet::new();
    let mut checked = 0;
    for v in vectors().values().filter(|v| v.name.starts_with("client/")) {
        let name = &v.name;
        let bytes = serde_json::to_vec(&v.frame).unwrap();
        let decoded = client::decode(&bytes);
        match (decoded, v.error.as_deref()) {
            (Ok(frame), None) => {
                check_client_fields(name, &frame, &v.frame);
                if let ClientFrame::Request(r) = &frame {
                    ops_shown.insert(r.op.clone());
                }
            }
            (Ok(ClientFrame::Request(r)), Some(code @ ("unknown_op" | "invalid_args"))) => {
                // The frame is well-formed; the operation is refused.
                let (got, message) = r
                    .op()
                    .expect_err(&format!("{name}: op() should fail with {code}"));
                assert_eq!(got.as_str(), code, "{name}: {message}");
            }
            (Ok(frame), Some(code)) => {
                panic!("{name}: should fail with {code} but decoded as {frame:?}")
            }
            (Err(e), Some(code)) => {
                assert_eq!(e.code.as_str(), code, "{name}: {}", e.message);
            }
            (Err(e), None) => panic!("{name}: should decode but failed: {e:?}"),
        }
        checked += 1;
    }
    assert!(checked > 0);
    for op in client::OPS {
        assert!(
            ops_shown.contains(*op),
            "no client vector shows a successful {op:?} request"
        );
    }
}

// ---------------------------------------------------------------- server ---

const ROOM: &str = "lobby";
const ANN: &str = "Hk3vQ9xLm2A";
const BOB: &str = "p7Rt0ZcWq1E";
const RESUME_TOKEN: &str = "Qm9uZ2lvcm5vLXJlc3VtZS10b2tlbi0x";
const EPOCH: u64 = 7_203_114_298_161_803_265;
const SDP: &str = "v=0\r\no=- 4611 2 IN IP4 127.0.0.1\r\n";

fn raw(v: Value) -> Box<RawValue> {
    RawValue::from_string(v.to_string()).unwrap()
}

fn member(session: &str, name: &str, platform: &str) -> MemberInfo {
    MemberInfo {
        session: session.into(),
        name: name.into(),
        platform: platform.into(),
        user: None,
    }
}

/// The movement of the spatial vectors.
fn walk() -> Value {
    json!({"from": [400.0, 300.0], "to": [640.0, 360.0], "t0": 1_732_312_400_000u64, "speed": 120.0})
}

fn ann() -> MemberInfo {
    member(ANN, "ann", "browser")
}

fn bob() -> MemberInfo {
    member(BOB, "bob", "xr")
}

fn entity(id: &str, kind: &str, data: Value, version: u64) -> EntityInfo {
    EntityInfo {
        id: id.into(),
        kind: Some(kind.into()),
        data,
        version,
    }
}

fn board() -> EntityInfo {
    entity("e1", "board", json!({"title": "Sprint 12"}), 3)
}

fn note(version: u64) -> EntityInfo {
    let data = match version {
        1 => json!({"text": "buy milk", "x": 10, "y": 20}),
        2 => json!({"text": "buy oat milk", "x": 10, "y": 20}),
        _ => json!({"text": "buy oat milk", "x": 12}),
    };
    entity("e7", "note", data, version)
}

fn lock(object: &str, owner: &str, token: u64, expires_at: u64) -> LockInfo {
    LockInfo {
        object: object.into(),
        owner: owner.into(),
        token,
        expires_at,
    }
}

fn board_lock() -> LockInfo {
    lock("e1", BOB, 5, 1_732_312_425_000)
}

fn note_lock() -> LockInfo {
    lock("e7", ANN, 6, 1_732_312_410_300)
}

fn snapshot() -> Snapshot {
    Snapshot {
        entities: vec![board()],
        locks: vec![board_lock()],
    }
}

fn joined(seq: u64, snapshot: Option<Snapshot>, resumed: bool) -> Joined {
    Joined {
        room: ROOM.into(),
        session: ANN.into(),
        resume_token: RESUME_TOKEN.into(),
        epoch: EPOCH,
        seq,
        members: vec![ann(), bob()],
        snapshot,
        channels: vec!["main".into(), "cursors".into()],
        resumed,
        reason: None,
        space: None,
        history: None,
        compact: None,
    }
}

/// Bob's chat message on topic `irc` (the batch and history vectors).
fn irc_message(seq: u64, ts: u64, text: &str) -> ServerFrame {
    event(
        seq,
        ts,
        Some(BOB),
        EventBody::Message {
            channel: "main".into(),
            event: "chat".into(),
            data: Some(raw(json!({ "text": text }))),
            topic: Some("irc".into()),
            reply_to: None,
            id: None,
        },
    )
}

fn ok(nonce: Value, result: Value) -> ServerFrame {
    ServerFrame::Response {
        room: ROOM.into(),
        nonce: raw(nonce),
        outcome: Outcome::Ok(result),
    }
}

fn event(seq: u64, ts: u64, from: Option<&str>, body: EventBody) -> ServerFrame {
    ServerFrame::Event(Event {
        room: ROOM.into(),
        seq,
        ts,
        from: from.map(str::to_owned),
        body,
    })
}

/// The typed frame each server vector shows.
fn expected_server_frame(name: &str) -> ServerFrame {
    match name {
        "server/joined.json" => ServerFrame::Joined(joined(42, Some(snapshot()), false)),
        "server/joined-resumed.json" => ServerFrame::Joined(joined(61, None, true)),
        "server/joined-history.json" => {
            let said = |seq, ts, text: &str| {
                let e = irc_message(seq, ts, text);
                RawValue::from_string(String::from_utf8(e.encode().to_vec()).unwrap()).unwrap()
            };
            ServerFrame::Joined(Joined {
                history: Some(JoinHistory {
                    events: vec![
                        said(39, 1_732_312_300_100, "anyone on irc?"),
                        said(41, 1_732_312_301_850, "never mind"),
                    ],
                    complete: true,
                }),
                ..joined(42, Some(snapshot()), false)
            })
        }
        "server/joined-compact.json" => ServerFrame::Joined(Joined {
            compact: Some(CompactKey {
                alias: 3,
                ts_base: 1_732_312_400_000,
            }),
            ..joined(42, Some(snapshot()), false)
        }),
        "server/resync.json" => ServerFrame::Resync(Joined {
            reason: Some(ResyncReason::HistoryTruncated),
            ..joined(2051, Some(snapshot()), false)
        }),
        "server/left.json" => ServerFrame::Left { room: ROOM.into() },
        "server/closed.json" => ServerFrame::Closed {
            room: ROOM.into(),
            reason: ClosedReason::RoomDeleted,
            message: None,
        },
        "server/closed-kicked.json" => ServerFrame::Closed {
            room: ROOM.into(),
            reason: ClosedReason::Kicked,
            message: Some("please keep the chat friendly".into()),
        },
        "server/ack.json" => ServerFrame::Ack {
            room: ROOM.into(),
            seq: 43,
            id: Some("m-17".into()),
            duplicate: false,
        },
        "server/ack-duplicate.json" => ServerFrame::Ack {
            room: ROOM.into(),
            seq: 43,
            id: Some("m-17".into()),
            duplicate: true,
        },
        // Results are built as plaza-core's `Room::request` builds them.
        "server/response-entity-create.json" => ok(json!(1), json!({"entity": note(1), "seq": 44})),
        "server/response-lock-acquire.json" => {
            ok(json!(2), json!({"lock": note_lock(), "seq": 45}))
        }
        "server/response-entity-set.json" => {
            ok(json!("n-3"), json!({"entity": note(2), "seq": 46}))
        }
        "server/response-entity-patch.json" => {
            ok(json!("n-4"), json!({"entity": note(3), "seq": 47}))
        }
        "server/response-lock-renew.json" => ok(
            json!("n-5"),
            json!({"lock": lock("e7", ANN, 6, 1_732_312_410_800), "seq": 48}),
        ),
        "server/response-lock-release.json" => {
            ok(json!("n-6"), json!({"object": "e7", "token": 6, "seq": 49}))
        }
        "server/response-entity-delete.json" => {
            ok(json!("n-7"), json!({"id": "e7", "version": 3, "seq": 50}))
        }
        "server/response-channel-subscribe.json" => {
            ok(json!(8), json!({"channels": ["main", "cursors"]}))
        }
        "server/response-channel-unsubscribe.json" => ok(json!(9), json!({"channels": ["main"]})),
        "server/response-error.json" => ServerFrame::Response {
            room: ROOM.into(),
            nonce: raw(json!("n-3")),
            outcome: Outcome::Err(ErrorBody {
                code: ErrorCode::VersionConflict,
                message: "entity \"e7\" is at version 2, not 1".into(),
            }),
        },
        "server/event-message.json" => event(
            43,
            1_732_312_400_120,
            Some(ANN),
            EventBody::Message {
                channel: "main".into(),
                event: "chat".into(),
                data: Some(raw(json!({"text": "hi all"}))),
                topic: Some("thread-3".into()),
                reply_to: Some(40),
                id: Some("m-17".into()),
            },
        ),
        "server/event-message-channel.json" => event(
            44,
            1_732_312_400_180,
            Some(BOB),
            EventBody::Message {
                channel: "xr".into(),
                event: "pose".into(),
                data: Some(raw(json!({"head": [0.1, 1.7, -0.4]}))),
                topic: None,
                reply_to: None,
                id: None,
            },
        ),
        "server/event-message-minimal.json" => event(
            45,
            1_732_312_400_240,
            Some(ANN),
            EventBody::Message {
                channel: "main".into(),
                event: "cursor".into(),
                data: Some(raw(json!([120, 48]))),
                topic: None,
                reply_to: None,
                id: None,
            },
        ),
        "server/event-presence-join.json" => event(
            58,
            1_732_312_460_050,
            Some(BOB),
            EventBody::PresenceJoin { member: bob() },
        ),
        "server/event-presence-leave.json" => event(
            55,
            1_732_312_450_000,
            Some(BOB),
            EventBody::PresenceLeave {
                session: BOB.into(),
                reason: LeaveReason::Disconnected,
            },
        ),
        "server/event-entity-created.json" => event(
            44,
            1_732_312_400_200,
            Some(ANN),
            EventBody::EntityCreated { entity: note(1) },
        ),
        "server/event-entity-updated.json" => event(
            46,
            1_732_312_400_400,
            Some(ANN),
            EventBody::EntityUpdated { entity: note(2) },
        ),
        "server/event-entity-deleted.json" => event(
            50,
            1_732_312_401_000,
            Some(ANN),
            EventBody::EntityDeleted {
                id: "e7".into(),
                version: 3,
            },
        ),
        "server/event-lock-acquired.json" => event(
            45,
            1_732_312_400_300,
            Some(ANN),
            EventBody::LockAcquired { lock: note_lock() },
        ),
        "server/response-space-move.json" => ok(
            json!(10),
            json!({"movement": walk(), "clamped": false, "seq": 60}),
        ),
        "server/event-space-moved.json" => event(
            60,
            1_732_312_400_000,
            Some(BOB),
            EventBody::SpaceMoved {
                session: BOB.into(),
                movement: walk(),
            },
        ),
        "server/event-interest-enter.json" => event(
            61,
            1_732_312_401_000,
            None,
            EventBody::InterestEnter {
                a: ANN.into(),
                b: BOB.into(),
                movements: json!({
                    ANN: {"from": [700.0, 400.0], "to": [700.0, 400.0], "t0": 1_732_312_390_000u64, "speed": 0.0},
                    BOB: walk(),
                }),
            },
        ),
        "server/event-proximity-enter.json" => event(
            62,
            1_732_312_402_000,
            None,
            EventBody::ProximityEnter {
                pair: 7,
                a: ANN.into(),
                b: BOB.into(),
                initiator: ANN.into(),
            },
        ),
        "server/event-proximity-leave.json" => event(
            63,
            1_732_312_409_000,
            None,
            EventBody::ProximityLeave {
                pair: 7,
                a: ANN.into(),
                b: BOB.into(),
            },
        ),
        "server/event-interest-leave.json" => event(
            64,
            1_732_312_412_000,
            None,
            EventBody::InterestLeave {
                a: ANN.into(),
                b: BOB.into(),
            },
        ),
        "server/event-lock-released.json" => event(
            49,
            1_732_312_400_900,
            Some(ANN),
            EventBody::LockReleased {
                object: "e7".into(),
                owner: ANN.into(),
                token: 6,
                reason: UnlockReason::Released,
            },
        ),
        "server/event-lock-expired.json" => event(
            53,
            1_732_312_425_000,
            None,
            EventBody::LockReleased {
                object: "e1".into(),
                owner: BOB.into(),
                token: 5,
                reason: UnlockReason::Expired,
            },
        ),
        "server/direct.json" => ServerFrame::Direct {
            room: ROOM.into(),
            from: ANN.into(),
            event: "rtc.offer".into(),
            data: Some(raw(json!({"sdp": SDP}))),
        },
        "server/error.json" => ServerFrame::Error {
            code: ErrorCode::NotJoined,
            message: "this connection has not joined the room".into(),
            reference: Some(ErrorRef {
                frame: Some("publish".into()),
                room: Some(ROOM.into()),
                id: Some("m-17".into()),
            }),
        },
        "server/error-rate-limited.json" => ServerFrame::Error {
            code: ErrorCode::RateLimited,
            message: "too many frames; this one was dropped".into(),
            reference: None,
        },
        "server/response-policy-update.json" => ok(
            json!(12),
            json!({"policy": {
                "filters": [
                    {"id": "mine", "enabled": false, "field": "topic", "op": {"equals": "xmpp"}},
                    {"id": "urgent", "enabled": true, "field": {"payload": "/priority"},
                     "op": {"in": ["high", "urgent"]}}
                ],
                "max_delay_ms": 2000, "max_held": 60, "aggregate": true
            }}),
        ),
        "server/response-policy-clear.json" => ok(json!(13), json!({"policy": null})),
        "server/batch.json" => ServerFrame::Batch {
            room: ROOM.into(),
            events: vec![
                irc_message(70, 1_732_312_500_100, "anyone on irc?"),
                irc_message(72, 1_732_312_501_850, "never mind"),
            ],
        },
        "server/pong.json" => ServerFrame::Pong {
            ts: Some(1_732_312_345_678u64.into()),
        },
        "server/authed.json" => ServerFrame::Authed {
            user: "u-ann".into(),
            name: Some("Ann".into()),
            expires_at: 1_732_316_000_000,
        },
        "server/error-forbidden.json" => ServerFrame::Error {
            code: ErrorCode::Forbidden,
            message: "the token grants no publish on channel \"xr\"".into(),
            reference: Some(ErrorRef {
                frame: Some("publish".into()),
                room: Some(ROOM.into()),
                id: Some("m-18".into()),
            }),
        },
        "server/event-presence-join-user.json" => event(
            59,
            1_732_312_460_900,
            Some(ANN),
            EventBody::PresenceJoin {
                member: MemberInfo {
                    name: "Ann".into(),
                    user: Some("u-ann".into()),
                    ..ann()
                },
            },
        ),
        other => {
            panic!("{other}: no typed frame for this vector; add one to expected_server_frame")
        }
    }
}

#[test]
fn server_vectors_are_exactly_what_the_encoder_produces() {
    let mut checked = 0;
    for v in vectors().values().filter(|v| v.name.starts_with("server/")) {
        let encoded = expected_server_frame(&v.name).encode();
        let got: Value = serde_json::from_slice(&encoded).unwrap();
        assert_eq!(
            got,
            v.frame,
            "{}: the encoder produces\n{}",
            v.name,
            serde_json::to_string_pretty(&got).unwrap()
        );
        checked += 1;
    }
    assert!(checked > 0);
}

#[test]
fn compact_vectors_are_the_compact_form_of_their_server_vector_and_expand_back() {
    let all = vectors();
    // Every compact vector is a message of the room that joined under this key.
    let joined = &all["server/joined-compact.json"].frame;
    let key: CompactKey = serde_json::from_value(joined["compact"].clone()).unwrap();
    let rooms = [(joined["room"].as_str().unwrap().to_owned(), key)];
    let mut checked = 0;
    for v in all.values().filter(|v| v.name.starts_with("compact/")) {
        let v1_name = v.v1.as_deref().unwrap();
        let v1 = all
            .get(v1_name)
            .unwrap_or_else(|| panic!("{}: no vector {v1_name}", v.name));
        assert!(
            v1_name.starts_with("server/"),
            "{}: v1 is a server vector",
            v.name
        );
        let compact = compact_message(&expected_server_frame(v1_name).encode(), key)
            .unwrap_or_else(|| panic!("{}: {v1_name} has no compact form", v.name));
        let got: Value = serde_json::from_slice(&compact).unwrap();
        assert_eq!(got, v.frame, "{}: the encoder produces {got}", v.name);
        assert_eq!(expand(&compact, &rooms).unwrap(), v1.frame, "{}", v.name);
        checked += 1;
    }
    assert!(checked > 0);
    // Every other server vector goes as it is.
    let compacted: BTreeSet<&str> = all.values().filter_map(|v| v.v1.as_deref()).collect();
    for v in all.values().filter(|v| v.name.starts_with("server/")) {
        let has_form = compact_message(&expected_server_frame(&v.name).encode(), key).is_some();
        assert_eq!(
            has_form,
            compacted.contains(v.name.as_str()),
            "{}: a compact form exactly for the vectors that show one",
            v.name
        );
    }
}

// ------------------------------------------------------------------- doc ---

/// A fenced block of the doc: its info string, its text, the vector named
/// right before it (if any) and its line number.
struct Block {
    lang: String,
    text: String,
    vector: Option<String>,
    line: usize,
}

fn doc_blocks(doc: &str) -> Vec<Block> {
    let mut blocks = Vec::new();
    let mut pending: Option<(String, usize)> = None;
    let mut lines = doc.lines().enumerate();
    while let Some((i, line)) = lines.next() {
        let t = line.trim();
        if let Some(rest) = t.strip_prefix("<!-- vector:") {
            let name = rest
                .strip_suffix("-->")
                .unwrap_or_else(|| panic!("docs/protocol.md:{}: malformed vector comment", i + 1))
                .trim();
            assert!(
                pending.is_none(),
                "docs/protocol.md:{}: vector comment without a block",
                i + 1
            );
            pending = Some((name.to_owned(), i + 1));
        } else if let Some(lang) = t.strip_prefix("```") {
            let mut text = String::new();
            for (_, l) in lines.by_ref() {
                if l.trim() == "```" {
                    break;
                }
                text.push_str(l);
                text.push('\n');
            }
            blocks.push(Block {
                lang: lang.trim().to_owned(),
                text,
                vector: pending.take().map(|(n, _)| n),
                line: i + 1,
            });
        } else if !t.is_empty() {
            if let Some((name, at)) = &pending {
                panic!("docs/protocol.md:{at}: <!-- vector: {name} --> must be followed by its ```json block");
            }
        }
    }
    assert!(
        pending.is_none(),
        "docs/protocol.md ends with a vector comment"
    );
    blocks
}

#[test]
fn doc_examples_and_vectors_match() {
    let doc = doc_text();
    let vectors = vectors();
    let mut shown = BTreeSet::new();
    for b in doc_blocks(&doc) {
        let at = format!("docs/protocol.md:{}", b.line);
        if b.lang != "json" {
            assert!(b.vector.is_none(), "{at}: a vector block must be ```json");
            continue;
        }
        let value: Value = serde_json::from_str(&b.text)
            .unwrap_or_else(|e| panic!("{at}: the json block is not JSON: {e}"));
        match b.vector {
            Some(name) => {
                let v = vectors
                    .get(&name)
                    .unwrap_or_else(|| panic!("{at}: no vector file protocol/vectors/{name}"));
                assert_eq!(
                    value, v.frame,
                    "{at}: the example differs from protocol/vectors/{name}"
                );
                assert!(shown.insert(name.clone()), "{at}: {name} is shown twice");
            }
            None => assert!(
                value.get("type").is_none(),
                "{at}: a frame example must be a vector: precede it with <!-- vector: ... -->"
            ),
        }
    }
    let missing: Vec<&String> = vectors.keys().filter(|n| !shown.contains(*n)).collect();
    assert!(
        missing.is_empty(),
        "vectors not shown in docs/protocol.md: {missing:?}"
    );
}

/// The first-column values of the table under the `## {heading}` heading.
fn table_keys(doc: &str, heading: &str) -> Vec<String> {
    let start = doc
        .lines()
        .position(|l| l.trim() == format!("## {heading}"))
        .unwrap_or_else(|| panic!("docs/protocol.md has no \"## {heading}\" section"));
    doc.lines()
        .skip(start + 1)
        .take_while(|l| !l.starts_with("## "))
        .filter(|l| l.starts_with('|'))
        .skip(2) // header and separator
        .map(|l| {
            l.split('|')
                .nth(1)
                .unwrap()
                .trim()
                .trim_matches('`')
                .to_owned()
        })
        .collect()
}

#[test]
fn doc_tables_list_every_error_and_close_code() {
    let doc = doc_text();
    let documented = table_keys(&doc, "Error codes");
    // Every code the server sends (the trajectory filters' aside, listed in
    // their section): the frames' and HTTP's, then the HTTP layer's own.
    let all: Vec<String> = ErrorCode::ALL
        .iter()
        .map(|c| c.as_str().to_owned())
        .chain(HttpErrorCode::ALL.iter().map(|c| c.as_str().to_owned()))
        .collect();
    assert_eq!(
        documented, all,
        "the error table must list ErrorCode::ALL then HttpErrorCode::ALL, in that order"
    );

    let mut documented: Vec<u16> = table_keys(&doc, "Close codes")
        .iter()
        .map(|c| c.parse().unwrap_or_else(|_| panic!("close code {c:?}")))
        .collect();
    documented.sort_unstable();
    let mut all: Vec<u16> = ALL_CLOSE_CODES.iter().map(|c| c.code()).collect();
    for c in ALL_CLOSE_CODES {
        assert!(listed(*c));
    }
    all.sort_unstable();
    assert_eq!(
        documented, all,
        "the close code table must list every CloseCode"
    );
}

const ALL_CLOSE_CODES: &[CloseCode] = &[
    CloseCode::Normal,
    CloseCode::ProtocolError,
    CloseCode::InvalidPayload,
    CloseCode::MessageTooBig,
    CloseCode::Restarting,
    CloseCode::HeartbeatTimeout,
    CloseCode::SlowConsumer,
    CloseCode::PolicyViolation,
    CloseCode::TokenExpired,
    CloseCode::HistoryRewritten,
];

/// Stops compiling when a close code is added, so that `ALL_CLOSE_CODES`
/// (and with it the doc's table) is updated too.
fn listed(c: CloseCode) -> bool {
    match c {
        CloseCode::Normal
        | CloseCode::ProtocolError
        | CloseCode::InvalidPayload
        | CloseCode::MessageTooBig
        | CloseCode::Restarting
        | CloseCode::HeartbeatTimeout
        | CloseCode::SlowConsumer
        | CloseCode::PolicyViolation
        | CloseCode::TokenExpired
        | CloseCode::HistoryRewritten => ALL_CLOSE_CODES.contains(&c),
    }
}
