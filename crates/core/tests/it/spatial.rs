//! Spatial rooms against brute force: the grid against a pass over every
//! point, and the space's proximity and interest decisions against a model
//! that checks every pair at every evaluation.

use std::collections::{BTreeMap, BTreeSet};

use plaza_core::spatial::{Movement, PairState, Space, SpaceConfig, SpaceEvent, SpatialGrid, Vec2};
use plaza_core::Millis;
use proptest::prelude::*;

const SESSIONS: [&str; 6] = ["a", "b", "c", "d", "e", "f"];

/// A command; coordinates are fractions of the plane's sides (outside [0, 1]:
/// off the plane), speeds fractions of the fastest allowed.
#[derive(Debug, Clone)]
enum Op {
    Join(usize, f64, f64),
    MoveTo(usize, f64, f64, f64),
    Jump(usize, f64, f64),
    Leave(usize),
    /// The clock moves and the room ticks.
    Advance(u64),
    /// The clock moves without a tick (never past a deadline): the next
    /// command lands between ticks.
    Wait(u64),
}

fn op(sessions: usize) -> impl Strategy<Value = Op> {
    let coord = -0.1f64..1.1;
    // Mostly walking paces, sometimes up to the fastest allowed.
    let speed = prop_oneof![4 => 0.0002f64..0.03, 1 => 0.0001f64..=1.0];
    prop_oneof![
        (0..sessions, coord.clone(), coord.clone()).prop_map(|(s, x, y)| Op::Join(s, x, y)),
        (0..sessions, coord.clone(), coord.clone(), speed)
            .prop_map(|(s, x, y, v)| Op::MoveTo(s, x, y, v)),
        (0..sessions, coord.clone(), coord).prop_map(|(s, x, y)| Op::Jump(s, x, y)),
        // Everyone to one spot: every pair within reach.
        (0..sessions).prop_map(|s| Op::Jump(s, 0.5, 0.5)),
        (0..sessions).prop_map(Op::Leave),
        (0u64..3_000).prop_map(Op::Advance),
        (0u64..300).prop_map(Op::Advance),
        (0u64..300).prop_map(Op::Wait),
    ]
}

/// Valid settings across their bounds: planes from 1 to 1e9 units, areas of
/// interest from a ten-thousandth of the plane to beyond it.
fn config() -> impl Strategy<Value = SpaceConfig> {
    (
        0.0f64..9.0,
        -1.0f64..1.0,
        1.0f64..4.0,
        -4.0f64..0.5,
        0.05f64..1.0,
        prop_oneof![Just(0u64), 0u64..3_000],
        10u64..1_000,
        any::<bool>(),
    )
        .prop_map(
            |(side, aspect, hysteresis, aoi, prox, dwell, tick, direct)| {
                let width = 10f64.powf(side);
                let height = (width * 10f64.powf(aspect)).clamp(1.0, 1e9);
                let aoi_radius = width.max(height) * 10f64.powf(aoi) / hysteresis * 1.01;
                SpaceConfig {
                    width,
                    height,
                    proximity_radius: aoi_radius * prox / hysteresis,
                    hysteresis,
                    min_dwell_ms: dwell,
                    aoi_radius,
                    tick_ms: tick,
                    direct_in_proximity_only: direct,
                }
            },
        )
        .prop_filter("valid", |c| c.validate().is_ok())
}

/// Every pair, every evaluation: the rules without an index.
struct Model {
    config: SpaceConfig,
    movements: BTreeMap<String, Movement>,
    pairs: BTreeMap<(String, String), PairState>,
    interest: BTreeSet<(String, String)>,
    next_pair: u64,
}

impl Model {
    fn new(config: SpaceConfig) -> Model {
        Model {
            config,
            movements: BTreeMap::new(),
            pairs: BTreeMap::new(),
            interest: BTreeSet::new(),
            next_pair: 1,
        }
    }

    /// Decides every pair (`only` = `None`) or the pairs of one member.
    fn evaluate(&mut self, now: Millis, only: Option<&str>) -> Vec<SpaceEvent> {
        let c = &self.config;
        let (r, leave_r) = (c.proximity_radius, c.proximity_radius * c.hysteresis);
        let (aoi, aoi_leave) = (c.aoi_radius, c.aoi_radius * c.hysteresis);
        let dwell = c.min_dwell_ms;
        let mut events = Vec::new();
        let ids: Vec<&String> = self.movements.keys().collect();
        let mut pairs = Vec::new();
        for (i, a) in ids.iter().enumerate() {
            for b in &ids[i + 1..] {
                if only.is_some_and(|s| s != a.as_str() && s != b.as_str()) {
                    continue;
                }
                let pa = self.movements[*a].position_at(now);
                let pb = self.movements[*b].position_at(now);
                pairs.push(((*a).clone(), (*b).clone(), pa.distance(pb)));
            }
        }
        for (a, b, d) in &pairs {
            let (a, b, d) = (a.clone(), b.clone(), *d);
            let key = (a.clone(), b.clone());
            match self.pairs.get(&key).copied() {
                Some(PairState::In { id, since }) => {
                    if d > leave_r && now >= since + dwell {
                        self.pairs.insert(key, PairState::Out { since: now });
                        events.push(SpaceEvent::ProximityLeave { pair: id, a, b });
                    }
                }
                Some(PairState::Out { since }) if now < since + dwell => {}
                _ => {
                    if d <= r {
                        let id = self.next_pair;
                        self.next_pair += 1;
                        self.pairs.insert(key, PairState::In { id, since: now });
                        events.push(SpaceEvent::ProximityEnter { pair: id, a, b });
                    }
                }
            }
        }
        for (a, b, d) in pairs {
            let key = (a.clone(), b.clone());
            let in_call = matches!(self.pairs.get(&key), Some(PairState::In { .. }));
            if self.interest.contains(&key) && d > aoi_leave && !in_call {
                self.interest.remove(&key);
                events.push(SpaceEvent::InterestLeave { a, b });
            } else if !self.interest.contains(&key) && d <= aoi {
                self.interest.insert(key);
                events.push(SpaceEvent::InterestEnter { a, b });
            }
        }
        events.sort();
        events
    }

    fn leave(&mut self, s: &str) -> Vec<SpaceEvent> {
        if self.movements.remove(s).is_none() {
            return Vec::new();
        }
        let mut events = Vec::new();
        let keys: Vec<(String, String)> = self
            .pairs
            .keys()
            .filter(|(a, b)| a == s || b == s)
            .cloned()
            .collect();
        for (a, b) in keys {
            if let Some(PairState::In { id, .. }) = self.pairs.remove(&(a.clone(), b.clone())) {
                events.push(SpaceEvent::ProximityLeave { pair: id, a, b });
            }
        }
        let seen: Vec<(String, String)> = self
            .interest
            .iter()
            .filter(|(a, b)| a == s || b == s)
            .cloned()
            .collect();
        for (a, b) in seen {
            self.interest.remove(&(a.clone(), b.clone()));
            events.push(SpaceEvent::InterestLeave { a, b });
        }
        events.sort();
        events
    }
}

/// Runs `ops` on a [`Space`] and on the model, checking every event and rule,
/// and that each command's work stays within [`Space::last_work`]'s budget.
fn space_matches_the_model(config: SpaceConfig, ops: Vec<Op>) -> Result<(), TestCaseError> {
    {
        let (w, h) = (config.width, config.height);
        let point = |x: f64, y: f64| Vec2::new(x * w, y * h);
        let mut peak = 0usize;
        let mut space = Space::new(config.clone());
        let mut model = Model::new(config.clone());
        let mut now: Millis = 1_000_000;
        let mut ticked_at = now;
        // The last change of each pair, to check the dwell.
        let mut changed: BTreeMap<(String, String), Millis> = BTreeMap::new();
        for op in ops {
            let before = space.export();
            let stated = before.pairs.len() + before.interest.len();
            let (events, left, only) = match op {
                Op::Join(s, x, y) => {
                    let s = SESSIONS[s];
                    if space.movements().contains_key(s) {
                        continue;
                    }
                    let p = point(x, y);
                    let joined = space.join(s, p, now);
                    prop_assert_eq!(
                        joined.clamped,
                        !(0.0..=w).contains(&p.x) || !(0.0..=h).contains(&p.y)
                    );
                    model.movements.insert(s.to_owned(), joined.movement);
                    (joined.events, None, Some(s))
                }
                Op::MoveTo(s, x, y, v) => {
                    let s = SESSIONS[s];
                    let v = v * config.max_speed();
                    match space.move_to(s, point(x, y), v, now) {
                        Ok(moved) => {
                            let m = moved.movement;
                            prop_assert!(
                                (0.0..=w).contains(&m.to.x) && (0.0..=h).contains(&m.to.y)
                            );
                            prop_assert_eq!(m.from, model.movements[s].position_at(now));
                            model.movements.insert(s.to_owned(), m);
                            (moved.events, None, Some(s))
                        }
                        Err(_) => {
                            prop_assert!(!model.movements.contains_key(s));
                            continue;
                        }
                    }
                }
                Op::Jump(s, x, y) => {
                    let s = SESSIONS[s];
                    match space.jump(s, point(x, y), now) {
                        Ok(moved) => {
                            model.movements.insert(s.to_owned(), moved.movement);
                            (moved.events, None, Some(s))
                        }
                        Err(_) => continue,
                    }
                }
                Op::Leave(s) => {
                    let s = SESSIONS[s];
                    let events = space.leave(s);
                    prop_assert_eq!(&events, &model.leave(s));
                    // A member who left takes its pairs along, in proximity or not: they
                    // start afresh (no dwell) if it comes back.
                    changed.retain(|(a, b), _| a != s && b != s);
                    (events, Some(s), None)
                }
                Op::Advance(dt) => {
                    // Never past a deadline the space asked for: the room wakes it then.
                    let next = space
                        .next_deadline(ticked_at)
                        .map_or(now + dt, |d| d.min(now + dt));
                    now = next.max(now);
                    ticked_at = now;
                    (space.tick(now), None, None)
                }
                Op::Wait(dt) => {
                    let next = space
                        .next_deadline(ticked_at)
                        .map_or(now + dt, |d| d.min(now + dt));
                    now = next.max(now);
                    continue;
                }
            };
            peak = peak.max(space.movements().len());
            let work = space.last_work();
            match (&left, only) {
                (Some(_), _) => {}
                (None, Some(_)) => prop_assert!(work <= 5 * peak, "a move took {} steps", work),
                (None, None) => {
                    let far = 2.0 * 2f64.sqrt() * config.aoi_radius * config.hysteresis;
                    let at: Vec<Vec2> = space
                        .movements()
                        .values()
                        .map(|m| m.position_at(now))
                        .collect();
                    let mut close = 0;
                    for (i, p) in at.iter().enumerate() {
                        close += at[i + 1..]
                            .iter()
                            .filter(|q| p.distance(**q) <= far)
                            .count();
                    }
                    let budget = 10 * peak + 2 * close + 2 * stated;
                    prop_assert!(
                        work <= budget,
                        "a tick took {} steps, budget {}",
                        work,
                        budget
                    );
                }
            }
            if left.is_none() {
                let expected = model.evaluate(now, only);
                prop_assert_eq!(&events, &expected, "at {}", now);
            }
            for e in &events {
                match e {
                    SpaceEvent::ProximityEnter { a, b, .. } => {
                        prop_assert!(a < b, "the initiator is the smaller id");
                        let pa = space.position(a, now).unwrap();
                        let pb = space.position(b, now).unwrap();
                        prop_assert!(pa.distance(pb) <= config.proximity_radius);
                        if let Some(t) = changed.get(&(a.clone(), b.clone())) {
                            prop_assert!(now >= t + config.min_dwell_ms, "re-entered too soon");
                        }
                        changed.insert((a.clone(), b.clone()), now);
                    }
                    SpaceEvent::ProximityLeave { a, b, .. } => {
                        if left.is_none() {
                            let pa = space.position(a, now).unwrap();
                            let pb = space.position(b, now).unwrap();
                            prop_assert!(
                                pa.distance(pb) > config.proximity_radius * config.hysteresis
                            );
                            let t = changed[&(a.clone(), b.clone())];
                            prop_assert!(now >= t + config.min_dwell_ms, "left too soon");
                            changed.insert((a.clone(), b.clone()), now);
                        } else {
                            // A member who left takes its pairs along, and they start afresh.
                            changed.remove(&(a.clone(), b.clone()));
                        }
                    }
                    _ => {}
                }
            }
            // A pair in proximity is always in each other's area of interest.
            for ((a, b), _) in space.pairs_in_proximity() {
                prop_assert!(space.sees(a, b));
            }
        }
    }
    Ok(())
}

/// Found by the property below: a pair that went apart, then one of them left and came back
/// close to the other at once. The left member's pairs start afresh: entering at once is right.
#[test]
fn a_member_that_leaves_and_comes_back_starts_its_pairs_afresh() {
    let ops = vec![
        Op::Join(5, 0.0, 0.0),
        Op::Jump(5, 0.6462295977253857, 0.7475568931441908),
        Op::Join(2, 0.640150295654805, 0.7416721257430181),
        Op::Advance(1000),
        Op::Jump(5, 0.8069686186890958, 0.6202443358885538),
        Op::Leave(2),
        Op::Join(2, 0.7885509426401829, 0.6231746947449449),
    ];
    space_matches_the_model(SpaceConfig::default(), ops).unwrap();
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    #[test]
    fn the_space_decides_what_every_pair_checked_by_hand_decides(ops in prop::collection::vec(op(SESSIONS.len()), 1..80)) {
        space_matches_the_model(SpaceConfig::default(), ops)?;
    }

    /// Any valid settings, from a plane of one unit to one of 1e9 with an
    /// area of interest of a ten-thousandth of it, speeds up to the fastest
    /// allowed: the same decisions as the model, and every command within
    /// its budget.
    #[test]
    fn any_valid_settings_decide_alike_within_the_work_budget(
        config in config(),
        ops in prop::collection::vec(op(SESSIONS.len()), 1..80),
    ) {
        space_matches_the_model(config, ops)?;
    }

    #[test]
    fn the_grid_finds_exactly_what_a_pass_over_every_point_finds(
        points in prop::collection::vec((-500.0f64..3000.0, -500.0f64..3000.0), 0..60),
        moves in prop::collection::vec((0usize..60, -500.0f64..3000.0, -500.0f64..3000.0), 0..30),
        queries in prop::collection::vec((-500.0f64..3000.0, -500.0f64..3000.0, 0.0f64..1500.0), 1..20),
        cell in 50.0f64..800.0,
    ) {
        let mut grid = SpatialGrid::new(cell);
        let mut at: BTreeMap<usize, Vec2> = BTreeMap::new();
        for (i, (x, y)) in points.iter().enumerate() {
            grid.place(i, Vec2::new(*x, *y));
            at.insert(i, Vec2::new(*x, *y));
        }
        for (i, x, y) in moves {
            if i % 7 == 0 {
                prop_assert_eq!(grid.remove(&i), at.remove(&i).is_some());
            } else if at.contains_key(&i) {
                grid.place(i, Vec2::new(x, y));
                at.insert(i, Vec2::new(x, y));
            }
        }
        prop_assert_eq!(grid.len(), at.len());
        for (x, y, r) in queries {
            let p = Vec2::new(x, y);
            let mut found: Vec<usize> = grid.within(p, r).into_iter().copied().collect();
            found.sort_unstable();
            let brute: Vec<usize> = at.iter().filter(|(_, q)| q.distance_sq(p) <= r * r).map(|(k, _)| *k).collect();
            prop_assert_eq!(found, brute);
        }
    }
}
