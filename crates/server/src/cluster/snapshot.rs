//! A room's state as stored in snapshots (a new room's first one included).

use bytes::Bytes;
use plaza_core::Room;

use crate::room::Sink;

/// Encodes `room` for the shared store: members are named by `node/conn`.
pub(crate) fn encode_state(room: &Room<Sink>) -> Bytes {
    let state = room.export(|s: &Sink| s.owner());
    Bytes::from(serde_json::to_vec(&state).expect("room state serializes"))
}
