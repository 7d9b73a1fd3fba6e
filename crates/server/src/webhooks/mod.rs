//! Webhooks: events POSTed to the application's backend, signed per the
//! Standard Webhooks specification (docs/protocol.md, "Webhooks").
//!
//! The node builds one [`Webhooks`] from `config.webhooks` (`None` without
//! targets, so callers skip all work) and calls [`Webhooks::emit`] where
//! events happen. Emitting never waits: the event's body is serialized once
//! and pushed onto the bounded queue of each target that wants it. Each
//! target has a dispatcher task that delivers events at least once, in order
//! per room, rooms in parallel.
//!
//! The parts, one idea each:
//! - `target`: the `[[webhooks]]` configuration and its checks;
//! - `event`: the event types, the event, the body;
//! - `signature`: `whsec_` secrets and `v1,` signatures;
//! - `queue`: a target's in-memory queue, in order per room (the seam for
//!   a durable backend);
//! - `retry`: the backoff schedule;
//! - `dispatcher`: sending, retrying and counting;
//! - `durable`: cluster mode's queues in the broker, and their reader;
//! - `drop_log`: the rate-limited warning about dropped events;
//! - `metrics`: a target's metric handles.

mod dispatcher;
mod drop_log;
mod durable;
mod event;
pub(crate) mod metrics;
mod queue;
mod retry;
mod signature;
mod target;

use std::sync::Arc;
use std::time::Instant;

use tokio_util::sync::CancellationToken;

pub use event::{WebhookEvent, WebhookKind};
pub(crate) use target::check_targets;
pub use target::WebhookTarget;

use crate::metrics::NodeMetrics;
use dispatcher::{Prepared, Target};
use plaza_broker::WebhookRecord;

/// The webhook targets of a node, shared by everything that emits events.
pub struct Webhooks {
    targets: Vec<Arc<Target>>,
    /// Every type some target wants, one bit each.
    any_wants: u16,
    /// Stops the dispatchers when the node lets go of this.
    stop: CancellationToken,
    /// Cluster mode with a broker that keeps queues: events go there, not
    /// into this node's memory.
    durable: Option<Arc<dyn plaza_broker::Cluster>>,
}

impl Webhooks {
    /// The targets of `targets`, each with its dispatcher task (so this must
    /// run inside a tokio runtime), registering their metrics in `metrics`.
    /// `None` when there is no target. A target that fails
    /// [`ServerConfig::check_bounds`](crate::ServerConfig::check_bounds)
    /// (which `plaza serve` runs first) is left out, with an error logged.
    pub fn new(targets: &[WebhookTarget], metrics: &NodeMetrics) -> Option<Arc<Webhooks>> {
        Webhooks::build(targets, metrics, None)
    }

    /// Like [`Webhooks::new`], for a node of `cluster`: when its broker
    /// keeps webhook queues (Redis), events are queued there and read by one
    /// node per target, so that no node's death loses one.
    pub fn clustered(
        targets: &[WebhookTarget],
        metrics: &NodeMetrics,
        cluster: Arc<dyn plaza_broker::Cluster>,
    ) -> Option<Arc<Webhooks>> {
        let durable = cluster.webhook_streams().is_some().then_some(cluster);
        Webhooks::build(targets, metrics, durable)
    }

    fn build(
        targets: &[WebhookTarget],
        metrics: &NodeMetrics,
        durable: Option<Arc<dyn plaza_broker::Cluster>>,
    ) -> Option<Arc<Webhooks>> {
        if targets.is_empty() {
            return None;
        }
        let settings = match check_targets(targets) {
            Ok(s) => s,
            Err(e) => {
                tracing::error!(error = %e, "webhook configuration refused: no webhook is sent");
                return None;
            }
        };
        let stop = CancellationToken::new();
        let targets: Vec<Arc<Target>> = settings
            .into_iter()
            .map(|s| {
                let m = metrics.webhook_target(&s.name);
                let t = Arc::new(Target::new(s, m, durable.is_some()));
                dispatcher::spawn(t.clone(), stop.clone());
                if let Some(cluster) = &durable {
                    durable::spawn_reader(t.clone(), cluster.clone(), stop.clone());
                }
                t
            })
            .collect();
        let any_wants = targets.iter().fold(0, |acc, t| acc | t.settings.events);
        Some(Arc::new(Webhooks {
            targets,
            any_wants,
            stop,
            durable,
        }))
    }

    /// Whether any target wants an event of type `kind` (in `channel`, for
    /// `message.published`): cheap, to skip building events nobody wants.
    pub fn wants(&self, kind: WebhookKind, channel: Option<&str>) -> bool {
        self.any_wants & kind.bit() != 0
            && self.targets.iter().any(|t| t.settings.wants(kind, channel))
    }

    /// Queues `event` for every target that wants it. Never blocks, never
    /// awaits: at a target's `queue_max` the event is dropped for that
    /// target (and counted in `plaza_webhook_dropped_total`).
    pub fn emit(&self, event: WebhookEvent) {
        if !self.wants(event.kind, event.channel.as_deref()) {
            return;
        }
        if let Some(cluster) = &self.durable {
            // Outside any room's log (a room created or deleted): queued at
            // once, from here, with a few tries.
            let records = self.records(&event, 0);
            let (cluster, room) = (cluster.clone(), event.room.clone());
            let targets = self.targets.clone();
            tokio::spawn(async move {
                let Some(streams) = cluster.webhook_streams() else {
                    return;
                };
                for attempt in 0..5u32 {
                    match streams.enqueue(&room, 0, &records).await {
                        Ok(dropped) => return count_dropped(&targets, &dropped),
                        Err(e) => {
                            tracing::warn!(%room, error = %e, attempt, "webhook not queued yet");
                            tokio::time::sleep(std::time::Duration::from_millis(200 << attempt))
                                .await;
                        }
                    }
                }
            });
            return;
        }
        let prepared = Arc::new(Prepared {
            body: event.body(),
            id: event.id,
            room: event.room,
            emitted: Instant::now(),
            stream_id: None,
        });
        for t in &self.targets {
            if t.settings.wants(event.kind, event.channel.as_deref()) {
                t.push(&prepared);
            }
        }
    }
}

impl Webhooks {
    /// Whether events go to the broker's queues (cluster mode with Redis):
    /// a room's replicas then queue its events by log position.
    pub(crate) fn is_durable(&self) -> bool {
        self.durable.is_some()
    }

    /// `event` as a record for each target that wants it, caused by the
    /// log entry at `position` (0: outside any log).
    pub(crate) fn records(&self, event: &WebhookEvent, position: u64) -> Vec<WebhookRecord> {
        let body = event.body();
        self.targets
            .iter()
            .filter(|t| t.settings.wants(event.kind, event.channel.as_deref()))
            .map(|t| WebhookRecord {
                position,
                target: t.settings.name.clone(),
                max: t.settings.queue_max as u64,
                id: event.id.clone(),
                room: event.room.clone(),
                body: body.clone(),
                ts: event.timestamp_ms,
            })
            .collect()
    }

    /// Counts records the broker dropped at their target's `queue_max`.
    pub(crate) fn dropped(&self, targets: &[String]) {
        count_dropped(&self.targets, targets);
    }
}

fn count_dropped(targets: &[Arc<Target>], names: &[String]) {
    for name in names {
        if let Some(t) = targets.iter().find(|t| t.settings.name == *name) {
            t.metrics().dropped.increment(1);
        }
    }
    if !names.is_empty() {
        tracing::warn!(dropped = names.len(), "webhook queue full: events dropped");
    }
}

impl Drop for Webhooks {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

impl std::fmt::Debug for Webhooks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let names: Vec<&str> = self
            .targets
            .iter()
            .map(|t| t.settings.name.as_str())
            .collect();
        f.debug_struct("Webhooks").field("targets", &names).finish()
    }
}
