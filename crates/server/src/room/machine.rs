//! The one place where a room command is applied and answered, in both modes.
//!
//! Embedded mode is a log that applies at once: its room task hands every
//! command straight to [`RoomMachine::apply`]. In cluster mode the replica
//! appends the command to the room's shared log and hands each entry to the
//! same method when the log delivers it, on every node hosting the room; only
//! the node that appended it holds the [`Pending`] answer. Every outcome
//! reaches this node's members through [`RoomMachine::deliver`], the one place
//! where per-member delivery happens.
//!
//! Most members follow the room's [`RoomFeed`]: their connections read the
//! room's events from it, so the room appends an event once rather than
//! queueing it for each of them. The machine decides who follows
//! ([`RoomMachine::reconcile`]): a member connected here with no delivery
//! policy; the others are handed each event by [`Room::route`].

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Instant;

use plaza_core::{Delivery, Held, HistoryEntry, JoinParams, Millis, Resume, Room, RoomError};
use plaza_protocol::client::Op;
use plaza_protocol::server::{ClosedReason, ServerFrame};
use plaza_protocol::{CloseCode, ErrorCode};

use super::answer::{self, not_joined};
use super::command::{Intent, JoinedSession, Pending, Waiter};
use super::compact_key::CompactLease;
use super::flush;
use super::sink::Sink;
use crate::metrics::ErrorCounter;
use crate::outbox::{FeedConfig, Follower, Outbox, RoomFeed};

/// Events fed between two looks for followers that fell too far behind
/// (and for what every follower has read, which the feed then forgets).
const SCAN_EVERY: usize = 64;

/// A member of this node that reads the room's events from its feed.
struct Following {
    conn: u64,
    /// Its connection's outbox, through the feed.
    outbox: Outbox,
    /// The channels its connection picks events by (shared with it).
    channels: Arc<[String]>,
    follower: Arc<Follower>,
}

/// Where a command came from: a node and one of its connections (0 for
/// commands no connection caused, such as ticks).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Origin<'a> {
    pub(crate) node: &'a str,
    pub(crate) conn: u64,
}

/// What the caller must do after a command was applied.
#[must_use]
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum FollowUp {
    /// Nothing.
    None,
    /// The room was deleted: it takes no more commands.
    Closed,
    /// A join of this node's landed although its waiter is gone (in cluster
    /// mode, its append reported a failure): nobody is on that connection,
    /// so the session must be disconnected (a must-land command).
    Orphaned { conn: u64, session: String },
}

/// A room and this node's part in it: which of its members are connected
/// here.
pub(crate) struct RoomMachine {
    room: Room<Sink>,
    /// This node's id.
    me: Arc<str>,
    /// This node's connections with a member in the room.
    locals: HashMap<u64, Outbox>,
    /// What the delivery policies of this node's members hold: node-local,
    /// since a member's held events are only what its connection has not
    /// been sent yet (a resume anywhere finds them in the history).
    held: Held,
    errors: ErrorCounter,
    /// The room's live events for the members that follow it.
    feed: Arc<RoomFeed>,
    /// This node's members that follow the feed, by session (the key
    /// shared with their connections).
    followers: HashMap<Arc<str>, Following>,
    /// This node's connected members that do not follow it (a delivery
    /// policy decides what they get when): they are handed each event.
    handed: HashSet<String>,
    /// Events fed since the last look at the followers.
    fed_since_scan: usize,
    /// The key its messages' compact form is made under here.
    compact: CompactLease,
    /// Where the room's events go as webhooks, if anywhere.
    webhooks: Option<Arc<crate::webhooks::Webhooks>>,
    /// Durable webhooks: the webhook events of the command being applied,
    /// for the replica to queue by log position (every replica does).
    collected: Vec<crate::webhooks::WebhookEvent>,
    /// Whether the command being applied was this node's: in cluster mode
    /// every replica applies every entry, and only the node that appended
    /// it sends its webhooks.
    ours: bool,
}

impl RoomMachine {
    /// A machine for `room` on node `me`, whose feed serves its followers
    /// as `feed` says.
    pub(crate) fn new(
        room: Room<Sink>,
        me: Arc<str>,
        errors: ErrorCounter,
        feed: FeedConfig,
        webhooks: Option<Arc<crate::webhooks::Webhooks>>,
    ) -> RoomMachine {
        let compact = CompactLease::new(crate::clock::now_ms());
        RoomMachine {
            compact,
            room,
            me,
            locals: HashMap::new(),
            held: Held::default(),
            errors,
            feed: RoomFeed::with_config(feed),
            followers: HashMap::new(),
            handed: HashSet::new(),
            fed_since_scan: 0,
            webhooks,
            ours: false,
            collected: Vec::new(),
        }
    }

    /// The webhook events collected since the last call (durable webhooks).
    pub(crate) fn take_webhooks(&mut self) -> Vec<crate::webhooks::WebhookEvent> {
        std::mem::take(&mut self.collected)
    }

    /// The room.
    pub(crate) fn room(&self) -> &Room<Sink> {
        &self.room
    }

    /// The room's id.
    pub(crate) fn id(&self) -> &str {
        self.room.id()
    }

    /// This node's id.
    pub(crate) fn me(&self) -> &Arc<str> {
        &self.me
    }

    /// This node's connections with a member in the room.
    pub(crate) fn locals(&self) -> &HashMap<u64, Outbox> {
        &self.locals
    }

    /// The error counter answers count refusals with.
    pub(crate) fn errors(&self) -> &ErrorCounter {
        &self.errors
    }

    /// Forgets a local connection (it dropped; its disconnect is on its way).
    pub(crate) fn forget_local(&mut self, conn: u64) {
        self.locals.remove(&conn);
        let feed = &self.feed;
        self.followers.retain(|_, f| {
            let keep = f.conn != conn;
            if !keep {
                feed.forget(&f.follower);
            }
            keep
        });
    }

    /// Replaces the room (cluster mode: a newer snapshot) and keeps only the
    /// local connections `keep` accepts.
    pub(crate) fn replace_room(
        &mut self,
        room: Room<Sink>,
        mut keep: impl FnMut(u64, &Outbox) -> bool,
    ) {
        // Held events go out now, through the connections the old room knew:
        // early is always allowed, and the new room starts with none held.
        let id = self.room.id();
        self.room
            .route_all(&mut self.held, flush::to_local(id, None));
        // The same key: the members here keep the one their `joined` gave
        // (the history's compact forms are made when a resume replays them).
        self.room = room;
        self.locals.retain(|conn, outbox| keep(*conn, outbox));
        self.reconcile_all();
    }

    /// Applies one command at time `now` and answers `pending`, if this node
    /// holds it.
    pub(crate) fn apply(
        &mut self,
        origin: Origin<'_>,
        intent: Intent,
        pending: Option<Pending>,
        now: Millis,
    ) -> FollowUp {
        // What is queued in answer comes after the room's events so far.
        let pending = pending.map(|mut p| {
            p.outbox = p.outbox.with_feed(&self.feed);
            p
        });
        self.ours = *origin.node == *self.me;
        let follow_up = self.apply_intent(origin, intent, pending, now);
        self.ours = false;
        #[cfg(debug_assertions)]
        self.check_followers();
        follow_up
    }

    fn apply_intent(
        &mut self,
        origin: Origin<'_>,
        intent: Intent,
        pending: Option<Pending>,
        now: Millis,
    ) -> FollowUp {
        match intent {
            Intent::Join {
                session,
                resume_token,
                name,
                platform,
                user,
                channels,
                ticket,
                resume,
                resume_only,
                policy,
                history,
            } => {
                let (outbox, reply) = match pending {
                    Some(Pending {
                        outbox,
                        waiter: Waiter::Join(reply),
                    }) => (Some(outbox), Some(reply)),
                    _ => (None, None),
                };
                let node = if *origin.node == *self.me {
                    self.me.clone()
                } else {
                    origin.node.into()
                };
                let params = JoinParams {
                    session,
                    resume_token,
                    name,
                    platform,
                    user,
                    channels,
                    ticket,
                    resume_only: resume_only.map(|(code, message)| RoomError::new(code, message)),
                    policy: policy.map(|p| *p),
                    history,
                    sink: Sink {
                        node,
                        conn: origin.conn,
                        outbox: outbox.clone(),
                    },
                };
                let resume = resume.map(|(token, last_seq)| Resume { token, last_seq });
                let joined = match self.room.join(params, resume, now) {
                    Ok(joined) => joined,
                    Err(e) => {
                        if let Some(reply) = reply {
                            let _ = reply.send(Err(e));
                        }
                        return FollowUp::None;
                    }
                };
                // A resume replays from the client's last seq, what was held included.
                self.room
                    .route_joined(&joined.frame.session, joined.client_seq, &mut self.held);
                let id = self.room.id();
                if let Some(old) = &joined.replaced {
                    if let Some(o) = &old.outbox {
                        let frame = ServerFrame::Closed {
                            room: id.to_owned(),
                            reason: ClosedReason::ResumedElsewhere,
                            message: None,
                        };
                        o.control().evict(id);
                        o.send(frame.encode());
                        self.locals.remove(&old.conn);
                    }
                }
                let mut follow_up = FollowUp::None;
                match (outbox, reply) {
                    (Some(outbox), Some(reply)) => {
                        let mut frame = joined.server_frame();
                        if outbox.control().is_compact() {
                            if let ServerFrame::Joined(j) | ServerFrame::Resync(j) = &mut frame {
                                j.compact = Some(self.compact.key());
                            }
                            // Made here, not when the room was loaded: a
                            // room's history may be long, and most of it is
                            // never replayed to a compact member.
                            for e in &joined.missed {
                                self.compact.prepare(e);
                            }
                        }
                        outbox.send(frame.encode());
                        outbox.replay(&joined.missed);
                        self.locals.insert(origin.conn, outbox);
                        let session = joined.frame.session.clone();
                        let user_less = self
                            .room
                            .member(&session)
                            .is_some_and(|m| m.info.user.is_none());
                        let _ = reply.send(Ok(JoinedSession { session, user_less }));
                    }
                    _ if *origin.node == *self.me => {
                        follow_up = FollowUp::Orphaned {
                            conn: origin.conn,
                            session: joined.frame.session.clone(),
                        };
                    }
                    _ => {}
                }
                self.reconcile(&joined.frame.session);
                self.deliver(&joined.events, now);
                follow_up
            }
            Intent::Leave { session } => {
                if self.connected_on(&session, origin) {
                    self.held.forget(&session);
                    let events = self.room.leave(&session, now);
                    self.reconcile(&session);
                    self.deliver(&events, now);
                }
                if *origin.node == *self.me {
                    self.locals.remove(&origin.conn);
                }
                if let Some(p) = pending {
                    p.answer_left(self.room.id());
                }
                FollowUp::None
            }
            Intent::Kick { session, message } => {
                self.held.forget(&session);
                let Some(removed) = self.room.kick(&session, now) else {
                    let e = RoomError::new(
                        ErrorCode::SessionNotFound,
                        format!("no session {session:?} in this room"),
                    );
                    return self.refuse(pending, e);
                };
                self.reconcile(&session);
                if let Some(outbox) = removed.sink.as_ref().and_then(|s| s.outbox.as_ref()) {
                    let id = self.room.id();
                    // Its connection forgets the room, as after a resume elsewhere.
                    outbox.control().evict(id);
                    let frame = ServerFrame::Closed {
                        room: id.to_owned(),
                        reason: ClosedReason::Kicked,
                        message,
                    };
                    outbox.send(frame.encode());
                    if let Some(sink) = &removed.sink {
                        self.locals.remove(&sink.conn);
                    }
                }
                self.deliver(&removed.events, now);
                if let Some(Pending {
                    waiter: Waiter::Admin(reply),
                    ..
                }) = pending
                {
                    let _ = reply.send(Ok(()));
                }
                FollowUp::None
            }
            Intent::Disconnect { session } => {
                if *origin.node == *self.me {
                    self.locals.remove(&origin.conn);
                }
                if self.connected_on(&session, origin) {
                    // What it held is after its last seq: its resume replays it.
                    self.held.forget(&session);
                    let events = self.room.disconnect(&session, now);
                    self.reconcile(&session);
                    self.deliver(&events, now);
                }
                FollowUp::None
            }
            Intent::Publish { session, params } => {
                if !self.connected_on(&session, origin) {
                    return self.refuse(pending, not_joined());
                }
                let id_of_message = params.id.clone();
                match self.room.publish(&session, params, now) {
                    Ok(p) => {
                        if let Some(e) = &p.entry {
                            self.deliver(std::slice::from_ref(e), now);
                        }
                        self.flush_held_of(&session);
                        if let Some(w) = pending {
                            let ack = ServerFrame::Ack {
                                room: self.room.id().to_owned(),
                                seq: p.seq,
                                id: id_of_message,
                                duplicate: p.entry.is_none(),
                            };
                            w.outbox.send(ack.encode());
                        }
                        FollowUp::None
                    }
                    Err(e) => self.refuse(pending, e),
                }
            }
            Intent::Request { session, nonce, op } => {
                let policy_changed = matches!(op, Op::PolicyUpdate(_) | Op::PolicyClear);
                let result = if self.connected_on(&session, origin) {
                    self.room.request(&session, op, now)
                } else {
                    Err(not_joined())
                };
                match result {
                    Ok(out) => {
                        // Channels and policy take effect from its events on.
                        self.reconcile(&session);
                        self.deliver(&out.events, now);
                        if policy_changed {
                            let id = self.room.id();
                            self.room.route_replanned(
                                &session,
                                &mut self.held,
                                now,
                                flush::to_local(id, None),
                            );
                        }
                        self.flush_held_of(&session);
                        if let Some(p) = pending {
                            let frame = answer::response(self.room.id(), nonce, Ok(out.result));
                            p.outbox.send(frame.encode());
                        }
                        FollowUp::None
                    }
                    Err(e) => self.refuse(pending, e),
                }
            }
            Intent::Direct {
                session,
                to,
                event,
                data,
            } => {
                let target = if self.connected_on(&session, origin) {
                    self.room
                        .direct_target(&session, &to)
                        .map(|s| s.outbox.clone())
                } else {
                    Err(not_joined())
                };
                match target {
                    Ok(Some(outbox)) => {
                        let frame = ServerFrame::Direct {
                            room: self.room.id().to_owned(),
                            from: session,
                            event,
                            data,
                        };
                        outbox.send(frame.encode());
                        FollowUp::None
                    }
                    // The target is on another node, which delivers it.
                    Ok(None) => FollowUp::None,
                    Err(e) => self.refuse(pending, e),
                }
            }
            Intent::ServerPublish { params } => match self.room.server_publish(params, now) {
                Ok(p) => {
                    if let Some(e) = &p.entry {
                        self.deliver(std::slice::from_ref(e), now);
                    }
                    if let Some(w) = pending {
                        let duplicate = p.entry.is_none();
                        w.answer_server(serde_json::json!({"seq": p.seq, "duplicate": duplicate}));
                    }
                    FollowUp::None
                }
                Err(e) => self.refuse(pending, e),
            },
            Intent::ServerRequest { op } => match self.room.server_request(op, now) {
                Ok(out) => {
                    self.deliver(&out.events, now);
                    if let Some(w) = pending {
                        w.answer_server(out.result);
                    }
                    FollowUp::None
                }
                Err(e) => self.refuse(pending, e),
            },
            Intent::ServerDirect { to, event, data } => {
                let Some(sink) = self.room.member(&to).and_then(|m| m.sink.as_ref()) else {
                    let e = RoomError::new(
                        ErrorCode::SessionNotFound,
                        format!("no connected session {to:?} in this room"),
                    );
                    return self.refuse(pending, e);
                };
                // A member connected to another node gets it from there.
                if let Some(outbox) = &sink.outbox {
                    let frame = ServerFrame::Direct {
                        room: self.room.id().to_owned(),
                        from: plaza_core::SERVER_SENDER.to_owned(),
                        event,
                        data,
                    };
                    outbox.send(frame.encode());
                }
                if let Some(w) = pending {
                    w.answer_server(serde_json::json!({"session": to}));
                }
                FollowUp::None
            }
            Intent::Tick => {
                // A spatial crowd's tick can take milliseconds: the worker's
                // other tasks (other rooms, connections, /healthz) move to
                // another thread first, rather than wait behind it.
                let long = self.room.space_tick_work() > LONG_TICK_STEPS;
                let events = outside_the_worker(long, || self.room.tick(now));
                self.deliver(&events, now);
                FollowUp::None
            }
            Intent::NodeDown { node } => {
                self.node_down(&node, now);
                FollowUp::None
            }
            Intent::Close => {
                self.close();
                FollowUp::Closed
            }
        }
    }

    /// Whether `session` is a member connected on the connection the command came from.
    fn connected_on(&self, session: &str, origin: Origin<'_>) -> bool {
        self.room
            .member(session)
            .and_then(|m| m.sink.as_ref())
            .is_some_and(|s| s.is(origin.node, origin.conn))
    }

    fn refuse(&self, pending: Option<Pending>, e: RoomError) -> FollowUp {
        if let Some(p) = pending {
            p.refuse(self.room.id(), e, &self.errors);
        }
        FollowUp::None
    }

    /// Gets each event's single encoded buffer to every recipient on this
    /// node: appended to the feed for the followers, handed to the others
    /// under their delivery policies ([`Room::route`]). An event for some
    /// members only (spatial rooms) is handed to each of them.
    pub(crate) fn deliver(&mut self, events: &[Arc<HistoryEntry>], now: Millis) {
        if events.is_empty() {
            return;
        }
        // Durable webhooks: every replica collects (the broker keeps each
        // event once); otherwise the node that appended the command sends.
        if let Some(hooks) = self
            .webhooks
            .as_ref()
            .filter(|h| self.ours || h.is_durable())
        {
            let (id, epoch) = (self.room.id(), self.room.epoch());
            for e in events {
                let wants = |kind, channel: Option<&str>| hooks.wants(kind, channel);
                if let Some(event) = super::hooks::webhook_event(id, epoch, e, wants) {
                    if hooks.is_durable() {
                        self.collected.push(event);
                    } else {
                        hooks.emit(event);
                    }
                }
            }
        }
        let ordered_at = Some(Instant::now());
        let (room, held, feed) = (&self.room, &mut self.held, &self.feed);
        let to = flush::to_local(room.id(), ordered_at);
        let (followers, handed) = (&self.followers, &self.handed);
        let followed = !followers.is_empty();
        for e in events {
            self.compact.prepare(e);
            let everyone = e.scope.is_all();
            if everyone && followed {
                feed.append(e.clone(), ordered_at);
                self.fed_since_scan += 1;
            }
            // With every member here a follower, there is nobody to hand
            // it to: the pass over the members is skipped.
            if everyone && handed.is_empty() {
                continue;
            }
            // Followers read a room-wide event from the feed. (They have no
            // policy: the route only sends to them, so leaving them out of
            // what it sends changes nothing else.)
            let local = |s: &Sink| s.outbox.is_some();
            let send = |session: &str, sink: &Sink, d: Delivery<'_>| {
                if !(everyone && followers.contains_key(session)) {
                    to(session, sink, d);
                }
            };
            room.route(e, held, now, local, send);
        }
        room.route_evicted(held, &to);
        drop(to);
        // A small feed is looked at more often: its laggards are found
        // before the feed has dropped much that they still needed.
        if self.fed_since_scan >= (self.feed.capacity() / 4).clamp(1, SCAN_EVERY) {
            self.scan_followers();
        }
    }

    /// Closes the followers further behind than the feed keeps (slow
    /// consumers: they resume to catch up), and lets the feed forget what
    /// the others have all read.
    fn scan_followers(&mut self) {
        self.fed_since_scan = 0;
        let end = self.feed.end();
        let mut oldest = end;
        for f in self.followers.values() {
            if !f.outbox.is_open() {
                continue;
            }
            let pos = f.follower.pos();
            if end - pos > self.feed.capacity() as u64 {
                f.outbox.control().close(CloseCode::SlowConsumer);
            } else {
                oldest = oldest.min(pos);
            }
        }
        self.feed.trim(oldest);
    }

    /// Makes `session`'s following match the room: a member connected here
    /// with no delivery policy follows the feed (on its channels); any other
    /// stops. Called where its connection, channels or policy may have
    /// changed, after what it was handed so far and before the next event.
    fn reconcile(&mut self, session: &str) {
        let wanted = self.room.member(session).and_then(|m| {
            let sink = m.sink.as_ref()?;
            let outbox = sink.outbox.as_ref()?;
            Some((sink.conn, outbox, m.policy.is_none(), &m.channels))
        });
        match wanted {
            Some((_, _, false, _)) => {
                self.handed.insert(session.to_owned());
            }
            _ => {
                self.handed.remove(session);
            }
        }
        let wanted = wanted.filter(|w| w.2);
        match (self.followers.get_mut(session), wanted) {
            (Some(f), Some((conn, _, _, channels))) if f.conn == conn => {
                if f.channels[..] != channels[..] {
                    f.channels = channels.as_slice().into();
                    f.outbox.rechannel(f.channels.clone());
                }
                return;
            }
            (None, None) => return,
            _ => {}
        }
        let wanted = wanted.map(|(conn, outbox, _, channels)| {
            let channels: Arc<[String]> = channels.as_slice().into();
            (conn, outbox.with_feed(&self.feed), channels)
        });
        if let Some(old) = self.followers.remove(session) {
            old.outbox.unfollow();
            self.feed.forget(&old.follower);
        }
        if let Some((conn, outbox, channels)) = wanted {
            let key: Arc<str> = session.into();
            if let Some(follower) = outbox.follow(key.clone(), channels.clone()) {
                let f = Following {
                    conn,
                    outbox,
                    channels,
                    follower,
                };
                self.followers.insert(key, f);
            }
        }
    }

    /// [`RoomMachine::reconcile`] for every member that follows, is handed
    /// its events, or is connected here.
    fn reconcile_all(&mut self) {
        let mut sessions: Vec<String> = self.followers.keys().map(|k| k.to_string()).collect();
        sessions.extend(self.handed.iter().cloned());
        sessions.extend(self.room.connected_sessions(|s: &Sink| s.outbox.is_some()));
        sessions.sort_unstable();
        sessions.dedup();
        for s in sessions {
            self.reconcile(&s);
        }
    }

    /// Checks that every member connected here either follows the feed or
    /// is handed its events: one that did neither would miss them. A
    /// connection already forgotten ([`RoomMachine::forget_local`]) is
    /// exempt: in cluster mode its disconnect is still on its way through the
    /// log while other entries apply, and it reads nothing more.
    #[cfg(debug_assertions)]
    fn check_followers(&self) {
        for s in self.room.connected_sessions(|s: &Sink| s.outbox.is_some()) {
            let Some(m) = self.room.member(&s) else {
                continue;
            };
            if m.sink
                .as_ref()
                .is_some_and(|k| !self.locals.contains_key(&k.conn))
            {
                continue;
            }
            let open = m
                .sink
                .as_ref()
                .and_then(|k| k.outbox.as_ref())
                .is_some_and(Outbox::is_open);
            if m.policy.is_some() {
                assert!(
                    self.handed.contains(&s),
                    "{s} has a policy but is not handed its events"
                );
            } else if open {
                assert!(
                    self.followers.contains_key(s.as_str()),
                    "{s} is connected here but follows no feed"
                );
            }
        }
    }

    /// When held events are next due, by this node's clock.
    pub(crate) fn next_flush(&self) -> Option<Millis> {
        self.held.next_deadline()
    }

    /// Sends what `session` holds: its ack or response comes next and carries
    /// a seq its client takes as "everything before has arrived".
    fn flush_held_of(&mut self, session: &str) {
        let id = self.room.id();
        self.room
            .route_flush(session, &mut self.held, flush::to_local(id, None));
    }

    /// When the feed's next held wake-up is due (busy followers').
    pub(crate) fn next_feed_release(&self) -> Option<Instant> {
        self.feed.next_release()
    }

    /// Wakes the followers whose held wake-up is due at `now`.
    pub(crate) fn release_feed(&self, now: Instant) {
        self.feed.release_due(now);
    }

    /// Sends the held events whose time is up at `now`.
    pub(crate) fn flush_due(&mut self, now: Millis) {
        let id = self.room.id();
        self.room
            .route_due(&mut self.held, now, flush::to_local(id, None));
    }

    /// Disconnects every member on a node that stopped renewing its heartbeat,
    /// in session order (every replica must produce the same events).
    fn node_down(&mut self, dead: &str, now: Millis) {
        let sessions = self.room.connected_sessions(|s: &Sink| *s.node == *dead);
        let mut events = Vec::new();
        for s in sessions {
            events.extend(self.room.disconnect(&s, now));
        }
        self.deliver(&events, now);
        self.reconcile_all();
        if *dead == *self.me {
            self.held = Held::default();
            // The others took this node for dead (a long stall): its clients
            // must reconnect and resume.
            for (_, outbox) in self.locals.drain() {
                outbox.control().close(CloseCode::Restarting);
            }
        }
    }

    /// The room was deleted: this node's members hear so.
    fn close(&mut self) {
        let frame = ServerFrame::Closed {
            room: self.room.id().to_owned(),
            reason: ClosedReason::RoomDeleted,
            message: None,
        }
        .encode();
        self.room.close();
        self.held = Held::default();
        for (_, f) in self.followers.drain() {
            f.outbox.unfollow();
        }
        self.feed.forget_all();
        self.handed.clear();
        for (_, outbox) in self.locals.drain() {
            outbox.send(frame.clone());
        }
    }
}

/// The steps of a spatial tick ([`plaza_core::spatial::Space::last_work`])
/// past which it runs [`outside_the_worker`]: about a millisecond.
const LONG_TICK_STEPS: usize = 20_000;

/// Runs `f`, a step of a room, when `long`, with `block_in_place` on the
/// multi-thread runtime: the tasks queued on this worker are handed to
/// another thread first, so that a room's long step slows only its own room.
fn outside_the_worker<T>(long: bool, f: impl FnOnce() -> T) -> T {
    use tokio::runtime::{Handle, RuntimeFlavor};
    let multi =
        Handle::try_current().is_ok_and(|h| h.runtime_flavor() == RuntimeFlavor::MultiThread);
    if long && multi {
        tokio::task::block_in_place(f)
    } else {
        f()
    }
}

#[cfg(test)]
mod tests {
    use super::outside_the_worker;

    /// A long step hands the worker's other tasks to another thread: a task
    /// queued on the same worker finishes while the step still runs. The
    /// step waits for it, so without the hand-off this test never ends.
    #[test]
    fn a_long_step_lets_the_workers_other_tasks_run() {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let got = rt.block_on(async {
            tokio::spawn(async {
                let (tx, rx) = std::sync::mpsc::channel();
                // Queued on this (the only) worker, behind the step below.
                tokio::spawn(async move { tx.send(7).unwrap() });
                outside_the_worker(true, || {
                    rx.recv_timeout(std::time::Duration::from_secs(10))
                        .expect("the other task ran during the step")
                })
            })
            .await
            .unwrap()
        });
        assert_eq!(got, 7);
    }

    /// On a current-thread runtime (tests, tools) there is no other worker:
    /// the step runs in place instead of panicking in `block_in_place`.
    #[tokio::test]
    async fn on_one_thread_a_long_step_runs_in_place() {
        assert_eq!(outside_the_worker(true, || 3), 3);
        assert_eq!(outside_the_worker(false, || 4), 4);
    }
}
