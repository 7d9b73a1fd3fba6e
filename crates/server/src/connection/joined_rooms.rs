//! The rooms one connection has joined, with its session and rights in each.

use std::sync::Arc;

use plaza_core::Rights;

use crate::room::RoomHandle;

/// A joined room, this connection's session in it and what the session may
/// do there: `None` for anything a member may (development mode, tickets),
/// else what the connection's token grants in the room.
pub(crate) type JoinedRoom = (RoomHandle, String, Option<Arc<Rights>>);

/// Joined rooms: a short vector rather than a hash map. A connection joins a
/// handful of rooms at most (`max_rooms_per_connection`), so a linear scan is
/// as fast, and an idle connection in one room keeps one 32-byte entry
/// instead of a map's minimum of four buckets (about 530 bytes).
#[derive(Default)]
pub(crate) struct JoinedRooms {
    entries: Vec<JoinedRoom>,
}

impl JoinedRooms {
    /// The room with this id and this connection's session in it.
    pub(crate) fn get(&self, room: &str) -> Option<&JoinedRoom> {
        self.entries.iter().find(|(r, _, _)| r.id() == room)
    }

    /// Whether the room with this id is joined.
    pub(crate) fn contains(&self, room: &str) -> bool {
        self.get(room).is_some()
    }

    /// Forgets the room with this id, returning its entry.
    pub(crate) fn remove(&mut self, room: &str) -> Option<JoinedRoom> {
        let at = self.entries.iter().position(|(r, _, _)| r.id() == room)?;
        let entry = self.entries.swap_remove(at);
        if self.entries.is_empty() {
            self.entries = Vec::new();
        }
        Some(entry)
    }

    /// Adds a room; the caller has checked it is not joined yet.
    pub(crate) fn insert(
        &mut self,
        room: RoomHandle,
        session: String,
        rights: Option<Arc<Rights>>,
    ) {
        debug_assert!(!self.contains(room.id()));
        // Exactly one more slot: most connections stay in one room.
        self.entries.reserve_exact(1);
        self.entries.push((room, session, rights));
    }

    /// Keeps only the rooms for which `keep` is true.
    pub(crate) fn retain(&mut self, mut keep: impl FnMut(&RoomHandle) -> bool) {
        self.entries.retain(|(r, _, _)| keep(r));
    }

    /// Sets the rights of every room joined under a token (a refreshed
    /// token's grants); rooms joined otherwise keep theirs.
    pub(crate) fn regrant(&mut self, mut rights: impl FnMut(&str) -> Arc<Rights>) {
        for (room, _, r) in &mut self.entries {
            if r.is_some() {
                *r = Some(rights(room.id()));
            }
        }
    }

    /// How many rooms are joined.
    pub(crate) fn len(&self) -> usize {
        self.entries.len()
    }

    /// Takes every entry, leaving none.
    pub(crate) fn take_all(&mut self) -> Vec<JoinedRoom> {
        std::mem::take(&mut self.entries)
    }
}
