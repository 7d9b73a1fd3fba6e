//! Rooms on this node: the commands they take, the handle connections hold,
//! and the one path that applies a command ([`machine::RoomMachine`]).
//!
//! A room is owned by one task, so its order is its mailbox's order with no
//! lock on the hot path. In embedded mode that task is [`embedded`]'s, which
//! applies each command at once; in cluster mode it is the room's replica
//! (`crate::cluster`), which applies commands in the shared log's order.

pub(crate) mod answer;
pub(crate) mod command;
mod compact_key;
pub(crate) mod embedded;
mod flush;
pub(crate) mod hooks;
pub(crate) mod info;
pub(crate) mod machine;
pub(crate) mod sink;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use tokio::sync::{mpsc, oneshot};

pub(crate) use command::{ClientCommand, Intent, Pending, Waiter};
pub(crate) use info::RoomInfo;
pub use info::RoomSummary;
pub(crate) use sink::Sink;

/// Commands a room task accepts.
pub(crate) enum RoomCommand {
    /// A client's command (boxed: see below).
    Client(Box<ClientCommand>),
    /// Delete the room (embedded mode; cluster mode deletes through the
    /// registry, and answers at once).
    Close { done: oneshot::Sender<()> },
    /// The connected members, for an admin (`GET /v1/rooms/{id}/members`).
    Members {
        reply: oneshot::Sender<Vec<plaza_protocol::server::MemberInfo>>,
    },
    /// A look at the room as this node holds it (server API reads: state,
    /// history, a user's sessions), run on the room's task. Nothing is
    /// logged: it changes nothing.
    Read(RoomLook),
}

/// A look at a room, run on its task (see [`RoomCommand::Read`]).
pub(crate) type RoomLook = Box<dyn FnOnce(&plaza_core::Room<Sink>) + Send>;

// The client's command is boxed: a room's mailbox allocates its slots in
// blocks of 32 commands up front, so every byte of `RoomCommand` costs 32
// bytes in every room, busy or not.

impl RoomCommand {
    /// A client's command.
    pub(crate) fn client(intent: Intent, pending: Pending) -> RoomCommand {
        RoomCommand::Client(Box::new(ClientCommand {
            intent,
            pending,
            handed_at: std::time::Instant::now(),
        }))
    }

    /// Answers a command that will not be carried out.
    pub(crate) fn refuse(
        self,
        room: &str,
        e: plaza_core::RoomError,
        errors: &crate::metrics::ErrorCounter,
    ) {
        match self {
            RoomCommand::Client(c) => c.pending.refuse(room, e, errors),
            RoomCommand::Close { done } => {
                let _ = done.send(());
            }
            // Dropped unanswered: the caller reads that as a room gone.
            RoomCommand::Members { .. } | RoomCommand::Read(_) => {}
        }
    }
}

/// A cheap handle to a room task: one pointer, since every connection keeps
/// one per joined room.
#[derive(Clone)]
pub(crate) struct RoomHandle(Arc<RoomShared>);

/// What every handle of one room shares.
struct RoomShared {
    id: Box<str>,
    info: RoomInfo,
    members: Arc<AtomicUsize>,
    tx: mpsc::Sender<RoomCommand>,
}

/// Room mailbox length: readers wait when it is full, pushing back on clients.
const MAILBOX: usize = 4096;

/// A handle and the mailbox its task reads; `members` is the count the task keeps.
pub(crate) fn mailbox(
    id: &str,
    info: RoomInfo,
    members: Arc<AtomicUsize>,
) -> (RoomHandle, mpsc::Receiver<RoomCommand>) {
    let (tx, rx) = mpsc::channel(MAILBOX);
    let handle = RoomHandle(Arc::new(RoomShared {
        id: id.into(),
        info,
        members,
        tx,
    }));
    (handle, rx)
}

impl RoomHandle {
    /// The room's id.
    pub(crate) fn id(&self) -> &str {
        &self.0.id
    }

    /// The room's summary, with the member count its task keeps.
    pub(crate) fn summary(&self) -> RoomSummary {
        self.0
            .info
            .summary(&self.0.id, self.0.members.load(Ordering::Relaxed))
    }

    /// Whether the room's task ended (it takes no more commands).
    pub(crate) fn is_closed(&self) -> bool {
        self.0.tx.is_closed()
    }

    /// Sends a command, waiting while the mailbox is full; gives the command
    /// back when the room is gone.
    pub(crate) async fn send(&self, cmd: RoomCommand) -> Result<(), RoomCommand> {
        self.0.tx.send(cmd).await.map_err(|e| e.0)
    }

    /// Deletes the room and waits until its members were told.
    pub(crate) async fn close(&self) {
        let (done, wait) = oneshot::channel();
        if self.0.tx.send(RoomCommand::Close { done }).await.is_ok() {
            let _ = wait.await;
        }
    }

    /// Removes a member for good, telling it `message`; an error if there
    /// is no such session (or the room is gone).
    pub(crate) async fn kick(
        &self,
        session: String,
        message: Option<String>,
    ) -> Result<(), plaza_core::RoomError> {
        let (reply, answer) = oneshot::channel();
        let cmd = RoomCommand::client(Intent::Kick { session, message }, Pending::admin(reply));
        let gone = || answer::room_deleted(&self.0.id);
        if self.0.tx.send(cmd).await.is_err() {
            return Err(gone());
        }
        answer.await.unwrap_or_else(|_| Err(gone()))
    }

    /// Runs `look` on the room's task and gives back what it returns;
    /// `None` if the room is gone.
    pub(crate) async fn read<T: Send + 'static>(
        &self,
        look: impl FnOnce(&plaza_core::Room<Sink>) -> T + Send + 'static,
    ) -> Option<T> {
        let (reply, answer) = oneshot::channel();
        let cmd = RoomCommand::Read(Box::new(move |room| {
            let _ = reply.send(look(room));
        }));
        self.0.tx.send(cmd).await.ok()?;
        answer.await.ok()
    }

    /// Whether both handles are of the same room task.
    pub(crate) fn same(&self, other: &RoomHandle) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

/// Sleeps until `deadline`, or for ever without one.
pub(crate) async fn sleep_until(deadline: Option<tokio::time::Instant>) {
    match deadline {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    /// A room's mailbox allocates its slots 32 at a time, up front: every
    /// byte of a command costs 32 bytes in every room. Large payloads are
    /// boxed to keep it so.
    #[test]
    fn room_commands_stay_small() {
        let size = std::mem::size_of::<super::RoomCommand>();
        assert!(size <= 64, "RoomCommand has {size} bytes");
        assert_eq!(std::mem::size_of::<super::RoomHandle>(), 8);
    }
}
