//! Cluster mode: rooms as replicated state machines over a shared log.
//!
//! A node hosts a *replica* of every room it has members in. Commands from
//! its clients are not applied at once: they become [`record::LogRecord`]s
//! appended to the room's shared log ([`plaza_broker::Cluster`]), which puts
//! them in the room's one order. Every replica applies the log in that order
//! to its own [`plaza_core::Room`]; the room being deterministic (and the
//! clock being the log's), all replicas agree on every outcome — who holds a
//! lock, which seq a message got — and each delivers events to its own
//! members. The node that appended a record answers its client (ack,
//! response, `joined`) when it applies that record.

pub(crate) mod record;
mod registry;
mod replica;
mod sink;

pub(crate) use registry::{encode_state, RoomMeta};
pub(crate) use replica::spawn_replica;
pub(crate) use sink::Sink;

use bytes::Bytes;
use plaza_broker::ClusterError;

/// The record that deletes a room, appended by `node`.
pub(crate) fn close_record(node: &str) -> Bytes {
    record::LogRecord {
        node: node.to_owned(),
        conn: 0,
        req: 0,
        intent: record::Intent::Close,
    }
    .encode()
}

/// An append that failed: who waited for it and, for changes that must not be
/// lost (a disconnect, a leave), the record to append again.
pub(crate) struct AppendFailure {
    pub(crate) req: u64,
    pub(crate) error: ClusterError,
    pub(crate) retry: Option<Bytes>,
}

/// Every this many log entries, the node that appended the entry stores a
/// snapshot of the room (a new replica starts from the latest snapshot).
pub(crate) const SNAPSHOT_EVERY: u64 = 256;
/// Any replica stores a snapshot when the latest one is this far behind (the
/// node due to store it may have died). Well below the log's capacity, so a
/// replica can always continue from the latest snapshot.
pub(crate) const SNAPSHOT_MAX_LAG: u64 = 2_000;
