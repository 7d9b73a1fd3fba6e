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
use plaza_core::{Millis, Room, RoomError};
use plaza_protocol::{CloseCode, ErrorCode};
use tokio::sync::{mpsc, Notify};

use super::record::LogRecord;
use super::{encode_state, AppendFailure, Hosting, SNAPSHOT_EVERY, SNAPSHOT_MAX_LAG};
use crate::clock::now_ms;
use crate::metrics::ErrorCounter;
use crate::room::answer::not_joined;
use crate::room::machine::{FollowUp, Origin, RoomMachine};
use crate::room::{
    self, mailbox, sleep_until, ClientCommand, Intent, Pending, RoomCommand, RoomHandle, RoomInfo,
    Sink, Waiter,
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
/// Log notices queued for a replica at most; past that, a notice is read
/// back from the log instead.
const NOTICES: usize = 4096;

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

/// What a replica is told besides its clients' commands.
enum Notice {
    /// An entry of the room's shared log, from the broker.
    Entry(LogEntry),
    /// An append this node made failed.
    AppendFailed(AppendFailure),
}

/// How a replica is set up.
pub(crate) struct ReplicaSetup {
    /// The node that hosts it, told when it ends.
    pub(crate) host: Weak<dyn Hosting>,
    pub(crate) cluster: Arc<dyn Cluster>,
    /// This node's id.
    pub(crate) me: Arc<str>,
    /// How long the room stays hosted without local members.
    pub(crate) linger: Duration,
    pub(crate) errors: ErrorCounter,
}

/// Starts hosting room `id` on this node. The replica loads the room's latest
/// snapshot and log before it takes commands; if it cannot, it refuses the
/// commands that reached it and ends.
pub(crate) fn spawn_replica(setup: ReplicaSetup, info: RoomInfo, id: &str) -> RoomHandle {
    let members = Arc::new(AtomicUsize::new(0));
    let (handle, rx) = mailbox(id, info, members.clone());
    let (notices_tx, notices) = mpsc::channel(NOTICES);
    let task = Replica {
        id: id.to_owned(),
        me: setup.me,
        cluster: setup.cluster,
        host: setup.host,
        handle: handle.clone(),
        notices_tx,
        machine: None,
        applied: 0,
        snapshot_at: 0,
        next_req: 0,
        pending: HashMap::new(),
        retry: Vec::new(),
        members,
        catch_up: Arc::new(Notify::new()),
        behind: false,
        tick_asked: None,
        ticker: None,
        members_recorded: None,
        barrier: None,
        linger: setup.linger,
        errors: setup.errors,
    };
    tokio::spawn(task.run(rx, notices));
    handle
}

struct Replica {
    id: String,
    me: Arc<str>,
    cluster: Arc<dyn Cluster>,
    host: Weak<dyn Hosting>,
    handle: RoomHandle,
    /// Where log entries and append failures are posted.
    notices_tx: mpsc::Sender<Notice>,
    /// The room and this node's members in it; `None` until loaded, and
    /// again once the room is deleted.
    machine: Option<RoomMachine>,
    /// The last log position applied.
    applied: u64,
    /// The log position of the latest snapshot known to be stored.
    snapshot_at: u64,
    next_req: u64,
    /// Who waits for the records this node appended, by request number.
    pending: HashMap<u64, Pending>,
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
    async fn run(
        mut self,
        mut rx: mpsc::Receiver<RoomCommand>,
        mut notices: mpsc::Receiver<Notice>,
    ) {
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
            let no_locals = self.machine.as_ref().is_none_or(|m| m.locals().is_empty());
            let idle = no_locals && self.pending.is_empty() && self.retry.is_empty();
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
                Some(notice) = notices.recv() => match notice {
                    Notice::Entry(e) => self.on_entry(e),
                    Notice::AppendFailed(f) => self.on_append_failed(f),
                },
                _ = self.catch_up.notified() => self.catch_up_or_retry().await,
                _ = sleep_until(deadline) => self.ask_tick(),
                _ = sleep_until(retry) => {
                    self.catch_up_or_retry().await;
                    self.append_retries();
                }
                _ = liveness.tick() => self.check_nodes(),
                _ = sleep_until(unhost_at) => {
                    return self.unhost(&mut rx).await;
                }
            }
            if self.machine.is_none() {
                // Closed: the room was deleted.
                rx.close();
                let e = room::answer::room_deleted(&self.id);
                while let Ok(cmd) = rx.try_recv() {
                    cmd.refuse(&self.id, e.clone(), &self.errors);
                }
                break;
            }
            self.count_members();
        }
        self.cluster.unsubscribe(&self.id).await;
        if let Some(host) = self.host.upgrade() {
            host.forget(&self.id, &self.handle);
        }
    }

    /// Stops hosting the room: no member is here. Commands that reached the
    /// mailbox meanwhile are answered; joins go to a new replica.
    async fn unhost(&mut self, rx: &mut mpsc::Receiver<RoomCommand>) {
        // Unsubscribe before leaving the node's map: a new replica's
        // subscription must not be the one removed.
        self.cluster.unsubscribe(&self.id).await;
        if self.applied > self.snapshot_at {
            let bytes = encode_state(self.machine().room());
            if let Err(e) = self
                .cluster
                .store_snapshot(&self.id, self.applied, bytes)
                .await
            {
                tracing::debug!(room = %self.id, error = %e, "no snapshot on unhosting");
            }
        }
        let host = self.host.upgrade();
        if let Some(host) = &host {
            host.forget(&self.id, &self.handle);
        }
        rx.close();
        while let Ok(cmd) = rx.try_recv() {
            match (cmd, &host) {
                (RoomCommand::Client(c), Some(host))
                    if matches!(c.pending.waiter, Waiter::Join(_)) =>
                {
                    host.clone().rejoin(self.id.clone(), RoomCommand::Client(c));
                }
                (cmd, _) => cmd.refuse(&self.id, not_joined(), &self.errors),
            }
        }
        tracing::debug!(room = %self.id, "no longer hosted here");
    }

    /// Subscribes, then loads the latest snapshot and the log after it.
    async fn host(&mut self) -> Result<(), ClusterError> {
        let notices = self.notices_tx.clone();
        let catch_up = self.catch_up.clone();
        let listener: LogListener = Arc::new(move |notice| match notice {
            LogNotice::Entry(e) => {
                // Never block the broker's task: a full queue means the
                // entry is read back from the log later.
                if notices.try_send(Notice::Entry(e)).is_err() {
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
        if let Some(host) = self.host.upgrade() {
            host.forget(&self.id, &self.handle);
        }
        while let Ok(cmd) = rx.try_recv() {
            cmd.refuse(&self.id, e.clone(), &self.errors);
        }
    }

    fn handle(&mut self, cmd: RoomCommand) {
        match cmd {
            RoomCommand::Client(c) => {
                let ClientCommand { intent, pending } = *c;
                let conn = pending.conn();
                // Changes that must not be lost are appended until they land.
                let must_land = matches!(intent, Intent::Leave { .. } | Intent::Disconnect { .. });
                if let Intent::Disconnect { .. } = intent {
                    if let Some(m) = &mut self.machine {
                        m.forget_local(conn);
                    }
                }
                let pending = match pending.waiter {
                    Waiter::Nothing => None,
                    _ => Some(pending),
                };
                self.submit(conn, intent, pending, must_land);
            }
            RoomCommand::Close { done } => {
                // Deletion goes through the registry, which appends `Close`
                // for every replica.
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
        let notices = self.notices_tx.downgrade();
        tokio::spawn(async move {
            if let Err(error) = append.await {
                let failure = AppendFailure {
                    req,
                    error,
                    retry: must_land.then_some(record),
                };
                if let Some(tx) = notices.upgrade() {
                    let _ = tx.send(Notice::AppendFailed(failure)).await;
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
        if let Some(p) = self.pending.remove(&f.req) {
            p.refuse(&self.id, f.error.into(), &self.errors);
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
        if self.machine.is_none() {
            return;
        }
        match self.catch_up().await {
            Ok(()) => self.behind = false,
            Err(ClusterError::RoomNotFound(_)) => {
                let me = self.me.clone();
                let origin = Origin { node: &me, conn: 0 };
                self.apply_intent(origin, Intent::Close, None, now_ms());
            }
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
                        if self.machine.is_none() {
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
        if self.machine.is_some() && n <= self.applied {
            // The log was trimmed past us and no newer snapshot exists: a bug
            // or a very long stall. Members must resync from scratch.
            tracing::error!(room = %self.id, n, applied = self.applied, "replica cannot continue");
            for outbox in self.machine().locals().values() {
                outbox.control().close(CloseCode::Restarting);
            }
            return Err(ClusterError::Trimmed(self.id.clone()));
        }
        let state: plaza_core::RoomState = serde_json::from_slice(&bytes)
            .map_err(|e| ClusterError::Unavailable(format!("unreadable snapshot: {e}")))?;
        state
            .validate()
            .map_err(|e| ClusterError::Unavailable(format!("invalid snapshot: {e}")))?;
        let me = self.me.clone();
        let skipping = self.machine.is_some();
        let room = {
            let locals = self.machine.as_ref().map(|m| m.locals());
            Room::import(state, |owner: &str| {
                let mut sink = Sink::from_owner(owner);
                if *sink.node == *me {
                    sink.node = me.clone();
                    sink.outbox = locals.and_then(|l| l.get(&sink.conn)).cloned();
                }
                sink
            })
        };
        // Local connections the snapshot no longer counts as members must
        // resume to learn what they missed.
        let kept: BTreeSet<u64> = room
            .connected_sessions(|s: &Sink| s.outbox.is_some())
            .iter()
            .filter_map(|s| room.member(s).and_then(|m| m.sink.as_ref()).map(|s| s.conn))
            .collect();
        // Sessions connected on this node by the snapshot's account, but on
        // no connection here: joins answered in skipped entries, or members
        // of an earlier run of this node id. Nothing else would ever
        // disconnect them (this node is alive, so no `node_down` comes).
        let ghosts: Vec<(u64, String)> = room
            .connected_sessions(|s: &Sink| *s.node == *me && s.outbox.is_none())
            .into_iter()
            .filter_map(|s| {
                let conn = room.member(&s)?.sink.as_ref()?.conn;
                Some((conn, s))
            })
            .collect();
        let keep = |conn: u64, outbox: &crate::outbox::Outbox| {
            let keep = kept.contains(&conn);
            if !keep {
                outbox.control().close(CloseCode::Restarting);
            }
            keep
        };
        match &mut self.machine {
            Some(m) => m.replace_room(room, keep),
            None => self.machine = Some(RoomMachine::new(room, me, self.errors.clone())),
        }
        let skipped_waiting = skipping && !self.pending.is_empty();
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
        let Some(m) = &self.machine else { return };
        let count = m.room().connected();
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
        if record.intent.may_change_members() {
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
        let LogRecord {
            node, conn, intent, ..
        } = record;
        self.apply_intent(Origin { node: &node, conn }, intent, pending, e.ts);
        if self.machine.is_some() {
            self.maybe_snapshot(e.n, origin);
        }
    }

    /// Applies one command through the room's machine and carries out what follows.
    fn apply_intent(
        &mut self,
        origin: Origin<'_>,
        intent: Intent,
        pending: Option<Pending>,
        now: Millis,
    ) {
        let Some(machine) = &mut self.machine else {
            return;
        };
        match machine.apply(origin, intent, pending, now) {
            FollowUp::None => {}
            FollowUp::Orphaned { conn, session } => {
                // The join landed although its append reported a failure
                // (the client was told it failed): nobody is on that connection.
                self.submit(conn, Intent::Disconnect { session }, None, true);
            }
            FollowUp::Closed => {
                let e = RoomError::new(ErrorCode::RoomNotFound, "the room was deleted");
                for (_, p) in self.pending.drain() {
                    if let Waiter::Join(reply) = p.waiter {
                        let _ = reply.send(Err(e.clone()));
                    }
                }
                self.members.store(0, Ordering::Relaxed);
                self.machine = None;
            }
        }
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
        let bytes = encode_state(self.machine().room());
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
        let at = self.machine.as_ref()?.room().next_deadline()?;
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
        let (machine, me) = (&self.machine, &self.me);
        *self.ticker.get_or_insert_with(|| {
            machine
                .as_ref()
                .is_some_and(|m| self_is_ticker(m.room(), me))
        })
    }

    fn ask_tick(&mut self) {
        let Some(at) = self.machine.as_ref().and_then(|m| m.room().next_deadline()) else {
            return;
        };
        self.tick_asked = Some((at, Instant::now()));
        self.submit(0, Intent::Tick, None, false);
    }

    /// Asks the broker whether the nodes this room's members are on are
    /// alive, and appends `NodeDown` for each dead one.
    fn check_nodes(&self) {
        let Some(m) = &self.machine else { return };
        let nodes: BTreeSet<&str> = m
            .room()
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

    fn machine(&self) -> &RoomMachine {
        self.machine.as_ref().expect("the replica is loaded")
    }
}
