//! When to ping a client and when to give up on it: the same rule on every
//! transport. Pure timing, the clock passed in.

use std::time::Duration;

use tokio::time::Instant;

/// What is due at a deadline.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Due {
    /// Nothing yet (an early wake-up).
    Nothing,
    /// Send a heartbeat: the client has been sent nothing of the kind for an
    /// interval.
    Ping,
    /// Nothing arrived from the client for the idle timeout: close it (4001).
    Expired,
}

/// A client's heartbeat schedule: a ping every `interval`, expiry after
/// `idle` without hearing from it.
#[derive(Debug, Clone)]
pub(crate) struct Liveness {
    interval: Duration,
    idle: Duration,
    last_heard: Instant,
    next_ping: Instant,
}

impl Liveness {
    /// A schedule starting at `now` (both durations at least 1 ms).
    pub(crate) fn new(interval: Duration, idle: Duration, now: Instant) -> Liveness {
        let interval = interval.max(Duration::from_millis(1));
        Liveness {
            interval,
            idle: idle.max(Duration::from_millis(1)),
            last_heard: now,
            next_ping: now + interval,
        }
    }

    /// Something arrived from the client at `now`.
    pub(crate) fn heard(&mut self, now: Instant) {
        self.last_heard = now;
    }

    /// The next time something may be due.
    pub(crate) fn deadline(&self) -> Instant {
        self.next_ping.min(self.last_heard + self.idle)
    }

    /// What is due at `now`; a ping due moves the next one an interval on.
    pub(crate) fn due(&mut self, now: Instant) -> Due {
        if now >= self.last_heard + self.idle {
            Due::Expired
        } else if now >= self.next_ping {
            self.next_ping = now + self.interval;
            Due::Ping
        } else {
            Due::Nothing
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Duration = Duration::from_secs(1);

    #[test]
    fn pings_every_interval_and_expires_after_silence() {
        let t0 = Instant::now();
        let mut l = Liveness::new(25 * S, 30 * S, t0);
        assert_eq!(l.deadline(), t0 + 25 * S);
        assert_eq!(l.due(t0 + 24 * S), Due::Nothing);
        assert_eq!(l.due(t0 + 25 * S), Due::Ping);
        // The next ping is an interval on, but expiry comes first.
        assert_eq!(l.deadline(), t0 + 30 * S);
        assert_eq!(l.due(t0 + 30 * S), Due::Expired);
    }

    #[test]
    fn hearing_from_the_client_postpones_expiry_not_pings() {
        let t0 = Instant::now();
        let mut l = Liveness::new(25 * S, 30 * S, t0);
        l.heard(t0 + 20 * S);
        assert_eq!(l.due(t0 + 25 * S), Due::Ping);
        assert_eq!(l.due(t0 + 30 * S), Due::Nothing);
        assert_eq!(l.deadline(), t0 + 50 * S);
        assert_eq!(l.due(t0 + 50 * S), Due::Expired);
    }

    #[test]
    fn zero_durations_are_one_millisecond() {
        let t0 = Instant::now();
        let mut l = Liveness::new(Duration::ZERO, Duration::ZERO, t0);
        assert_eq!(l.deadline(), t0 + Duration::from_millis(1));
        assert_eq!(l.due(t0 + Duration::from_millis(1)), Due::Expired);
    }
}
