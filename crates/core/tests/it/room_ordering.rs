//! Sequencing, history bounds, event encoding and visibility.

use std::sync::Arc;

use crate::common::*;
use plaza_core::{HistoryEntry, RoomConfig};
use plaza_protocol::client::Op;
use plaza_protocol::server::ServerFrame;
use serde_json::json;

#[test]
fn every_event_gets_the_next_seq() {
    let mut r = room();
    assert_eq!(r.seq(), 0);
    assert!(r.log().is_empty());
    let mut all: Vec<Arc<HistoryEntry>> = Vec::new();
    all.extend(join(&mut r, 1, 10).events);
    all.extend(join(&mut r, 2, 11).events);
    all.push(say(&mut r, 1, 12));
    all.extend(ok(&mut r, 2, create(json!({"x": 1})), 13).events);
    all.extend(ok(&mut r, 1, acquire("e1", Some(100)), 14).events);
    all.extend(ok(&mut r, 1, release("e1"), 15).events);
    all.extend(ok(&mut r, 1, acquire("e1", Some(100)), 16).events);
    // disconnect: lock released + presence.leave
    let d = r.disconnect(&sid(1), 17);
    assert_eq!(d.len(), 2);
    all.extend(d);
    all.extend(join(&mut r, 3, 18).events);
    all.extend(r.leave(&sid(3), 19));
    assert_consecutive(&all, 1);
    assert_eq!(r.seq(), 11);
    assert_eq!(r.log().len(), 11);
    // the log holds exactly the returned entries, shared not copied
    let logged: Vec<_> = r.log().last(100).cloned().collect();
    assert_eq!(logged.len(), all.len());
    for (a, b) in logged.iter().zip(&all) {
        assert!(Arc::ptr_eq(a, b));
    }
    let kinds: Vec<String> = all.iter().map(|e| kind(e)).collect();
    assert_eq!(
        kinds,
        [
            "presence.join",
            "presence.join",
            "message",
            "entity.created",
            "lock.acquired",
            "lock.released",
            "lock.acquired",
            "lock.released",
            "presence.leave",
            "presence.join",
            "presence.leave",
        ]
    );
    let ts: Vec<u64> = all.iter().map(|e| e.ts).collect();
    assert_eq!(ts, [10, 11, 12, 13, 14, 15, 16, 17, 17, 18, 19]);
}

#[test]
fn refused_operations_do_not_consume_seqs() {
    let mut r = room();
    join(&mut r, 1, 0);
    join(&mut r, 2, 0);
    let before = r.seq();
    assert!(r
        .request(
            &sid(1),
            Op::EntityDelete {
                id: "e9".into(),
                version: None
            },
            1
        )
        .is_err());
    assert!(r.request(&sid(1), release("nothing"), 1).is_err());
    assert!(r.request(&sid(9), create(json!(1)), 1).is_err());
    assert!(r.publish(&sid(9), msg("main", "x"), 1).is_err());
    let mut p = msg("main", "x");
    p.reply_to = Some(0);
    assert!(r.publish(&sid(1), p, 1).is_err());
    // channel requests never produce events
    assert!(ok(&mut r, 1, subscribe("extra"), 1).events.is_empty());
    assert!(ok(&mut r, 1, unsubscribe("extra"), 1).events.is_empty());
    // disconnecting or leaving twice is a no-op
    assert_eq!(r.disconnect(&sid(2), 2).len(), 1);
    assert!(r.disconnect(&sid(2), 3).is_empty());
    assert!(r.disconnect("nobody", 3).is_empty());
    assert!(r.leave("nobody", 3).is_empty());
    assert_eq!(r.seq(), before + 1);
    assert_eq!(say(&mut r, 1, 4).seq, before + 2);
}

#[test]
fn history_keeps_the_last_history_size_events() {
    let mut r = room_with(RoomConfig {
        history_size: 5,
        ..RoomConfig::default()
    });
    join(&mut r, 1, 0);
    join(&mut r, 2, 0);
    for i in 0..10 {
        say(&mut r, 1 + i % 2, i.into());
        assert!(r.log().len() <= 5);
    }
    assert_eq!(r.seq(), 12);
    assert_eq!(r.log().len(), 5);
    assert_eq!(r.log().capacity(), 5);
    assert_eq!(r.log().first_seq(), Some(8));
    let since = |l: u64| {
        r.log()
            .since(l)
            .map(|it| it.map(|e| e.seq).collect::<Vec<_>>())
    };
    assert_eq!(since(7), Some(vec![8, 9, 10, 11, 12]));
    assert_eq!(since(10), Some(vec![11, 12]));
    assert_eq!(since(12), Some(vec![]));
    assert_eq!(since(6), None);
    assert_eq!(since(0), None);
    assert_eq!(
        r.log().last(2).map(|e| e.seq).collect::<Vec<_>>(),
        vec![11, 12]
    );
}

#[test]
fn presence_join_frame_encodes_the_member() {
    let mut r = room();
    let j = join(&mut r, 1, 1234);
    assert_eq!(j.events.len(), 1);
    assert!(j.missed.is_empty());
    assert!(j.replaced.is_none());
    let e = &j.events[0];
    assert_eq!((e.seq, e.ts), (1, 1234));
    assert_eq!(e.from.as_deref(), Some("s1"));
    assert_eq!(e.channel, None);
    assert_eq!(
        frame(e),
        json!({
            "type": "event", "room": "r", "seq": 1, "ts": 1234, "from": "s1",
            "kind": "presence.join",
            "member": {"session": "s1", "name": "user1", "platform": "test"}
        })
    );
}

#[test]
fn joined_frame_describes_the_room() {
    let mut r = room();
    let e = r.seed_entity(Some("node".into()), json!({"a": 1}));
    assert_eq!(e, "e1");
    assert_eq!(r.seq(), 0, "seeding orders no event");
    join(&mut r, 2, 0);
    ok(&mut r, 2, acquire("e1", Some(500)), 10);
    let j = r.join(params_ch(1, &["extra", "main"]), None, 20).unwrap();
    let f = &j.frame;
    assert_eq!(f.room, "r");
    assert_eq!(f.session, "s1");
    assert_eq!(f.resume_token, "t1");
    assert_eq!(f.epoch, 7);
    assert_eq!(f.seq, 3);
    assert_eq!(f.seq, r.seq());
    assert!(!f.resumed);
    assert_eq!(f.reason, None);
    assert_eq!(f.channels, vec!["main", "extra"]);
    let members: Vec<&str> = f.members.iter().map(|m| m.session.as_str()).collect();
    assert_eq!(members, ["s1", "s2"]);
    let snap = f.snapshot.as_ref().expect("a new member gets a snapshot");
    assert_eq!(snap.entities.len(), 1);
    assert_eq!(snap.entities[0].id, "e1");
    assert_eq!(snap.entities[0].kind.as_deref(), Some("node"));
    assert_eq!(snap.entities[0].data, json!({"a": 1}));
    assert_eq!(snap.locks.len(), 1);
    assert_eq!(snap.locks[0].owner, "s2");
    assert_eq!(snap.locks[0].expires_at, 510);
    let ServerFrame::Joined(_) = j.server_frame() else {
        panic!("a fresh join answers `joined`")
    };
    let v: serde_json::Value = serde_json::from_slice(&j.server_frame().encode()).unwrap();
    assert_eq!(v["type"], "joined");
    assert_eq!(v["resumed"], false);
    assert!(v.get("reason").is_none());
    // members_info lists connected members only
    r.disconnect(&sid(2), 30);
    let infos: Vec<String> = r.members_info().into_iter().map(|m| m.session).collect();
    assert_eq!(infos, ["s1"]);
    assert_eq!(r.id(), "r");
    assert_eq!(r.name(), "Room R");
    assert_eq!(r.epoch(), 7);
    assert_eq!(r.created_at(), 0);
}

#[test]
fn message_frame_carries_every_field() {
    let mut r = room();
    join(&mut r, 1, 0);
    join(&mut r, 2, 0);
    let p = plaza_core::PublishParams {
        channel: "main".into(),
        event: "chat".into(),
        data: raw(r#"{"text": "hi", "n": [1, 2]}"#),
        id: Some("m-1".into()),
        topic: Some("t".into()),
        reply_to: Some(2),
        echo: true,
    };
    let out = r.publish(&sid(1), p, 55).unwrap();
    assert_eq!(out.seq, 3);
    let e = out.entry.unwrap();
    assert_eq!(e.seq, 3);
    assert_eq!(e.channel.as_deref(), Some("main"));
    assert_eq!(e.topic.as_deref(), Some("t"));
    assert_eq!(e.reply_to, Some(2));
    assert!(e.echo);
    assert_eq!(
        frame(&e),
        json!({
            "type": "event", "room": "r", "seq": 3, "ts": 55, "from": "s1",
            "kind": "message", "event": "chat",
            "data": {"text": "hi", "n": [1, 2]}, "topic": "t", "reply_to": 2, "id": "m-1"
        }),
        "every field, but `channel` only when it is not main"
    );
    // data is relayed untouched, byte for byte
    let text = std::str::from_utf8(&e.frame).unwrap();
    assert!(
        text.contains(r#""data":{"text": "hi", "n": [1, 2]}"#),
        "{text}"
    );
    // optional fields are omitted
    let bare = say(&mut r, 2, 56);
    let v = frame(&bare);
    for field in ["data", "topic", "reply_to", "id"] {
        assert!(v.get(field).is_none(), "{field} in {v}");
    }
}

#[test]
fn leave_and_disconnect_frames_give_the_reason() {
    let mut r = room();
    join(&mut r, 1, 0);
    join(&mut r, 2, 0);
    let d = r.disconnect(&sid(1), 5);
    assert_eq!(
        frame(&d[0]),
        json!({"type": "event", "room": "r", "seq": 3, "ts": 5, "from": "s1",
               "kind": "presence.leave", "session": "s1", "reason": "disconnected"})
    );
    let l = r.leave(&sid(2), 6);
    assert_eq!(l.len(), 1);
    assert_eq!(frame(&l[0])["reason"], "left");
    assert_eq!(frame(&l[0])["session"], "s2");
    // leaving after a disconnect ends the session silently
    assert!(r.leave(&sid(1), 7).is_empty());
    assert!(r.member(&sid(1)).is_none());
    assert_eq!(r.sessions(), 0);
    assert_eq!(r.connected(), 0);
}

#[test]
fn messages_skip_the_sender_unless_echo() {
    let mut r = room();
    for n in 1..=3 {
        join(&mut r, n, 0);
    }
    let e = say(&mut r, 1, 1);
    assert_eq!(recipients(&r, &e), sessions(&[2, 3]));
    let mut p = msg("main", "chat");
    p.echo = true;
    let e = r.publish(&sid(1), p, 2).unwrap().entry.unwrap();
    assert_eq!(recipients(&r, &e), sessions(&[1, 2, 3]));
}

#[test]
fn messages_reach_only_subscribers_of_their_channel() {
    let mut r = room();
    join(&mut r, 1, 0);
    r.join(params_ch(2, &["game"]), None, 0).unwrap();
    r.join(params_ch(3, &["game", "voice"]), None, 0).unwrap();
    assert_eq!(
        r.member(&sid(3)).unwrap().channels,
        ["main", "game", "voice"]
    );

    let on = |r: &mut plaza_core::Room<u32>, n: u32, ch: &str| {
        r.publish(&sid(n), msg(ch, "x"), 1).unwrap().entry.unwrap()
    };
    let e = on(&mut r, 1, "main");
    assert_eq!(recipients(&r, &e), sessions(&[2, 3]));
    let e = on(&mut r, 1, "game");
    assert_eq!(recipients(&r, &e), sessions(&[2, 3]));
    let e = on(&mut r, 2, "voice");
    assert_eq!(recipients(&r, &e), sessions(&[3]));
    let e = on(&mut r, 3, "nobody-here");
    assert!(recipients(&r, &e).is_empty());

    // subscribe / unsubscribe change what arrives
    let out = ok(&mut r, 1, subscribe("voice"), 2);
    assert_eq!(out.result, json!({"channels": ["main", "voice"]}));
    let out = ok(&mut r, 3, unsubscribe("main"), 2);
    assert_eq!(out.result, json!({"channels": ["game", "voice"]}));
    let e = on(&mut r, 2, "voice");
    assert_eq!(recipients(&r, &e), sessions(&[1, 3]));
    let e = on(&mut r, 2, "main");
    assert_eq!(recipients(&r, &e), sessions(&[1]));
    // subscribing twice keeps one subscription
    let out = ok(&mut r, 1, subscribe("voice"), 3);
    assert_eq!(out.result, json!({"channels": ["main", "voice"]}));
    // unsubscribing an unknown channel is harmless
    let out = ok(&mut r, 1, unsubscribe("never"), 3);
    assert_eq!(out.result, json!({"channels": ["main", "voice"]}));
    // echo does not bypass the channel filter
    let mut p = msg("elsewhere", "x");
    p.echo = true;
    let e = r.publish(&sid(1), p, 4).unwrap().entry.unwrap();
    assert!(recipients(&r, &e).is_empty());
}

#[test]
fn room_wide_events_reach_everyone_but_the_actor() {
    let mut r = room();
    for n in 1..=3 {
        join(&mut r, n, 0);
    }
    // unsubscribing from every channel does not hide room-wide events
    ok(&mut r, 3, unsubscribe("main"), 0);
    let j = join(&mut r, 4, 1);
    assert_eq!(recipients(&r, &j.events[0]), sessions(&[1, 2, 3]));
    let c = ok(&mut r, 1, create(json!({})), 2);
    assert_eq!(recipients(&r, &c.events[0]), sessions(&[2, 3, 4]));
    let l = ok(&mut r, 2, acquire("e1", Some(10)), 3);
    assert_eq!(recipients(&r, &l.events[0]), sessions(&[1, 3, 4]));
    // an expired lease has no actor: everyone hears of it, the owner too
    let t = r.tick(13);
    assert_eq!(t.len(), 1);
    assert_eq!(t[0].from, None);
    assert!(frame(&t[0]).get("from").is_none());
    assert_eq!(recipients(&r, &t[0]), sessions(&[1, 2, 3, 4]));
    let d = r.disconnect(&sid(4), 14);
    assert_eq!(recipients(&r, &d[0]), sessions(&[1, 2, 3]));
    // disconnected members receive nothing
    let e = say(&mut r, 1, 15);
    assert_eq!(recipients(&r, &e), sessions(&[2]));
}

#[test]
fn close_returns_connected_sinks_and_empties_the_room() {
    let mut r = room();
    for n in 1..=3 {
        join(&mut r, n, 0);
    }
    r.disconnect(&sid(2), 1);
    let mut sinks = r.close();
    sinks.sort();
    assert_eq!(sinks, vec![1, 3]);
    assert_eq!(r.connected(), 0);
    assert_eq!(r.sessions(), 0);
    // tokens are gone too: a resume starts a new session
    let j = r.join(params(5), resume("t1", 0), 2).unwrap();
    assert_eq!(j.frame.session, "s5");
    assert_eq!(
        j.frame.reason,
        Some(plaza_protocol::server::ResyncReason::SessionExpired)
    );
}

#[test]
fn without_presence_members_see_no_joins_or_leaves_but_messages_still_flow() {
    let mut r = room_with(RoomConfig {
        presence: false,
        ..RoomConfig::default()
    });
    let a = join(&mut r, 1, 10);
    let b = join(&mut r, 2, 11);
    assert!(
        a.events.is_empty() && b.events.is_empty(),
        "no presence.join"
    );
    // Each member's joined frame lists only itself.
    let listed: Vec<&str> = b.frame.members.iter().map(|m| m.session.as_str()).collect();
    assert_eq!(listed, ["s2"]);
    assert_eq!(r.connected(), 2);
    // Messages still reach the other member, and carry the next seq.
    let m = say(&mut r, 1, 12);
    assert_eq!(m.seq, 1);
    let mut got = Vec::new();
    r.for_each_recipient(&m, |session, _| got.push(session.to_owned()));
    assert_eq!(got, ["s2"]);
    // Leaving and disconnecting announce nothing (no lock was held).
    assert!(r.leave(&sid(2), 13).is_empty());
    assert!(r.disconnect(&sid(1), 14).is_empty());
    assert_eq!(r.seq(), 1, "only the message was sequenced");
}
