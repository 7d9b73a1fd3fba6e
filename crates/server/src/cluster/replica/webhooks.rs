//! A replica's part in durable webhooks (cluster mode with Redis): every
//! replica of a room queues the webhook events of the entries it applies, by
//! log position, and the broker keeps each once (a cursor per room). So an
//! event is queued although the node that appended its entry died right
//! after: another replica, or the next node to host the room, queues it.
//!
//! One writer task per replica writes in order: a snapshot at position `n`
//! is stored only after the events of every entry up to `n` are queued, so
//! that no snapshot skips an entry whose events were never queued.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use plaza_broker::{Cluster, WebhookRecord};
use tokio::sync::mpsc;

use crate::webhooks::Webhooks;

/// What a replica hands its writer.
pub(super) enum Write {
    /// The events of the entries up to `upto` (those without events
    /// included): queue them, move the room's cursor.
    Events {
        upto: u64,
        records: Vec<WebhookRecord>,
    },
    /// Store this snapshot, after everything handed before.
    Snapshot { n: u64, bytes: Bytes },
}

/// Tries of one write while the broker is unreachable (about a minute).
const TRIES: u32 = 120;
/// The wait between tries.
const RETRY: Duration = Duration::from_millis(500);
/// Writes taken together into one call at most.
const BATCH: usize = 256;

/// Starts the writer of room `room`'s replica; it ends once the replica
/// drops the sender and everything handed to it is written.
pub(super) fn spawn_writer(
    room: String,
    cluster: Arc<dyn Cluster>,
    hooks: Arc<Webhooks>,
) -> mpsc::UnboundedSender<Write> {
    let (tx, mut rx) = mpsc::unbounded_channel::<Write>();
    tokio::spawn(async move {
        while let Some(first) = rx.recv().await {
            let mut writes = vec![first];
            while writes.len() < BATCH {
                match rx.try_recv() {
                    Ok(w) => writes.push(w),
                    Err(_) => break,
                }
            }
            let (mut upto, mut records) = (0, Vec::new());
            for w in writes {
                match w {
                    Write::Events {
                        upto: u,
                        records: r,
                    } => {
                        upto = upto.max(u);
                        records.extend(r);
                    }
                    Write::Snapshot { n, bytes } => {
                        let queued = queue(&room, &*cluster, &hooks, upto, &records).await;
                        (upto, records) = (0, Vec::new());
                        if !queued {
                            // A snapshot past events never queued would skip them.
                            continue;
                        }
                        if let Err(e) = cluster.store_snapshot(&room, n, bytes).await {
                            tracing::warn!(%room, n, error = %e, "snapshot not stored");
                        }
                    }
                }
            }
            queue(&room, &*cluster, &hooks, upto, &records).await;
        }
    });
    tx
}

/// Queues `records` and moves the cursor to `upto`, trying while the broker
/// is unreachable; false when it never answered (no snapshot may follow).
async fn queue(
    room: &str,
    cluster: &dyn Cluster,
    hooks: &Webhooks,
    upto: u64,
    records: &[WebhookRecord],
) -> bool {
    if upto == 0 && records.is_empty() {
        return true;
    }
    let Some(streams) = cluster.webhook_streams() else {
        return true;
    };
    for attempt in 1..=TRIES {
        match streams.enqueue(room, upto, records).await {
            Ok(dropped) => {
                hooks.dropped(&dropped);
                return true;
            }
            Err(e) if attempt == TRIES => {
                tracing::error!(%room, upto, events = records.len(), error = %e,
                    "webhook events not queued: the next replica of the room queues them");
            }
            Err(e) => {
                tracing::debug!(%room, error = %e, "webhook events not queued yet");
                tokio::time::sleep(RETRY).await;
            }
        }
    }
    false
}
