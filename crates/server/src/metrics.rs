//! The node's Prometheus metrics.
//!
//! Each node has its own recorder (no global state, so several nodes can live
//! in one process, as in tests). Handles are resolved once at start-up: the hot
//! path only bumps atomics. The figures of the status endpoint
//! ([`Status`](crate::Status)) are teed into atomics of their own, since the
//! exporter cannot be read back cheaply, and sampled once a second by
//! [`NodeMetrics::sample`].

use std::sync::Arc;
use std::time::Duration;

use metrics::{Counter, Gauge, Histogram, Key, Label, Level, Metadata, Recorder};
use metrics_exporter_prometheus::{
    Matcher, PrometheusBuilder, PrometheusHandle, PrometheusRecorder,
};
use plaza_protocol::ErrorCode;

use crate::bucket_histogram::BucketHistogram;
use crate::status::{self, LatencyHistogram, Sampler, TeeCounter, Totals};

/// Pre-registered metric handles of one node.
pub struct NodeMetrics {
    handle: PrometheusHandle,
    recorder: PrometheusRecorder,
    /// Open WebSocket connections.
    pub connections: Gauge,
    /// Rooms held.
    pub rooms: Gauge,
    /// Frames received from clients.
    pub frames_in: Counter,
    /// Bytes received from clients.
    pub bytes_in: Counter,
    /// Time a client's command waited for its room's task (in cluster mode, for this node's replica).
    pub room_wait: Histogram,
    /// Connections closed because their send queue stayed full.
    pub slow_consumers: Counter,
    /// Connections refused because the node held `max_connections`.
    pub connections_refused: Counter,
    /// Times the JWKS file was loaded again after it changed.
    pub jwks_reloads: Counter,
    /// Changes of the JWKS file that did not load (the keys in use stayed).
    pub jwks_reload_failures: Counter,
    /// Cluster mode: times a hosted room's log was seen to go back (a broker
    /// failover lost entries this node had applied): the room's connections
    /// here were closed with 4005 and its replica rebuilt.
    pub log_regressions: Counter,
    errors: Vec<(ErrorCode, Counter, Arc<TeeCounter>)>,
    /// The same counters, shareable.
    error_set: ErrorCounter,
    totals: [Arc<TeeCounter>; 4],
    /// The delivery latency since the last sample, for the status page.
    recent_latency: LatencyHistogram,
    /// The per-event histograms, rendered after the recorder's text.
    histograms: [Arc<BucketHistogram>; 2],
    sampler: Sampler,
    /// Every counter, to publish before rendering.
    tees: Vec<Arc<TeeCounter>>,
}

const METADATA: Metadata<'static> = Metadata::new("plaza", Level::INFO, Some(module_path!()));

impl NodeMetrics {
    /// Registers every metric on a fresh recorder.
    pub fn new() -> Self {
        let recorder = PrometheusBuilder::new()
            .set_buckets_for_metric(
                Matcher::Full("plaza_webhook_delivery_seconds".into()),
                &crate::webhooks::metrics::DELIVERY_BUCKETS,
            )
            .expect("buckets are given")
            .build_recorder();
        // Sampled per write batch and per command: kept in fixed buckets
        // (see `bucket_histogram`), rendered after the recorder's text.
        let delivery_histogram = BucketHistogram::new(
            "plaza_delivery_latency_seconds",
            &[
                0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
            ],
        );
        let room_wait_histogram = BucketHistogram::new(
            "plaza_room_wait_seconds",
            &[
                0.0001, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0,
            ],
        );
        // Every counter is a tee, published to the exporter when rendered.
        let tees = std::cell::RefCell::new(Vec::new());
        let tee = |exported| {
            let (tee, counter) = TeeCounter::wrap(exported);
            tees.borrow_mut().push(tee.clone());
            (tee, counter)
        };
        let counter = |name: &'static str| {
            tee(recorder.register_counter(&Key::from_static_name(name), &METADATA))
        };
        let gauge =
            |name: &'static str| recorder.register_gauge(&Key::from_static_name(name), &METADATA);
        let errors: Vec<(ErrorCode, Counter, Arc<TeeCounter>)> = ErrorCode::ALL
            .iter()
            .map(|&code| {
                let key = Key::from_parts(
                    "plaza_errors_total",
                    vec![Label::new("code", code.as_str())],
                );
                let (tee, c) = tee(recorder.register_counter(&key, &METADATA));
                (code, c, tee)
            })
            .collect();
        let (frames_in_tee, frames_in) = counter("plaza_frames_in_total");
        // Written to only through `wrote`.
        let (frames_out_tee, _) = counter("plaza_frames_out_total");
        let (bytes_in_tee, bytes_in) = counter("plaza_bytes_in_total");
        let (bytes_out_tee, _) = counter("plaza_bytes_out_total");
        NodeMetrics {
            handle: recorder.handle(),
            connections: gauge("plaza_connections"),
            rooms: gauge("plaza_rooms"),
            frames_in,
            bytes_in,
            slow_consumers: counter("plaza_slow_consumers_total").1,
            connections_refused: counter("plaza_connections_refused_total").1,
            jwks_reloads: counter("plaza_jwks_reloads_total").1,
            jwks_reload_failures: counter("plaza_jwks_reload_failures_total").1,
            log_regressions: counter("plaza_log_regressions_total").1,
            room_wait: Histogram::from_arc(room_wait_histogram.clone()),
            histograms: [delivery_histogram, room_wait_histogram],
            error_set: ErrorCounter(
                errors
                    .iter()
                    .map(|(code, c, _)| (*code, c.clone()))
                    .collect(),
            ),
            errors,
            totals: [frames_in_tee, frames_out_tee, bytes_in_tee, bytes_out_tee],
            recent_latency: LatencyHistogram::new(),
            sampler: Sampler::new(),
            recorder,
            tees: tees.into_inner(),
        }
    }

    /// The `plaza_webhook_*` series of webhook target `name`.
    pub(crate) fn webhook_target(&self, name: &str) -> crate::webhooks::metrics::TargetMetrics {
        let key = |metric: &'static str| {
            Key::from_parts(metric, vec![Label::new("target", name.to_owned())])
        };
        let counter = |metric| self.recorder.register_counter(&key(metric), &METADATA);
        crate::webhooks::metrics::TargetMetrics {
            delivered: counter("plaza_webhook_delivered_total"),
            retries: counter("plaza_webhook_retries_total"),
            failed: counter("plaza_webhook_failed_total"),
            dropped: counter("plaza_webhook_dropped_total"),
            redelivered: counter("plaza_webhook_redelivered_total"),
            queue_depth: self
                .recorder
                .register_gauge(&key("plaza_webhook_queue_depth"), &METADATA),
            delivery_seconds: self
                .recorder
                .register_histogram(&key("plaza_webhook_delivery_seconds"), &METADATA),
        }
    }

    /// Counts an error sent to a client.
    pub fn error(&self, code: ErrorCode) {
        if let Some((_, c, _)) = self.errors.iter().find(|(c, _, _)| *c == code) {
            c.increment(1);
        }
    }

    /// The counter of one error code.
    pub fn error_counter(&self, code: ErrorCode) -> Counter {
        self.errors
            .iter()
            .find(|(c, _, _)| *c == code)
            .map(|(_, c, _)| c.clone())
            .unwrap_or_else(Counter::noop)
    }

    /// A cheap handle that counts errors by code, for tasks that should not
    /// hold the node (room tasks).
    pub fn error_counter_set(&self) -> ErrorCounter {
        self.error_set.clone()
    }

    /// Counts one write to a client of `frames` frames and `bytes` bytes,
    /// whose oldest room event was ordered `latency` before (the delivery
    /// latency, sampled once per write).
    ///
    /// Called for every write, the hottest place that records metrics: the
    /// totals and both latency histograms are recorded here directly, in
    /// integers, where the `metrics` handles took a dynamic call per counter
    /// and per histogram and a conversion to seconds (together ~1.5 % of a
    /// busy server's samples).
    pub fn wrote(&self, frames: u64, bytes: u64, latency: Option<Duration>) {
        let [_, frames_out, _, bytes_out] = &self.totals;
        frames_out.add(frames);
        bytes_out.add(bytes);
        if let Some(d) = latency {
            let ns = u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
            let [delivery, _] = &self.histograms;
            delivery.record_ns(ns);
            self.recent_latency.record_us(ns.saturating_add(500) / 1000);
        }
    }

    /// Folds recorded histogram samples into their buckets. The exporter keeps
    /// raw samples until then, so this must run periodically even when
    /// nobody scrapes `/metrics`, or memory grows with every sample.
    pub fn upkeep(&self) {
        self.handle.run_upkeep();
    }

    /// Takes a sample of the counters and the delivery latency since the
    /// previous sample, for the rates and quantiles of [`Status`](crate::Status);
    /// the node's upkeep tick calls this once a second.
    pub fn sample(&self) {
        let [frames_in, frames_out, ..] = &self.totals;
        let totals = Totals {
            frames_in: frames_in.get(),
            frames_out: frames_out.get(),
        };
        self.sampler.sample(totals, &self.recent_latency);
    }

    /// Totals since start-up and the recent rates and latency.
    pub(crate) fn snapshot(&self) -> status::Snapshot {
        let [frames_in, frames_out, bytes_in, bytes_out] = &self.totals;
        status::Snapshot {
            uptime: self.sampler.uptime(),
            frames_in: frames_in.get(),
            frames_out: frames_out.get(),
            bytes_in: bytes_in.get(),
            bytes_out: bytes_out.get(),
            errors: self
                .errors
                .iter()
                .map(|(code, _, tee)| (code.as_str(), tee.get()))
                .collect(),
            recent: self.sampler.recent(),
        }
    }

    /// The Prometheus text exposition.
    pub fn render(&self) -> String {
        // Read when scraped; shown only where the allocator reports (`plaza serve`).
        if let Some(f) = crate::allocator::allocator_figures() {
            let gauge = |name| {
                self.recorder
                    .register_gauge(&Key::from_static_name(name), &METADATA)
            };
            gauge("plaza_allocator_allocated_bytes").set(f.allocated as f64);
            gauge("plaza_allocator_resident_bytes").set(f.resident as f64);
        }
        for tee in &self.tees {
            tee.publish();
        }
        self.handle.run_upkeep();
        let mut text = self.handle.render();
        for h in &self.histograms {
            h.render(&mut text);
        }
        text
    }
}

impl Default for NodeMetrics {
    fn default() -> Self {
        Self::new()
    }
}

/// Counts errors sent to clients by code (see [`NodeMetrics::error_counter_set`]).
#[derive(Clone)]
pub struct ErrorCounter(Arc<[(ErrorCode, Counter)]>);

impl ErrorCounter {
    /// Counts one error.
    pub fn count(&self, code: ErrorCode) {
        if let Some((_, c)) = self.0.iter().find(|(x, _)| *x == code) {
            c.increment(1);
        }
    }
}

impl std::fmt::Debug for ErrorCounter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ErrorCounter")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A write's counts reach the exported totals, the exported histogram
    /// (bucket, sum, count) and the status page's recent latency alike.
    #[test]
    fn a_write_is_counted_everywhere() {
        let m = NodeMetrics::new();
        m.sample();
        m.wrote(3, 300, Some(Duration::from_micros(1_500)));
        m.wrote(2, 100, None);
        m.wrote(1, 50, Some(Duration::from_millis(40)));
        m.sample();

        let s = m.snapshot();
        assert_eq!((s.frames_out, s.bytes_out), (6, 450));
        assert_eq!(s.recent.latency.max, Some(40.0));
        // The status page's buckets are log-linear: 1.5 ms is in the one
        // up to 1.535 ms.
        let p50 = s.recent.latency.p50.expect("two samples");
        assert!((1.5..1.6).contains(&p50), "{p50}");

        let text = m.render();
        for line in [
            "plaza_frames_out_total 6",
            "plaza_bytes_out_total 450",
            "plaza_delivery_latency_seconds_bucket{le=\"0.001\"} 0",
            "plaza_delivery_latency_seconds_bucket{le=\"0.002\"} 1",
            "plaza_delivery_latency_seconds_bucket{le=\"0.025\"} 1",
            "plaza_delivery_latency_seconds_bucket{le=\"0.05\"} 2",
            "plaza_delivery_latency_seconds_bucket{le=\"+Inf\"} 2",
            "plaza_delivery_latency_seconds_sum 0.0415",
            "plaza_delivery_latency_seconds_count 2",
        ] {
            assert!(text.lines().any(|l| l == line), "{line:?} not in\n{text}");
        }
    }

    /// The first-column names of the "Metrics" table of docs/protocol.md
    /// (labels cut off: `plaza_errors_total{code="..."}` is
    /// `plaza_errors_total`).
    fn documented_metrics() -> Vec<String> {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/protocol.md");
        let doc = std::fs::read_to_string(path).expect("docs/protocol.md");
        let start = doc
            .lines()
            .position(|l| l.trim() == "## Metrics")
            .expect("a Metrics section");
        doc.lines()
            .skip(start + 1)
            .take_while(|l| !l.starts_with("## "))
            .filter(|l| l.starts_with('|'))
            .skip(2) // header and separator
            .map(|l| {
                let cell = l.split('|').nth(1).unwrap().trim().trim_matches('`');
                cell.split('{').next().unwrap().to_owned()
            })
            .collect()
    }

    /// Every metric a node exports is in the doc's table, and the table
    /// names no metric the node does not have (the allocator's gauges
    /// appear only where the allocator reports, as the table says).
    #[test]
    fn the_doc_lists_every_metric_and_no_other() {
        let m = NodeMetrics::new();
        // Every labelled series exists from the start; a histogram sample
        // makes sure the histograms render whatever their implementation.
        m.wrote(1, 1, Some(Duration::from_millis(1)));
        m.room_wait.record(0.001);
        // The webhook series exist per target.
        let hook = m.webhook_target("t");
        hook.delivery_seconds.record(0.01);
        hook.delivered.increment(1);
        let text = m.render();
        let exported: std::collections::BTreeSet<String> = text
            .lines()
            .filter_map(|l| l.strip_prefix("# TYPE "))
            .map(|l| l.split(' ').next().unwrap().to_owned())
            .collect();
        assert!(
            exported.contains("plaza_jwks_reloads_total")
                && exported.contains("plaza_errors_total"),
            "{text}"
        );
        let documented = documented_metrics();
        let missing: Vec<&String> = exported
            .iter()
            .filter(|n| !documented.contains(n))
            .collect();
        assert!(
            missing.is_empty(),
            "metrics missing from the table of docs/protocol.md: {missing:?}"
        );
        let allocator = [
            "plaza_allocator_allocated_bytes",
            "plaza_allocator_resident_bytes",
        ];
        let unknown: Vec<&String> = documented
            .iter()
            .filter(|n| !exported.contains(*n) && !allocator.contains(&n.as_str()))
            .collect();
        assert!(
            unknown.is_empty(),
            "docs/protocol.md documents metrics a node does not export: {unknown:?}"
        );
    }

    /// Samples on a bound, a nanosecond past it, and at half a microsecond:
    /// the bound holds the first, the next bucket the second, and the status
    /// page rounds the third to the nearer microsecond.
    #[test]
    fn write_latencies_at_the_edges() {
        let m = NodeMetrics::new();
        m.sample();
        m.wrote(1, 1, Some(Duration::from_nanos(1_000_000)));
        m.wrote(1, 1, Some(Duration::from_nanos(1_000_001)));
        m.sample();
        let text = m.render();
        for line in [
            "plaza_delivery_latency_seconds_bucket{le=\"0.001\"} 1",
            "plaza_delivery_latency_seconds_bucket{le=\"0.002\"} 2",
            "plaza_delivery_latency_seconds_sum 0.002000001",
        ] {
            assert!(text.lines().any(|l| l == line), "{line:?} not in\n{text}");
        }

        let half = NodeMetrics::new();
        half.sample();
        half.wrote(1, 1, Some(Duration::from_nanos(124_500)));
        half.sample();
        assert_eq!(half.snapshot().recent.latency.max, Some(0.125));
    }
}
