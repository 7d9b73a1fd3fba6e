//! One client's session on any transport, from open to end.

use std::sync::Arc;

use plaza_protocol::CloseCode;
use tokio::time::Instant;

use super::liveness::{Due, Liveness};
use crate::connection::Connection;
use crate::outbox::{ConnectionControl, Outbox, OutboxReceiver};
use crate::Node;

/// What a transport holds for one client: the protocol state its frames go
/// to, the queue its frames come from, the heartbeat schedule, and the
/// node's count of open sessions.
pub(crate) struct ClientSession {
    pub(crate) node: Arc<Node>,
    conn: Connection,
    /// Shared with every outbox handle: closing it ends the session.
    pub(crate) control: Arc<ConnectionControl>,
    /// The frames to send, queued by rooms.
    pub(crate) queue: OutboxReceiver,
    liveness: Liveness,
}

/// What a transport must do at a heartbeat deadline.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Heartbeat {
    /// Nothing.
    Nothing,
    /// Send the transport's ping.
    Ping,
    /// The client went silent: the session is closed (4001).
    Expired,
}

impl ClientSession {
    /// Opens a session on `node` for a client at `peer` (counted until
    /// [`ClientSession::finish`]), which gets room messages in the compact
    /// form if `compact`.
    pub(crate) fn open(
        node: Arc<Node>,
        peer: Option<std::net::IpAddr>,
        compact: bool,
    ) -> ClientSession {
        node.connection_opened();
        let config = node.config();
        let control = ConnectionControl::with_compact(compact);
        node.session_opened(&control);
        let (outbox, queue) = Outbox::new(config.send_queue_frames, control.clone());
        let liveness = Liveness::new(
            std::time::Duration::from_millis(config.heartbeat_interval_ms),
            std::time::Duration::from_millis(config.idle_timeout_ms),
            Instant::now(),
        );
        ClientSession {
            conn: Connection::new(node.clone(), outbox, control.clone(), peer),
            node,
            control,
            queue,
            liveness,
        }
    }

    /// Verifies the token the client gave on connect (`?token=`), as an
    /// `auth` frame would: the answer is the session's first frame.
    pub(crate) fn authenticate(&mut self, token: &str) {
        self.conn.authenticate(token);
    }

    /// Handles one complete client message.
    pub(crate) async fn receive(&mut self, message: &[u8]) {
        // Boxed: the frame handler's state (~1.6 KB) is allocated only while
        // a frame is handled, not kept in every idle session's task.
        Box::pin(self.conn.on_frame(message)).await
    }

    /// Bytes arrived from the client.
    pub(crate) fn heard(&mut self) {
        self.liveness.heard(Instant::now());
    }

    /// The next heartbeat deadline.
    pub(crate) fn heartbeat_deadline(&self) -> Instant {
        self.liveness.deadline()
    }

    /// What the heartbeat deadline asks for; an expired session is closed.
    pub(crate) fn heartbeat(&mut self, now: Instant) -> Heartbeat {
        match self.liveness.due(now) {
            Due::Nothing => Heartbeat::Nothing,
            Due::Ping => Heartbeat::Ping,
            Due::Expired => {
                self.control.close(CloseCode::HeartbeatTimeout);
                Heartbeat::Expired
            }
        }
    }

    /// The session is ending: its members are disconnected (they may
    /// resume). Returns the close code when the server closed it.
    pub(crate) async fn disconnect(&mut self) -> Option<u16> {
        self.conn.disconnect_all().await;
        let code = self.control.close_code();
        if code == Some(CloseCode::SlowConsumer.code()) {
            self.node.metrics.slow_consumers.increment(1);
        }
        code
    }

    /// The session is over: nothing more is queued for it and it no longer counts.
    pub(crate) fn finish(self) {
        self.control.close(CloseCode::Normal);
        self.node.session_closed(&self.control);
        let node = self.node.clone();
        drop(self);
        node.connection_closed();
    }
}
