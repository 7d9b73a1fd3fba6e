//! A spatial room between its ticks: a command that decides one member's
//! pairs must not cost the others the tick that decides theirs, and a
//! replica loaded from a snapshot must tick when the original does.

use crate::common::*;
use plaza_core::spatial::{PairState, SpaceConfig};
use plaza_core::{Millis, Room, RoomConfig};
use plaza_protocol::client::Op;
use plaza_protocol::ErrorCode;

/// Default plane (2000 × 2000, proximity 150, areas of interest 600,
/// hysteresis 1.2, dwell 1 s, tick 100 ms).
fn spatial_room() -> Room<u32> {
    room_with(RoomConfig {
        space: Some(SpaceConfig::default()),
        ..RoomConfig::default()
    })
}

fn jump(r: &mut Room<u32>, n: u32, x: f64, y: f64, now: Millis) {
    ok(r, n, Op::SpaceJump { to: [x, y] }, now);
}

fn walk(r: &mut Room<u32>, n: u32, x: f64, y: f64, speed: f64, now: Millis) {
    ok(r, n, Op::SpaceMove { to: [x, y], speed }, now);
}

fn in_proximity(r: &Room<u32>, a: u32, b: u32) -> bool {
    let state = r.export(|s| s.to_string()).space.expect("a spatial room");
    state
        .space
        .pairs
        .iter()
        .any(|((x, y), s)| (x, y) == (&sid(a), &sid(b)) && matches!(s, PairState::In { .. }))
}

fn see(r: &Room<u32>, a: u32, b: u32) -> bool {
    let state = r.export(|s| s.to_string()).space.expect("a spatial room");
    state.space.interest.contains(&(sid(a), sid(b)))
}

/// Ticks at every deadline the room asks for, up to `until`.
fn run_until(r: &mut Room<u32>, until: Millis) {
    while let Some(d) = r.next_deadline().filter(|d| *d <= until) {
        r.tick(d);
    }
}

/// When the scenes below start: members may meet where they spawn, and
/// the dwell holds such calls for a second.
const T: Millis = 10_000;

/// Members 1 and 2 in a call, member 3 far away, all settled at `T`.
fn call_with_a_bystander(config: SpaceConfig) -> Room<u32> {
    let mut r = room_with(RoomConfig {
        space: Some(config),
        ..RoomConfig::default()
    });
    for n in 1..=3 {
        join(&mut r, n, 0);
    }
    jump(&mut r, 1, 100.0, 100.0, 0);
    jump(&mut r, 2, 110.0, 100.0, 0);
    jump(&mut r, 3, 1900.0, 1900.0, 0);
    run_until(&mut r, T);
    assert!(in_proximity(&r, 1, 2));
    assert!(!in_proximity(&r, 1, 3) && !in_proximity(&r, 2, 3));
    assert_eq!(r.next_deadline(), None, "settled");
    r
}

#[test]
fn a_change_held_by_the_dwell_happens_though_another_member_jumps_when_it_falls_due() {
    let mut r = call_with_a_bystander(SpaceConfig::default());
    jump(&mut r, 2, 1000.0, 1000.0, T);
    assert!(!in_proximity(&r, 1, 2), "the call had lasted its dwell");
    // Back at once: the dwell holds the new call until T + 1000.
    jump(&mut r, 2, 110.0, 100.0, T + 200);
    assert!(!in_proximity(&r, 1, 2));
    assert_eq!(r.next_deadline(), Some(T + 1000));
    jump(&mut r, 3, 1800.0, 1800.0, T + 1000);
    assert_eq!(r.next_deadline(), Some(T + 1000), "still due");
    run_until(&mut r, T + 5_000);
    assert!(in_proximity(&r, 1, 2));
}

#[test]
fn others_moving_between_ticks_do_not_put_off_the_tick_that_decides_a_walker() {
    let mut r = call_with_a_bystander(SpaceConfig::default());
    jump(&mut r, 2, 995.0, 100.0, T);
    run_until(&mut r, T + 2_000);
    assert!(!see(&r, 1, 2), "895 apart");
    // Member 2 walks towards member 1 (areas of interest: 600, reached
    // after 2.95 s) while member 3 jumps every 50 ms, faster than the tick.
    let start = T + 2_000;
    walk(&mut r, 2, 700.0, 100.0, 100.0, start);
    let mut now = start;
    while now < start + 4_000 {
        now += 50;
        run_until(&mut r, now);
        jump(&mut r, 3, 1800.0 + (now % 100) as f64, 1800.0, now);
    }
    assert!(see(&r, 1, 2), "2 stands 600 from 1: they see each other");
}

#[test]
fn a_replica_loaded_mid_dwell_ticks_when_the_original_does() {
    let mut r = call_with_a_bystander(SpaceConfig::default());
    jump(&mut r, 2, 1000.0, 1000.0, T);
    jump(&mut r, 2, 110.0, 100.0, T + 200); // re-entry held until T + 1000
    run_until(&mut r, T + 600);
    assert_eq!(r.next_deadline(), Some(T + 1000), "nobody moves");
    // Through MessagePack, as a data directory keeps it (the JSON path is
    // the replica tests').
    let state = rmp_serde::to_vec_named(&r.export(|s| s.to_string())).unwrap();
    let mut copy: Room<u32> = Room::import(rmp_serde::from_slice(&state).unwrap(), |o| {
        o.parse().unwrap()
    });
    assert_eq!(copy.next_deadline(), r.next_deadline());
    let mut now = T + 600;
    while now < T + 12_000 {
        now = r.next_deadline().unwrap_or(T + 12_000);
        assert_eq!(copy.next_deadline(), r.next_deadline(), "at {now}");
        let (a, b) = (r.tick(now), copy.tick(now));
        assert_eq!(seqs(&a), seqs(&b), "at {now}");
    }
    assert!(in_proximity(&r, 1, 2) && in_proximity(&copy, 1, 2));
    assert_eq!(
        serde_json::to_string(&r.export(|s| s.to_string())).unwrap(),
        serde_json::to_string(&copy.export(|s| s.to_string())).unwrap()
    );
}

#[test]
fn a_slow_walk_cut_short_stops_the_ticks() {
    let mut r = call_with_a_bystander(SpaceConfig::default());
    walk(&mut r, 3, 0.0, 1900.0, 0.001, T); // would arrive in 22 days
    jump(&mut r, 3, 1900.0, 1900.0, T + 10);
    run_until(&mut r, T + 1_000);
    assert_eq!(r.next_deadline(), None, "nobody moves, nothing held");
}

#[test]
fn a_member_that_leaves_after_dropping_leaves_nothing_behind() {
    let mut r = call_with_a_bystander(SpaceConfig::default());
    r.disconnect(&sid(3), T);
    let parked = |r: &Room<u32>| r.export(|s| s.to_string()).space.unwrap().parked;
    assert!(parked(&r).contains_key(&sid(3)), "kept for a resume");
    r.leave(&sid(3), T + 1);
    assert!(parked(&r).is_empty());
}

#[test]
fn moves_in_a_room_without_a_space_and_bad_moves_are_refused() {
    let mut r = room();
    join(&mut r, 1, 0);
    let jump = Op::SpaceJump { to: [1.0, 1.0] };
    assert_eq!(err(&mut r, 1, jump, 0), ErrorCode::InvalidArgs);
    let mut r = spatial_room();
    join(&mut r, 1, 0);
    for speed in [0.0, -1.0, f64::NAN] {
        let walk = Op::SpaceMove {
            to: [1.0, 1.0],
            speed,
        };
        assert_eq!(err(&mut r, 1, walk, 0), ErrorCode::InvalidArgs);
    }
    let nowhere = Op::SpaceJump {
        to: [f64::INFINITY, 1.0],
    };
    assert_eq!(err(&mut r, 1, nowhere, 0), ErrorCode::InvalidArgs);
}

#[test]
fn directs_outside_proximity_are_refused_where_the_room_asks_for_it() {
    let r = call_with_a_bystander(SpaceConfig {
        direct_in_proximity_only: true,
        ..SpaceConfig::default()
    });
    assert!(r.direct_target(&sid(1), &sid(2)).is_ok());
    assert_eq!(
        code(r.direct_target(&sid(1), &sid(3))),
        ErrorCode::NotInProximity
    );
}
