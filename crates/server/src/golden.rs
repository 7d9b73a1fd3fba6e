//! Golden vectors of every format Plaza persists or sends between nodes:
//! the files under `formats/golden/` (see its README.md) must decode with
//! this build and encode again to the same bytes. Nodes of two versions
//! share logs, snapshots and registries during a rolling upgrade, so a
//! change that fails here breaks mixed-version clusters and data
//! directories written by earlier versions.
//!
//! The tests only read the files. `write_missing_golden_vectors` (ignored)
//! writes the vectors that do not exist yet and never overwrites one.

use std::collections::BTreeSet;
use std::path::PathBuf;

use plaza_broker::SnapshotFormat;
use plaza_core::policy::DeliveryPolicy;
use plaza_core::spatial::SpaceConfig;
use plaza_core::{Access, JoinParams, PublishParams, Room, RoomConfig, ServerPublish};
use plaza_protocol::client::{HistoryRequest, Op};
use plaza_protocol::ErrorCode;
use serde_json::json;
use serde_json::value::RawValue;

use crate::cluster::record::LogRecord;
use crate::cluster::snapshot::{decode_state, encode_state};
use crate::room::info::RoomInfo;
use crate::room::{Intent, Sink};
use crate::server_api::UserCall;
use crate::webhooks::{WebhookEvent, WebhookKind};

/// 2^53 + 1: the first integer a JSON reader that parses numbers as doubles
/// gets wrong, so a vector holding it proves ours do not.
const PAST_DOUBLES: u64 = 9_007_199_254_740_993;
/// A moment in November 2023, Unix milliseconds.
const T0: u64 = 1_700_000_000_123;

fn dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../formats/golden")
}

fn read(file: &str) -> Vec<u8> {
    let path = dir().join(file);
    std::fs::read(&path).unwrap_or_else(|e| {
        panic!(
            "golden vector {}: {e} (a new case gets its file from the ignored \
             test write_missing_golden_vectors, see formats/golden/README.md)",
            path.display()
        )
    })
}

fn raw(text: &str) -> Box<RawValue> {
    RawValue::from_string(text.to_owned()).expect("test payloads are JSON")
}

fn policy() -> DeliveryPolicy {
    serde_json::from_value(json!({
        "filters": [
            {"id": "urgent", "field": {"payload": "/priority"}, "op": {"in": ["high", 9007199254740993u64]}},
            {"id": "mine", "enabled": false, "field": "sender", "op": {"equals": "s-ü"}},
            {"id": "tagged", "field": "topic", "op": "exists"}
        ],
        "max_delay_ms": 250,
        "max_held": 64,
        "aggregate": false
    }))
    .expect("a valid policy")
}

fn record(node: &str, conn: u64, req: u64, intent: Intent) -> LogRecord {
    LogRecord {
        node: node.into(),
        conn,
        req,
        intent,
    }
}

/// One log record per file, each intent variant (and each request
/// operation) at least once, optional fields both present and absent.
fn record_cases() -> Vec<(&'static str, LogRecord)> {
    let op_request = |op: Op| Intent::Request {
        session: "s-ü".into(),
        nonce: raw(r#""n-1""#),
        op,
    };
    vec![
        (
            "record-join-new.json",
            record(
                "node-α",
                7,
                1,
                Intent::Join {
                    session: "s-ü".into(),
                    resume_token: "rt-0123456789abcdef0123456789abcdef".into(),
                    name: "Zoë \"the\" ✓".into(),
                    platform: "web".into(),
                    user: Some("user-名".into()),
                    channels: vec!["chat".into(), "ünïcode".into()],
                    ticket: true,
                    resume: None,
                    resume_only: None,
                    policy: Some(Box::new(policy())),
                    history: Some(HistoryRequest {
                        channel: "chat".into(),
                        last: Some(50),
                        since: Some(PAST_DOUBLES),
                    }),
                },
            ),
        ),
        (
            "record-join-resume.json",
            record(
                "node-b",
                PAST_DOUBLES,
                u64::MAX,
                Intent::Join {
                    session: "s2".into(),
                    resume_token: "-".into(),
                    name: "-".into(),
                    platform: "-".into(),
                    user: None,
                    channels: Vec::new(),
                    ticket: false,
                    resume: Some(("r".repeat(32), u64::MAX)),
                    resume_only: Some((ErrorCode::TokenRequired, "a token is required ✓".into())),
                    policy: None,
                    history: None,
                },
            ),
        ),
        (
            "record-leave.json",
            record(
                "node-a",
                3,
                4,
                Intent::Leave {
                    session: "s1".into(),
                },
            ),
        ),
        (
            "record-kick-message.json",
            record(
                "node-a",
                0,
                5,
                Intent::Kick {
                    session: "s1".into(),
                    message: Some("bye — «see you»".into()),
                },
            ),
        ),
        (
            "record-kick.json",
            record(
                "node-a",
                0,
                0,
                Intent::Kick {
                    session: "s1".into(),
                    message: None,
                },
            ),
        ),
        (
            "record-disconnect.json",
            record(
                "node-a",
                3,
                0,
                Intent::Disconnect {
                    session: "s1".into(),
                },
            ),
        ),
        (
            "record-publish.json",
            record(
                "node-a",
                3,
                6,
                Intent::Publish {
                    session: "s1".into(),
                    params: PublishParams {
                        channel: "chat".into(),
                        event: "msg.ü".into(),
                        // Kept as written: spaces, escapes and a number past
                        // doubles.
                        data: Some(raw(
                            r#"{"text": "h\u00e9llo \"x\" ✓", "n": 9007199254740993, "f": 2.5e-3}"#,
                        )),
                        id: Some("m-1".into()),
                        topic: Some("news".into()),
                        reply_to: Some(PAST_DOUBLES),
                        echo: true,
                    },
                },
            ),
        ),
        (
            "record-publish-minimal.json",
            record(
                "node-a",
                3,
                0,
                Intent::Publish {
                    session: "s1".into(),
                    params: PublishParams {
                        channel: "main".into(),
                        event: "e".into(),
                        data: None,
                        id: None,
                        topic: None,
                        reply_to: None,
                        echo: false,
                    },
                },
            ),
        ),
        (
            "record-request-entity-create.json",
            record(
                "node-a",
                3,
                7,
                op_request(Op::EntityCreate {
                    kind: Some("node".into()),
                    data: json!({"label": "Ünïcode", "size": PAST_DOUBLES, "pos": [1.5, -2.25]}),
                }),
            ),
        ),
        (
            "record-request-entity-create-no-kind.json",
            record(
                "node-a",
                3,
                8,
                Intent::Request {
                    session: "s1".into(),
                    nonce: raw("42"),
                    op: Op::EntityCreate {
                        kind: None,
                        data: json!(null),
                    },
                },
            ),
        ),
        (
            "record-request-entity-set.json",
            record(
                "node-a",
                3,
                9,
                op_request(Op::EntitySet {
                    id: "e1".into(),
                    data: json!({"a": [true, null, "x"]}),
                    version: Some(PAST_DOUBLES),
                }),
            ),
        ),
        (
            "record-request-entity-patch.json",
            record(
                "node-a",
                3,
                10,
                op_request(Op::EntityPatch {
                    id: "e1".into(),
                    data: serde_json::Map::from_iter([
                        ("gone".to_owned(), json!(null)),
                        ("label".to_owned(), json!("new ✓")),
                    ]),
                    version: None,
                }),
            ),
        ),
        (
            "record-request-entity-delete.json",
            record(
                "node-a",
                3,
                11,
                op_request(Op::EntityDelete {
                    id: "e1".into(),
                    version: Some(2),
                }),
            ),
        ),
        (
            "record-request-lock-acquire.json",
            record(
                "node-a",
                3,
                12,
                op_request(Op::LockAcquire {
                    object: "e1".into(),
                    ttl_ms: Some(30_000),
                }),
            ),
        ),
        (
            "record-request-lock-renew.json",
            record(
                "node-a",
                3,
                13,
                op_request(Op::LockRenew {
                    object: "e1".into(),
                    ttl_ms: None,
                }),
            ),
        ),
        (
            "record-request-lock-release.json",
            record(
                "node-a",
                3,
                14,
                op_request(Op::LockRelease {
                    object: "e1".into(),
                }),
            ),
        ),
        (
            "record-request-channel-subscribe.json",
            record(
                "node-a",
                3,
                15,
                op_request(Op::ChannelSubscribe {
                    channel: "alerts".into(),
                }),
            ),
        ),
        (
            "record-request-channel-unsubscribe.json",
            record(
                "node-a",
                3,
                16,
                op_request(Op::ChannelUnsubscribe {
                    channel: "alerts".into(),
                }),
            ),
        ),
        (
            "record-request-space-move.json",
            record(
                "node-a",
                3,
                17,
                op_request(Op::SpaceMove {
                    to: [12.5, -0.1],
                    speed: 3.75,
                }),
            ),
        ),
        (
            "record-request-space-jump.json",
            record(
                "node-a",
                3,
                18,
                op_request(Op::SpaceJump { to: [0.0, 1e-7] }),
            ),
        ),
        (
            "record-request-policy-update.json",
            record(
                "node-a",
                3,
                19,
                op_request(Op::PolicyUpdate(
                    serde_json::from_value(json!({
                        "add": [{"id": "x", "field": "channel", "op": {"equals": "chat"}}],
                        "remove": ["old"],
                        "enable": ["mine"],
                        "disable": ["tagged"],
                        "max_delay_ms": null,
                        "max_held": 10
                    }))
                    .expect("a valid policy update"),
                )),
            ),
        ),
        (
            "record-request-policy-clear.json",
            record("node-a", 3, 20, op_request(Op::PolicyClear)),
        ),
        (
            "record-direct.json",
            record(
                "node-a",
                3,
                21,
                Intent::Direct {
                    session: "s1".into(),
                    to: "s2".into(),
                    event: "poke".into(),
                    data: Some(raw(r#"[1, "ü", {"k": null}]"#)),
                },
            ),
        ),
        (
            "record-direct-no-data.json",
            record(
                "node-a",
                3,
                22,
                Intent::Direct {
                    session: "s1".into(),
                    to: "s2".into(),
                    event: "poke".into(),
                    data: None,
                },
            ),
        ),
        (
            "record-server-publish.json",
            record(
                "node-a",
                0,
                23,
                Intent::ServerPublish {
                    params: ServerPublish {
                        channel: "main".into(),
                        event: "announce".into(),
                        data: Some(raw(r#"{"text":"maintenance at 02:00 ✓"}"#)),
                        topic: Some("ops".into()),
                        reply_to: Some(12),
                        key: Some("idem-Ω-1".into()),
                    },
                },
            ),
        ),
        (
            "record-server-publish-minimal.json",
            record(
                "node-a",
                0,
                24,
                Intent::ServerPublish {
                    params: ServerPublish {
                        channel: "main".into(),
                        event: "e".into(),
                        data: None,
                        topic: None,
                        reply_to: None,
                        key: None,
                    },
                },
            ),
        ),
        (
            "record-server-request.json",
            record(
                "node-a",
                0,
                25,
                Intent::ServerRequest {
                    op: Op::EntitySet {
                        id: "e7".into(),
                        data: json!({"owner": "backend"}),
                        version: None,
                    },
                },
            ),
        ),
        (
            "record-server-direct.json",
            record(
                "node-a",
                0,
                26,
                Intent::ServerDirect {
                    to: "s2".into(),
                    event: "note".into(),
                    data: Some(raw(r#""just a string""#)),
                },
            ),
        ),
        (
            "record-server-direct-no-data.json",
            record(
                "node-a",
                0,
                27,
                Intent::ServerDirect {
                    to: "s2".into(),
                    event: "note".into(),
                    data: None,
                },
            ),
        ),
        ("record-tick.json", record("node-a", 0, 0, Intent::Tick)),
        (
            "record-node-down.json",
            record(
                "node-b",
                0,
                0,
                Intent::NodeDown {
                    node: "node-α".into(),
                },
            ),
        ),
        ("record-close.json", record("node-a", 0, 0, Intent::Close)),
    ]
}

fn join_params(session: &str, owner: &str, user: Option<&str>) -> JoinParams<Sink> {
    JoinParams {
        session: session.into(),
        resume_token: format!("rt-{session}-0123456789abcdef"),
        name: format!("Name «{session}»"),
        platform: "web".into(),
        user: user.map(str::to_owned),
        channels: Vec::new(),
        ticket: false,
        resume_only: None,
        sink: Sink::from_owner(owner),
        policy: None,
        history: None,
    }
}

/// A room that went through every kind of change a snapshot keeps:
/// members connected and disconnected, a policy, a later subscription,
/// remembered message ids, entities, a lock, an idempotency key and a
/// history holding every event kind a webhook tells of.
fn full_room() -> Room<Sink> {
    let config = RoomConfig {
        access: Access::TicketOnly,
        history_size: 64,
        ..RoomConfig::default()
    };
    let mut room = Room::new(
        "lobby.42".into(),
        "Café ✓ \"quoted\"".into(),
        config,
        PAST_DOUBLES,
        T0,
    );
    let mut alice = join_params("s-alice", "node-α/7", Some("user-名"));
    alice.ticket = true;
    alice.channels = vec!["chat".into()];
    alice.policy = Some(policy());
    room.join(alice, None, T0 + 1).expect("alice joins");
    let mut bob = join_params("s-bob", "node-b/9", None);
    bob.ticket = true;
    room.join(bob, None, T0 + 2).expect("bob joins");
    let mut carol = join_params("s-carol", "node-b/10", None);
    carol.ticket = true;
    room.join(carol, None, T0 + 2).expect("carol joins");
    let message = PublishParams {
        channel: "chat".into(),
        event: "msg".into(),
        data: Some(raw(
            r#"{"text": "h\u00e9llo \"x\" ✓", "n": 9007199254740993}"#,
        )),
        id: Some("m-1".into()),
        topic: Some("news".into()),
        reply_to: None,
        echo: false,
    };
    room.publish("s-alice", message, T0 + 3)
        .expect("alice publishes");
    let request = |room: &mut Room<Sink>, session: &str, op: Op, at: u64| {
        room.request(session, op, at).expect("the request is valid");
    };
    request(
        &mut room,
        "s-alice",
        Op::EntityCreate {
            kind: Some("node".into()),
            data: json!({"label": "Ünïcode", "size": PAST_DOUBLES, "pos": [1.5, -2.25]}),
        },
        T0 + 4,
    );
    request(
        &mut room,
        "s-alice",
        Op::EntityCreate {
            kind: None,
            data: json!("scratch"),
        },
        T0 + 5,
    );
    request(
        &mut room,
        "s-bob",
        Op::EntityPatch {
            id: "e1".into(),
            data: serde_json::Map::from_iter([("label".to_owned(), json!("patched"))]),
            version: Some(1),
        },
        T0 + 6,
    );
    request(
        &mut room,
        "s-bob",
        Op::EntityDelete {
            id: "e2".into(),
            version: None,
        },
        T0 + 7,
    );
    request(
        &mut room,
        "s-bob",
        Op::LockAcquire {
            object: "e1".into(),
            ttl_ms: Some(30_000),
        },
        T0 + 8,
    );
    request(
        &mut room,
        "s-alice",
        Op::LockAcquire {
            object: "board".into(),
            ttl_ms: None,
        },
        T0 + 8,
    );
    request(
        &mut room,
        "s-alice",
        Op::LockRelease {
            object: "board".into(),
        },
        T0 + 9,
    );
    request(
        &mut room,
        "s-alice",
        Op::ChannelSubscribe {
            channel: "alerts".into(),
        },
        T0 + 10,
    );
    let announce = ServerPublish {
        channel: "main".into(),
        event: "announce".into(),
        data: Some(raw(r#"{"text":"maintenance ✓"}"#)),
        topic: None,
        reply_to: Some(1),
        key: Some("idem-Ω-1".into()),
    };
    room.server_publish(announce, T0 + 11)
        .expect("the backend publishes");
    room.leave("s-carol", T0 + 12);
    room.disconnect("s-bob", T0 + 13);
    room
}

/// A spatial room with one member placed and one parked (disconnected).
fn spatial_room() -> Room<Sink> {
    let config = RoomConfig {
        space: Some(SpaceConfig::default()),
        ..RoomConfig::default()
    };
    let mut room = Room::new("plaza".into(), "Spatial".into(), config, 3, T0);
    room.join(join_params("s1", "node-a/1", None), None, T0 + 1)
        .expect("s1 joins");
    room.join(join_params("s2", "node-a/2", Some("u2")), None, T0 + 2)
        .expect("s2 joins");
    room.request("s1", Op::SpaceJump { to: [12.5, 3.25] }, T0 + 3)
        .expect("s1 jumps");
    room.disconnect("s2", T0 + 4);
    room
}

/// The snapshots' cases: a new room's first snapshot and two rooms with
/// everything a snapshot holds; each in both formats (`.json`, `.msgpack`).
fn snapshot_cases() -> Vec<(&'static str, Room<Sink>)> {
    vec![
        (
            "snapshot-room-new",
            Room::new("r".into(), "R".into(), RoomConfig::default(), 1, T0),
        ),
        ("snapshot-room-full", full_room()),
        ("snapshot-room-spatial", spatial_room()),
    ]
}

fn snapshot_file(stem: &str, format: SnapshotFormat) -> String {
    match format {
        SnapshotFormat::Json => format!("{stem}.json"),
        SnapshotFormat::MessagePack => format!("{stem}.msgpack"),
    }
}

const SNAPSHOT_FORMATS: [SnapshotFormat; 2] = [SnapshotFormat::Json, SnapshotFormat::MessagePack];

fn room_info_cases() -> Vec<(&'static str, RoomInfo)> {
    let ticket = RoomConfig {
        access: Access::TicketOnly,
        history_size: 100_000,
        max_members: 1_000_000,
        presence: false,
        ..RoomConfig::default()
    };
    let spatial = RoomConfig {
        space: Some(SpaceConfig::default()),
        ..RoomConfig::default()
    };
    vec![
        (
            "room-info-open.json",
            RoomInfo::new("Café ✓ \"quoted\"", &RoomConfig::default(), T0),
        ),
        (
            "room-info-ticket.json",
            RoomInfo::new("Ticket only", &ticket, T0),
        ),
        (
            "room-info-spatial.json",
            RoomInfo::new("Spatial", &spatial, T0),
        ),
    ]
}

fn user_call_cases() -> Vec<(&'static str, UserCall)> {
    vec![
        (
            "user-call-direct.json",
            UserCall::Direct {
                user: "user-名".into(),
                event: "note".into(),
                data: Some(raw(r#"{"text": "h\u00e9llo", "n": 9007199254740993}"#)),
            },
        ),
        (
            "user-call-direct-no-data.json",
            UserCall::Direct {
                user: "u1".into(),
                event: "ping".into(),
                data: None,
            },
        ),
        (
            "user-call-disconnect.json",
            UserCall::Disconnect {
                user: "user-名".into(),
                reason: Some("banned — «spam»".into()),
            },
        ),
        (
            "user-call-disconnect-no-reason.json",
            UserCall::Disconnect {
                user: "u1".into(),
                reason: None,
            },
        ),
    ]
}

/// One webhook body of each type: the room's events as the room task turns
/// them into webhooks, the room's creation and deletion as the node does.
fn webhook_cases() -> Vec<(String, WebhookEvent)> {
    let room = full_room();
    let state = room.export(|s: &Sink| s.owner());
    let mut events = Vec::new();
    let summary =
        RoomInfo::new(&state.name, &state.config, state.created_at).summary("lobby.42", 0);
    let mut created = serde_json::to_value(&summary).expect("summaries serialize");
    created.as_object_mut().expect("an object").remove("id");
    events.push(WebhookEvent {
        id: format!("lobby.42:created:{T0}"),
        kind: WebhookKind::RoomCreated,
        room: "lobby.42".into(),
        channel: None,
        timestamp_ms: T0,
        data: created,
    });
    for entry in &state.history {
        let event = crate::room::hooks::webhook_event(&state.id, state.epoch, entry, |_, _| true);
        if let Some(e) = event.filter(|e| !events.iter().any(|o: &WebhookEvent| o.kind == e.kind)) {
            events.push(e);
        }
    }
    events.push(WebhookEvent {
        id: format!("lobby.42:deleted:{}", T0 + 99),
        kind: WebhookKind::RoomDeleted,
        room: "lobby.42".into(),
        channel: None,
        timestamp_ms: T0 + 99,
        data: serde_json::Value::Null,
    });
    events
        .into_iter()
        .map(|e| {
            (
                format!("webhook-body-{}.json", e.kind.as_str().replace('.', "-")),
                e,
            )
        })
        .collect()
}

/// The variant names a serde enum accepts, from the error naming them all
/// (serde writes "expected `a`", "expected `a` or `b`" or "expected one of
/// `a`, `b`, ...").
fn serde_variants<T: serde::de::DeserializeOwned>() -> BTreeSet<String> {
    let Err(e) = serde_json::from_str::<T>(r#""no such variant""#) else {
        panic!("an unknown variant decoded");
    };
    let e = e.to_string();
    let (_, expected) = e
        .split_once(", expected")
        .unwrap_or_else(|| panic!("no variant list in {e:?}"));
    // The names are the quoted pieces: every other one between backquotes.
    expected
        .split('`')
        .skip(1)
        .step_by(2)
        .map(str::to_owned)
        .collect()
}

/// The tag of an externally tagged enum value: a string, or an object's only key.
fn tag(v: &serde_json::Value) -> String {
    match v {
        serde_json::Value::String(s) => s.clone(),
        serde_json::Value::Object(m) if m.len() == 1 => {
            m.keys().next().cloned().unwrap_or_default()
        }
        other => panic!("not an externally tagged value: {other}"),
    }
}

#[test]
fn golden_log_records_decode_and_encode_to_the_same_bytes() {
    for (file, expected) in record_cases() {
        let bytes = read(file);
        let decoded = LogRecord::decode(&bytes).unwrap_or_else(|e| panic!("{file}: {e}"));
        // Same meaning as the value it was made from (Debug shows every
        // field, raw payloads as written).
        assert_eq!(format!("{decoded:?}"), format!("{expected:?}"), "{file}");
        assert_eq!(decoded.encode(), bytes, "{file}: decoded and encoded again");
        assert_eq!(expected.encode(), bytes, "{file}: encoded by this build");
    }
}

#[test]
fn golden_log_records_cover_every_intent_and_operation() {
    let (mut intents, mut ops) = (BTreeSet::new(), BTreeSet::new());
    for (file, _) in record_cases() {
        let v: serde_json::Value = serde_json::from_slice(&read(file)).expect("JSON");
        let intent = tag(&v["intent"]);
        match intent.as_str() {
            "request" => ops.insert(tag(&v["intent"]["request"]["op"])),
            "server_request" => ops.insert(tag(&v["intent"]["server_request"]["op"])),
            _ => false,
        };
        intents.insert(intent);
    }
    assert_eq!(
        intents,
        serde_variants::<Intent>(),
        "an Intent without a vector"
    );
    assert_eq!(ops, serde_variants::<Op>(), "an Op without a vector");
}

#[test]
fn golden_snapshots_decode_and_encode_to_the_same_bytes() {
    for (stem, room) in snapshot_cases() {
        let expected = room.export(|s: &Sink| s.owner());
        for format in SNAPSHOT_FORMATS {
            let file = snapshot_file(stem, format);
            let bytes = read(&file);
            // Readers tell the formats apart by the first byte.
            assert_eq!(bytes[0] == b'{', format == SnapshotFormat::Json, "{file}");
            let state = decode_state(&bytes).unwrap_or_else(|e| panic!("{file}: {e}"));
            state.validate().unwrap_or_else(|e| panic!("{file}: {e}"));
            assert_eq!(state, expected, "{file}");
            let again = Room::import(state, Sink::from_owner);
            assert_eq!(
                encode_state(&again, format),
                bytes,
                "{file}: imported and encoded again"
            );
            assert_eq!(
                encode_state(&room, format),
                bytes,
                "{file}: encoded by this build"
            );
        }
    }
}

#[test]
fn golden_snapshots_hold_what_the_room_held() {
    let state = decode_state(&read("snapshot-room-full.msgpack")).expect("decodes");
    assert_eq!((state.id.as_str(), state.epoch), ("lobby.42", PAST_DOUBLES));
    assert_eq!(state.name, "Café ✓ \"quoted\"");
    let alice = state
        .members
        .iter()
        .find(|m| m.session == "s-alice")
        .expect("alice");
    assert_eq!(alice.owner.as_deref(), Some("node-α/7"));
    assert_eq!(alice.user.as_deref(), Some("user-名"));
    assert_eq!(alice.recent, vec![("m-1".to_owned(), 4)]);
    assert_eq!(alice.policy, Some(policy()));
    let bob = state
        .members
        .iter()
        .find(|m| m.session == "s-bob")
        .expect("bob");
    assert_eq!(
        (bob.owner.as_deref(), bob.disconnected_at),
        (None, Some(T0 + 13))
    );
    assert!(
        !state.members.iter().any(|m| m.session == "s-carol"),
        "carol left"
    );
    assert_eq!(state.server_keys.len(), 1);
    assert_eq!(state.server_keys[0].0, "idem-Ω-1");
    let message = state
        .history
        .iter()
        .find(|e| e.channel.as_deref() == Some("chat"))
        .expect("alice's message");
    let frame: serde_json::Value = serde_json::from_slice(&message.frame).expect("a frame");
    assert_eq!(frame["data"]["n"], json!(PAST_DOUBLES), "{frame}");
    let spatial = decode_state(&read("snapshot-room-spatial.json")).expect("decodes");
    assert!(spatial.space.is_some() && spatial.config.space.is_some());
}

#[test]
fn golden_room_infos_decode_and_encode_to_the_same_bytes() {
    for (file, expected) in room_info_cases() {
        let bytes = read(file);
        let decoded = RoomInfo::decode(&bytes).unwrap_or_else(|| panic!("{file} decodes"));
        assert_eq!(decoded, expected, "{file}");
        assert_eq!(decoded.encode(), bytes, "{file}: decoded and encoded again");
        assert_eq!(expected.encode(), bytes, "{file}: encoded by this build");
    }
}

#[test]
fn golden_user_calls_decode_and_encode_to_the_same_bytes() {
    let cases = user_call_cases();
    let tags: BTreeSet<String> = cases
        .iter()
        .map(|(file, _)| tag(&serde_json::from_slice(&read(file)).expect("JSON")))
        .collect();
    assert_eq!(
        tags,
        serde_variants::<UserCall>(),
        "a UserCall without a vector"
    );
    for (file, expected) in cases {
        let bytes = read(file);
        let decoded: UserCall =
            serde_json::from_slice(&bytes).unwrap_or_else(|e| panic!("{file}: {e}"));
        match (&decoded, &expected) {
            (
                UserCall::Direct { user, event, data },
                UserCall::Direct {
                    user: u,
                    event: e,
                    data: d,
                },
            ) => {
                assert_eq!((user, event), (u, e), "{file}");
                assert_eq!(
                    data.as_ref().map(|d| d.get()),
                    d.as_ref().map(|d| d.get()),
                    "{file}"
                );
            }
            (
                UserCall::Disconnect { user, reason },
                UserCall::Disconnect { user: u, reason: r },
            ) => assert_eq!((user, reason), (u, r), "{file}"),
            _ => panic!("{file}: another variant"),
        }
        assert_eq!(
            serde_json::to_vec(&decoded).expect("encodes"),
            bytes,
            "{file}"
        );
        assert_eq!(
            serde_json::to_vec(&expected).expect("encodes"),
            bytes,
            "{file}"
        );
    }
}

#[test]
fn golden_webhook_bodies_are_what_this_build_writes() {
    let cases = webhook_cases();
    let kinds: BTreeSet<&str> = cases.iter().map(|(_, e)| e.kind.as_str()).collect();
    let all: BTreeSet<&str> = WebhookKind::ALL.iter().map(|k| k.as_str()).collect();
    assert_eq!(kinds, all, "a webhook type without a vector");
    for (file, event) in cases {
        let bytes = read(&file);
        // Stored as it is POSTed: a receiver reads it as JSON.
        let body: serde_json::Value =
            serde_json::from_slice(&bytes).unwrap_or_else(|e| panic!("{file}: {e}"));
        assert_eq!(body["type"], event.kind.as_str(), "{file}");
        assert_eq!(body["data"]["room"], "lobby.42", "{file}");
        assert!(
            body["timestamp"]
                .as_str()
                .is_some_and(|t| t.starts_with("2023-11-14T22:13:2")),
            "{file}: {body}"
        );
        assert_eq!(
            serde_json::to_vec(&body).expect("encodes"),
            bytes,
            "{file}: decoded and encoded again"
        );
        assert_eq!(event.body(), bytes, "{file}: written by this build");
    }
}

/// Every file in the directory belongs to a case (here, or in the broker's
/// tests for `redis-*`): a renamed or stray vector is noticed rather than
/// silently left untested.
#[test]
fn golden_directory_holds_only_tested_vectors() {
    let mut known: BTreeSet<String> = ["README.md", ".gitattributes"].map(String::from).into();
    known.extend(record_cases().into_iter().map(|(f, _)| f.to_owned()));
    for (stem, _) in snapshot_cases() {
        known.extend(SNAPSHOT_FORMATS.map(|f| snapshot_file(stem, f)));
    }
    known.extend(room_info_cases().into_iter().map(|(f, _)| f.to_owned()));
    known.extend(user_call_cases().into_iter().map(|(f, _)| f.to_owned()));
    known.extend(webhook_cases().into_iter().map(|(f, _)| f));
    let present: BTreeSet<String> = std::fs::read_dir(dir())
        .expect("formats/golden exists")
        .map(|e| {
            e.expect("a directory entry")
                .file_name()
                .to_string_lossy()
                .into_owned()
        })
        // The broker's own vectors, which its tests check (redis/golden.rs).
        .filter(|f| !f.starts_with("redis-"))
        .collect();
    assert_eq!(present, known);
}

/// Writes the vectors whose files do not exist yet, from the cases above;
/// never overwrites one (a golden file is never edited). Run with
/// `cargo test -p plaza-server --lib write_missing_golden_vectors -- --ignored`.
#[test]
#[ignore = "writes formats/golden/; run by hand when adding a case"]
fn write_missing_golden_vectors() {
    let mut files: Vec<(String, Vec<u8>)> = Vec::new();
    files.extend(
        record_cases()
            .into_iter()
            .map(|(f, r)| (f.to_owned(), r.encode().to_vec())),
    );
    for (stem, room) in snapshot_cases() {
        for format in SNAPSHOT_FORMATS {
            files.push((
                snapshot_file(stem, format),
                encode_state(&room, format).to_vec(),
            ));
        }
    }
    files.extend(
        room_info_cases()
            .into_iter()
            .map(|(f, i)| (f.to_owned(), i.encode().to_vec())),
    );
    files.extend(
        user_call_cases()
            .into_iter()
            .map(|(f, c)| (f.to_owned(), serde_json::to_vec(&c).expect("encodes"))),
    );
    files.extend(
        webhook_cases()
            .into_iter()
            .map(|(f, e)| (f, e.body().to_vec())),
    );
    std::fs::create_dir_all(dir()).expect("formats/golden");
    for (file, bytes) in files {
        let path = dir().join(&file);
        if !path.exists() {
            std::fs::write(&path, bytes).expect("writes");
            println!("wrote {file}");
        }
    }
}
