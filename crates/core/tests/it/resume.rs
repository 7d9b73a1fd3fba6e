//! Resuming a session: missed events, resync reasons, replaced connections.

use crate::common::*;
use plaza_core::RoomConfig;
use plaza_protocol::client::Op;
use plaza_protocol::server::{ResyncReason, ServerFrame};
use plaza_protocol::ErrorCode;
use serde_json::json;

#[test]
fn resume_delivers_exactly_the_missed_visible_events() {
    let mut r = room();
    join(&mut r, 1, 0); // 1
    r.join(params_ch(2, &["side"]), None, 0).unwrap(); // 2
    let seen = say(&mut r, 2, 1); // 3, s1 sees it
    assert_eq!(recipients(&r, &seen), sessions(&[1]));
    let own = say(&mut r, 1, 2); // 4, own message
    let mut p = msg("main", "echoed");
    p.echo = true;
    let echoed = r.publish(&sid(1), p, 3).unwrap().entry.unwrap(); // 5
    assert_eq!(r.disconnect(&sid(1), 10).len(), 1); // 6
    let m = say(&mut r, 2, 11); // 7
    r.publish(&sid(2), msg("side", "x"), 12).unwrap(); // 8, not subscribed
    let c = ok(&mut r, 2, create(json!({"k": 1})), 13).events; // 9
    let j3 = join(&mut r, 3, 14).events; // 10
    assert_eq!(r.connected(), 2);
    assert_eq!(r.sessions(), 3);

    // the params' session, token and name are ignored on resume; the sink is used
    let mut p = params(9);
    p.sink = 99;
    let j = r.join(p, resume("t1", seen.seq), 20).unwrap();
    assert_eq!(j.frame.session, "s1");
    assert_eq!(j.frame.resume_token, "t1");
    assert!(j.frame.resumed);
    assert_eq!(j.frame.reason, None);
    assert!(
        j.frame.snapshot.is_none(),
        "missed events replace the snapshot"
    );
    assert_eq!(j.frame.channels, ["main"]);
    assert!(j.replaced.is_none());
    assert!(j.missed.iter().all(|e| e.seq != own.seq));
    assert_eq!(
        seqs(&j.missed),
        vec![echoed.seq, m.seq, c[0].seq, j3[0].seq]
    );
    assert_eq!(seqs(&j.missed), vec![5, 7, 9, 10]);
    // the others see it come back
    assert_eq!(j.events.len(), 1);
    assert_eq!(j.events[0].seq, 11);
    assert_eq!(kind(&j.events[0]), "presence.join");
    assert_eq!(recipients(&r, &j.events[0]), sessions(&[2, 3]));
    assert_eq!(j.frame.seq, 11);
    assert_eq!(r.connected(), 3);
    assert_eq!(r.member("s1").unwrap().sink, Some(99));
    assert!(r.member("s9").is_none());
    let members: Vec<&str> = j.frame.members.iter().map(|m| m.session.as_str()).collect();
    assert_eq!(members, ["s1", "s2", "s3"]);
    let ServerFrame::Joined(_) = j.server_frame() else {
        panic!("a resume that continues answers `joined`")
    };
    // the new params' token was not registered
    let again = r.join(params(10), resume("t9", 0), 21).unwrap();
    assert_eq!(again.frame.reason, Some(ResyncReason::SessionExpired));
}

#[test]
fn resume_with_nothing_missed() {
    let mut r = room();
    join(&mut r, 1, 0);
    join(&mut r, 2, 0);
    r.disconnect(&sid(1), 1); // 3
    let j = r.join(params(1), resume("t1", 3), 2).unwrap();
    assert!(j.frame.resumed);
    assert!(j.missed.is_empty());
    assert_eq!(j.frame.seq, 4);
}

#[test]
fn resume_skips_channels_the_session_left() {
    let mut r = room();
    r.join(params_ch(1, &["a", "b"]), None, 0).unwrap(); // 1
    join(&mut r, 2, 0); // 2
    ok(&mut r, 1, unsubscribe("a"), 0);
    ok(&mut r, 1, unsubscribe("main"), 0);
    r.disconnect(&sid(1), 1); // 3
    for ch in ["main", "a", "b", "c"] {
        r.publish(&sid(2), msg(ch, "x"), 2).unwrap(); // 4..=7
    }
    let j = r.join(params(1), resume("t1", 2), 3).unwrap();
    assert!(j.frame.resumed);
    assert_eq!(j.frame.channels, ["b"]);
    assert_eq!(seqs(&j.missed), vec![6]);
    assert_eq!(frame(&j.missed[0])["channel"], "b");
}

#[test]
fn resume_skips_messages_of_a_channel_from_before_the_subscription() {
    let mut r = room();
    join(&mut r, 1, 0); // 1
    join(&mut r, 2, 0); // 2
    r.publish(&sid(2), msg("side", "early"), 1).unwrap(); // 3, s1 not on "side"
    ok(&mut r, 1, subscribe("side"), 2); // at seq 3
    r.publish(&sid(2), msg("side", "late"), 3).unwrap(); // 4
    ok(&mut r, 1, unsubscribe("side"), 4);
    r.publish(&sid(2), msg("side", "away"), 5).unwrap(); // 5
    ok(&mut r, 1, subscribe("side"), 6); // again, at seq 5
    r.publish(&sid(2), msg("side", "back"), 7).unwrap(); // 6
    r.disconnect(&sid(1), 8); // 7
                              // The client saw up to seq 2: it resumes from there.
    let j = r.join(params(1), resume("t1", 2), 9).unwrap();
    assert!(j.frame.resumed);
    let events: Vec<String> = j
        .missed
        .iter()
        .map(|e| frame(e)["event"].as_str().unwrap_or_default().to_owned())
        .collect();
    assert_eq!(events, ["back"], "only what it would have received live");
    // The subscription seqs travel with the room's state.
    let exported = r.export(|s| s.to_string());
    let s1 = exported.members.iter().find(|m| m.session == "s1").unwrap();
    assert_eq!(s1.subscribed_at, [("side".to_owned(), 5)]);
}

#[test]
fn truncated_history_resyncs_the_same_session_with_a_snapshot() {
    let mut r = room_with(RoomConfig {
        history_size: 3,
        ..RoomConfig::default()
    });
    join(&mut r, 1, 0); // 1
    join(&mut r, 2, 0); // 2
    ok(&mut r, 2, create(json!({"v": 1})), 0); // 3
    r.disconnect(&sid(1), 1); // 4
    for t in 0..4 {
        say(&mut r, 2, 2 + t); // 5..=8
    }
    assert_eq!(r.log().first_seq(), Some(6));
    let j = r.join(params(1), resume("t1", 3), 10).unwrap();
    assert_eq!(j.frame.reason, Some(ResyncReason::HistoryTruncated));
    assert!(!j.frame.resumed);
    assert_eq!(j.frame.session, "s1");
    assert_eq!(j.frame.resume_token, "t1");
    assert!(j.missed.is_empty());
    let snap = j
        .frame
        .snapshot
        .as_ref()
        .expect("resync carries a snapshot");
    assert_eq!(snap.entities.len(), 1);
    assert_eq!(snap.entities[0].data, json!({"v": 1}));
    assert_eq!(j.frame.seq, 9, "the snapshot is at the room's seq");
    assert_eq!(seqs(&j.events), vec![9]);
    assert_eq!(r.connected(), 2);
    assert_eq!(r.sessions(), 2);
    let ServerFrame::Resync(_) = j.server_frame() else {
        panic!("a resync answers `resync`")
    };
    let v: serde_json::Value = serde_json::from_slice(&j.server_frame().encode()).unwrap();
    assert_eq!(v["type"], "resync");
    assert_eq!(v["reason"], "history_truncated");
    assert_eq!(v["session"], "s1");

    // the boundary: last_seq = first_seq - 1 still resumes
    r.disconnect(&sid(1), 11); // 10
    let first = r.log().first_seq().unwrap();
    assert_eq!(first, 8);
    let j = r.join(params(1), resume("t1", first - 1), 12).unwrap();
    assert!(j.frame.resumed);
    assert_eq!(j.frame.reason, None);
    // 9 and 10 are its own presence events
    assert_eq!(seqs(&j.missed), vec![8]);
}

#[test]
fn a_last_seq_ahead_of_the_room_means_the_epoch_changed() {
    let mut r = room();
    join(&mut r, 1, 0);
    join(&mut r, 2, 0);
    r.disconnect(&sid(1), 1); // 3
    let j = r.join(params(1), resume("t1", 4), 2).unwrap();
    assert_eq!(j.frame.reason, Some(ResyncReason::EpochChanged));
    assert!(!j.frame.resumed);
    assert_eq!(j.frame.session, "s1");
    assert!(j.frame.snapshot.is_some());
    assert!(j.missed.is_empty());
    // last_seq equal to the room's seq is fine
    r.disconnect(&sid(1), 3); // 5
    let j = r.join(params(1), resume("t1", 5), 4).unwrap();
    assert!(j.frame.resumed);
    assert!(j.missed.is_empty());
}

#[test]
fn an_unknown_token_starts_a_new_session() {
    let mut r = room();
    join(&mut r, 1, 0);
    let j = r.join(params(2), resume("bogus", 1), 1).unwrap();
    assert_eq!(j.frame.reason, Some(ResyncReason::SessionExpired));
    assert!(!j.frame.resumed);
    assert_eq!(j.frame.session, "s2");
    assert_eq!(j.frame.resume_token, "t2");
    assert!(j.frame.snapshot.is_some());
    assert!(j.missed.is_empty());
    assert_eq!(seqs(&j.events), vec![2]);
    assert_eq!(kind(&j.events[0]), "presence.join");
    assert_eq!(r.connected(), 2);
    let ServerFrame::Resync(_) = j.server_frame() else {
        panic!("an expired session answers `resync`")
    };
}

#[test]
fn the_resume_window_ends_the_session() {
    let mut r = room_with(RoomConfig {
        resume_window_ms: 1_000,
        ..RoomConfig::default()
    });
    join(&mut r, 1, 0);
    join(&mut r, 2, 0);
    assert_eq!(r.next_deadline(), None);
    r.disconnect(&sid(1), 100);
    assert_eq!(r.next_deadline(), Some(1_100));
    assert!(r.tick(1_099).is_empty());
    assert_eq!(r.sessions(), 2);
    assert!(r.member("s1").is_some());
    // expiry orders no event: the others already saw the member leave
    assert!(r.tick(1_100).is_empty());
    assert_eq!(r.seq(), 3);
    assert_eq!(r.sessions(), 1);
    assert!(r.member("s1").is_none());
    assert_eq!(r.next_deadline(), None);
    let j = r.join(params(3), resume("t1", 3), 1_200).unwrap();
    assert_eq!(j.frame.reason, Some(ResyncReason::SessionExpired));
    assert_eq!(j.frame.session, "s3");
    assert_eq!(r.connected(), 2);
}

#[test]
fn a_resume_just_inside_the_window_succeeds() {
    let mut r = room_with(RoomConfig {
        resume_window_ms: 1_000,
        ..RoomConfig::default()
    });
    join(&mut r, 1, 0);
    r.disconnect(&sid(1), 100);
    assert!(r.tick(1_099).is_empty());
    let j = r.join(params(1), resume("t1", 1), 1_099).unwrap();
    assert!(j.frame.resumed);
    assert_eq!(j.frame.session, "s1");
    // reconnected: no deadline any more, a late tick keeps the session
    assert_eq!(r.next_deadline(), None);
    r.tick(5_000);
    assert!(r.member("s1").is_some());
}

#[test]
fn the_resume_window_holds_even_before_tick_runs() {
    // The runtime ticks at `next_deadline`, but a resume may be processed
    // first: the window must be enforced by `join` itself.
    let mut r = room_with(RoomConfig {
        resume_window_ms: 1_000,
        ..RoomConfig::default()
    });
    join(&mut r, 1, 0);
    join(&mut r, 2, 0);
    r.disconnect(&sid(1), 100);
    let j = r.join(params(3), resume("t1", 3), 1_100).unwrap();
    assert_eq!(j.frame.reason, Some(ResyncReason::SessionExpired));
    assert_eq!(j.frame.session, "s3");
    assert!(r.member("s1").is_none());
    assert_eq!(r.sessions(), 2);
    assert_eq!(r.connected(), 2);
    // the old token is gone for good
    let j = r.join(params(4), resume("t1", 3), 1_101).unwrap();
    assert_eq!(j.frame.session, "s4");
}

#[test]
fn resuming_a_live_connection_replaces_it_silently() {
    let mut r = room();
    join(&mut r, 1, 0); // 1
    join(&mut r, 2, 0); // 2
    say(&mut r, 2, 1); // 3
    say(&mut r, 2, 2); // 4
    let mut p = params(1);
    p.sink = 11;
    let j = r.join(p, resume("t1", 3), 3).unwrap();
    assert_eq!(j.replaced, Some(1));
    assert!(j.events.is_empty(), "no presence change");
    assert!(j.frame.resumed);
    assert_eq!(seqs(&j.missed), vec![4]);
    assert_eq!(r.seq(), 4);
    assert_eq!(r.connected(), 2);
    assert_eq!(r.member("s1").unwrap().sink, Some(11));
    // new events go to the new sink
    let e = say(&mut r, 2, 4);
    let mut got = Vec::new();
    r.for_each_recipient(&e, |s, sink| got.push((s.to_owned(), *sink)));
    assert_eq!(got, vec![("s1".to_owned(), 11)]);
}

#[test]
fn a_session_can_resume_repeatedly_with_the_same_token() {
    let mut r = room();
    join(&mut r, 1, 0);
    join(&mut r, 2, 0);
    for round in 0..3u64 {
        r.disconnect(&sid(1), 10 * round);
        let e = say(&mut r, 2, 10 * round + 1);
        let j = r
            .join(params(1), resume("t1", e.seq - 2), 10 * round + 2)
            .unwrap();
        assert!(j.frame.resumed, "round {round}");
        assert_eq!(seqs(&j.missed), vec![e.seq], "round {round}");
    }
    assert_eq!(r.sessions(), 2);
}

#[test]
fn a_session_that_left_cannot_resume() {
    let mut r = room();
    join(&mut r, 1, 0);
    r.leave(&sid(1), 1);
    let j = r.join(params(2), resume("t1", 2), 2).unwrap();
    assert_eq!(j.frame.reason, Some(ResyncReason::SessionExpired));
    assert_eq!(j.frame.session, "s2");
}

#[test]
fn a_resumed_session_learns_its_locks_were_released() {
    // After a successful resume no snapshot is sent: the missed events are the
    // only way for the client to learn that its locks ended on disconnect.
    let mut r = room();
    join(&mut r, 1, 0); // 1
    join(&mut r, 2, 0); // 2
    let own = ok(&mut r, 1, acquire("doc", Some(10_000)), 1).events; // 3
    assert_eq!(recipients(&r, &own[0]), sessions(&[2]));
    let d = r.disconnect(&sid(1), 2); // 4 lock.released, 5 presence.leave
    assert_eq!(kind(&d[0]), "lock.released");
    assert_eq!(
        frame(&d[0]),
        json!({"type": "event", "room": "r", "seq": 4, "ts": 2, "from": "s1",
               "kind": "lock.released", "object": "doc", "owner": "s1",
               "token": 1, "reason": "disconnected"})
    );
    assert_eq!(recipients(&r, &d[0]), sessions(&[2]));
    ok(&mut r, 2, acquire("doc", Some(10_000)), 3); // 6
    let j = r.join(params(1), resume("t1", 3), 4).unwrap();
    assert!(j.frame.resumed);
    let kinds: Vec<String> = j.missed.iter().map(|e| kind(e)).collect();
    assert_eq!(kinds, ["lock.released", "lock.acquired"]);
    assert_eq!(seqs(&j.missed), vec![4, 6]);
}

#[test]
fn a_resumed_session_gets_the_state_changes_it_asked_for() {
    // A request's response may be lost with the connection: the missed
    // events then tell the requester what became of its entity and lock
    // requests. Its own messages and presence stay out (it has acks, and
    // it is the member that came and went).
    let mut r = room();
    join(&mut r, 1, 0); // 1
    join(&mut r, 2, 0); // 2
    let created = ok(&mut r, 1, create(json!({"x": 1})), 1).events; // 3
    assert_eq!(recipients(&r, &created[0]), sessions(&[2]));
    let set = Op::EntitySet {
        id: "e1".into(),
        data: json!({"x": 2}),
        version: Some(1),
    };
    ok(&mut r, 1, set, 2); // 4
    ok(&mut r, 1, acquire("e1", Some(10_000)), 3); // 5
    let release = Op::LockRelease {
        object: "e1".into(),
    };
    ok(&mut r, 1, release, 4); // 6
    say(&mut r, 1, 5); // 7, own message
    say(&mut r, 2, 6); // 8
    r.disconnect(&sid(1), 7); // 9 presence.leave
    let j = r.join(params(1), resume("t1", 2), 8).unwrap();
    assert!(j.frame.resumed);
    let kinds: Vec<String> = j.missed.iter().map(|e| kind(e)).collect();
    assert_eq!(
        kinds,
        [
            "entity.created",
            "entity.updated",
            "lock.acquired",
            "lock.released",
            "message"
        ]
    );
    assert_eq!(seqs(&j.missed), vec![3, 4, 5, 6, 8]);
    assert_eq!(frame(&j.missed[1])["entity"]["data"], json!({"x": 2}));
    // live, the requester still gets none of them
    let again = ok(&mut r, 1, create(json!({"x": 3})), 9).events;
    assert_eq!(recipients(&r, &again[0]), sessions(&[2]));
}

#[test]
fn resume_requires_a_ticket_in_ticket_only_rooms() {
    let mut r = room_with(RoomConfig {
        access: plaza_core::Access::TicketOnly,
        ..RoomConfig::default()
    });
    let mut p = params(1);
    p.ticket = true;
    r.join(p, None, 0).unwrap();
    r.disconnect(&sid(1), 1);
    assert_eq!(
        code(r.join(params(1), resume("t1", 1), 2)),
        ErrorCode::TicketRequired
    );
    assert_eq!(r.connected(), 0);
    let mut p = params(1);
    p.ticket = true;
    assert!(r.join(p, resume("t1", 1), 3).unwrap().frame.resumed);
}
