//! One client's protocol state on one connection: decodes, checks and routes
//! its frames to room tasks, whatever the transport ([`crate::transport`]).

mod admission;
mod joined_rooms;

use std::sync::Arc;

use plaza_core::{PublishParams, Right, RoomError, TokenBucket};
use plaza_protocol::client::{self, ClientFrame, Op};
use plaza_protocol::server::{ErrorRef, ServerFrame};
use plaza_protocol::{CloseCode, ErrorCode};
use tokio::sync::oneshot;

use crate::auth::expiry::ExpiryWatch;
use crate::auth::Identity;
use crate::clock::now_ms;
use crate::metrics::ErrorCounter;
use crate::outbox::{ConnectionControl, Outbox};
use crate::room::answer::{not_joined, room_deleted};
use crate::room::{Intent, Pending, RoomCommand, Waiter};
use crate::Node;
use admission::Admitted;
use joined_rooms::JoinedRooms;

pub(crate) struct Connection {
    node: Arc<Node>,
    outbox: Outbox,
    control: Arc<ConnectionControl>,
    bucket: TokenBucket,
    /// Frames refused by the rate limit since the last accepted one.
    refused_in_a_row: u32,
    /// Joined rooms and this connection's session in each.
    rooms: JoinedRooms,
    /// Rooms deleted while this connection was in them, the latest last (at most
    /// `max_rooms_per_connection`): frames for them are answered `room_not_found` (a `leave`,
    /// `left`) until the id is joined again, not `not_joined` as for a room never joined.
    deleted: Vec<String>,
    /// The client's address, when known (joins per address are limited).
    peer: Option<std::net::IpAddr>,
    /// Who its token says it is (boxed: most connections have none).
    auth: Option<Box<Authenticated>>,
}

/// A connection's verified identity and the timer that ends it.
struct Authenticated {
    identity: Identity,
    expiry: ExpiryWatch,
}

impl Connection {
    pub(crate) fn new(
        node: Arc<Node>,
        outbox: Outbox,
        control: Arc<ConnectionControl>,
        peer: Option<std::net::IpAddr>,
    ) -> Self {
        let config = node.config();
        Connection {
            peer,
            bucket: TokenBucket::new(config.rate_limit_per_sec, config.rate_limit_burst, now_ms()),
            refused_in_a_row: 0,
            node,
            outbox,
            control,
            rooms: JoinedRooms::default(),
            deleted: Vec::new(),
            auth: None,
        }
    }

    /// Verifies `token` and makes it the connection's identity, answering
    /// `authed` or an error. A refresh must name the same user; its rights
    /// apply to every later frame, in rooms already joined too.
    pub(crate) fn authenticate(&mut self, token: &str) {
        let Some(verifier) = self.node.tokens() else {
            return self.error(
                ErrorCode::TokenInvalid,
                "this server verifies no tokens (no jwt_* key is configured)".into(),
                auth_ref(),
            );
        };
        let identity = match verifier.verify(token, now_ms()) {
            Ok(i) => i,
            Err(e) => return self.error(e.code, e.message, auth_ref()),
        };
        if let Some(current) = &self.auth {
            if current.identity.user != identity.user {
                let msg = format!(
                    "the connection is user {:?}; a refreshed token must name the same user",
                    current.identity.user
                );
                return self.error(ErrorCode::Forbidden, msg, auth_ref());
            }
        }
        let authed = ServerFrame::Authed {
            user: identity.user.clone(),
            name: identity.name.clone(),
            expires_at: identity.expires_at,
        };
        self.rooms
            .regrant(|room| admission::granted(&identity, room));
        match &mut self.auth {
            Some(a) => {
                a.expiry.extend(identity.expires_at);
                a.identity = identity;
            }
            None => {
                let expiry = ExpiryWatch::start(
                    identity.expires_at,
                    self.outbox.clone(),
                    self.control.clone(),
                );
                self.auth = Some(Box::new(Authenticated { identity, expiry }));
            }
        }
        self.outbox.send(authed.encode());
    }

    /// The connection ended: its sessions are disconnected (resumable).
    pub(crate) async fn disconnect_all(&mut self) {
        for (room, session, _) in self.rooms.take_all() {
            let cmd = RoomCommand::client(
                Intent::Disconnect { session },
                self.pending(Waiter::Nothing),
            );
            // A room that is gone has nothing to disconnect.
            let _ = room.send(cmd).await;
        }
    }

    /// Handles one complete client message.
    pub(crate) async fn on_frame(&mut self, bytes: &[u8]) {
        let m = &self.node.metrics;
        m.frames_in.increment(1);
        m.bytes_in.increment(bytes.len() as u64);
        let max = self.node.config().max_frame_bytes;
        if bytes.len() > max {
            let msg = format!("frame has {} bytes, the limit is {max}", bytes.len());
            return self.error(ErrorCode::FrameTooLarge, msg, None);
        }
        if !self.bucket.try_take(now_ms()) {
            self.refused_in_a_row += 1;
            // A client that keeps sending through this many refusals is not
            // reading its errors: cut it off rather than spend CPU on it.
            let limit = self
                .node
                .config()
                .rate_limit_burst
                .saturating_mul(10)
                .max(100);
            if self.refused_in_a_row > limit {
                self.control.close(CloseCode::PolicyViolation);
                return;
            }
            return self.error(
                ErrorCode::RateLimited,
                "too many frames; this one was dropped".into(),
                None,
            );
        }
        self.refused_in_a_row = 0;
        let frame = match client::decode(bytes) {
            Ok(f) => f,
            Err(e) => {
                let r = e.frame_type.map(|t| ErrorRef {
                    frame: Some(t),
                    room: e.room,
                    id: e.id,
                });
                return self.error(e.code, e.message, r);
            }
        };
        match frame {
            ClientFrame::Join(j) => self.join(j).await,
            ClientFrame::Leave(l) => {
                let pending = self.pending(Waiter::Leave);
                let Some((room, session, _)) = self.rooms.remove(&l.room) else {
                    if self.was_deleted(&l.room) {
                        return pending.answer_left(&l.room);
                    }
                    return self.leave_not_joined(l.room);
                };
                let cmd = RoomCommand::client(Intent::Leave { session }, pending);
                if let Err(cmd) = room.send(cmd).await {
                    // The room was deleted meanwhile: the member is out all the same.
                    self.note_deleted(&l.room);
                    cmd.refuse(&l.room, room_deleted(&l.room), &self.errors());
                }
            }
            ClientFrame::Publish(p) => {
                let pending = self.pending(Waiter::Publish(p.id.clone()));
                let Some((_, session, rights)) = self.rooms.get(&p.room) else {
                    let e = self.not_in(&p.room);
                    return pending.refuse(&p.room, e, &self.errors());
                };
                let channel = p.channel.as_str();
                if rights.as_ref().is_some_and(|r| !r.may_publish(channel)) {
                    let e = forbidden(format!(
                        "the token grants no publish on channel {channel:?}"
                    ));
                    return pending.refuse(&p.room, e, &self.errors());
                }
                let params = PublishParams {
                    channel: p.channel,
                    event: p.event,
                    data: p.data,
                    id: p.id,
                    topic: p.topic,
                    reply_to: p.reply_to,
                    echo: p.echo,
                };
                let intent = Intent::Publish {
                    session: session.clone(),
                    params,
                };
                self.route(&p.room, RoomCommand::client(intent, pending))
                    .await;
            }
            ClientFrame::Request(r) => {
                let pending = self.pending(Waiter::Request(r.nonce.clone()));
                let op = match r.op() {
                    Ok(op) => op,
                    Err((code, message)) => {
                        return pending.refuse(
                            &r.room,
                            RoomError::new(code, message),
                            &self.errors(),
                        )
                    }
                };
                let Some((_, session, rights)) = self.rooms.get(&r.room) else {
                    let e = self.not_in(&r.room);
                    return pending.refuse(&r.room, e, &self.errors());
                };
                if let (Some(rights), Some(needed)) = (rights, right_for(&op)) {
                    if !rights.may(needed) {
                        let e = forbidden(format!(
                            "the token grants no {} in this room",
                            needed.as_str()
                        ));
                        return pending.refuse(&r.room, e, &self.errors());
                    }
                }
                // The filters an update brings get RFC 6901's strict check
                // here, before its record is written: the room (on every
                // replica, of any version) checks pointers leniently, so
                // that a filter held from an earlier version does not stop
                // its member changing the policy.
                if let Op::PolicyUpdate(update) = &op {
                    if let Err(e) = update.validate_pointers() {
                        let e = RoomError::new(ErrorCode::InvalidArgs, e);
                        return pending.refuse(&r.room, e, &self.errors());
                    }
                }
                let intent = Intent::Request {
                    session: session.clone(),
                    nonce: r.nonce,
                    op,
                };
                self.route(&r.room, RoomCommand::client(intent, pending))
                    .await;
            }
            ClientFrame::Direct(d) => {
                let pending = self.pending(Waiter::Direct);
                let Some((_, session, rights)) = self.rooms.get(&d.room) else {
                    let e = self.not_in(&d.room);
                    return pending.refuse(&d.room, e, &self.errors());
                };
                if rights.as_ref().is_some_and(|r| !r.may(Right::Direct)) {
                    let e = forbidden("the token grants no direct in this room".into());
                    return pending.refuse(&d.room, e, &self.errors());
                }
                let intent = Intent::Direct {
                    session: session.clone(),
                    to: d.to,
                    event: d.event,
                    data: d.data,
                };
                self.route(&d.room, RoomCommand::client(intent, pending))
                    .await;
            }
            ClientFrame::Ping(p) => {
                self.outbox.send(ServerFrame::Pong { ts: p.ts }.encode());
            }
            ClientFrame::Auth(a) => self.authenticate(&a.token),
        }
    }

    /// The answer a command of this connection is owed.
    fn pending(&self, waiter: Waiter) -> Pending {
        Pending {
            outbox: self.outbox.clone(),
            waiter,
        }
    }

    /// Sends a command to a joined room; if the room is gone, the command is
    /// refused and the room forgotten.
    async fn route(&mut self, room_id: &str, cmd: RoomCommand) {
        let Some((room, _, _)) = self.rooms.get(room_id) else {
            return;
        };
        if let Err(cmd) = room.send(cmd).await {
            self.rooms.remove(room_id);
            self.note_deleted(room_id);
            cmd.refuse(room_id, room_deleted(room_id), &self.errors());
        }
    }

    /// Why a frame for `room`, which this connection is not in, is refused.
    fn not_in(&self, room: &str) -> RoomError {
        if self.was_deleted(room) {
            room_deleted(room)
        } else {
            not_joined()
        }
    }

    fn was_deleted(&self, room: &str) -> bool {
        self.deleted.iter().any(|r| r == room)
    }

    fn note_deleted(&mut self, room: &str) {
        if self.was_deleted(room) {
            return;
        }
        let keep = self.node.config().max_rooms_per_connection.max(1);
        if self.deleted.len() >= keep {
            self.deleted.remove(0);
        }
        self.deleted.push(room.to_owned());
    }

    async fn join(&mut self, j: client::Join) {
        let mut r = ErrorRef {
            frame: Some("join".into()),
            room: j.room.clone(),
            id: None,
        };
        if self.node.is_shutting_down() {
            return self.error(
                ErrorCode::ShuttingDown,
                "the server is shutting down".into(),
                Some(r),
            );
        }
        if let Some(ip) = self.peer {
            if !self.node.may_join_from(ip, now_ms()) {
                return self.error(
                    ErrorCode::RateLimited,
                    "too many joins from this address; try again in a moment".into(),
                    Some(r),
                );
            }
        }
        // Checks that need no ticket come first, so a refused join does not
        // spend the ticket.
        let mut gone = Vec::new();
        self.rooms.retain(|room| {
            let open = !room.is_closed();
            if !open {
                gone.push(room.id().to_owned());
            }
            open
        });
        for room in gone {
            self.note_deleted(&room);
        }
        for room in self.control.take_evicted() {
            self.rooms.remove(&room);
        }
        let max_rooms = self.node.config().max_rooms_per_connection;
        if self.rooms.len() >= max_rooms {
            let msg = format!("a connection may join {max_rooms} rooms at most");
            return self.error(ErrorCode::TooManyRooms, msg, Some(r));
        }
        if j.room
            .as_ref()
            .is_some_and(|room| self.rooms.contains(room))
        {
            let msg = format!(
                "already in room {:?}",
                j.room.as_deref().unwrap_or_default()
            );
            return self.error(ErrorCode::AlreadyJoined, msg, Some(r));
        }
        let identity = self.auth.as_ref().map(|a| &a.identity);
        let admitted = match admission::admit(&self.node, &j, identity).await {
            Ok(a) => a,
            Err(e) => return self.error(e.code, e.message, Some(r)),
        };
        let Admitted {
            room: room_id,
            name,
            platform,
            ticket,
            user,
            rights,
            resume_only,
        } = admitted;
        r.room = Some(room_id.clone());
        if self.rooms.contains(&room_id) {
            return self.error(
                ErrorCode::AlreadyJoined,
                format!("already in room {room_id:?}"),
                Some(r),
            );
        }
        // A join that may only resume creates no room.
        let room = if resume_only.is_some() {
            self.node.existing_room(&room_id).await
        } else {
            self.node.room_for_join(&room_id).await
        };
        let room = match room {
            Ok(h) => h,
            Err(e) => return self.error(e.code, e.message, Some(r)),
        };
        // A new policy's pointers get RFC 6901's strict check here, before
        // the join's record is written: the room (on every replica, of any
        // version) checks them leniently, as earlier versions did.
        if let Some(Err(e)) = j.policy.as_ref().map(|p| p.validate_pointers()) {
            return self.error(
                ErrorCode::InvalidFrame,
                format!("invalid join policy: {e}"),
                Some(r),
            );
        }
        let intent = Intent::Join {
            session: plaza_broker::new_session_id(),
            resume_token: plaza_broker::new_resume_token(),
            name,
            platform,
            user,
            channels: j.channels,
            ticket,
            resume: j.resume.map(|x| (x.token, x.last_seq)),
            resume_only: resume_only.map(|e| (e.code, e.message)),
            policy: j.policy.map(Box::new),
            history: j.history,
        };
        let (reply, answer) = oneshot::channel();
        let cmd = RoomCommand::client(intent, self.pending(Waiter::Join(reply)));
        if room.send(cmd).await.is_err() {
            return self.error(
                ErrorCode::RoomNotFound,
                format!("no room {room_id:?}"),
                Some(r),
            );
        }
        match answer.await {
            Ok(Ok(joined)) => {
                self.deleted.retain(|r| r != room.id());
                // A session without a user (joined with a ticket and no
                // token) has a ticket's rights, on a token connection too.
                let rights = if joined.user_less { None } else { rights };
                self.rooms.insert(room, joined.session, rights);
            }
            Ok(Err(e)) => self.error(e.code, e.message, Some(r)),
            Err(_) => self.error(
                ErrorCode::RoomNotFound,
                format!("room {room_id:?} was deleted"),
                Some(r),
            ),
        }
    }

    fn errors(&self) -> ErrorCounter {
        self.node.metrics.error_counter_set()
    }

    /// A `leave` of a room this connection is not in (a leave of a joined
    /// room is always answered with `left`).
    fn leave_not_joined(&self, room: String) {
        let e = not_joined();
        let r = ErrorRef {
            frame: Some("leave".into()),
            room: Some(room),
            id: None,
        };
        self.error(e.code, e.message, Some(r));
    }

    fn error(&self, code: ErrorCode, message: String, reference: Option<ErrorRef>) {
        self.node.metrics.error(code);
        self.outbox.send(
            ServerFrame::Error {
                code,
                message,
                reference,
            }
            .encode(),
        );
    }
}

/// The right a request needs beyond membership: subscribing and delivery
/// policies are every member's own business.
fn right_for(op: &Op) -> Option<Right> {
    match op {
        Op::EntityCreate { .. }
        | Op::EntitySet { .. }
        | Op::EntityPatch { .. }
        | Op::EntityDelete { .. } => Some(Right::Entities),
        Op::LockAcquire { .. } | Op::LockRenew { .. } | Op::LockRelease { .. } => {
            Some(Right::Locks)
        }
        Op::SpaceMove { .. } | Op::SpaceJump { .. } => Some(Right::Move),
        Op::ChannelSubscribe { .. }
        | Op::ChannelUnsubscribe { .. }
        | Op::PolicyUpdate(_)
        | Op::PolicyClear => None,
    }
}

fn forbidden(message: String) -> RoomError {
    RoomError::new(ErrorCode::Forbidden, message)
}

fn auth_ref() -> Option<ErrorRef> {
    Some(ErrorRef {
        frame: Some("auth".into()),
        room: None,
        id: None,
    })
}
