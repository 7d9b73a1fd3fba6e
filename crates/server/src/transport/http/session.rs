//! One HTTP transport session (SSE or long polling): the task that owns its
//! [`ClientSession`], and the buffer of numbered frames its requests read.
//!
//! HTTP requests come and go; the session outlives them. Client frames
//! arrive by `POST` and go to the task in order; the task moves what rooms
//! queue into a buffer of frames numbered from 1, which an event stream or a
//! poll reads from a position. A frame stays buffered until the client says
//! it has it (a poll's `ack`, a stream's `Last-Event-ID`), so a response lost
//! on the way is sent again; frames a stream has sent are dropped first when
//! the buffer is full, frames never sent close the session as a slow
//! consumer (4002), as on WebSocket.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use plaza_protocol::CloseCode;
use tokio::sync::{mpsc, Notify};
use tokio::time::Instant;

use super::super::session::ClientSession;
use crate::outbox::ConnectionControl;
use crate::Node;

/// Client messages waiting for the session task, at most.
const INBOUND: usize = 64;

/// What the request handlers share with the session's task.
pub(crate) struct HttpSession {
    /// The unguessable id that names (and is the secret of) the session.
    pub(crate) id: String,
    inbound: mpsc::Sender<Bytes>,
    pub(crate) out: Mutex<OutBuffer>,
    /// Signalled when frames are added or the session ends.
    pub(crate) changed: Notify,
    /// A poll or event stream is reading (one at a time).
    pub(crate) reading: AtomicBool,
    /// When a request last came (ms since the session opened).
    last_heard_ms: AtomicU64,
    opened: Instant,
    control: Arc<ConnectionControl>,
}

/// A frame in a session's buffer.
pub(crate) struct Numbered {
    /// Its position (frames are numbered from 1).
    pub(crate) pos: u64,
    pub(crate) frame: Bytes,
    /// When its room ordered it, for a live room event: the delivery
    /// latency is sampled when it is first sent.
    ordered_at: Option<std::time::Instant>,
}

/// What a response sends, for the node's delivery metrics.
pub(crate) struct Sending {
    /// Frames in it.
    pub(crate) frames: u64,
    /// When the oldest live event sent for the first time was ordered: a
    /// frame sent again (its response was lost) is no new delivery.
    pub(crate) oldest: Option<std::time::Instant>,
}

impl Sending {
    /// Counts a response of `bytes` carrying these frames, as a WebSocket
    /// write is counted.
    pub(crate) fn count(self, node: &Node, bytes: usize) {
        if self.frames == 0 {
            return;
        }
        let latency = self
            .oldest
            .map(|t| std::time::Instant::now().saturating_duration_since(t));
        node.metrics.wrote(self.frames, bytes as u64, latency);
    }
}

/// The numbered frames of a session.
#[derive(Default)]
pub(crate) struct OutBuffer {
    /// Frames after the last one acknowledged.
    pub(crate) frames: VecDeque<Numbered>,
    /// The position the next frame gets (frames are numbered from 1).
    pub(crate) next: u64,
    /// The highest position handed to a reader (see [`OutBuffer::send`]).
    sent: u64,
    /// Set when the session has ended: its close code.
    pub(crate) ended: Option<u16>,
    /// The position of the last event a resume replayed: frames up to it
    /// are held over and above the bound (see `Outbox::replay`).
    pub(crate) replay_end: u64,
}

impl OutBuffer {
    /// Frames held up to the end of the last replay: allowed beyond the bound.
    fn replays_held(&self) -> usize {
        self.frames
            .iter()
            .take_while(|f| f.pos <= self.replay_end)
            .count()
    }

    /// Appends a frame at the next position.
    fn push(&mut self, frame: Bytes, ordered_at: Option<std::time::Instant>) -> u64 {
        let pos = self.next;
        self.next += 1;
        self.frames.push_back(Numbered {
            pos,
            frame,
            ordered_at,
        });
        pos
    }

    /// Drops the frames up to `pos`: the client has them.
    pub(crate) fn ack(&mut self, pos: u64) {
        while self.frames.front().is_some_and(|f| f.pos <= pos) {
            self.frames.pop_front();
        }
    }

    /// The first position still held (`next` when none is).
    pub(crate) fn first(&self) -> u64 {
        self.frames.front().map_or(self.next, |f| f.pos)
    }

    /// The frames after `from` go to a reader, up to and including `to`:
    /// they may be let go once the buffer is full. Returns what is sent,
    /// for the metrics.
    pub(crate) fn send(&mut self, from: u64, to: u64) -> Sending {
        let mut sending = Sending {
            frames: 0,
            oldest: None,
        };
        for f in self.frames.iter().filter(|f| f.pos > from && f.pos <= to) {
            sending.frames += 1;
            if f.pos > self.sent {
                if let Some(t) = f.ordered_at {
                    sending.oldest =
                        Some(sending.oldest.map_or(t, |o: std::time::Instant| o.min(t)));
                }
            }
        }
        self.sent = self.sent.max(to);
        sending
    }
}

/// Why a frame could not be handed to the session.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum SendError {
    /// The session has ended.
    Ended,
}

impl HttpSession {
    /// Passes one client message to the session, in order.
    pub(crate) async fn send(&self, message: Bytes) -> Result<(), SendError> {
        self.heard();
        self.inbound
            .send(message)
            .await
            .map_err(|_| SendError::Ended)
    }

    /// Ends the session (`DELETE`): its rooms' sessions stay resumable.
    pub(crate) fn close(&self) {
        self.control.close(CloseCode::Normal);
    }

    /// A request came.
    pub(crate) fn heard(&self) {
        let ms = self.opened.elapsed().as_millis() as u64;
        self.last_heard_ms.fetch_max(ms, Ordering::Relaxed);
    }

    fn silent_for(&self) -> Duration {
        let heard = Duration::from_millis(self.last_heard_ms.load(Ordering::Relaxed));
        self.opened.elapsed().saturating_sub(heard)
    }
}

/// Opens a session on `node` and starts its task; `on_end` runs when it ends.
pub(crate) fn open(
    node: Arc<Node>,
    id: String,
    peer: Option<std::net::IpAddr>,
    token: Option<String>,
    on_end: impl FnOnce(&str) + Send + 'static,
) -> Arc<HttpSession> {
    let (tx, rx) = mpsc::channel(INBOUND);
    let mut client = ClientSession::open(node, peer, false);
    if let Some(t) = token {
        client.authenticate(&t);
    }
    let session = Arc::new(HttpSession {
        control: client.control.clone(),
        id,
        inbound: tx,
        out: Mutex::new(OutBuffer {
            next: 1,
            ..OutBuffer::default()
        }),
        changed: Notify::new(),
        reading: AtomicBool::new(false),
        last_heard_ms: AtomicU64::new(0),
        opened: Instant::now(),
    });
    let shared = session.clone();
    tokio::spawn(async move {
        run(client, &shared, rx).await;
        on_end(&shared.id);
    });
    session
}

/// The session's life: client messages in, room frames out, until it is
/// closed, the node shuts down, or the client stays silent too long.
async fn run(mut client: ClientSession, shared: &HttpSession, mut rx: mpsc::Receiver<Bytes>) {
    let config = client.node.config();
    let idle = Duration::from_millis(config.idle_timeout_ms);
    let limit = config.send_queue_frames.max(1);
    // Shutdown closes the session through its control (1012), like any close.
    let control = client.control.clone();
    loop {
        // A reader waiting counts as the client being there.
        let silent = if shared.reading.load(Ordering::Relaxed) {
            Duration::ZERO
        } else {
            shared.silent_for()
        };
        let expiry = Instant::now() + idle.saturating_sub(silent);
        tokio::select! {
            biased;
            _ = control.closed.cancelled() => break,
            message = rx.recv() => match message {
                Some(m) => client.receive(&m).await,
                None => break,
            },
            () = client.queue.ready() => {
                let batch = client.queue.take_batch(usize::MAX);
                let mut out = shared.out.lock().unwrap_or_else(|p| p.into_inner());
                for item in batch {
                    let pos = out.push(item.frame().clone(), item.ordered_at());
                    if item.is_replayed() {
                        out.replay_end = pos;
                    }
                }
                // Room for what comes: drop what a reader already sent
                // (a reconnect cannot ask for it again), else the client
                // does not keep up.
                while out.frames.len() > limit + out.replays_held()
                    && out.frames.front().is_some_and(|f| f.pos <= out.sent)
                {
                    out.frames.pop_front();
                }
                let full = out.frames.len() > limit + out.replays_held();
                drop(out);
                shared.changed.notify_waiters();
                if full {
                    control.close(CloseCode::SlowConsumer);
                    break;
                }
            }
            _ = tokio::time::sleep_until(expiry) => {
                if !shared.reading.load(Ordering::Relaxed) && shared.silent_for() >= idle {
                    control.close(CloseCode::HeartbeatTimeout);
                    break;
                }
            }
        }
    }
    let code = client.disconnect().await;
    {
        let mut out = shared.out.lock().unwrap_or_else(|p| p.into_inner());
        // What was queued before the close (the error that explains it, say)
        // can still be read; a slow consumer's backlog is not kept.
        if code != Some(CloseCode::SlowConsumer.code()) {
            for item in client.queue.take_batch(super::super::LAST_FRAMES) {
                out.push(item.frame().clone(), item.ordered_at());
            }
        }
        out.ended = Some(code.unwrap_or(CloseCode::Normal.code()));
    }
    shared.changed.notify_waiters();
    client.finish();
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A response counts every frame it carries, and samples the latency
    /// only from live events sent for the first time: a frame sent again
    /// (its response was lost) is no new delivery.
    #[test]
    fn a_frame_sent_again_counts_as_a_frame_but_not_as_a_delivery() {
        let t0 = std::time::Instant::now();
        let at = |ms| Some(t0 + Duration::from_millis(ms));
        let mut out = OutBuffer {
            next: 1,
            ..OutBuffer::default()
        };
        out.push(Bytes::from_static(b"ack"), None);
        out.push(Bytes::from_static(b"e2"), at(2));
        out.push(Bytes::from_static(b"e3"), at(3));
        let first = out.send(0, 2);
        assert_eq!((first.frames, first.oldest), (2, at(2)));
        // The response was lost: the client polls from 0 again, and e4 came.
        out.push(Bytes::from_static(b"e4"), at(1));
        let again = out.send(0, 4);
        assert_eq!((again.frames, again.oldest), (4, at(1)));
        // Nothing new: no sample.
        let resent = out.send(2, 4);
        assert_eq!((resent.frames, resent.oldest), (2, None));
    }
}
