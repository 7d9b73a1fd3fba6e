//! Replicas: rooms fed the same inputs, or continued from an exported state,
//! must agree byte for byte (cluster mode runs one replica per node).

use std::collections::HashMap;

use crate::common::*;
use plaza_core::spatial::SpaceConfig;
use plaza_core::{
    JoinParams, Millis, PublishParams, Resume, Room, RoomConfig, RoomError, RoomState,
};
use plaza_protocol::client::Op;
use proptest::prelude::*;
use serde_json::{json, Map, Value};

/// One input of a room's ordered log, as every replica receives it.
#[derive(Debug, Clone)]
enum Input {
    Join {
        n: u32,
        channels: Vec<String>,
    },
    /// Resume `token`; the params of a fresh session `n` are used if it is gone.
    Resume {
        n: u32,
        token: String,
        last_seq: u64,
    },
    Publish {
        session: String,
        channel: String,
        id: Option<String>,
        echo: bool,
        reply_to: Option<u64>,
    },
    Request {
        session: String,
        op: Op,
    },
    Disconnect(String),
    /// A node went away: every member delivered through it drops, in the
    /// order `connected_sessions` gives (sinks of this parity, here).
    NodeDown(u32),
    Leave(String),
    Tick,
}

fn join_params(n: u32, channels: Vec<String>) -> JoinParams<u32> {
    JoinParams {
        session: format!("s{n}"),
        resume_token: format!("t{n}"),
        name: format!("user{n}"),
        platform: "replica".into(),
        user: None,
        channels,
        ticket: false,
        resume_only: None,
        policy: None,
        history: None,
        sink: n,
    }
}

fn owner(sink: &u32) -> String {
    format!("node-{sink}")
}

fn sink_of(owner: &str) -> u32 {
    owner
        .strip_prefix("node-")
        .and_then(|n| n.parse().ok())
        .expect("owner names a sink")
}

/// Everything observable about the room's answer to `input` and its state
/// after it, as text (frames verbatim). Equal transcripts: equal replicas.
fn apply(room: &mut Room<u32>, input: &Input, now: Millis) -> (String, Option<(String, String)>) {
    let mut out = format!("{input:?} @{now}\n");
    let mut joined = None;
    let mut events = Vec::new();
    let error = |e: RoomError| format!("error {} {}\n", e.code, e.message);
    match input.clone() {
        Input::Join { n, channels } => match room.join(join_params(n, channels), None, now) {
            Ok(j) => {
                out += &text(&j.server_frame().encode());
                joined = Some((j.frame.session.clone(), j.frame.resume_token.clone()));
                events = j.events;
            }
            Err(e) => out += &error(e),
        },
        Input::Resume { n, token, last_seq } => {
            let r = Resume { token, last_seq };
            match room.join(join_params(n, Vec::new()), Some(r), now) {
                Ok(j) => {
                    out += &text(&j.server_frame().encode());
                    for m in &j.missed {
                        out += &format!("missed {}", text(&m.frame));
                    }
                    out += &format!("replaced {:?}\n", j.replaced);
                    joined = Some((j.frame.session.clone(), j.frame.resume_token.clone()));
                    events = j.events;
                }
                Err(e) => out += &error(e),
            }
        }
        Input::Publish {
            session,
            channel,
            id,
            echo,
            reply_to,
        } => {
            let p = PublishParams {
                channel,
                event: "chat".into(),
                data: raw(r#"{"t":"h\u00e9","n":[1,2.5e-300]}"#),
                id,
                topic: Some("tp".into()),
                reply_to,
                echo,
            };
            match room.publish(&session, p, now) {
                Ok(p) => {
                    out += &format!("published {} new {}\n", p.seq, p.entry.is_some());
                    events.extend(p.entry);
                }
                Err(e) => out += &error(e),
            }
        }
        Input::Request { session, op } => match room.request(&session, op, now) {
            Ok(o) => {
                out += &format!("result {}\n", o.result);
                events = o.events;
            }
            Err(e) => out += &error(e),
        },
        Input::Disconnect(s) => events = room.disconnect(&s, now),
        Input::NodeDown(parity) => {
            for s in room.connected_sessions(|sink| sink % 2 == parity) {
                events.extend(room.disconnect(&s, now));
            }
        }
        Input::Leave(s) => events = room.leave(&s, now),
        Input::Tick => events = room.tick(now),
    }
    for e in &events {
        let mut to = Vec::new();
        room.for_each_recipient(e, |s, sink| to.push(format!("{s}:{sink}")));
        to.sort();
        out += &format!("event {:?} -> {to:?}\n  {}", e, text(&e.frame));
    }
    out += &format!(
        "seq {} connected {} sessions {} deadline {:?} members {:?} all {:?} snapshot {}\n",
        room.seq(),
        room.connected(),
        room.sessions(),
        room.next_deadline(),
        room.members_info(),
        room.connected_sessions(|_| true),
        serde_json::to_string(&room.snapshot(now)).unwrap(),
    );
    (out, joined)
}

fn text(frame: &[u8]) -> String {
    format!(
        "{}\n",
        std::str::from_utf8(frame).expect("frames are UTF-8")
    )
}

fn export_json(room: &Room<u32>) -> String {
    let state = room.export(owner);
    // The data directory's snapshots are MessagePack (named fields): the
    // same state must come back from it.
    let packed = rmp_serde::to_vec_named(&state).expect("room state packs");
    let unpacked: RoomState = rmp_serde::from_slice(&packed).expect("room state unpacks");
    assert_eq!(unpacked, state, "a MessagePack round trip changes nothing");
    serde_json::to_string(&state).expect("room state serializes")
}

/// What a node that starts hosting the room does: decode and load the state.
fn import_json(json: &str) -> Room<u32> {
    let state: RoomState = serde_json::from_str(json).expect("room state deserializes");
    state.validate().expect("an exported state is valid");
    Room::import(state, sink_of)
}

fn publish(session: &str, id: Option<&str>) -> Input {
    Input::Publish {
        session: session.into(),
        channel: "main".into(),
        id: id.map(str::to_owned),
        echo: false,
        reply_to: None,
    }
}

fn joining(n: u32, channels: &[&str]) -> Input {
    Input::Join {
        n,
        channels: channels.iter().map(|c| (*c).to_owned()).collect(),
    }
}

fn resuming(n: u32, token: &str, last_seq: u64) -> Input {
    Input::Resume {
        n,
        token: token.into(),
        last_seq,
    }
}

fn set(id: &str, data: Value, version: Option<u64>) -> Op {
    Op::EntitySet {
        id: id.into(),
        data,
        version,
    }
}

fn request(session: &str, op: Op) -> Input {
    Input::Request {
        session: session.into(),
        op,
    }
}

/// Applies `inputs` to both rooms and checks every answer is the same.
fn run_both(a: &mut Room<u32>, b: &mut Room<u32>, inputs: &[(Input, Millis)]) {
    for (input, now) in inputs {
        let (ta, _) = apply(a, input, *now);
        let (tb, _) = apply(b, input, *now);
        assert_eq!(ta, tb);
    }
}

#[test]
fn an_imported_room_continues_exactly_like_the_original() {
    let config = RoomConfig {
        history_size: 16, // the exported history starts after seq 1
        max_members: 10,
        dedup_window: 3,
        resume_window_ms: 1_000,
        default_lock_ttl_ms: 500,
        max_lock_ttl_ms: 5_000,
        ..RoomConfig::default()
    };
    let mut a = Room::new("r".into(), "Room R".into(), config, u64::MAX - 3, 1);
    a.seed_entity(Some("seed".into()), json!({"at": 0}));
    let s = sid;
    // Numbers that only survive JSON exactly with serde_json's float_roundtrip.
    let data = json!({
        "big": u64::MAX,
        "tiny": 1.0715660391465826e-75,
        "neg": -1.81996730402717e-179,
        "s": "caf\u{e9} \"q\""
    });
    let before: Vec<(Input, Millis)> = vec![
        (joining(1, &["side"]), 2),
        (joining(2, &[]), 2),
        (joining(3, &[]), 3),
        (joining(4, &["x", "y"]), 3),
        (joining(5, &[]), 3),
        (publish(&s(1), Some("a")), 4),
        (publish(&s(1), Some("b")), 4),
        (publish(&s(1), Some("c")), 5),
        (publish(&s(1), Some("d")), 5), // the window (3) forgets "a"
        (publish(&s(2), Some("a")), 5), // ids are per session
        (request(&s(2), create(data.clone())), 6),
        (request(&s(2), create(json!([1]))), 6),
        (request(&s(2), set("e2", data.clone(), Some(1))), 7),
        (request(&s(1), acquire("doc", Some(300))), 10), // until 310
        (request(&s(2), acquire("pad", Some(2_000))), 10),
        (request(&s(3), acquire("map", None)), 10),
        (request(&s(2), subscribe("side")), 11),
        (request(&s(4), unsubscribe("main")), 11),
        (Input::Disconnect(s(3)), 20), // releases "map"; resumable until 1020
        (Input::Disconnect(s(4)), 30), // resumable until 1030
        (Input::Disconnect(s(5)), 30),
        (Input::Leave(s(5)), 31),
        (publish(&s(2), None), 32),
    ];
    let mut scratch = Room::new(
        "r".into(),
        "Room R".into(),
        a.config().clone(),
        a.epoch(),
        1,
    );
    scratch.seed_entity(Some("seed".into()), json!({"at": 0}));
    for (input, now) in &before {
        let (ta, _) = apply(&mut a, input, *now);
        let (ts, _) = apply(&mut scratch, input, *now);
        assert_eq!(ta, ts, "two fresh replicas agree");
    }
    assert_eq!(a.connected(), 2);
    assert_eq!(a.sessions(), 4);
    assert!(a.log().first_seq() > Some(1), "the history is already cut");

    let json = export_json(&a);
    assert_eq!(json, export_json(&scratch));
    let mut b = import_json(&json);
    assert_eq!(export_json(&b), json, "import then export is the identity");
    assert_eq!((b.id(), b.name(), b.created_at()), ("r", "Room R", 1));
    assert_eq!((b.epoch(), b.seq()), (a.epoch(), a.seq()));
    assert_eq!(b.config(), a.config());
    assert_eq!((b.connected(), b.sessions()), (2, 4));
    assert_eq!(b.member(&s(1)).unwrap().sink, Some(1));
    assert_eq!(b.member(&s(3)).unwrap().sink, None);
    assert_eq!(b.members_info(), a.members_info());
    assert_eq!(b.next_deadline(), a.next_deadline());
    assert_eq!(b.log().len(), a.log().len());
    for (x, y) in a.log().last(usize::MAX).zip(b.log().last(usize::MAX)) {
        assert_eq!(**x, **y);
    }
    assert_eq!(b.entities().get("e2").unwrap().data, data);

    let side = Input::Publish {
        session: s(2),
        channel: "side".into(),
        id: Some("z".into()),
        echo: true,
        reply_to: Some(3),
    };
    let patch = Op::EntityPatch {
        id: "e2".into(),
        data: Map::from_iter([("w".into(), Value::from(1.5e-300))]),
        version: None,
    };
    let delete = Op::EntityDelete {
        id: "e1".into(),
        version: None,
    };
    let after: Vec<(Input, Millis)> = vec![
        (publish(&s(1), Some("c")), 100), // duplicate: acknowledged, not ordered
        (publish(&s(1), Some("a")), 100), // forgotten: ordered again
        (publish(&s(1), Some("e")), 101), // the window forgets "b"
        (publish(&s(1), Some("b")), 101),
        (publish(&s(1), Some("e")), 102), // duplicate
        (publish(&s(2), Some("a")), 102), // duplicate of s2's own
        (side, 103),
        (request(&s(2), acquire("doc", None)), 104), // held by s1: conflict
        (request(&s(2), set("e2", json!(1), Some(1))), 105), // stale version
        (request(&s(2), set("e2", json!({"v": 3}), Some(2))), 105),
        (request(&s(1), patch), 106),
        (request(&s(1), delete), 106),
        (request(&s(1), create(json!(null))), 107), // e4: the counter carried over
        (request(&s(1), renew("doc", Some(100))), 108), // until 208
        (Input::Disconnect(s(2)), 200),             // releases "pad"
        (Input::Tick, 208),                         // "doc" expires
        (request(&s(1), acquire("doc", Some(50))), 209), // a fresh fencing token
        (Input::Tick, 1_020),                       // s3's window ends, s4's does not
        (resuming(30, "t3", 5), 1_021),             // gone: a new session
        (resuming(40, "t4", 26), 1_029),            // the missed events follow
        (resuming(41, "t2", 2), 1_029),             // history truncated
        (resuming(42, "t1", 10_000), 1_029),        // ahead of the room
        (joining(6, &["side"]), 1_030),
        (publish(&s(6), Some("a")), 1_031),
        (Input::Leave(s(1)), 1_032),
        (Input::Tick, 5_000),
    ];
    run_both(&mut a, &mut b, &after);
    assert_eq!(export_json(&a), export_json(&b));
    let odd = |sink: &u32| sink % 2 == 1;
    assert_eq!(a.connected_sessions(odd), b.connected_sessions(odd));
    assert_eq!(a.close(), b.close());
}

#[test]
fn a_disconnected_member_stays_resumable_after_import() {
    let mut a = room();
    join(&mut a, 1, 0);
    join(&mut a, 2, 0);
    say(&mut a, 1, 1); // 3
    a.disconnect(&sid(2), 2); // 4
    say(&mut a, 1, 3); // 5
    let mut b = import_json(&export_json(&a));
    for r in [&mut a, &mut b] {
        let j = r.join(params(9), resume("t2", 3), 4).unwrap();
        assert!(j.frame.resumed);
        assert_eq!(seqs(&j.missed), vec![5], "not its own departure");
        assert_eq!(r.member(&sid(2)).unwrap().sink, Some(9));
        assert_eq!(r.connected(), 2);
    }
}

#[test]
fn connected_sessions_are_sorted_and_filtered() {
    let mut r = room();
    for n in [9, 10, 2, 21, 1, 4, 3] {
        join(&mut r, n, 0);
    }
    r.disconnect(&sid(4), 1);
    let even = |sink: &u32| sink.is_multiple_of(2);
    // session ids sort as strings
    assert_eq!(r.connected_sessions(even), ["s10", "s2"]);
    assert_eq!(
        r.connected_sessions(|_| true),
        ["s1", "s10", "s2", "s21", "s3", "s9"]
    );
    assert!(r.connected_sessions(|s| *s > 100).is_empty());
    assert_eq!(r.close(), [1, 10, 2, 21, 3, 9], "closed in session order");
}

#[test]
fn eviction_ties_go_to_the_smallest_session_id() {
    // Many rooms: each has its own HashMap seed, so a tie broken by
    // iteration order would not pick the same session in all of them.
    for _ in 0..32 {
        let mut r = room_with(RoomConfig {
            max_members: 2,
            ..RoomConfig::default()
        });
        for n in [5, 3, 4, 6] {
            join(&mut r, n, 0);
            r.disconnect(&sid(n), if n == 6 { 2 } else { 1 });
        }
        // 4 sessions held, twice max_members: the next join evicts the
        // oldest disconnected one; s3, s4 and s5 dropped at the same time.
        join(&mut r, 7, 3);
        assert!(r.member(&sid(3)).is_none());
        assert_eq!(r.sessions(), 4);
        join(&mut r, 8, 3);
        assert!(r.member(&sid(4)).is_none());
        assert!(r.member(&sid(5)).is_some());
    }
}

// ---------------------------------------------------------------------------
// Random inputs: independent replicas, and one that joins late from a state.

#[derive(Debug, Clone)]
enum Act {
    Join {
        slot: usize,
        channels: u8,
    },
    Resume {
        slot: usize,
        back: u8,
    },
    Publish {
        slot: usize,
        channel: usize,
        id: Option<u8>,
        echo: bool,
        reply_back: Option<u8>,
    },
    Create {
        slot: usize,
        tiny: bool,
    },
    Set {
        slot: usize,
        entity: u8,
        version: Option<u8>,
    },
    Patch {
        slot: usize,
        entity: u8,
    },
    Delete {
        slot: usize,
        entity: u8,
    },
    Acquire {
        slot: usize,
        object: u8,
        ttl: Option<u16>,
    },
    Renew {
        slot: usize,
        object: u8,
    },
    Release {
        slot: usize,
        object: u8,
    },
    Subscribe {
        slot: usize,
        channel: usize,
    },
    Unsubscribe {
        slot: usize,
        channel: usize,
    },
    Disconnect {
        slot: usize,
    },
    NodeDown(u32),
    Leave {
        slot: usize,
    },
    Tick,
    /// `space.move` (with a speed) or `space.jump` (without), in the small
    /// plane of [`small_space`].
    Move {
        slot: usize,
        to: [f64; 2],
        speed: Option<f64>,
    },
}

/// A plane where the six slots meet often: calls, dwells and areas of
/// interest change within a few steps.
fn small_space() -> SpaceConfig {
    SpaceConfig {
        width: 400.0,
        height: 400.0,
        proximity_radius: 60.0,
        hysteresis: 1.2,
        min_dwell_ms: 300,
        aoi_radius: 150.0,
        tick_ms: 50,
        direct_in_proximity_only: false,
    }
}

const CHANNELS: [&str; 3] = ["main", "a", "b"];

fn act() -> impl Strategy<Value = Act> {
    let slot = 0..6usize;
    prop_oneof![
        4 => (slot.clone(), 0..8u8).prop_map(|(slot, channels)| Act::Join { slot, channels }),
        3 => (slot.clone(), 0..8u8).prop_map(|(slot, back)| Act::Resume { slot, back }),
        6 => (
            slot.clone(),
            0..3usize,
            proptest::option::of(0..5u8),
            any::<bool>(),
            proptest::option::weighted(0.2, 0..3u8),
        )
            .prop_map(|(slot, channel, id, echo, reply_back)| Act::Publish {
                slot,
                channel,
                id,
                echo,
                reply_back
            }),
        2 => (slot.clone(), any::<bool>()).prop_map(|(slot, tiny)| Act::Create { slot, tiny }),
        2 => (slot.clone(), 1..5u8, proptest::option::of(0..4u8))
            .prop_map(|(slot, entity, version)| Act::Set { slot, entity, version }),
        1 => (slot.clone(), 1..5u8).prop_map(|(slot, entity)| Act::Patch { slot, entity }),
        1 => (slot.clone(), 1..5u8).prop_map(|(slot, entity)| Act::Delete { slot, entity }),
        3 => (slot.clone(), 1..4u8, proptest::option::of(1..3000u16))
            .prop_map(|(slot, object, ttl)| Act::Acquire { slot, object, ttl }),
        1 => (slot.clone(), 1..4u8).prop_map(|(slot, object)| Act::Renew { slot, object }),
        1 => (slot.clone(), 1..4u8).prop_map(|(slot, object)| Act::Release { slot, object }),
        1 => (slot.clone(), 0..3usize).prop_map(|(slot, channel)| Act::Subscribe { slot, channel }),
        1 => (slot.clone(), 0..3usize)
            .prop_map(|(slot, channel)| Act::Unsubscribe { slot, channel }),
        3 => slot.clone().prop_map(|slot| Act::Disconnect { slot }),
        1 => (0..2u32).prop_map(Act::NodeDown),
        1 => slot.clone().prop_map(|slot| Act::Leave { slot }),
        2 => Just(Act::Tick),
        4 => (
            slot,
            (-20.0..420.0f64, -20.0..420.0f64),
            proptest::option::of(20.0..600.0f64)
        )
            .prop_map(|(slot, (x, y), speed)| Act::Move { slot, to: [x, y], speed }),
    ]
}

/// Time steps: mostly none or tiny, so that many things share a millisecond
/// (where ties are broken), sometimes past leases and resume windows.
fn step() -> impl Strategy<Value = u16> {
    prop_oneof![4 => Just(0u16), 4 => 1..20u16, 1 => 200..4000u16]
}

fn config() -> impl Strategy<Value = RoomConfig> {
    (
        1..12usize,
        1..4usize,
        0..4usize,
        1..4usize,
        // Long windows too, so that disconnected sessions pile up to evictions.
        prop_oneof![0..3000u64, Just(1_000_000)],
        any::<bool>(),
    )
        .prop_map(
            |(history_size, max_members, dedup_window, max_channels, resume_window_ms, space)| {
                RoomConfig {
                    history_size,
                    max_members,
                    dedup_window,
                    max_channels,
                    resume_window_ms,
                    default_lock_ttl_ms: 500,
                    max_lock_ttl_ms: 2_000,
                    space: space.then(small_space),
                    ..RoomConfig::default()
                }
            },
        )
}

/// Turns generated actions into log inputs: which session a slot is, its token.
#[derive(Default)]
struct World {
    slots: HashMap<usize, (String, String)>,
    next: u32,
}

impl World {
    fn session(&self, slot: usize) -> String {
        self.slots
            .get(&slot)
            .map_or_else(|| "nobody".into(), |(s, _)| s.clone())
    }

    fn input(&mut self, act: Act, seq: u64) -> Input {
        let req = |w: &World, slot: usize, op: Op| Input::Request {
            session: w.session(slot),
            op,
        };
        match act {
            Act::Join { channels, .. } => {
                self.next += 1;
                Input::Join {
                    n: self.next,
                    channels: CHANNELS
                        .iter()
                        .enumerate()
                        .filter(|(i, _)| channels & (1 << i) != 0)
                        .map(|(_, c)| (*c).to_owned())
                        .collect(),
                }
            }
            Act::Resume { slot, back } => {
                self.next += 1;
                Input::Resume {
                    n: self.next,
                    token: self
                        .slots
                        .get(&slot)
                        .map_or_else(|| "unknown".into(), |(_, t)| t.clone()),
                    last_seq: seq.saturating_sub(back.into()),
                }
            }
            Act::Publish {
                slot,
                channel,
                id,
                echo,
                reply_back,
            } => Input::Publish {
                session: self.session(slot),
                channel: CHANNELS[channel].into(),
                id: id.map(|i| format!("m{i}")),
                echo,
                reply_to: reply_back.map(|b| seq.saturating_sub(b.into())),
            },
            Act::Create { slot, tiny } => {
                let data = if tiny {
                    json!({"x": 1.0715660391465826e-75})
                } else {
                    json!(slot)
                };
                req(self, slot, create(data))
            }
            Act::Set {
                slot,
                entity,
                version,
            } => req(
                self,
                slot,
                Op::EntitySet {
                    id: format!("e{entity}"),
                    data: json!({"by": slot, "big": u64::MAX - u64::from(entity)}),
                    version: version.map(u64::from),
                },
            ),
            Act::Patch { slot, entity } => req(
                self,
                slot,
                Op::EntityPatch {
                    id: format!("e{entity}"),
                    data: Map::from_iter([(format!("k{slot}"), Value::from(-2.5e-308))]),
                    version: None,
                },
            ),
            Act::Delete { slot, entity } => req(
                self,
                slot,
                Op::EntityDelete {
                    id: format!("e{entity}"),
                    version: None,
                },
            ),
            Act::Acquire { slot, object, ttl } => req(
                self,
                slot,
                acquire(&format!("o{object}"), ttl.map(u64::from)),
            ),
            Act::Renew { slot, object } => req(self, slot, renew(&format!("o{object}"), None)),
            Act::Release { slot, object } => req(self, slot, release(&format!("o{object}"))),
            Act::Subscribe { slot, channel } => req(self, slot, subscribe(CHANNELS[channel])),
            Act::Unsubscribe { slot, channel } => req(self, slot, unsubscribe(CHANNELS[channel])),
            Act::Disconnect { slot } => Input::Disconnect(self.session(slot)),
            Act::NodeDown(parity) => Input::NodeDown(parity),
            Act::Leave { slot } => Input::Leave(self.session(slot)),
            Act::Tick => Input::Tick,
            Act::Move { slot, to, speed } => req(
                self,
                slot,
                match speed {
                    Some(speed) => Op::SpaceMove { to, speed },
                    None => Op::SpaceJump { to },
                },
            ),
        }
    }
}

/// Feeds `acts` to two replicas built independently, and from step `late`
/// on to a third one that loaded the first one's exported state (a node that
/// starts hosting the room), checking that all answers and states agree.
fn run_replicas(
    config: RoomConfig,
    acts: Vec<(Act, u16)>,
    late: usize,
) -> Result<(), TestCaseError> {
    // Built one after the other: each HashMap gets its own seed.
    let mut a: Room<u32> = Room::new("r".into(), "R".into(), config.clone(), 3, 0);
    let mut b: Room<u32> = Room::new("r".into(), "R".into(), config, 3, 0);
    let mut c: Option<Room<u32>> = None;
    let mut w = World::default();
    let mut now: Millis = 0;
    for (i, (act, dt)) in acts.into_iter().enumerate() {
        if i == late {
            let json = export_json(&a);
            prop_assert_eq!(&json, &export_json(&b));
            c = Some(import_json(&json));
        }
        now += Millis::from(dt);
        let slot = match act {
            Act::Join { slot, .. } | Act::Resume { slot, .. } => Some(slot),
            _ => None,
        };
        let input = w.input(act, a.seq());
        let (ta, joined) = apply(&mut a, &input, now);
        let (tb, _) = apply(&mut b, &input, now);
        prop_assert_eq!(&ta, &tb);
        if let Some(c) = c.as_mut() {
            let (tc, _) = apply(c, &input, now);
            prop_assert_eq!(&ta, &tc);
        }
        if let (Some(slot), Some(j)) = (slot, joined) {
            w.slots.insert(slot, j);
        }
    }
    let json = export_json(&a);
    prop_assert_eq!(&json, &export_json(&b));
    let closed = a.close();
    prop_assert_eq!(&closed, &b.close());
    if let Some(c) = c.as_mut() {
        prop_assert_eq!(&json, &export_json(c));
        prop_assert_eq!(&closed, &c.close());
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn replicas_fed_the_same_inputs_agree(
        config in config(),
        acts in proptest::collection::vec((act(), step()), 1..80),
        late in any::<proptest::sample::Index>(),
    ) {
        let late = late.index(acts.len());
        run_replicas(config, acts, late)?;
    }
}
