//! The append task: one batch in flight, so one node's appends to a room
//! reach Redis in the order they were called while many share a round
//! trip. A batch's entries for one room go in one `append.lua` call.
//!
//! On one server a batch is one pipeline on the task's own connection. On a
//! Redis Cluster appends go in lanes, one per primary, each with one batch
//! in flight and none waiting for another ([`lanes`]); a batch goes as one
//! pipeline per primary, and a call redirected elsewhere is made again
//! there (a redirection means it did not run; see [`Shards::send`]).
//!
//! With [`BrokerAck::Replicas`](super::BrokerAck::Replicas) a call is
//! followed by `WAIT N` on the same connection (on a Redis Cluster, in the
//! same pipeline, so on that slot's primary), then, if WAIT counted N
//! replicas, by one `publish.lua` per room. Entries WAIT did not confirm
//! fail as unavailable and are never published by this node; they stay in
//! the log, hidden from reads until a later entry of their room is confirmed
//! (their replication then is too).

use std::sync::Arc;
use std::time::Duration;

use ::redis::aio::MultiplexedConnection;
use ::redis::{
    AsyncConnectionConfig, Client, Cmd, Pipeline, ProtocolVersion, RedisResult, ServerErrorKind,
    Value,
};
use bytes::Bytes;
use tokio::sync::{mpsc, oneshot, watch};
use tokio_util::sync::CancellationToken;

use super::connect::{self, Servers};
use super::errors::{guarded, unavailable};
use super::scripts::{APPEND, PUBLISH};

mod lanes;
use super::shards::{slot_of, Addr, Routed, Shards};
use super::wire::encode_message;
use super::RedisConfig;
use crate::{AppendFuture, ClusterError, LogPosition};

/// Appends taken into one batch at most.
const MAX_BATCH: usize = 512;

type Reply = oneshot::Sender<Result<LogPosition, ClusterError>>;

/// One append, with the names `append.lua` needs.
pub(super) struct AppendRequest {
    pub(super) room: String,
    pub(super) meta_key: String,
    pub(super) log_key: String,
    pub(super) channel: String,
    pub(super) payload: Bytes,
}

pub(super) struct Queued {
    request: AppendRequest,
    reply: Reply,
    /// The hash slot of the room's keys (on a Redis Cluster).
    pub(super) slot: u16,
}

/// A batch's appends to one room, in call order.
struct Group {
    entries: Vec<Queued>,
}

impl Group {
    fn request(&self) -> &AppendRequest {
        &self.entries[0].request
    }

    fn fail(self, e: &ClusterError) {
        for q in self.entries {
            let _ = q.reply.send(Err(e.clone()));
        }
    }
}

/// `batch` by room, each room's appends in call order.
fn by_room(batch: Vec<Queued>) -> Vec<Group> {
    let mut groups: Vec<Group> = Vec::new();
    let mut index: std::collections::HashMap<String, usize> = std::collections::HashMap::new();
    for q in batch {
        match index.get(&q.request.room) {
            Some(&at) => groups[at].entries.push(q),
            None => {
                index.insert(q.request.room.clone(), groups.len());
                groups.push(Group { entries: vec![q] });
            }
        }
    }
    groups
}

/// Handle of the append task.
pub(super) struct Appender {
    /// Unbounded so that queueing never waits: the queue order is the call
    /// order. Each queued append has a caller waiting at most `wait`, and
    /// during an outage the task fails batches as fast as they come.
    queue: mpsc::UnboundedSender<Queued>,
    /// How long a caller waits at most: its batch may queue behind one that
    /// is timing out.
    wait: Duration,
}

impl Appender {
    /// Connects to `servers` and starts the task; it ends with `stop` or
    /// when the handle is dropped. When `servers` changes (a Sentinel
    /// failover), the next batch goes to the new primary.
    pub(super) async fn start(
        config: &RedisConfig,
        mut servers: watch::Receiver<Servers>,
        shards: Option<Arc<Shards>>,
        stop: CancellationToken,
    ) -> Result<Self, ClusterError> {
        let current = servers.borrow_and_update().clone();
        let link = match (&current, shards) {
            (Servers::Cluster(_), Some(shards)) => Link::Cluster(shards),
            (Servers::Cluster(_), None) => {
                return Err(unavailable("a Redis Cluster needs its slot routing"))
            }
            (Servers::Primary(info), _) => {
                let client = connect::client(info, config, ProtocolVersion::RESP2)?;
                let settings = connect::plain_config(config);
                let conn = guarded(config.timeout, open(&client, &settings)).await?;
                Link::Single(Box::new(tokio::sync::Mutex::new(SingleLink {
                    client,
                    settings,
                    conn: Some(conn),
                })))
            }
        };
        let (queue, rx) = mpsc::unbounded_channel();
        let sender = Arc::new(Sender {
            config: config.clone(),
            link,
        });
        match &sender.link {
            Link::Single(_) => tokio::spawn(run_one(sender, servers, rx, stop)),
            Link::Cluster(shards) => tokio::spawn(lanes::run(
                Arc::clone(&sender),
                Arc::clone(shards),
                rx,
                stop,
            )),
        };
        Ok(Self {
            queue,
            wait: config.timeout * 3,
        })
    }

    /// Queues the append now (so queue order is call order) and returns the
    /// future of its answer.
    pub(super) fn append(&self, request: AppendRequest) -> AppendFuture {
        fn stopped() -> ClusterError {
            ClusterError::Unavailable("the append task has stopped".into())
        }
        let (reply, answer) = oneshot::channel();
        let slot = slot_of(request.meta_key.as_bytes());
        if self
            .queue
            .send(Queued {
                request,
                reply,
                slot,
            })
            .is_err()
        {
            return Box::pin(std::future::ready(Err(stopped())));
        }
        let wait = self.wait;
        Box::pin(async move {
            match tokio::time::timeout(wait, answer).await {
                Ok(Ok(result)) => result,
                Ok(Err(_)) => Err(stopped()),
                Err(_) => Err(ClusterError::Unavailable(format!(
                    "append not answered within {wait:?}"
                ))),
            }
        })
    }
}

/// Makes the scripts known to every server, so EVALSHA only misses them if
/// someone flushes the script cache.
async fn load_scripts<C: ::redis::aio::ConnectionLike>(conn: &mut C) -> RedisResult<()> {
    APPEND.load_async(conn).await?;
    PUBLISH.load_async(conn).await?;
    Ok(())
}

/// A fresh connection to one server, with the scripts loaded.
async fn open(
    client: &Client,
    settings: &AsyncConnectionConfig,
) -> RedisResult<MultiplexedConnection> {
    let mut conn = client
        .get_multiplexed_async_connection_with_config(settings)
        .await?;
    load_scripts(&mut conn).await?;
    Ok(conn)
}

/// The task's own connection to one server.
struct SingleLink {
    client: Client,
    settings: AsyncConnectionConfig,
    /// `None` after a failure: the next batch connects anew.
    conn: Option<MultiplexedConnection>,
}

/// The task's connection.
enum Link {
    /// Its own connection to one server (one batch in flight: the lock is
    /// never contended).
    Single(Box<tokio::sync::Mutex<SingleLink>>),
    /// The node's connections to a Redis Cluster's primaries, shared by
    /// the lanes (see [`lanes`]).
    Cluster(Arc<Shards>),
}

/// Sends batches of appends and answers their callers. On one server one
/// batch is in flight at a time; on a Redis Cluster one per lane.
pub(super) struct Sender {
    config: RedisConfig,
    link: Link,
}

/// The task on one server: one batch in flight, so one node's appends
/// reach Redis in call order while many share a round trip.
async fn run_one(
    sender: Arc<Sender>,
    mut servers: watch::Receiver<Servers>,
    mut rx: mpsc::UnboundedReceiver<Queued>,
    stop: CancellationToken,
) {
    loop {
        let first = tokio::select! {
            biased;
            _ = stop.cancelled() => return,
            next = rx.recv() => match next {
                Some(q) => q,
                None => return,
            },
        };
        let mut batch = vec![first];
        while batch.len() < MAX_BATCH {
            match rx.try_recv() {
                Ok(q) => batch.push(q),
                Err(_) => break,
            }
        }
        // Err (no sender: a fixed primary) means no change.
        if servers.has_changed().unwrap_or(false) {
            let current = servers.borrow_and_update().clone();
            if let (Servers::Primary(info), Link::Single(link)) = (&current, &sender.link) {
                match connect::client(info, &sender.config, ProtocolVersion::RESP2) {
                    Ok(new) => {
                        let mut link = link.lock().await;
                        link.client = new;
                        link.conn = None;
                    }
                    Err(e) => {
                        fail(batch, &e);
                        continue;
                    }
                }
            }
        }
        sender.send(batch).await;
    }
}

/// A room's entries written (and confirmed by WAIT), not published yet.
struct Written {
    group: Group,
    first: u64,
    ts: u64,
}

/// What one room's call answered: the append's reply and, when waiting for
/// replicas, WAIT's; or why the call failed (every entry fails with it).
type Answer = Result<(Value, Option<Value>), ClusterError>;

/// An answer, with the Redis Cluster primary that answered `ASK` if the
/// call went on to the importing one (see [`Shards::send`]).
type Sent = (Answer, Option<Addr>);

impl Sender {
    /// Sends one batch and answers every caller in it.
    pub(super) async fn send(&self, batch: Vec<Queued>) {
        // A caller that stopped waiting was told the append failed (and may
        // append the record again): sending it now could land it twice.
        let pending: Vec<Queued> = batch.into_iter().filter(|q| !q.reply.is_closed()).collect();
        if pending.is_empty() {
            return;
        }
        let groups = by_room(pending);
        let written = self.append(groups).await;
        if !written.is_empty() {
            self.publish(written).await;
        }
    }

    /// Runs `append.lua` for each room (and, waiting for replicas, `WAIT`)
    /// and answers the callers, but for entries confirmed by `WAIT`: those
    /// are returned, to be published.
    async fn append(&self, mut groups: Vec<Group>) -> Vec<Written> {
        let replicas = self.config.ack.replicas();
        let mut written = Vec::new();
        // A second round only for rooms that met a flushed script cache.
        for round in 0..2 {
            let answers = match self.append_calls(&groups).await {
                Ok(answers) => answers,
                Err(e) => {
                    groups.into_iter().for_each(|g| g.fail(&e));
                    return written;
                }
            };
            let mut missing_script = Vec::new();
            for (group, (answer, asked)) in groups.into_iter().zip(answers) {
                let (reply, waited) = match answer {
                    Ok(replies) => replies,
                    Err(e) => {
                        group.fail(&e);
                        continue;
                    }
                };
                if is_no_script(&reply) {
                    missing_script.push(group);
                    continue;
                }
                let (first, ts) = match position(&group.request().room, reply) {
                    Ok(at) => at,
                    Err(e) => {
                        group.fail(&e);
                        continue;
                    }
                };
                if replicas > 0 {
                    match confirmation(waited, replicas, self.config.ack_wait()) {
                        Ok(()) => written.push(Written { group, first, ts }),
                        Err(e) => group.fail(&e),
                    }
                    continue;
                }
                if let Some(at) = asked {
                    self.publish_at(&at, &group, first, ts).await;
                }
                for (i, q) in group.entries.into_iter().enumerate() {
                    let n = first + i as u64;
                    let _ = q.reply.send(Ok(LogPosition { n, ts }));
                }
            }
            if missing_script.is_empty() {
                return written;
            }
            if round == 0 {
                if let Err(e) = self.reload().await {
                    missing_script.into_iter().for_each(|g| g.fail(&e));
                    return written;
                }
            }
            groups = missing_script;
        }
        let e = unavailable("the append script keeps disappearing from redis");
        groups.into_iter().for_each(|g| g.fail(&e));
        written
    }

    /// The call of `append.lua` for `group`.
    fn append_cmd(&self, group: &Group) -> Cmd {
        let r = group.request();
        let sharded = matches!(self.link, Link::Cluster(_));
        let mut cmd = ::redis::cmd("EVALSHA");
        cmd.arg(APPEND.get_hash())
            .arg(2)
            .arg(&r.meta_key)
            .arg(&r.log_key)
            .arg(self.config.log_capacity)
            .arg(&r.channel)
            .arg(if self.config.ack.replicas() == 0 {
                "1"
            } else {
                "0"
            })
            .arg(if sharded { "SPUBLISH" } else { "PUBLISH" });
        for q in &group.entries {
            cmd.arg(&q.request.payload[..]);
        }
        cmd
    }

    /// `WAIT` for the replicas `broker_ack` asks for, if any.
    fn wait_cmd(&self) -> Option<Cmd> {
        let replicas = self.config.ack.replicas();
        (replicas > 0).then(|| {
            let mut wait = ::redis::cmd("WAIT");
            wait.arg(replicas)
                .arg(self.config.ack_wait().as_millis() as u64);
            wait
        })
    }

    /// Publishes `group`'s entries (from position `first`, at `ts`) again at
    /// the Redis Cluster primary `at`, which answered `ASK`: their room's
    /// subscribers are still there.
    async fn publish_at(&self, at: &Addr, group: &Group, first: u64, ts: u64) {
        let Link::Cluster(shards) = &self.link else {
            return;
        };
        let messages = group
            .entries
            .iter()
            .enumerate()
            .map(|(i, q)| encode_message(first + i as u64, ts, &q.request.payload))
            .collect();
        shards
            .publish_at(at, &group.request().channel, messages)
            .await;
    }

    /// The calls of `append.lua` for `groups`, with their answers in order;
    /// `Err` when the connection to the one server failed.
    async fn append_calls(&self, groups: &[Group]) -> Result<Vec<Sent>, ClusterError> {
        let cmds: Vec<Routed> = groups
            .iter()
            .map(|g| Routed {
                key: g.request().meta_key.clone(),
                cmd: self.append_cmd(g),
            })
            .collect();
        let wait = self.wait_cmd();
        self.calls(cmds, wait).await
    }

    /// Sends `cmds` (and `trailer` after them): one pipeline on one
    /// server, one per primary on a Redis Cluster. Answers in order; `Err`
    /// when the connection to the one server failed.
    async fn calls(
        &self,
        cmds: Vec<Routed>,
        trailer: Option<Cmd>,
    ) -> Result<Vec<Sent>, ClusterError> {
        match &self.link {
            Link::Single(_) => {
                let mut pipe = ::redis::pipe();
                pipe.ignore_errors();
                let count = cmds.len();
                for c in cmds {
                    pipe.add_command(c.cmd);
                }
                let waiting = trailer.is_some();
                if let Some(trailer) = trailer {
                    pipe.add_command(trailer);
                }
                let mut replies = self.single(&pipe).await?;
                let waited = if waiting { replies.pop() } else { None };
                replies.truncate(count);
                Ok(replies
                    .into_iter()
                    .map(|reply| (Ok((reply, waited.clone())), None))
                    .collect())
            }
            Link::Cluster(shards) => Ok(shards.send(cmds, trailer).await),
        }
    }

    /// Sends `pipe` on the connection to one server; a failure drops the
    /// connection, so that late replies cannot be taken for the next
    /// batch's (whether the batch ran is unknown).
    async fn single(&self, pipe: &Pipeline) -> Result<Vec<Value>, ClusterError> {
        let Link::Single(link) = &self.link else {
            return Err(unavailable("not a connection to one server"));
        };
        let mut link = link.lock().await;
        let mut live = match link.conn.take() {
            Some(live) => live,
            None => open(&link.client, &link.settings)
                .await
                .map_err(unavailable)?,
        };
        let replies = pipe
            .query_async::<Vec<Value>>(&mut live)
            .await
            .map_err(unavailable)?;
        link.conn = Some(live);
        Ok(replies)
    }

    /// Loads the scripts again (someone flushed them).
    async fn reload(&self) -> Result<(), ClusterError> {
        let timeout = self.config.timeout;
        match &self.link {
            Link::Single(link) => match &mut link.lock().await.conn {
                Some(c) => guarded(timeout, load_scripts(c)).await,
                // The next batch opens a connection, which loads them.
                None => Ok(()),
            },
            Link::Cluster(shards) => {
                shards.reset();
                Ok(())
            }
        }
    }

    /// Publishes entries confirmed by `WAIT` and answers their callers.
    async fn publish(&self, mut written: Vec<Written>) {
        for round in 0..2 {
            let answers = match self.publish_calls(&written).await {
                Ok(answers) => answers,
                Err(e) => {
                    written.into_iter().for_each(|w| w.group.fail(&e));
                    return;
                }
            };
            let mut missing_script = Vec::new();
            for (w, (answer, asked)) in written.into_iter().zip(answers) {
                let result = match answer.map(|(reply, _)| reply) {
                    Ok(reply) if is_no_script(&reply) => {
                        missing_script.push(w);
                        continue;
                    }
                    Ok(Value::ServerError(e)) => Err(unavailable(format!("publish failed: {e:?}"))),
                    // 0: the room was deleted meanwhile; the append did happen.
                    Ok(_) => Ok(()),
                    Err(e) => Err(e),
                };
                match result {
                    Ok(()) => {
                        if let Some(at) = asked {
                            self.publish_at(&at, &w.group, w.first, w.ts).await;
                        }
                        for (i, q) in w.group.entries.into_iter().enumerate() {
                            let at = LogPosition {
                                n: w.first + i as u64,
                                ts: w.ts,
                            };
                            let _ = q.reply.send(Ok(at));
                        }
                    }
                    Err(e) => w.group.fail(&e),
                }
            }
            if missing_script.is_empty() {
                return;
            }
            if round == 0 {
                if let Err(e) = self.reload().await {
                    missing_script.into_iter().for_each(|w| w.group.fail(&e));
                    return;
                }
            }
            written = missing_script;
        }
        let e = unavailable("the publish script keeps disappearing from redis");
        written.into_iter().for_each(|w| w.group.fail(&e));
    }

    /// The calls of `publish.lua` for `written`, with their replies in
    /// order; `Err` when the connection to the one server failed.
    async fn publish_calls(&self, written: &[Written]) -> Result<Vec<Sent>, ClusterError> {
        let sharded = matches!(self.link, Link::Cluster(_));
        let cmds = written
            .iter()
            .map(|w| {
                let r = w.group.request();
                let last = w.first + w.group.entries.len() as u64 - 1;
                let mut cmd = ::redis::cmd("EVALSHA");
                cmd.arg(PUBLISH.get_hash())
                    .arg(2)
                    .arg(&r.meta_key)
                    .arg(&r.log_key)
                    .arg(&r.channel)
                    .arg(if sharded { "SPUBLISH" } else { "PUBLISH" })
                    .arg(w.first)
                    .arg(last);
                Routed {
                    key: r.meta_key.clone(),
                    cmd,
                }
            })
            .collect();
        self.calls(cmds, None).await
    }
}

fn is_no_script(reply: &Value) -> bool {
    matches!(reply, Value::ServerError(e) if e.kind() == Some(ServerErrorKind::NoScript))
}

/// What `WAIT` answered: enough replicas, or why not.
fn confirmation(reply: Option<Value>, replicas: u8, wait: Duration) -> Result<(), ClusterError> {
    let count = match reply {
        Some(Value::Int(count)) => count,
        other => return Err(unavailable(format!("WAIT failed: {other:?}"))),
    };
    if count >= i64::from(replicas) {
        return Ok(());
    }
    Err(unavailable(format!(
        "only {count} of {replicas} replicas confirmed the append within {wait:?}; \
         it may still be in the log"
    )))
}

fn fail(batch: Vec<Queued>, why: &dyn std::fmt::Display) {
    for q in batch {
        let _ = q.reply.send(Err(unavailable(why)));
    }
}

/// What `append.lua` answered: `{n, ts}` of the first entry, or nil for an
/// unknown room.
fn position(room: &str, reply: Value) -> Result<(u64, u64), ClusterError> {
    match reply {
        Value::Nil => Err(ClusterError::RoomNotFound(room.to_owned())),
        Value::ServerError(e) => Err(unavailable(format!("append failed: {e:?}"))),
        reply => ::redis::from_redis_value(reply).map_err(unavailable),
    }
}
