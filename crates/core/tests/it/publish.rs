//! Publishing: idempotency by client message id, reply_to validation.

use crate::common::*;
use plaza_core::RoomConfig;
use plaza_protocol::ErrorCode;

#[test]
fn a_repeated_id_is_acknowledged_with_the_original_seq() {
    let mut r = room();
    join(&mut r, 1, 0);
    join(&mut r, 2, 0);
    let first = r.publish(&sid(1), msg_id("m1"), 1).unwrap();
    assert_eq!(first.seq, 3);
    let e = first.entry.expect("first publish orders an event");
    assert_eq!(frame(&e)["id"], "m1");
    say(&mut r, 2, 2); // 4
    let dup = r.publish(&sid(1), msg_id("m1"), 3).unwrap();
    assert_eq!(dup.seq, 3);
    assert!(dup.entry.is_none());
    assert_eq!(r.seq(), 4, "a duplicate orders nothing");
    assert_eq!(r.log().len(), 4);
    // a different id is a new message
    let other = r.publish(&sid(1), msg_id("m2"), 4).unwrap();
    assert_eq!(other.seq, 5);
    assert!(other.entry.is_some());
}

#[test]
fn ids_are_per_session() {
    let mut r = room();
    join(&mut r, 1, 0);
    join(&mut r, 2, 0);
    let a = r.publish(&sid(1), msg_id("same"), 1).unwrap();
    let b = r.publish(&sid(2), msg_id("same"), 1).unwrap();
    assert_eq!((a.seq, b.seq), (3, 4));
    assert!(b.entry.is_some());
}

#[test]
fn messages_without_id_are_never_deduplicated() {
    let mut r = room();
    join(&mut r, 1, 0);
    let a = r.publish(&sid(1), msg("main", "x"), 1).unwrap();
    let b = r.publish(&sid(1), msg("main", "x"), 1).unwrap();
    assert_eq!((a.seq, b.seq), (2, 3));
    assert!(a.entry.is_some() && b.entry.is_some());
}

#[test]
fn ids_survive_a_disconnect_and_resume() {
    let mut r = room();
    join(&mut r, 1, 0);
    join(&mut r, 2, 0);
    let first = r.publish(&sid(1), msg_id("retry-me"), 1).unwrap();
    r.disconnect(&sid(1), 2);
    // while disconnected, publishing is refused
    assert_eq!(
        code(r.publish(&sid(1), msg_id("retry-me"), 3)),
        ErrorCode::NotJoined
    );
    let j = r.join(params(1), resume("t1", first.seq), 4).unwrap();
    assert!(j.frame.resumed);
    let dup = r.publish(&sid(1), msg_id("retry-me"), 5).unwrap();
    assert_eq!(dup.seq, first.seq);
    assert!(dup.entry.is_none());
}

#[test]
fn a_new_session_does_not_inherit_ids() {
    let mut r = room_with(RoomConfig {
        resume_window_ms: 10,
        ..RoomConfig::default()
    });
    join(&mut r, 1, 0);
    r.publish(&sid(1), msg_id("m"), 1).unwrap();
    r.disconnect(&sid(1), 2);
    r.tick(12);
    let j = r.join(params(2), resume("t1", 2), 13).unwrap();
    assert_eq!(j.frame.session, "s2");
    let p = r.publish(&sid(2), msg_id("m"), 14).unwrap();
    assert!(p.entry.is_some());
}

#[test]
fn the_dedup_window_is_bounded() {
    let mut r = room_with(RoomConfig {
        dedup_window: 2,
        ..RoomConfig::default()
    });
    join(&mut r, 1, 0);
    let a = r.publish(&sid(1), msg_id("a"), 1).unwrap().seq; // 2
    let b = r.publish(&sid(1), msg_id("b"), 1).unwrap().seq; // 3
    assert_eq!((a, b), (2, 3));
    // both remembered
    assert_eq!(r.publish(&sid(1), msg_id("a"), 1).unwrap().seq, 2);
    assert_eq!(r.publish(&sid(1), msg_id("b"), 1).unwrap().seq, 3);
    let c = r.publish(&sid(1), msg_id("c"), 1).unwrap(); // 4, forgets a
    assert_eq!(c.seq, 4);
    let dup_c = r.publish(&sid(1), msg_id("c"), 1).unwrap();
    assert!(dup_c.entry.is_none());
    assert_eq!(dup_c.seq, 4);
    let dup_b = r.publish(&sid(1), msg_id("b"), 1).unwrap();
    assert!(dup_b.entry.is_none());
    assert_eq!(dup_b.seq, 3);
    // `a` fell out of the window: it is a new message now (and forgets b)
    let a2 = r.publish(&sid(1), msg_id("a"), 1).unwrap();
    assert_eq!(a2.seq, 5);
    assert!(a2.entry.is_some());
    let b2 = r.publish(&sid(1), msg_id("b"), 1).unwrap();
    assert_eq!(b2.seq, 6);
    assert!(b2.entry.is_some());
    // the window now holds a (seq 5) and b (seq 6)
    assert_eq!(r.publish(&sid(1), msg_id("a"), 1).unwrap().seq, 5);
    assert_eq!(r.publish(&sid(1), msg_id("b"), 1).unwrap().seq, 6);
    assert_eq!(r.seq(), 6);
}

#[test]
fn a_zero_dedup_window_remembers_nothing() {
    let mut r = room_with(RoomConfig {
        dedup_window: 0,
        ..RoomConfig::default()
    });
    join(&mut r, 1, 0);
    let a = r.publish(&sid(1), msg_id("a"), 1).unwrap();
    let b = r.publish(&sid(1), msg_id("a"), 1).unwrap();
    assert_eq!((a.seq, b.seq), (2, 3));
    assert!(b.entry.is_some());
}

#[test]
fn a_refused_publish_does_not_burn_its_id() {
    let mut r = room();
    join(&mut r, 1, 0);
    let mut p = msg_id("x");
    p.reply_to = Some(99);
    assert_eq!(code(r.publish(&sid(1), p, 1)), ErrorCode::InvalidFrame);
    let ok = r.publish(&sid(1), msg_id("x"), 1).unwrap();
    assert_eq!(ok.seq, 2);
    assert!(ok.entry.is_some());
}

#[test]
fn reply_to_must_name_an_earlier_seq() {
    let mut r = room();
    join(&mut r, 1, 0); // 1
    join(&mut r, 2, 0); // 2
    let with = |reply_to| {
        let mut p = msg("main", "re");
        p.reply_to = Some(reply_to);
        p
    };
    assert_eq!(
        code(r.publish(&sid(1), with(0), 1)),
        ErrorCode::InvalidFrame
    );
    assert_eq!(
        code(r.publish(&sid(1), with(3), 1)),
        ErrorCode::InvalidFrame
    );
    assert_eq!(
        code(r.publish(&sid(1), with(u64::MAX), 1)),
        ErrorCode::InvalidFrame
    );
    assert_eq!(r.seq(), 2);
    let e = r.publish(&sid(1), with(2), 1).unwrap().entry.unwrap();
    assert_eq!((e.seq, e.reply_to), (3, Some(2)));
    assert_eq!(frame(&e)["reply_to"], 2);
    let e = r.publish(&sid(2), with(1), 1).unwrap().entry.unwrap();
    assert_eq!((e.seq, e.reply_to), (4, Some(1)));
}

#[test]
fn publishing_needs_a_connected_member() {
    let mut r = room();
    assert_eq!(
        code(r.publish("ghost", msg("main", "x"), 0)),
        ErrorCode::NotJoined
    );
    join(&mut r, 1, 0);
    r.leave(&sid(1), 1);
    assert_eq!(
        code(r.publish(&sid(1), msg("main", "x"), 2)),
        ErrorCode::NotJoined
    );
    assert_eq!(r.seq(), 2);
}

#[test]
fn publish_refuses_empty_and_overlong_channel_names_without_using_a_seq() {
    let mut room = crate::common::room();
    crate::common::join(&mut room, 1, 0);
    let before = room.seq();
    for channel in ["".to_owned(), "c".repeat(65)] {
        let e = room
            .publish(
                &crate::common::sid(1),
                crate::common::msg(&channel, "chat"),
                1,
            )
            .unwrap_err();
        assert_eq!(e.code, plaza_protocol::ErrorCode::InvalidFrame);
    }
    assert_eq!(room.seq(), before);
}
