//! Fingerprints of the last entries a replica applied, to tell a harmless
//! duplicate from a log that went back.
//!
//! Redis replicates asynchronously: a replica promoted after its primary died
//! can lack the last entries of a room's log that this node already applied
//! and delivered. The log then goes on from the promoted replica's end, and
//! new entries take the lost ones' positions with other contents. Entries
//! carry no link to the entry before them, so the replica remembers what it
//! applied at each of the last [`REMEMBERED`] positions (the entry's
//! timestamp and a hash of its payload): an entry at a position already
//! applied is a duplicate if it matches, and proof that the room's history
//! was rewritten if it does not.
//!
//! Limits: a position older than the last [`REMEMBERED`] applied cannot be
//! checked, nor one applied before the replica last started from a
//! snapshot (the snapshot does not say what the entries before it were).
//! The hash is std's `DefaultHasher` (SipHash with fixed keys): stable within
//! a process, which is all it is compared in.

use std::collections::VecDeque;
use std::hash::{DefaultHasher, Hash, Hasher};

use plaza_broker::LogEntry;
use plaza_core::Millis;

/// Positions remembered: the last this many entries applied.
pub(super) const REMEMBERED: usize = 1024;

/// What an entry at a position already applied is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Seen {
    /// The entry applied there: delivered again (a harmless duplicate).
    Same,
    /// Another entry than the one applied there: the log went back.
    Rewritten,
    /// Not remembered: it cannot be told.
    Unknown,
}

/// An entry's fingerprint.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Print {
    ts: Millis,
    hash: u64,
}

impl Print {
    fn of(e: &LogEntry) -> Print {
        let mut h = DefaultHasher::new();
        e.payload.hash(&mut h);
        Print {
            ts: e.ts,
            hash: h.finish(),
        }
    }
}

/// The fingerprints of the last [`REMEMBERED`] entries applied, at
/// consecutive positions.
#[derive(Debug, Default)]
pub(super) struct Applied {
    /// The position of `prints[0]`.
    first: u64,
    prints: VecDeque<Print>,
}

impl Applied {
    /// Remembers the entry just applied. Entries are applied at consecutive
    /// positions; one that is not the next starts the memory again.
    pub(super) fn push(&mut self, e: &LogEntry) {
        if self.prints.is_empty() || e.n != self.first + self.prints.len() as u64 {
            self.prints.clear();
            self.first = e.n;
        }
        self.prints.push_back(Print::of(e));
        if self.prints.len() > REMEMBERED {
            self.prints.pop_front();
            self.first += 1;
        }
    }

    /// Forgets everything (the replica started again from a snapshot).
    pub(super) fn clear(&mut self) {
        self.prints.clear();
    }

    /// Whether position `n` is remembered.
    pub(super) fn holds(&self, n: u64) -> bool {
        n >= self.first && n - self.first < self.prints.len() as u64
    }

    /// Compares an entry at a position already applied with what was applied there.
    pub(super) fn check(&self, e: &LogEntry) -> Seen {
        if !self.holds(e.n) {
            return Seen::Unknown;
        }
        if self.prints[(e.n - self.first) as usize] == Print::of(e) {
            Seen::Same
        } else {
            Seen::Rewritten
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(n: u64, ts: Millis, payload: &'static str) -> LogEntry {
        LogEntry {
            n,
            ts,
            payload: bytes::Bytes::from_static(payload.as_bytes()),
        }
    }

    #[test]
    fn an_identical_duplicate_is_the_same_entry() {
        let mut applied = Applied::default();
        for n in 1..=5 {
            applied.push(&entry(n, 100 + n, "same"));
        }
        // The same entries delivered again: nothing happened.
        for n in 1..=5 {
            assert_eq!(applied.check(&entry(n, 100 + n, "same")), Seen::Same);
        }
    }

    #[test]
    fn another_entry_at_an_applied_position_is_a_rewritten_history() {
        let mut applied = Applied::default();
        applied.push(&entry(1, 10, "a"));
        applied.push(&entry(2, 11, "b"));
        assert_eq!(applied.check(&entry(2, 11, "c")), Seen::Rewritten);
        assert_eq!(applied.check(&entry(2, 12, "b")), Seen::Rewritten);
        assert_eq!(applied.check(&entry(1, 10, "a")), Seen::Same);
    }

    #[test]
    fn only_the_last_positions_are_remembered() {
        let mut applied = Applied::default();
        let total = REMEMBERED as u64 + 10;
        for n in 1..=total {
            applied.push(&entry(n, n, "x"));
        }
        assert_eq!(applied.check(&entry(10, 10, "y")), Seen::Unknown);
        assert_eq!(applied.check(&entry(11, 11, "y")), Seen::Rewritten);
        assert_eq!(applied.check(&entry(total, total, "x")), Seen::Same);
        assert_eq!(applied.check(&entry(total + 1, 0, "x")), Seen::Unknown);
        assert!(applied.holds(total) && !applied.holds(10));
    }

    #[test]
    fn a_jump_or_a_clear_starts_the_memory_again() {
        let mut applied = Applied::default();
        applied.push(&entry(1, 1, "a"));
        applied.push(&entry(2, 2, "b"));
        // A snapshot took the replica to 40.
        applied.push(&entry(41, 41, "c"));
        assert_eq!(applied.check(&entry(2, 2, "z")), Seen::Unknown);
        assert_eq!(applied.check(&entry(41, 41, "c")), Seen::Same);
        applied.clear();
        assert_eq!(applied.check(&entry(41, 41, "z")), Seen::Unknown);
        assert!(!applied.holds(41));
    }
}
