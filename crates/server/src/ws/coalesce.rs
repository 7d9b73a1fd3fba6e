//! Write coalescing: when to write a connection's queued frames.
//!
//! A busy room wakes each member's task for every event. Writing at once
//! would cost one syscall (and one TCP segment) per event per member; holding
//! the queue until a short window has passed since the previous write turns a
//! burst into one write. A connection that has been quiet for the window
//! writes at once, so coalescing adds no latency to sparse traffic and at most
//! one window to a busy connection.

use std::time::Duration;

use tokio::time::Instant;

/// When a connection whose queue just became non-empty should write: `None`
/// for now, or the instant one `window` after its previous write.
///
/// `last_write` is `None` before the first write; a zero `window` turns
/// coalescing off.
pub(crate) fn hold_until(
    last_write: Option<Instant>,
    now: Instant,
    window: Duration,
) -> Option<Instant> {
    let due = last_write? + window;
    (window > Duration::ZERO && now < due).then_some(due)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn the_first_write_and_a_quiet_connection_write_at_once() {
        let now = Instant::now();
        assert_eq!(hold_until(None, now, 2 * MS), None);
        assert_eq!(hold_until(Some(now - 2 * MS), now, 2 * MS), None);
        assert_eq!(hold_until(Some(now - 50 * MS), now, 2 * MS), None);
    }

    #[test]
    fn a_busy_connection_waits_for_the_rest_of_the_window() {
        let now = Instant::now();
        let last = now - MS / 2;
        assert_eq!(hold_until(Some(last), now, 2 * MS), Some(last + 2 * MS));
        assert_eq!(hold_until(Some(now), now, 2 * MS), Some(now + 2 * MS));
    }

    #[test]
    fn a_zero_window_never_holds() {
        let now = Instant::now();
        assert_eq!(hold_until(Some(now), now, Duration::ZERO), None);
    }
}
