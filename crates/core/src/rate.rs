use crate::Millis;

/// Thousandths of a token: refilling `per_second` tokens per second adds
/// exactly `per_second` of them per millisecond, so no rounding accumulates.
const MILLI: u64 = 1_000;

/// A token bucket: `burst` tokens at most, refilled at `per_second`.
#[derive(Debug, Clone)]
pub struct TokenBucket {
    /// Most milli-tokens held.
    capacity: u64,
    /// Milli-tokens added per millisecond (= tokens per second).
    per_ms: u64,
    /// Milli-tokens held.
    tokens: u64,
    last: Millis,
}

impl TokenBucket {
    /// A full bucket.
    pub fn new(per_second: u32, burst: u32, now: Millis) -> Self {
        let capacity = u64::from(burst.max(1)) * MILLI;
        TokenBucket {
            capacity,
            per_ms: u64::from(per_second),
            tokens: capacity,
            last: now,
        }
    }

    /// Takes one token if there is one.
    pub fn try_take(&mut self, now: Millis) -> bool {
        let elapsed = now.saturating_sub(self.last);
        self.last = self.last.max(now);
        let refill = elapsed.saturating_mul(self.per_ms);
        self.tokens = self.tokens.saturating_add(refill).min(self.capacity);
        if self.tokens >= MILLI {
            self.tokens -= MILLI;
            true
        } else {
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn burst_then_steady_rate() {
        let mut b = TokenBucket::new(10, 3, 0);
        assert!((0..3).all(|_| b.try_take(0)));
        assert!(!b.try_take(0));
        assert!(!b.try_take(99));
        assert!(b.try_take(100));
        assert!(!b.try_take(100));
        // a clock going backwards never adds tokens
        assert!(!b.try_take(50));
        assert!(b.try_take(10_000) && b.try_take(10_000) && b.try_take(10_000));
        assert!(!b.try_take(10_000));
    }
}
