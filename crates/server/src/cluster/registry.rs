//! Rooms in the cluster's registry: what every node needs to know of a room
//! it does not host (its summary), and a new room's first snapshot.

use bytes::Bytes;
use plaza_core::{Access, Millis, Room, RoomConfig};
use serde::{Deserialize, Serialize};

use super::Sink;
use crate::node::RoomSummary;

/// A room's registry entry, fixed at creation.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct RoomMeta {
    pub(crate) name: String,
    pub(crate) created_at: Millis,
    /// `open` or `ticket`.
    pub(crate) access: String,
    pub(crate) history_size: usize,
    pub(crate) max_members: usize,
    pub(crate) presence: bool,
}

impl RoomMeta {
    pub(crate) fn new(name: &str, config: &RoomConfig, created_at: Millis) -> RoomMeta {
        RoomMeta {
            name: name.to_owned(),
            created_at,
            access: match config.access {
                Access::Open => "open".into(),
                Access::TicketOnly => "ticket".into(),
            },
            history_size: config.history_size,
            max_members: config.max_members,
            presence: config.presence,
        }
    }

    pub(crate) fn access(&self) -> Access {
        if self.access == "ticket" {
            Access::TicketOnly
        } else {
            Access::Open
        }
    }

    pub(crate) fn encode(&self) -> Bytes {
        Bytes::from(serde_json::to_vec(self).expect("metadata serializes"))
    }

    pub(crate) fn decode(bytes: &[u8]) -> Option<RoomMeta> {
        serde_json::from_slice(bytes).ok()
    }

    /// The summary, with `members` as this node knows it.
    pub(crate) fn summary(&self, id: &str, members: usize) -> RoomSummary {
        RoomSummary {
            id: id.to_owned(),
            name: self.name.clone(),
            members,
            created_at: self.created_at,
            access: self.access.clone(),
            history_size: self.history_size,
            max_members: self.max_members,
            presence: self.presence,
        }
    }
}

/// A room's state as stored in snapshots (a new room's first one included).
pub(crate) fn encode_state(room: &Room<Sink>) -> Bytes {
    let state = room.export(|s: &Sink| s.owner());
    Bytes::from(serde_json::to_vec(&state).expect("room state serializes"))
}
