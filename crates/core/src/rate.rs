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

/// One token bucket per key (a client address, say), created full on a key's
/// first take. Keys whose bucket has filled up again are forgotten once more
/// than `keep` keys are known: such a key behaves the same when it comes back.
#[derive(Debug)]
pub struct RatePerKey<K> {
    per_second: u32,
    burst: u32,
    keep: usize,
    buckets: std::collections::HashMap<K, TokenBucket>,
}

impl<K: std::hash::Hash + Eq> RatePerKey<K> {
    /// `per_second` takes per key, `burst` at once; about `keep` keys kept.
    pub fn new(per_second: u32, burst: u32, keep: usize) -> Self {
        RatePerKey {
            per_second,
            burst,
            keep: keep.max(1),
            buckets: std::collections::HashMap::new(),
        }
    }

    /// Takes one token of `key`'s bucket if there is one.
    pub fn try_take(&mut self, key: K, now: Millis) -> bool {
        if self.buckets.len() >= self.keep && !self.buckets.contains_key(&key) {
            self.buckets.retain(|_, b| !b.is_full(now));
        }
        let (per_second, burst) = (self.per_second, self.burst);
        self.buckets
            .entry(key)
            .or_insert_with(|| TokenBucket::new(per_second, burst, now))
            .try_take(now)
    }

    /// Keys known now.
    pub fn len(&self) -> usize {
        self.buckets.len()
    }

    /// Whether no key is known.
    pub fn is_empty(&self) -> bool {
        self.buckets.is_empty()
    }
}

impl TokenBucket {
    /// Whether the bucket would be full at `now`: as good as a new one.
    pub fn is_full(&self, now: Millis) -> bool {
        let refill = now.saturating_sub(self.last).saturating_mul(self.per_ms);
        self.tokens.saturating_add(refill) >= self.capacity
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_key_has_its_own_bucket_and_idle_keys_are_forgotten() {
        let mut r = RatePerKey::new(1, 2, 2);
        assert!(r.try_take("a", 0) && r.try_take("a", 0));
        assert!(!r.try_take("a", 0), "a's burst is spent");
        assert!(r.try_take("b", 0), "b is not affected");
        // A third key while two are known: none is idle yet, so none is forgotten.
        assert!(r.try_take("c", 500));
        assert_eq!(r.len(), 3);
        // Later every bucket has filled up: a new key makes room.
        assert!(r.try_take("d", 10_000));
        assert_eq!(r.len(), 1);
        assert!(r.try_take("a", 10_000) && r.try_take("a", 10_000));
        assert!(!r.try_take("a", 10_000));
    }

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
