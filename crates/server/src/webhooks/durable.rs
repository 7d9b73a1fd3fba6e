//! Cluster mode's durable queues: each target's events live in the broker
//! (a stream per target), so that no node's death loses one. One node at a
//! time reads a target's stream (it holds the target's lease); it takes over
//! what a dead reader read and did not acknowledge, hands the records to the
//! target's dispatcher, and acknowledges each once it is delivered or given
//! up.

use std::sync::Arc;
use std::time::{Duration, Instant};

use plaza_broker::{Cluster, QueuedWebhook};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::dispatcher::{Prepared, Target};

/// How long a reader's lease lasts unless renewed.
const LEASE_MS: u64 = 5_000;
/// How often the lease is renewed, and a node without it tries to take it.
const LEASE_EVERY: Duration = Duration::from_millis(1_000);
/// Records read ahead of delivery at most.
const READ_AHEAD: usize = 2_048;
/// Records asked for per read.
const READ_BATCH: usize = 256;
/// The wait before reading again when the stream had nothing new.
const IDLE_POLL: Duration = Duration::from_millis(20);

/// Runs the reader of `target`'s durable queue until `cancel`.
pub(crate) fn spawn_reader(
    target: Arc<Target>,
    cluster: Arc<dyn Cluster>,
    cancel: CancellationToken,
) {
    let (acks_tx, acks) = mpsc::unbounded_channel();
    let _ = target.acks.set(acks_tx);
    tokio::spawn(async move {
        let mut reader = Reader {
            target,
            cluster,
            acks,
            leased_until: None,
            claimed: false,
        };
        tokio::select! {
            () = reader.run() => {}
            () = cancel.cancelled() => {}
        }
    });
}

struct Reader {
    target: Arc<Target>,
    cluster: Arc<dyn Cluster>,
    acks: mpsc::UnboundedReceiver<String>,
    /// Until when this node holds the lease (renewed well before).
    leased_until: Option<Instant>,
    /// Whether what earlier readers left unacknowledged was taken over
    /// since the lease was taken.
    claimed: bool,
}

impl Reader {
    async fn run(&mut self) {
        let name = self.target.settings.name.clone();
        let mut renew_at = Instant::now();
        let cluster = self.cluster.clone();
        let Some(streams) = cluster.webhook_streams() else {
            return;
        };
        loop {
            self.flush_acks(&name).await;
            if Instant::now() >= renew_at {
                renew_at = Instant::now() + LEASE_EVERY;
                match streams.lease(&name, LEASE_MS).await {
                    Ok(true) => {
                        if self.leased_until.is_none() {
                            self.claimed = false;
                        }
                        self.leased_until = Some(Instant::now() + Duration::from_millis(LEASE_MS));
                    }
                    Ok(false) => self.leased_until = None,
                    Err(e) => {
                        tracing::debug!(target_name = %name, error = %e, "webhook lease not renewed");
                    }
                }
                if let Ok(depth) = streams.depth(&name).await {
                    self.target.metrics().queue_depth.set(depth as f64);
                }
            }
            let leased = self.leased_until.is_some_and(|t| Instant::now() < t);
            if !leased {
                self.leased_until = None;
                tokio::time::sleep(LEASE_EVERY / 2).await;
                continue;
            }
            if self.target.in_memory() >= READ_AHEAD {
                self.wait_for_acks().await;
                continue;
            }
            if !self.claimed {
                match self.claim_all(&name).await {
                    Ok(()) => self.claimed = true,
                    Err(e) => {
                        tracing::debug!(target_name = %name, error = %e, "webhook claim failed");
                        tokio::time::sleep(LEASE_EVERY / 2).await;
                        continue;
                    }
                }
            }
            match streams.read(&name, READ_BATCH).await {
                Ok(records) if records.is_empty() => self.wait_for_acks_or(IDLE_POLL).await,
                Ok(records) => self.hand_over(records, false),
                Err(e) => {
                    tracing::debug!(target_name = %name, error = %e, "webhook read failed");
                    tokio::time::sleep(LEASE_EVERY / 2).await;
                }
            }
        }
    }

    /// Takes over every record read before and not acknowledged.
    async fn claim_all(&mut self, name: &str) -> Result<(), plaza_broker::ClusterError> {
        let cluster = self.cluster.clone();
        let streams = cluster.webhook_streams().expect("checked by the caller");
        let mut cursor = "0-0".to_owned();
        loop {
            let (records, next) = streams.claim(name, &cursor, READ_BATCH).await?;
            self.hand_over(records, true);
            if next == "0-0" {
                return Ok(());
            }
            cursor = next;
        }
    }

    fn hand_over(&self, records: Vec<QueuedWebhook>, claimed: bool) {
        let now_ms = crate::clock::now_ms();
        for r in records {
            if claimed {
                self.target.metrics().redelivered.increment(1);
            }
            let age = Duration::from_millis(now_ms.saturating_sub(r.ts));
            let emitted = Instant::now().checked_sub(age).unwrap_or_else(Instant::now);
            self.target.push(&Arc::new(Prepared {
                id: r.id,
                room: r.room,
                body: r.body,
                emitted,
                stream_id: Some(r.stream_id),
            }));
        }
    }

    async fn wait_for_acks(&mut self) {
        self.wait_for_acks_or(LEASE_EVERY / 4).await;
    }

    async fn wait_for_acks_or(&mut self, wait: Duration) {
        tokio::select! {
            Some(id) = self.acks.recv() => {
                let name = self.target.settings.name.clone();
                self.ack(&name, vec![id]).await;
            }
            () = tokio::time::sleep(wait) => {}
        }
    }

    async fn flush_acks(&mut self, name: &str) {
        let mut ids = Vec::new();
        while let Ok(id) = self.acks.try_recv() {
            ids.push(id);
        }
        self.ack(name, ids).await;
    }

    /// Acknowledges `ids`, with everything else already acknowledged; tried
    /// until the broker takes them (an unacknowledged record is sent again
    /// by the next reader: at least once).
    async fn ack(&mut self, name: &str, mut ids: Vec<String>) {
        while let Ok(id) = self.acks.try_recv() {
            ids.push(id);
        }
        if ids.is_empty() {
            return;
        }
        let Some(streams) = self.cluster.webhook_streams() else {
            return;
        };
        if let Err(e) = streams.ack(name, &ids).await {
            tracing::debug!(target_name = %name, error = %e, "webhook acks not written");
        }
    }
}
