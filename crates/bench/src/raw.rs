//! What one load process counted, before it becomes a report: plain
//! data that travels between processes (a run spread over several load
//! processes merges one of these per process) and merges by adding up.

use std::collections::BTreeMap;

use hdrhistogram::Histogram;
use serde::{Deserialize, Serialize};

use crate::counts::Counts;

/// One process's counts of a run.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RawRun {
    /// Driver name.
    pub driver: String,
    /// What users connected over ([`crate::transport::Transport::name`]).
    #[serde(default = "websocket")]
    pub transport: String,
    /// Users this process ran.
    pub users: u64,
    /// What it counted.
    #[serde(flatten)]
    pub counts: Counts,
    /// Length of the recorded stretch, µs.
    pub recorded_us: u64,
    /// Errors by kind.
    pub errors: BTreeMap<String, u64>,
    /// Delivery latency samples (µs).
    #[serde(with = "histogram_pairs")]
    pub latency: Histogram<u64>,
    /// Request round trips (µs).
    #[serde(with = "histogram_pairs")]
    pub request_rt: Histogram<u64>,
    /// HTTP call round trips (µs).
    #[serde(with = "histogram_pairs")]
    pub http_rt: Histogram<u64>,
    /// Chat replies, from send to receipt by the author of what they answer (µs).
    #[serde(with = "histogram_pairs", default = "histogram")]
    pub reply_latency: Histogram<u64>,
    /// Webhook requests, from the send time their message carries (the
    /// publish call) to their receipt by the run's receiver (µs).
    #[serde(with = "histogram_pairs", default = "histogram")]
    pub webhook_latency: Histogram<u64>,
    /// Webhook requests received, by event `type`.
    #[serde(default)]
    pub webhook_types: BTreeMap<String, u64>,
    /// The server's `plaza_webhook_*` metrics at the end of the run (after
    /// the drain), by series (`name{labels}`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub server_webhook_metrics: BTreeMap<String, f64>,
    /// When the run's first HTTP request was sent, unix µs. Unix time is the
    /// clock every load process shares (their schedules start at a common
    /// unix instant), so processes' readings compare.
    #[serde(default)]
    pub http_first_sent_unix_us: Option<u64>,
    /// When the run's last HTTP call ended (response read, or failed), unix µs.
    #[serde(default)]
    pub http_last_done_unix_us: Option<u64>,
    /// When the run's first WebSocket publish or request was sent, unix µs.
    #[serde(default)]
    pub ws_first_sent_unix_us: Option<u64>,
    /// When a joined user last received a WebSocket message, unix µs.
    #[serde(default)]
    pub ws_last_received_unix_us: Option<u64>,
    /// Server CPU time while recording, µs.
    pub server_cpu_us: Option<u64>,
    /// This process's CPU time while recording, µs.
    pub generator_cpu_us: Option<u64>,
    /// Worker threads of this process's generator (its CPU can reach this
    /// many cores).
    pub generator_threads: u64,
    /// Server RSS at the end of recording, KiB.
    pub server_rss_kib: Option<u64>,
    /// Largest server RSS sampled, KiB.
    pub server_rss_max_kib: Option<u64>,
    /// Server RSS at the start, KiB.
    pub server_rss_start_kib: Option<u64>,
    /// Server RSS every [`RSS_SERIES_EVERY_S`] seconds of the run (a soak's
    /// curve): every load process samples the same server, the longest
    /// series is kept.
    #[serde(default)]
    pub server_rss_series: Vec<RssSample>,
    /// Where events spent their time inside the server over the recorded
    /// stretch, from its own `/metrics` (Plaza only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server_stages: Option<crate::plaza_metrics::StageMeans>,
    /// Bytes over the loopback interface while recording (a target on
    /// loopback only): IP and TCP headers included, both directions.
    #[serde(default)]
    pub loopback_bytes: Option<u64>,
    /// Packets over the loopback interface while recording.
    #[serde(default)]
    pub loopback_packets: Option<u64>,
}

/// How often the server's RSS goes into [`RawRun::server_rss_series`].
pub const RSS_SERIES_EVERY_S: f64 = 10.0;

/// One reading of the server's RSS.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct RssSample {
    /// Seconds since the run's start.
    pub at_s: f64,
    /// Resident set size, KiB.
    pub kib: u64,
    /// Whether a recorded phase was running.
    pub recorded: bool,
    /// The server allocator's live bytes at that moment, KiB (Plaza's
    /// `plaza_allocator_allocated_bytes`; absent for servers that do not
    /// report it). Beside RSS it tells live data from pages kept.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub heap_kib: Option<u64>,
    /// The pages the server's allocator holds, KiB
    /// (`plaza_allocator_resident_bytes`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allocator_resident_kib: Option<u64>,
}

fn websocket() -> String {
    "websocket".into()
}

/// An empty histogram with the bounds every run uses: 1 µs to 1 h, three
/// significant digits.
pub fn histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 3_600_000_000, 3).expect("valid bounds")
}

impl RawRun {
    /// Adds `other`'s counts to these. Every process watches the same
    /// server over the same recorded stretch, so the server's CPU and
    /// memory readings are not added up but the largest is kept; the
    /// generator's CPU is added up.
    pub fn merge(&mut self, other: &RawRun) {
        self.users += other.users;
        self.counts.add(&other.counts);
        self.recorded_us = self.recorded_us.max(other.recorded_us);
        for (k, v) in &other.errors {
            *self.errors.entry(k.clone()).or_default() += v;
        }
        let _ = self.latency.add(&other.latency);
        let _ = self.request_rt.add(&other.request_rt);
        let _ = self.http_rt.add(&other.http_rt);
        let _ = self.reply_latency.add(&other.reply_latency);
        let _ = self.webhook_latency.add(&other.webhook_latency);
        for (k, v) in &other.webhook_types {
            *self.webhook_types.entry(k.clone()).or_default() += v;
        }
        if self.server_webhook_metrics.is_empty() {
            self.server_webhook_metrics
                .clone_from(&other.server_webhook_metrics);
        }
        let max = |a: Option<u64>, b: Option<u64>| match (a, b) {
            (Some(a), Some(b)) => Some(a.max(b)),
            (a, b) => a.or(b),
        };
        let min = |a: Option<u64>, b: Option<u64>| match (a, b) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        // The run's traffic spans from the earliest start of any process to
        // the latest end of any.
        self.http_first_sent_unix_us =
            min(self.http_first_sent_unix_us, other.http_first_sent_unix_us);
        self.http_last_done_unix_us =
            max(self.http_last_done_unix_us, other.http_last_done_unix_us);
        self.ws_first_sent_unix_us = min(self.ws_first_sent_unix_us, other.ws_first_sent_unix_us);
        self.ws_last_received_unix_us = max(
            self.ws_last_received_unix_us,
            other.ws_last_received_unix_us,
        );
        self.server_cpu_us = max(self.server_cpu_us, other.server_cpu_us);
        self.server_rss_kib = max(self.server_rss_kib, other.server_rss_kib);
        self.server_rss_max_kib = max(self.server_rss_max_kib, other.server_rss_max_kib);
        self.server_rss_start_kib = min(self.server_rss_start_kib, other.server_rss_start_kib);
        if other.server_rss_series.len() > self.server_rss_series.len() {
            self.server_rss_series.clone_from(&other.server_rss_series);
        }
        // Every process reads the same server: one reading is the figure.
        self.server_stages = self.server_stages.or(other.server_stages);
        // One machine's interface, seen by every process: the same traffic.
        self.loopback_bytes = max(self.loopback_bytes, other.loopback_bytes);
        self.loopback_packets = max(self.loopback_packets, other.loopback_packets);
        self.generator_threads += other.generator_threads;
        self.generator_cpu_us = match (self.generator_cpu_us, other.generator_cpu_us) {
            (Some(a), Some(b)) => Some(a + b),
            (a, b) => a.or(b),
        };
    }
}

/// A histogram as `[value, count]` pairs of its recorded values.
mod histogram_pairs {
    use hdrhistogram::Histogram;
    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    pub fn serialize<S: Serializer>(h: &Histogram<u64>, s: S) -> Result<S::Ok, S::Error> {
        let pairs: Vec<(u64, u64)> = h
            .iter_recorded()
            .map(|v| (v.value_iterated_to(), v.count_at_value()))
            .collect();
        pairs.serialize(s)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Histogram<u64>, D::Error> {
        let pairs = Vec::<(u64, u64)>::deserialize(d)?;
        let mut h = super::histogram();
        for (value, count) in pairs {
            h.record_n(value, count).map_err(serde::de::Error::custom)?;
        }
        Ok(h)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::Report;
    use crate::scenario::Scenario;

    fn raw(users: u64, latencies: &[u64]) -> RawRun {
        let mut latency = histogram();
        for &l in latencies {
            latency.record(l).unwrap();
        }
        RawRun {
            driver: "plaza".into(),
            transport: "sse".into(),
            users,
            counts: Counts {
                joined: users,
                deliveries_total: 10 * users,
                expected_total: 10 * users,
                deliveries: 5 * users,
                expected: 5 * users,
                publishes_total: users,
                publishes: users,
                acks: users,
                requests_ok: 1,
                requests_failed: 0,
                bytes_in: 100,
                bytes_out: 10,
                http_ok: users,
                http_failed: 0,
                http_calls_rec: users,
                http_bytes_out: 1000 * users,
                http_bytes_in: 2000 * users,
                proximity_events: 0,
                frames_in: 3,
                chat_replies: 0,
                socket_bytes_in: 300,
                socket_bytes_out: 30,
                transport_requests: users,
                ..Counts::default()
            },
            recorded_us: 1_000_000,
            errors: BTreeMap::from([("x".to_owned(), users)]),
            latency,
            request_rt: histogram(),
            http_rt: histogram(),
            reply_latency: histogram(),
            webhook_latency: histogram(),
            webhook_types: BTreeMap::new(),
            server_webhook_metrics: BTreeMap::new(),
            http_first_sent_unix_us: Some(1_000_000 + users),
            http_last_done_unix_us: Some(5_000_000 + users),
            ws_first_sent_unix_us: None,
            ws_last_received_unix_us: None,
            server_cpu_us: Some(500_000 + users),
            generator_cpu_us: Some(100_000),
            generator_threads: 1,
            server_rss_kib: Some(1000 + users),
            server_rss_max_kib: Some(2000),
            server_rss_start_kib: Some(500 - users),
            server_rss_series: Vec::new(),
            server_stages: None,
            loopback_bytes: None,
            loopback_packets: None,
        }
    }

    #[test]
    fn survives_json_and_merges_by_adding_counts_and_keeping_server_readings() {
        let a = raw(3, &[1000, 2000]);
        let json = serde_json::to_string(&a).unwrap();
        let back: RawRun = serde_json::from_str(&json).unwrap();
        assert_eq!(back.latency.len(), 2);
        assert_eq!(back.latency.max(), a.latency.max());
        let mut m = back;
        m.merge(&raw(4, &[3000]));
        assert_eq!(m.users, 7);
        assert_eq!(m.counts.deliveries_total, 70);
        assert_eq!(m.errors["x"], 7);
        assert_eq!(m.counts.http_ok, 7);
        assert_eq!(m.latency.len(), 3);
        assert_eq!(m.server_cpu_us, Some(500_004), "the largest, not the sum");
        assert_eq!(m.generator_cpu_us, Some(200_000), "the sum");
        assert_eq!(m.generator_threads, 2);
        assert_eq!(m.server_rss_start_kib, Some(496), "the smallest start");
        let scenario = Scenario::parse(
            "name: x\nphases: [{name: a, duration_s: 1}]\nflows: [{name: f, steps: [connect]}]\n",
            &[],
        )
        .unwrap();
        let report = Report::build(&scenario, &m);
        assert_eq!(report.users, 7);
        assert_eq!(report.latency.unwrap().count, 3);
    }

    #[test]
    fn traffic_spans_merge_to_the_earliest_start_and_latest_end() {
        let mut a = raw(3, &[]);
        let mut b = raw(4, &[]);
        b.ws_first_sent_unix_us = Some(2_000_000);
        b.ws_last_received_unix_us = Some(3_000_000);
        let json = serde_json::to_string(&b).unwrap();
        let b: RawRun = serde_json::from_str(&json).unwrap();
        assert_eq!(b.http_first_sent_unix_us, Some(1_000_004), "survives JSON");
        a.merge(&b);
        assert_eq!(
            (a.counts.http_bytes_out, a.counts.http_bytes_in),
            (7000, 14_000)
        );
        assert_eq!(a.counts.http_calls_rec, 7);
        assert_eq!(a.http_first_sent_unix_us, Some(1_000_003), "a's start");
        assert_eq!(a.http_last_done_unix_us, Some(5_000_004), "b's end");
        // A process without WebSocket traffic does not erase another's.
        assert_eq!(a.ws_first_sent_unix_us, Some(2_000_000));
        assert_eq!(a.ws_last_received_unix_us, Some(3_000_000));
        let scenario = Scenario::parse(
            "name: x\nphases: [{name: a, duration_s: 1}]\nflows: [{name: f, steps: [connect]}]\n",
            &[],
        )
        .unwrap();
        let report = Report::build(&scenario, &a);
        let d = report.http_duration_s.unwrap();
        assert!((d - 4.000_001).abs() < 1e-9, "{d}");
        assert!((report.http_calls_per_s.unwrap() - 7.0 / d).abs() < 1e-9);
        assert!((report.http_bytes_in_per_s.unwrap() - 14_000.0 / d).abs() < 1e-6);
        assert_eq!(report.ws_duration_s, Some(1.0));

        // Results written before these fields existed still read.
        let mut old = serde_json::to_value(raw(1, &[])).unwrap();
        for f in [
            "http_calls_rec",
            "http_bytes_out",
            "http_first_sent_unix_us",
        ] {
            old.as_object_mut().unwrap().remove(f);
        }
        let old: RawRun = serde_json::from_value(old).unwrap();
        assert_eq!(
            (old.counts.http_bytes_out, old.http_first_sent_unix_us),
            (0, None)
        );
    }
}
