//! Durable webhook queues in the data directory: the same contract as Redis
//! streams ([`WebhookStreams`]), so that embedded mode with `data_dir`
//! delivers every event of a room at least once, in order, across a
//! restart or `kill -9`. One process owns the directory, so it always holds
//! every target's lease; what it read and did not acknowledge before it
//! died is simply unread after the restart.

use std::collections::{BTreeMap, VecDeque};

use async_trait::async_trait;
use tokio::sync::oneshot;

use super::{unavailable, DiskBroker, Write};
use crate::{ClusterError, QueuedWebhook, WebhookRecord, WebhookStreams};

/// One target's queue: records in the store, in their order.
#[derive(Debug, Default)]
pub(super) struct WebhookQueue {
    /// The number the next record gets (its stream id).
    pub(super) next: u64,
    /// Committed, not handed to the reader yet.
    pub(super) unread: VecDeque<(u64, QueuedWebhook)>,
    /// Handed to the reader, not acknowledged yet.
    pub(super) reading: BTreeMap<u64, QueuedWebhook>,
}

impl WebhookQueue {
    fn len(&self) -> usize {
        self.unread.len() + self.reading.len()
    }
}

/// A record to write: its target and number.
#[derive(Debug)]
pub(super) struct NewWebhook {
    pub(super) target: String,
    pub(super) seq: u64,
    pub(super) record: QueuedWebhook,
}

fn seq_of(stream_id: &str) -> Option<u64> {
    stream_id.parse().ok()
}

async fn committed(
    answer: oneshot::Receiver<Result<(), ClusterError>>,
) -> Result<(), ClusterError> {
    answer
        .await
        .unwrap_or_else(|_| Err(unavailable("the writer stopped")))
}

#[async_trait]
impl WebhookStreams for DiskBroker {
    async fn enqueue(
        &self,
        room: &str,
        upto: u64,
        records: &[WebhookRecord],
    ) -> Result<Vec<String>, ClusterError> {
        let mut dropped = Vec::new();
        let mut new = Vec::new();
        let (done, answer) = oneshot::channel();
        {
            let mut st = self.state()?;
            // A deleted room's records are enqueued only when they belong
            // to no log position (its deletion), as with Redis.
            let cursor = st.rooms.get(room).map(|r| r.webhook_cursor);
            for r in records {
                let wanted = r.position == 0 || cursor.is_some_and(|c| r.position > c);
                if !wanted {
                    continue;
                }
                let queue = st.webhooks.entry(r.target.clone()).or_default();
                if queue.len() as u64 >= r.max {
                    dropped.push(r.target.clone());
                    continue;
                }
                queue.next += 1;
                new.push(NewWebhook {
                    target: r.target.clone(),
                    seq: queue.next,
                    record: QueuedWebhook {
                        stream_id: queue.next.to_string(),
                        id: r.id.clone(),
                        room: r.room.clone(),
                        body: r.body.clone(),
                        ts: r.ts,
                    },
                });
            }
            let cursor = cursor.filter(|c| upto > *c).map(|_| upto);
            if new.is_empty() && cursor.is_none() {
                return Ok(dropped);
            }
            // Under the state's lock: records reach the queue in the order
            // of their numbers.
            self.send(Write::Webhooks {
                room: room.to_owned(),
                cursor,
                records: new,
                done,
            })?;
        }
        committed(answer).await?;
        Ok(dropped)
    }

    async fn lease(&self, _target: &str, _ttl_ms: u64) -> Result<bool, ClusterError> {
        // The directory's lock file keeps every other process out.
        self.state().map(|_| true)
    }

    async fn claim(
        &self,
        target: &str,
        cursor: &str,
        count: usize,
    ) -> Result<(Vec<QueuedWebhook>, String), ClusterError> {
        let st = self.state()?;
        let after = seq_of(cursor).unwrap_or(0);
        let Some(queue) = st.webhooks.get(target) else {
            return Ok((Vec::new(), "0-0".to_owned()));
        };
        let taken: Vec<_> = queue
            .reading
            .range(after + 1..)
            .take(count.max(1))
            .map(|(_, r)| r.clone())
            .collect();
        let next = match taken.last() {
            Some(last) if taken.len() == count.max(1) => last.stream_id.clone(),
            _ => "0-0".to_owned(),
        };
        Ok((taken, next))
    }

    async fn read(&self, target: &str, count: usize) -> Result<Vec<QueuedWebhook>, ClusterError> {
        let mut st = self.state()?;
        let Some(queue) = st.webhooks.get_mut(target) else {
            return Ok(Vec::new());
        };
        let mut out = Vec::new();
        while out.len() < count.max(1) {
            let Some((seq, record)) = queue.unread.pop_front() else {
                break;
            };
            out.push(record.clone());
            queue.reading.insert(seq, record);
        }
        Ok(out)
    }

    async fn ack(&self, target: &str, stream_ids: &[String]) -> Result<(), ClusterError> {
        let seqs: Vec<u64> = stream_ids.iter().filter_map(|s| seq_of(s)).collect();
        if seqs.is_empty() {
            return Ok(());
        }
        let (done, answer) = oneshot::channel();
        {
            let mut st = self.state()?;
            if let Some(queue) = st.webhooks.get_mut(target) {
                for seq in &seqs {
                    queue.reading.remove(seq);
                }
            }
        }
        self.send(Write::WebhookAck {
            target: target.to_owned(),
            seqs,
            done,
        })?;
        committed(answer).await
    }

    async fn depth(&self, target: &str) -> Result<u64, ClusterError> {
        Ok(self
            .state()?
            .webhooks
            .get(target)
            .map_or(0, |q| q.len() as u64))
    }

    async fn lagging_rooms(&self) -> Result<Vec<(String, u64, u64)>, ClusterError> {
        let st = self.state()?;
        Ok(st
            .rooms
            .iter()
            .filter_map(|(id, r)| {
                let n = r.log.back().map_or(r.snapshot.0, |e| e.n);
                (n > r.webhook_cursor).then(|| (id.clone(), n, r.webhook_cursor))
            })
            .collect())
    }
}
