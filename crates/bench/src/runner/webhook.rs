//! The run's own webhook endpoint ([`crate::scenario::WebhookReceiver`]): a
//! minimal HTTP/1.1 server on kept-alive connections that answers every
//! POST with 204, counts it, and times it from the send timestamp (`"bt":`)
//! its message carries to its receipt.

use std::collections::HashSet;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use super::*;

/// What the receiver keeps besides the shared counters.
#[derive(Default)]
pub(super) struct WebhookTally {
    /// Latency samples (µs) while recording.
    pub(super) latency: Mutex<Option<Histogram<u64>>>,
    /// Requests by event type.
    pub(super) types: Mutex<BTreeMap<String, u64>>,
    /// Every `webhook-id` seen.
    ids: Mutex<HashSet<Box<[u8]>>>,
    /// The channels whose messages the server sends.
    pub(super) channels: Vec<String>,
}

impl WebhookTally {
    pub(super) fn new(channels: Vec<String>) -> WebhookTally {
        WebhookTally {
            latency: Mutex::new(Some(histogram())),
            channels,
            ..WebhookTally::default()
        }
    }

    /// Whether a message on `channel` (`None`: main) becomes a webhook event.
    pub(super) fn wants(&self, channel: Option<&str>) -> bool {
        let ch = channel.unwrap_or(plaza_protocol::DEFAULT_CHANNEL);
        self.channels.iter().any(|c| c == ch || c == "*")
    }
}

/// Binds the receiver's address (before the run starts, so that a taken
/// port fails the run at once).
pub(super) async fn bind(listen: &str) -> Result<TcpListener, RunError> {
    TcpListener::bind(listen)
        .await
        .map_err(|e| RunError::Setup(format!("webhook receiver {listen}: {e}")))
}

/// Accepts connections until the run stops.
pub(super) async fn serve(shared: Arc<Shared>, listener: TcpListener) {
    loop {
        let accepted = tokio::select! {
            _ = shared.stop.cancelled() => return,
            a = listener.accept() => a,
        };
        match accepted {
            Ok((sock, _)) => {
                let _ = sock.set_nodelay(true);
                tokio::spawn(connection(shared.clone(), sock));
            }
            Err(e) => shared.error(format!("webhook receiver: accept: {}", e.kind())),
        }
    }
}

/// One kept-alive connection: request after request, each answered 204.
async fn connection(shared: Arc<Shared>, mut sock: TcpStream) {
    let mut buf: Vec<u8> = Vec::with_capacity(16 * 1024);
    let mut chunk = vec![0u8; 16 * 1024];
    loop {
        // The head.
        let head_end = loop {
            if let Some(at) = memchr::memmem::find(&buf, b"\r\n\r\n") {
                break at + 4;
            }
            let n = tokio::select! {
                _ = shared.stop.cancelled() => return,
                r = sock.read(&mut chunk) => r,
            };
            match n {
                Ok(0) | Err(_) => return,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
        };
        let head = &buf[..head_end];
        let Some(len) = header(head, b"content-length")
            .and_then(|v| std::str::from_utf8(v).ok()?.trim().parse::<usize>().ok())
        else {
            shared.error("webhook receiver: a request without content-length");
            let _ = sock
                .write_all(b"HTTP/1.1 411 Length Required\r\ncontent-length: 0\r\nconnection: close\r\n\r\n")
                .await;
            return;
        };
        while buf.len() < head_end + len {
            let n = tokio::select! {
                _ = shared.stop.cancelled() => return,
                r = sock.read(&mut chunk) => r,
            };
            match n {
                Ok(0) | Err(_) => return,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
        }
        let now = unix_micros();
        received(
            &shared,
            &buf[..head_end],
            &buf[head_end..head_end + len],
            now,
        );
        buf.drain(..head_end + len);
        if sock
            .write_all(b"HTTP/1.1 204 No Content\r\n\r\n")
            .await
            .is_err()
        {
            return;
        }
    }
}

/// Counts one request received at `now` (unix µs).
fn received(shared: &Shared, head: &[u8], body: &[u8], now: u64) {
    let Some(tally) = &shared.webhooks else {
        return;
    };
    let c = &shared.counts;
    c.webhooks_received_total.fetch_add(1, Ordering::Relaxed);
    let recording = shared.recording();
    if recording {
        c.webhooks_received.fetch_add(1, Ordering::Relaxed);
    }
    if let Some(id) = header(head, b"webhook-id") {
        let new = tally
            .ids
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(id.into());
        if new {
            c.webhooks_distinct_total.fetch_add(1, Ordering::Relaxed);
        }
    }
    let kind = event_type(body).unwrap_or("?");
    *tally
        .types
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .entry(kind.to_owned())
        .or_default() += 1;
    if recording {
        if let Some(sent) = crate::driver::first_timestamp(body) {
            if let Some(h) = tally
                .latency
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .as_mut()
            {
                let _ = h.record(now.saturating_sub(sent).max(1));
            }
        }
    }
}

/// The value of header `name` (lower case) in a request head.
fn header<'a>(head: &'a [u8], name: &[u8]) -> Option<&'a [u8]> {
    head.split(|&b| b == b'\n').skip(1).find_map(|line| {
        let colon = line.iter().position(|&b| b == b':')?;
        line[..colon]
            .eq_ignore_ascii_case(name)
            .then(|| line[colon + 1..].trim_ascii())
    })
}

/// The body's `"type"` (the first key Plaza writes).
fn event_type(body: &[u8]) -> Option<&str> {
    let at = memchr::memmem::find(body, br#""type":""#)? + 8;
    let end = memchr::memchr(b'"', &body[at..])?;
    std::str::from_utf8(&body[at..at + end]).ok()
}

/// The `plaza_webhook_*` series of a metrics page (`name{labels}` → value).
pub(super) fn server_metrics(page: &str) -> BTreeMap<String, f64> {
    page.lines()
        .filter(|l| l.starts_with("plaza_webhook_"))
        .filter_map(|l| {
            let (series, value) = l.rsplit_once(' ')?;
            Some((series.to_owned(), value.parse().ok()?))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headers_and_types_are_read_from_the_request() {
        let head = b"POST /hook HTTP/1.1\r\nContent-Length: 12\r\nwebhook-id: r:1:7\r\n\r\n";
        assert_eq!(header(head, b"content-length"), Some(&b"12"[..]));
        assert_eq!(header(head, b"webhook-id"), Some(&b"r:1:7"[..]));
        assert_eq!(header(head, b"host"), None);
        let body = br#"{"type":"message.published","timestamp":"x","data":{"data":{"bt":5}}}"#;
        assert_eq!(event_type(body), Some("message.published"));
        assert_eq!(crate::driver::first_timestamp(body), Some(5));
        let page =
            "# TYPE x counter\nplaza_webhook_delivered_total{target=\"bench\"} 42\nplaza_rooms 3\n";
        let m = server_metrics(page);
        assert_eq!(m.len(), 1);
        assert_eq!(m["plaza_webhook_delivered_total{target=\"bench\"}"], 42.0);
    }
}
