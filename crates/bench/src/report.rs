//! What a run measured: built from the runner's counters, written as JSON and
//! as a Markdown summary, and checked against the scenario's expectations.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::Duration;

use hdrhistogram::Histogram;
use serde::Serialize;

use crate::raw::RawRun;
use crate::scenario::Scenario;

/// Latency summary in milliseconds.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Latency {
    /// Samples.
    pub count: u64,
    /// Smallest (the first arrival of a timed broadcast).
    pub min_ms: f64,
    /// Mean.
    pub mean_ms: f64,
    /// Median.
    pub p50_ms: f64,
    /// 95th percentile.
    pub p95_ms: f64,
    /// 99th percentile.
    pub p99_ms: f64,
    /// 99.9th percentile.
    pub p999_ms: f64,
    /// Largest.
    pub max_ms: f64,
}

impl Latency {
    fn of(h: &Histogram<u64>) -> Option<Latency> {
        if h.is_empty() {
            return None;
        }
        let ms = |us: u64| us as f64 / 1000.0;
        Some(Latency {
            count: h.len(),
            min_ms: ms(h.min()),
            mean_ms: h.mean() / 1000.0,
            p50_ms: ms(h.value_at_quantile(0.5)),
            p95_ms: ms(h.value_at_quantile(0.95)),
            p99_ms: ms(h.value_at_quantile(0.99)),
            p999_ms: ms(h.value_at_quantile(0.999)),
            max_ms: ms(h.max()),
        })
    }
}

/// One expectation and whether it held.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Check {
    /// What was checked.
    pub name: String,
    /// The limit.
    pub limit: f64,
    /// Whether the value must be at most (true) or at least (false) the limit.
    pub at_most: bool,
    /// The measured value (`None`: nothing to measure, which fails).
    pub value: Option<f64>,
    /// Whether it held.
    pub passed: bool,
}

impl Check {
    /// Whether this check limits a time or a rate (a latency, a throughput):
    /// what a busy machine moves. A benchmark judges those; a test of
    /// behaviour looks only at the others ([`Report::behaviour_failures`]).
    pub fn is_speed(&self) -> bool {
        self.name.ends_with("_ms") || self.name.ends_with("_per_s")
    }
}

/// The result of a run.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// Scenario name.
    pub scenario: String,
    /// Driver (protocol) used.
    pub driver: String,
    /// What users connected over (`websocket`, `sse`, `long-polling`, `polling`).
    #[serde(default)]
    pub transport: String,
    /// Scenario parameters after overrides.
    pub params: BTreeMap<String, serde_json::Value>,
    /// Users scheduled.
    pub users: u64,
    /// Users that joined.
    pub joined: u64,
    /// Seconds recorded.
    pub recorded_s: f64,
    /// Publishes sent while recording.
    pub publishes: u64,
    /// Deliveries received while recording.
    pub deliveries: u64,
    /// Deliveries expected from the publishes sent while recording (edges
    /// of the window make the two differ slightly).
    pub expected_deliveries: u64,
    /// Deliveries over the whole run, drain included.
    pub deliveries_total: u64,
    /// Deliveries expected from every publish of the run.
    pub expected_deliveries_total: u64,
    /// deliveries_total / expected_deliveries_total.
    pub delivery_ratio: Option<f64>,
    /// Publishes over the whole run.
    pub publishes_total: u64,
    /// Acknowledgements received (drivers that acknowledge publishes).
    pub acks: u64,
    /// Proximity events (spatial rooms) received per second while recording.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub proximity_events_per_s: Option<f64>,
    /// Messages received per second while recording.
    pub received_per_s: f64,
    /// Messages sent per second while recording.
    pub sent_per_s: f64,
    /// Bytes received per second while recording.
    pub bytes_in_per_s: f64,
    /// WebSocket messages received per second while recording (a batch of
    /// held messages is one).
    #[serde(default)]
    pub frames_in_per_s: f64,
    /// Chat replays: replies, from send to receipt by the author of the
    /// message they answer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reply_latency: Option<Latency>,
    /// Chat replays: replies sent while recording.
    #[serde(default)]
    pub chat_replies: u64,
    /// Loopback traffic while recording, both directions, IP and TCP
    /// headers and ACKs included (a target on loopback only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub loopback_bytes_per_s: Option<f64>,
    /// Loopback packets per second while recording.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub loopback_packets_per_s: Option<f64>,
    /// Loopback bytes while recording, both ways, headers included: what
    /// a capture (source document 004's Wireshark) counts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub loopback_bytes: Option<u64>,
    /// Loopback packets while recording.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub loopback_packets: Option<u64>,
    /// Bytes the users read at their sockets while recording (TCP payload:
    /// HTTP headers and WebSocket framing included).
    #[serde(default)]
    pub socket_bytes_in: u64,
    /// Bytes the users wrote at their sockets while recording.
    #[serde(default)]
    pub socket_bytes_out: u64,
    /// HTTP requests of the users' HTTP transports while recording.
    #[serde(default)]
    pub transport_requests: u64,
    /// Bytes sent per second while recording.
    pub bytes_out_per_s: f64,
    /// Delivery latency measured by observers.
    pub latency: Option<Latency>,
    /// Request round trips.
    pub request_rt: Option<Latency>,
    /// Successful requests.
    pub requests_ok: u64,
    /// Failed or unanswered requests.
    pub requests_failed: u64,
    /// HTTP call round trips.
    pub http_rt: Option<Latency>,
    /// Successful HTTP calls.
    pub http_ok: u64,
    /// Failed HTTP calls.
    pub http_failed: u64,
    /// HTTP calls (ok and failed) that ended while recording, per recorded
    /// second: averaged over the recorded window like the other `_per_s`
    /// figures, so idle stretches of the window lower it.
    pub http_calls_per_recorded_s: f64,
    /// Seconds from the first HTTP request sent to the end of the last HTTP
    /// call (its response read, or its failure), over the whole run and
    /// every load process: how long the HTTP work took.
    pub http_duration_s: Option<f64>,
    /// HTTP calls (ok and failed, whole run) / `http_duration_s`.
    pub http_calls_per_s: Option<f64>,
    /// HTTP bytes sent over the whole run: request line, headers and body of
    /// every call that got a response, as written (the runner sets every
    /// header itself, so it knows what the client writes). Calls that failed
    /// before a response (connect errors, timeouts) are not counted.
    pub http_bytes_out: u64,
    /// HTTP bytes received over the whole run: status line, headers and body
    /// of every response, as the client parsed them. Exact for HTTP/1.1
    /// responses with a `content-length` and the standard reason phrase;
    /// short by the chunk framing of chunked responses, and off by a
    /// non-standard reason phrase or extra spaces in header lines, which the
    /// client does not keep.
    pub http_bytes_in: u64,
    /// `http_bytes_out` / `http_duration_s`.
    pub http_bytes_out_per_s: Option<f64>,
    /// `http_bytes_in` / `http_duration_s`.
    pub http_bytes_in_per_s: Option<f64>,
    /// Seconds from the first WebSocket publish or request sent to the last
    /// WebSocket message a joined user received (drain included), over the
    /// whole run and every load process.
    pub ws_duration_s: Option<f64>,
    /// Server-API publishes answered 2xx over the whole run.
    #[serde(default)]
    pub api_publishes_total: u64,
    /// Server-API publishes sent while recording and answered 2xx, per
    /// recorded second: the accepted publish rate.
    #[serde(default)]
    pub api_publishes_per_s: f64,
    /// Webhook requests the run's receiver got over the whole run (drain
    /// included), redeliveries included.
    #[serde(default)]
    pub webhooks_received_total: u64,
    /// Distinct webhook ids among them.
    #[serde(default)]
    pub webhooks_distinct_total: u64,
    /// Webhook events expected: publishes on the receiver's channels.
    #[serde(default)]
    pub webhooks_expected_total: u64,
    /// webhooks_distinct_total / webhooks_expected_total.
    #[serde(default)]
    pub webhook_ratio: Option<f64>,
    /// Webhook requests received per recorded second.
    #[serde(default)]
    pub webhooks_per_s: f64,
    /// Webhook latency: from the publish call (the send time its message
    /// carries) to the receiver's receipt.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub webhook_latency: Option<Latency>,
    /// Webhook requests received, by event type.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub webhook_types: BTreeMap<String, u64>,
    /// The server's `plaza_webhook_*` metrics at the end of the run.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub server_webhook_metrics: BTreeMap<String, f64>,
    /// Errors by kind.
    pub errors: BTreeMap<String, u64>,
    /// Errors / (users + publishes + requests + HTTP calls).
    pub error_rate: f64,
    /// Server CPU use while recording, % of one core.
    pub server_cpu_percent: Option<f64>,
    /// Server CPU µs per delivery while recording.
    pub server_cpu_us_per_delivery: Option<f64>,
    /// Server RSS at the end of recording, KiB.
    pub server_rss_kib: Option<u64>,
    /// Largest server RSS sampled, KiB.
    pub server_rss_max_kib: Option<u64>,
    /// Server RSS at the start of the run, KiB.
    pub server_rss_start_kib: Option<u64>,
    /// (RSS at the end of recording − RSS at the start) / users joined, KiB.
    pub server_rss_per_user_kib: Option<f64>,
    /// The server's RSS every 10 s of the run.
    #[serde(default)]
    pub server_rss_series: Vec<crate::raw::RssSample>,
    /// Over the recorded phases: the largest distance of an RSS reading
    /// from the first recorded one, as a fraction of it.
    #[serde(default)]
    pub server_rss_drift: Option<f64>,
    /// The same distance for the server allocator's live bytes (Plaza's
    /// `plaza_allocator_allocated_bytes`): growing live data, where RSS
    /// can also grow by pages the allocator keeps. Not a check.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server_heap_drift: Option<f64>,
    /// Where events spent their time inside the server while recording,
    /// from its own `/metrics` (Plaza only): with the delivery latency the
    /// clients measured, it tells the server's part from the network's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server_stages: Option<crate::plaza_metrics::StageMeans>,
    /// Generator CPU while recording, % of one core.
    pub generator_cpu_percent: Option<f64>,
    /// Whether the generator used ≥ 90 % of the cores its threads can use
    /// while recording: then it, not the server, may have set the figures.
    pub generator_busy: bool,
    /// Expectations and their outcome.
    pub checks: Vec<Check>,
    /// Whether every expectation held.
    pub passed: bool,
    /// Things a reader must know (e.g. the generator was saturated).
    pub warnings: Vec<String>,
}

/// Generator CPU (% of one core, per generator thread) from which a run is
/// flagged as possibly limited by the generator.
const GENERATOR_BUSY_PERCENT: f64 = 90.0;

/// The largest distance of a recorded RSS reading from the first recorded
/// one, as a fraction of it; `None` with fewer than two readings.
fn rss_drift(series: &[crate::raw::RssSample]) -> Option<f64> {
    drift(series, |r| Some(r.kib))
}

/// [`rss_drift`] of the allocator's live bytes, over the readings that have
/// them.
fn heap_drift(series: &[crate::raw::RssSample]) -> Option<f64> {
    drift(series, |r| r.heap_kib)
}

fn drift(
    series: &[crate::raw::RssSample],
    value: impl Fn(&crate::raw::RssSample) -> Option<u64>,
) -> Option<f64> {
    let mut recorded = series.iter().filter(|r| r.recorded).filter_map(value);
    let first = recorded.next()? as f64;
    let mut drift = None;
    for v in recorded {
        let d = (v as f64 - first).abs() / first.max(1.0);
        drift = Some(drift.map_or(d, |m: f64| m.max(d)));
    }
    drift
}

impl Report {
    /// The expectations that failed, other than speed ([`Check::is_speed`]):
    /// counts, ratios, errors, bytes, memory.
    pub fn behaviour_failures(&self) -> Vec<&Check> {
        self.checks
            .iter()
            .filter(|c| !c.passed && !c.is_speed())
            .collect()
    }

    /// Builds the report of `scenario` from a run's counts.
    pub fn build(scenario: &Scenario, i: &RawRun) -> Report {
        let c = &i.counts;
        let recorded = Duration::from_micros(i.recorded_us);
        let server_cpu = i.server_cpu_us.map(Duration::from_micros);
        let generator_cpu = i.generator_cpu_us.map(Duration::from_micros);
        let secs = recorded.as_secs_f64().max(1e-9);
        let per_s = |v: u64| v as f64 / secs;
        let pct = |d: Option<Duration>| d.map(|d| d.as_secs_f64() / secs * 100.0);
        let errors_total: u64 = i.errors.values().sum();
        let ops = i.users
            + c.publishes_total
            + c.requests_ok
            + c.requests_failed
            + c.http_ok
            + c.http_failed;
        let error_rate = if ops == 0 {
            0.0
        } else {
            errors_total as f64 / ops as f64
        };
        let delivery_ratio =
            (c.expected_total > 0).then(|| c.deliveries_total as f64 / c.expected_total as f64);
        let latency = Latency::of(&i.latency);
        let request_rt = Latency::of(&i.request_rt);
        let reply_latency = Latency::of(&i.reply_latency);
        let server_cpu_us_per_delivery = server_cpu
            .filter(|_| c.deliveries > 0)
            .map(|d| d.as_secs_f64() * 1e6 / c.deliveries as f64);
        let generator_cpu_percent = pct(generator_cpu);
        let mut warnings = Vec::new();
        let generator_busy = generator_cpu_percent
            .is_some_and(|p| p >= GENERATOR_BUSY_PERCENT * i.generator_threads.max(1) as f64);
        if generator_busy {
            warnings.push(format!(
                "the load generator used {:.0} % of a core ({} thread(s)) while recording: it may \
                 be the bottleneck; run with more threads or processes",
                generator_cpu_percent.unwrap_or_default(),
                i.generator_threads.max(1)
            ));
        }
        // Users of HTTP-only flows never join: nothing to warn about.
        let members = scenario.members(i.users);
        if c.joined < members && scenario.joins() {
            warnings.push(format!("only {} of {} members joined", c.joined, members));
        }
        let e = &scenario.expect;
        let mut checks = Vec::new();
        let mut check = |name: &str, limit: Option<f64>, value: Option<f64>, at_most: bool| {
            if let Some(limit) = limit {
                let passed = value.is_some_and(|v| if at_most { v <= limit } else { v >= limit });
                checks.push(Check {
                    name: name.into(),
                    limit,
                    at_most,
                    value,
                    passed,
                });
            }
        };
        check(
            "latency_mean_ms",
            e.latency_mean_ms,
            latency.as_ref().map(|l| l.mean_ms),
            true,
        );
        check(
            "latency_p99_ms",
            e.latency_p99_ms,
            latency.as_ref().map(|l| l.p99_ms),
            true,
        );
        check(
            "request_mean_ms",
            e.request_mean_ms,
            request_rt.as_ref().map(|l| l.mean_ms),
            true,
        );
        check(
            "reply_p99_ms",
            e.reply_p99_ms,
            reply_latency.as_ref().map(|l| l.p99_ms),
            true,
        );
        let http_rt = Latency::of(&i.http_rt);
        check(
            "http_mean_ms",
            e.http_mean_ms,
            http_rt.as_ref().map(|l| l.mean_ms),
            true,
        );
        check(
            "http_p95_ms",
            e.http_p95_ms,
            http_rt.as_ref().map(|l| l.p95_ms),
            true,
        );
        check(
            "http_p99_ms",
            e.http_p99_ms,
            http_rt.as_ref().map(|l| l.p99_ms),
            true,
        );
        let api_publishes_per_s = per_s(c.api_publishes);
        check(
            "api_publishes_per_s",
            e.api_publishes_per_s_min,
            Some(api_publishes_per_s),
            false,
        );
        let webhooks_per_s = per_s(c.webhooks_received);
        check(
            "webhooks_per_s",
            e.webhooks_per_s_min,
            Some(webhooks_per_s),
            false,
        );
        let webhook_latency = Latency::of(&i.webhook_latency);
        check(
            "webhook_p99_ms",
            e.webhook_p99_ms,
            webhook_latency.as_ref().map(|l| l.p99_ms),
            true,
        );
        let webhook_ratio = (c.webhooks_expected_total > 0)
            .then(|| c.webhooks_distinct_total as f64 / c.webhooks_expected_total as f64);
        check("webhook_ratio", e.webhook_ratio, webhook_ratio, false);
        check(
            "loopback_bytes",
            e.loopback_bytes_max,
            i.loopback_bytes.map(|b| b as f64),
            true,
        );
        let server_rss_drift = rss_drift(&i.server_rss_series);
        check("rss_drift", e.rss_drift_max, server_rss_drift, true);
        check("error_rate", e.error_rate, Some(error_rate), true);
        check("delivery_ratio", e.delivery_ratio, delivery_ratio, false);
        let passed = checks.iter().all(|c| c.passed);
        let span = |from: Option<u64>, to: Option<u64>| {
            from.zip(to).map(|(a, b)| b.saturating_sub(a) as f64 / 1e6)
        };
        let http_duration_s = span(i.http_first_sent_unix_us, i.http_last_done_unix_us);
        let per_http_s = |v: u64| http_duration_s.filter(|&d| d > 0.0).map(|d| v as f64 / d);
        Report {
            scenario: scenario.name.clone(),
            driver: i.driver.clone(),
            transport: i.transport.clone(),
            params: scenario
                .params
                .iter()
                .map(|(k, v)| (k.clone(), serde_json::to_value(v).unwrap_or_default()))
                .collect(),
            users: i.users,
            joined: c.joined,
            recorded_s: recorded.as_secs_f64(),
            publishes: c.publishes,
            deliveries: c.deliveries,
            expected_deliveries: c.expected,
            deliveries_total: c.deliveries_total,
            expected_deliveries_total: c.expected_total,
            delivery_ratio,
            publishes_total: c.publishes_total,
            acks: c.acks,
            proximity_events_per_s: (c.proximity_events > 0).then(|| per_s(c.proximity_events)),
            received_per_s: per_s(c.deliveries),
            sent_per_s: per_s(c.publishes),
            bytes_in_per_s: per_s(c.bytes_in),
            bytes_out_per_s: per_s(c.bytes_out),
            frames_in_per_s: per_s(c.frames_in),
            reply_latency,
            chat_replies: c.chat_replies,
            loopback_bytes_per_s: i.loopback_bytes.map(per_s),
            loopback_packets_per_s: i.loopback_packets.map(per_s),
            loopback_bytes: i.loopback_bytes,
            loopback_packets: i.loopback_packets,
            socket_bytes_in: c.socket_bytes_in,
            socket_bytes_out: c.socket_bytes_out,
            transport_requests: c.transport_requests,
            latency,
            request_rt,
            requests_ok: c.requests_ok,
            requests_failed: c.requests_failed,
            http_rt,
            http_ok: c.http_ok,
            http_failed: c.http_failed,
            http_calls_per_recorded_s: per_s(c.http_calls_rec),
            http_duration_s,
            http_calls_per_s: per_http_s(c.http_ok + c.http_failed),
            http_bytes_out: c.http_bytes_out,
            http_bytes_in: c.http_bytes_in,
            http_bytes_out_per_s: per_http_s(c.http_bytes_out),
            http_bytes_in_per_s: per_http_s(c.http_bytes_in),
            ws_duration_s: span(i.ws_first_sent_unix_us, i.ws_last_received_unix_us),
            api_publishes_total: c.api_publishes_total,
            api_publishes_per_s,
            webhooks_received_total: c.webhooks_received_total,
            webhooks_distinct_total: c.webhooks_distinct_total,
            webhooks_expected_total: c.webhooks_expected_total,
            webhook_ratio,
            webhooks_per_s,
            webhook_latency,
            webhook_types: i.webhook_types.clone(),
            server_webhook_metrics: i.server_webhook_metrics.clone(),
            errors: i.errors.clone(),
            error_rate,
            server_cpu_percent: pct(server_cpu),
            server_cpu_us_per_delivery,
            server_rss_kib: i.server_rss_kib,
            server_rss_max_kib: i.server_rss_max_kib,
            server_rss_start_kib: i.server_rss_start_kib,
            server_rss_series: i.server_rss_series.clone(),
            server_rss_drift,
            server_heap_drift: heap_drift(&i.server_rss_series),
            server_stages: i.server_stages,
            server_rss_per_user_kib: i
                .server_rss_kib
                .zip(i.server_rss_start_kib)
                .filter(|_| c.joined > 0)
                .map(|(end, start)| (end as f64 - start as f64) / c.joined as f64),
            generator_cpu_percent,
            generator_busy,
            checks,
            passed,
            warnings,
        }
    }

    /// Writes `result.json` and `summary.md` into `dir` (created if needed).
    pub fn write_to(&self, dir: &std::path::Path) -> Result<(), String> {
        let at = |e: std::io::Error| format!("{}: {e}", dir.display());
        std::fs::create_dir_all(dir).map_err(at)?;
        let json = serde_json::to_string_pretty(self).map_err(|e| e.to_string())?;
        std::fs::write(dir.join("result.json"), json).map_err(at)?;
        std::fs::write(dir.join("summary.md"), self.markdown()).map_err(at)
    }

    /// A Markdown summary.
    pub fn markdown(&self) -> String {
        let mut s = String::new();
        let opt =
            |v: Option<f64>, unit: &str| v.map_or("—".to_owned(), |v| format!("{v:.2}{unit}"));
        let _ = writeln!(
            s,
            "### {} — {} ({} users)\n",
            self.scenario, self.driver, self.users
        );
        let _ = writeln!(s, "| measure | value |\n|---|---|");
        let _ = writeln!(s, "| joined | {} / {} |", self.joined, self.users);
        let _ = writeln!(s, "| recorded | {:.1} s |", self.recorded_s);
        let _ = writeln!(s, "| publishes/s | {:.0} |", self.sent_per_s);
        if let Some(p) = self.proximity_events_per_s {
            let _ = writeln!(s, "| proximity events/s (received) | {p:.1} |");
        }
        let _ = writeln!(s, "| deliveries/s | {:.0} |", self.received_per_s);
        let _ = writeln!(
            s,
            "| deliveries (whole run) | {} of {} expected ({}) |",
            self.deliveries_total,
            self.expected_deliveries_total,
            opt(self.delivery_ratio.map(|r| r * 100.0), " %")
        );
        let _ = writeln!(
            s,
            "| WebSocket bytes in/s, out/s; messages in/s | {:.0}, {:.0}; {:.1} |",
            self.bytes_in_per_s, self.bytes_out_per_s, self.frames_in_per_s
        );
        if let (Some(b), Some(p)) = (self.loopback_bytes_per_s, self.loopback_packets_per_s) {
            let _ = writeln!(
                s,
                "| loopback traffic, both ways, IP+TCP headers included (bytes/s, packets/s) | {b:.0}, {p:.0} |"
            );
        }
        if let (Some(b), Some(p)) = (self.loopback_bytes, self.loopback_packets) {
            let _ = writeln!(
                s,
                "| loopback traffic while recording, both ways, headers included (bytes, packets) | {b}, {p} |"
            );
        }
        if self.socket_bytes_in + self.socket_bytes_out > 0 {
            let _ = writeln!(
                s,
                "| at the users' sockets while recording ({}): bytes in, bytes out; HTTP requests | {}, {}; {} |",
                self.transport, self.socket_bytes_in, self.socket_bytes_out, self.transport_requests
            );
        }
        if let Some(d) = self.ws_duration_s {
            let _ = writeln!(
                s,
                "| WebSocket duration (first publish or request → last message received) | {d:.3} s |"
            );
        }
        if let Some(l) = &self.latency {
            let _ = writeln!(
                s,
                "| delivery latency ms (min, mean, p50, p95, p99, p99.9, max; {} samples) | {:.2}, {:.2}, {:.2}, {:.2}, {:.2}, {:.2}, {:.2} |",
                l.count, l.min_ms, l.mean_ms, l.p50_ms, l.p95_ms, l.p99_ms, l.p999_ms, l.max_ms
            );
        }
        if let Some(l) = &self.reply_latency {
            let _ = writeln!(
                s,
                "| chat reply latency ms (mean, p50, p95, p99, max; {} received of {} sent) | {:.2}, {:.2}, {:.2}, {:.2}, {:.2} |",
                l.count, self.chat_replies, l.mean_ms, l.p50_ms, l.p95_ms, l.p99_ms, l.max_ms
            );
        }
        if let Some(l) = &self.request_rt {
            let _ = writeln!(
                s,
                "| request RT ms (mean, p50, p95, p99, max; {} ok, {} failed) | {:.2}, {:.2}, {:.2}, {:.2}, {:.2} |",
                self.requests_ok, self.requests_failed, l.mean_ms, l.p50_ms, l.p95_ms, l.p99_ms, l.max_ms
            );
        }
        if let Some(l) = &self.http_rt {
            let _ = writeln!(
                s,
                "| HTTP RT ms (mean, p50, p95, p99, max; {} ok, {} failed) | {:.2}, {:.2}, {:.2}, {:.2}, {:.2} |",
                self.http_ok, self.http_failed, l.mean_ms, l.p50_ms, l.p95_ms, l.p99_ms, l.max_ms
            );
        }
        if self.http_ok + self.http_failed > 0 {
            let fixed =
                |v: Option<f64>, d: usize| v.map_or("—".to_owned(), |v| format!("{v:.d$}"));
            let _ = writeln!(
                s,
                "| HTTP duration (first request → last response) | {} s |",
                fixed(self.http_duration_s, 3)
            );
            let _ = writeln!(
                s,
                "| HTTP calls/s (over that duration; over the recorded window) | {}; {:.1} |",
                fixed(self.http_calls_per_s, 1),
                self.http_calls_per_recorded_s
            );
            let _ = writeln!(
                s,
                "| HTTP bytes out, in (total; per s over that duration) | {}, {}; {}, {} |",
                self.http_bytes_out,
                self.http_bytes_in,
                fixed(self.http_bytes_out_per_s, 0),
                fixed(self.http_bytes_in_per_s, 0)
            );
        }
        if self.api_publishes_total > 0 {
            let _ = writeln!(
                s,
                "| server-API publishes accepted/s (recorded); accepted in all | {:.0}; {} |",
                self.api_publishes_per_s, self.api_publishes_total
            );
        }
        if self.webhooks_received_total + self.webhooks_expected_total > 0 {
            let _ = writeln!(
                s,
                "| webhooks received/s (recorded); received in all, distinct, expected | {:.0}; {}, {}, {} ({}) |",
                self.webhooks_per_s,
                self.webhooks_received_total,
                self.webhooks_distinct_total,
                self.webhooks_expected_total,
                opt(self.webhook_ratio.map(|r| r * 100.0), " %")
            );
        }
        if let Some(l) = &self.webhook_latency {
            let _ = writeln!(
                s,
                "| webhook latency ms, publish call → receipt (mean, p50, p95, p99, p99.9, max; {} samples) | {:.2}, {:.2}, {:.2}, {:.2}, {:.2}, {:.2} |",
                l.count, l.mean_ms, l.p50_ms, l.p95_ms, l.p99_ms, l.p999_ms, l.max_ms
            );
        }
        if !self.webhook_types.is_empty() {
            let types: Vec<String> = self
                .webhook_types
                .iter()
                .map(|(k, v)| format!("{k}: {v}"))
                .collect();
            let _ = writeln!(s, "| webhook requests by type | {} |", types.join("; "));
        }
        if !self.server_webhook_metrics.is_empty() {
            let m = &self.server_webhook_metrics;
            let sum = |prefix: &str| -> f64 {
                m.iter()
                    .filter(|(k, _)| k.starts_with(prefix) && !k.contains("le=\""))
                    .map(|(_, v)| v)
                    .sum()
            };
            let count = sum("plaza_webhook_delivery_seconds_count");
            let mean =
                (count > 0.0).then(|| sum("plaza_webhook_delivery_seconds_sum") / count * 1000.0);
            let _ = writeln!(
                s,
                "| server plaza_webhook_*: delivered, retries, failed, dropped, queue depth; delivery mean | {}, {}, {}, {}, {}; {} |",
                sum("plaza_webhook_delivered_total"),
                sum("plaza_webhook_retries_total"),
                sum("plaza_webhook_failed_total"),
                sum("plaza_webhook_dropped_total"),
                sum("plaza_webhook_queue_depth"),
                opt(mean, " ms")
            );
        }
        let _ = writeln!(s, "| server CPU | {} |", opt(self.server_cpu_percent, " %"));
        if let Some(st) = &self.server_stages {
            let _ = writeln!(
                s,
                "| in the server (its /metrics): command's wait for its room; room to socket write | {} ({} commands); {} ({} write batches) |",
                opt(st.room_wait_ms, " ms"),
                st.room_wait_samples,
                opt(st.to_write_ms, " ms"),
                st.to_write_samples
            );
        }
        let _ = writeln!(
            s,
            "| server CPU per delivery | {} |",
            opt(self.server_cpu_us_per_delivery, " µs")
        );
        let rss = |v: Option<u64>| {
            v.map_or("—".to_owned(), |k| {
                format!("{:.1} MiB", k as f64 / 1024.0)
            })
        };
        let _ = writeln!(
            s,
            "| server RSS (start, end, max) | {}, {}, {} |",
            rss(self.server_rss_start_kib),
            rss(self.server_rss_kib),
            rss(self.server_rss_max_kib)
        );
        if let Some(k) = self.server_rss_per_user_kib {
            let _ = writeln!(s, "| server RSS per joined user | {k:.2} KiB |");
        }
        if let Some(d) = self.server_rss_drift {
            let recorded: Vec<_> = self
                .server_rss_series
                .iter()
                .filter(|r| r.recorded)
                .collect();
            let (lo, hi) = recorded
                .iter()
                .fold((u64::MAX, 0), |(lo, hi), r| (lo.min(r.kib), hi.max(r.kib)));
            let _ = writeln!(
                s,
                "| server RSS while recording ({} readings, 10 s apart) | {:.1} to {:.1} MiB, at most {:.1} % from the first |",
                recorded.len(),
                lo as f64 / 1024.0,
                hi as f64 / 1024.0,
                d * 100.0
            );
        }
        let heap: Vec<u64> = self
            .server_rss_series
            .iter()
            .filter(|r| r.recorded)
            .filter_map(|r| r.heap_kib)
            .collect();
        if let (Some(d), Some(lo), Some(hi)) =
            (self.server_heap_drift, heap.iter().min(), heap.iter().max())
        {
            let _ = writeln!(
                s,
                "| server allocator, live bytes while recording | {:.1} to {:.1} MiB, at most {:.1} % from the first |",
                *lo as f64 / 1024.0,
                *hi as f64 / 1024.0,
                d * 100.0
            );
        }
        let _ = writeln!(
            s,
            "| generator CPU | {} |",
            opt(self.generator_cpu_percent, " %")
        );
        let errors: Vec<String> = self
            .errors
            .iter()
            .map(|(k, v)| format!("{k}: {v}"))
            .collect();
        let _ = writeln!(
            s,
            "| errors | {} |",
            if errors.is_empty() {
                "none".to_owned()
            } else {
                errors.join("; ")
            }
        );
        for c in &self.checks {
            let _ = writeln!(
                s,
                "| expect {} {} {} | {} {} |",
                c.name,
                if c.at_most { "≤" } else { "≥" },
                c.limit,
                opt(c.value, ""),
                if c.passed { "pass" } else { "FAIL" }
            );
        }
        for w in &self.warnings {
            let _ = writeln!(s, "\n**Warning:** {w}");
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::raw::RssSample;

    #[test]
    fn rss_drift_is_the_largest_distance_from_the_first_recorded_reading() {
        let at = |at_s: f64, kib: u64, recorded: bool| RssSample {
            at_s,
            kib,
            recorded,
            heap_kib: None,
            allocator_resident_kib: None,
        };
        // Warm-up readings do not count; the first recorded one is the base.
        let series = [
            at(0.0, 100, false),
            at(10.0, 1000, true),
            at(20.0, 1040, true),
            at(30.0, 970, true),
        ];
        let d = rss_drift(&series).unwrap();
        assert!((d - 0.04).abs() < 1e-9, "{d}");
        assert_eq!(
            rss_drift(&series[..2]),
            None,
            "one recorded reading is no curve"
        );
        assert_eq!(rss_drift(&[]), None);
        assert_eq!(heap_drift(&series), None, "no allocator readings");
    }

    #[test]
    fn heap_drift_uses_only_the_readings_that_have_the_allocator_figure() {
        let at = |kib: u64, heap_kib: Option<u64>| RssSample {
            at_s: 0.0,
            kib,
            recorded: true,
            heap_kib,
            allocator_resident_kib: heap_kib.map(|h| h + 1),
        };
        let series = [
            at(1000, None),
            at(1000, Some(200)),
            at(2000, Some(210)),
            at(900, None),
        ];
        let d = heap_drift(&series).unwrap();
        assert!((d - 0.05).abs() < 1e-9, "{d}");
        let r = rss_drift(&series).unwrap();
        assert!((r - 1.0).abs() < 1e-9, "{r}");
    }
}
