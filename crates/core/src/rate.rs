use crate::Millis;

/// A token bucket: `burst` tokens at most, refilled at `per_second`.
#[derive(Debug, Clone)]
pub struct TokenBucket {
    capacity: f64,
    per_ms: f64,
    tokens: f64,
    last: Millis,
}

impl TokenBucket {
    /// A full bucket.
    pub fn new(per_second: u32, burst: u32, now: Millis) -> Self {
        let capacity = f64::from(burst.max(1));
        TokenBucket {
            capacity,
            per_ms: f64::from(per_second) / 1000.0,
            tokens: capacity,
            last: now,
        }
    }

    /// Takes one token if there is one.
    pub fn try_take(&mut self, now: Millis) -> bool {
        let elapsed = now.saturating_sub(self.last) as f64;
        self.last = self.last.max(now);
        self.tokens = (self.tokens + elapsed * self.per_ms).min(self.capacity);
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
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
