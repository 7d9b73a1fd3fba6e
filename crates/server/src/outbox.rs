//! A connection's bounded send queue.
//!
//! Room tasks push already-encoded frames with [`Outbox::send`], which never
//! waits: if the queue is full the connection is marked a slow consumer and
//! closed (close code 4002), so one slow client can never stall a room or grow
//! the server's memory without bound. The client resumes and catches up from
//! the room history.

use std::sync::atomic::{AtomicU16, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use bytes::Bytes;
use plaza_protocol::CloseCode;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

/// One queued frame. `ordered_at` is shared by every copy of an event, taken
/// once when it was ordered, so latency sampling costs nothing per recipient.
#[derive(Debug)]
pub struct Outgoing {
    /// The encoded frame.
    pub frame: Bytes,
    /// When the room ordered it, if it is a room event.
    pub ordered_at: Option<Instant>,
}

/// State shared by a connection's reader, writer and every outbox handle.
#[derive(Debug)]
pub struct ConnectionControl {
    /// Cancelled when the connection must close.
    pub closed: CancellationToken,
    close_code: AtomicU16,
    /// Rooms whose session on this connection was taken over by a resume on
    /// another connection; the reader forgets them.
    evicted: Mutex<Vec<String>>,
}

impl ConnectionControl {
    /// A live connection.
    pub fn new() -> Arc<Self> {
        Arc::new(ConnectionControl {
            closed: CancellationToken::new(),
            close_code: AtomicU16::new(0),
            evicted: Mutex::new(Vec::new()),
        })
    }

    /// Notes that this connection's session in `room` now lives on another connection.
    pub fn evict(&self, room: &str) {
        self.evicted
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(room.to_owned());
    }

    /// Takes the rooms evicted since the last call.
    pub fn take_evicted(&self) -> Vec<String> {
        std::mem::take(&mut *self.evicted.lock().unwrap_or_else(|p| p.into_inner()))
    }

    /// Closes the connection with `code`, unless it is closing already.
    pub fn close(&self, code: CloseCode) {
        if self
            .close_code
            .compare_exchange(0, code.code(), Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
        {
            self.closed.cancel();
        }
    }

    /// The close code, once closing.
    pub fn close_code(&self) -> Option<u16> {
        match self.close_code.load(Ordering::Acquire) {
            0 => None,
            c => Some(c),
        }
    }
}

/// A cheap, clonable handle that queues frames for one connection.
#[derive(Debug, Clone)]
pub struct Outbox {
    tx: mpsc::Sender<Outgoing>,
    control: Arc<ConnectionControl>,
}

/// The receiving end, owned by the connection's writer.
pub type OutboxReceiver = mpsc::Receiver<Outgoing>;

impl Outbox {
    /// A queue holding at most `capacity` frames.
    pub fn new(capacity: usize, control: Arc<ConnectionControl>) -> (Outbox, OutboxReceiver) {
        let (tx, rx) = mpsc::channel(capacity.max(1));
        (Outbox { tx, control }, rx)
    }

    /// Queues a frame without waiting. Returns false if the connection is
    /// gone or was just closed as a slow consumer.
    pub fn send(&self, frame: Bytes, ordered_at: Option<Instant>) -> bool {
        match self.tx.try_send(Outgoing { frame, ordered_at }) {
            Ok(()) => true,
            Err(mpsc::error::TrySendError::Full(_)) => {
                self.control.close(CloseCode::SlowConsumer);
                false
            }
            Err(mpsc::error::TrySendError::Closed(_)) => false,
        }
    }

    /// The connection this outbox feeds.
    pub fn control(&self) -> &Arc<ConnectionControl> {
        &self.control
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_queue_closes_the_connection_as_slow_consumer() {
        let control = ConnectionControl::new();
        let (out, mut rx) = Outbox::new(2, control.clone());
        assert!(out.send(Bytes::from_static(b"1"), None));
        assert!(out.send(Bytes::from_static(b"2"), None));
        assert!(!out.send(Bytes::from_static(b"3"), None));
        assert_eq!(control.close_code(), Some(CloseCode::SlowConsumer.code()));
        assert!(control.closed.is_cancelled());
        assert_eq!(rx.try_recv().unwrap().frame, "1");
        // a later close does not overwrite the first reason
        control.close(CloseCode::Restarting);
        assert_eq!(control.close_code(), Some(4002));
    }
}
