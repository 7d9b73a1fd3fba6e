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
//! - `drop_log`: the rate-limited warning about dropped events;
//! - `metrics`: a target's metric handles.

mod dispatcher;
mod drop_log;
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

/// The webhook targets of a node, shared by everything that emits events.
pub struct Webhooks {
    targets: Vec<Arc<Target>>,
    /// Every type some target wants, one bit each.
    any_wants: u16,
    /// Stops the dispatchers when the node lets go of this.
    stop: CancellationToken,
}

impl Webhooks {
    /// The targets of `targets`, each with its dispatcher task (so this must
    /// run inside a tokio runtime), registering their metrics in `metrics`.
    /// `None` when there is no target. A target that fails
    /// [`ServerConfig::check_bounds`](crate::ServerConfig::check_bounds)
    /// (which `plaza serve` runs first) is left out, with an error logged.
    pub fn new(targets: &[WebhookTarget], metrics: &NodeMetrics) -> Option<Arc<Webhooks>> {
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
                let t = Arc::new(Target::new(s, m));
                dispatcher::spawn(t.clone(), stop.clone());
                t
            })
            .collect();
        let any_wants = targets.iter().fold(0, |acc, t| acc | t.settings.events);
        Some(Arc::new(Webhooks {
            targets,
            any_wants,
            stop,
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
        let prepared = Arc::new(Prepared {
            body: event.body(),
            id: event.id,
            room: event.room,
            emitted: Instant::now(),
        });
        for t in &self.targets {
            if t.settings.wants(event.kind, event.channel.as_deref()) {
                t.push(&prepared);
            }
        }
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
