//! What a Plaza server says about itself in `/metrics`, read beside the
//! figures `plaza bench` measures from outside: its allocator's live and
//! resident bytes (RSS alone cannot tell live data from pages the allocator
//! keeps after a burst, and a soak's memory verdict needs that difference),
//! and the time events spend in its stages (a command's wait for its room's
//! task; an event's time from the room to the socket write), which split the
//! end-to-end latency the clients see. Other servers do not report these:
//! every reading is then `None`.

use std::net::SocketAddr;
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// One reading of Plaza's allocator gauges, in KiB.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AllocatorGauges {
    /// Bytes in live allocations (`plaza_allocator_allocated_bytes`).
    pub heap_kib: u64,
    /// Pages the allocator holds (`plaza_allocator_resident_bytes`).
    pub resident_kib: u64,
}

/// The two gauges in a Prometheus text page, or `None` when either is
/// missing (a peer server, or a Plaza built without the probe).
pub fn parse(page: &str) -> Option<AllocatorGauges> {
    let kib = |name: &str| value(page, name).map(|v| (v / 1024.0).round() as u64);
    Some(AllocatorGauges {
        heap_kib: kib("plaza_allocator_allocated_bytes")?,
        resident_kib: kib("plaza_allocator_resident_bytes")?,
    })
}

/// The value of the sample named exactly `name` (no labels), if finite and
/// not negative.
fn value(page: &str, name: &str) -> Option<f64> {
    page.lines()
        .filter(|l| !l.starts_with('#'))
        .find_map(|l| {
            let (metric, v) = l.split_once(char::is_whitespace)?;
            (metric == name).then(|| v.trim().parse::<f64>().ok())?
        })
        .filter(|v| v.is_finite() && *v >= 0.0)
}

/// A histogram's running totals: seconds summed, samples counted.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Totals {
    /// Seconds, summed over the samples.
    pub sum_s: f64,
    /// Samples.
    pub count: u64,
}

impl Totals {
    fn read(page: &str, histogram: &str) -> Option<Totals> {
        Some(Totals {
            sum_s: value(page, &format!("{histogram}_sum"))?,
            count: value(page, &format!("{histogram}_count"))? as u64,
        })
    }

    /// The mean of the samples taken since `before`, in ms.
    pub fn mean_ms_since(&self, before: &Totals) -> Option<f64> {
        let n = self.count.checked_sub(before.count).filter(|&n| n > 0)?;
        Some((self.sum_s - before.sum_s).max(0.0) / n as f64 * 1000.0)
    }
}

/// Where an event's time goes inside a Plaza server, as running totals.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct StageTotals {
    /// A client's command waiting for its room's task
    /// (`plaza_room_wait_seconds`).
    pub room_wait: Totals,
    /// An event from its room's ordering to the socket write, once per
    /// write batch (`plaza_delivery_latency_seconds`).
    pub to_write: Totals,
}

/// The stage histograms in a Prometheus text page; `None` when the page
/// lacks them (a peer server, or a Plaza older than the room-wait figure).
pub fn stages(page: &str) -> Option<StageTotals> {
    Some(StageTotals {
        room_wait: Totals::read(page, "plaza_room_wait_seconds")?,
        to_write: Totals::read(page, "plaza_delivery_latency_seconds")?,
    })
}

/// The stages' means over a recorded stretch, from the totals at its ends.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct StageMeans {
    /// Mean wait of a command for its room's task, ms.
    pub room_wait_ms: Option<f64>,
    /// Commands sampled.
    pub room_wait_samples: u64,
    /// Mean time from the room's ordering to the socket write (the oldest
    /// event of each write batch), ms.
    pub to_write_ms: Option<f64>,
    /// Write batches sampled.
    pub to_write_samples: u64,
}

impl StageMeans {
    /// The means between two readings.
    pub fn between(start: &StageTotals, end: &StageTotals) -> StageMeans {
        StageMeans {
            room_wait_ms: end.room_wait.mean_ms_since(&start.room_wait),
            room_wait_samples: end.room_wait.count.saturating_sub(start.room_wait.count),
            to_write_ms: end.to_write.mean_ms_since(&start.to_write),
            to_write_samples: end.to_write.count.saturating_sub(start.to_write.count),
        }
    }
}

/// Reads `http://addr/metrics` once (at most a second). `None` when the
/// server does not answer with a page.
pub async fn page(http: &reqwest::Client, addr: SocketAddr, host: &str) -> Option<String> {
    let resp = http
        .get(format!("http://{addr}/metrics"))
        .header(reqwest::header::HOST, host)
        .timeout(Duration::from_secs(1))
        .send()
        .await
        .ok()?;
    if !resp.status().is_success() {
        return None;
    }
    resp.text().await.ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_both_gauges_and_ignores_comments_and_look_alikes() {
        let page = "# HELP plaza_allocator_allocated_bytes Bytes in live allocations\n\
                    # TYPE plaza_allocator_allocated_bytes gauge\n\
                    plaza_allocator_allocated_bytes_total 1\n\
                    plaza_allocator_allocated_bytes 2097152\n\
                    plaza_allocator_resident_bytes 3.5e6\n";
        assert_eq!(
            parse(page),
            Some(AllocatorGauges {
                heap_kib: 2048,
                resident_kib: 3418
            })
        );
    }

    #[test]
    fn a_page_without_them_gives_none() {
        assert_eq!(parse("plaza_connections 3\n"), None);
        assert_eq!(parse("plaza_allocator_allocated_bytes 10\n"), None);
        assert_eq!(
            parse("plaza_allocator_allocated_bytes NaN\nplaza_allocator_resident_bytes 1\n"),
            None
        );
    }

    #[test]
    fn stage_means_come_from_the_totals_at_both_ends() {
        let at = |wait_sum: f64, wait_n: u64, write_sum: f64, write_n: u64| {
            format!(
                "plaza_room_wait_seconds_bucket{{le=\"0.001\"}} 1\n\
                 plaza_room_wait_seconds_sum {wait_sum}\n\
                 plaza_room_wait_seconds_count {wait_n}\n\
                 plaza_delivery_latency_seconds_sum {write_sum}\n\
                 plaza_delivery_latency_seconds_count {write_n}\n"
            )
        };
        let start = stages(&at(1.0, 100, 5.0, 1000)).unwrap();
        let end = stages(&at(1.5, 600, 9.0, 3000)).unwrap();
        let m = StageMeans::between(&start, &end);
        assert_eq!((m.room_wait_samples, m.to_write_samples), (500, 2000));
        assert!((m.room_wait_ms.unwrap() - 1.0).abs() < 1e-9, "{m:?}");
        assert!((m.to_write_ms.unwrap() - 2.0).abs() < 1e-9, "{m:?}");
        // Nothing sampled in between: no mean.
        assert_eq!(StageMeans::between(&end, &end).room_wait_ms, None);
        // A page without them (a peer, an older Plaza).
        assert_eq!(stages("plaza_delivery_latency_seconds_sum 1\n"), None);
    }
}
