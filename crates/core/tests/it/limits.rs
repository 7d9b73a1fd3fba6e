//! Admission and validation: member limit, tickets, channels, direct targets.

use crate::common::*;
use plaza_core::{Access, RoomConfig};
use plaza_protocol::server::ResyncReason;
use plaza_protocol::ErrorCode;

fn small(max_members: usize) -> plaza_core::Room<u32> {
    room_with(RoomConfig {
        max_members,
        ..RoomConfig::default()
    })
}

#[test]
fn a_full_room_refuses_new_members() {
    let mut r = small(2);
    join(&mut r, 1, 0);
    join(&mut r, 2, 0);
    assert_eq!(code(r.join(params(3), None, 1)), ErrorCode::RoomFull);
    assert_eq!(r.connected(), 2);
    assert_eq!(r.sessions(), 2);
    assert_eq!(r.seq(), 2);
    // an unknown resume token is a new member too
    assert_eq!(
        code(r.join(params(3), resume("bogus", 0), 1)),
        ErrorCode::RoomFull
    );
    // a disconnected member frees its place
    r.disconnect(&sid(1), 2);
    assert_eq!(r.connected(), 1);
    assert_eq!(r.join(params(3), None, 3).unwrap().frame.session, "s3");
    assert_eq!(r.connected(), 2);
}

#[test]
fn a_full_room_refuses_to_resume_a_disconnected_session() {
    let mut r = small(2);
    join(&mut r, 1, 0);
    join(&mut r, 2, 0);
    r.disconnect(&sid(1), 1); // 3
    join(&mut r, 3, 2); // 4
    let seq = r.seq();
    assert_eq!(
        code(r.join(params(1), resume("t1", 2), 3)),
        ErrorCode::RoomFull
    );
    // nothing changed: still disconnected, still resumable
    assert_eq!(r.seq(), seq);
    assert_eq!(r.connected(), 2);
    assert!(r.member("s1").unwrap().sink.is_none());
    assert_eq!(r.next_deadline(), Some(1 + 120_000));
    r.leave(&sid(3), 4); // 5
    let j = r.join(params(1), resume("t1", 2), 5).unwrap();
    assert!(j.frame.resumed);
    assert_eq!(j.frame.session, "s1");
    assert_eq!(seqs(&j.missed), vec![4, 5]);
}

#[test]
fn a_full_room_still_lets_a_connected_session_reconnect() {
    let mut r = small(2);
    join(&mut r, 1, 0);
    join(&mut r, 2, 0);
    let mut p = params(1);
    p.sink = 10;
    let j = r.join(p, resume("t1", 2), 1).unwrap();
    assert!(j.frame.resumed);
    assert_eq!(j.replaced, Some(1));
    assert_eq!(r.connected(), 2);
}

#[test]
fn sessions_held_for_resume_are_bounded() {
    let mut r = small(2);
    join(&mut r, 1, 0);
    join(&mut r, 2, 0);
    r.disconnect(&sid(1), 1);
    r.disconnect(&sid(2), 2);
    join(&mut r, 3, 3);
    join(&mut r, 4, 4);
    r.disconnect(&sid(3), 5);
    assert_eq!(r.sessions(), 4);
    // at twice the member limit, the oldest disconnected session goes
    join(&mut r, 5, 6);
    assert_eq!(r.sessions(), 4);
    assert!(r.member("s1").is_none());
    assert!(r.member("s2").is_some());
    assert!(r.member("s3").is_some());
    let j = r.join(params(6), resume("t1", 0), 7);
    assert_eq!(code(j), ErrorCode::RoomFull);
    r.leave(&sid(5), 8);
    let j = r.join(params(6), resume("t1", 0), 9).unwrap();
    assert_eq!(j.frame.reason, Some(ResyncReason::SessionExpired));
}

#[test]
fn colliding_ids_are_an_internal_error() {
    let mut r = room();
    join(&mut r, 1, 0);
    let mut p = params(2);
    p.session = sid(1);
    assert_eq!(code(r.join(p, None, 1)), ErrorCode::Internal);
    let mut p = params(2);
    p.resume_token = "t1".into();
    assert_eq!(code(r.join(p, None, 1)), ErrorCode::Internal);
    assert_eq!(r.connected(), 1);
    assert_eq!(r.seq(), 1);
    // a disconnected session's id is still taken
    r.disconnect(&sid(1), 2);
    assert_eq!(code(r.join(params(1), None, 3)), ErrorCode::Internal);
}

#[test]
fn ticket_only_rooms_need_a_ticket() {
    let mut r = room_with(RoomConfig {
        access: Access::TicketOnly,
        ..RoomConfig::default()
    });
    assert_eq!(code(r.join(params(1), None, 0)), ErrorCode::TicketRequired);
    assert_eq!(
        code(r.join(params(1), resume("t9", 0), 0)),
        ErrorCode::TicketRequired
    );
    assert_eq!(r.seq(), 0);
    assert_eq!(r.connected(), 0);
    let mut p = params(1);
    p.ticket = true;
    assert_eq!(r.join(p, None, 0).unwrap().frame.session, "s1");
    // open rooms take anyone, with or without ticket
    let mut open = room();
    let mut p = params(1);
    p.ticket = true;
    open.join(p, None, 0).unwrap();
    open.join(params(2), None, 0).unwrap();
    assert_eq!(open.connected(), 2);
    assert_eq!(Access::default(), Access::Open);
}

#[test]
fn join_channels_are_validated() {
    let mut r = room_with(RoomConfig {
        max_channels: 3,
        ..RoomConfig::default()
    });
    assert_eq!(
        code(r.join(params_ch(1, &[""]), None, 0)),
        ErrorCode::InvalidArgs
    );
    let long = "x".repeat(65);
    assert_eq!(
        code(r.join(params_ch(1, &["ok", &long]), None, 0)),
        ErrorCode::InvalidArgs
    );
    assert_eq!(r.sessions(), 0);
    assert_eq!(r.seq(), 0);
    let max = "x".repeat(64);
    let j = r.join(params_ch(1, &[&max]), None, 0).unwrap();
    assert_eq!(j.frame.channels, ["main".to_owned(), max]);
}

#[test]
fn join_channels_are_limited_like_subscriptions() {
    let mut r = room_with(RoomConfig {
        max_channels: 3,
        ..RoomConfig::default()
    });
    // main counts: at most two more
    assert_eq!(
        code(r.join(params_ch(1, &["a", "b", "c"]), None, 0)),
        ErrorCode::InvalidArgs
    );
    assert_eq!(
        code(r.join(params_ch(1, &["a", "b", "c", "d"]), None, 0)),
        ErrorCode::InvalidArgs
    );
    assert_eq!(r.sessions(), 0);
    let j = r.join(params_ch(1, &["a", "b"]), None, 0).unwrap();
    assert_eq!(j.frame.channels, ["main", "a", "b"]);
    // naming main or a channel twice does not count twice
    let j = r.join(params_ch(2, &["main", "a", "b"]), None, 0).unwrap();
    assert_eq!(j.frame.channels, ["main", "a", "b"]);
    let j = r.join(params_ch(3, &["b", "b"]), None, 0).unwrap();
    assert_eq!(j.frame.channels, ["main", "b"]);
    // and a member that joined at the limit cannot subscribe to more
    assert_eq!(err(&mut r, 1, subscribe("z"), 1), ErrorCode::InvalidArgs);
}

#[test]
fn direct_targets_must_be_connected_members() {
    let mut r = room();
    join(&mut r, 1, 0);
    join(&mut r, 2, 0);
    join(&mut r, 3, 0);
    assert_eq!(r.direct_target("s1", "s2"), Ok(&2));
    assert_eq!(r.direct_target("s2", "s2"), Ok(&2));
    assert_eq!(code(r.direct_target("ghost", "s2")), ErrorCode::NotJoined);
    assert_eq!(
        code(r.direct_target("s1", "ghost")),
        ErrorCode::SessionNotFound
    );
    r.disconnect(&sid(3), 1);
    assert_eq!(code(r.direct_target("s3", "s1")), ErrorCode::NotJoined);
    assert_eq!(
        code(r.direct_target("s1", "s3")),
        ErrorCode::SessionNotFound
    );
    r.leave(&sid(2), 2);
    assert_eq!(
        code(r.direct_target("s1", "s2")),
        ErrorCode::SessionNotFound
    );
    assert_eq!(code(r.direct_target("s2", "s1")), ErrorCode::NotJoined);
    // after a resume the target's new sink is returned
    let mut p = params(3);
    p.sink = 33;
    r.join(p, resume("t3", 0), 3).unwrap();
    assert_eq!(r.direct_target("s1", "s3"), Ok(&33));
}

#[test]
fn errors_display_their_code() {
    let mut r = room();
    let e = r.join(params_ch(1, &[""]), None, 0).unwrap_err();
    assert_eq!(e.code, ErrorCode::InvalidArgs);
    assert!(e.to_string().starts_with("invalid_args: "), "{e}");
    assert!(!e.message.is_empty());
}
