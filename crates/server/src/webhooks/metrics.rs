//! The metric handles of one target (label `target` = its name), registered
//! by [`NodeMetrics::webhook_target`](crate::metrics::NodeMetrics::webhook_target).

use metrics::{Counter, Gauge, Histogram};

/// `plaza_webhook_*{target="<name>"}`.
#[derive(Clone)]
pub(crate) struct TargetMetrics {
    /// Events answered 2xx.
    pub(crate) delivered: Counter,
    /// Attempts after a failed one.
    pub(crate) retries: Counter,
    /// Events given up after `retry_for_ms`.
    pub(crate) failed: Counter,
    /// Records of the durable queue taken over from a reader that read them
    /// and did not acknowledge them (its node died, say): each may be a
    /// second delivery.
    pub(crate) redelivered: Counter,
    /// Events dropped because the queue held `queue_max`.
    pub(crate) dropped: Counter,
    /// Events queued or being delivered.
    pub(crate) queue_depth: Gauge,
    /// From emit to the 2xx, seconds.
    pub(crate) delivery_seconds: Histogram,
}

/// The buckets of `plaza_webhook_delivery_seconds`: a fast receiver
/// answers in milliseconds, retries take seconds to an hour.
pub(crate) const DELIVERY_BUCKETS: [f64; 14] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0, 60.0, 300.0, 3600.0, 86400.0,
];
