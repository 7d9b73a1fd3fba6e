//! A Prometheus histogram with fixed buckets, recorded with atomic adds.
//!
//! The per-event histograms (`plaza_delivery_latency_seconds`, sampled once
//! per write batch; `plaza_room_wait_seconds`, once per command) take a
//! sample many thousand times a second. The exporter's own histogram keeps
//! every sample in blocks allocated as they fill and freed, through epoch
//! reclamation, some time after each upkeep: memory that rises and falls with
//! the load and a pin of the epoch per sample. Here a sample is two atomic
//! adds into memory allocated once.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// A histogram with the upper bounds (seconds) `bounds`, rendered as
/// Prometheus text under its name.
#[derive(Debug)]
pub(crate) struct BucketHistogram {
    name: &'static str,
    bounds: &'static [f64],
    /// `bounds` in nanoseconds: a sample is placed by integer comparisons.
    bounds_ns: Box<[u64]>,
    /// Samples per bucket (not cumulative), the last one past every bound.
    counts: Box<[AtomicU64]>,
    sum_ns: AtomicU64,
}

impl BucketHistogram {
    /// An empty histogram; `bounds` must be increasing.
    pub(crate) fn new(name: &'static str, bounds: &'static [f64]) -> Arc<BucketHistogram> {
        debug_assert!(bounds.windows(2).all(|w| w[0] < w[1]));
        Arc::new(BucketHistogram {
            name,
            bounds,
            bounds_ns: bounds.iter().map(|&le| (le * 1e9).round() as u64).collect(),
            counts: (0..=bounds.len()).map(|_| AtomicU64::new(0)).collect(),
            sum_ns: AtomicU64::new(0),
        })
    }

    /// Records one sample, in seconds (a negative one counts as 0; one that
    /// is not a number is dropped).
    pub(crate) fn record(&self, seconds: f64) {
        if seconds.is_nan() {
            return;
        }
        // Rounded, not cut: 1,000,001 ns as seconds times 1e9 is 1000000.99…
        self.record_ns((seconds.max(0.0) * 1e9).round().min(u64::MAX as f64) as u64);
    }

    /// Records one sample, in nanoseconds.
    pub(crate) fn record_ns(&self, ns: u64) {
        let bucket = self
            .bounds_ns
            .iter()
            .position(|&le| ns <= le)
            .unwrap_or(self.bounds_ns.len());
        self.counts[bucket].fetch_add(1, Ordering::Relaxed);
        self.sum_ns.fetch_add(ns, Ordering::Relaxed);
    }

    /// Appends the histogram in Prometheus text format: cumulative
    /// buckets, `+Inf`, the sum in seconds and the count.
    pub(crate) fn render(&self, out: &mut String) {
        let name = self.name;
        let _ = writeln!(out, "# TYPE {name} histogram");
        let mut total = 0u64;
        for (i, count) in self.counts.iter().enumerate() {
            total += count.load(Ordering::Relaxed);
            match self.bounds.get(i) {
                Some(le) => {
                    let _ = writeln!(out, "{name}_bucket{{le=\"{le}\"}} {total}");
                }
                None => {
                    let _ = writeln!(out, "{name}_bucket{{le=\"+Inf\"}} {total}");
                }
            }
        }
        let sum = self.sum_ns.load(Ordering::Relaxed) as f64 / 1e9;
        let _ = writeln!(out, "{name}_sum {sum}");
        let _ = writeln!(out, "{name}_count {total}\n");
    }
}

impl metrics::HistogramFn for BucketHistogram {
    fn record(&self, value: f64) {
        BucketHistogram::record(self, value);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn samples_land_in_the_first_bucket_that_holds_them_and_render_cumulatively() {
        let h = BucketHistogram::new("t_seconds", &[0.001, 0.01]);
        for s in [0.0005, 0.001, 0.002, 5.0, -1.0, f64::NAN] {
            h.record(s);
        }
        let mut out = String::new();
        h.render(&mut out);
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(
            lines,
            [
                "# TYPE t_seconds histogram",
                "t_seconds_bucket{le=\"0.001\"} 3",
                "t_seconds_bucket{le=\"0.01\"} 4",
                "t_seconds_bucket{le=\"+Inf\"} 5",
                "t_seconds_sum 5.0035",
                "t_seconds_count 5",
                "",
            ]
        );
    }

    /// A sample just past a bound, given in seconds, lands past it: the
    /// seconds are rounded to whole nanoseconds, not cut.
    #[test]
    fn a_sample_a_nanosecond_past_a_bound_lands_past_it() {
        let h = BucketHistogram::new("t_seconds", &[0.001, 0.002]);
        h.record(std::time::Duration::from_nanos(1_000_001).as_secs_f64());
        h.record(std::time::Duration::from_nanos(1_000_000).as_secs_f64());
        let mut out = String::new();
        h.render(&mut out);
        assert!(out.contains("t_seconds_bucket{le=\"0.001\"} 1\n"), "{out}");
        assert!(out.contains("t_seconds_bucket{le=\"0.002\"} 2\n"), "{out}");
        assert!(out.contains("t_seconds_sum 0.002000001\n"), "{out}");
    }
}
