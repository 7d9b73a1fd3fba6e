//! Delivery policies, property-tested: whatever members publish, however
//! time passes, policies change or the connection drops and resumes, a
//! member with a policy gets every event meant for it exactly once, in
//! increasing seq; what must go at once goes at once; nothing is held past
//! its bounds.

use std::collections::BTreeSet;
use std::sync::Arc;

use plaza_core::policy::{DeliveryPolicy, Field, Filter, MatchOp, PolicyUpdate};
use plaza_core::{Delivery, Held, HistoryEntry, Millis, Room, RoomConfig};
use plaza_protocol::client::Op;
use proptest::prelude::*;
use serde_json::json;

use crate::common::{join, msg, params, resume, room_with, sid};

/// Ann (member 1) has the policy; bob (2) and cat (3) have none.
const ANN: u32 = 1;
const TOPICS: [&str; 3] = ["xmpp", "irc", "web"];

#[derive(Debug, Clone)]
enum Act {
    /// Member `from` publishes on `TOPICS[topic]`, maybe replying to the
    /// `reply`-th message published so far, maybe echoed.
    Publish {
        from: u32,
        topic: usize,
        reply: Option<usize>,
        echo: bool,
    },
    /// Time passes, then held events that are due go out.
    Wait(Millis),
    /// Ann changes her policy.
    Update(PolicyUpdate),
    /// Ann's connection drops; she resumes with the last seq she received.
    Reconnect,
}

fn filter_on(topic: usize) -> Filter {
    Filter {
        id: format!("f{topic}"),
        enabled: true,
        field: Field::Topic,
        op: MatchOp::Equals(json!(TOPICS[topic])),
    }
}

fn policy() -> impl Strategy<Value = DeliveryPolicy> {
    (
        proptest::option::of(0..3usize),
        proptest::option::of(1..400u64),
        proptest::option::of(1..6u32),
        any::<bool>(),
    )
        .prop_filter("a policy needs a bound", |(_, d, h, _)| {
            d.is_some() || h.is_some()
        })
        .prop_map(|(f, max_delay_ms, max_held, aggregate)| DeliveryPolicy {
            filters: f.into_iter().map(filter_on).collect(),
            max_delay_ms,
            max_held,
            aggregate,
        })
}

fn update() -> impl Strategy<Value = PolicyUpdate> {
    (
        proptest::option::of(0..3usize),
        proptest::option::of(proptest::option::of(1..400u64)),
        proptest::option::of(proptest::option::of(1..6u32)),
        any::<bool>(),
    )
        .prop_map(|(add, max_delay_ms, max_held, disable)| PolicyUpdate {
            add: add.into_iter().map(filter_on).collect(),
            disable: add
                .filter(|_| disable)
                .map(|t| format!("f{t}"))
                .into_iter()
                .collect(),
            max_delay_ms,
            max_held,
            ..PolicyUpdate::default()
        })
}

fn act() -> impl Strategy<Value = Act> {
    prop_oneof![
        6 => (1..4u32, 0..3usize, proptest::option::of(0..20usize), any::<bool>())
            .prop_map(|(from, topic, reply, echo)| Act::Publish { from, topic, reply, echo }),
        3 => (0..300u64).prop_map(Act::Wait),
        1 => update().prop_map(Act::Update),
        1 => Just(Act::Reconnect),
    ]
}

/// What ann's connection received, frame by frame.
#[derive(Default)]
struct Ann {
    frames: Vec<Vec<Arc<HistoryEntry>>>,
}

impl Ann {
    fn take(&mut self, d: Delivery<'_>) {
        match d {
            Delivery::Event(e) => self.frames.push(vec![e.clone()]),
            Delivery::Flush { events, aggregate } => {
                if aggregate {
                    self.frames.push(events);
                } else {
                    self.frames.extend(events.into_iter().map(|e| vec![e]));
                }
            }
        }
    }

    fn seqs(&self) -> Vec<u64> {
        self.frames.iter().flatten().map(|e| e.seq).collect()
    }
}

/// Routes `events` as the server does: everyone's deliveries, ann's kept;
/// what ann is a recipient of is `owed` to her.
fn route(
    room: &Room<u32>,
    held: &mut Held,
    events: &[Arc<HistoryEntry>],
    now: Millis,
    ann: &mut Ann,
    owed: &mut BTreeSet<u64>,
) {
    for e in events {
        room.for_each_recipient(e, |_, sink| {
            if *sink == ANN {
                owed.insert(e.seq);
            }
        });
        room.route(
            e,
            held,
            now,
            |_| true,
            |_, sink, d| {
                if *sink == ANN {
                    ann.take(d);
                }
            },
        );
    }
    room.route_evicted(held, |_, sink, d| {
        if *sink == ANN {
            ann.take(d);
        }
    });
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]
    #[test]
    fn a_policy_delays_but_never_loses_reorders_or_repeats(
        first in policy(),
        acts in proptest::collection::vec(act(), 1..60),
        history in 4..40usize,
    ) {
        let config = RoomConfig { history_size: history, ..RoomConfig::default() };
        let mut room = room_with(config);
        let mut held = Held::default();
        let mut ann = Ann::default();
        let mut now: Millis = 1_000;
        let joined = room
            .join(plaza_core::JoinParams { policy: Some(first.clone()), ..params(ANN) }, None, now)
            .unwrap();
        let token = joined.frame.resume_token.clone();
        let mut last_seq = joined.frame.seq;
        room.route_joined(&sid(ANN), joined.client_seq, &mut held);
        let mut owed = BTreeSet::new();
        for n in [2, 3] {
            let j = join(&mut room, n, now);
            route(&room, &mut held, &j.events, now, &mut ann, &mut owed);
        }
        let mut policy = first;
        // The highest seq of ann's acks: her client's last seq counts them.
        let mut acked = 0;
        let mut published: Vec<(u64, u32)> = Vec::new();
        for act in acts {
            match act {
                Act::Publish { from, topic, reply, echo } => {
                    let reply_to = reply.and_then(|i| published.get(i)).map(|(s, _)| *s);
                    let p = plaza_core::PublishParams {
                        topic: Some(TOPICS[topic].into()),
                        reply_to,
                        echo: echo && from == ANN,
                        ..msg("main", "chat")
                    };
                    let out = room.publish(&sid(from), p, now).unwrap();
                    let e = out.entry.unwrap();
                    let seq = e.seq;
                    published.push((seq, from));
                    let before = ann.seqs().len();
                    route(&room, &mut held, &[e], now, &mut ann, &mut owed);
                    let to_ann = from != ANN || echo;
                    if from == ANN {
                        // Her ack comes next: what she held goes first.
                        room.route_flush(&sid(ANN), &mut held, |_, sink, d| {
                            if *sink == ANN {
                                ann.take(d);
                            }
                        });
                        prop_assert_eq!(held.held(&sid(ANN)).count(), 0);
                        acked = acked.max(seq);
                    }
                    // While the message answered is in the history.
                    let replies_to_ann = reply_to.is_some_and(|r| {
                        room.log().get(r).is_some()
                            && published.iter().any(|(s, f)| *s == r && *f == ANN)
                    });
                    let matches = policy.filters.iter().any(|f| f.enabled && f.id == format!("f{topic}"));
                    if to_ann && (from == ANN || replies_to_ann || matches) {
                        prop_assert!(
                            ann.seqs()[before..].contains(&seq),
                            "seq {seq} must go at once (from {from}, reply to ann {replies_to_ann}, match {matches})"
                        );
                    }
                }
                Act::Wait(ms) => {
                    now += ms;
                    room.route_due(&mut held, now, |_, sink, d| {
                        if *sink == ANN {
                            ann.take(d);
                        }
                    });
                }
                Act::Update(u) => {
                    if let Ok(out) = room.request(&sid(ANN), Op::PolicyUpdate(u), now) {
                        policy = serde_json::from_value(out.result["policy"].clone()).unwrap();
                        room.route_replanned(&sid(ANN), &mut held, now, |_, sink, d| {
                            if *sink == ANN {
                                ann.take(d);
                            }
                        });
                    }
                }
                Act::Reconnect => {
                    // What was held is dropped with the connection.
                    let was_holding = held.held(&sid(ANN)).next().is_some();
                    held.forget(&sid(ANN));
                    if let Some(s) = ann.seqs().last() {
                        last_seq = last_seq.max(*s);
                    }
                    last_seq = last_seq.max(acked);
                    let events = room.disconnect(&sid(ANN), now);
                    route(&room, &mut held, &events, now, &mut ann, &mut owed);
                    let j = room
                        .join(params(ANN), resume(&token, last_seq), now)
                        .unwrap();
                    if j.frame.reason.is_some() {
                        // Nothing reached her for longer than the history (her own
                        // messages went by): a resync, as without a policy; never
                        // while she was holding something.
                        prop_assert!(!was_holding, "holding made her resume fail");
                        // What she got before the resync still came in order,
                        // never twice, and only what was meant for her; what
                        // she missed the resync tells her of (not exactly once).
                        let got = ann.seqs();
                        prop_assert!(got.windows(2).all(|w| w[0] < w[1]), "seqs increase: {got:?}");
                        let got_set: BTreeSet<u64> = got.iter().copied().collect();
                        prop_assert!(got_set.is_subset(&owed), "only events meant for her: {got:?}");
                        return Ok(());
                    }
                    for e in &j.missed {
                        ann.frames.push(vec![e.clone()]);
                    }
                    room.route_joined(&sid(ANN), j.client_seq, &mut held);
                    route(&room, &mut held, &j.events, now, &mut ann, &mut owed);
                }
            }
            // While she holds something the history keeps everything after
            // her client's last seq, with room for one more event.
            let client_last = ann.seqs().last().copied().unwrap_or(0).max(acked).max(last_seq);
            if held.held(&sid(ANN)).next().is_some() {
                let log = room.log();
                let full = u64::from(log.len() >= log.capacity());
                prop_assert!(
                    log.first_seq().unwrap() + full <= client_last + 1,
                    "the history begins at {:?}, her client is at {client_last}",
                    log.first_seq()
                );
            }
            // Bounds: volume never reached while held; nothing due is held.
            let n = held.held(&sid(ANN)).count();
            if let Some(max) = policy.max_held {
                prop_assert!(n < max as usize, "{n} held, max {max}");
            }
            if let Some(at) = held.next_deadline() {
                prop_assert!(at > now, "a flush due at {at} still pending at {now}");
            }
        }
        // Policy cleared: what is held goes out.
        room.request(&sid(ANN), Op::PolicyClear, now).unwrap();
        room.route_replanned(&sid(ANN), &mut held, now, |_, sink, d| {
            if *sink == ANN {
                ann.take(d);
            }
        });
        let got = ann.seqs();
        prop_assert!(got.windows(2).all(|w| w[0] < w[1]), "seqs increase: {got:?}");
        let got_set: BTreeSet<u64> = got.iter().copied().collect();
        prop_assert_eq!(got_set, owed, "every event meant for her, once");
    }
}

/// The room checks a policy's payload pointers as earlier versions did: it
/// runs on every replica of a cluster, whose versions must decide a join's
/// record alike. A `~` escape RFC 6901 does not know is taken there (a
/// node refuses it in a new join or update before the record is written),
/// and a member holding such a filter can still change its policy.
#[test]
fn a_policy_held_with_a_stray_tilde_is_taken_and_can_still_change() {
    let mut room = room_with(RoomConfig::default());
    let stray = |id: &str| Filter {
        id: id.into(),
        enabled: true,
        field: Field::Payload("/a~2b".into()),
        op: MatchOp::Exists,
    };
    let mut p = params(ANN);
    p.policy = Some(DeliveryPolicy {
        filters: vec![stray("p")],
        max_delay_ms: None,
        max_held: Some(5),
        aggregate: true,
    });
    room.join(p, None, 0)
        .expect("a record an earlier node wrote");
    let update = |v: serde_json::Value| Op::PolicyUpdate(serde_json::from_value(v).unwrap());
    let out = room
        .request(&sid(ANN), update(json!({"max_held": 10})), 1)
        .expect("a bound changes");
    assert_eq!(out.result["policy"]["max_held"], 10, "{}", out.result);
    assert_eq!(
        out.result["policy"]["filters"][0]["field"]["payload"],
        "/a~2b"
    );
    let out = room
        .request(&sid(ANN), update(json!({"disable": ["p"]})), 2)
        .expect("the filter is switched off");
    assert_eq!(out.result["policy"]["filters"][0]["enabled"], false);
    // What the room still refuses, it refuses as before.
    let e = room
        .request(&sid(ANN), update(json!({"max_held": null})), 3)
        .unwrap_err();
    assert_eq!(e.code, plaza_protocol::ErrorCode::InvalidArgs);
}
