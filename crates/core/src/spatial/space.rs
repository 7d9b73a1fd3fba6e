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
//! same order on every replica. Inside, members are numbered (a slot each)
//! and pairs keyed by two numbers, so that a tick compares integers, not
//! session ids; the numbers depend on the order of joins and never reach an
//! event, whose order and pair ids follow the session ids.
//!
//! What a step costs (the bounds [`SpaceConfig::validate`] and
//! [`SpaceConfig::max_speed`] keep): a move or a jump, its mover's neighbourhood
//! (at most a pass over every member); a tick, a pass over every member, the
//! pairs within `aoi_radius × hysteresis` of each other and the pairs with a
//! state.

use std::collections::{BTreeMap, BTreeSet};

use rustc_hash::{FxHashMap, FxHashSet};
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
    /// A coordinate or the speed is not a finite number, or the speed is out of its bounds.
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
    /// Absent from snapshots written before they were kept: an import then
    /// works them out again ([`Space::import`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub held: Option<Vec<((String, String), Millis)>>,
    /// When the last movement under way arrives, as the original counts it
    /// (absent from snapshots written before it was kept).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub moving_until: Option<Millis>,
}

/// A member's number inside the space.
type Slot = u32;

/// An unordered pair of slots: the smaller in the high half.
type PairKey = u64;

fn pair_key(x: Slot, y: Slot) -> PairKey {
    let (a, b) = if x < y { (x, y) } else { (y, x) };
    (u64::from(a) << 32) | u64::from(b)
}

fn pair_slots(k: PairKey) -> (Slot, Slot) {
    ((k >> 32) as Slot, k as Slot)
}

/// A member of the space.
#[derive(Debug, Clone)]
struct Member {
    session: String,
    movement: Movement,
    /// Where the grid has it.
    at: Vec2,
    /// The members it has a proximity state with.
    paired: FxHashSet<Slot>,
    /// The members it sees (and who see it).
    sees: FxHashSet<Slot>,
}

/// A pair's change, before it is told with session ids.
#[derive(Debug, Clone, Copy)]
enum Change {
    Enter,
    Leave(u64),
    Sees,
    Unsees,
}

/// Who relates to whom: the proximity states, the dwell-held changes and
/// areas of interest, keyed by slots.
#[derive(Debug, Clone, Default)]
struct Relations {
    members: Vec<Option<Member>>,
    pairs: FxHashMap<PairKey, PairState>,
    held: FxHashMap<PairKey, Millis>,
    /// `held` by due time: the next deadline without a pass over it.
    held_due: BTreeSet<(Millis, PairKey)>,
    /// How many pairs see each other.
    seeing: usize,
}

impl Relations {
    fn member(&self, s: Slot) -> &Member {
        self.members[s as usize].as_ref().expect("a live slot")
    }

    fn member_mut(&mut self, s: Slot) -> &mut Member {
        self.members[s as usize].as_mut().expect("a live slot")
    }

    fn hold(&mut self, k: PairKey, due: Millis) {
        if let Some(old) = self.held.insert(k, due) {
            self.held_due.remove(&(old, k));
        }
        self.held_due.insert((due, k));
    }

    fn release(&mut self, k: PairKey) {
        if let Some(old) = self.held.remove(&k) {
            self.held_due.remove(&(old, k));
        }
    }

    fn set_pair(&mut self, k: PairKey, state: PairState) {
        if self.pairs.insert(k, state).is_none() {
            let (a, b) = pair_slots(k);
            self.member_mut(a).paired.insert(b);
            self.member_mut(b).paired.insert(a);
        }
    }

    fn drop_pair(&mut self, k: PairKey) -> Option<PairState> {
        let state = self.pairs.remove(&k)?;
        let (a, b) = pair_slots(k);
        self.member_mut(a).paired.remove(&b);
        self.member_mut(b).paired.remove(&a);
        Some(state)
    }

    fn set_sees(&mut self, k: PairKey, on: bool) {
        let (a, b) = pair_slots(k);
        if on {
            if self.member_mut(a).sees.insert(b) {
                self.seeing += 1;
            }
            self.member_mut(b).sees.insert(a);
        } else {
            if self.member_mut(a).sees.remove(&b) {
                self.seeing -= 1;
            }
            self.member_mut(b).sees.remove(&a);
        }
    }

    fn sees(&self, k: PairKey) -> bool {
        let (a, b) = pair_slots(k);
        self.member(a).sees.contains(&b)
    }
}

/// The thresholds of one evaluation, squared: no square root per pair.
#[derive(Debug, Clone, Copy)]
struct Rules {
    now: Millis,
    enter: f64,
    leave: f64,
    aoi: f64,
    reach: f64,
    dwell: Millis,
}

impl Rules {
    fn new(c: &SpaceConfig, now: Millis) -> Rules {
        let sq = |x: f64| x * x;
        Rules {
            now,
            enter: sq(c.proximity_radius),
            leave: sq(c.proximity_radius * c.hysteresis),
            aoi: sq(c.aoi_radius),
            reach: sq(c.aoi_radius * c.hysteresis),
            dwell: c.min_dwell_ms,
        }
    }

    fn dwelled(&self, since: Millis) -> bool {
        self.now >= since.saturating_add(self.dwell)
    }

    /// Re-decides the pair `k` at squared distance `d2`, noting its changes.
    /// Each pair is decided at most once per evaluation.
    fn decide(&self, rel: &mut Relations, k: PairKey, d2: f64, out: &mut Vec<(PairKey, Change)>) {
        let state = rel.pairs.get(&k).copied();
        // A change the dwell holds back: remembered, so that a tick comes when it falls due.
        match state {
            Some(PairState::In { since, .. }) if d2 > self.leave && !self.dwelled(since) => {
                rel.hold(k, since.saturating_add(self.dwell));
            }
            Some(PairState::Out { since }) if d2 <= self.enter && !self.dwelled(since) => {
                rel.hold(k, since.saturating_add(self.dwell));
            }
            Some(_) | None => rel.release(k),
        }
        let in_call = match state {
            Some(PairState::In { id, since }) => {
                if d2 > self.leave && self.dwelled(since) {
                    rel.set_pair(k, PairState::Out { since: self.now });
                    out.push((k, Change::Leave(id)));
                    false
                } else {
                    true
                }
            }
            Some(PairState::Out { since }) if !self.dwelled(since) => false,
            state => {
                if d2 <= self.enter {
                    // The id is given once the evaluation's entries are in order.
                    rel.set_pair(
                        k,
                        PairState::In {
                            id: 0,
                            since: self.now,
                        },
                    );
                    out.push((k, Change::Enter));
                    true
                } else {
                    if state.is_some() {
                        // Out, and the dwell no longer holds it: forget it.
                        rel.drop_pair(k);
                    }
                    false
                }
            }
        };
        // Interest, with hysteresis, after proximity (which holds it: a
        // member sees whom it is in a call with, however far the dwell keeps
        // the call going).
        let sees = rel.sees(k);
        if sees && d2 > self.reach && !in_call {
            rel.set_sees(k, false);
            out.push((k, Change::Unsees));
        } else if !sees && d2 <= self.aoi {
            rel.set_sees(k, true);
            out.push((k, Change::Sees));
        }
    }
}

/// The spatial part of a room.
#[derive(Debug, Clone)]
pub struct Space {
    config: SpaceConfig,
    /// Every member's movement, by session id.
    movements: BTreeMap<String, Movement>,
    /// Each member's slot.
    slots: FxHashMap<String, Slot>,
    /// Slots free for the next member.
    free: Vec<Slot>,
    rel: Relations,
    /// Where each member was at the last evaluation of its pairs.
    grid: SpatialGrid<Slot>,
    next_pair: u64,
    /// When the grid last placed every member.
    grid_at: Millis,
    /// At least the speed of every member that moved since `grid_at`: how
    /// far from its place in the grid a member can be.
    fastest: f64,
    /// When the last movement under way arrives (a tick is due until then).
    moving_until: Millis,
    /// Per slot, the evaluation that last decided its pair with the mover.
    seen: Vec<u64>,
    evaluation: u64,
    /// The steps the last command took (see [`Space::last_work`]).
    work: usize,
    /// The steps the last tick took.
    tick_work: usize,
}

impl Space {
    /// An empty space; `config` must be valid ([`SpaceConfig::validate`]).
    pub fn new(config: SpaceConfig) -> Space {
        let cell = config.aoi_radius * config.hysteresis;
        Space {
            grid: SpatialGrid::new(cell),
            config,
            movements: BTreeMap::new(),
            slots: FxHashMap::default(),
            free: Vec::new(),
            rel: Relations::default(),
            next_pair: 1,
            grid_at: 0,
            fastest: 0.0,
            moving_until: 0,
            seen: Vec::new(),
            evaluation: 0,
            work: 0,
            tick_work: 0,
        }
    }

    fn session(&self, s: Slot) -> &str {
        &self.rel.member(s).session
    }

    /// The pair `k` as session ids, the smaller first.
    fn sessions(&self, k: PairKey) -> (String, String) {
        let (x, y) = pair_slots(k);
        let (x, y) = (self.session(x), self.session(y));
        let (a, b) = if x < y { (x, y) } else { (y, x) };
        (a.to_owned(), b.to_owned())
    }

    /// Everything but the settings, for a snapshot.
    pub fn export(&self) -> SpaceState {
        let mut pairs: Vec<((String, String), PairState)> = self
            .rel
            .pairs
            .iter()
            .map(|(k, v)| (self.sessions(*k), *v))
            .collect();
        let mut interest: Vec<(String, String)> = self
            .rel
            .members
            .iter()
            .enumerate()
            .filter_map(|(i, m)| Some((i as Slot, m.as_ref()?)))
            .flat_map(|(i, m)| m.sees.iter().filter(move |j| i < **j).map(move |j| (i, *j)))
            .map(|(i, j)| self.sessions(pair_key(i, j)))
            .collect();
        let mut held: Vec<((String, String), Millis)> = self
            .rel
            .held
            .iter()
            .map(|(k, due)| (self.sessions(*k), *due))
            .collect();
        // Hashed inside: sorted, replicas export alike.
        pairs.sort_unstable_by(|x, y| x.0.cmp(&y.0));
        interest.sort_unstable();
        held.sort_unstable();
        SpaceState {
            movements: self.movements.clone(),
            pairs,
            interest,
            next_pair: self.next_pair,
            held: Some(held),
            moving_until: Some(self.moving_until),
        }
    }

    /// A space continuing from a snapshot whose last tick was at
    /// `evaluated_at`: members are placed in the grid where the original
    /// has them (where they were at that tick, or where their movement
    /// started since), so that the next tick decides the pairs the
    /// original's does.
    pub fn import(config: SpaceConfig, state: SpaceState, evaluated_at: Millis) -> Space {
        let mut space = Space::new(config);
        for (s, m) in &state.movements {
            space.add(s, *m, m.position_at(evaluated_at));
            if m.arrives_at() > evaluated_at {
                space.fastest = space.fastest.max(m.speed);
            }
        }
        space.grid_at = evaluated_at;
        let slot = |s: &String| space.slots.get(s).copied();
        let keys = |(a, b): &(String, String)| Some(pair_key(slot(a)?, slot(b)?));
        let pairs: Vec<(PairKey, PairState)> = state
            .pairs
            .iter()
            .filter_map(|(p, v)| Some((keys(p)?, *v)))
            .collect();
        let interest: Vec<PairKey> = state.interest.iter().filter_map(keys).collect();
        let held: Option<Vec<(PairKey, Millis)>> = state.held.as_ref().map(|held| {
            held.iter()
                .filter_map(|(p, due)| Some((keys(p)?, *due)))
                .collect()
        });
        for (k, v) in pairs {
            space.rel.set_pair(k, v);
        }
        for k in interest {
            space.rel.set_sees(k, true);
        }
        // Only a pair with a state can wait for the dwell: anything else in
        // a snapshot is dropped, not kept to outlive its members.
        match held {
            Some(held) => {
                for (k, due) in held {
                    if space.rel.pairs.contains_key(&k) {
                        space.rel.hold(k, due);
                    }
                }
            }
            None => space.rebuild_held(evaluated_at),
        }
        space.next_pair = state.next_pair;
        space.moving_until = state.moving_until.unwrap_or_else(|| space.latest_arrival());
        space
    }

    /// Notes again the changes the dwell holds, as they stood at `at`, for a
    /// snapshot written before they were kept (it has no `held`): else a
    /// room where nobody moves would never tick to carry them out.
    fn rebuild_held(&mut self, at: Millis) {
        let rules = Rules::new(&self.config, at);
        let pairs: Vec<(PairKey, PairState)> =
            self.rel.pairs.iter().map(|(k, v)| (*k, *v)).collect();
        for (k, state) in pairs {
            let (a, b) = pair_slots(k);
            let (pa, pb) = (
                self.rel.member(a).movement.position_at(at),
                self.rel.member(b).movement.position_at(at),
            );
            let d2 = pa.distance_sq(pb);
            let since = match state {
                PairState::In { since, .. } if d2 > rules.leave => since,
                PairState::Out { since } if d2 <= rules.enter => since,
                _ => continue,
            };
            if !rules.dwelled(since) {
                self.rel.hold(k, since.saturating_add(rules.dwell));
            }
        }
    }

    /// Gives `session` a slot with `movement`, placed in the grid at `at`.
    fn add(&mut self, session: &str, movement: Movement, at: Vec2) -> Slot {
        let member = Member {
            session: session.to_owned(),
            movement,
            at,
            paired: FxHashSet::default(),
            sees: FxHashSet::default(),
        };
        let slot = match self.free.pop() {
            Some(s) => {
                self.rel.members[s as usize] = Some(member);
                s
            }
            None => {
                self.rel.members.push(Some(member));
                self.seen.push(0);
                (self.rel.members.len() - 1) as Slot
            }
        };
        self.slots.insert(session.to_owned(), slot);
        self.movements.insert(session.to_owned(), movement);
        self.grid.place(slot, at);
        slot
    }

    /// The settings.
    pub fn config(&self) -> &SpaceConfig {
        &self.config
    }

    /// The steps the last join, move, jump, leave or tick took: members
    /// placed or looked at, grid cells looked up, pairs looked at. The
    /// budget, whatever the settings and the moves (tested):
    /// - a join, move or jump: at most 5 × members (the most the space has
    ///   held at once, as below);
    /// - a leave: the departing member's pairs with a state;
    /// - a tick: 10 × members, plus twice the pairs at most 2√2 ×
    ///   `aoi_radius × hysteresis` apart, plus twice the pairs with a state
    ///   (in proximity, held out by the dwell, or seeing each other).
    pub fn last_work(&self) -> usize {
        self.work
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
        let mut v: Vec<((&String, &String), u64)> = self
            .rel
            .pairs
            .iter()
            .filter_map(|(k, s)| match s {
                PairState::In { id, .. } => {
                    let (x, y) = pair_slots(*k);
                    let (x, y) = (&self.rel.member(x).session, &self.rel.member(y).session);
                    Some((if x < y { (x, y) } else { (y, x) }, *id))
                }
                PairState::Out { .. } => None,
            })
            .collect();
        v.sort_unstable();
        v.into_iter()
    }

    fn pair_of(&self, a: &str, b: &str) -> Option<PairKey> {
        Some(pair_key(*self.slots.get(a)?, *self.slots.get(b)?))
    }

    /// Whether `a` and `b` are a pair in proximity.
    pub fn in_proximity(&self, a: &str, b: &str) -> bool {
        self.pair_of(a, b)
            .is_some_and(|k| a != b && matches!(self.rel.pairs.get(&k), Some(PairState::In { .. })))
    }

    /// Whether `a` and `b` see each other (a member always sees itself).
    pub fn sees(&self, a: &str, b: &str) -> bool {
        a == b || self.pair_of(a, b).is_some_and(|k| self.rel.sees(k))
    }

    /// The members `session` sees (and who see it), in no particular order.
    pub fn viewers<'a>(&'a self, session: &'a str) -> impl Iterator<Item = &'a String> + 'a {
        self.slots
            .get(session)
            .into_iter()
            .flat_map(move |s| self.rel.member(*s).sees.iter())
            .map(move |j| &self.rel.member(*j).session)
    }

    /// Places a new member standing at `at` (clamped into the plane).
    pub fn join(&mut self, session: &str, at: Vec2, now: Millis) -> Moved {
        let (at, clamped) = self.config.clamp(at);
        // Standing: nothing for a tick to follow (its own pairs are decided now).
        let movement = Movement::standing(at, now);
        match self.slots.get(session).copied() {
            Some(slot) => {
                self.rel.member_mut(slot).movement = movement;
                self.movements.insert(session.to_owned(), movement);
            }
            None => {
                self.add(session, movement, at);
            }
        }
        Moved {
            movement,
            clamped,
            events: self.evaluate_one(session, now),
        }
    }

    /// Starts `session` towards `to` at `speed` units per second from where
    /// it is now; `speed` is in (0, [`SpaceConfig::max_speed`]].
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
        let max = self.config.max_speed();
        if !(speed.is_finite() && speed > 0.0 && speed <= max) {
            return Err(SpaceError::InvalidArgs(format!(
                "speed must be a number greater than 0 and at most {max} (the plane's diagonal per tick), not {speed}"
            )));
        }
        let slot = *self.slots.get(session).ok_or(SpaceError::NotInSpace)?;
        let from = self.rel.member(slot).movement.position_at(now);
        let (to, clamped) = self.config.clamp(to);
        let movement = Movement {
            from,
            to,
            t0: now,
            speed,
        };
        self.rel.member_mut(slot).movement = movement;
        self.movements.insert(session.to_owned(), movement);
        self.moving_until = self.moving_until.max(movement.arrives_at());
        self.fastest = self.fastest.max(speed);
        Ok(Moved {
            movement,
            clamped,
            events: self.evaluate_one(session, now),
        })
    }

    /// Puts `session` at `at` at once (a teleport).
    pub fn jump(&mut self, session: &str, at: Vec2, now: Millis) -> Result<Moved, SpaceError> {
        if !at.is_finite() {
            return Err(SpaceError::InvalidArgs(
                "at must be two finite numbers".into(),
            ));
        }
        if !self.slots.contains_key(session) {
            return Err(SpaceError::NotInSpace);
        }
        Ok(self.join(session, at, now))
    }

    /// Removes `session`: its pairs leave proximity and interest at once
    /// (the dwell does not hold a member who is gone).
    pub fn leave(&mut self, session: &str) -> Vec<SpaceEvent> {
        let Some(slot) = self.slots.get(session).copied() else {
            self.work = 0;
            return Vec::new();
        };
        let mut events = Vec::new();
        let paired: Vec<Slot> = self.rel.member(slot).paired.iter().copied().collect();
        self.work = paired.len() + self.rel.member(slot).sees.len();
        for other in paired {
            let k = pair_key(slot, other);
            self.rel.release(k);
            if let Some(PairState::In { id, .. }) = self.rel.pairs.get(&k).copied() {
                let (a, b) = self.sessions(k);
                events.push(SpaceEvent::ProximityLeave { pair: id, a, b });
            }
            self.rel.drop_pair(k);
        }
        let seen: Vec<Slot> = self.rel.member(slot).sees.iter().copied().collect();
        for other in seen {
            let k = pair_key(slot, other);
            let (a, b) = self.sessions(k);
            self.rel.set_sees(k, false);
            events.push(SpaceEvent::InterestLeave { a, b });
        }
        self.grid.remove(&slot);
        self.rel.members[slot as usize] = None;
        self.slots.remove(session);
        self.movements.remove(session);
        self.free.push(slot);
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

    /// Re-evaluates the space at `now` (on the room's tick): the pairs of
    /// every member that moved since the last tick, and the changes the
    /// dwell held that fell due. A pair of members that both stood still
    /// was decided when each last moved, at the distance it still has.
    pub fn tick(&mut self, now: Millis) -> Vec<SpaceEvent> {
        let rules = Rules::new(&self.config, now);
        let since = self.grid_at;
        let mut fastest: f64 = 0.0;
        let mut moving_until = 0;
        let mut movers: Vec<Slot> = Vec::new();
        let mut live = 0;
        self.evaluation += 1;
        let evaluation = self.evaluation;
        for (i, m) in self.rel.members.iter_mut().enumerate() {
            let Some(m) = m else { continue };
            live += 1;
            let arrives = m.movement.arrives_at();
            moving_until = moving_until.max(arrives);
            if arrives > now {
                fastest = fastest.max(m.movement.speed);
            }
            // Under way at some time since the last tick (a standing member's
            // place in the grid is where it is).
            if arrives > since {
                m.at = m.movement.position_at(now);
                self.grid.place_ref(&(i as Slot), m.at);
                movers.push(i as Slot);
                self.seen[i] = evaluation;
            }
        }
        self.grid_at = now;
        self.fastest = fastest;
        // Only grows between ticks (a walk cut short by a jump or a
        // departure still counts): the full pass sets it right.
        self.moving_until = moving_until;
        let mut changes = Vec::new();
        let mut work = self.rel.members.len();
        if movers.len() * 2 > live {
            work += self.decide_all(rules, &mut changes);
        } else {
            work += self.decide_movers(rules, &movers, &mut changes);
        }
        self.work = work;
        self.tick_work = work;
        self.tell(changes)
    }

    /// The steps the last tick took: what the next is likely to take.
    pub fn last_tick_work(&self) -> usize {
        self.tick_work
    }

    /// Decides every pair within reach (as the grid yields them, each once)
    /// and every pair with a state; returns the steps it took.
    fn decide_all(&mut self, rules: Rules, changes: &mut Vec<(PairKey, Change)>) -> usize {
        let reach = self.config.aoi_radius * self.config.hysteresis;
        let rel = &mut self.rel;
        let mut work = rel.pairs.len() + rel.seeing;
        work += self.grid.for_each_pair_within(reach, |a, _, b, _, d2| {
            rules.decide(rel, pair_key(*a, *b), d2, changes)
        });
        // The pairs with a state beyond reach: the grid did not yield them.
        let mut beyond: Vec<(PairKey, f64)> = Vec::new();
        let far = |k: PairKey| {
            let (a, b) = pair_slots(k);
            let d2 = rel.member(a).at.distance_sq(rel.member(b).at);
            (d2 > rules.reach).then_some((k, d2))
        };
        beyond.extend(rel.pairs.keys().filter_map(|k| far(*k)));
        for (i, m) in rel.members.iter().enumerate() {
            let Some(m) = m else { continue };
            let i = i as Slot;
            beyond.extend(
                m.sees
                    .iter()
                    .filter(|j| i < **j)
                    .filter_map(|j| far(pair_key(i, *j))),
            );
        }
        beyond.sort_unstable_by_key(|(k, _)| *k);
        beyond.dedup_by_key(|(k, _)| *k);
        for (k, d2) in beyond {
            rules.decide(rel, k, d2, changes);
        }
        work
    }

    /// Decides the pairs of `movers` (marked in `seen` with the current
    /// evaluation), each once, and the held changes that fell due; returns
    /// the steps it took.
    fn decide_movers(
        &mut self,
        rules: Rules,
        movers: &[Slot],
        changes: &mut Vec<(PairKey, Change)>,
    ) -> usize {
        let reach = self.config.aoi_radius * self.config.hysteresis;
        let evaluation = self.evaluation;
        let seen = &self.seen;
        // A pair of two movers is decided with the smaller of them.
        let other_decides =
            |me: Slot, other: Slot| seen[other as usize] == evaluation && other < me;
        let mut work = 0;
        let mut near: Vec<(Slot, f64)> = Vec::new();
        let mut related: Vec<Slot> = Vec::new();
        for &i in movers {
            let p = self.rel.member(i).at;
            near.clear();
            work += self.grid.for_each_within(p, reach, |j, q| {
                if *j != i && !other_decides(i, *j) {
                    near.push((*j, p.distance_sq(q)));
                }
            });
            for &(j, d2) in &near {
                rules.decide(&mut self.rel, pair_key(i, j), d2, changes);
            }
            // Its pairs with a state beyond reach (the grid yielded the others).
            let me = self.rel.member(i);
            related.clear();
            related.extend(me.paired.iter().chain(me.sees.iter()).copied());
            related.sort_unstable();
            related.dedup();
            work += related.len();
            for &j in &related {
                if other_decides(i, j) {
                    continue;
                }
                let d2 = p.distance_sq(self.rel.member(j).at);
                if d2 > rules.reach {
                    rules.decide(&mut self.rel, pair_key(i, j), d2, changes);
                }
            }
        }
        // The held changes that fell due, between members who stood still.
        let due: Vec<PairKey> = self
            .rel
            .held_due
            .range(..=(rules.now, PairKey::MAX))
            .map(|(_, k)| *k)
            .collect();
        work += due.len();
        for k in due {
            let (a, b) = pair_slots(k);
            if seen[a as usize] == evaluation || seen[b as usize] == evaluation {
                continue;
            }
            let d2 = self.rel.member(a).at.distance_sq(self.rel.member(b).at);
            rules.decide(&mut self.rel, k, d2, changes);
        }
        work
    }

    /// Re-decides the pairs of `session`, whose movement just changed: a
    /// move costs its neighbourhood, not the room; the others' pairs follow
    /// on the next tick, on every replica alike.
    fn evaluate_one(&mut self, session: &str, now: Millis) -> Vec<SpaceEvent> {
        let Some(slot) = self.slots.get(session).copied() else {
            return Vec::new();
        };
        let rules = Rules::new(&self.config, now);
        let p = self.rel.member(slot).movement.position_at(now);
        self.rel.member_mut(slot).at = p;
        self.grid.place_ref(&slot, p);
        self.evaluation += 1;
        let evaluation = self.evaluation;
        self.seen[slot as usize] = evaluation;
        // Others stand where the grid has them, or have walked at most this
        // far since. Before the first tick (or right after an import) the
        // margin can exceed the plane: the grid then visits every member.
        // With a little slack: distances are computed along other paths.
        let margin = self.fastest * now.saturating_sub(self.grid_at) as f64 / 1000.0 * (1.0 + 1e-9);
        let radius = self.config.aoi_radius * self.config.hysteresis + margin;
        let mut near: Vec<(Slot, f64)> = Vec::new();
        let rel = &self.rel;
        let mut work = self.grid.for_each_within(p, radius, |other, _| {
            if *other != slot {
                let q = rel.member(*other).movement.position_at(now);
                let d2 = p.distance_sq(q);
                if d2 <= rules.reach {
                    near.push((*other, d2));
                }
            }
        });
        // And the mover's pairs with a state, wherever the other is now.
        let me = rel.member(slot);
        let related: Vec<Slot> = me.paired.iter().chain(me.sees.iter()).copied().collect();
        work += related.len();
        self.work = work;
        let mut changes = Vec::new();
        for (other, d2) in near {
            self.seen[other as usize] = evaluation;
            rules.decide(&mut self.rel, pair_key(slot, other), d2, &mut changes);
        }
        for other in related {
            if self.seen[other as usize] == evaluation {
                continue;
            }
            self.seen[other as usize] = evaluation;
            let q = self.rel.member(other).movement.position_at(now);
            rules.decide(
                &mut self.rel,
                pair_key(slot, other),
                p.distance_sq(q),
                &mut changes,
            );
        }
        self.tell(changes)
    }

    /// The changes of one evaluation as events, in order: the pairs that
    /// entered get their ids in the order of their session ids.
    fn tell(&mut self, changes: Vec<(PairKey, Change)>) -> Vec<SpaceEvent> {
        let mut entered: Vec<((String, String), PairKey)> = Vec::new();
        let mut events = Vec::with_capacity(changes.len());
        for (k, change) in changes {
            let (a, b) = self.sessions(k);
            match change {
                Change::Enter => entered.push(((a, b), k)),
                Change::Leave(pair) => events.push(SpaceEvent::ProximityLeave { pair, a, b }),
                Change::Sees => events.push(SpaceEvent::InterestEnter { a, b }),
                Change::Unsees => events.push(SpaceEvent::InterestLeave { a, b }),
            }
        }
        entered.sort_unstable_by(|x, y| x.0.cmp(&y.0));
        for ((a, b), k) in entered {
            let id = self.next_pair;
            self.next_pair = self.next_pair.saturating_add(1);
            if let Some(PairState::In { id: slot, .. }) = self.rel.pairs.get_mut(&k) {
                *slot = id;
            }
            events.push(SpaceEvent::ProximityEnter { pair: id, a, b });
        }
        events.sort();
        events
    }

    /// The next time the space must be evaluated: a tick from now while a
    /// member moves, else when the first change held by the dwell falls due.
    /// While the ticks run, a held change waits for the next one (at most
    /// `tick_ms` past its due): a crowd's held changes fall due every few
    /// milliseconds, and a full pass for each would multiply the ticks.
    pub fn next_deadline(&self, now: Millis) -> Option<Millis> {
        // Both kept up to date by every change: the room asks after every
        // command.
        if now < self.moving_until {
            return Some(now.saturating_add(self.config.tick_ms));
        }
        self.rel
            .held_due
            .range((now.saturating_add(1), 0)..)
            .next()
            .map(|(due, _)| *due)
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
    fn a_snapshot_without_held_changes_gets_them_back() {
        let mut s = space();
        s.join("a", Vec2::new(0.0, 0.0), 0);
        s.join("b", Vec2::new(10.0, 0.0), 0);
        // Apart before the dwell (1 s) is over: the leave waits until 1 s.
        s.jump("b", Vec2::new(500.0, 0.0), 300).unwrap();
        assert_eq!(s.next_deadline(300), Some(1_000));
        let mut old = s.export();
        old.held = None;
        let mut copy = Space::import(SpaceConfig::default(), old, 300);
        assert_eq!(copy.next_deadline(300), Some(1_000));
        // A snapshot that says nothing is held is taken at its word.
        let mut none = s.export();
        none.held = Some(Vec::new());
        let quiet = Space::import(SpaceConfig::default(), none, 300);
        assert_eq!(quiet.next_deadline(300), None);
        assert_eq!(copy.tick(1_000), s.tick(1_000));
        assert_eq!(copy.tick(1_000), vec![]);
    }

    /// Found in review: a pair left Out while most members moved, then only
    /// a third member walks, so nothing decides the pair again. A replica
    /// imported mid-way must decide the same pairs on its next tick as the
    /// original, or their exports part (the stale Out stays on one only).
    #[test]
    fn a_replica_imported_mid_walk_decides_the_pairs_the_original_does() {
        let mut s = space();
        s.join("a", Vec2::new(0.0, 0.0), 1_000);
        s.join("b", Vec2::new(100.0, 0.0), 1_000);
        s.join("c", Vec2::new(2000.0, 2000.0), 1_000);
        s.move_to("c", Vec2::new(1000.0, 2000.0), 100.0, 1_000)
            .unwrap();
        let mut now = 1_000;
        while now < 2_500 {
            now += 100;
            s.tick(now);
        }
        s.jump("b", Vec2::new(300.0, 0.0), 2_550).unwrap();
        while now < 5_000 {
            now += 100;
            s.tick(now);
        }
        let snapshot = s.export();
        assert!(
            snapshot
                .pairs
                .iter()
                .any(|(p, st)| p == &("a".to_owned(), "b".to_owned())
                    && matches!(st, PairState::Out { .. })),
            "the scenario leaves a stale Out: {snapshot:?}"
        );
        let mut copy = Space::import(SpaceConfig::default(), snapshot, 5_000);
        for t in [5_100, 5_200, 9_000] {
            assert_eq!(copy.tick(t), s.tick(t), "at {t}");
            assert_eq!(copy.export(), s.export(), "at {t}");
        }
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
