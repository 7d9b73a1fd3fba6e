//! What a room is asked to do: one [`Intent`] per change, the same type in
//! both modes. Embedded mode applies it at once; cluster mode appends it to
//! the room's shared log (inside a [`LogRecord`](crate::cluster::record)) and
//! applies it when the log hands it back. Either way it reaches
//! [`RoomMachine::apply`](super::machine::RoomMachine::apply).

use plaza_core::{PublishParams, RoomError, ServerPublish};
use plaza_protocol::client::Op;
use plaza_protocol::server::ServerFrame;
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use tokio::sync::oneshot;

use super::answer;
use crate::metrics::ErrorCounter;
use crate::outbox::Outbox;

/// A change to a room, as asked for. Records are inputs, not outcomes: every
/// replica applies them to its own room and, the room being deterministic,
/// gets the same outcome.
#[derive(Debug, Serialize, Deserialize)]
// Externally tagged: an internally tagged enum buffers its fields, which
// `RawValue` payloads do not survive.
#[serde(rename_all = "snake_case")]
pub(crate) enum Intent {
    /// A member joins, or resumes with `resume` = (token, last seq).
    Join {
        session: String,
        resume_token: String,
        name: String,
        platform: String,
        /// The user id a verified token gave.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        user: Option<String>,
        channels: Vec<String>,
        ticket: bool,
        resume: Option<(String, u64)>,
        /// Set when the connection vouched for no new member (see
        /// `JoinParams::resume_only`): only a session without a user may be
        /// resumed, anything else gets this refusal.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        resume_only: Option<(plaza_protocol::ErrorCode, String)>,
        /// Its delivery policy (boxed: most joins have none).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        policy: Option<Box<plaza_core::policy::DeliveryPolicy>>,
        /// Past messages to put in `joined` (only the joining node uses it).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        history: Option<plaza_protocol::client::HistoryRequest>,
    },
    /// A member leaves for good.
    Leave { session: String },
    /// An admin removes a member for good, with a message for it.
    Kick {
        session: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        message: Option<String>,
    },
    /// A member's connection dropped (it may resume).
    Disconnect { session: String },
    /// A message.
    Publish {
        session: String,
        params: PublishParams,
    },
    /// A request, answered by `nonce`.
    Request {
        session: String,
        nonce: Box<RawValue>,
        op: Op,
    },
    /// A message for one session.
    Direct {
        session: String,
        to: String,
        event: String,
        data: Option<Box<RawValue>>,
    },
    /// A message of the application's backend (server API).
    ServerPublish { params: ServerPublish },
    /// An entity change of the application's backend (server API).
    ServerRequest { op: Op },
    /// A message of the application's backend for one session.
    ServerDirect {
        to: String,
        event: String,
        data: Option<Box<RawValue>>,
    },
    /// The clock moved: expire leases and resume windows due by the entry's time.
    Tick,
    /// `node` stopped renewing its heartbeat: its members are disconnected.
    NodeDown { node: String },
    /// The room was deleted.
    Close,
}

impl Intent {
    /// Whether applying it may change who is a member (and where).
    pub(crate) fn may_change_members(&self) -> bool {
        !matches!(
            self,
            Intent::Publish { .. }
                | Intent::Direct { .. }
                | Intent::ServerPublish { .. }
                | Intent::ServerRequest { .. }
                | Intent::ServerDirect { .. }
        )
    }
}

/// A client's command: the change and who waits for its outcome.
pub(crate) struct ClientCommand {
    pub(crate) intent: Intent,
    pub(crate) pending: Pending,
    /// When the connection handed it to the room: how long it waited for
    /// the room's task is `plaza_room_wait_seconds`.
    pub(crate) handed_at: std::time::Instant,
}

/// The session a join got, for its connection.
#[derive(Debug)]
pub(crate) struct JoinedSession {
    /// Its id.
    pub(crate) session: String,
    /// Whether it has no user (joined with a ticket and no token, or on a
    /// node without keys): it has a ticket's rights, whatever the token of
    /// the connection that resumed it grants.
    pub(crate) user_less: bool,
}

/// Who waits for the outcome of a command on this node: the connection's
/// outbox, and what its answer needs.
pub(crate) struct Pending {
    pub(crate) outbox: Outbox,
    pub(crate) waiter: Waiter,
}

/// The answer a command is owed.
pub(crate) enum Waiter {
    /// `joined` (or `resync`) then the missed events; the session to the connection.
    Join(oneshot::Sender<Result<JoinedSession, RoomError>>),
    /// `left`, whatever happened.
    Leave,
    /// `ack`, or an error naming the message id.
    Publish(Option<String>),
    /// `response` with the nonce.
    Request(Box<RawValue>),
    /// Nothing on success; an error otherwise.
    Direct,
    /// Nothing at all (a disconnect).
    Nothing,
    /// An admin call over HTTP (a kick): whether it was done.
    Admin(oneshot::Sender<Result<(), RoomError>>),
    /// A server API call over HTTP: its JSON answer.
    Server(oneshot::Sender<Result<serde_json::Value, RoomError>>),
}

impl Pending {
    /// The answer an admin call over HTTP waits for: no connection is
    /// behind it, so its outbox is one nothing reads.
    pub(crate) fn admin(reply: oneshot::Sender<Result<(), RoomError>>) -> Pending {
        let (outbox, _) = Outbox::new(1, crate::outbox::ConnectionControl::new());
        Pending {
            outbox,
            waiter: Waiter::Admin(reply),
        }
    }

    /// The answer a server API call waits for (see [`Pending::admin`]).
    pub(crate) fn server(reply: oneshot::Sender<Result<serde_json::Value, RoomError>>) -> Pending {
        let (outbox, _) = Outbox::new(1, crate::outbox::ConnectionControl::new());
        Pending {
            outbox,
            waiter: Waiter::Server(reply),
        }
    }

    /// Answers a server API call, if this is one.
    pub(crate) fn answer_server(self, answer: serde_json::Value) {
        if let Waiter::Server(reply) = self.waiter {
            let _ = reply.send(Ok(answer));
        }
    }

    /// The connection's number in this process.
    pub(crate) fn conn(&self) -> u64 {
        self.outbox.control().id()
    }

    /// Answers a command that will not be carried out (or was refused): the
    /// one place a refusal is sent, whoever refuses.
    pub(crate) fn refuse(self, room: &str, e: RoomError, errors: &ErrorCounter) {
        let frame = match self.waiter {
            Waiter::Join(reply) => {
                // The connection reports it (and counts it).
                let _ = reply.send(Err(e));
                return;
            }
            Waiter::Leave => {
                // The member is out as far as its connection is concerned.
                return self.answer_left(room);
            }
            Waiter::Nothing => return,
            Waiter::Admin(reply) => {
                let _ = reply.send(Err(e));
                return;
            }
            Waiter::Server(reply) => {
                let _ = reply.send(Err(e));
                return;
            }
            Waiter::Publish(id) => answer::error_frame(room, e.clone(), "publish", id),
            Waiter::Request(nonce) => answer::response(room, nonce, Err(e.clone())),
            Waiter::Direct => answer::error_frame(room, e.clone(), "direct", None),
        };
        errors.count(e.code);
        self.outbox.send(frame.encode());
    }

    /// Sends `left`.
    pub(crate) fn answer_left(&self, room: &str) {
        let frame = ServerFrame::Left {
            room: room.to_owned(),
        };
        self.outbox.send(frame.encode());
    }
}
