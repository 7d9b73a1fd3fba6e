//! Property tests: random operation sequences against the room's invariants.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;

use crate::common::*;
use plaza_core::{
    HistoryEntry, JoinParams, Joined, Millis, PublishParams, Resume, Room, RoomConfig, RoomLog,
    TokenBucket,
};
use plaza_protocol::client::Op;
use plaza_protocol::server::ResyncReason;
use plaza_protocol::ErrorCode;
use proptest::prelude::*;
use serde_json::json;

const CHANNELS: [&str; 5] = ["main", "a", "b", "c", ""];

fn channel_list(mask: u8) -> Vec<String> {
    CHANNELS
        .iter()
        .enumerate()
        .filter(|(i, _)| mask & (1 << i) != 0)
        .map(|(_, c)| (*c).to_owned())
        .collect()
}

/// Checks the returned events continue the room's order and stores them.
struct Order {
    next: u64,
    all: Vec<Arc<HistoryEntry>>,
}

impl Order {
    fn new() -> Self {
        Order {
            next: 1,
            all: Vec::new(),
        }
    }

    fn take(&mut self, events: &[Arc<HistoryEntry>]) -> Result<(), TestCaseError> {
        for e in events {
            prop_assert_eq!(e.seq, self.next, "events must be gap-free");
            let v = frame(e);
            prop_assert_eq!(v["type"].as_str(), Some("event"));
            prop_assert_eq!(v["seq"].as_u64(), Some(e.seq));
            prop_assert_eq!(v["ts"].as_u64(), Some(e.ts));
            prop_assert_eq!(v["from"].as_str(), e.from.as_deref());
            self.next += 1;
            self.all.push(e.clone());
        }
        Ok(())
    }
}

// ---------------------------------------------------------------------------
// Ordering, bounds and bookkeeping under arbitrary operations.

#[derive(Debug, Clone)]
enum Act {
    Join {
        slot: usize,
        channels: u8,
    },
    Resume {
        slot: usize,
        back: u8,
        ahead: bool,
    },
    Publish {
        slot: usize,
        channel: usize,
        echo: bool,
        id: Option<u8>,
        reply_back: Option<u8>,
    },
    Create {
        slot: usize,
    },
    Set {
        slot: usize,
        entity: u8,
        version: Option<u8>,
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
        ttl: Option<u16>,
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
    Leave {
        slot: usize,
    },
    Tick,
}

fn act() -> impl Strategy<Value = Act> {
    let slot = 0..5usize;
    prop_oneof![
        3 => (slot.clone(), 0..32u8).prop_map(|(slot, channels)| Act::Join { slot, channels }),
        2 => (slot.clone(), 0..6u8, proptest::bool::weighted(0.1))
            .prop_map(|(slot, back, ahead)| Act::Resume { slot, back, ahead }),
        6 => (
            slot.clone(),
            0..5usize,
            any::<bool>(),
            proptest::option::of(0..6u8),
            proptest::option::weighted(0.2, 0..4u8),
        )
            .prop_map(|(slot, channel, echo, id, reply_back)| Act::Publish {
                slot,
                channel,
                echo,
                id,
                reply_back
            }),
        2 => slot.clone().prop_map(|slot| Act::Create { slot }),
        2 => (slot.clone(), 1..5u8, proptest::option::of(0..4u8))
            .prop_map(|(slot, entity, version)| Act::Set { slot, entity, version }),
        1 => (slot.clone(), 1..5u8).prop_map(|(slot, entity)| Act::Delete { slot, entity }),
        3 => (slot.clone(), 1..5u8, proptest::option::of(0..3000u16))
            .prop_map(|(slot, object, ttl)| Act::Acquire { slot, object, ttl }),
        1 => (slot.clone(), 1..5u8, proptest::option::of(0..3000u16))
            .prop_map(|(slot, object, ttl)| Act::Renew { slot, object, ttl }),
        1 => (slot.clone(), 1..5u8).prop_map(|(slot, object)| Act::Release { slot, object }),
        1 => (slot.clone(), 0..5usize).prop_map(|(slot, channel)| Act::Subscribe { slot, channel }),
        1 => (slot.clone(), 0..5usize)
            .prop_map(|(slot, channel)| Act::Unsubscribe { slot, channel }),
        2 => slot.clone().prop_map(|slot| Act::Disconnect { slot }),
        1 => slot.prop_map(|slot| Act::Leave { slot }),
        1 => Just(Act::Tick),
    ]
}

fn config() -> impl Strategy<Value = RoomConfig> {
    (1..12usize, 1..5usize, 0..4usize, 1..5usize, 0..4000u64).prop_map(
        |(history_size, max_members, dedup_window, max_channels, resume_window_ms)| RoomConfig {
            history_size,
            max_members,
            dedup_window,
            max_channels,
            resume_window_ms,
            default_lock_ttl_ms: 500,
            max_lock_ttl_ms: 2_000,
            ..RoomConfig::default()
        },
    )
}

#[derive(Default)]
struct World {
    /// Per slot, the session id and token it last got.
    slots: HashMap<usize, (String, String)>,
    /// Every session id ever handed out.
    ids: Vec<String>,
    /// (session, client id) -> seq of the message that used it.
    published: HashMap<(String, String), u64>,
    counter: u32,
    sink: u32,
}

impl World {
    fn fresh(&mut self, slot: usize, channels: Vec<String>) -> JoinParams<u32> {
        self.counter += 1;
        self.sink += 1;
        let session = format!("s{}", self.counter);
        self.ids.push(session.clone());
        JoinParams {
            session,
            resume_token: format!("t{}", self.counter),
            name: format!("slot{slot}"),
            platform: "prop".into(),
            user: None,
            channels,
            ticket: false,
            resume_only: None,
            policy: None,
            history: None,
            sink: self.sink,
        }
    }

    fn session(&self, slot: usize) -> String {
        self.slots
            .get(&slot)
            .map(|(s, _)| s.clone())
            .unwrap_or_else(|| "never-joined".into())
    }
}

fn check_joined(
    room: &Room<u32>,
    w: &mut World,
    slot: usize,
    last_seq: Option<u64>,
    j: &Joined<u32>,
    order: &mut Order,
) -> Result<(), TestCaseError> {
    order.take(&j.events)?;
    prop_assert_eq!(j.frame.seq, room.seq());
    prop_assert_eq!(j.frame.epoch, 7);
    prop_assert!(room
        .member(&j.frame.session)
        .is_some_and(|m| m.sink.is_some()));
    prop_assert!(j.frame.members.iter().any(|m| m.session == j.frame.session));
    prop_assert_eq!(j.frame.members.len(), room.connected());
    prop_assert_eq!(
        j.frame.resumed,
        j.frame.reason.is_none() && last_seq.is_some()
    );
    prop_assert_eq!(j.frame.snapshot.is_some(), !j.frame.resumed);
    if j.frame.resumed {
        let last = last_seq.expect("resumed");
        let missed = seqs(&j.missed);
        prop_assert!(missed.windows(2).all(|p| p[0] < p[1]));
        prop_assert!(missed.iter().all(|s| *s > last && *s <= room.seq()));
    } else {
        prop_assert!(j.missed.is_empty());
    }
    if j.frame.reason == Some(ResyncReason::SessionExpired) || last_seq.is_none() {
        prop_assert!(j.replaced.is_none());
        prop_assert_eq!(j.events.len(), 1);
    }
    w.slots.insert(
        slot,
        (j.frame.session.clone(), j.frame.resume_token.clone()),
    );
    Ok(())
}

fn run_ordering(cfg: RoomConfig, acts: Vec<(Act, u16)>) -> Result<(), TestCaseError> {
    let history_size = cfg.history_size;
    let mut room: Room<u32> = Room::new("r".into(), "R".into(), cfg, 7, 0);
    let mut w = World::default();
    let mut order = Order::new();
    let mut now: Millis = 0;
    for (a, dt) in acts {
        now += Millis::from(dt);
        match a {
            Act::Join { slot, channels } => {
                let p = w.fresh(slot, channel_list(channels));
                if let Ok(j) = room.join(p, None, now) {
                    check_joined(&room, &mut w, slot, None, &j, &mut order)?;
                }
            }
            Act::Resume { slot, back, ahead } => {
                let token = w
                    .slots
                    .get(&slot)
                    .map(|(_, t)| t.clone())
                    .unwrap_or_else(|| "unknown".into());
                let last = if ahead {
                    room.seq() + 1
                } else {
                    room.seq().saturating_sub(back.into())
                };
                let p = w.fresh(slot, Vec::new());
                let r = Resume {
                    token,
                    last_seq: last,
                };
                match room.join(p, Some(r), now) {
                    Ok(j) => {
                        if ahead && j.frame.reason != Some(ResyncReason::SessionExpired) {
                            prop_assert_eq!(j.frame.reason, Some(ResyncReason::EpochChanged));
                        }
                        check_joined(&room, &mut w, slot, Some(last), &j, &mut order)?;
                    }
                    Err(e) => prop_assert_eq!(e.code, ErrorCode::RoomFull),
                }
            }
            Act::Publish {
                slot,
                channel,
                echo,
                id,
                reply_back,
            } => {
                let s = w.session(slot);
                let id = id.map(|i| format!("m{i}"));
                let p = PublishParams {
                    channel: CHANNELS[channel].to_owned(),
                    event: "e".into(),
                    data: raw("[1]"),
                    id: id.clone(),
                    topic: None,
                    reply_to: reply_back.map(|b| room.seq().saturating_sub(b.into())),
                    echo,
                };
                let before = room.seq();
                match room.publish(&s, p, now) {
                    Ok(out) => match out.entry {
                        Some(e) => {
                            prop_assert_eq!(out.seq, e.seq);
                            order.take(&[e])?;
                            if let Some(id) = id {
                                w.published.insert((s, id), out.seq);
                            }
                        }
                        None => {
                            prop_assert_eq!(room.seq(), before);
                            let id = id.expect("only messages with an id are duplicates");
                            prop_assert_eq!(w.published.get(&(s, id)), Some(&out.seq));
                        }
                    },
                    Err(e) => {
                        prop_assert!(
                            [ErrorCode::NotJoined, ErrorCode::InvalidFrame].contains(&e.code),
                            "{:?}",
                            e
                        );
                    }
                }
            }
            Act::Tick => {
                order.take(&room.tick(now))?;
                prop_assert!(room.next_deadline().is_none_or(|d| d > now));
            }
            Act::Disconnect { slot } => {
                order.take(&room.disconnect(&w.session(slot), now))?;
            }
            Act::Leave { slot } => {
                order.take(&room.leave(&w.session(slot), now))?;
            }
            other => {
                let (slot, op) = match other {
                    Act::Create { slot } => (slot, create(json!({"n": 1}))),
                    Act::Set {
                        slot,
                        entity,
                        version,
                    } => (
                        slot,
                        Op::EntitySet {
                            id: format!("e{entity}"),
                            data: json!(entity),
                            version: version.map(u64::from),
                        },
                    ),
                    Act::Delete { slot, entity } => (
                        slot,
                        Op::EntityDelete {
                            id: format!("e{entity}"),
                            version: None,
                        },
                    ),
                    Act::Acquire { slot, object, ttl } => {
                        (slot, acquire(&format!("e{object}"), ttl.map(u64::from)))
                    }
                    Act::Renew { slot, object, ttl } => {
                        (slot, renew(&format!("e{object}"), ttl.map(u64::from)))
                    }
                    Act::Release { slot, object } => (slot, release(&format!("e{object}"))),
                    Act::Subscribe { slot, channel } => (slot, subscribe(CHANNELS[channel])),
                    Act::Unsubscribe { slot, channel } => (slot, unsubscribe(CHANNELS[channel])),
                    _ => unreachable!(),
                };
                let before = room.seq();
                match room.request(&w.session(slot), op, now) {
                    Ok(out) => order.take(&out.events)?,
                    Err(_) => prop_assert_eq!(room.seq(), before),
                }
            }
        }
        // invariants after every step
        prop_assert_eq!(room.seq(), order.next - 1);
        let log = room.log();
        prop_assert!(log.len() <= history_size.max(1));
        prop_assert_eq!(log.len() as u64, room.seq().min(history_size.max(1) as u64));
        if let Some(first) = log.first_seq() {
            prop_assert_eq!(first, room.seq() - log.len() as u64 + 1);
            let held: Vec<u64> = log
                .since(first - 1)
                .expect("reaches")
                .map(|e| e.seq)
                .collect();
            let want: Vec<u64> = (first..=room.seq()).collect();
            prop_assert_eq!(held, want);
            for e in log.last(log.len()) {
                prop_assert!(Arc::ptr_eq(e, &order.all[(e.seq - 1) as usize]));
            }
        }
        let with_sink = w
            .ids
            .iter()
            .filter(|s| room.member(s).is_some_and(|m| m.sink.is_some()))
            .count();
        prop_assert_eq!(room.connected(), with_sink);
        prop_assert!(room.connected() <= room.config().max_members);
        let held = w.ids.iter().filter(|s| room.member(s).is_some()).count();
        prop_assert_eq!(room.sessions(), held);
        prop_assert_eq!(room.members_info().len(), with_sink);
        for s in &w.ids {
            if let Some(m) = room.member(s) {
                prop_assert!(m.channels.len() <= room.config().max_channels);
                prop_assert!(m.channels.iter().all(|c| !c.is_empty()));
            }
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn seqs_stay_gap_free_and_history_bounded(
        cfg in config(),
        acts in proptest::collection::vec((act(), 0..700u16), 1..80),
    ) {
        run_ordering(cfg, acts)?;
    }
}

// ---------------------------------------------------------------------------
// Resume: a client that records what it receives ends with exactly what it
// should see.

#[derive(Debug, Clone)]
enum Other {
    Join {
        slot: usize,
        channels: u8,
    },
    Publish {
        slot: usize,
        channel: usize,
        echo: bool,
    },
    Create {
        slot: usize,
    },
    Acquire {
        slot: usize,
        object: u8,
    },
    Subscribe {
        slot: usize,
        channel: usize,
        on: bool,
    },
    Disconnect {
        slot: usize,
    },
    Resume {
        slot: usize,
    },
    Leave {
        slot: usize,
    },
}

#[derive(Debug, Clone)]
enum Step {
    Other(Other),
    APublish {
        channel: usize,
        echo: bool,
        id: Option<u8>,
    },
    ACreate,
    AAcquire {
        object: u8,
    },
    ARelease {
        object: u8,
    },
    ADisconnect {
        lose: u8,
    },
    AResume {
        lose: u8,
    },
    Tick {
        dt: u16,
    },
}

fn step() -> impl Strategy<Value = Step> {
    let slot = 1..5usize;
    let other = prop_oneof![
        2 => (slot.clone(), 0..16u8).prop_map(|(slot, channels)| Other::Join { slot, channels }),
        6 => (slot.clone(), 0..4usize, any::<bool>())
            .prop_map(|(slot, channel, echo)| Other::Publish { slot, channel, echo }),
        1 => slot.clone().prop_map(|slot| Other::Create { slot }),
        2 => (slot.clone(), 0..3u8).prop_map(|(slot, object)| Other::Acquire { slot, object }),
        1 => (slot.clone(), 0..4usize, any::<bool>())
            .prop_map(|(slot, channel, on)| Other::Subscribe { slot, channel, on }),
        1 => slot.clone().prop_map(|slot| Other::Disconnect { slot }),
        1 => slot.clone().prop_map(|slot| Other::Resume { slot }),
        1 => slot.prop_map(|slot| Other::Leave { slot }),
    ];
    prop_oneof![
        10 => other.prop_map(Step::Other),
        3 => (0..4usize, any::<bool>(), proptest::option::of(0..3u8))
            .prop_map(|(channel, echo, id)| Step::APublish { channel, echo, id }),
        1 => Just(Step::ACreate),
        2 => (0..3u8).prop_map(|object| Step::AAcquire { object }),
        1 => (0..3u8).prop_map(|object| Step::ARelease { object }),
        2 => (0..4u8).prop_map(|lose| Step::ADisconnect { lose }),
        2 => (0..4u8).prop_map(|lose| Step::AResume { lose }),
        1 => (0..400u16).prop_map(|dt| Step::Tick { dt }),
    ]
}

/// What the tracked client should receive, from the event's JSON: messages on
/// its channels (its own only when echoed), every other event not caused by
/// it, and the news that its own locks ended when it disconnected.
fn should_see(e: &HistoryEntry, me: &str, channels: &[String], echoed: &HashSet<u64>) -> bool {
    let v = frame(e);
    let mine = v["from"].as_str() == Some(me);
    match v["kind"].as_str().expect("kind") {
        "message" => {
            // A message on main does not name its channel.
            let channel = v["channel"]
                .as_str()
                .unwrap_or(plaza_protocol::DEFAULT_CHANNEL);
            channels.iter().any(|c| c == channel) && (!mine || echoed.contains(&e.seq))
        }
        // its own joins and leaves are answers to it, not events
        "presence.join" | "presence.leave" => !mine,
        // its own state changes come in responses, or among the missed
        // events if the connection lost the response
        _ => true,
    }
}

struct Tracked {
    session: String,
    token: String,
    channels: Vec<String>,
    joined_at: u64,
    received: Vec<u64>,
    /// The client's sync point after the last (re)connect: it holds
    /// everything up to here, by events or by snapshot.
    synced: u64,
    covered: Vec<(u64, u64)>,
    echoed: HashSet<u64>,
    connected: bool,
}

impl Tracked {
    fn last_seq(&self) -> u64 {
        self.received.last().copied().unwrap_or(0).max(self.synced)
    }

    fn lose(&mut self, n: u8) {
        for _ in 0..n {
            match self.received.last() {
                Some(s) if *s > self.synced => {
                    self.received.pop();
                }
                _ => break,
            }
        }
    }
}

fn deliver(room: &Room<u32>, a: &mut Tracked, events: &[Arc<HistoryEntry>]) {
    for e in events {
        room.for_each_recipient(e, |s, _| {
            if s == a.session {
                a.received.push(e.seq);
            }
        });
    }
}

fn a_resume(
    room: &mut Room<u32>,
    a: &mut Tracked,
    order: &mut Order,
    lose: u8,
    now: Millis,
    sink: u32,
) -> Result<(), TestCaseError> {
    a.lose(lose);
    let last = a.last_seq();
    let p = JoinParams {
        session: format!("unused{sink}"),
        resume_token: format!("unused{sink}"),
        name: "a".into(),
        platform: "prop".into(),
        user: None,
        channels: Vec::new(),
        ticket: false,
        resume_only: None,
        policy: None,
        history: None,
        sink,
    };
    let r = Resume {
        token: a.token.clone(),
        last_seq: last,
    };
    let j = room
        .join(p, Some(r), now)
        .expect("the tracked client may always resume");
    prop_assert_eq!(&j.frame.session, &a.session);
    prop_assert_eq!(&j.frame.channels, &a.channels);
    prop_assert_eq!(j.replaced.is_some(), a.connected);
    prop_assert_eq!(j.events.is_empty(), a.connected);
    match j.frame.reason {
        None => {
            prop_assert!(j.frame.resumed);
            a.received.extend(j.missed.iter().map(|e| e.seq));
        }
        Some(ResyncReason::HistoryTruncated) => {
            prop_assert!(j.frame.snapshot.is_some());
            prop_assert!(room.log().first_seq().is_some_and(|f| f > last + 1));
            a.covered.push((last, j.frame.seq));
        }
        Some(other) => prop_assert!(false, "unexpected resync {:?}", other),
    }
    a.synced = if j.frame.reason.is_some() {
        j.frame.seq
    } else {
        last
    };
    a.connected = true;
    order.take(&j.events)?;
    deliver(room, a, &j.events);
    Ok(())
}

fn run_resume(history_size: usize, a_channels: u8, steps: Vec<Step>) -> Result<(), TestCaseError> {
    let cfg = RoomConfig {
        history_size,
        resume_window_ms: u64::MAX / 4,
        default_lock_ttl_ms: 300,
        ..RoomConfig::default()
    };
    let mut room: Room<u32> = Room::new("r".into(), "R".into(), cfg, 7, 0);
    let mut order = Order::new();
    let mut now: Millis = 0;
    let mut sink = 100;
    let channels: Vec<String> = channel_list(a_channels & 0b1110);
    let j = room
        .join(
            JoinParams {
                session: "A".into(),
                resume_token: "tA".into(),
                name: "a".into(),
                platform: "prop".into(),
                user: None,
                channels,
                ticket: false,
                resume_only: None,
                policy: None,
                history: None,
                sink: 0,
            },
            None,
            now,
        )
        .unwrap();
    order.take(&j.events)?;
    if a_channels & 1 == 0 {
        ok_request(&mut room, "A", unsubscribe("main"), now);
    }
    let mut a = Tracked {
        session: "A".into(),
        token: "tA".into(),
        channels: room.member("A").unwrap().channels.clone(),
        joined_at: j.frame.seq,
        received: Vec::new(),
        synced: j.frame.seq,
        covered: Vec::new(),
        echoed: HashSet::new(),
        connected: true,
    };
    // other clients: slot -> (session, token), connected
    let mut others: HashMap<usize, (String, String, bool)> = HashMap::new();
    let mut counter = 0;
    for st in steps {
        now += 1;
        let asked = matches!(
            st,
            Step::ACreate | Step::AAcquire { .. } | Step::ARelease { .. }
        );
        let events: Vec<Arc<HistoryEntry>> = match st {
            Step::Tick { dt } => {
                now += Millis::from(dt);
                room.tick(now)
            }
            Step::APublish { channel, echo, id } => {
                let p = PublishParams {
                    channel: CHANNELS[channel].into(),
                    event: "e".into(),
                    data: None,
                    id: id.map(|i| format!("a{i}")),
                    topic: None,
                    reply_to: None,
                    echo,
                };
                match room.publish("A", p, now) {
                    Ok(out) => match out.entry {
                        Some(e) => {
                            if echo {
                                a.echoed.insert(e.seq);
                            }
                            vec![e]
                        }
                        None => Vec::new(),
                    },
                    Err(e) => {
                        prop_assert!(!a.connected);
                        prop_assert_eq!(e.code, ErrorCode::NotJoined);
                        Vec::new()
                    }
                }
            }
            Step::ACreate => request_events(&mut room, "A", create(json!({})), now),
            Step::AAcquire { object } => {
                request_events(&mut room, "A", acquire(&format!("o{object}"), None), now)
            }
            Step::ARelease { object } => {
                request_events(&mut room, "A", release(&format!("o{object}")), now)
            }
            Step::ADisconnect { lose } => {
                let ev = room.disconnect("A", now);
                if a.connected {
                    a.lose(lose);
                }
                a.connected = false;
                ev
            }
            Step::AResume { lose } => {
                sink += 1;
                a_resume(&mut room, &mut a, &mut order, lose, now, sink)?;
                Vec::new()
            }
            Step::Other(o) => match o {
                Other::Join { slot, channels } => {
                    if others.get(&slot).is_some_and(|(_, _, c)| *c) {
                        Vec::new()
                    } else {
                        counter += 1;
                        sink += 1;
                        let p = JoinParams {
                            session: format!("o{counter}"),
                            resume_token: format!("ot{counter}"),
                            name: "o".into(),
                            platform: "prop".into(),
                            user: None,
                            channels: channel_list(channels & 0b1110),
                            ticket: false,
                            resume_only: None,
                            policy: None,
                            history: None,
                            sink,
                        };
                        let j = room.join(p, None, now).unwrap();
                        others.insert(slot, (j.frame.session, j.frame.resume_token, true));
                        j.events
                    }
                }
                Other::Resume { slot } => match others.get(&slot).cloned() {
                    Some((s, t, _)) if room.member(&s).is_some() => {
                        sink += 1;
                        let p = JoinParams {
                            session: format!("x{sink}"),
                            resume_token: format!("x{sink}"),
                            name: "o".into(),
                            platform: "prop".into(),
                            user: None,
                            channels: Vec::new(),
                            ticket: false,
                            resume_only: None,
                            policy: None,
                            history: None,
                            sink,
                        };
                        let r = Resume {
                            token: t.clone(),
                            last_seq: room.seq(),
                        };
                        let j = room.join(p, Some(r), now).unwrap();
                        prop_assert_eq!(&j.frame.session, &s);
                        others.insert(slot, (s, t, true));
                        j.events
                    }
                    _ => Vec::new(),
                },
                Other::Publish {
                    slot,
                    channel,
                    echo,
                } => {
                    let s = others.get(&slot).map(|o| o.0.clone()).unwrap_or_default();
                    let mut p = msg(CHANNELS[channel], "e");
                    p.echo = echo;
                    room.publish(&s, p, now)
                        .ok()
                        .and_then(|o| o.entry)
                        .into_iter()
                        .collect()
                }
                Other::Create { slot } => {
                    let s = others.get(&slot).map(|o| o.0.clone()).unwrap_or_default();
                    request_events(&mut room, &s, create(json!(1)), now)
                }
                Other::Acquire { slot, object } => {
                    let s = others.get(&slot).map(|o| o.0.clone()).unwrap_or_default();
                    request_events(&mut room, &s, acquire(&format!("o{object}"), None), now)
                }
                Other::Subscribe { slot, channel, on } => {
                    let s = others.get(&slot).map(|o| o.0.clone()).unwrap_or_default();
                    let op = if on {
                        subscribe(CHANNELS[channel])
                    } else {
                        unsubscribe(CHANNELS[channel])
                    };
                    request_events(&mut room, &s, op, now)
                }
                Other::Disconnect { slot } => match others.get_mut(&slot) {
                    Some(o) => {
                        o.2 = false;
                        room.disconnect(&o.0.clone(), now)
                    }
                    None => Vec::new(),
                },
                Other::Leave { slot } => match others.remove(&slot) {
                    Some(o) => room.leave(&o.0, now),
                    None => Vec::new(),
                },
            },
        };
        order.take(&events)?;
        deliver(&room, &mut a, &events);
        // A's response carries the seq of the change it asked for, after
        // the events ordered before it.
        if asked {
            let answered = events.iter().filter(|e| e.from.as_deref() == Some("A"));
            a.received.extend(answered.map(|e| e.seq));
        }
    }
    if !a.connected {
        sink += 1;
        a_resume(&mut room, &mut a, &mut order, 0, now, sink)?;
    }
    let expected: Vec<u64> = order
        .all
        .iter()
        .filter(|e| e.seq > a.joined_at)
        .filter(|e| !a.covered.iter().any(|(lo, hi)| e.seq > *lo && e.seq <= *hi))
        .filter(|e| should_see(e, &a.session, &a.channels, &a.echoed))
        .map(|e| e.seq)
        .collect();
    prop_assert_eq!(&a.received, &expected);
    Ok(())
}

fn ok_request(room: &mut Room<u32>, s: &str, op: Op, now: Millis) {
    room.request(s, op, now).expect("request");
}

fn request_events(room: &mut Room<u32>, s: &str, op: Op, now: Millis) -> Vec<Arc<HistoryEntry>> {
    room.request(s, op, now)
        .map(|o| o.events)
        .unwrap_or_default()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn a_resuming_client_sees_everything_once(
        a_channels in 0..16u8,
        steps in proptest::collection::vec(step(), 1..100),
    ) {
        run_resume(100_000, a_channels, steps)?;
    }

    #[test]
    fn a_resuming_client_with_short_history_sees_everything_once_or_resyncs(
        history_size in 1..8usize,
        a_channels in 0..16u8,
        steps in proptest::collection::vec(step(), 1..100),
    ) {
        run_resume(history_size, a_channels, steps)?;
    }
}

// ---------------------------------------------------------------------------
// Leases: at most one live holder per object, strictly increasing tokens.

#[derive(Debug, Clone)]
enum LockAct {
    Acquire { who: usize, object: u8, ttl: u16 },
    Renew { who: usize, object: u8, ttl: u16 },
    Release { who: usize, object: u8 },
    Write { who: usize, object: u8 },
    Disconnect { who: usize },
    Reconnect { who: usize },
    Tick,
}

fn lock_act() -> impl Strategy<Value = LockAct> {
    let who = 0..4usize;
    let object = 1..4u8;
    prop_oneof![
        4 => (who.clone(), object.clone(), 0..120u16)
            .prop_map(|(who, object, ttl)| LockAct::Acquire { who, object, ttl }),
        2 => (who.clone(), object.clone(), 0..120u16)
            .prop_map(|(who, object, ttl)| LockAct::Renew { who, object, ttl }),
        2 => (who.clone(), object.clone()).prop_map(|(who, object)| LockAct::Release { who, object }),
        2 => (who.clone(), object).prop_map(|(who, object)| LockAct::Write { who, object }),
        1 => who.clone().prop_map(|who| LockAct::Disconnect { who }),
        1 => who.prop_map(|who| LockAct::Reconnect { who }),
        2 => Just(LockAct::Tick),
    ]
}

#[derive(Debug, Clone, PartialEq)]
struct Lease {
    owner: String,
    token: u64,
    expires_at: Millis,
}

fn run_leases(acts: Vec<(LockAct, u8)>) -> Result<(), TestCaseError> {
    let cfg = RoomConfig {
        default_lock_ttl_ms: 50,
        max_lock_ttl_ms: 100,
        ..RoomConfig::default()
    };
    let mut room: Room<u32> = Room::new("r".into(), "R".into(), cfg, 7, 0);
    let mut order = Order::new();
    for n in 0..4u32 {
        order.take(&join(&mut room, n, 0).events)?;
    }
    for _ in 1..4 {
        order.take(&room.request(&sid(0), create(json!(0)), 0).unwrap().events)?;
    }
    // the model: object -> lease, kept by its own rules
    let mut model: BTreeMap<String, Lease> = BTreeMap::new();
    let mut last_token = 0u64;
    // disconnected sessions and when they went
    let mut gone: BTreeMap<String, Millis> = BTreeMap::new();
    let mut now: Millis = 0;
    for (a, dt) in acts {
        now += Millis::from(dt);
        let live =
            |m: &BTreeMap<String, Lease>, o: &str| m.get(o).filter(|l| l.expires_at > now).cloned();
        let events = match a {
            LockAct::Acquire { who, object, ttl } => {
                let (s, o) = (sid(who as u32), format!("e{object}"));
                let res = room.request(&s, acquire(&o, Some(ttl.into())), now);
                let connected = room.member(&s).is_some_and(|m| m.sink.is_some());
                match res {
                    Ok(out) => {
                        prop_assert!(ttl > 0 && connected);
                        let holder = live(&model, &o);
                        prop_assert!(holder.as_ref().is_none_or(|l| l.owner == s));
                        let token = out.result["lock"]["token"].as_u64().unwrap();
                        prop_assert!(token > last_token, "token {} after {}", token, last_token);
                        last_token = token;
                        let expected_events = if model.get(&o).is_some_and(|l| l.expires_at <= now)
                        {
                            2
                        } else {
                            1
                        };
                        prop_assert_eq!(out.events.len(), expected_events);
                        model.insert(
                            o,
                            Lease {
                                owner: s,
                                token,
                                expires_at: now + u64::from(ttl).min(100),
                            },
                        );
                        out.events
                    }
                    Err(e) => {
                        let want = if !connected {
                            ErrorCode::NotJoined
                        } else if ttl == 0 {
                            ErrorCode::InvalidArgs
                        } else {
                            prop_assert!(live(&model, &o).is_some_and(|l| l.owner != s));
                            ErrorCode::LockHeld
                        };
                        prop_assert_eq!(e.code, want);
                        Vec::new()
                    }
                }
            }
            LockAct::Renew { who, object, ttl } => {
                let (s, o) = (sid(who as u32), format!("e{object}"));
                let res = room.request(&s, renew(&o, Some(ttl.into())), now);
                let held = live(&model, &o).is_some_and(|l| l.owner == s);
                match res {
                    Ok(out) => {
                        prop_assert!(held && ttl > 0);
                        let l = model.get_mut(&o).unwrap();
                        prop_assert_eq!(out.result["lock"]["token"].as_u64(), Some(l.token));
                        l.expires_at = now + u64::from(ttl).min(100);
                        out.events
                    }
                    Err(e) => {
                        prop_assert!(
                            !held || ttl == 0 || e.code == ErrorCode::NotJoined,
                            "{:?}",
                            e
                        );
                        Vec::new()
                    }
                }
            }
            LockAct::Release { who, object } => {
                let (s, o) = (sid(who as u32), format!("e{object}"));
                let held = live(&model, &o).is_some_and(|l| l.owner == s);
                match room.request(&s, release(&o), now) {
                    Ok(out) => {
                        prop_assert!(held);
                        let l = model.remove(&o).unwrap();
                        prop_assert_eq!(out.result["token"].as_u64(), Some(l.token));
                        out.events
                    }
                    Err(e) => {
                        prop_assert!(!held || e.code == ErrorCode::NotJoined);
                        Vec::new()
                    }
                }
            }
            LockAct::Write { who, object } => {
                let (s, o) = (sid(who as u32), format!("e{object}"));
                let op = Op::EntitySet {
                    id: o.clone(),
                    data: json!(now),
                    version: None,
                };
                let connected = room.member(&s).is_some_and(|m| m.sink.is_some());
                match room.request(&s, op, now) {
                    Ok(out) => {
                        prop_assert!(live(&model, &o).is_none_or(|l| l.owner == s));
                        out.events
                    }
                    Err(e) => {
                        if connected {
                            prop_assert_eq!(e.code, ErrorCode::LockHeld);
                            prop_assert!(live(&model, &o).is_some_and(|l| l.owner != s));
                        } else {
                            prop_assert_eq!(e.code, ErrorCode::NotJoined);
                        }
                        Vec::new()
                    }
                }
            }
            LockAct::Disconnect { who } => {
                let s = sid(who as u32);
                let ev = room.disconnect(&s, now);
                if !ev.is_empty() {
                    gone.insert(s.clone(), now);
                }
                // Lapsed leases (anyone's) end as expired, the leaver's
                // live ones as disconnected.
                let mut released: Vec<(String, String, u64, String)> = ev
                    .iter()
                    .filter(|e| kind(e) == "lock.released")
                    .map(|e| {
                        let v = frame(e);
                        (
                            v["reason"].as_str().unwrap().to_owned(),
                            v["object"].as_str().unwrap().to_owned(),
                            v["token"].as_u64().unwrap(),
                            v["owner"].as_str().unwrap().to_owned(),
                        )
                    })
                    .collect();
                released.sort();
                let mut want: Vec<(String, String, u64, String)> = model
                    .iter()
                    .filter_map(|(o, l)| {
                        let reason = if l.expires_at <= now {
                            "expired"
                        } else if l.owner == s {
                            "disconnected"
                        } else {
                            return None;
                        };
                        Some((reason.to_owned(), o.clone(), l.token, l.owner.clone()))
                    })
                    .collect();
                want.sort();
                if ev.is_empty() {
                    // Not connected: nothing happened at all.
                    want.clear();
                }
                prop_assert_eq!(released, want);
                if !ev.is_empty() {
                    model.retain(|_, l| l.owner != s && l.expires_at > now);
                }
                ev
            }
            LockAct::Reconnect { who } => {
                let n = who as u32;
                if room.member(&sid(n)).is_some_and(|m| m.sink.is_none()) {
                    let j = room
                        .join(params(n), resume(&format!("t{n}"), 0), now)
                        .unwrap();
                    gone.remove(&sid(n));
                    prop_assert_eq!(&j.frame.session, &sid(n));
                    j.events
                } else {
                    Vec::new()
                }
            }
            LockAct::Tick => {
                let ev = room.tick(now);
                let mut expired: Vec<(String, u64)> = ev
                    .iter()
                    .map(|e| {
                        let v = frame(e);
                        assert_eq!(v["kind"], "lock.released");
                        assert_eq!(v["reason"], "expired");
                        (
                            v["object"].as_str().unwrap().to_owned(),
                            v["token"].as_u64().unwrap(),
                        )
                    })
                    .collect();
                expired.sort();
                let want: Vec<(String, u64)> = model
                    .iter()
                    .filter(|(_, l)| l.expires_at <= now)
                    .map(|(o, l)| (o.clone(), l.token))
                    .collect();
                prop_assert_eq!(expired, want);
                model.retain(|_, l| l.expires_at > now);
                ev
            }
        };
        order.take(&events)?;
        // the room's live locks are exactly the model's
        let live_model: Vec<(String, String, u64, Millis)> = model
            .iter()
            .filter(|(_, l)| l.expires_at > now)
            .map(|(o, l)| (o.clone(), l.owner.clone(), l.token, l.expires_at))
            .collect();
        let live_room: Vec<(String, String, u64, Millis)> = room
            .snapshot(now)
            .locks
            .into_iter()
            .map(|l| (l.object, l.owner, l.token, l.expires_at))
            .collect();
        prop_assert_eq!(&live_room, &live_model);
        let objects: HashSet<&String> = live_room.iter().map(|l| &l.0).collect();
        prop_assert_eq!(objects.len(), live_room.len(), "one live holder per object");
        // every live holder is connected
        for l in &live_room {
            prop_assert!(room.member(&l.1).is_some_and(|m| m.sink.is_some()));
        }
        let soonest = model
            .values()
            .map(|l| l.expires_at)
            .chain(gone.values().map(|t| t + 120_000))
            .min();
        prop_assert_eq!(room.next_deadline(), soonest);
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn leases_have_one_holder_and_growing_tokens(
        acts in proptest::collection::vec((lock_act(), 0..40u8), 1..120),
    ) {
        run_leases(acts)?;
    }
}

// ---------------------------------------------------------------------------
// Smaller parts.

proptest! {
    #[test]
    fn log_since_matches_a_naive_model(
        capacity in 1..10usize,
        start in 0..5u64,
        len in 0..25u64,
        last_seq in 0..40u64,
    ) {
        let mut log = RoomLog::new(capacity);
        let mut all = Vec::new();
        for seq in start + 1..=start + len {
            let e = Arc::new(HistoryEntry {
                seq, ts: 0, from: None, channel: None, echo: false, replay_to_sender: false,
                topic: None, reply_to: None, scope: Default::default(), frame: bytes::Bytes::new(),
                wire: Default::default(),
            });
            log.push(e);
            all.push(seq);
        }
        let held: Vec<u64> = all.iter().rev().take(capacity).rev().copied().collect();
        prop_assert_eq!(log.len(), held.len());
        let got = log.since(last_seq).map(|it| it.map(|e| e.seq).collect::<Vec<_>>());
        let reaches = held.first().is_none_or(|f| last_seq + 1 >= *f);
        let want = reaches.then(|| held.iter().copied().filter(|s| *s > last_seq).collect::<Vec<_>>());
        prop_assert_eq!(got, want);
    }

    #[test]
    fn a_bucket_never_grants_more_than_burst_plus_rate(
        per_second in 0..2_000u32,
        burst in 0..20u32,
        start in 0..1_000_000u64,
        gaps in proptest::collection::vec(0..300u64, 1..200),
    ) {
        let mut b = TokenBucket::new(per_second, burst, start);
        let mut now = start;
        let mut granted = 0u64;
        for g in gaps {
            now += g;
            if b.try_take(now) {
                granted += 1;
            }
            let limit = u64::from(burst.max(1)) + u64::from(per_second) * (now - start) / 1_000;
            prop_assert!(granted <= limit, "{} > {}", granted, limit);
        }
    }

    #[test]
    fn a_drained_bucket_refills_exactly_at_its_rate(
        per_second in 1..1_000u32,
        polls in 1..50u64,
    ) {
        // drained and then polled every millisecond, a bucket grants exactly
        // per_second tokens a second, no matter the rounding
        let mut b = TokenBucket::new(per_second, 1_000, 0);
        prop_assert_eq!((0..1_001).filter(|_| b.try_take(0)).count(), 1_000);
        let horizon = polls * 100;
        let granted = (1..=horizon).filter(|t| b.try_take(*t)).count() as u64;
        prop_assert_eq!(granted, u64::from(per_second) * horizon / 1_000);
    }
}
