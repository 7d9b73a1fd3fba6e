//! One task per room: the only owner of its [`Room`], so the room's order is
//! simply the order of its mailbox, with no lock on the hot path.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use plaza_core::{
    Access, HistoryEntry, JoinParams, Millis, PublishParams, Resume, Room, RoomConfig, RoomError,
};
use plaza_protocol::client::Op;
use plaza_protocol::server::{ErrorBody, ErrorRef, ServerFrame};
use plaza_protocol::ErrorCode;
use serde_json::value::RawValue;
use tokio::sync::{mpsc, oneshot};

use crate::clock::now_ms;
use crate::metrics::NodeMetrics;
use crate::node::RoomSummary;
use crate::outbox::Outbox;

/// Commands a room task accepts. `outbox` is always the sender's, so errors
/// reach it and the room can check that the session belongs to that connection.
pub(crate) enum RoomCommand {
    Join(Box<JoinCommand>),
    Leave {
        session: String,
        outbox: Outbox,
    },
    Disconnect {
        session: String,
        outbox: Outbox,
    },
    Publish {
        session: String,
        outbox: Outbox,
        params: Box<PublishParams>,
    },
    Request {
        session: String,
        outbox: Outbox,
        call: Box<RequestCall>,
    },
    Direct {
        session: String,
        outbox: Outbox,
        message: Box<DirectMessage>,
    },
    Close {
        done: oneshot::Sender<()>,
    },
    /// Cluster mode: an entry of the room's shared log, from the broker.
    Log(Box<plaza_broker::LogEntry>),
    /// Cluster mode: an append this node made failed.
    AppendFailed(Box<crate::cluster::AppendFailure>),
}

// The larger payloads are boxed: a room's mailbox allocates its slots in
// blocks of 32 commands up front, so every byte of `RoomCommand` costs 32
// bytes in every room, busy or not.

/// A join, answered with the session id.
pub(crate) struct JoinCommand {
    pub(crate) params: JoinParams<Outbox>,
    pub(crate) resume: Option<Resume>,
    pub(crate) reply: oneshot::Sender<Result<String, RoomError>>,
}

/// A request and the nonce its response carries.
pub(crate) struct RequestCall {
    pub(crate) nonce: Box<RawValue>,
    pub(crate) op: Op,
}

/// A message for one session.
pub(crate) struct DirectMessage {
    pub(crate) to: String,
    pub(crate) event: String,
    pub(crate) data: Option<Box<RawValue>>,
}

/// A cheap handle to a room task: one pointer, since every connection keeps
/// one per joined room.
#[derive(Clone)]
pub(crate) struct RoomHandle(Arc<RoomShared>);

/// What every handle of one room shares.
struct RoomShared {
    id: Box<str>,
    name: Box<str>,
    created_at: Millis,
    access: Access,
    history_size: usize,
    max_members: usize,
    presence: bool,
    members: Arc<AtomicUsize>,
    tx: mpsc::Sender<RoomCommand>,
}

/// Room mailbox length: readers wait when it is full, pushing back on clients.
const MAILBOX: usize = 4096;

impl RoomHandle {
    pub(crate) fn id(&self) -> &str {
        &self.0.id
    }

    pub(crate) fn summary(&self) -> RoomSummary {
        let s = &self.0;
        RoomSummary {
            id: s.id.to_string(),
            name: s.name.to_string(),
            members: s.members.load(Ordering::Relaxed),
            created_at: s.created_at,
            access: match s.access {
                Access::Open => "open".into(),
                Access::TicketOnly => "ticket".into(),
            },
            history_size: s.history_size,
            max_members: s.max_members,
            presence: s.presence,
        }
    }

    /// Whether the room was deleted (it takes no more commands).
    pub(crate) fn is_closed(&self) -> bool {
        self.0.tx.is_closed()
    }

    /// Sends a command; false when the room is gone.
    pub(crate) async fn send(&self, cmd: RoomCommand) -> bool {
        self.0.tx.send(cmd).await.is_ok()
    }

    pub(crate) async fn close(&self) {
        let (done, wait) = oneshot::channel();
        if self.0.tx.send(RoomCommand::Close { done }).await.is_ok() {
            let _ = wait.await;
        }
    }
}

/// What a room's summary shows, fixed at its creation.
pub(crate) struct RoomInfo<'a> {
    pub(crate) id: &'a str,
    pub(crate) name: &'a str,
    pub(crate) created_at: Millis,
    pub(crate) access: Access,
    pub(crate) history_size: usize,
    pub(crate) max_members: usize,
    pub(crate) presence: bool,
}

/// A handle and the mailbox its task reads; `members` is the count the task keeps.
pub(crate) fn mailbox(
    info: RoomInfo<'_>,
    members: Arc<AtomicUsize>,
) -> (RoomHandle, mpsc::Receiver<RoomCommand>) {
    let (tx, rx) = mpsc::channel(MAILBOX);
    let handle = RoomHandle(Arc::new(RoomShared {
        id: info.id.into(),
        name: info.name.into(),
        created_at: info.created_at,
        access: info.access,
        history_size: info.history_size,
        max_members: info.max_members,
        presence: info.presence,
        members,
        tx,
    }));
    (handle, rx)
}

impl RoomHandle {
    /// A sender that does not keep the mailbox open (a task's way to post to itself).
    pub(crate) fn downgrade(&self) -> mpsc::WeakSender<RoomCommand> {
        self.0.tx.downgrade()
    }

    /// Posts without waiting; false when the mailbox is full or closed.
    pub(crate) fn try_send(&self, cmd: RoomCommand) -> bool {
        self.0.tx.try_send(cmd).is_ok()
    }

    pub(crate) fn same(&self, other: &RoomHandle) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

pub(crate) fn spawn(
    id: String,
    name: String,
    config: RoomConfig,
    entities: Vec<(Option<String>, serde_json::Value)>,
    now: Millis,
    metrics: &NodeMetrics,
) -> RoomHandle {
    let members = Arc::new(AtomicUsize::new(0));
    let info = RoomInfo {
        id: &id,
        name: &name,
        created_at: now,
        access: config.access,
        history_size: config.history_size,
        max_members: config.max_members,
        presence: config.presence,
    };
    let (handle, rx) = mailbox(info, members.clone());
    let mut room = Room::new(id, name, config, plaza_broker::new_epoch(), now);
    for (kind, data) in entities {
        room.seed_entity(kind, data);
    }
    let counters = Counters {
        errors: metrics_errors(metrics),
    };
    tokio::spawn(
        RoomTask {
            room,
            members,
            counters,
        }
        .run(rx),
    );
    handle
}

struct Counters {
    errors: ErrorCounter,
}

pub(crate) type ErrorCounter = Arc<dyn Fn(ErrorCode) + Send + Sync>;

pub(crate) fn metrics_errors(m: &NodeMetrics) -> ErrorCounter {
    // The room task needs only "count this error"; a closure over the node's
    // counters keeps the task independent of the node's lifetime.
    let codes: Vec<(ErrorCode, metrics::Counter)> = ErrorCode::ALL
        .iter()
        .map(|&c| (c, m.error_counter(c)))
        .collect();
    Arc::new(move |code| {
        if let Some((_, c)) = codes.iter().find(|(x, _)| *x == code) {
            c.increment(1);
        }
    })
}

struct RoomTask {
    room: Room<Outbox>,
    members: Arc<AtomicUsize>,
    counters: Counters,
}

impl RoomTask {
    async fn run(mut self, mut rx: mpsc::Receiver<RoomCommand>) {
        loop {
            let deadline = self.room.next_deadline().map(|at| {
                let wait = at.saturating_sub(now_ms());
                tokio::time::Instant::now() + Duration::from_millis(wait)
            });
            let cmd = tokio::select! {
                cmd = rx.recv() => cmd,
                _ = sleep_until(deadline) => {
                    let events = self.room.tick(now_ms());
                    self.deliver(&events);
                    continue;
                }
            };
            match cmd {
                None => break,
                Some(RoomCommand::Close { done }) => {
                    // Refuse new commands before telling members: whoever saw
                    // `closed` and acts on the room must hear it is gone.
                    rx.close();
                    let frame = ServerFrame::Closed {
                        room: self.room.id().to_owned(),
                        reason: "room_deleted".into(),
                    }
                    .encode();
                    for sink in self.room.close() {
                        sink.send(frame.clone(), None);
                    }
                    self.members.store(0, Ordering::Relaxed);
                    let _ = done.send(());
                    break;
                }
                Some(cmd) => self.handle(cmd),
            }
            self.members.store(self.room.connected(), Ordering::Relaxed);
        }
    }

    fn handle(&mut self, cmd: RoomCommand) {
        let now = now_ms();
        match cmd {
            RoomCommand::Join(join) => {
                let JoinCommand {
                    params,
                    resume,
                    reply,
                } = *join;
                let outbox = params.sink.clone();
                match self.room.join(params, resume, now) {
                    Ok(joined) => {
                        if let Some(old) = &joined.replaced {
                            let frame = ServerFrame::Closed {
                                room: self.room.id().to_owned(),
                                reason: "resumed_elsewhere".into(),
                            };
                            old.control().evict(self.room.id());
                            old.send(frame.encode(), None);
                        }
                        outbox.send(joined.server_frame().encode(), None);
                        for e in &joined.missed {
                            outbox.send(e.frame.clone(), None);
                        }
                        self.deliver(&joined.events);
                        let _ = reply.send(Ok(joined.frame.session));
                    }
                    Err(e) => {
                        let _ = reply.send(Err(e));
                    }
                }
            }
            RoomCommand::Leave { session, outbox } => {
                if self.owns(&session, &outbox) {
                    let events = self.room.leave(&session, now);
                    self.deliver(&events);
                }
                outbox.send(
                    ServerFrame::Left {
                        room: self.room.id().to_owned(),
                    }
                    .encode(),
                    None,
                );
            }
            RoomCommand::Disconnect { session, outbox } => {
                if self.owns(&session, &outbox) {
                    let events = self.room.disconnect(&session, now);
                    self.deliver(&events);
                }
            }
            RoomCommand::Publish {
                session,
                outbox,
                params,
            } => {
                let id = params.id.clone();
                if !self.owns(&session, &outbox) {
                    return self.refuse(&outbox, not_joined(), "publish", id);
                }
                match self.room.publish(&session, *params, now) {
                    Ok(p) => {
                        if let Some(e) = &p.entry {
                            self.deliver(std::slice::from_ref(e));
                        }
                        let ack = ServerFrame::Ack {
                            room: self.room.id().to_owned(),
                            seq: p.seq,
                            id,
                            duplicate: p.entry.is_none(),
                        };
                        outbox.send(ack.encode(), None);
                    }
                    Err(e) => self.refuse(&outbox, e, "publish", id),
                }
            }
            RoomCommand::Request {
                session,
                outbox,
                call,
            } => {
                let RequestCall { nonce, op } = *call;
                let result = if self.owns(&session, &outbox) {
                    self.room.request(&session, op, now)
                } else {
                    Err(not_joined())
                };
                let frame = match result {
                    Ok(out) => {
                        self.deliver(&out.events);
                        response(self.room.id(), nonce, Ok(out.result))
                    }
                    Err(e) => {
                        (self.counters.errors)(e.code);
                        response(self.room.id(), nonce, Err(e))
                    }
                };
                outbox.send(frame.encode(), None);
            }
            RoomCommand::Direct {
                session,
                outbox,
                message,
            } => {
                let DirectMessage { to, event, data } = *message;
                if !self.owns(&session, &outbox) {
                    return self.refuse(&outbox, not_joined(), "direct", None);
                }
                match self.room.direct_target(&session, &to) {
                    Ok(target) => {
                        let frame = ServerFrame::Direct {
                            room: self.room.id().to_owned(),
                            from: session,
                            event,
                            data,
                        };
                        target.send(frame.encode(), None);
                    }
                    Err(e) => self.refuse(&outbox, e, "direct", None),
                }
            }
            RoomCommand::Close { .. } => unreachable!("handled in run"),
            // Only cluster replicas read a shared log.
            RoomCommand::Log(_) | RoomCommand::AppendFailed(_) => {}
        }
    }

    /// Whether `session` is a connected member whose frames go to `outbox`.
    fn owns(&self, session: &str, outbox: &Outbox) -> bool {
        self.room
            .member(session)
            .and_then(|m| m.sink.as_ref())
            .is_some_and(|s| Arc::ptr_eq(s.control(), outbox.control()))
    }

    fn refuse(&self, outbox: &Outbox, e: RoomError, frame: &str, id: Option<String>) {
        (self.counters.errors)(e.code);
        outbox.send(error_frame(self.room.id(), e, frame, id).encode(), None);
    }

    /// Hands each event's single encoded buffer to every recipient.
    fn deliver(&self, events: &[Arc<HistoryEntry>]) {
        if events.is_empty() {
            return;
        }
        let ordered_at = Some(Instant::now());
        for e in events {
            self.room.for_each_recipient(e, |_, sink| {
                sink.send(e.frame.clone(), ordered_at);
            });
        }
    }
}

/// The `error` frame refusing a client's `frame` (with its message `id`) in `room`.
pub(crate) fn error_frame(
    room: &str,
    e: RoomError,
    frame: &str,
    id: Option<String>,
) -> ServerFrame {
    ServerFrame::Error {
        code: e.code,
        message: e.message,
        reference: Some(ErrorRef {
            frame: Some(frame.to_owned()),
            room: Some(room.to_owned()),
            id,
        }),
    }
}

pub(crate) fn not_joined() -> RoomError {
    RoomError::new(
        ErrorCode::NotJoined,
        "not a member of this room on this connection",
    )
}

pub(crate) fn response(
    room: &str,
    nonce: Box<RawValue>,
    result: Result<serde_json::Value, RoomError>,
) -> ServerFrame {
    match result {
        Ok(v) => ServerFrame::Response {
            room: room.to_owned(),
            nonce,
            ok: true,
            result: Some(v),
            error: None,
        },
        Err(e) => ServerFrame::Response {
            room: room.to_owned(),
            nonce,
            ok: false,
            result: None,
            error: Some(ErrorBody {
                code: e.code,
                message: e.message,
            }),
        },
    }
}

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
