//! A warning about dropped events at most every so often, saying how many
//! were dropped since the last one. Pure: the caller passes the clock.

use std::sync::atomic::{AtomicU64, Ordering};

/// The shortest time between two warnings.
pub(crate) const WARN_EVERY_MS: u64 = 10_000;

/// Counts drops and says when to warn.
#[derive(Debug, Default)]
pub(crate) struct DropLog {
    /// When the last warning was given (Unix ms; 0: never).
    last_ms: AtomicU64,
    /// Drops since the last warning.
    since: AtomicU64,
}

impl DropLog {
    /// Counts one drop at `now_ms`: the drops to report (this one
    /// included) when a warning is due, else `None`.
    pub(crate) fn dropped(&self, now_ms: u64) -> Option<u64> {
        self.since.fetch_add(1, Ordering::Relaxed);
        let last = self.last_ms.load(Ordering::Relaxed);
        let due = last == 0 || now_ms.saturating_sub(last) >= WARN_EVERY_MS;
        // One caller wins the warning.
        if due
            && self
                .last_ms
                .compare_exchange(last, now_ms.max(1), Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            return Some(self.since.swap(0, Ordering::Relaxed));
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn warns_at_once_then_at_most_every_ten_seconds_with_the_count() {
        let log = DropLog::default();
        assert_eq!(log.dropped(1_000), Some(1));
        assert_eq!(log.dropped(1_001), None);
        assert_eq!(log.dropped(10_999), None);
        assert_eq!(log.dropped(11_000), Some(3));
        assert_eq!(log.dropped(11_000), None);
        assert_eq!(log.dropped(30_000), Some(2));
    }
}
