//! Write coalescing: when to write a connection's queued frames.
//!
//! A busy room wakes each member's task for every event. Writing at once
//! would cost one syscall (and one TCP segment) per event per member. A
//! connection counts as busy when it wrote less than one window ago: then a
//! newly queued frame waits one full window, and every frame that arrives
//! meanwhile joins the same write. Counting the window from the first queued
//! frame (rather than from the previous write) matters when events arrive
//! about once per window: counted from the previous write, most of the window
//! has already passed when the next frame comes, and writes carry one frame
//! each. A quiet connection writes at once, so coalescing adds no latency to
//! sparse traffic and at most one window to a busy connection.

use std::time::Duration;

use tokio::time::Instant;

/// When a connection whose queue just became non-empty should write: `None`
/// for now, or one `window` from `now` when the connection is busy (it wrote
/// less than one `window` ago).
///
/// `last_write` is `None` before the first write; a zero `window` turns
/// coalescing off.
pub(crate) fn hold_until(
    last_write: Option<Instant>,
    now: Instant,
    window: Duration,
) -> Option<Instant> {
    let busy = now < last_write? + window;
    (window > Duration::ZERO && busy).then_some(now + window)
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
    fn a_busy_connection_holds_a_full_window_from_the_first_queued_frame() {
        let now = Instant::now();
        // Late in the window after the previous write: still a full window,
        // so the frames of the next window's worth join this write.
        assert_eq!(
            hold_until(Some(now - 2 * MS + MS / 10), now, 2 * MS),
            Some(now + 2 * MS)
        );
        assert_eq!(
            hold_until(Some(now - MS / 2), now, 2 * MS),
            Some(now + 2 * MS)
        );
        assert_eq!(hold_until(Some(now), now, 2 * MS), Some(now + 2 * MS));
    }

    #[test]
    fn a_zero_window_never_holds() {
        let now = Instant::now();
        assert_eq!(hold_until(Some(now), now, Duration::ZERO), None);
        assert_eq!(hold_until(None, now, Duration::ZERO), None);
    }
}
