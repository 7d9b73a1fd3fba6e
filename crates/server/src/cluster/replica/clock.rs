//! Time in a replicated room: one node asks for each tick, the others only as
//! a fallback.

use super::*;

/// How long after a deadline a node that is not the room's ticker asks for
/// the tick itself, in case the ticker cannot (it is stuck, or dead and not
/// yet declared so).
const TICK_FALLBACK: Duration = Duration::from_secs(2);

/// Whether node `me` asks for the room's ticks: the node with the smallest id
/// among those its connected members are on. Every replica agrees on it, so
/// one tick is appended per deadline instead of one per hosting node; when no
/// node has members, every host asks.
fn self_is_ticker(room: &Room<Sink>, me: &str) -> bool {
    room.connected_sinks()
        .map(|s| &*s.node)
        .min()
        .is_none_or(|first| first == me)
}

impl Replica {
    /// The next time the room's clock has work, unless a tick for it was asked
    /// for lately (the broker's clock may lag this node's a little).
    pub(super) fn tick_deadline(&mut self) -> Option<tokio::time::Instant> {
        let at = self.machine.as_ref()?.room().next_deadline()?;
        let ticker = self.is_ticker();
        let wait = match self.tick_asked {
            Some((asked, when)) if asked == at => {
                (when + RETRY_AFTER).saturating_duration_since(Instant::now())
            }
            _ => Duration::from_millis(at.saturating_sub(now_ms())),
        };
        if ticker {
            return Some(tokio::time::Instant::now() + wait);
        }
        // Others wait until the fallback time after the deadline itself (not
        // after now: the loop recomputes this on every command, which would
        // push a relative delay away for ever).
        let fallback_at = at.saturating_add(TICK_FALLBACK.as_millis() as Millis);
        let fallback = Duration::from_millis(fallback_at.saturating_sub(now_ms()));
        Some(tokio::time::Instant::now() + wait.max(fallback))
    }

    /// Whether this node asks for the room's ticks (see [`self_is_ticker`]),
    /// computed once per change to the members.
    pub(super) fn is_ticker(&mut self) -> bool {
        let (machine, me) = (&self.machine, &self.me);
        *self.ticker.get_or_insert_with(|| {
            machine
                .as_ref()
                .is_some_and(|m| self_is_ticker(m.room(), me))
        })
    }

    pub(super) fn ask_tick(&mut self) {
        let Some(at) = self.machine.as_ref().and_then(|m| m.room().next_deadline()) else {
            return;
        };
        self.tick_asked = Some((at, Instant::now()));
        self.submit(0, Intent::Tick, None, false);
    }
}
