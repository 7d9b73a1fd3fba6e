//! Edge cases of the smaller parts: tickets, rate limiting, the history log
//! and the entity store.

use std::sync::Arc;

use bytes::Bytes;
use plaza_core::{EntityStore, HistoryEntry, RoomLog, TicketBook, TicketGrant, TokenBucket};
use plaza_protocol::ErrorCode;
use serde_json::{json, Map, Value};

fn grant(name: &str) -> TicketGrant {
    TicketGrant {
        room: "r".into(),
        name: name.into(),
        platform: "xr".into(),
    }
}

fn entry(seq: u64) -> Arc<HistoryEntry> {
    Arc::new(HistoryEntry {
        seq,
        ts: seq * 10,
        from: None,
        channel: None,
        echo: false,
        replay_to_sender: false,
        topic: None,
        reply_to: None,
        scope: Default::default(),
        frame: Bytes::from(format!("{{\"seq\":{seq}}}")),
        wire: Default::default(),
    })
}

#[test]
fn tickets_are_valid_until_just_before_they_expire() {
    let mut b = TicketBook::default();
    assert!(b.is_empty());
    b.issue("a".into(), grant("ann"), 1_000);
    b.issue("b".into(), grant("bob"), 1_000);
    assert_eq!(b.len(), 2);
    assert_eq!(b.redeem("a", 999).unwrap(), grant("ann"));
    assert_eq!(
        b.redeem("b", 1_000).unwrap_err().code,
        ErrorCode::TicketExpired
    );
    assert_eq!(
        b.redeem("b", 5_000).unwrap_err().code,
        ErrorCode::TicketExpired
    );
    // a used ticket that has also expired reports the expiry
    assert_eq!(
        b.redeem("a", 1_000).unwrap_err().code,
        ErrorCode::TicketExpired
    );
    assert_eq!(b.redeem("a", 500).unwrap_err().code, ErrorCode::TicketUsed);
}

#[test]
fn tickets_are_single_use_and_independent() {
    let mut b = TicketBook::default();
    b.issue("a".into(), grant("ann"), 1_000);
    b.issue("b".into(), grant("bob"), 1_000);
    assert_eq!(b.redeem("b", 0).unwrap().name, "bob");
    assert_eq!(b.redeem("b", 0).unwrap_err().code, ErrorCode::TicketUsed);
    assert_eq!(b.redeem("a", 0).unwrap().name, "ann");
    assert_eq!(b.redeem("A", 0).unwrap_err().code, ErrorCode::TicketInvalid);
    assert_eq!(b.redeem("", 0).unwrap_err().code, ErrorCode::TicketInvalid);
    // used tickets stay known (as used) until purged
    assert_eq!(b.len(), 2);
}

#[test]
fn purge_keeps_expired_tickets_for_a_minute() {
    let mut b = TicketBook::default();
    b.issue("early".into(), grant("a"), 1_000);
    b.issue("late".into(), grant("b"), 100_000);
    assert_eq!(b.purge(0), 0);
    assert_eq!(b.purge(60_999), 0);
    assert_eq!(
        b.redeem("early", 60_999).unwrap_err().code,
        ErrorCode::TicketExpired
    );
    assert_eq!(b.purge(61_000), 1);
    assert_eq!(b.len(), 1);
    assert_eq!(
        b.redeem("early", 61_000).unwrap_err().code,
        ErrorCode::TicketInvalid
    );
    assert_eq!(b.redeem("late", 61_000).unwrap().name, "b");
    assert_eq!(b.purge(160_000), 1);
    assert!(b.is_empty());
    assert_eq!(b.purge(u64::MAX), 0);
}

#[test]
fn purging_on_every_issue_scans_at_most_once_a_second() {
    let mut b = TicketBook::default();
    b.issue("a".into(), grant("a"), 1_000);
    assert_eq!(b.purge_now_and_then(61_000), 1, "the first call purges");
    b.issue("b".into(), grant("b"), 1_000);
    assert_eq!(
        b.purge_now_and_then(61_999),
        0,
        "within the second: no scan"
    );
    assert_eq!(b.len(), 1);
    assert_eq!(b.purge_now_and_then(62_000), 1, "a second later it does");
    assert!(b.is_empty());
}

#[test]
fn a_ticket_that_never_expires_survives_purge() {
    let mut b = TicketBook::default();
    b.issue("forever".into(), grant("a"), u64::MAX);
    assert_eq!(b.purge(u64::MAX - 1), 0);
    assert_eq!(b.redeem("forever", u64::MAX - 1).unwrap().name, "a");
}

#[test]
fn bucket_starts_full_and_refills_at_its_rate() {
    let mut b = TokenBucket::new(1_000, 2, 5_000);
    assert!(b.try_take(5_000));
    assert!(b.try_take(5_000));
    assert!(!b.try_take(5_000));
    // 1000/s is one token per millisecond
    assert!(b.try_take(5_001));
    assert!(!b.try_take(5_001));
    // a long pause refills to the burst only
    let ok = (0..10).filter(|_| b.try_take(1_000_000)).count();
    assert_eq!(ok, 2);
}

#[test]
fn bucket_with_zero_burst_still_allows_one() {
    let mut b = TokenBucket::new(1, 0, 0);
    assert!(b.try_take(0));
    assert!(!b.try_take(999));
    assert!(b.try_take(1_000));
    assert!(!b.try_take(1_000));
}

#[test]
fn bucket_with_zero_rate_never_refills() {
    let mut b = TokenBucket::new(0, 3, 0);
    assert_eq!((0..5).filter(|_| b.try_take(0)).count(), 3);
    assert!(!b.try_take(u64::MAX));
}

#[test]
fn bucket_ignores_a_clock_going_backwards() {
    let mut b = TokenBucket::new(10, 1, 1_000);
    assert!(b.try_take(1_000));
    assert!(!b.try_take(0));
    // time before the last observation does not count twice
    assert!(!b.try_take(1_099));
    assert!(b.try_take(1_100));
}

#[test]
fn bucket_refill_does_not_depend_on_how_often_it_is_asked() {
    // 10 tokens per second: after 100 ms there is a token again, whether or
    // not the bucket was polled in between.
    let mut polled = TokenBucket::new(10, 1, 0);
    let mut idle = TokenBucket::new(10, 1, 0);
    assert!(polled.try_take(0) && idle.try_take(0));
    for t in (10..100).step_by(10) {
        assert!(!polled.try_take(t), "at {t}");
    }
    assert!(idle.try_take(100));
    assert!(polled.try_take(100));
    // a third of a second per token at 3/s, fractions carried over
    let mut b = TokenBucket::new(3, 10, 0);
    assert_eq!((0..11).filter(|_| b.try_take(0)).count(), 10);
    let mut granted = Vec::new();
    for t in 1..=2_000 {
        if b.try_take(t) {
            granted.push(t);
        }
    }
    assert_eq!(granted, vec![334, 667, 1_000, 1_334, 1_667, 2_000]);
}

#[test]
fn a_full_bucket_does_not_bank_refill() {
    // with a burst of one, the refill that arrives while the bucket is full
    // is lost: at 3/s and polled every ms, a token comes every 334 ms
    let mut b = TokenBucket::new(3, 1, 0);
    assert!(b.try_take(0));
    let granted: Vec<u64> = (1..=2_000).filter(|t| b.try_take(*t)).collect();
    assert_eq!(granted, vec![334, 668, 1_002, 1_336, 1_670]);
}

#[test]
fn log_capacity_is_at_least_one() {
    let mut log = RoomLog::new(0);
    assert_eq!(log.capacity(), 1);
    assert!(log.is_empty());
    assert_eq!(log.first_seq(), None);
    log.push(entry(1));
    log.push(entry(2));
    assert_eq!(log.len(), 1);
    assert_eq!(log.first_seq(), Some(2));
}

#[test]
fn log_since_on_the_edges() {
    let empty = RoomLog::new(4);
    assert_eq!(empty.since(0).map(|it| it.count()), Some(0));
    assert_eq!(empty.since(7).map(|it| it.count()), Some(0));
    let mut log = RoomLog::new(4);
    for s in 1..=3 {
        log.push(entry(s));
    }
    let seqs = |l: u64| log.since(l).map(|it| it.map(|e| e.seq).collect::<Vec<_>>());
    assert_eq!(seqs(0), Some(vec![1, 2, 3]));
    assert_eq!(seqs(3), Some(vec![]));
    assert_eq!(seqs(4), Some(vec![]));
    assert_eq!(seqs(u64::MAX), Some(vec![]));
    assert_eq!(log.last(0).count(), 0);
    assert_eq!(
        log.last(10).map(|e| e.seq).collect::<Vec<_>>(),
        vec![1, 2, 3]
    );
}

#[test]
fn log_may_start_at_any_seq() {
    let mut log = RoomLog::new(2);
    log.push(entry(41));
    log.push(entry(42));
    log.push(entry(43));
    let seqs = |l: u64| log.since(l).map(|it| it.map(|e| e.seq).collect::<Vec<_>>());
    assert_eq!(seqs(0), None);
    assert_eq!(seqs(41), Some(vec![42, 43]));
    assert_eq!(seqs(42), Some(vec![43]));
}

#[test]
#[should_panic(expected = "gap-free")]
fn log_refuses_a_repeated_seq() {
    let mut log = RoomLog::new(3);
    log.push(entry(1));
    log.push(entry(1));
}

#[test]
fn entity_store_check_and_snapshot() {
    let mut s = EntityStore::default();
    assert!(s.is_empty());
    assert_eq!(
        s.check("e1", None).unwrap_err().code,
        ErrorCode::EntityNotFound
    );
    s.create(Some("a".into()), json!(1));
    s.create(None, json!({"k": [1]}));
    assert_eq!(s.len(), 2);
    assert_eq!(s.check("e2", Some(1)).unwrap().data, json!({"k": [1]}));
    assert_eq!(
        s.check("e2", Some(2)).unwrap_err().code,
        ErrorCode::VersionConflict
    );
    let snap = s.snapshot();
    let ids: Vec<&str> = snap.iter().map(|e| e.id.as_str()).collect();
    assert_eq!(ids, ["e1", "e2"]);
    assert_eq!(snap[0].kind.as_deref(), Some("a"));
    // patching null fields that are absent changes nothing but the version
    let mut m = Map::new();
    m.insert("missing".into(), Value::Null);
    let p = s.patch("e2", m, Some(1)).unwrap();
    assert_eq!((p.version, p.data), (2, json!({"k": [1]})));
    // a refused change leaves the entity alone
    assert!(s.set("e2", json!(0), Some(1)).is_err());
    assert_eq!(s.get("e2").unwrap().version, 2);
    assert_eq!(s.delete("e1", None).unwrap(), 1);
    assert_eq!(s.len(), 1);
}
