use std::collections::VecDeque;
use std::sync::{Arc, OnceLock};

use bytes::Bytes;
use serde::{Deserialize, Serialize};

use crate::Millis;

/// One ordered room event: its metadata for routing and its frame, encoded once.
///
/// Serializable as part of a [`crate::RoomState`]; absent options and a false
/// `echo` are left out, since a full history is most of a room's snapshot.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HistoryEntry {
    /// Position in the room's total order.
    pub seq: u64,
    /// When it was ordered.
    pub ts: Millis,
    /// Session that caused it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from: Option<String>,
    /// `Some` for messages: only subscribers of this channel receive it.
    /// `None` for room-wide events (presence, state, locks).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub channel: Option<String>,
    /// Deliver to `from` as well.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub echo: bool,
    /// Replay to `from` when it resumes, though it was not delivered to it
    /// live: a state change it caused whose answer the lost connection may
    /// have carried away.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub replay_to_sender: bool,
    /// Message topic, for delivery policies.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub topic: Option<String>,
    /// The seq this message answers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reply_to: Option<u64>,
    /// Who among the members gets it: everyone (subject to `channel`), or
    /// only some (spatial rooms).
    #[serde(default, skip_serializing_if = "Scope::is_all")]
    pub scope: Scope,
    /// The `event` frame as sent on the wire.
    #[serde(with = "frame_bytes")]
    pub frame: Bytes,
    /// The frame's other wire forms, each made once for every recipient
    /// that needs it. Not part of snapshots.
    #[serde(skip)]
    pub wire: WireCache,
}

/// The other wire forms of a frame, each made lazily (the first time a
/// recipient needs it) and then shared by every recipient.
///
/// Equal to any other: it only caches what the frame determines.
#[derive(Clone, Default)]
pub struct WireCache {
    /// Compressed on its own by permessage-deflate: it comes out the same
    /// for everyone.
    deflated: OnceLock<Bytes>,
    /// The compact form (`plaza_protocol::compact`), made by the room on
    /// the node under its key; `None` for a frame that has none and goes as
    /// it is.
    compact: OnceLock<Option<Bytes>>,
    /// The compact form, compressed.
    compact_deflated: OnceLock<Bytes>,
}

impl WireCache {
    /// The frame compressed, made by `make` the first time.
    pub fn deflated(&self, make: impl FnOnce() -> Bytes) -> &Bytes {
        self.deflated.get_or_init(make)
    }

    /// Makes the frame's compact form with `make`, unless it was made.
    pub fn make_compact(&self, make: impl FnOnce() -> Option<Bytes>) {
        self.compact.get_or_init(make);
    }

    /// The frame's compact form, if it has one and it was made.
    pub fn compact(&self) -> Option<&Bytes> {
        self.compact.get().and_then(Option::as_ref)
    }

    /// The compact form compressed, made by `make` the first time.
    pub fn compact_deflated(&self, make: impl FnOnce() -> Bytes) -> &Bytes {
        self.compact_deflated.get_or_init(make)
    }
}

impl PartialEq for WireCache {
    fn eq(&self, _: &WireCache) -> bool {
        true
    }
}

impl Eq for WireCache {}

impl std::fmt::Debug for WireCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WireCache")
            .field("deflated", &self.deflated.get().is_some())
            .field("compact", &self.compact.get().is_some())
            .field("compact_deflated", &self.compact_deflated.get().is_some())
            .finish()
    }
}

/// Which members an event is for.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Scope {
    /// Every member (subject to the channel).
    #[default]
    All,
    /// The members whose area of interest holds its sender (spatial rooms).
    Near,
    /// These sessions only.
    Only(Vec<String>),
}

impl Scope {
    /// Whether it is [`Scope::All`].
    pub fn is_all(&self) -> bool {
        *self == Scope::All
    }
}

/// Serde for a frame: opaque bytes that must come back identical.
///
/// Frames are UTF-8 (JSON) in practice, and a JSON string holds them at a
/// small escaping cost, where the generic byte encoding of text formats (an
/// array of numbers) would take about four times the space. Anything else
/// still round-trips: as a byte array in text formats, and binary formats
/// always get plain bytes.
mod frame_bytes {
    use std::fmt;

    use bytes::Bytes;
    use serde::de::{self, SeqAccess, Visitor};
    use serde::{Deserializer, Serializer};

    pub fn serialize<S: Serializer>(frame: &Bytes, s: S) -> Result<S::Ok, S::Error> {
        match std::str::from_utf8(frame) {
            Ok(text) if s.is_human_readable() => s.serialize_str(text),
            _ => s.serialize_bytes(frame),
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Bytes, D::Error> {
        if d.is_human_readable() {
            // Text or a byte array, depending on what `serialize` chose.
            d.deserialize_any(FrameVisitor)
        } else {
            d.deserialize_byte_buf(FrameVisitor)
        }
    }

    struct FrameVisitor;

    impl<'de> Visitor<'de> for FrameVisitor {
        type Value = Bytes;

        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("a frame as a string or bytes")
        }

        fn visit_str<E: de::Error>(self, v: &str) -> Result<Bytes, E> {
            Ok(Bytes::copy_from_slice(v.as_bytes()))
        }

        fn visit_string<E: de::Error>(self, v: String) -> Result<Bytes, E> {
            Ok(Bytes::from(v.into_bytes()))
        }

        fn visit_bytes<E: de::Error>(self, v: &[u8]) -> Result<Bytes, E> {
            Ok(Bytes::copy_from_slice(v))
        }

        fn visit_byte_buf<E: de::Error>(self, v: Vec<u8>) -> Result<Bytes, E> {
            Ok(Bytes::from(v))
        }

        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Bytes, A::Error> {
            let mut v = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(1 << 16));
            while let Some(b) = seq.next_element::<u8>()? {
                v.push(b);
            }
            Ok(Bytes::from(v))
        }
    }
}

/// A room's bounded, ordered history: the last `capacity` events.
///
/// Sequence numbers are gap-free, so the entry for `seq` is found by offset.
#[derive(Debug)]
pub struct RoomLog {
    entries: VecDeque<Arc<HistoryEntry>>,
    capacity: usize,
}

impl RoomLog {
    /// An empty log keeping at most `capacity` entries (at least 1).
    pub fn new(capacity: usize) -> Self {
        RoomLog {
            // Grows on demand: a quiet room holds no history memory.
            entries: VecDeque::new(),
            capacity: capacity.max(1),
        }
    }

    /// Appends the next entry, dropping the oldest when full.
    ///
    /// # Panics
    /// If `entry.seq` does not follow the last entry's seq: that would be a bug
    /// in the room, and a gap must never reach a client.
    pub fn push(&mut self, entry: Arc<HistoryEntry>) {
        if let Some(last) = self.entries.back() {
            assert_eq!(entry.seq, last.seq + 1, "room log must stay gap-free");
        }
        if self.entries.len() == self.capacity {
            self.entries.pop_front();
        }
        self.entries.push_back(entry);
    }

    /// The entries after `last_seq`, or `None` if the log no longer reaches back
    /// that far (some event after `last_seq` was dropped).
    pub fn since(&self, last_seq: u64) -> Option<impl Iterator<Item = &Arc<HistoryEntry>>> {
        let first = match self.entries.front() {
            Some(e) => e.seq,
            None => return Some(self.entries.range(0..0)),
        };
        let next = last_seq.saturating_add(1);
        if next < first {
            return None;
        }
        let skip = usize::try_from(next - first).unwrap_or(usize::MAX);
        Some(self.entries.range(skip.min(self.entries.len())..))
    }

    /// The entry with `seq`, if still held.
    pub fn get(&self, seq: u64) -> Option<&Arc<HistoryEntry>> {
        let first = self.entries.front()?.seq;
        let i = usize::try_from(seq.checked_sub(first)?).ok()?;
        self.entries.get(i)
    }

    /// The last `n` entries, oldest first.
    pub fn last(&self, n: usize) -> impl Iterator<Item = &Arc<HistoryEntry>> {
        self.entries.range(self.entries.len().saturating_sub(n)..)
    }

    /// The newest `last` messages on `channel` for everyone (not scoped to
    /// some members) with a seq above `since`, oldest first; and whether the
    /// log reached back far enough to be sure none older qualified.
    pub fn messages(
        &self,
        channel: &str,
        since: u64,
        last: usize,
    ) -> (Vec<&Arc<HistoryEntry>>, bool) {
        let mut found: Vec<&Arc<HistoryEntry>> = self
            .entries
            .iter()
            .rev()
            .take_while(|e| e.seq > since)
            .filter(|e| e.channel.as_deref() == Some(channel) && e.scope.is_all())
            .take(last)
            .collect();
        found.reverse();
        // Complete if `last` were found, or the log still holds the first
        // seq that could have qualified.
        let complete = found.len() == last
            || match self.entries.front() {
                None => true,
                Some(e) => e.seq <= since.saturating_add(1) || e.seq == 1,
            };
        (found, complete)
    }

    /// The oldest seq still held.
    pub fn first_seq(&self) -> Option<u64> {
        self.entries.front().map(|e| e.seq)
    }

    /// Number of entries held.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// True when nothing is held.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The most entries held.
    pub fn capacity(&self) -> usize {
        self.capacity
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    pub(crate) fn entry(seq: u64) -> Arc<HistoryEntry> {
        Arc::new(HistoryEntry {
            seq,
            ts: 0,
            from: None,
            channel: None,
            echo: false,
            replay_to_sender: false,
            topic: None,
            reply_to: None,
            scope: Scope::All,
            frame: Bytes::new(),
            wire: Default::default(),
        })
    }

    #[test]
    fn since_returns_exactly_the_missed_entries() {
        let mut log = RoomLog::new(3);
        for s in 1..=5 {
            log.push(entry(s));
        }
        assert_eq!(log.first_seq(), Some(3));
        let seqs = |l: u64| log.since(l).map(|it| it.map(|e| e.seq).collect::<Vec<_>>());
        assert_eq!(seqs(2), Some(vec![3, 4, 5]));
        assert_eq!(seqs(4), Some(vec![5]));
        assert_eq!(seqs(5), Some(vec![]));
        assert_eq!(seqs(9), Some(vec![]));
        assert_eq!(seqs(1), None);
        assert_eq!(log.last(2).map(|e| e.seq).collect::<Vec<_>>(), vec![4, 5]);
    }

    /// Seqs 1..=10: odd ones on `chat`, 4 on `chat` for some members only,
    /// the rest room-wide; a log of `capacity`.
    fn chat_log(capacity: usize) -> RoomLog {
        let mut log = RoomLog::new(capacity);
        for seq in 1..=10 {
            let mut e = (*entry(seq)).clone();
            if seq % 2 == 1 || seq == 4 {
                e.channel = Some("chat".into());
            }
            if seq == 4 {
                e.scope = Scope::Only(vec!["s1".into()]);
            }
            log.push(Arc::new(e));
        }
        log
    }

    #[test]
    fn messages_are_the_newest_of_a_channel_for_everyone() {
        let log = chat_log(100);
        let pick = |since, last| {
            let (found, complete) = log.messages("chat", since, last);
            (found.iter().map(|e| e.seq).collect::<Vec<_>>(), complete)
        };
        assert_eq!(pick(0, 3), (vec![5, 7, 9], true));
        assert_eq!(pick(0, 100), (vec![1, 3, 5, 7, 9], true));
        assert_eq!(pick(5, 100), (vec![7, 9], true));
        assert_eq!(pick(6, 1), (vec![9], true));
        assert_eq!(pick(10, 5), (vec![], true));
        assert_eq!(log.messages("main", 0, 5).0.len(), 0);
    }

    #[test]
    fn messages_say_when_the_log_no_longer_reaches_back() {
        // Holds 6..=10: messages 7 and 9 on `chat`.
        let log = chat_log(5);
        let pick = |since, last| {
            let (found, complete) = log.messages("chat", since, last);
            (found.iter().map(|e| e.seq).collect::<Vec<_>>(), complete)
        };
        assert_eq!(pick(0, 2), (vec![7, 9], true));
        assert_eq!(pick(0, 3), (vec![7, 9], false));
        assert_eq!(pick(4, 10), (vec![7, 9], false));
        assert_eq!(pick(5, 10), (vec![7, 9], true));
        assert_eq!(pick(8, 10), (vec![9], true));
    }

    #[test]
    #[should_panic(expected = "gap-free")]
    fn gaps_are_refused() {
        let mut log = RoomLog::new(3);
        log.push(entry(1));
        log.push(entry(3));
    }
}
