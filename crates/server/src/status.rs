//! The node's live status (`GET /v1/status`): totals, recent rates and recent
//! delivery latency.
//!
//! The Prometheus exporter cannot be read back cheaply, so the counters the
//! status needs are "teed": each [`metrics::Counter`] handed out by
//! [`NodeMetrics`](crate::metrics::NodeMetrics) bumps both the exporter's
//! counter and an atomic here, and the delivery-latency histogram also records
//! into a small lock-free histogram of its own. Once a second the node's upkeep
//! tick takes a [`Sample`] (the totals, plus the latency histogram of the second
//! just ended, which is reset); a ring of the last [`WINDOW`] seconds of samples
//! gives the rates and latency quantiles. Memory is fixed: nothing grows with
//! traffic or uptime.

use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use metrics::{Counter, CounterFn};
use serde::Serialize;

/// How many one-second intervals the rates and latency quantiles cover.
pub const WINDOW: usize = 5;

/// Body of `GET /v1/status`: what this node is doing now.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Status {
    /// This node's id.
    pub node: String,
    /// The broker's kind (`memory`, `redis`).
    pub broker: &'static str,
    /// Whole seconds since the node started.
    pub uptime_s: u64,
    /// Open WebSocket connections.
    pub connections: usize,
    /// Rooms held here (in cluster mode: hosted here).
    pub rooms: usize,
    /// WebSocket data messages received from clients since start-up.
    pub frames_in: u64,
    /// Frames written to clients since start-up.
    pub frames_out: u64,
    /// Bytes of `frames_in`.
    pub bytes_in: u64,
    /// Bytes of `frames_out`.
    pub bytes_out: u64,
    /// Seconds the rates and latency cover: up to 5, 0 until the
    /// node has taken two samples (about one second after start-up).
    pub window_s: f64,
    /// Frames received per second over the window.
    pub messages_in_per_s: f64,
    /// Frames written per second over the window.
    pub messages_out_per_s: f64,
    /// Delivery latency over the window.
    pub delivery_latency_ms: LatencySummary,
    /// Errors sent to WebSocket clients since start-up.
    pub errors: ErrorTotals,
    /// Whether `POST /v1/demo/token` is served (`demo_tokens` with a
    /// `jwt_secret`): the demo page asks for a token only then.
    pub demo_tokens: bool,
}

/// Errors sent to WebSocket clients, as counted by `plaza_errors_total`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ErrorTotals {
    /// All codes together.
    pub total: u64,
    /// Per error code, only the codes sent at least once.
    pub by_code: BTreeMap<&'static str, u64>,
}

/// The metrics' part of a [`Status`].
pub(crate) struct Snapshot {
    pub(crate) uptime: Duration,
    pub(crate) frames_in: u64,
    pub(crate) frames_out: u64,
    pub(crate) bytes_in: u64,
    pub(crate) bytes_out: u64,
    pub(crate) errors: Vec<(&'static str, u64)>,
    pub(crate) recent: Recent,
}

impl Status {
    /// Assembles a status from a node's identity, gauges and metrics.
    pub(crate) fn new(
        node: String,
        broker: &'static str,
        connections: usize,
        rooms: usize,
        demo_tokens: bool,
        m: Snapshot,
    ) -> Status {
        let round = |x: f64, places: i32| {
            let f = 10f64.powi(places);
            (x * f).round() / f
        };
        let by_code: BTreeMap<&'static str, u64> =
            m.errors.into_iter().filter(|&(_, n)| n > 0).collect();
        Status {
            node,
            broker,
            uptime_s: m.uptime.as_secs(),
            connections,
            rooms,
            frames_in: m.frames_in,
            frames_out: m.frames_out,
            bytes_in: m.bytes_in,
            bytes_out: m.bytes_out,
            window_s: round(m.recent.window_s, 3),
            messages_in_per_s: round(m.recent.messages_in_per_s, 2),
            messages_out_per_s: round(m.recent.messages_out_per_s, 2),
            delivery_latency_ms: m.recent.latency,
            errors: ErrorTotals {
                total: by_code.values().sum(),
                by_code,
            },
            demo_tokens,
        }
    }
}

/// A counter whose total is read here and published to the Prometheus
/// exporter when it is scraped ([`TeeCounter::publish`]).
///
/// Why not count in the exporter's counter as well: some of these count
/// every write of every connection, and the exporter's counter is two more
/// atomic read-modify-writes per count (its value and its generation),
/// about 1 % of a busy server (docs/benchmarks-history.md, issue 19).
pub(crate) struct TeeCounter {
    exported: Counter,
    total: AtomicU64,
}

impl TeeCounter {
    /// Wraps `exported`; returns the shared tee and a [`Counter`] feeding it.
    pub(crate) fn wrap(exported: Counter) -> (Arc<TeeCounter>, Counter) {
        let tee = Arc::new(TeeCounter {
            exported,
            total: AtomicU64::new(0),
        });
        (tee.clone(), Counter::from_arc(tee))
    }

    /// Everything counted so far.
    pub(crate) fn get(&self) -> u64 {
        self.total.load(Ordering::Relaxed)
    }

    /// Gives the exporter the total: before every render.
    pub(crate) fn publish(&self) {
        self.exported.absolute(self.get());
    }

    /// Counts `value` more, without the `metrics` handle's dynamic call.
    #[inline]
    pub(crate) fn add(&self, value: u64) {
        self.total.fetch_add(value, Ordering::Relaxed);
    }
}

impl CounterFn for TeeCounter {
    fn increment(&self, value: u64) {
        self.add(value);
    }

    fn absolute(&self, value: u64) {
        self.total.fetch_max(value, Ordering::Relaxed);
    }
}

/// Sub-buckets per power of two (2^4 = 16): a bucket is at most 1/16 of its
/// values wide, so a quantile is off by at most about 6 %.
const SUB_BITS: u32 = 4;
const SUB: usize = 1 << SUB_BITS;
/// The largest exponent with buckets of its own: values of 2^28 µs (about
/// 4.5 minutes) and more land in the last bucket (the exact `max` is kept).
const MAX_EXP: u32 = 27;
const BUCKETS: usize = SUB + (MAX_EXP - SUB_BITS + 1) as usize * SUB;

fn bucket_of(us: u64) -> usize {
    if us < SUB as u64 {
        return us as usize;
    }
    let us = us.min((1u64 << (MAX_EXP + 1)) - 1);
    let exp = 63 - us.leading_zeros();
    let sub = (us >> (exp - SUB_BITS)) as usize & (SUB - 1);
    SUB + (exp - SUB_BITS) as usize * SUB + sub
}

/// The largest value (µs) that falls in bucket `i`.
fn bucket_top(i: usize) -> u64 {
    if i < SUB {
        return i as u64;
    }
    let k = i - SUB;
    let shift = (k / SUB) as u32;
    let sub = (k % SUB) as u64;
    ((SUB as u64 + sub + 1) << shift) - 1
}

/// A lock-free log-linear histogram of microseconds, emptied by each sample.
pub(crate) struct LatencyHistogram {
    buckets: Box<[AtomicU64]>,
    max_us: AtomicU64,
}

impl LatencyHistogram {
    pub(crate) fn new() -> Self {
        LatencyHistogram {
            buckets: (0..BUCKETS).map(|_| AtomicU64::new(0)).collect(),
            max_us: AtomicU64::new(0),
        }
    }

    pub(crate) fn record_us(&self, us: u64) {
        self.buckets[bucket_of(us)].fetch_add(1, Ordering::Relaxed);
        // Rarely a new maximum: a load, not a read-modify-write, per sample.
        if us > self.max_us.load(Ordering::Relaxed) {
            self.max_us.fetch_max(us, Ordering::Relaxed);
        }
    }

    /// Takes the counts recorded since the last call, leaving the histogram empty.
    fn take(&self) -> Interval {
        let counts: Box<[u64]> = self
            .buckets
            .iter()
            .map(|b| b.swap(0, Ordering::Relaxed))
            .collect();
        Interval {
            counts,
            max_us: self.max_us.swap(0, Ordering::Relaxed),
        }
    }
}

/// Latency counts of one interval.
struct Interval {
    counts: Box<[u64]>,
    max_us: u64,
}

/// The counters at one upkeep tick, and the latency since the previous tick.
struct Sample {
    at: Instant,
    frames_in: u64,
    frames_out: u64,
    latency: Interval,
}

/// What the sampler reads at a tick.
pub(crate) struct Totals {
    pub(crate) frames_in: u64,
    pub(crate) frames_out: u64,
}

/// The ring of the last [`WINDOW`] + 1 samples.
pub(crate) struct Sampler {
    started: Instant,
    ring: Mutex<VecDeque<Sample>>,
}

/// Rates and latency over the sampled window.
pub(crate) struct Recent {
    pub(crate) window_s: f64,
    pub(crate) messages_in_per_s: f64,
    pub(crate) messages_out_per_s: f64,
    pub(crate) latency: LatencySummary,
}

impl Sampler {
    pub(crate) fn new() -> Self {
        Sampler {
            started: Instant::now(),
            ring: Mutex::new(VecDeque::with_capacity(WINDOW + 1)),
        }
    }

    /// Time since the node started.
    pub(crate) fn uptime(&self) -> Duration {
        self.started.elapsed()
    }

    /// Records one sample, dropping the oldest beyond the window.
    pub(crate) fn sample(&self, totals: Totals, latency: &LatencyHistogram) {
        let mut ring = self.ring.lock().unwrap_or_else(|p| p.into_inner());
        if ring.len() > WINDOW {
            ring.pop_front();
        }
        ring.push_back(Sample {
            at: Instant::now(),
            frames_in: totals.frames_in,
            frames_out: totals.frames_out,
            latency: latency.take(),
        });
    }

    /// Rates between the oldest and the newest sample, and the latency
    /// quantiles of the intervals between them. Zero rates and no latency
    /// before the second sample.
    pub(crate) fn recent(&self) -> Recent {
        let ring = self.ring.lock().unwrap_or_else(|p| p.into_inner());
        let (Some(first), Some(last)) = (ring.front(), ring.back()) else {
            return Recent::empty();
        };
        let secs = last.at.duration_since(first.at).as_secs_f64();
        if ring.len() < 2 || secs <= 0.0 {
            return Recent::empty();
        }
        let rate = |a: u64, b: u64| b.saturating_sub(a) as f64 / secs;
        let mut counts = vec![0u64; BUCKETS];
        let mut max_us = 0;
        // The first sample's interval ended where the window starts.
        for s in ring.iter().skip(1) {
            for (sum, c) in counts.iter_mut().zip(s.latency.counts.iter()) {
                *sum += c;
            }
            max_us = max_us.max(s.latency.max_us);
        }
        Recent {
            window_s: secs,
            messages_in_per_s: rate(first.frames_in, last.frames_in),
            messages_out_per_s: rate(first.frames_out, last.frames_out),
            latency: LatencySummary::of(&counts, max_us),
        }
    }
}

impl Recent {
    fn empty() -> Self {
        Recent {
            window_s: 0.0,
            messages_in_per_s: 0.0,
            messages_out_per_s: 0.0,
            latency: LatencySummary::default(),
        }
    }
}

/// Delivery latency quantiles in milliseconds; `None` (JSON `null`) when
/// nothing was delivered in the window.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct LatencySummary {
    /// Median.
    pub p50: Option<f64>,
    /// 90th percentile.
    pub p90: Option<f64>,
    /// 99th percentile.
    pub p99: Option<f64>,
    /// Largest sample.
    pub max: Option<f64>,
}

impl LatencySummary {
    fn of(counts: &[u64], max_us: u64) -> Self {
        let n: u64 = counts.iter().sum();
        if n == 0 {
            return LatencySummary::default();
        }
        let ms = |us: u64| Some(us as f64 / 1000.0);
        let quantile = |q: f64| {
            // The smallest value with at least q·n samples at or below it.
            let rank = ((q * n as f64).ceil() as u64).max(1);
            let mut seen = 0;
            for (i, c) in counts.iter().enumerate() {
                seen += c;
                if seen >= rank {
                    return ms(bucket_top(i).min(max_us));
                }
            }
            ms(max_us)
        };
        LatencySummary {
            p50: quantile(0.50),
            p90: quantile(0.90),
            p99: quantile(0.99),
            max: ms(max_us),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_cover_values_in_order() {
        let mut last = 0;
        for us in (0..100_000u64).chain([1 << 27, (1 << 28) - 1]) {
            let i = bucket_of(us);
            assert!(i >= last, "{us}");
            assert!(bucket_top(i) >= us, "{us} above the top of bucket {i}");
            if i > 0 {
                assert!(bucket_top(i - 1) < us, "{us} belongs below bucket {i}");
            }
            last = i;
        }
        assert_eq!(bucket_of(u64::MAX), BUCKETS - 1);
        assert_eq!(bucket_of((1 << 28) - 1), BUCKETS - 1);
    }

    #[test]
    fn quantiles_are_within_a_bucket() {
        let h = LatencyHistogram::new();
        for us in 1..=1000 {
            h.record_us(us);
        }
        let s = LatencySummary::of(&h.take().counts, 1000);
        let near = |got: Option<f64>, want: f64| {
            let got = got.unwrap();
            assert!(got >= want && got <= want * 1.07, "{got} vs {want}");
        };
        near(s.p50, 0.5);
        near(s.p90, 0.9);
        near(s.p99, 0.99);
        assert_eq!(s.max, Some(1.0));
        // Taking empties it.
        assert_eq!(
            LatencySummary::of(&h.take().counts, 0),
            LatencySummary::default()
        );
    }

    #[test]
    fn the_ring_keeps_the_window_and_rates_follow_the_counters() {
        let s = Sampler::new();
        let h = LatencyHistogram::new();
        assert_eq!(s.recent().messages_in_per_s, 0.0);
        for i in 0..20u64 {
            h.record_us(2000);
            s.sample(
                Totals {
                    frames_in: i * 10,
                    frames_out: i * 20,
                },
                &h,
            );
            std::thread::sleep(Duration::from_millis(2));
        }
        assert_eq!(s.ring.lock().unwrap().len(), WINDOW + 1);
        let r = s.recent();
        assert!(r.window_s > 0.0);
        assert!(r.messages_in_per_s > 0.0);
        let ratio = r.messages_out_per_s / r.messages_in_per_s;
        assert!((ratio - 2.0).abs() < 1e-9, "{ratio}");
        assert_eq!(r.latency.max, Some(2.0));
        assert!(r.latency.p50.unwrap() >= 2.0 && r.latency.p50.unwrap() < 2.2);
    }
}
