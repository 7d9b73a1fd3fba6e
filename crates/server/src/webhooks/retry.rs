//! When a failed delivery is tried again: exponential backoff with full
//! jitter, up to a deadline after the first attempt. Pure: the caller passes
//! the time since the first attempt and the random draw.

use std::time::Duration;

/// The longest wait before the second attempt.
pub(crate) const FIRST_BACKOFF: Duration = Duration::from_millis(500);
/// The longest wait between two attempts.
pub(crate) const MAX_BACKOFF: Duration = Duration::from_secs(60);

/// A target's retry schedule.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct RetryPolicy {
    /// How long after its first attempt an event is still tried.
    pub(crate) retry_for: Duration,
}

impl RetryPolicy {
    /// The longest wait after the `failures`-th failed attempt (1: the first
    /// attempt failed): 500 ms, doubling, at most 60 s.
    pub(crate) fn ceiling(failures: u32) -> Duration {
        let doublings = failures.saturating_sub(1).min(16);
        FIRST_BACKOFF
            .saturating_mul(1 << doublings)
            .min(MAX_BACKOFF)
    }

    /// The wait before the next attempt after the `failures`-th failed one,
    /// which ended `since_first` after the first attempt started: a uniform
    /// draw (`jitter` in `[0, 1)`) up to [`RetryPolicy::ceiling`], cut to end
    /// at the deadline; `None` when the deadline has passed (give up).
    pub(crate) fn next_delay(
        &self,
        failures: u32,
        since_first: Duration,
        jitter: f64,
    ) -> Option<Duration> {
        let left = self.retry_for.checked_sub(since_first)?;
        if left.is_zero() {
            return None;
        }
        let delay = Self::ceiling(failures).mul_f64(jitter.clamp(0.0, 1.0));
        Some(delay.min(left))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: fn(u64) -> Duration = Duration::from_millis;

    #[test]
    fn the_ceiling_doubles_from_half_a_second_to_a_minute() {
        let ceilings: Vec<u64> = (1..=10)
            .map(|n| RetryPolicy::ceiling(n).as_millis() as u64)
            .collect();
        assert_eq!(
            ceilings,
            [500, 1000, 2000, 4000, 8000, 16000, 32000, 60000, 60000, 60000]
        );
        assert_eq!(RetryPolicy::ceiling(u32::MAX), MAX_BACKOFF);
        assert_eq!(RetryPolicy::ceiling(0), FIRST_BACKOFF);
    }

    #[test]
    fn the_wait_is_a_uniform_draw_below_the_ceiling() {
        let p = RetryPolicy {
            retry_for: Duration::from_secs(3600),
        };
        assert_eq!(p.next_delay(1, MS(10), 0.0), Some(MS(0)));
        assert_eq!(p.next_delay(1, MS(10), 0.5), Some(MS(250)));
        assert_eq!(p.next_delay(3, MS(10), 0.5), Some(MS(1000)));
        assert_eq!(p.next_delay(30, MS(10), 0.25), Some(MS(15_000)));
        // Out-of-range draws are clamped.
        assert_eq!(p.next_delay(1, MS(10), 7.0), Some(MS(500)));
    }

    #[test]
    fn no_attempt_starts_after_the_deadline() {
        let p = RetryPolicy {
            retry_for: Duration::from_secs(1),
        };
        // Cut to end at the deadline: one last attempt there.
        assert_eq!(p.next_delay(2, MS(900), 0.99), Some(MS(100)));
        assert_eq!(p.next_delay(2, MS(900), 0.01), Some(MS(10)));
        // A failure at or past the deadline gives up.
        assert_eq!(p.next_delay(2, MS(1000), 0.5), None);
        assert_eq!(p.next_delay(9, MS(5000), 0.5), None);
    }
}
