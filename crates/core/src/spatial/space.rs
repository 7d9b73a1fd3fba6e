//! The members of a spatial room: where each is going, who sees whom (areas of
//! interest), and which pairs are in proximity — decided here, by the server,
//! for both sides at once.
//!
//! Positions change between messages, so the space is evaluated on every move
//! and on a tick while anyone moves ([`Space::next_deadline`]). A pair enters
//! proximity at distance ≤ `proximity_radius` and leaves it only beyond
//! `proximity_radius × hysteresis`; no pair changes state again within
//! `min_dwell_ms` of its last change (a change that falls due earlier waits
//! for it). Both members of a pair get the same pair id and the same
//! initiator, the smaller session id: exactly one side starts the call.
//! Areas of interest follow the same hysteresis (no dwell), and a pair in
//! proximity always sees each other.
//!
//! Deterministic like the room: the same inputs give the same events in the
//! same order on every replica.

use std::collections::{BTreeMap, BTreeSet};

use rustc_hash::FxHashMap;

use super::pairs::{order, Adjacency, PairMap};

use serde::{Deserialize, Serialize};

use super::config::SpaceConfig;
use super::geometry::{Movement, Vec2};
use super::grid::SpatialGrid;
use crate::Millis;

/// What a change of the space means for its members, in the order to tell
/// them: calls end before avatars hide, avatars show before calls start.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub enum SpaceEvent {
    /// The pair `a < b` left proximity (or one of them left the room).
    ProximityLeave {
        /// The pair's id, as its `ProximityEnter` gave it.
        pair: u64,
        /// The member with the smaller session id.
        a: String,
        /// The other.
        b: String,
    },
    /// `a < b` no longer see each other.
    InterestLeave {
        /// The member with the smaller session id.
        a: String,
        /// The other.
        b: String,
    },
    /// `a < b` now see each other (each is told of the other's moves).
    InterestEnter {
        /// The member with the smaller session id.
        a: String,
        /// The other.
        b: String,
    },
    /// The pair `a < b` came into proximity: `a`, the initiator, starts the call.
    ProximityEnter {
        /// A new id, unique in the room.
        pair: u64,
        /// The member with the smaller session id: the initiator.
        a: String,
        /// The other.
        b: String,
    },
}

/// The proximity state of a pair that changed state lately or is in proximity.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum PairState {
    /// In proximity since `since`, as pair `id`.
    In {
        /// The pair id.
        id: u64,
        /// When it entered.
        since: Millis,
    },
    /// Out of proximity since `since` (kept only while the dwell holds it).
    Out {
        /// When it left.
        since: Millis,
    },
}

/// Why a move was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SpaceError {
    /// The session is not in the space.
    NotInSpace,
    /// A coordinate or the speed is not a finite number, or the speed is not positive.
    InvalidArgs(String),
}

/// The outcome of a move or a jump.
#[derive(Debug, Clone, PartialEq)]
pub struct Moved {
    /// The stored movement (its target clamped into the plane).
    pub movement: Movement,
    /// Whether the target was outside the plane.
    pub clamped: bool,
    /// What the move changed, in order.
    pub events: Vec<SpaceEvent>,
}

/// What a space holds besides its settings, as stored in snapshots (the
/// grid is rebuilt from the movements).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SpaceState {
    /// Every member's movement.
    pub movements: BTreeMap<String, Movement>,
    /// Pairs in proximity or held out by the dwell.
    pub pairs: Vec<((String, String), PairState)>,
    /// Pairs that see each other.
    pub interest: Vec<(String, String)>,
    /// The next pair id.
    pub next_pair: u64,
    /// Pairs whose change waits for the dwell, and when it falls due (a
    /// replica that loses them would not tick when the original does).
    #[serde(default)]
    pub held: Vec<((String, String), Millis)>,
    /// When the last movement under way arrives, as the original counts it
    /// (absent from snapshots written before it was kept).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub moving_until: Option<Millis>,
}

/// The spatial part of a room.
#[derive(Debug, Clone)]
pub struct Space {
    config: SpaceConfig,
    /// Every member's movement, by session id.
    movements: BTreeMap<String, Movement>,
    /// Where each member was at the last evaluation.
    grid: SpatialGrid<String>,
    /// Pairs `(a, b)`, `a < b`, in proximity or held out by the dwell.
    pairs: PairMap<PairState>,
    /// Pairs `(a, b)`, `a < b`, that see each other.
    interest: Adjacency,
    next_pair: u64,
    /// When the grid last placed every member.
    grid_at: Millis,
    /// Pairs whose change waits for the dwell, and when it falls due.
    held: PairMap<Millis>,
    /// When the last movement under way arrives (a tick is due until then).
    moving_until: Millis,
}

impl Space {
    /// An empty space; `config` must be valid ([`SpaceConfig::validate`]).
    pub fn new(config: SpaceConfig) -> Space {
        let cell = config.aoi_radius * config.hysteresis;
        Space {
            grid: SpatialGrid::new(cell),
            config,
            movements: BTreeMap::new(),
            pairs: PairMap::default(),
            interest: Adjacency::default(),
            next_pair: 1,
            grid_at: 0,
            held: PairMap::default(),
            moving_until: 0,
        }
    }

    /// Everything but the settings, for a snapshot.
    pub fn export(&self) -> SpaceState {
        SpaceState {
            movements: self.movements.clone(),
            pairs: self
                .pairs
                .iter()
                .map(|(a, b, v)| ((a.clone(), b.clone()), *v))
                .collect(),
            interest: {
                let mut v: Vec<(String, String)> = self
                    .interest
                    .iter()
                    .map(|(a, b)| (a.clone(), b.clone()))
                    .collect();
                // The adjacency is hashed: sorted, replicas export alike.
                v.sort_unstable();
                v
            },
            next_pair: self.next_pair,
            held: self
                .held
                .iter()
                .map(|(a, b, due)| ((a.clone(), b.clone()), *due))
                .collect(),
            moving_until: Some(self.moving_until),
        }
    }

    /// A space continuing from a snapshot.
    pub fn import(config: SpaceConfig, state: SpaceState) -> Space {
        let mut space = Space::new(config);
        space.movements = state.movements;
        for ((a, b), v) in state.pairs {
            space.pairs.insert(&a, &b, v);
        }
        for (a, b) in state.interest {
            space.interest.insert(&a, &b);
        }
        space.next_pair = state.next_pair;
        for ((a, b), due) in state.held {
            space.held.insert(&a, &b, due);
        }
        // Placed where they started; the first tick places them anew (until
        // then a move considers every member).
        for (s, m) in &space.movements {
            space.grid.place(s.clone(), m.from);
        }
        space.moving_until = state.moving_until.unwrap_or_else(|| space.latest_arrival());
        space
    }

    /// The settings.
    pub fn config(&self) -> &SpaceConfig {
        &self.config
    }

    /// Every member's movement, by session id.
    pub fn movements(&self) -> &BTreeMap<String, Movement> {
        &self.movements
    }

    /// Where `session` is at `t`.
    pub fn position(&self, session: &str, t: Millis) -> Option<Vec2> {
        self.movements.get(session).map(|m| m.position_at(t))
    }

    /// The pairs in proximity: `(a, b)`, `a < b`, and the pair id, in order.
    pub fn pairs_in_proximity(&self) -> impl Iterator<Item = ((&String, &String), u64)> {
        self.pairs.iter().filter_map(|(a, b, s)| match s {
            PairState::In { id, .. } => Some(((a, b), *id)),
            PairState::Out { .. } => None,
        })
    }

    /// Whether `a` and `b` are a pair in proximity.
    pub fn in_proximity(&self, a: &str, b: &str) -> bool {
        matches!(self.pairs.get(a, b), Some(PairState::In { .. }))
    }

    /// Whether `a` and `b` see each other (a member always sees itself).
    pub fn sees(&self, a: &str, b: &str) -> bool {
        a == b || self.interest.contains(a, b)
    }

    /// The members `session` sees (and who see it), in order.
    pub fn viewers<'a>(&'a self, session: &'a str) -> impl Iterator<Item = &'a String> + 'a {
        self.interest.neighbours(session)
    }

    /// Places a new member standing at `at` (clamped into the plane).
    pub fn join(&mut self, session: &str, at: Vec2, now: Millis) -> Moved {
        let (at, clamped) = self.config.clamp(at);
        // Standing: nothing for a tick to follow (its own pairs are decided now).
        let movement = Movement::standing(at, now);
        self.movements.insert(session.to_owned(), movement);
        Moved {
            movement,
            clamped,
            events: self.evaluate_for(now, Some(session)),
        }
    }

    /// Starts `session` towards `to` at `speed` units per second from where
    /// it is now.
    pub fn move_to(
        &mut self,
        session: &str,
        to: Vec2,
        speed: f64,
        now: Millis,
    ) -> Result<Moved, SpaceError> {
        if !to.is_finite() {
            return Err(SpaceError::InvalidArgs(
                "to must be two finite numbers".into(),
            ));
        }
        if !(speed.is_finite() && speed > 0.0) {
            return Err(SpaceError::InvalidArgs(format!(
                "speed must be a positive number, not {speed}"
            )));
        }
        let from = self.position(session, now).ok_or(SpaceError::NotInSpace)?;
        let (to, clamped) = self.config.clamp(to);
        let movement = Movement {
            from,
            to,
            t0: now,
            speed,
        };
        self.movements.insert(session.to_owned(), movement);
        self.moving_until = self.moving_until.max(movement.arrives_at());
        Ok(Moved {
            movement,
            clamped,
            events: self.evaluate_for(now, Some(session)),
        })
    }

    /// Puts `session` at `at` at once (a teleport).
    pub fn jump(&mut self, session: &str, at: Vec2, now: Millis) -> Result<Moved, SpaceError> {
        if !at.is_finite() {
            return Err(SpaceError::InvalidArgs(
                "at must be two finite numbers".into(),
            ));
        }
        if !self.movements.contains_key(session) {
            return Err(SpaceError::NotInSpace);
        }
        Ok(self.join(session, at, now))
    }

    /// Removes `session`: its pairs leave proximity and interest at once
    /// (the dwell does not hold a member who is gone).
    pub fn leave(&mut self, session: &str) -> Vec<SpaceEvent> {
        if self.movements.remove(session).is_none() {
            return Vec::new();
        }
        self.grid.remove(&session.to_owned());
        let mut events = Vec::new();
        for (a, b) in self.pairs.pairs_of(session) {
            if let Some(PairState::In { id, .. }) = self.pairs.remove(&a, &b) {
                events.push(SpaceEvent::ProximityLeave { pair: id, a, b });
            }
        }
        for (a, b) in self.interest.pairs_of(session) {
            self.interest.remove(&a, &b);
            events.push(SpaceEvent::InterestLeave { a, b });
        }
        for (a, b) in self.held.pairs_of(session) {
            self.held.remove(&a, &b);
        }
        events.sort();
        events
    }

    /// When the last movement arrives (0 without members).
    fn latest_arrival(&self) -> Millis {
        self.movements
            .values()
            .map(Movement::arrives_at)
            .max()
            .unwrap_or(0)
    }

    /// Re-evaluates the space at `now` (on the room's tick).
    pub fn tick(&mut self, now: Millis) -> Vec<SpaceEvent> {
        self.evaluate_for(now, None)
    }

    /// The next time the space must be evaluated: a tick from now while a
    /// member moves, and when a change held by the dwell falls due.
    pub fn next_deadline(&self, now: Millis) -> Option<Millis> {
        // Both kept up to date by every change: the room asks after every
        // command, and a pass over the pairs each time cost more than the rest.
        let moving = now < self.moving_until;
        let mut next = moving.then(|| now.saturating_add(self.config.tick_ms));
        for (_, _, due) in self.held.iter() {
            if *due > now {
                next = Some(next.map_or(*due, |n| n.min(*due)));
            }
        }
        next
    }

    /// Re-decides at `now` every pair (`only` = `None`, on the tick) or the
    /// pairs of one member whose movement just changed (`Some`): a move
    /// costs its neighbourhood, not the room; the others' pairs follow on the
    /// next tick, on every replica alike. Strings are cloned only for pairs
    /// whose state changes.
    fn evaluate_for(&mut self, now: Millis, only: Option<&str>) -> Vec<SpaceEvent> {
        let c = &self.config;
        // Distances are compared squared: no square root per pair.
        let sq = |x: f64| x * x;
        let (r, leave_r) = (
            sq(c.proximity_radius),
            sq(c.proximity_radius * c.hysteresis),
        );
        let (aoi, reach) = (sq(c.aoi_radius), sq(c.aoi_radius * c.hysteresis));
        let reach_radius = c.aoi_radius * c.hysteresis;
        let dwell = c.min_dwell_ms;
        let diagonal = c.width.hypot(c.height);
        let dwelled = |since: Millis| now >= since.saturating_add(dwell);
        match only {
            None => {
                for (s, m) in &self.movements {
                    self.grid.place_ref(s, m.position_at(now));
                }
                self.grid_at = now;
                // Only grows between ticks (a walk cut short by a jump or a
                // departure still counts): the full pass sets it right.
                self.moving_until = self.latest_arrival();
            }
            Some(session) => {
                let Some(p) = self.movements.get(session).map(|m| m.position_at(now)) else {
                    return Vec::new();
                };
                self.grid.place_ref(&session.to_owned(), p);
            }
        }
        let (movements, grid) = (&self.movements, &self.grid);
        // Pairs (a < b) within reach, and their squared distance.
        let mut near: FxHashMap<(&str, &str), f64> = FxHashMap::default();
        match only {
            None => {
                for (s, m) in movements {
                    let p = m.position_at(now);
                    for other in grid.within(p, reach_radius) {
                        if other > s {
                            let q = grid.position(other).expect("placed");
                            near.insert((s.as_str(), other.as_str()), p.distance_sq(q));
                        }
                    }
                }
            }
            Some(session) => {
                let (session, m) = movements.get_key_value(session).expect("checked above");
                let p = m.position_at(now);
                // Others stand where the last tick placed them, or have walked
                // at most this far since.
                let fastest = movements.values().map(|m| m.speed).fold(0.0, f64::max);
                let margin = fastest * now.saturating_sub(self.grid_at) as f64 / 1000.0;
                let radius = reach_radius + margin;
                // Before the first tick (or right after an import) the margin can
                // exceed the plane: then everyone is a candidate.
                let candidates: Vec<&String> = if radius >= diagonal {
                    movements.keys().collect()
                } else {
                    grid.within(p, radius)
                };
                for other in candidates {
                    if other == session {
                        continue;
                    }
                    let d = p.distance_sq(movements[other].position_at(now));
                    if d <= reach {
                        near.insert(order(session, other), d);
                    }
                }
            }
        }
        let involved = |a: &str, b: &str| only.is_none_or(|s| a == s || b == s);
        let mut events = Vec::new();
        // Proximity, with hysteresis and dwell: the pairs with a state, then
        // those that came within the radius, in order (ids are given in it).
        let mut todo: BTreeSet<(&str, &str)> = near
            .iter()
            .filter(|(_, d)| **d <= r)
            .map(|(k, _)| *k)
            .collect();
        let held: Vec<(String, String)> = self
            .pairs
            .iter()
            .filter(|(a, b, _)| involved(a, b))
            .map(|(a, b, _)| (a.clone(), b.clone()))
            .collect();
        todo.extend(held.iter().map(|(a, b)| (a.as_str(), b.as_str())));
        for (a, b) in todo {
            let d = near.get(&(a, b)).copied().unwrap_or(f64::INFINITY);
            let state = self.pairs.get(a, b).copied();
            // A change the dwell holds back: remembered, so that a tick comes when it falls due.
            let waits = match state {
                Some(PairState::In { since, .. }) => d > leave_r && !dwelled(since),
                Some(PairState::Out { since }) => d <= r && !dwelled(since),
                None => false,
            };
            match (waits, state) {
                (true, Some(PairState::In { since, .. } | PairState::Out { since })) => {
                    self.held.insert(a, b, since.saturating_add(dwell));
                }
                _ => {
                    self.held.remove(a, b);
                }
            }
            match state {
                Some(PairState::In { id, since }) => {
                    if d > leave_r && dwelled(since) {
                        self.pairs.insert(a, b, PairState::Out { since: now });
                        events.push(SpaceEvent::ProximityLeave {
                            pair: id,
                            a: a.to_owned(),
                            b: b.to_owned(),
                        });
                    }
                }
                Some(PairState::Out { since }) if !dwelled(since) => {}
                state => {
                    if d <= r {
                        let id = self.next_pair;
                        self.next_pair += 1;
                        self.pairs.insert(a, b, PairState::In { id, since: now });
                        events.push(SpaceEvent::ProximityEnter {
                            pair: id,
                            a: a.to_owned(),
                            b: b.to_owned(),
                        });
                    } else if state.is_some() {
                        // Out, and the dwell no longer holds it: forget it.
                        self.pairs.remove(a, b);
                    }
                }
            }
        }
        // Interest, with hysteresis, after proximity (which holds it: a
        // member sees whom it is in a call with, however far the dwell keeps
        // the call going).
        // Only the pairs that go are cloned: a tick looks at every pair.
        let pairs = &self.pairs;
        let goes = |a: &str, b: &str| {
            near.get(&(a, b)).is_none_or(|d| *d > reach)
                && !matches!(pairs.get(a, b), Some(PairState::In { .. }))
        };
        let stale: Vec<(String, String)> = match only {
            None => self
                .interest
                .iter()
                .filter(|(a, b)| goes(a, b))
                .map(|(a, b)| (a.clone(), b.clone()))
                .collect(),
            Some(s) => self
                .interest
                .neighbours(s)
                .map(|other| order(s, other))
                .filter(|(a, b)| goes(a, b))
                .map(|(a, b)| (a.to_owned(), b.to_owned()))
                .collect(),
        };
        for (a, b) in stale {
            self.interest.remove(&a, &b);
            events.push(SpaceEvent::InterestLeave { a, b });
        }
        for (&(a, b), d) in &near {
            if *d <= aoi && !self.interest.contains(a, b) {
                self.interest.insert(a, b);
                events.push(SpaceEvent::InterestEnter {
                    a: a.to_owned(),
                    b: b.to_owned(),
                });
            }
        }
        events.sort();
        events
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn space() -> Space {
        Space::new(SpaceConfig::default())
    }

    fn enter(pair: u64, a: &str, b: &str) -> SpaceEvent {
        SpaceEvent::ProximityEnter {
            pair,
            a: a.into(),
            b: b.into(),
        }
    }

    fn leave(pair: u64, a: &str, b: &str) -> SpaceEvent {
        SpaceEvent::ProximityLeave {
            pair,
            a: a.into(),
            b: b.into(),
        }
    }

    fn sees(a: &str, b: &str) -> SpaceEvent {
        SpaceEvent::InterestEnter {
            a: a.into(),
            b: b.into(),
        }
    }

    #[test]
    fn walking_together_starts_one_call_with_the_smaller_id_as_initiator() {
        let mut s = space();
        assert_eq!(s.join("bob", Vec2::new(0.0, 0.0), 0).events, vec![]);
        assert_eq!(
            s.join("ann", Vec2::new(1000.0, 0.0), 0).events,
            vec![],
            "beyond the area of interest"
        );
        // ann walks towards bob at 100 units/s: 1000 → 0 takes 10 s.
        let moved = s.move_to("ann", Vec2::new(0.0, 0.0), 100.0, 0).unwrap();
        assert!(moved.events.is_empty() && !moved.clamped);
        assert_eq!(s.next_deadline(0), Some(100));
        // At 4.1 s she is 590 away: in each other's area of interest (600).
        assert_eq!(s.tick(4_100), vec![sees("ann", "bob")]);
        // At 8.6 s, 140 away: in proximity; "ann" < "bob" initiates.
        assert_eq!(s.tick(8_600), vec![enter(1, "ann", "bob")]);
        assert_eq!(
            s.pairs_in_proximity().next(),
            Some(((&"ann".to_owned(), &"bob".to_owned()), 1))
        );
        assert_eq!(s.tick(10_000), vec![], "arrived: nothing new");
        assert_eq!(s.next_deadline(10_000), None, "nobody moves");
    }

    #[test]
    fn the_boundary_does_not_flap_and_the_dwell_holds_changes() {
        let mut s = space();
        s.join("a", Vec2::new(0.0, 0.0), 0);
        s.join("b", Vec2::new(149.0, 0.0), 0);
        assert_eq!(s.tick(0), vec![]);
        let ev = s.jump("b", Vec2::new(149.0, 0.0), 0).unwrap().events;
        assert!(ev.is_empty(), "already in: {ev:?}");
        // Just beyond the radius but within radius × hysteresis (180): still in.
        assert_eq!(
            s.jump("b", Vec2::new(170.0, 0.0), 100).unwrap().events,
            vec![]
        );
        // Beyond 180 before the dwell (1 s) is over: held, and a deadline is set.
        assert_eq!(
            s.jump("b", Vec2::new(200.0, 0.0), 500).unwrap().events,
            vec![]
        );
        assert_eq!(s.next_deadline(500), Some(1_000));
        assert_eq!(s.tick(1_000), vec![leave(1, "a", "b")]);
        // Back at once: held out until 2 s.
        assert_eq!(
            s.jump("b", Vec2::new(10.0, 0.0), 1_200).unwrap().events,
            vec![]
        );
        assert_eq!(s.next_deadline(1_200), Some(2_000));
        assert_eq!(s.tick(2_000), vec![enter(2, "a", "b")]);
    }

    #[test]
    fn a_member_who_leaves_ends_its_pairs_at_once() {
        let mut s = space();
        s.join("a", Vec2::new(0.0, 0.0), 0);
        let joined = s.join("b", Vec2::new(10.0, 0.0), 0).events;
        assert_eq!(joined, vec![sees("a", "b"), enter(1, "a", "b")]);
        assert_eq!(
            s.leave("b"),
            vec![
                leave(1, "a", "b"),
                SpaceEvent::InterestLeave {
                    a: "a".into(),
                    b: "b".into()
                }
            ]
        );
        assert!(s.leave("b").is_empty());
        assert_eq!(s.pairs_in_proximity().count(), 0);
    }

    #[test]
    fn bad_moves_are_refused_and_targets_clamped() {
        let mut s = space();
        assert_eq!(
            s.move_to("x", Vec2::new(1.0, 1.0), 10.0, 0),
            Err(SpaceError::NotInSpace)
        );
        s.join("x", Vec2::new(5.0, 5.0), 0);
        for speed in [0.0, -1.0, f64::NAN, f64::INFINITY] {
            assert!(matches!(
                s.move_to("x", Vec2::new(1.0, 1.0), speed, 0),
                Err(SpaceError::InvalidArgs(_))
            ));
        }
        assert!(matches!(
            s.move_to("x", Vec2::new(f64::NAN, 1.0), 10.0, 0),
            Err(SpaceError::InvalidArgs(_))
        ));
        let moved = s.move_to("x", Vec2::new(-50.0, 9000.0), 10.0, 0).unwrap();
        assert!(moved.clamped);
        assert_eq!(moved.movement.to, Vec2::new(0.0, 2000.0));
    }
}
