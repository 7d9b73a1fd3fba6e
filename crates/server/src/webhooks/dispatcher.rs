//! Delivery to one target: one task takes ready rooms' head events from the
//! target's queue (at most `max_in_flight` rooms at once) and spawns a
//! delivery for each, which POSTs it, signed, and retries it until it is
//! answered 2xx or `retry_for_ms` has passed since its first attempt; then
//! the room's next event may go.

use std::sync::{Arc, Mutex};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use reqwest::header::{CONTENT_TYPE, USER_AGENT};
use tokio::sync::{Notify, Semaphore};
use tokio_util::sync::CancellationToken;

use super::drop_log::DropLog;
use super::metrics::TargetMetrics;
use super::queue::RoomQueues;
use super::target::Settings;

/// The most of an answer's body read (and thrown away).
const MAX_ANSWER_READ: usize = 64 * 1024;

/// An event ready to send: its body serialized once, shared by every
/// target and every attempt.
#[derive(Debug)]
pub(crate) struct Prepared {
    pub(crate) id: String,
    pub(crate) room: String,
    pub(crate) body: Bytes,
    /// When it was emitted (for `plaza_webhook_delivery_seconds`).
    pub(crate) emitted: Instant,
    /// Its id in the target's durable queue (cluster mode), acknowledged
    /// once it is delivered or given up.
    pub(crate) stream_id: Option<String>,
}

/// One target: its settings, its queue and its metrics.
pub(crate) struct Target {
    pub(crate) settings: Settings,
    queue: Mutex<RoomQueues<Arc<Prepared>>>,
    /// Wakes the dispatcher: an event was queued, or a room is done.
    wake: Notify,
    metrics: TargetMetrics,
    drops: DropLog,
    client: reqwest::Client,
    /// Whether the broker keeps this target's queue (cluster mode): the
    /// in-memory queue then holds only what was read ahead of delivery, and
    /// the depth gauge shows the broker's queue.
    durable: bool,
    /// Where delivered records of the durable queue are acknowledged.
    pub(crate) acks: std::sync::OnceLock<tokio::sync::mpsc::UnboundedSender<String>>,
}

impl Target {
    pub(crate) fn new(settings: Settings, metrics: TargetMetrics, durable: bool) -> Target {
        let client = reqwest::Client::builder()
            // A redirect is a misconfigured target, not a delivery.
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .expect("an HTTP client without TLS builds");
        // A durable target's bound is the broker's queue; its reader reads
        // only a little ahead.
        let max = if durable {
            usize::MAX
        } else {
            settings.queue_max
        };
        Target {
            durable,
            acks: std::sync::OnceLock::new(),
            queue: Mutex::new(RoomQueues::new(max)),
            settings,
            wake: Notify::new(),
            metrics,
            drops: DropLog::default(),
            client,
        }
    }

    /// Queues `event` (never waits); at `queue_max` it is dropped and counted.
    pub(crate) fn push(&self, event: &Arc<Prepared>) {
        let queued = {
            let mut queue = self.queue.lock().unwrap_or_else(|p| p.into_inner());
            let queued = queue.push(&event.room, event.clone());
            // Under the lock, so that the gauge's last value is the queue's.
            if !self.durable {
                self.metrics.queue_depth.set(queue.len() as f64);
            }
            queued
        };
        if queued {
            self.wake.notify_one();
            return;
        }
        self.metrics.dropped.increment(1);
        if let Some(n) = self.drops.dropped(crate::clock::now_ms()) {
            tracing::warn!(
                target_name = %self.settings.name,
                dropped = n,
                queue_max = self.settings.queue_max,
                "webhook queue full: events dropped"
            );
        }
    }

    /// Events in the in-memory queue (read ahead, for a durable target).
    pub(crate) fn in_memory(&self) -> usize {
        self.queue.lock().unwrap_or_else(|p| p.into_inner()).len()
    }

    pub(crate) fn metrics(&self) -> &TargetMetrics {
        &self.metrics
    }

    fn take(&self) -> Option<(String, Arc<Prepared>)> {
        self.queue.lock().unwrap_or_else(|p| p.into_inner()).take()
    }

    fn done(&self, room: &str) {
        {
            let mut queue = self.queue.lock().unwrap_or_else(|p| p.into_inner());
            queue.done(room);
            if !self.durable {
                self.metrics.queue_depth.set(queue.len() as f64);
            }
        }
        self.wake.notify_one();
    }

    /// One attempt: Ok on a 2xx answer, else what went wrong.
    async fn attempt(&self, event: &Prepared) -> Result<(), String> {
        let timestamp = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0);
        let signature = self.settings.secret.sign(&event.id, timestamp, &event.body);
        let mut answer = self
            .client
            .post(self.settings.url.clone())
            .timeout(self.settings.timeout)
            .header(CONTENT_TYPE, "application/json")
            .header(USER_AGENT, concat!("plaza/", env!("CARGO_PKG_VERSION")))
            .header("webhook-id", &event.id)
            .header("webhook-timestamp", timestamp.to_string())
            .header("webhook-signature", signature)
            .body(event.body.clone())
            .send()
            .await
            .map_err(|e| e.to_string())?;
        let status = answer.status();
        // A short answer is read to its end, so that the connection is
        // kept for the next event (within the attempt's timeout).
        let mut left = MAX_ANSWER_READ;
        while let Ok(Some(chunk)) = answer.chunk().await {
            left = left.saturating_sub(chunk.len());
            if left == 0 {
                break;
            }
        }
        if status.is_success() {
            Ok(())
        } else {
            Err(format!("answered {status}"))
        }
    }

    /// Sends `event` until it is delivered or given up; false when
    /// cancelled meanwhile.
    async fn deliver(&self, event: &Prepared, cancel: &CancellationToken) -> bool {
        let first = Instant::now();
        let mut failures = 0u32;
        loop {
            let outcome = tokio::select! {
                o = self.attempt(event) => o,
                () = cancel.cancelled() => return false,
            };
            let error = match outcome {
                Ok(()) => {
                    self.metrics.delivered.increment(1);
                    self.metrics
                        .delivery_seconds
                        .record(event.emitted.elapsed().as_secs_f64());
                    return true;
                }
                Err(e) => e,
            };
            failures += 1;
            let Some(delay) =
                self.settings
                    .retry
                    .next_delay(failures, first.elapsed(), fastrand::f64())
            else {
                self.metrics.failed.increment(1);
                tracing::warn!(
                    target_name = %self.settings.name,
                    id = %event.id,
                    room = %event.room,
                    attempts = failures,
                    %error,
                    "webhook event given up after retry_for_ms"
                );
                return true;
            };
            tracing::debug!(target_name = %self.settings.name, id = %event.id, %error, ?delay, "webhook attempt failed");
            tokio::select! {
                () = tokio::time::sleep(delay) => {}
                () = cancel.cancelled() => return false,
            }
            self.metrics.retries.increment(1);
        }
    }
}

/// Runs `target`'s deliveries until `cancel`.
pub(crate) fn spawn(target: Arc<Target>, cancel: CancellationToken) {
    tokio::spawn(async move {
        let rooms = Arc::new(Semaphore::new(target.settings.max_in_flight));
        loop {
            let permit = tokio::select! {
                p = rooms.clone().acquire_owned() => p.expect("the semaphore stays open"),
                () = cancel.cancelled() => return,
            };
            let (room, event) = loop {
                if let Some(next) = target.take() {
                    break next;
                }
                tokio::select! {
                    () = target.wake.notified() => {}
                    () = cancel.cancelled() => return,
                }
            };
            let target = target.clone();
            let cancel = cancel.clone();
            tokio::spawn(async move {
                if target.deliver(&event, &cancel).await {
                    if let (Some(id), Some(acks)) = (&event.stream_id, target.acks.get()) {
                        let _ = acks.send(id.clone());
                    }
                    target.done(&room);
                }
                drop(permit);
            });
        }
    });
}
