//! Closing a connection whose token expired: one timer per connection with
//! an identity, moved forward by every refreshed token.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use plaza_core::Millis;
use plaza_protocol::server::ServerFrame;
use plaza_protocol::{CloseCode, ErrorCode};

use crate::clock::now_ms;
use crate::outbox::{ConnectionControl, Outbox};

/// The expiry of a connection's identity, watched by a task of its own
/// (whatever the transport) until the connection closes.
pub(crate) struct ExpiryWatch {
    expires_at: Arc<AtomicU64>,
}

impl ExpiryWatch {
    /// Starts watching: at `expires_at` (Unix ms) the client gets a
    /// `token_expired` error and the connection closes with 4004.
    pub(crate) fn start(
        expires_at: Millis,
        outbox: Outbox,
        control: Arc<ConnectionControl>,
    ) -> ExpiryWatch {
        let at = Arc::new(AtomicU64::new(expires_at));
        tokio::spawn(watch(at.clone(), outbox, control));
        ExpiryWatch { expires_at: at }
    }

    /// A refreshed token moved the expiry.
    pub(crate) fn extend(&self, expires_at: Millis) {
        self.expires_at.store(expires_at, Ordering::Release);
    }
}

async fn watch(at: Arc<AtomicU64>, outbox: Outbox, control: Arc<ConnectionControl>) {
    loop {
        let (deadline, now) = (at.load(Ordering::Acquire), now_ms());
        if deadline <= now {
            let frame = ServerFrame::Error {
                code: ErrorCode::TokenExpired,
                message: "the token expired; reconnect with a fresh one and resume".into(),
                reference: None,
            };
            outbox.send(frame.encode());
            control.close(CloseCode::TokenExpired);
            return;
        }
        tokio::select! {
            _ = control.closed.cancelled() => return,
            // Then the deadline is read again: a refresh may have moved it.
            _ = tokio::time::sleep(Duration::from_millis(deadline - now)) => {}
        }
    }
}
