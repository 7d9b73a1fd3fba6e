//! The server allocator's own figures, read from a Plaza server's `/metrics`
//! beside its RSS: RSS alone cannot tell live data from pages the allocator
//! keeps after a burst, and a soak's memory verdict needs that difference.

use std::net::SocketAddr;
use std::time::Duration;

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
    let value = |name: &str| {
        page.lines()
            .filter(|l| !l.starts_with('#'))
            .find_map(|l| {
                let (metric, v) = l.split_once(char::is_whitespace)?;
                (metric == name).then(|| v.trim().parse::<f64>().ok())?
            })
            .filter(|v| v.is_finite() && *v >= 0.0)
            .map(|v| (v / 1024.0).round() as u64)
    };
    Some(AllocatorGauges {
        heap_kib: value("plaza_allocator_allocated_bytes")?,
        resident_kib: value("plaza_allocator_resident_bytes")?,
    })
}

/// Scrapes `http://addr/metrics` once (at most a second). `None` when the
/// server does not answer or does not report the gauges.
pub async fn scrape(
    http: &reqwest::Client,
    addr: SocketAddr,
    host: &str,
) -> Option<AllocatorGauges> {
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
    parse(&resp.text().await.ok()?)
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
}
