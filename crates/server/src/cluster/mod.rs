//! Cluster mode: rooms as replicated state machines over a shared log.
//!
//! A node hosts a *replica* of every room it has members in. Commands from
//! its clients are not applied at once: they become [`record::LogRecord`]s
//! appended to the room's shared log ([`plaza_broker::Cluster`]), which puts
//! them in the room's one order. Every replica applies the log in that order
//! through the same [`RoomMachine`](crate::room::machine::RoomMachine) as
//! embedded mode; the room being deterministic (and the clock being the
//! log's), all replicas agree on every outcome — who holds a lock, which seq
//! a message got — and each delivers events to its own members. The node
//! that appended a record answers its client (ack, response, `joined`) when
//! it applies that record.

pub(crate) mod record;
mod replica;
pub(crate) mod snapshot;
mod webhook_sweep;

pub(crate) use replica::{spawn_replica, ReplicaSetup};
pub(crate) use snapshot::encode_state;

use bytes::Bytes;
use plaza_broker::ClusterError;

use crate::room::{Intent, RoomCommand, RoomHandle};

/// What a replica needs of the node hosting it: implemented by the node's
/// room directory, so that replicas do not depend on it.
pub(crate) trait Hosting: Send + Sync + 'static {
    /// The replica of room `id` behind `handle` ended: forget it, unless a
    /// newer replica took its place.
    fn forget(&self, id: &str, handle: &RoomHandle);
    /// A join reached a replica as it stopped hosting: hand it to the room's
    /// next replica (refusing it if there is none).
    fn rejoin(self: std::sync::Arc<Self>, id: String, join: RoomCommand);
}

/// The record that deletes a room, appended by `node`.
pub(crate) fn close_record(node: &str) -> Bytes {
    record::LogRecord {
        node: node.to_owned(),
        conn: 0,
        req: 0,
        intent: Intent::Close,
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
