//! What the nodes of a cluster share besides tickets: the room registry, every
//! room's ordered log with its snapshots, subscriptions to rooms, and which
//! nodes are alive.
//!
//! A room in cluster mode is a replicated state machine. Every change to a
//! room (a join, a publish, a lock request, a tick of the clock) is appended to
//! the room's shared log, which gives it its place in the room's one order and
//! its timestamp. Every node that has members in the room applies the log, in
//! that order, to its own replica of the room; since [`plaza_core::Room`] is
//! deterministic, all replicas agree on every outcome (who got the lock, which
//! seq a message has) without asking each other. A node that starts to host a
//! room loads the latest snapshot and reads the log from there.

use std::sync::Arc;

use async_trait::async_trait;
use bytes::Bytes;
use plaza_core::{Millis, RoomError};
use plaza_protocol::ErrorCode;

/// One entry of a room's shared log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogEntry {
    /// Position in the room's log: 1, 2, 3, … without gaps.
    pub n: u64,
    /// When the broker appended it, Unix milliseconds (the broker's clock, so
    /// every replica applies the entry at the same time).
    pub ts: Millis,
    /// What the node that appended it wrote; opaque to the broker.
    pub payload: Bytes,
}

/// Where an append landed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LogPosition {
    /// The entry's position.
    pub n: u64,
    /// The entry's timestamp.
    pub ts: Millis,
}

/// What a subscription reports to its listener.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LogNotice {
    /// A new entry, in log order (but entries can be missed: a listener that
    /// sees a gap reads the missing entries with [`Cluster::read`]).
    Entry(LogEntry),
    /// The subscription was re-established after the connection to the broker
    /// was lost: entries appended meanwhile were not delivered, so the listener
    /// reads them with [`Cluster::read`].
    Resubscribed,
}

/// The outcome of [`Cluster::append`], independent of the cluster's lifetime.
pub type AppendFuture =
    std::pin::Pin<Box<dyn std::future::Future<Output = Result<LogPosition, ClusterError>> + Send>>;

/// Receives a room's [`LogNotice`]s. Called on the broker's receiving task:
/// it must not block (hand the notice over with `try_send` and, when that
/// fails, remember to read the log later).
pub type LogListener = Arc<dyn Fn(LogNotice) + Send + Sync>;

/// Why a cluster operation failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ClusterError {
    /// The broker cannot be reached (or answered with an error); nothing is
    /// known to have been done.
    #[error("broker unavailable: {0}")]
    Unavailable(String),
    /// The room is not in the registry.
    #[error("no room {0:?}")]
    RoomNotFound(String),
    /// The log no longer holds the entries asked for: load a snapshot.
    #[error("the log of room {0:?} no longer reaches back that far")]
    Trimmed(String),
}

impl From<ClusterError> for RoomError {
    fn from(e: ClusterError) -> Self {
        let code = match &e {
            ClusterError::Unavailable(_) => ErrorCode::BrokerUnavailable,
            ClusterError::RoomNotFound(_) => ErrorCode::RoomNotFound,
            ClusterError::Trimmed(_) => ErrorCode::Internal,
        };
        RoomError::new(code, e.to_string())
    }
}

/// What [`Cluster::list_reachable_rooms`] could read.
#[derive(Debug, Clone, Default)]
pub struct RoomListing {
    /// Rooms with their metadata, in no particular order.
    pub rooms: Vec<(String, Bytes)>,
    /// False when some rooms could not be read (they are left out).
    pub complete: bool,
}

/// The shared side of cluster mode. Implementations: [`crate::MemoryCluster`]
/// (nodes in one process, for tests) and the Redis one.
#[async_trait]
pub trait Cluster: Send + Sync + 'static {
    /// This node's id, unique in the cluster.
    fn node_id(&self) -> &str;

    /// Adds a room to the registry with its metadata (opaque to the broker)
    /// and its initial snapshot (at log position 0). False if the id is taken.
    async fn create_room(
        &self,
        id: &str,
        meta: Bytes,
        snapshot: Bytes,
    ) -> Result<bool, ClusterError>;

    /// A room's metadata, `None` if there is no such room.
    async fn room_meta(&self, id: &str) -> Result<Option<Bytes>, ClusterError>;

    /// Every room with its metadata, in no particular order.
    async fn list_rooms(&self) -> Result<Vec<(String, Bytes)>, ClusterError>;

    /// The rooms that can be read now, and whether that is all of them: on
    /// a Redis Cluster, rooms (or parts of the registry) on a shard without
    /// a primary are left out rather than failing the whole listing. Other
    /// brokers list every room, or fail.
    async fn list_reachable_rooms(&self) -> Result<RoomListing, ClusterError> {
        Ok(RoomListing {
            rooms: self.list_rooms().await?,
            complete: true,
        })
    }

    /// Removes a room with its log and snapshot. False if there was none.
    async fn delete_room(&self, id: &str) -> Result<bool, ClusterError>;

    /// Records how many members room `id` has connected, as counted at log
    /// position `at`, so that nodes not hosting the room can tell. A count at
    /// an earlier position than the recorded one is ignored; so is an unknown
    /// room (it is not created).
    async fn set_room_members(&self, id: &str, members: u64, at: u64) -> Result<(), ClusterError>;

    /// The recorded member counts of rooms `ids`, in order (0 for a room
    /// with none recorded, or none at all).
    async fn room_members(&self, ids: &[String]) -> Result<Vec<u64>, ClusterError>;

    /// Appends to a room's log and notifies its subscribers, in one step.
    ///
    /// Not an `async fn` on purpose: the append is queued when this is
    /// *called*, and one node's appends to one room land in the order of the
    /// calls, so a client's messages keep their order even though the caller
    /// awaits the returned future elsewhere (it does not borrow `self`).
    /// Appends to different rooms have no order between them: on a Redis
    /// Cluster they may go to different servers.
    fn append(&self, room: &str, payload: Bytes) -> AppendFuture;

    /// Up to `limit` entries after position `after`, oldest first. Empty when
    /// nothing follows `after`; [`ClusterError::Trimmed`] when entry `after + 1`
    /// is gone but later ones exist.
    async fn read(
        &self,
        room: &str,
        after: u64,
        limit: usize,
    ) -> Result<Vec<LogEntry>, ClusterError>;

    /// Stores a snapshot of the room as of log position `n`, unless a snapshot
    /// at `n` or later is stored already.
    async fn store_snapshot(&self, room: &str, n: u64, snapshot: Bytes)
        -> Result<(), ClusterError>;

    /// The latest snapshot and its log position, `None` if the room has none.
    async fn load_snapshot(&self, room: &str) -> Result<Option<(u64, Bytes)>, ClusterError>;

    /// Starts delivering the room's new entries to `listener` (replacing an
    /// earlier listener of this room on this node). Returns once entries
    /// appended from now on will be delivered.
    async fn subscribe(&self, room: &str, listener: LogListener) -> Result<(), ClusterError>;

    /// Stops delivering the room's entries to this node.
    async fn unsubscribe(&self, room: &str);

    /// Sends `payload` to the control listener of every node (this one's
    /// too): calls that act on every node, such as the server API's
    /// messages to a user. At most once: a node not listening at that moment
    /// misses it.
    async fn publish_control(&self, payload: Bytes) -> Result<(), ClusterError>;

    /// Starts delivering control messages to `listener` (as
    /// [`LogNotice::Entry`] with position 0), replacing an earlier one.
    async fn subscribe_control(&self, listener: LogListener) -> Result<(), ClusterError>;

    /// How replicas write rooms' states into this broker's snapshots.
    fn snapshot_format(&self) -> SnapshotFormat {
        SnapshotFormat::Json
    }

    /// The broker's durable webhook queues, if it keeps them (Redis does;
    /// the in-process cluster does not: its nodes queue in memory).
    fn webhook_streams(&self) -> Option<&dyn crate::WebhookStreams> {
        None
    }

    /// For each node id, whether that node is alive (its heartbeat is fresh).
    async fn nodes_alive(&self, nodes: &[String]) -> Result<Vec<bool>, ClusterError>;

    /// This node leaves the cluster (graceful shutdown): its heartbeat stops
    /// and others may treat it as gone at once.
    async fn leave(&self);

    /// Whether the broker answers now (for `/readyz`).
    async fn ready(&self) -> bool;
}

/// How long a node's heartbeat stays fresh without renewal: a node that stopped
/// renewing for this long is dead to the others.
pub const NODE_TTL_MS: Millis = 5_000;
/// How often a node renews its heartbeat.
pub const NODE_HEARTBEAT_MS: Millis = 1_000;

/// How a room's state is encoded in its snapshots. Readers tell the two
/// apart by the first byte (`{` is JSON), so a store may hold both.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SnapshotFormat {
    /// JSON: what every Plaza version reads, so nodes of mixed versions can
    /// share a Redis during a rolling upgrade.
    Json,
    /// MessagePack with named fields: event frames are stored as bytes, so
    /// reading a snapshot copies them instead of unescaping JSON strings.
    /// Only for a broker whose snapshots this process alone reads (a data
    /// directory): a Plaza older than this format cannot read them.
    MessagePack,
}
