//! Lock leases through room requests: ownership, renewal, expiry, fencing.

use crate::common::*;
use plaza_core::{LockTable, RoomConfig};
use plaza_protocol::ErrorCode;
use serde_json::{json, Value};

fn three() -> plaza_core::Room<u32> {
    let mut r = room_with(RoomConfig {
        default_lock_ttl_ms: 1_000,
        max_lock_ttl_ms: 5_000,
        ..RoomConfig::default()
    });
    for n in 1..=3 {
        join(&mut r, n, 0);
    }
    r
}

#[test]
fn acquire_grants_a_lease_with_a_token() {
    let mut r = three();
    let out = ok(&mut r, 1, acquire("doc", Some(300)), 100);
    assert_eq!(
        out.result,
        json!({"lock": {"object": "doc", "owner": "s1", "token": 1, "expires_at": 400}, "seq": 4})
    );
    assert_eq!(out.events.len(), 1);
    assert_eq!(
        frame(&out.events[0]),
        json!({"type": "event", "room": "r", "seq": 4, "ts": 100, "from": "s1",
               "kind": "lock.acquired",
               "lock": {"object": "doc", "owner": "s1", "token": 1, "expires_at": 400}})
    );
    assert_eq!(recipients(&r, &out.events[0]), sessions(&[2, 3]));
    let snap = r.snapshot(100);
    assert_eq!(snap.locks.len(), 1);
    assert_eq!(snap.locks[0].owner, "s1");
    assert_eq!(
        r.snapshot(400).locks.len(),
        0,
        "an ended lease is not shown"
    );
}

#[test]
fn another_session_cannot_take_a_live_lease() {
    let mut r = three();
    ok(&mut r, 1, acquire("doc", Some(300)), 100);
    assert_eq!(
        err(&mut r, 2, acquire("doc", Some(300)), 399),
        ErrorCode::LockHeld
    );
    assert_eq!(
        err(&mut r, 2, renew("doc", None), 200),
        ErrorCode::LockNotHeld
    );
    assert_eq!(err(&mut r, 2, release("doc"), 200), ErrorCode::LockNotHeld);
    assert_eq!(r.seq(), 4);
    // other objects are independent
    let out = ok(&mut r, 2, acquire("other", Some(300)), 200);
    assert_eq!(out.result["lock"]["token"], 2);
}

#[test]
fn reacquiring_ones_own_lock_issues_a_new_token() {
    let mut r = three();
    ok(&mut r, 1, acquire("doc", Some(300)), 100);
    let out = ok(&mut r, 1, acquire("doc", Some(500)), 200);
    assert_eq!(out.events.len(), 1, "no release for a live lease");
    assert_eq!(out.result["lock"]["token"], 2);
    assert_eq!(out.result["lock"]["expires_at"], 700);
}

#[test]
fn renew_extends_the_lease_and_keeps_the_token() {
    let mut r = three();
    ok(&mut r, 1, acquire("doc", Some(300)), 100);
    let out = ok(&mut r, 1, renew("doc", Some(1_000)), 350);
    assert_eq!(
        out.result,
        json!({"lock": {"object": "doc", "owner": "s1", "token": 1, "expires_at": 1_350}, "seq": 5})
    );
    assert_eq!(kind(&out.events[0]), "lock.acquired");
    assert_eq!(recipients(&r, &out.events[0]), sessions(&[2, 3]));
    // the old end no longer frees it
    assert!(r.tick(400).is_empty());
    assert_eq!(
        err(&mut r, 2, acquire("doc", None), 1_349),
        ErrorCode::LockHeld
    );
    // default ttl when none is given
    let out = ok(&mut r, 1, renew("doc", None), 1_300);
    assert_eq!(out.result["lock"]["expires_at"], 2_300);
    // an ended lease cannot be renewed
    assert_eq!(
        err(&mut r, 1, renew("doc", None), 2_300),
        ErrorCode::LockNotHeld
    );
    // nor one never held
    assert_eq!(
        err(&mut r, 1, renew("nothing", None), 0),
        ErrorCode::LockNotHeld
    );
}

#[test]
fn release_frees_the_object() {
    let mut r = three();
    ok(&mut r, 1, acquire("doc", Some(300)), 100);
    let out = ok(&mut r, 1, release("doc"), 150);
    assert_eq!(out.result, json!({"object": "doc", "token": 1, "seq": 5}));
    assert_eq!(
        frame(&out.events[0]),
        json!({"type": "event", "room": "r", "seq": 5, "ts": 150, "from": "s1",
               "kind": "lock.released", "object": "doc", "owner": "s1", "token": 1,
               "reason": "released"})
    );
    assert_eq!(recipients(&r, &out.events[0]), sessions(&[2, 3]));
    assert_eq!(err(&mut r, 1, release("doc"), 160), ErrorCode::LockNotHeld);
    assert!(r.snapshot(160).locks.is_empty());
    assert_eq!(r.next_deadline(), None);
    let out = ok(&mut r, 2, acquire("doc", None), 170);
    assert_eq!(out.result["lock"]["owner"], "s2");
    assert_eq!(out.result["lock"]["token"], 2);
    assert_eq!(out.result["lock"]["expires_at"], 1_170);
}

#[test]
fn an_ended_lease_cannot_be_released() {
    let mut r = three();
    ok(&mut r, 1, acquire("doc", Some(300)), 100);
    assert_eq!(err(&mut r, 1, release("doc"), 400), ErrorCode::LockNotHeld);
    // tick reports it as expired
    let t = r.tick(400);
    assert_eq!(t.len(), 1);
    assert_eq!(frame(&t[0])["reason"], "expired");
}

#[test]
fn tick_expires_leases_at_their_end() {
    let mut r = three();
    ok(&mut r, 1, acquire("a", Some(300)), 100); // ends 400
    ok(&mut r, 2, acquire("b", Some(500)), 100); // ends 600
    assert_eq!(r.next_deadline(), Some(400));
    assert!(r.tick(399).is_empty());
    let t = r.tick(400);
    assert_eq!(t.len(), 1);
    assert_eq!(t[0].seq, 6);
    assert_eq!(t[0].ts, 400);
    assert_eq!(
        frame(&t[0]),
        json!({"type": "event", "room": "r", "seq": 6, "ts": 400,
               "kind": "lock.released", "object": "a", "owner": "s1", "token": 1,
               "reason": "expired"})
    );
    assert_eq!(recipients(&r, &t[0]), sessions(&[1, 2, 3]));
    assert_eq!(r.next_deadline(), Some(600));
    assert!(r.tick(400).is_empty(), "an expiry is reported once");
    // the freed object can be taken by anyone
    let out = ok(&mut r, 3, acquire("a", Some(100)), 401);
    assert_eq!(out.events.len(), 1);
    assert_eq!(out.result["lock"]["token"], 3);
    // a late tick expires everything due at once
    let t = r.tick(10_000);
    assert_eq!(seqs(&t), vec![8, 9]);
    let mut objects: Vec<String> = t
        .iter()
        .map(|e| frame(e)["object"].as_str().unwrap().to_owned())
        .collect();
    objects.sort();
    assert_eq!(objects, ["a", "b"]);
    assert_eq!(r.next_deadline(), None);
}

#[test]
fn taking_an_ended_lease_before_tick_reports_its_expiry_first() {
    let mut r = three();
    ok(&mut r, 1, acquire("doc", Some(300)), 100); // 4
    let out = ok(&mut r, 2, acquire("doc", Some(300)), 400);
    assert_eq!(seqs(&out.events), vec![5, 6]);
    let released = frame(&out.events[0]);
    assert_eq!(released["kind"], "lock.released");
    assert_eq!(released["reason"], "expired");
    assert_eq!(released["owner"], "s1");
    assert_eq!(released["token"], 1);
    assert!(released.get("from").is_none());
    assert_eq!(recipients(&r, &out.events[0]), sessions(&[1, 2, 3]));
    assert_eq!(frame(&out.events[1])["lock"]["owner"], "s2");
    assert_eq!(out.result["seq"], 6);
    // tick has nothing left to report for it
    assert!(r.tick(450).is_empty());
}

#[test]
fn fencing_tokens_strictly_increase() {
    let mut r = three();
    let mut last = 0;
    let mut now = 0;
    for round in 0..5u32 {
        for (n, object) in [(1, "a"), (2, "b"), (3, "a")] {
            now += 1;
            let who = 1 + (n + round) % 3;
            let res = r.request(&sid(who), acquire(object, Some(1)), now);
            if let Ok(out) = res {
                let token = out.result["lock"]["token"].as_u64().unwrap();
                assert!(token > last, "{token} after {last}");
                last = token;
            }
            r.tick(now + 1);
        }
    }
    assert_eq!(last, 15);
}

#[test]
fn disconnect_and_leave_release_the_sessions_locks() {
    let mut r = three();
    ok(&mut r, 1, acquire("a", None), 10);
    ok(&mut r, 1, acquire("b", None), 10);
    ok(&mut r, 2, acquire("c", None), 10);
    let d = r.disconnect(&sid(1), 20);
    assert_eq!(seqs(&d), vec![7, 8, 9]);
    let kinds: Vec<String> = d.iter().map(|e| kind(e)).collect();
    assert_eq!(kinds, ["lock.released", "lock.released", "presence.leave"]);
    for (e, object, token) in [(&d[0], "a", 1), (&d[1], "b", 2)] {
        let v = frame(e);
        assert_eq!(v["object"], object);
        assert_eq!(v["token"], token);
        assert_eq!(v["owner"], "s1");
        assert_eq!(v["reason"], "disconnected");
        assert_eq!(recipients(&r, e), sessions(&[2, 3]));
    }
    let live: Vec<String> = r.snapshot(20).locks.into_iter().map(|l| l.object).collect();
    assert_eq!(live, ["c"]);
    ok(&mut r, 3, acquire("a", None), 21);
    let l = r.leave(&sid(2), 30);
    let kinds: Vec<String> = l.iter().map(|e| kind(e)).collect();
    assert_eq!(kinds, ["lock.released", "presence.leave"]);
    assert_eq!(frame(&l[0])["object"], "c");
    assert_eq!(frame(&l[1])["reason"], "left");
    let live: Vec<String> = r.snapshot(30).locks.into_iter().map(|l| l.object).collect();
    assert_eq!(live, ["a"]);
}

#[test]
fn next_deadline_is_the_earliest_lease_or_resume_window_end() {
    let mut r = room_with(RoomConfig {
        resume_window_ms: 1_000,
        ..RoomConfig::default()
    });
    for n in 1..=3 {
        join(&mut r, n, 0);
    }
    assert_eq!(r.next_deadline(), None);
    ok(&mut r, 1, acquire("a", Some(5_000)), 0);
    assert_eq!(r.next_deadline(), Some(5_000));
    r.disconnect(&sid(2), 100);
    assert_eq!(r.next_deadline(), Some(1_100));
    ok(&mut r, 3, acquire("b", Some(500)), 200);
    assert_eq!(r.next_deadline(), Some(700));
    ok(&mut r, 3, renew("b", Some(2_000)), 300);
    assert_eq!(r.next_deadline(), Some(1_100));
    assert!(r.tick(1_100).is_empty());
    assert_eq!(r.next_deadline(), Some(2_300));
    assert_eq!(r.tick(2_300).len(), 1);
    assert_eq!(r.next_deadline(), Some(5_000));
    r.disconnect(&sid(1), 2_400);
    assert_eq!(r.next_deadline(), Some(3_400));
}

#[test]
fn ttl_must_be_positive_and_is_capped() {
    let mut r = three();
    assert_eq!(
        err(&mut r, 1, acquire("a", Some(0)), 0),
        ErrorCode::InvalidArgs
    );
    assert!(r.snapshot(0).locks.is_empty());
    let out = ok(&mut r, 1, acquire("a", Some(1)), 0);
    assert_eq!(out.result["lock"]["expires_at"], 1);
    let out = ok(&mut r, 1, acquire("b", Some(u64::MAX)), 10);
    assert_eq!(out.result["lock"]["expires_at"], 5_010);
    let out = ok(&mut r, 1, acquire("c", None), 10);
    assert_eq!(out.result["lock"]["expires_at"], 1_010);
    assert_eq!(
        err(&mut r, 1, renew("b", Some(0)), 20),
        ErrorCode::InvalidArgs
    );
    let out = ok(&mut r, 1, renew("b", Some(9_999)), 20);
    assert_eq!(out.result["lock"]["expires_at"], 5_020);
    assert_eq!(r.seq(), 3 + 4);
}

#[test]
fn lock_table_edge_cases() {
    let mut t = LockTable::default();
    assert_eq!(t.next_expiry(), None);
    assert!(t.expire(u64::MAX).is_empty());
    assert!(t.release_all("nobody").is_empty());
    let (a, replaced) = t.acquire("o", "s1", 10, 0).unwrap();
    assert!(replaced.is_none());
    assert_eq!(t.holder("o", 9).unwrap().token, a.token);
    assert!(t.holder("o", 10).is_none());
    // own expired lease, re-acquired: the old one is reported as replaced
    let (b, replaced) = t.acquire("o", "s1", 10, 10).unwrap();
    assert_eq!(replaced.unwrap().token, a.token);
    assert!(b.token > a.token);
    // a huge ttl does not overflow the clock
    let (c, _) = t.acquire("far", "s1", u64::MAX, 1_000).unwrap();
    assert_eq!(c.expires_at, u64::MAX);
    assert!(t.holder("far", u64::MAX - 1).is_some());
    let r = t.renew("far", "s1", u64::MAX, 2_000).unwrap();
    assert_eq!(r.expires_at, u64::MAX);
}

#[test]
fn a_lapsed_lease_of_a_departing_session_ends_as_expired() {
    let mut r = room();
    join(&mut r, 1, 0); // 1
    join(&mut r, 2, 0); // 2
    ok(&mut r, 1, acquire("old", Some(100)), 10); // 3, until 110
    ok(&mut r, 1, acquire("live", Some(10_000)), 20); // 4

    // No tick ran since the first lease lapsed at 110.
    let d = r.disconnect(&sid(1), 200);
    let frames: Vec<Value> = d.iter().map(|e| frame(e)).collect();
    assert_eq!(frames[0]["kind"], "lock.released");
    assert_eq!(frames[0]["object"], "old");
    assert_eq!(frames[0]["reason"], "expired");
    assert!(frames[0].get("from").is_none(), "nobody caused an expiry");
    assert_eq!(frames[1]["object"], "live");
    assert_eq!(frames[1]["reason"], "disconnected");
    assert_eq!(frames[2]["kind"], "presence.leave");
    assert_eq!(d.len(), 3);
    assert!(r.tick(300).is_empty(), "nothing left to expire");
}
