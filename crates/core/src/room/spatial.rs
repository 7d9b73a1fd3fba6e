//! A spatial room's members in its plane: joining places them, moves are
//! requests, the space's decisions become events for the members concerned.

use super::requests::outcome;
use super::*;
use crate::spatial::{RoomSpaceState, Space, SpaceError, SpaceEvent, Vec2};
use crate::Scope;

/// The spatial part of a room: the space, when it was last evaluated, and
/// where disconnected members stood (a resume puts them back there).
#[derive(Debug)]
pub(super) struct RoomSpace {
    pub(super) space: Space,
    pub(super) evaluated_at: Millis,
    pub(super) parked: BTreeMap<String, Vec2>,
}

impl RoomSpace {
    /// A room's space continuing from a snapshot.
    pub(super) fn import(config: crate::spatial::SpaceConfig, state: RoomSpaceState) -> RoomSpace {
        RoomSpace {
            space: Space::import(config, state.space, state.evaluated_at),
            evaluated_at: state.evaluated_at,
            parked: state.parked,
        }
    }

    pub(super) fn export(&self) -> RoomSpaceState {
        RoomSpaceState {
            space: self.space.export(),
            evaluated_at: self.evaluated_at,
            parked: self.parked.clone(),
        }
    }
}

impl<S> Room<S> {
    /// Places a joining or resuming member: where it stood when it dropped,
    /// else in the middle of the plane.
    pub(super) fn space_enter(&mut self, session: &str, now: Millis) -> Vec<Arc<HistoryEntry>> {
        let Some(rs) = &mut self.space else {
            return Vec::new();
        };
        let c = rs.space.config();
        let at = rs
            .parked
            .remove(session)
            .unwrap_or_else(|| spawn_point(session, c.width, c.height));
        // Only the joiner's pairs are decided here: `evaluated_at` stays the
        // last full pass, or the others' due changes would be skipped.
        let events = rs.space.join(session, at, now).events;
        // Caused by the joiner, whose `joined` (ordered after them) carries
        // the space with them: the joiner is not sent them again.
        self.space_events(events, Some(session), now)
    }

    /// Takes a departing member out of the plane; `park` keeps where it
    /// stood for a resume.
    pub(super) fn space_exit(
        &mut self,
        session: &str,
        park: bool,
        now: Millis,
    ) -> Vec<Arc<HistoryEntry>> {
        let Some(rs) = &mut self.space else {
            return Vec::new();
        };
        if park {
            if let Some(at) = rs.space.position(session, now) {
                rs.parked.insert(session.to_owned(), at);
            }
        } else {
            rs.parked.remove(session);
        }
        let events = rs.space.leave(session);
        self.space_events(events, None, now)
    }

    /// Forgets where an expired session stood.
    pub(super) fn space_forget(&mut self, session: &str) {
        if let Some(rs) = &mut self.space {
            rs.parked.remove(session);
        }
    }

    /// `space.move` and `space.jump`.
    pub(super) fn space_request(
        &mut self,
        session: &str,
        to: [f64; 2],
        speed: Option<f64>,
        now: Millis,
    ) -> Result<RequestOutcome, RoomError> {
        let Some(rs) = &mut self.space else {
            return Err(RoomError::new(
                ErrorCode::InvalidArgs,
                "this room has no space: space.move and space.jump need a room created with options.space",
            ));
        };
        let to = Vec2::from(to);
        let moved = match speed {
            Some(speed) => rs.space.move_to(session, to, speed, now),
            None => rs.space.jump(session, to, now),
        }
        .map_err(|e| match e {
            SpaceError::InvalidArgs(m) => RoomError::new(ErrorCode::InvalidArgs, m),
            SpaceError::NotInSpace => {
                RoomError::new(ErrorCode::NotJoined, "not in the room's space")
            }
        })?;
        let movement = serde_json::to_value(moved.movement).expect("movements serialize");
        let body = EventBody::SpaceMoved {
            session: session.to_owned(),
            movement: movement.clone(),
        };
        let e = self.push_scoped(Some(session), Scope::Near, body, now);
        let mut events = vec![e.clone()];
        events.extend(self.space_events(moved.events, None, now));
        Ok(outcome(
            json!({"movement": movement, "clamped": moved.clamped, "seq": e.seq}),
            events,
        ))
    }

    /// Evaluates the space on the room's tick, when it is due.
    pub(super) fn space_tick(&mut self, now: Millis) -> Vec<Arc<HistoryEntry>> {
        let Some(rs) = &mut self.space else {
            return Vec::new();
        };
        if rs
            .space
            .next_deadline(rs.evaluated_at)
            .is_none_or(|d| d > now)
        {
            return Vec::new();
        }
        let events = rs.space.tick(now);
        rs.evaluated_at = now;
        self.space_events(events, None, now)
    }

    /// The steps the space's last tick took (0 without a space).
    pub fn space_tick_work(&self) -> usize {
        self.space
            .as_ref()
            .map_or(0, |rs| rs.space.last_tick_work())
    }

    /// When the space must be evaluated next.
    pub(super) fn space_deadline(&self) -> Option<Millis> {
        let rs = self.space.as_ref()?;
        rs.space.next_deadline(rs.evaluated_at)
    }

    /// The `space` of a `joined` frame: the plane, every member's movement,
    /// and the pairs in proximity `session` is in.
    pub(super) fn space_snapshot(&self, session: &str) -> Option<Value> {
        let rs = self.space.as_ref()?;
        let c = rs.space.config();
        let pairs: Vec<Value> = rs
            .space
            .pairs_in_proximity()
            .filter(|((a, b), _)| *a == session || *b == session)
            .map(|((a, b), id)| json!({"pair": id, "a": a, "b": b, "initiator": a}))
            .collect();
        Some(json!({
            "width": c.width,
            "height": c.height,
            "proximity_radius": c.proximity_radius,
            "hysteresis": c.hysteresis,
            "min_dwell_ms": c.min_dwell_ms,
            "aoi_radius": c.aoi_radius,
            "tick_ms": c.tick_ms,
            "direct_in_proximity_only": c.direct_in_proximity_only,
            "movements": rs.space.movements(),
            "pairs": pairs,
        }))
    }

    /// Whether a `direct` from `from` to `to` may pass (see
    /// [`SpaceConfig::direct_in_proximity_only`](crate::spatial::SpaceConfig)).
    pub(super) fn direct_allowed(&self, from: &str, to: &str) -> bool {
        self.space.as_ref().is_none_or(|rs| {
            !rs.space.config().direct_in_proximity_only || rs.space.in_proximity(from, to)
        })
    }

    /// The members who see `subject` (none in a room without a space).
    pub(super) fn space_viewers<'a>(
        &'a self,
        subject: &'a str,
    ) -> impl Iterator<Item = &'a String> + 'a {
        self.space
            .as_ref()
            .into_iter()
            .flat_map(move |rs| rs.space.viewers(subject))
    }

    /// The space's decisions as events for the two members of each pair
    /// (but `from`, when one of them caused them and knows them already).
    fn space_events(
        &mut self,
        events: Vec<SpaceEvent>,
        from: Option<&str>,
        now: Millis,
    ) -> Vec<Arc<HistoryEntry>> {
        let mut out = Vec::with_capacity(events.len());
        for e in events {
            let (a, b, body) = match e {
                SpaceEvent::ProximityEnter { pair, a, b } => {
                    let body = EventBody::ProximityEnter {
                        pair,
                        a: a.clone(),
                        b: b.clone(),
                        initiator: a.clone(),
                    };
                    (a, b, body)
                }
                SpaceEvent::ProximityLeave { pair, a, b } => {
                    let body = EventBody::ProximityLeave {
                        pair,
                        a: a.clone(),
                        b: b.clone(),
                    };
                    (a, b, body)
                }
                SpaceEvent::InterestEnter { a, b } => {
                    let space = &self
                        .space
                        .as_ref()
                        .expect("spatial events need a space")
                        .space;
                    let movements: BTreeMap<&String, _> = [&a, &b]
                        .into_iter()
                        .filter_map(|s| space.movements().get(s).map(|m| (s, m)))
                        .collect();
                    let body = EventBody::InterestEnter {
                        a: a.clone(),
                        b: b.clone(),
                        movements: serde_json::to_value(movements).expect("movements serialize"),
                    };
                    (a, b, body)
                }
                SpaceEvent::InterestLeave { a, b } => {
                    let body = EventBody::InterestLeave {
                        a: a.clone(),
                        b: b.clone(),
                    };
                    (a, b, body)
                }
            };
            out.push(self.push_scoped(from, Scope::Only(vec![a, b]), body, now));
        }
        out
    }
}

/// Where a new member appears: a point of the plane drawn from its session id
/// (FNV-1a), the same on every replica. Scattered, not all in one spot: a
/// crowd spawned in the middle would put every pair in proximity at once.
fn spawn_point(session: &str, width: f64, height: f64) -> Vec2 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in session.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    let fx = (h & 0xffff_ffff) as f64 / f64::from(u32::MAX);
    let fy = (h >> 32) as f64 / f64::from(u32::MAX);
    Vec2::new((fx * width).round(), (fy * height).round())
}
