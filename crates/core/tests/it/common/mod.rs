//! Helpers shared by the integration tests of `plaza-core`.
#![allow(dead_code)]

use std::sync::Arc;

use plaza_core::{
    HistoryEntry, JoinParams, Joined, Millis, PublishParams, RequestOutcome, Resume, Room,
    RoomConfig, RoomError,
};
use plaza_protocol::client::Op;
use plaza_protocol::ErrorCode;
use serde_json::value::RawValue;
use serde_json::Value;

/// A room with `config`, id `r`, epoch 7, created at 0. Sinks are `u32`s.
pub fn room_with(config: RoomConfig) -> Room<u32> {
    Room::new("r".into(), "Room R".into(), config, 7, 0)
}

/// A room with the default config.
pub fn room() -> Room<u32> {
    room_with(RoomConfig::default())
}

/// Session id of member `n`.
pub fn sid(n: u32) -> String {
    format!("s{n}")
}

/// Join parameters for member `n`: session `s{n}`, token `t{n}`, sink `n`.
pub fn params(n: u32) -> JoinParams<u32> {
    JoinParams {
        session: sid(n),
        resume_token: format!("t{n}"),
        name: format!("user{n}"),
        platform: "test".into(),
        user: None,
        channels: Vec::new(),
        ticket: false,
        resume_only: None,
        policy: None,
        history: None,
        sink: n,
    }
}

/// Join parameters for member `n` with extra channels.
pub fn params_ch(n: u32, channels: &[&str]) -> JoinParams<u32> {
    JoinParams {
        channels: channels.iter().map(|c| (*c).to_owned()).collect(),
        ..params(n)
    }
}

/// Joins member `n` (must succeed).
pub fn join(room: &mut Room<u32>, n: u32, now: Millis) -> Joined<u32> {
    room.join(params(n), None, now).expect("join")
}

/// Resume parameters.
pub fn resume(token: &str, last_seq: u64) -> Option<Resume> {
    Some(Resume {
        token: token.to_owned(),
        last_seq,
    })
}

/// A message on `channel` without id, data or echo.
pub fn msg(channel: &str, event: &str) -> PublishParams {
    PublishParams {
        channel: channel.to_owned(),
        event: event.to_owned(),
        data: None,
        id: None,
        topic: None,
        reply_to: None,
        echo: false,
    }
}

/// A message on `main` with a client id.
pub fn msg_id(id: &str) -> PublishParams {
    PublishParams {
        id: Some(id.to_owned()),
        ..msg("main", "chat")
    }
}

/// Raw JSON payload.
pub fn raw(json: &str) -> Option<Box<RawValue>> {
    Some(RawValue::from_string(json.to_owned()).expect("valid json"))
}

/// Publishes on `main` and returns the new entry.
pub fn say(room: &mut Room<u32>, n: u32, now: Millis) -> Arc<HistoryEntry> {
    room.publish(&sid(n), msg("main", "chat"), now)
        .expect("publish")
        .entry
        .expect("new entry")
}

/// Runs a request that must succeed.
pub fn ok(room: &mut Room<u32>, n: u32, op: Op, now: Millis) -> RequestOutcome {
    room.request(&sid(n), op, now).expect("request")
}

/// Runs a request that must fail and returns its code.
pub fn err(room: &mut Room<u32>, n: u32, op: Op, now: Millis) -> ErrorCode {
    room.request(&sid(n), op, now)
        .expect_err("request must fail")
        .code
}

/// The code of an error result.
pub fn code<T: std::fmt::Debug>(r: Result<T, RoomError>) -> ErrorCode {
    r.expect_err("must fail").code
}

/// The event frame of an entry, decoded.
pub fn frame(entry: &HistoryEntry) -> Value {
    serde_json::from_slice(&entry.frame).expect("frames are JSON")
}

/// The `kind` of an entry's event.
pub fn kind(entry: &HistoryEntry) -> String {
    frame(entry)["kind"].as_str().expect("kind").to_owned()
}

/// Seqs of entries.
pub fn seqs(entries: &[Arc<HistoryEntry>]) -> Vec<u64> {
    entries.iter().map(|e| e.seq).collect()
}

/// Sessions `for_each_recipient` delivers `entry` to, sorted, checking that
/// each sink is the member's current one.
pub fn recipients(room: &Room<u32>, entry: &HistoryEntry) -> Vec<String> {
    let mut v = Vec::new();
    room.for_each_recipient(entry, |s, sink| {
        assert_eq!(room.member(s).and_then(|m| m.sink.as_ref()), Some(sink));
        v.push(s.to_owned());
    });
    v.sort();
    v
}

/// Sorted session ids.
pub fn sessions(ns: &[u32]) -> Vec<String> {
    let mut v: Vec<String> = ns.iter().map(|n| sid(*n)).collect();
    v.sort();
    v
}

pub fn create(data: Value) -> Op {
    Op::EntityCreate { kind: None, data }
}

pub fn acquire(object: &str, ttl_ms: Option<u64>) -> Op {
    Op::LockAcquire {
        object: object.to_owned(),
        ttl_ms,
    }
}

pub fn renew(object: &str, ttl_ms: Option<u64>) -> Op {
    Op::LockRenew {
        object: object.to_owned(),
        ttl_ms,
    }
}

pub fn release(object: &str) -> Op {
    Op::LockRelease {
        object: object.to_owned(),
    }
}

pub fn subscribe(channel: &str) -> Op {
    Op::ChannelSubscribe {
        channel: channel.to_owned(),
    }
}

pub fn unsubscribe(channel: &str) -> Op {
    Op::ChannelUnsubscribe {
        channel: channel.to_owned(),
    }
}

/// Asserts that consecutive entries are numbered `first`, `first + 1`, ...
pub fn assert_consecutive(entries: &[Arc<HistoryEntry>], first: u64) {
    let want: Vec<u64> = (first..first + entries.len() as u64).collect();
    assert_eq!(seqs(entries), want);
    for e in entries {
        assert_eq!(frame(e)["seq"], e.seq);
    }
}
