//! A joined user's receiver: counts deliveries, times them for observers,
//! routes responses to their waiting requests.

use super::*;
use crate::driver::{self, Inbound};
use crate::transport::{Reader, Writer};
use crate::wsclient::Incoming;

/// What one receiver counts between two flushes into the shared counters.
pub(super) struct Tally {
    /// The observer's latency samples (µs) since the last flush; `None` for
    /// other users. A short buffer rather than a histogram per observer: a
    /// histogram is ~100 KB, and every user observes in idle-capacity runs.
    latency: Option<Vec<u64>>,
    /// Receipt time (unix µs) and recording flag of the current read, taken
    /// once, when its first message is handled: after the read, not before
    /// it waited for data.
    stamp: Option<(u64, bool)>,
    deliveries: u64,
    acks: u64,
    replies: Vec<String>,
    /// Proximity events since the last flush.
    proximity: u64,
    /// Whether the current read held a message (not only pings).
    got_message: bool,
    /// Messages (frames) since the last flush.
    frames: u64,
    /// What a chat reply to this user carries in its payload
    /// (`,"re":<vu>,`), and the reply latencies (µs) since the last flush.
    reply_tag: memchr::memmem::Finder<'static>,
    reply_latency: Vec<u64>,
}

impl Tally {
    fn message(&mut self, shared: &Shared, msg: &[u8]) {
        self.got_message = true;
        self.frames += 1;
        match shared.opts.driver.classify(msg, &mut self.replies) {
            Inbound::Deliveries(n) => {
                self.deliveries += n as u64;
                if let Some(h) = self.latency.as_mut() {
                    let (now, recording) = *self
                        .stamp
                        .get_or_insert_with(|| (unix_micros(), shared.recording()));
                    if !recording {
                    } else if n > 1 {
                        // A batch: each message's own send time.
                        for (sent, _) in driver::timestamps(msg) {
                            h.push(now.saturating_sub(sent).max(1));
                        }
                    } else if let Some(sent) = shared.opts.driver.sent_at_us(msg) {
                        h.push(now.saturating_sub(sent).max(1));
                    }
                }
                if let Some(at) = self.reply_tag.find(msg) {
                    let (now, recording) = *self
                        .stamp
                        .get_or_insert_with(|| (unix_micros(), shared.recording()));
                    let sent = driver::timestamps(msg)
                        .take_while(|&(_, end)| end <= at)
                        .last();
                    if let (true, Some((sent, _))) = (recording, sent) {
                        self.reply_latency.push(now.saturating_sub(sent).max(1));
                    }
                }
            }
            Inbound::Ack => {
                self.acks += 1;
                if let Some(chat) = &shared.chat_seqs {
                    if let Some((id, seq)) = shared.opts.driver.ack_id_seq(msg) {
                        chat.lock()
                            .unwrap_or_else(|p| p.into_inner())
                            .insert(id, seq);
                    }
                }
            }
            Inbound::Proximity => self.proximity += 1,
            Inbound::Response { nonce, ok } => {
                let waiter = shared
                    .pending
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .remove(&nonce);
                if let Some(w) = waiter {
                    let _ = w.send(ok);
                }
            }
            Inbound::Error(e) => shared.error(format!("server: {e}")),
            Inbound::Other => {}
        }
    }

    /// Adds what was counted since the last flush to the shared counters.
    fn flush(&mut self, shared: &Shared, bytes: u64) {
        let recording = match self.stamp.take() {
            Some((_, r)) => r,
            None => shared.recording(),
        };
        let deliveries = std::mem::take(&mut self.deliveries);
        shared
            .counts
            .deliveries_total
            .fetch_add(deliveries, Ordering::Relaxed);
        if recording {
            shared
                .counts
                .deliveries
                .fetch_add(deliveries, Ordering::Relaxed);
            shared.counts.bytes_in.fetch_add(bytes, Ordering::Relaxed);
        }
        let frames = std::mem::take(&mut self.frames);
        if recording {
            shared.counts.frames_in.fetch_add(frames, Ordering::Relaxed);
        }
        if !self.reply_latency.is_empty() {
            let mut h = shared
                .reply_latency
                .lock()
                .unwrap_or_else(|p| p.into_inner());
            for v in self.reply_latency.drain(..) {
                let _ = h.record(v);
            }
        }
        let proximity = std::mem::take(&mut self.proximity);
        if recording && proximity > 0 {
            shared
                .counts
                .proximity_events
                .fetch_add(proximity, Ordering::Relaxed);
        }
        let acks = std::mem::take(&mut self.acks);
        if acks > 0 {
            shared.counts.acks.fetch_add(acks, Ordering::Relaxed);
        }
        if let Some(samples) = self.latency.as_mut().filter(|s| !s.is_empty()) {
            let mut h = shared.latency.lock().unwrap_or_else(|p| p.into_inner());
            for v in samples.drain(..) {
                let _ = h.record(v);
            }
        }
    }
}

/// When a receiver last got a message. Handed to the run's latest when the
/// receiver ends, however it ends: dropping covers a receiver aborted by a
/// `disconnect` step too. One shared write per receiver, not per read.
pub(super) struct LastReceipt<'a> {
    shared: &'a Shared,
    at: Option<Instant>,
}

impl Drop for LastReceipt<'_> {
    fn drop(&mut self) {
        if let Some(at) = self.at {
            self.shared
                .ws_last_received
                .fetch_max(self.shared.unix_us(at), Ordering::Relaxed);
        }
    }
}

/// Receives until the run stops: counts deliveries, times them if this user
/// observes, routes responses, answers pings. `early` holds messages that
/// arrived with the end of the join handshake.
pub(super) async fn receive(
    shared: Arc<Shared>,
    vu: u64,
    mut reader: Reader,
    writer: Arc<tokio::sync::Mutex<Writer>>,
    observer: bool,
    early: Vec<Vec<u8>>,
) {
    let mut tally = Tally {
        latency: observer.then(Vec::new),
        stamp: None,
        deliveries: 0,
        proximity: 0,
        acks: 0,
        replies: Vec::new(),
        got_message: false,
        frames: 0,
        reply_tag: memchr::memmem::Finder::new(format!(",\"re\":{vu},").as_bytes()).into_owned(),
        reply_latency: Vec::new(),
    };
    for m in &early {
        tally.message(&shared, m);
    }
    tally.flush(&shared, 0);
    let mut last = LastReceipt {
        shared: &shared,
        at: None,
    };
    let mut pongs: Vec<Vec<u8>> = Vec::new();
    loop {
        let mut closed = None;
        let read = tokio::select! {
            _ = shared.stop.cancelled() => break,
            r = reader.read_some(|m| match m {
                Incoming::Message(b) => tally.message(&shared, b),
                Incoming::Ping(p) => pongs.push(p.to_vec()),
                Incoming::Close(c) => closed = Some(c),
            }) => r,
        };
        match read {
            Ok(0) => {
                shared.error("closed by server");
                break;
            }
            Ok(n) => {
                if std::mem::take(&mut tally.got_message) {
                    last.at = Some(Instant::now());
                }
                tally.flush(&shared, n as u64);
            }
            Err(e) => {
                shared.error(format!("read: {}", e.kind()));
                break;
            }
        }
        if let Some(code) = closed {
            shared.error(format!("closed by server: {code:?}"));
            break;
        }
        if !tally.replies.is_empty() || !pongs.is_empty() {
            let mut w = writer.lock().await;
            for r in tally.replies.drain(..) {
                let _ = w.send_text(r.as_bytes()).await;
            }
            for p in pongs.drain(..) {
                let _ = w.pong(&p).await;
            }
        }
    }
}
