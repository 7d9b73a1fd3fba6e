//! One room's replica on this node: the cluster-mode room task.
//!
//! Client commands become log records (appended, not applied); log entries
//! are applied in log order, by position `n`, each exactly once. A missed
//! entry (a full mailbox, a broker reconnect) shows as a gap and is read back
//! from the log; a replica too far behind starts again from a snapshot.
//!
//! The log can also go back: a broker failover to a replica that lacked its
//! last entries, after this node applied and delivered them (see
//! [`history`]). The replica tells that from an entry at a position it
//! applied with other contents, or from a log that ends before the last
//! entry it applied when it catches up (as it does after every failover,
//! on subscribing again); it then closes its connections in the room
//! (close code 4005, join again without resuming), their sessions leave,
//! and it rebuilds the room from the broker's snapshot and log
//! (`log::log_went_back`, `reload::rebuild`).

mod clock;
mod history;
mod log;
mod members;
mod reload;
mod webhooks;

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
use crate::outbox::FeedConfig;
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
/// Log notices queued for a replica at most; past that, a notice is read
/// back from the log instead.
const NOTICES: usize = 4096;

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
    /// `plaza_room_wait_seconds`: a command's wait in the mailbox.
    pub(crate) room_wait: metrics::Histogram,
    /// How the room's feed serves this node's members.
    pub(crate) feed_config: FeedConfig,
    /// Where the room's events go as webhooks, if anywhere.
    pub(crate) webhooks: Option<Arc<crate::webhooks::Webhooks>>,
    /// `plaza_log_regressions_total`: times a room's log was seen to go back.
    pub(crate) log_regressions: metrics::Counter,
}

/// Starts hosting room `id` on this node. The replica loads the room's latest
/// snapshot and log before it takes commands; if it cannot, it refuses the
/// commands that reached it and ends.
pub(crate) fn spawn_replica(setup: ReplicaSetup, info: RoomInfo, id: &str) -> RoomHandle {
    let members = Arc::new(AtomicUsize::new(0));
    let (handle, rx) = mailbox(id, info, members.clone());
    let (notices_tx, notices) = mpsc::channel(NOTICES);
    let webhook_writer = setup
        .webhooks
        .as_ref()
        .filter(|w| w.is_durable())
        .map(|w| webhooks::spawn_writer(id.to_owned(), setup.cluster.clone(), w.clone()));
    let task = Replica {
        webhook_writer,
        id: id.to_owned(),
        me: setup.me,
        cluster: setup.cluster,
        host: setup.host,
        handle: handle.clone(),
        notices_tx,
        machine: None,
        applied: 0,
        prints: history::Applied::default(),
        rewritten: false,
        log_regressions: setup.log_regressions,
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
        room_wait: setup.room_wait,
        feed_config: setup.feed_config,
        webhooks_sent: 0,
        webhooks: setup.webhooks,
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
    /// What was applied at the last positions up to `applied`, to tell a
    /// duplicate from a rewritten history.
    prints: history::Applied,
    /// The room's log went back past entries applied here: nothing more is
    /// applied (nor stored as a snapshot) until the replica is rebuilt from
    /// the broker ([`Self::rebuild`]).
    rewritten: bool,
    /// `plaza_log_regressions_total`.
    log_regressions: metrics::Counter,
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
    room_wait: metrics::Histogram,
    feed_config: FeedConfig,
    webhooks: Option<Arc<crate::webhooks::Webhooks>>,
    /// Durable webhooks: where this replica's webhook events and snapshots
    /// are written, in order.
    webhook_writer: Option<mpsc::UnboundedSender<webhooks::Write>>,
    /// The last log position handed to the writer.
    webhooks_sent: u64,
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
            // Held events: this node's own timer (held state is node-local).
            let flush_at = self
                .machine
                .as_ref()
                .and_then(|m| m.next_flush())
                .map(|at| {
                    let wait = at.saturating_sub(crate::clock::now_ms());
                    tokio::time::Instant::now() + Duration::from_millis(wait)
                });
            // Busy followers' wake-ups, held by the feed.
            let release_at = self
                .machine
                .as_ref()
                .and_then(|m| m.next_feed_release())
                .map(tokio::time::Instant::from_std);
            let flush_at = match (flush_at, release_at) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            };
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
                _ = sleep_until(flush_at) => {
                    if let Some(m) = self.machine.as_mut() {
                        m.release_feed(Instant::now());
                        m.flush_due(crate::clock::now_ms());
                    }
                }
                _ = sleep_until(retry) => {
                    self.catch_up_or_retry().await;
                    self.append_retries();
                }
                _ = liveness.tick() => {
                    self.check_nodes();
                    self.send_webhook_cursor();
                }
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
        if self.rewritten {
            // The state is of a history the log no longer has: no snapshot of it.
        } else if self.applied > self.snapshot_at && self.webhook_writer.is_some() {
            // After the events of every entry applied, by the writer.
            self.send_webhook_cursor();
            let bytes = encode_state(self.machine().room(), self.cluster.snapshot_format());
            self.write_snapshot(self.applied, bytes);
        } else if self.applied > self.snapshot_at {
            let bytes = encode_state(self.machine().room(), self.cluster.snapshot_format());
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
            // Joins, and the calls that need no membership here (the server
            // API, admin calls, reads), go to a new replica: they met one
            // that was leaving, not a room that is gone.
            match (cmd, &host) {
                (RoomCommand::Client(c), Some(host))
                    if matches!(
                        c.pending.waiter,
                        Waiter::Join(_) | Waiter::Server(_) | Waiter::Admin(_)
                    ) =>
                {
                    host.clone().rejoin(self.id.clone(), RoomCommand::Client(c));
                }
                (cmd @ (RoomCommand::Read(_) | RoomCommand::Members { .. }), Some(host)) => {
                    host.clone().rejoin(self.id.clone(), cmd);
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
                let ClientCommand {
                    intent,
                    pending,
                    handed_at,
                } = *c;
                self.room_wait.record(handed_at.elapsed().as_secs_f64());
                let conn = pending.conn();
                // Changes that must not be lost are appended until they land.
                let must_land = matches!(intent, Intent::Leave { .. } | Intent::Disconnect { .. });
                if let Intent::Disconnect { .. } = intent {
                    if let Some(m) = &mut self.machine {
                        m.forget_local(conn);
                    }
                }
                // A join that may only resume is written only when this
                // replica holds the session it resumes (a session without
                // a user, in its resume window): a node of an earlier
                // version, which does not know `resume_only`, would apply
                // any other such record as a new member. The room's own
                // check, when the record comes back, still decides.
                if let Intent::Join {
                    resume: Some((token, _)),
                    resume_only: Some((code, message)),
                    ..
                } = &intent
                {
                    let refusal = RoomError::new(*code, message.clone());
                    let room = self.machine().room();
                    if let Err(e) = room.check_resume_only(token, refusal, now_ms()) {
                        return pending.refuse(&self.id, e, &self.errors);
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
            RoomCommand::Members { reply } => {
                let _ = reply.send(self.machine().room().members_info());
            }
            RoomCommand::Read(look) => look(self.machine().room()),
        }
    }

    /// Durable webhooks: tells the writer every entry up to `applied` was
    /// applied, so the room's cursor moves past entries without events.
    fn send_webhook_cursor(&mut self) {
        if let Some(w) = &self.webhook_writer {
            if self.applied > self.webhooks_sent {
                let _ = w.send(webhooks::Write::Events {
                    upto: self.applied,
                    records: Vec::new(),
                });
                self.webhooks_sent = self.applied;
            }
        }
    }

    /// Hands the webhook events of the entry at `n` just applied to the writer.
    fn send_webhook_events(&mut self, n: u64) {
        let (Some(w), Some(hooks), Some(m)) =
            (&self.webhook_writer, &self.webhooks, self.machine.as_mut())
        else {
            return;
        };
        let events = m.take_webhooks();
        if events.is_empty() {
            return;
        }
        let records = events.iter().flat_map(|e| hooks.records(e, n)).collect();
        let _ = w.send(webhooks::Write::Events { upto: n, records });
        self.webhooks_sent = n;
    }

    /// Stores a snapshot: through the writer with durable webhooks (after
    /// the events before it), else at once.
    fn write_snapshot(&self, n: u64, bytes: bytes::Bytes) {
        if let Some(w) = &self.webhook_writer {
            let _ = w.send(webhooks::Write::Snapshot { n, bytes });
            return;
        }
        let cluster = self.cluster.clone();
        let id = self.id.clone();
        tokio::spawn(async move {
            if let Err(e) = cluster.store_snapshot(&id, n, bytes).await {
                tracing::warn!(room = %id, n, error = %e, "snapshot not stored");
            }
        });
    }

    fn machine(&self) -> &RoomMachine {
        self.machine.as_ref().expect("the replica is loaded")
    }
}
