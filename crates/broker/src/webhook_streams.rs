//! Durable webhook queues: one stream per webhook target in the broker, fed
//! by every replica of a room (idempotently, by log position) and read by
//! one node at a time per target, which acknowledges what it delivered. A
//! node's death loses nothing: what it appended is enqueued by another
//! replica, and what it read but did not acknowledge is claimed by the next
//! reader.

use async_trait::async_trait;
use bytes::Bytes;

use crate::ClusterError;

/// One webhook event to enqueue for one target.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WebhookRecord {
    /// The log position of the entry that caused it; 0 for events outside
    /// any room's log (a room created or deleted), always enqueued.
    pub position: u64,
    /// The target's name (its stream).
    pub target: String,
    /// The target's `queue_max`: at that length the record is dropped.
    pub max: u64,
    /// The event's id (`webhook-id`).
    pub id: String,
    /// The room.
    pub room: String,
    /// The body to POST.
    pub body: Bytes,
    /// When the event happened, Unix ms.
    pub ts: u64,
}

/// One record read back from a target's stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueuedWebhook {
    /// Its id in the stream, to acknowledge it by.
    pub stream_id: String,
    /// The event's id.
    pub id: String,
    /// The room.
    pub room: String,
    /// The body to POST.
    pub body: Bytes,
    /// When the event happened, Unix ms.
    pub ts: u64,
}

/// The broker's side of durable webhook queues.
#[async_trait]
pub trait WebhookStreams: Send + Sync {
    /// Enqueues `records` of room `room` whose position is past the room's
    /// webhook cursor (or 0), then moves the cursor to `upto`: every replica
    /// of a room may call this for the same entries, each is enqueued once.
    /// Returns the targets of the records dropped at their `max`.
    async fn enqueue(
        &self,
        room: &str,
        upto: u64,
        records: &[WebhookRecord],
    ) -> Result<Vec<String>, ClusterError>;

    /// Takes or renews this node's lease on reading `target`'s stream, for
    /// `ttl_ms`; false when another node holds it.
    async fn lease(&self, target: &str, ttl_ms: u64) -> Result<bool, ClusterError>;

    /// Takes over up to `count` records read but not acknowledged (by any
    /// reader, a dead one included), starting after `cursor` ("0-0" first);
    /// returns them and the cursor to go on from ("0-0" when done).
    async fn claim(
        &self,
        target: &str,
        cursor: &str,
        count: usize,
    ) -> Result<(Vec<QueuedWebhook>, String), ClusterError>;

    /// Up to `count` records no reader has had yet.
    async fn read(&self, target: &str, count: usize) -> Result<Vec<QueuedWebhook>, ClusterError>;

    /// Acknowledges and removes delivered (or given up) records.
    async fn ack(&self, target: &str, stream_ids: &[String]) -> Result<(), ClusterError>;

    /// Records in `target`'s stream (queued or being delivered).
    async fn depth(&self, target: &str) -> Result<u64, ClusterError>;

    /// Rooms whose log has entries past their webhook cursor, with their
    /// log position and cursor.
    async fn lagging_rooms(&self) -> Result<Vec<(String, u64, u64)>, ClusterError>;
}
