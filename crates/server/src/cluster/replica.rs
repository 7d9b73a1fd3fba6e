//! One room's replica on this node: the cluster-mode room task.
//!
//! Client commands become log records (appended, not applied); log entries
//! are applied in log order, by position `n`, each exactly once. A missed
//! entry (a full mailbox, a broker reconnect) shows as a gap and is read back
//! from the log; a replica too far behind starts again from a snapshot.

use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use plaza_broker::{Cluster, ClusterError, LogEntry, LogListener, LogNotice};
use plaza_core::{HistoryEntry, JoinParams, Millis, Resume, Room, RoomError};
use plaza_protocol::server::ServerFrame;
use plaza_protocol::{CloseCode, ErrorCode};
use serde_json::value::RawValue;
use tokio::sync::{mpsc, oneshot, Notify};

use super::record::{Intent, LogRecord};
use super::{encode_state, AppendFailure, RoomMeta, Sink, SNAPSHOT_EVERY, SNAPSHOT_MAX_LAG};
use crate::clock::now_ms;
use crate::node::Node;
use crate::outbox::Outbox;
use crate::room_task::{
    self, error_frame, not_joined, response, DirectMessage, ErrorCounter, JoinCommand, RequestCall,
    RoomCommand, RoomHandle, RoomInfo,
};

/// Entries read from the log per call when catching up.
const READ_BATCH: usize = 512;
/// How often a replica checks that the nodes its members are on are alive.
const LIVENESS_EVERY: Duration = Duration::from_millis(plaza_broker::NODE_HEARTBEAT_MS * 2);
/// Wait before retrying a failed catch-up or a change that must not be lost.
const RETRY_AFTER: Duration = Duration::from_millis(500);
/// How long after a deadline a node that is not the room's ticker asks for
/// the tick itself, in case the ticker cannot (it is stuck, or dead and not
/// yet declared so).
const TICK_FALLBACK: Duration = Duration::from_secs(2);

/// Whether node `me` asks for the room's ticks: the node with the smallest id
/// among those its connected members are on. Every replica agrees on it, so
/// one tick is appended per deadline instead of one per hosting node; when no
/// node has members, every host asks.
fn self_is_ticker(room: &Room<Sink>, me: &str) -> bool {
    room.connected_sinks()
        .map(|s| &*s.node)
        .min()
        .is_none_or(|first| first == me)
}

/// Starts hosting room `id` on this node. The replica loads the room's latest
/// snapshot and log before it takes commands; if it cannot, it refuses the
/// commands that reached it and ends.
pub(crate) fn spawn_replica(
    node: &Arc<Node>,
    cluster: Arc<dyn Cluster>,
    meta: &RoomMeta,
    id: &str,
) -> RoomHandle {
    let members = Arc::new(AtomicUsize::new(0));
    let info = RoomInfo {
        id,
        name: &meta.name,
        created_at: meta.created_at,
        access: meta.access(),
        history_size: meta.history_size,
        max_members: meta.max_members,
        presence: meta.presence,
    };
    let (handle, rx) = room_task::mailbox(info, members.clone());
    let catch_up = Arc::new(Notify::new());
    let task = Replica {
        id: id.to_owned(),
        me: node.id().into(),
        cluster,
        node: Arc::downgrade(node),
        handle: handle.clone(),
        room: None,
        applied: 0,
        snapshot_at: 0,
        next_req: 0,
        pending: HashMap::new(),
        locals: HashMap::new(),
        retry: Vec::new(),
        members,
        catch_up: catch_up.clone(),
        behind: false,
        tick_asked: None,
        ticker: None,
        members_recorded: None,
        barrier: None,
        linger: Duration::from_millis(node.config().room_linger_ms),
        errors: room_task::metrics_errors(&node.metrics),
    };
    tokio::spawn(task.run(rx));
    handle
}

/// Who waits for the outcome of a record this node appended.
struct Pending {
    outbox: Outbox,
    waiter: Waiter,
}

enum Waiter {
    Join(oneshot::Sender<Result<String, RoomError>>),
    Leave,
    Publish(Option<String>),
    Request(Box<RawValue>),
    Direct,
}

struct Replica {
    id: String,
    me: Arc<str>,
    cluster: Arc<dyn Cluster>,
    node: Weak<Node>,
    handle: RoomHandle,
    /// `None` until loaded.
    room: Option<Room<Sink>>,
    /// The last log position applied.
    applied: u64,
    /// The log position of the latest snapshot known to be stored.
    snapshot_at: u64,
    next_req: u64,
    pending: HashMap<u64, Pending>,
    /// This node's connections with a member in the room.
    locals: HashMap<u64, Outbox>,
    /// Records that must be appended again (disconnects and leaves).
    retry: Vec<bytes::Bytes>,
    /// The member count the summary shows.
    members: Arc<AtomicUsize>,
    /// Signalled when entries may have been missed.
    catch_up: Arc<Notify>,
    /// Whether a catch-up failed and must be tried again.
    behind: bool,
    /// The deadline a tick was last asked for, so it is not asked again and again.
    tick_asked: Option<(Millis, Instant)>,
    /// Whether this node is the room's ticker, as of the last change to the
    /// members (`None`: to be computed: a pass over the members, too much for
    /// every message).
    ticker: Option<bool>,
    /// The member count this node last recorded in the registry, for nodes
    /// that do not host the room.
    members_recorded: Option<usize>,
    /// After skipping entries to a snapshot: the request number of the record
    /// this node appended right after, whose arrival tells which waiting
    /// commands were among the skipped entries (see [`Self::restart_skipped`]).
    barrier: Option<u64>,
    /// How long the room stays hosted without local members.
    linger: Duration,
    errors: ErrorCounter,
}

impl Replica {
    async fn run(mut self, mut rx: mpsc::Receiver<RoomCommand>) {
        if let Err(e) = self.host().await {
            tracing::warn!(room = %self.id, error = %e, "cannot host room");
            self.give_up(&mut rx, e.into()).await;
            return;
        }
        let mut liveness = tokio::time::interval(LIVENESS_EVERY);
        liveness.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut idle_since: Option<tokio::time::Instant> = None;
        loop {
            let deadline = self.tick_deadline();
            let retry = (self.behind || !self.retry.is_empty())
                .then(|| tokio::time::Instant::now() + RETRY_AFTER);
            // A node hosts a room while it has members there, and a while
            // after (they often come back), not forever: every hosted room
            // costs a subscription and the work of applying its log.
            let idle = self.locals.is_empty() && self.pending.is_empty() && self.retry.is_empty();
            idle_since = if idle {
                idle_since.or_else(|| Some(tokio::time::Instant::now()))
            } else {
                None
            };
            let unhost_at = idle_since.map(|t| t + self.linger);
            tokio::select! {
                cmd = rx.recv() => match cmd {
                    None => break,
                    Some(cmd) => self.handle(cmd),
                },
                _ = self.catch_up.notified() => self.catch_up_or_retry().await,
                _ = room_task::sleep_until(deadline) => self.ask_tick(),
                _ = room_task::sleep_until(retry) => {
                    self.catch_up_or_retry().await;
                    self.append_retries();
                }
                _ = liveness.tick() => self.check_nodes(),
                _ = room_task::sleep_until(unhost_at) => {
                    return self.unhost(&mut rx).await;
                }
            }
            if self.room.is_none() {
                // Closed: the room was deleted.
                rx.close();
                while let Ok(cmd) = rx.try_recv() {
                    self.refuse_closed(cmd);
                }
                break;
            }
            self.count_members();
        }
        self.cluster.unsubscribe(&self.id).await;
        if let Some(node) = self.node.upgrade() {
            node.forget_room(&self.id, &self.handle);
        }
    }

    /// Stops hosting the room: no member is here. Commands that reached the
    /// mailbox meanwhile are answered; joins go to a new replica.
    async fn unhost(&mut self, rx: &mut mpsc::Receiver<RoomCommand>) {
        // Unsubscribe before leaving the node's map: a new replica's
        // subscription must not be the one removed.
        self.cluster.unsubscribe(&self.id).await;
        if self.applied > self.snapshot_at {
            let bytes = encode_state(self.room_ref());
            if let Err(e) = self
                .cluster
                .store_snapshot(&self.id, self.applied, bytes)
                .await
            {
                tracing::debug!(room = %self.id, error = %e, "no snapshot on unhosting");
            }
        }
        let node = self.node.upgrade();
        if let Some(node) = &node {
            node.forget_room(&self.id, &self.handle);
        }
        rx.close();
        while let Ok(cmd) = rx.try_recv() {
            match (cmd, &node) {
                (RoomCommand::Join(join), Some(node)) => {
                    let node = node.clone();
                    let id = self.id.clone();
                    tokio::spawn(async move {
                        match node.room_for_join(&id).await {
                            // If that fails too, dropping the reply tells the
                            // connection the room is gone.
                            Ok(h) => drop(h.send(RoomCommand::Join(join)).await),
                            Err(e) => drop(join.reply.send(Err(e))),
                        }
                    });
                }
                (cmd, _) => self.refuse_command(cmd, not_joined()),
            }
        }
        tracing::debug!(room = %self.id, "no longer hosted here");
    }

    /// Subscribes, then loads the latest snapshot and the log after it.
    async fn host(&mut self) -> Result<(), ClusterError> {
        let handle = self.handle.clone();
        let catch_up = self.catch_up.clone();
        let listener: LogListener = Arc::new(move |notice| match notice {
            LogNotice::Entry(e) => {
                // Never block the broker's task: a full mailbox means the
                // entry is read back from the log later.
                if !handle.try_send(RoomCommand::Log(Box::new(e))) {
                    catch_up.notify_one();
                }
            }
            LogNotice::Resubscribed => catch_up.notify_one(),
        });
        self.cluster.subscribe(&self.id, listener).await?;
        self.reload().await?;
        self.catch_up().await
    }

    /// Refuses every queued command (hosting failed) and leaves the node's map.
    async fn give_up(&mut self, rx: &mut mpsc::Receiver<RoomCommand>, e: RoomError) {
        self.cluster.unsubscribe(&self.id).await;
        rx.close();
        if let Some(node) = self.node.upgrade() {
            node.forget_room(&self.id, &self.handle);
        }
        while let Ok(cmd) = rx.try_recv() {
            self.refuse_command(cmd, e.clone());
        }
    }

    fn refuse_closed(&mut self, cmd: RoomCommand) {
        let e = RoomError::new(
            ErrorCode::RoomNotFound,
            format!("room {:?} was deleted", self.id),
        );
        self.refuse_command(cmd, e);
    }

    /// Answers a command that will not be carried out.
    fn refuse_command(&mut self, cmd: RoomCommand, e: RoomError) {
        match cmd {
            RoomCommand::Join(j) => {
                let _ = j.reply.send(Err(e));
            }
            RoomCommand::Publish { outbox, params, .. } => {
                self.refuse(&outbox, e, "publish", params.id.clone())
            }
            RoomCommand::Request { outbox, call, .. } => {
                (self.errors)(e.code);
                outbox.send(response(&self.id, call.nonce, Err(e)).encode(), None);
            }
            RoomCommand::Direct { outbox, .. } => self.refuse(&outbox, e, "direct", None),
            RoomCommand::Leave { outbox, .. } => {
                outbox.send(
                    ServerFrame::Left {
                        room: self.id.clone(),
                    }
                    .encode(),
                    None,
                );
            }
            RoomCommand::Close { done } => {
                let _ = done.send(());
            }
            RoomCommand::Disconnect { .. } | RoomCommand::Log(_) | RoomCommand::AppendFailed(_) => {
            }
        }
    }

    fn handle(&mut self, cmd: RoomCommand) {
        match cmd {
            RoomCommand::Log(entry) => self.on_entry(*entry),
            RoomCommand::AppendFailed(f) => self.on_append_failed(*f),
            RoomCommand::Join(join) => {
                let JoinCommand {
                    params,
                    resume,
                    reply,
                } = *join;
                let conn = params.sink.control().id();
                let intent = Intent::Join {
                    session: params.session,
                    resume_token: params.resume_token,
                    name: params.name,
                    platform: params.platform,
                    channels: params.channels,
                    ticket: params.ticket,
                    resume: resume.map(|r| (r.token, r.last_seq)),
                };
                let pending = Pending {
                    outbox: params.sink,
                    waiter: Waiter::Join(reply),
                };
                self.submit(conn, intent, Some(pending), false);
            }
            RoomCommand::Leave { session, outbox } => {
                let conn = outbox.control().id();
                let pending = Pending {
                    outbox,
                    waiter: Waiter::Leave,
                };
                self.submit(conn, Intent::Leave { session }, Some(pending), true);
            }
            RoomCommand::Disconnect { session, outbox } => {
                let conn = outbox.control().id();
                self.locals.remove(&conn);
                self.submit(conn, Intent::Disconnect { session }, None, true);
            }
            RoomCommand::Publish {
                session,
                outbox,
                params,
            } => {
                let conn = outbox.control().id();
                let pending = Pending {
                    outbox,
                    waiter: Waiter::Publish(params.id.clone()),
                };
                let intent = Intent::Publish {
                    session,
                    params: *params,
                };
                self.submit(conn, intent, Some(pending), false);
            }
            RoomCommand::Request {
                session,
                outbox,
                call,
            } => {
                let conn = outbox.control().id();
                let RequestCall { nonce, op } = *call;
                let pending = Pending {
                    outbox,
                    waiter: Waiter::Request(nonce.clone()),
                };
                let intent = Intent::Request { session, nonce, op };
                self.submit(conn, intent, Some(pending), false);
            }
            RoomCommand::Direct {
                session,
                outbox,
                message,
            } => {
                let conn = outbox.control().id();
                let DirectMessage { to, event, data } = *message;
                let pending = Pending {
                    outbox,
                    waiter: Waiter::Direct,
                };
                let intent = Intent::Direct {
                    session,
                    to,
                    event,
                    data,
                };
                self.submit(conn, intent, Some(pending), false);
            }
            RoomCommand::Close { done } => {
                // Deletion goes through the registry (Node::delete_room),
                // which appends `Close` for every replica.
                let _ = done.send(());
            }
        }
    }

    /// Appends a record; its outcome comes when the log delivers it back.
    fn submit(&mut self, conn: u64, intent: Intent, pending: Option<Pending>, must_land: bool) {
        self.next_req += 1;
        let req = self.next_req;
        if let Some(p) = pending {
            self.pending.insert(req, p);
        }
        let record = LogRecord {
            node: self.me.to_string(),
            conn,
            req,
            intent,
        }
        .encode();
        self.append(req, record, must_land);
    }

    fn append(&self, req: u64, record: bytes::Bytes, must_land: bool) {
        // Called here, in command order: appends from one node keep their order.
        let append = self.cluster.append(&self.id, record.clone());
        let mailbox = self.handle.downgrade();
        tokio::spawn(async move {
            if let Err(error) = append.await {
                let failure = AppendFailure {
                    req,
                    error,
                    retry: must_land.then_some(record),
                };
                if let Some(tx) = mailbox.upgrade() {
                    let _ = tx.send(RoomCommand::AppendFailed(Box::new(failure))).await;
                }
            }
        });
    }

    fn append_retries(&mut self) {
        for record in std::mem::take(&mut self.retry) {
            self.append(0, record, true);
        }
    }

    fn on_append_failed(&mut self, f: AppendFailure) {
        if let Some(record) = f.retry {
            self.retry.push(record);
        }
        if self.barrier == Some(f.req) {
            // Nothing will tell the skipped commands from the others.
            self.barrier = None;
            self.restart_skipped(f.req);
        }
        let Some(p) = self.pending.remove(&f.req) else {
            return;
        };
        let e: RoomError = f.error.into();
        match p.waiter {
            Waiter::Join(reply) => {
                let _ = reply.send(Err(e));
            }
            Waiter::Leave => {
                // The member is out as far as its connection is concerned;
                // the leave is appended again until it lands.
                p.outbox.send(
                    ServerFrame::Left {
                        room: self.id.clone(),
                    }
                    .encode(),
                    None,
                );
            }
            Waiter::Publish(id) => self.refuse(&p.outbox, e, "publish", id),
            Waiter::Request(nonce) => {
                (self.errors)(e.code);
                p.outbox
                    .send(response(&self.id, nonce, Err(e)).encode(), None);
            }
            Waiter::Direct => self.refuse(&p.outbox, e, "direct", None),
        }
    }

    /// A log entry from the subscription.
    fn on_entry(&mut self, e: LogEntry) {
        if e.n <= self.applied {
            return;
        }
        if e.n > self.applied + 1 {
            // A gap: read the missing entries (this one included) from the log.
            self.behind = true;
            self.catch_up.notify_one();
            return;
        }
        self.apply(e);
    }

    async fn catch_up_or_retry(&mut self) {
        if self.room.is_none() {
            return;
        }
        match self.catch_up().await {
            Ok(()) => self.behind = false,
            Err(ClusterError::RoomNotFound(_)) => self.close(),
            Err(e) => {
                tracing::debug!(room = %self.id, error = %e, "catch-up failed; retrying");
                self.behind = true;
            }
        }
    }

    /// Applies every entry after `applied` that the log holds.
    async fn catch_up(&mut self) -> Result<(), ClusterError> {
        loop {
            match self.cluster.read(&self.id, self.applied, READ_BATCH).await {
                Ok(entries) if entries.is_empty() => return Ok(()),
                Ok(entries) => {
                    for e in entries {
                        if e.n == self.applied + 1 {
                            self.apply(e);
                        }
                        if self.room.is_none() {
                            return Ok(());
                        }
                    }
                }
                Err(ClusterError::Trimmed(_)) => self.reload().await?,
                Err(e) => return Err(e),
            }
        }
    }

    /// Replaces the replica's state with the latest snapshot (only if it is
    /// ahead of what was applied).
    async fn reload(&mut self) -> Result<(), ClusterError> {
        let Some((n, bytes)) = self.cluster.load_snapshot(&self.id).await? else {
            return Err(ClusterError::RoomNotFound(self.id.clone()));
        };
        if self.room.is_some() && n <= self.applied {
            // The log was trimmed past us and no newer snapshot exists: a bug
            // or a very long stall. Members must resync from scratch.
            tracing::error!(room = %self.id, n, applied = self.applied, "replica cannot continue");
            for outbox in self.locals.values() {
                outbox.control().close(CloseCode::Restarting);
            }
            return Err(ClusterError::Trimmed(self.id.clone()));
        }
        let skipping = self.room.is_some();
        let state: plaza_core::RoomState = serde_json::from_slice(&bytes)
            .map_err(|e| ClusterError::Unavailable(format!("unreadable snapshot: {e}")))?;
        state
            .validate()
            .map_err(|e| ClusterError::Unavailable(format!("invalid snapshot: {e}")))?;
        let me = self.me.clone();
        let locals = &self.locals;
        let room = Room::import(state, |owner: &str| {
            let mut sink = Sink::from_owner(owner);
            if *sink.node == *me {
                sink.outbox = locals.get(&sink.conn).cloned();
            }
            sink
        });
        // Local connections the snapshot no longer counts as members must
        // resume to learn what they missed.
        let kept: BTreeSet<u64> = room
            .connected_sessions(|s: &Sink| s.outbox.is_some())
            .iter()
            .filter_map(|s| room.member(s).and_then(|m| m.sink.as_ref()).map(|s| s.conn))
            .collect();
        self.locals.retain(|conn, outbox| {
            let keep = kept.contains(conn);
            if !keep {
                outbox.control().close(CloseCode::Restarting);
            }
            keep
        });
        // Sessions connected on this node by the snapshot's account, but on
        // no connection here: joins answered in skipped entries, or members
        // of an earlier run of this node id. Nothing else would ever
        // disconnect them (this node is alive, so no `node_down` comes).
        let me = &self.me;
        let ghosts: Vec<(u64, String)> = room
            .connected_sessions(|s: &Sink| *s.node == **me && s.outbox.is_none())
            .into_iter()
            .filter_map(|s| {
                let conn = room.member(&s)?.sink.as_ref()?.conn;
                Some((conn, s))
            })
            .collect();
        let skipped_waiting = skipping && !self.pending.is_empty();
        self.room = Some(room);
        self.ticker = None;
        self.applied = n;
        self.snapshot_at = self.snapshot_at.max(n);
        for (conn, session) in ghosts {
            self.submit(conn, Intent::Disconnect { session }, None, true);
        }
        if skipped_waiting {
            // A record appended now lands after everything this node appended
            // before (appends keep call order): once it is applied, a command
            // still waiting had its record among the skipped entries. A tick
            // serves, as it changes nothing that is not due.
            self.submit(0, Intent::Tick, None, false);
            self.barrier = Some(self.next_req);
        }
        Ok(())
    }

    /// Publishes the member count: to this node's summaries, and (from the
    /// ticker, when it changed) to the registry, where nodes that do not host
    /// the room read it.
    fn count_members(&mut self) {
        let Some(room) = &self.room else { return };
        let count = room.connected();
        self.members.store(count, Ordering::Relaxed);
        if self.members_recorded == Some(count) || !self.is_ticker() {
            return;
        }
        self.members_recorded = Some(count);
        let cluster = self.cluster.clone();
        let id = self.id.clone();
        let at = self.applied;
        tokio::spawn(async move {
            if let Err(e) = cluster.set_room_members(&id, count as u64, at).await {
                // Shown again with the next change; meanwhile other nodes show the old count.
                tracing::debug!(room = %id, error = %e, "member count not recorded");
            }
        });
    }

    /// After skipping entries to a snapshot, the commands appended before
    /// request `barrier` and still unanswered when its record arrives had
    /// their records among the skipped entries: their answers would never
    /// come. Their connections are told to reconnect (1012): a resume then
    /// replays what became of each (its own state changes included), and
    /// unacknowledged publishes are retried by id. (All of them when the
    /// barrier itself could not be appended.)
    fn restart_skipped(&mut self, barrier: u64) {
        let skipped: Vec<u64> = self
            .pending
            .keys()
            .copied()
            .filter(|r| *r < barrier)
            .collect();
        for req in skipped {
            let Some(p) = self.pending.remove(&req) else {
                continue;
            };
            p.outbox.control().close(CloseCode::Restarting);
            if let Waiter::Join(reply) = p.waiter {
                let _ = reply.send(Err(RoomError::new(
                    ErrorCode::BrokerUnavailable,
                    "the room's log moved on while joining: reconnect and join again",
                )));
            }
        }
    }

    /// Applies the entry at `applied + 1`.
    fn apply(&mut self, e: LogEntry) {
        self.applied = e.n;
        let record = match LogRecord::decode(&e.payload) {
            Ok(r) => r,
            Err(err) => {
                tracing::error!(room = %self.id, n = e.n, error = %err, "unreadable log record skipped");
                return;
            }
        };
        if !matches!(
            record.intent,
            Intent::Publish { .. } | Intent::Direct { .. }
        ) {
            // The members may have changed.
            self.ticker = None;
        }
        let origin = *record.node == *self.me;
        if origin && self.barrier == Some(record.req) {
            self.barrier = None;
            self.restart_skipped(record.req);
        }
        let pending = if origin {
            self.pending.remove(&record.req)
        } else {
            None
        };
        self.apply_record(record, pending, e.ts);
        if self.room.is_some() {
            self.maybe_snapshot(e.n, origin);
        }
    }

    fn apply_record(&mut self, record: LogRecord, pending: Option<Pending>, now: Millis) {
        let LogRecord {
            node, conn, intent, ..
        } = record;
        if let Intent::Close = intent {
            return self.close();
        }
        if let Intent::NodeDown { node: dead } = intent {
            return self.node_down(&dead, now);
        }
        if let Intent::Tick = intent {
            let events = self.room_mut().tick(now);
            return self.deliver(&events);
        }
        let mine = *node == *self.me;
        let connected = |room: &Room<Sink>, session: &str| {
            room.member(session)
                .and_then(|m| m.sink.as_ref())
                .is_some_and(|s| s.is(&node, conn))
        };
        match intent {
            Intent::Join {
                session,
                resume_token,
                name,
                platform,
                channels,
                ticket,
                resume,
            } => {
                let (outbox, reply) = match pending {
                    Some(Pending {
                        outbox,
                        waiter: Waiter::Join(reply),
                    }) => (Some(outbox), Some(reply)),
                    _ => (None, None),
                };
                let params = JoinParams {
                    session,
                    resume_token,
                    name,
                    platform,
                    channels,
                    ticket,
                    sink: Sink {
                        node: node.as_str().into(),
                        conn,
                        outbox: outbox.clone(),
                    },
                };
                let resume = resume.map(|(token, last_seq)| Resume { token, last_seq });
                let result = self.room_mut().join(params, resume, now);
                match result {
                    Ok(joined) => {
                        if let Some(old) = joined.replaced.as_ref() {
                            if let Some(o) = &old.outbox {
                                let frame = ServerFrame::Closed {
                                    room: self.id.clone(),
                                    reason: "resumed_elsewhere".into(),
                                };
                                o.control().evict(&self.id);
                                o.send(frame.encode(), None);
                                self.locals.remove(&old.conn);
                            }
                        }
                        let session = joined.frame.session.clone();
                        match (outbox, reply) {
                            (Some(outbox), Some(reply)) => {
                                outbox.send(joined.server_frame().encode(), None);
                                for e in &joined.missed {
                                    outbox.send(e.frame.clone(), None);
                                }
                                self.locals.insert(conn, outbox);
                                let _ = reply.send(Ok(session));
                            }
                            _ if mine => {
                                // The join landed although its append reported
                                // a failure (the client was told it failed):
                                // nobody is on that connection.
                                self.submit(conn, Intent::Disconnect { session }, None, true);
                            }
                            _ => {}
                        }
                        self.deliver(&joined.events);
                    }
                    Err(e) => {
                        if let Some(reply) = reply {
                            let _ = reply.send(Err(e));
                        }
                    }
                }
            }
            Intent::Leave { session } => {
                if connected(self.room_ref(), &session) {
                    let events = self.room_mut().leave(&session, now);
                    self.deliver(&events);
                }
                if mine {
                    self.locals.remove(&conn);
                }
                if let Some(p) = pending {
                    p.outbox.send(
                        ServerFrame::Left {
                            room: self.id.clone(),
                        }
                        .encode(),
                        None,
                    );
                }
            }
            Intent::Disconnect { session } => {
                if connected(self.room_ref(), &session) {
                    let events = self.room_mut().disconnect(&session, now);
                    self.deliver(&events);
                }
            }
            Intent::Publish { session, params } => {
                let id = params.id.clone();
                if !connected(self.room_ref(), &session) {
                    if let Some(p) = pending {
                        self.refuse(&p.outbox, not_joined(), "publish", id);
                    }
                    return;
                }
                match self.room_mut().publish(&session, params, now) {
                    Ok(p) => {
                        if let Some(e) = &p.entry {
                            self.deliver(std::slice::from_ref(e));
                        }
                        if let Some(w) = pending {
                            let ack = ServerFrame::Ack {
                                room: self.id.clone(),
                                seq: p.seq,
                                id,
                                duplicate: p.entry.is_none(),
                            };
                            w.outbox.send(ack.encode(), None);
                        }
                    }
                    Err(e) => {
                        if let Some(p) = pending {
                            self.refuse(&p.outbox, e, "publish", id);
                        }
                    }
                }
            }
            Intent::Request { session, nonce, op } => {
                let result = if connected(self.room_ref(), &session) {
                    self.room_mut().request(&session, op, now)
                } else {
                    Err(not_joined())
                };
                let frame = match result {
                    Ok(out) => {
                        self.deliver(&out.events);
                        response(&self.id, nonce, Ok(out.result))
                    }
                    Err(e) => {
                        if pending.is_some() {
                            (self.errors)(e.code);
                        }
                        response(&self.id, nonce, Err(e))
                    }
                };
                if let Some(p) = pending {
                    p.outbox.send(frame.encode(), None);
                }
            }
            Intent::Direct {
                session,
                to,
                event,
                data,
            } => {
                let room = self.room_ref();
                let target = if connected(room, &session) {
                    room.direct_target(&session, &to).map(|s| s.outbox.clone())
                } else {
                    Err(not_joined())
                };
                match target {
                    Ok(Some(outbox)) => {
                        let frame = ServerFrame::Direct {
                            room: self.id.clone(),
                            from: session,
                            event,
                            data,
                        };
                        outbox.send(frame.encode(), None);
                    }
                    // The target is on another node, which delivers it.
                    Ok(None) => {}
                    Err(e) => {
                        if let Some(p) = pending {
                            self.refuse(&p.outbox, e, "direct", None);
                        }
                    }
                }
            }
            Intent::Tick | Intent::NodeDown { .. } | Intent::Close => unreachable!("handled above"),
        }
    }

    /// Disconnects every member on a node that stopped renewing its heartbeat,
    /// in session order (every replica must produce the same events).
    fn node_down(&mut self, dead: &str, now: Millis) {
        let room = self.room_mut();
        let sessions = room.connected_sessions(|s: &Sink| *s.node == *dead);
        let mut events = Vec::new();
        for s in sessions {
            events.extend(room.disconnect(&s, now));
        }
        self.deliver(&events);
        if *dead == *self.me {
            // The others took this node for dead (a long stall): its clients
            // must reconnect and resume.
            for (_, outbox) in self.locals.drain() {
                outbox.control().close(CloseCode::Restarting);
            }
        }
    }

    /// The room was deleted: members hear so and the replica ends.
    fn close(&mut self) {
        let frame = ServerFrame::Closed {
            room: self.id.clone(),
            reason: "room_deleted".into(),
        }
        .encode();
        for (_, outbox) in self.locals.drain() {
            outbox.send(frame.clone(), None);
        }
        for (_, p) in self.pending.drain() {
            if let Waiter::Join(reply) = p.waiter {
                let _ = reply.send(Err(RoomError::new(
                    ErrorCode::RoomNotFound,
                    "the room was deleted",
                )));
            }
        }
        self.members.store(0, Ordering::Relaxed);
        self.room = None;
    }

    fn maybe_snapshot(&mut self, n: u64, origin: bool) {
        if n.is_multiple_of(SNAPSHOT_EVERY) && !origin {
            // Its origin stores this one: the lag counts from here, so that
            // other replicas do not store snapshots of their own as well.
            self.snapshot_at = n;
            return;
        }
        let due = (origin && n.is_multiple_of(SNAPSHOT_EVERY))
            || n >= self.snapshot_at + SNAPSHOT_MAX_LAG;
        if !due {
            return;
        }
        self.snapshot_at = n;
        let bytes = encode_state(self.room_ref());
        let cluster = self.cluster.clone();
        let id = self.id.clone();
        tokio::spawn(async move {
            if let Err(e) = cluster.store_snapshot(&id, n, bytes).await {
                tracing::warn!(room = %id, n, error = %e, "snapshot not stored");
            }
        });
    }

    /// The next time the room's clock has work, unless a tick for it was asked
    /// for lately (the broker's clock may lag this node's a little).
    fn tick_deadline(&mut self) -> Option<tokio::time::Instant> {
        let at = self.room.as_ref()?.next_deadline()?;
        let ticker = self.is_ticker();
        let wait = match self.tick_asked {
            Some((asked, when)) if asked == at => {
                (when + RETRY_AFTER).saturating_duration_since(Instant::now())
            }
            _ => Duration::from_millis(at.saturating_sub(now_ms())),
        };
        if ticker {
            return Some(tokio::time::Instant::now() + wait);
        }
        // Others wait until the fallback time after the deadline itself (not
        // after now: the loop recomputes this on every command, which would
        // push a relative delay away for ever).
        let fallback_at = at.saturating_add(TICK_FALLBACK.as_millis() as Millis);
        let fallback = Duration::from_millis(fallback_at.saturating_sub(now_ms()));
        Some(tokio::time::Instant::now() + wait.max(fallback))
    }

    /// Whether this node asks for the room's ticks (see [`self_is_ticker`]),
    /// computed once per change to the members.
    fn is_ticker(&mut self) -> bool {
        let (room, me) = (&self.room, &self.me);
        *self
            .ticker
            .get_or_insert_with(|| room.as_ref().is_some_and(|r| self_is_ticker(r, me)))
    }

    fn ask_tick(&mut self) {
        let Some(at) = self.room.as_ref().and_then(|r| r.next_deadline()) else {
            return;
        };
        self.tick_asked = Some((at, Instant::now()));
        self.submit(0, Intent::Tick, None, false);
    }

    /// Asks the broker whether the nodes this room's members are on are
    /// alive, and appends `NodeDown` for each dead one.
    fn check_nodes(&self) {
        let Some(room) = &self.room else { return };
        let nodes: BTreeSet<&str> = room
            .connected_sinks()
            .map(|s| &*s.node)
            .filter(|n| *n != &*self.me)
            .collect();
        let nodes: Vec<String> = nodes.into_iter().map(str::to_owned).collect();
        if nodes.is_empty() {
            return;
        }
        let cluster = self.cluster.clone();
        let id = self.id.clone();
        let me = self.me.to_string();
        tokio::spawn(async move {
            let Ok(alive) = cluster.nodes_alive(&nodes).await else {
                return;
            };
            for (node, alive) in nodes.into_iter().zip(alive) {
                if !alive {
                    tracing::info!(room = %id, node = %node, "node is gone: disconnecting its members");
                    let record = LogRecord {
                        node: me.clone(),
                        conn: 0,
                        req: 0,
                        intent: Intent::NodeDown { node },
                    };
                    let _ = cluster.append(&id, record.encode()).await;
                }
            }
        });
    }

    /// Hands each event to this node's recipients.
    fn deliver(&self, events: &[Arc<HistoryEntry>]) {
        if events.is_empty() {
            return;
        }
        let room = self.room_ref();
        let ordered_at = Some(Instant::now());
        for e in events {
            room.for_each_recipient(e, |_, sink| {
                if let Some(o) = &sink.outbox {
                    o.send(e.frame.clone(), ordered_at);
                }
            });
        }
    }

    fn refuse(&self, outbox: &Outbox, e: RoomError, frame: &str, id: Option<String>) {
        (self.errors)(e.code);
        outbox.send(error_frame(&self.id, e, frame, id).encode(), None);
    }

    fn room_ref(&self) -> &Room<Sink> {
        self.room.as_ref().expect("the replica is loaded")
    }

    fn room_mut(&mut self) -> &mut Room<Sink> {
        self.room.as_mut().expect("the replica is loaded")
    }
}
