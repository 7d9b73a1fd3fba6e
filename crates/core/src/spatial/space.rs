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
    pairs: BTreeMap<(String, String), PairState>,
    /// Pairs `(a, b)`, `a < b`, that see each other.
    interest: BTreeSet<(String, String)>,
    next_pair: u64,
}

fn ordered(x: &str, y: &str) -> (String, String) {
    if x < y {
        (x.to_owned(), y.to_owned())
    } else {
        (y.to_owned(), x.to_owned())
    }
}

impl Space {
    /// An empty space; `config` must be valid ([`SpaceConfig::validate`]).
    pub fn new(config: SpaceConfig) -> Space {
        let cell = config.aoi_radius * config.hysteresis;
        Space {
            grid: SpatialGrid::new(cell),
            config,
            movements: BTreeMap::new(),
            pairs: BTreeMap::new(),
            interest: BTreeSet::new(),
            next_pair: 1,
        }
    }

    /// Everything but the settings, for a snapshot.
    pub fn export(&self) -> SpaceState {
        SpaceState {
            movements: self.movements.clone(),
            pairs: self.pairs.iter().map(|(k, v)| (k.clone(), *v)).collect(),
            interest: self.interest.iter().cloned().collect(),
            next_pair: self.next_pair,
        }
    }

    /// A space continuing from a snapshot.
    pub fn import(config: SpaceConfig, state: SpaceState) -> Space {
        let mut space = Space::new(config);
        space.movements = state.movements;
        space.pairs = state.pairs.into_iter().collect();
        space.interest = state.interest.into_iter().collect();
        space.next_pair = state.next_pair;
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

    /// The pairs in proximity: `(a, b)` → pair id.
    pub fn pairs_in_proximity(&self) -> impl Iterator<Item = (&(String, String), u64)> {
        self.pairs.iter().filter_map(|(k, s)| match s {
            PairState::In { id, .. } => Some((k, *id)),
            PairState::Out { .. } => None,
        })
    }

    /// Whether `a` and `b` are a pair in proximity.
    pub fn in_proximity(&self, a: &str, b: &str) -> bool {
        matches!(self.pairs.get(&ordered(a, b)), Some(PairState::In { .. }))
    }

    /// Whether `a` and `b` see each other (a member always sees itself).
    pub fn sees(&self, a: &str, b: &str) -> bool {
        a == b || self.interest.contains(&ordered(a, b))
    }

    /// Places a new member standing at `at` (clamped into the plane).
    pub fn join(&mut self, session: &str, at: Vec2, now: Millis) -> Moved {
        let (at, clamped) = self.config.clamp(at);
        let movement = Movement::standing(at, now);
        self.movements.insert(session.to_owned(), movement);
        Moved {
            movement,
            clamped,
            events: self.evaluate(now),
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
        Ok(Moved {
            movement,
            clamped,
            events: self.evaluate(now),
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
        let gone = |(a, b): &(String, String)| a == session || b == session;
        let pairs: Vec<(String, String)> = self.pairs.keys().filter(|k| gone(k)).cloned().collect();
        for key in pairs {
            if let Some(PairState::In { id, .. }) = self.pairs.remove(&key) {
                events.push(SpaceEvent::ProximityLeave {
                    pair: id,
                    a: key.0,
                    b: key.1,
                });
            }
        }
        let seen: Vec<(String, String)> =
            self.interest.iter().filter(|k| gone(k)).cloned().collect();
        for (a, b) in seen {
            self.interest.remove(&(a.clone(), b.clone()));
            events.push(SpaceEvent::InterestLeave { a, b });
        }
        events.sort();
        events
    }

    /// Re-evaluates the space at `now` (on the room's tick).
    pub fn tick(&mut self, now: Millis) -> Vec<SpaceEvent> {
        self.evaluate(now)
    }

    /// The next time the space must be evaluated: a tick from now while a
    /// member moves, and when a change held by the dwell falls due.
    pub fn next_deadline(&self, now: Millis) -> Option<Millis> {
        let moving = self.movements.values().any(|m| m.is_moving(now));
        let mut next = moving.then(|| now.saturating_add(self.config.tick_ms));
        for (key, state) in &self.pairs {
            let since = match state {
                PairState::In { since, .. } | PairState::Out { since } => *since,
            };
            let due = since.saturating_add(self.config.min_dwell_ms);
            if due > now && self.change_waits(key, *state, now) {
                next = Some(next.map_or(due, |n| n.min(due)));
            }
        }
        next
    }

    /// Whether the pair's state would change now but for the dwell.
    fn change_waits(&self, (a, b): &(String, String), state: PairState, now: Millis) -> bool {
        let (Some(pa), Some(pb)) = (self.position(a, now), self.position(b, now)) else {
            return false;
        };
        let d = pa.distance(pb);
        match state {
            PairState::In { .. } => d > self.leave_radius(),
            PairState::Out { .. } => d <= self.config.proximity_radius,
        }
    }

    fn leave_radius(&self) -> f64 {
        self.config.proximity_radius * self.config.hysteresis
    }

    fn dwelled(&self, since: Millis, now: Millis) -> bool {
        now >= since.saturating_add(self.config.min_dwell_ms)
    }

    /// Positions at `now`, then every pair near enough to matter, and the
    /// pairs whose members drifted apart beyond the grid's reach.
    fn evaluate(&mut self, now: Millis) -> Vec<SpaceEvent> {
        for (s, m) in &self.movements {
            self.grid.place(s.clone(), m.position_at(now));
        }
        let reach = self.config.aoi_radius * self.config.hysteresis;
        let mut near: BTreeMap<(String, String), f64> = BTreeMap::new();
        for (s, m) in &self.movements {
            let p = m.position_at(now);
            for other in self.grid.within(p, reach) {
                if other > s {
                    let q = self.grid.position(other).expect("placed");
                    near.insert((s.clone(), other.clone()), p.distance(q));
                }
            }
        }
        let mut events = Vec::new();
        // Proximity, with hysteresis and dwell.
        let keys: BTreeSet<(String, String)> = self
            .pairs
            .keys()
            .cloned()
            .chain(
                near.iter()
                    .filter(|(_, d)| **d <= self.config.proximity_radius)
                    .map(|(k, _)| k.clone()),
            )
            .collect();
        for key in keys {
            let d = near.get(&key).copied().unwrap_or(f64::INFINITY);
            match self.pairs.get(&key).copied() {
                Some(PairState::In { id, since }) => {
                    if d > self.leave_radius() && self.dwelled(since, now) {
                        self.pairs
                            .insert(key.clone(), PairState::Out { since: now });
                        events.push(SpaceEvent::ProximityLeave {
                            pair: id,
                            a: key.0,
                            b: key.1,
                        });
                    }
                }
                Some(PairState::Out { since }) if !self.dwelled(since, now) => {}
                state => {
                    if d <= self.config.proximity_radius {
                        let id = self.next_pair;
                        self.next_pair += 1;
                        self.pairs
                            .insert(key.clone(), PairState::In { id, since: now });
                        events.push(SpaceEvent::ProximityEnter {
                            pair: id,
                            a: key.0,
                            b: key.1,
                        });
                    } else if state.is_some() {
                        // Out, and the dwell no longer holds it: forget it.
                        self.pairs.remove(&key);
                    }
                }
            }
        }
        // Interest, with hysteresis, after proximity (which holds it).
        let aoi_leave = reach;
        let stale: Vec<(String, String)> = self
            .interest
            .iter()
            .filter(|k| near.get(*k).is_none_or(|d| *d > aoi_leave))
            // A member sees whom it is in a call with, however far the dwell
            // keeps the call going.
            .filter(|k| !matches!(self.pairs.get(*k), Some(PairState::In { .. })))
            .cloned()
            .collect();
        for (a, b) in stale {
            self.interest.remove(&(a.clone(), b.clone()));
            events.push(SpaceEvent::InterestLeave { a, b });
        }
        for (key, d) in &near {
            if *d <= self.config.aoi_radius && self.interest.insert(key.clone()) {
                events.push(SpaceEvent::InterestEnter {
                    a: key.0.clone(),
                    b: key.1.clone(),
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
            Some((&("ann".into(), "bob".into()), 1))
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
