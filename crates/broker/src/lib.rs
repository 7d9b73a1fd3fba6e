//! The seams between a Plaza node and whatever it shares with other nodes.
//!
//! Two seams: [`TicketStore`] keeps single-use join tickets; [`Cluster`] is
//! the broker proper (the room registry, each room's shared log and
//! snapshots, subscriptions, node liveness). Embedded mode needs only a
//! [`MemoryTicketStore`]: everything else lives in the node's process.
//! Cluster mode puts both in front of Redis ([`RedisBroker`]), so that any
//! node can redeem any ticket and every room's log is shared. [`MemoryCluster`] runs several nodes of a cluster in
//! one process, for tests. Code above this crate only ever talks to
//! `dyn TicketStore` and `dyn Cluster`.

#![warn(missing_docs)]

mod cluster;
mod disk;
mod ids;
mod memory_cluster;
mod memory_tickets;
mod redis;
mod webhook_streams;

pub use self::redis::{
    BrokerAck, RedisBroker, RedisConfig, CLUSTER_SCHEME, MAX_ACK_REPLICAS, SENTINEL_SCHEME,
};
pub use cluster::{
    AppendFuture, Cluster, ClusterError, LogEntry, LogListener, LogNotice, LogPosition,
    RoomListing, SnapshotFormat, NODE_HEARTBEAT_MS, NODE_TTL_MS,
};
pub use disk::{store_counts, store_size, DiskBroker, Fsync, LOCK_FILE, STORE_FILE};
pub use ids::{is_resume_token, new_epoch, new_resume_token, new_session_id, new_ticket_token};
pub use memory_cluster::{MemoryCluster, DEFAULT_LOG_CAPACITY};
pub use memory_tickets::MemoryTicketStore;
pub use webhook_streams::{QueuedWebhook, WebhookRecord, WebhookStreams};

use async_trait::async_trait;
pub use plaza_core::RoomError;
use plaza_core::{Millis, TicketGrant};

/// A ticket as handed to a client.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IssuedTicket {
    /// The unguessable token (192 random bits, URL-safe base64).
    pub ticket: String,
    /// End of its life, Unix milliseconds.
    pub expires_at: Millis,
}

/// Where single-use join tickets are kept. Implementations must be cheap to
/// call concurrently.
#[async_trait]
pub trait TicketStore: Send + Sync + 'static {
    /// A short name for logs and `/readyz`, e.g. `memory`.
    fn kind(&self) -> &'static str;

    /// Stores a single-use ticket for `grant`, valid for `ttl_ms` from `now`.
    async fn issue_ticket(
        &self,
        grant: TicketGrant,
        ttl_ms: Millis,
        now: Millis,
    ) -> Result<IssuedTicket, RoomError>;

    /// Redeems a ticket once; fails with `ticket_invalid`, `ticket_expired` or `ticket_used`.
    async fn redeem_ticket(&self, ticket: &str, now: Millis) -> Result<TicketGrant, RoomError>;

    /// Whether the broker can serve requests now (for `/readyz`).
    async fn ready(&self) -> bool;
}
