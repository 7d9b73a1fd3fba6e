//! The key a room's compact messages are made under on this node
//! ([`plaza_protocol::compact`]): an alias unique among the rooms open in
//! this process, and the time their `ts` counts from.
//!
//! The key belongs to the room's machine, not to a connection, so a
//! message's compact form is made once for every recipient here. An alias
//! goes back to the pool when its room's machine ends, and is handed out
//! again after the ones freed before it. A client never confuses two rooms
//! by it: the old room's events all come before its `closed`, and the new
//! room's after the `joined` that names its key.

use std::collections::VecDeque;
use std::sync::Mutex;

use plaza_core::{HistoryEntry, Millis};
use plaza_protocol::compact::{compact_message, CompactKey};

/// The aliases of this process: every number from 1 to `last` that is not
/// in `free` is leased.
#[derive(Default)]
struct AliasPool {
    last: u32,
    free: VecDeque<u32>,
}

impl AliasPool {
    /// The alias freed longest ago, or a new one: aliases stay as small as
    /// the number of rooms open at once.
    fn take(&mut self) -> u32 {
        self.free.pop_front().unwrap_or_else(|| {
            self.last += 1;
            self.last
        })
    }

    fn give_back(&mut self, alias: u32) {
        self.free.push_back(alias);
    }
}

static POOL: Mutex<AliasPool> = Mutex::new(AliasPool {
    last: 0,
    free: VecDeque::new(),
});

/// A room's compact key, held for as long as its machine lives.
#[derive(Debug)]
pub(crate) struct CompactLease {
    key: CompactKey,
}

impl CompactLease {
    /// A key with an alias no open room has, its time counted from `now`.
    pub(crate) fn new(now: Millis) -> CompactLease {
        let alias = POOL.lock().unwrap_or_else(|p| p.into_inner()).take();
        CompactLease {
            key: CompactKey {
                alias,
                ts_base: now,
            },
        }
    }

    /// The key.
    pub(crate) fn key(&self) -> CompactKey {
        self.key
    }

    /// Makes `entry`'s compact form under this key (once; nothing for an
    /// event that is not a message).
    pub(crate) fn prepare(&self, entry: &HistoryEntry) {
        entry
            .wire
            .make_compact(|| compact_message(&entry.frame, self.key));
    }
}

impl Drop for CompactLease {
    fn drop(&mut self) {
        POOL.lock()
            .unwrap_or_else(|p| p.into_inner())
            .give_back(self.key.alias);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aliases_are_distinct_small_and_a_freed_one_comes_back_after_older_ones() {
        let mut pool = AliasPool::default();
        let taken: Vec<u32> = (0..4).map(|_| pool.take()).collect();
        assert_eq!(taken, [1, 2, 3, 4]);
        pool.give_back(3);
        pool.give_back(1);
        assert_eq!(pool.take(), 3);
        assert_eq!(pool.take(), 1);
        assert_eq!(pool.take(), 5);
    }

    #[test]
    fn a_lease_keeps_its_alias_from_every_other_lease_and_its_base() {
        let a = CompactLease::new(5);
        let b = CompactLease::new(6);
        assert_ne!(a.key().alias, b.key().alias);
        assert_eq!((a.key().ts_base, b.key().ts_base), (5, 6));
    }

    #[test]
    fn a_message_is_prepared_under_the_key_and_other_events_are_not() {
        use bytes::Bytes;
        let lease = CompactLease::new(1_000);
        let entry = |frame: &'static str| HistoryEntry {
            seq: 1,
            ts: 1_010,
            from: None,
            channel: None,
            echo: false,
            replay_to_sender: false,
            topic: None,
            reply_to: None,
            scope: Default::default(),
            frame: Bytes::from_static(frame.as_bytes()),
            wire: Default::default(),
        };
        let message =
            entry(r#"{"type":"event","room":"r","seq":1,"ts":1010,"kind":"message","event":"e"}"#);
        lease.prepare(&message);
        let alias = lease.key().alias;
        assert_eq!(
            message.wire.compact().map(|b| b.to_vec()),
            Some(format!(r#"[{alias},1,10,null,"e",null]"#).into_bytes())
        );
        let presence = entry(
            r#"{"type":"event","room":"r","seq":1,"ts":1010,"kind":"presence.leave","session":"s","reason":"left"}"#,
        );
        lease.prepare(&presence);
        assert_eq!(presence.wire.compact(), None);
    }
}
