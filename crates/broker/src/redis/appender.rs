//! The append task: one connection, one batch in flight, so one node's
//! appends reach Redis in the order they were called while many share a
//! round trip.
//!
//! With [`BrokerAck::Replicas`](super::BrokerAck::Replicas) a batch takes two round trips: the appends
//! (written, not published) followed by `WAIT N` in one pipeline, then, if
//! WAIT counted N replicas, one `publish.lua` per entry. An entry WAIT did
//! not confirm fails as unavailable and is never published by this node;
//! it stays in the log, hidden from reads until a later entry of its room is
//! confirmed (its replication then is too).

use std::time::Duration;

use ::redis::aio::MultiplexedConnection;
use ::redis::{
    AsyncConnectionConfig, Client, ConnectionInfo, ProtocolVersion, ServerErrorKind, Value,
};
use bytes::Bytes;
use tokio::sync::{mpsc, oneshot, watch};
use tokio_util::sync::CancellationToken;

use super::errors::{guarded, unavailable};
use super::scripts::{APPEND, PUBLISH};
use super::{connect, RedisConfig};
use crate::{AppendFuture, ClusterError, LogPosition};

/// Appends sent in one pipeline at most.
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

struct Queued {
    request: AppendRequest,
    reply: Reply,
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
    /// Connects to the primary `primary` names and starts the task; it ends
    /// with `stop` or when the handle is dropped. When `primary` changes (a
    /// failover), the next batch goes to the new one.
    pub(super) async fn start(
        config: &RedisConfig,
        mut primary: watch::Receiver<ConnectionInfo>,
        stop: CancellationToken,
    ) -> Result<Self, ClusterError> {
        let info = primary.borrow_and_update().clone();
        let client = connect::client(&info, config, ProtocolVersion::RESP2)?;
        let settings = connect::plain_config(config);
        let conn = guarded(config.timeout, open(&client, &settings)).await?;
        let (queue, rx) = mpsc::unbounded_channel();
        let task = Task {
            config: config.clone(),
            primary,
            client,
            settings,
            conn: Some(conn),
        };
        tokio::spawn(task.run(rx, stop));
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
        if self.queue.send(Queued { request, reply }).is_err() {
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

/// A fresh connection with the scripts loaded, so EVALSHA only misses them
/// if someone flushes the script cache.
async fn open(
    client: &Client,
    settings: &AsyncConnectionConfig,
) -> ::redis::RedisResult<MultiplexedConnection> {
    let mut conn = client
        .get_multiplexed_async_connection_with_config(settings)
        .await?;
    APPEND.load_async(&mut conn).await?;
    PUBLISH.load_async(&mut conn).await?;
    Ok(conn)
}

struct Task {
    config: RedisConfig,
    /// Where the primary is; changes after a Sentinel failover.
    primary: watch::Receiver<ConnectionInfo>,
    client: Client,
    settings: AsyncConnectionConfig,
    /// `None` after a failure: the next batch connects anew.
    conn: Option<MultiplexedConnection>,
}

/// An entry written and confirmed on enough replicas, not published yet.
struct Written {
    queued: Queued,
    at: LogPosition,
}

impl Task {
    async fn run(mut self, mut rx: mpsc::UnboundedReceiver<Queued>, stop: CancellationToken) {
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
            self.send(batch).await;
        }
    }

    /// Sends one batch as a pipeline and answers every caller in it.
    async fn send(&mut self, batch: Vec<Queued>) {
        // Err (no sender: a fixed primary) means no change.
        if self.primary.has_changed().unwrap_or(false) {
            let info = self.primary.borrow_and_update().clone();
            match connect::client(&info, &self.config, ProtocolVersion::RESP2) {
                Ok(client) => {
                    self.client = client;
                    self.conn = None;
                }
                Err(e) => return fail(batch, &e),
            }
        }
        let mut conn = match self.conn.take() {
            Some(conn) => conn,
            None => match open(&self.client, &self.settings).await {
                Ok(conn) => conn,
                Err(e) => return fail(batch, &e),
            },
        };
        // A caller that stopped waiting was told the append failed (and may
        // append the record again): sending it now could land it twice.
        let pending: Vec<Queued> = batch.into_iter().filter(|q| !q.reply.is_closed()).collect();
        if pending.is_empty() {
            self.conn = Some(conn);
            return;
        }
        // Whether a batch that met a connection error ran is unknown; a
        // fresh connection at least drops its late replies.
        let Ok(written) = self.append(&mut conn, pending).await else {
            return;
        };
        if !written.is_empty() && publish(&mut conn, written).await.is_err() {
            return;
        }
        self.conn = Some(conn);
    }

    /// Runs `append.lua` for each entry (and, waiting for replicas, `WAIT`
    /// after them) and answers the callers, but for entries confirmed by
    /// `WAIT`: those are returned, to be published. `Err` when the
    /// connection failed (every caller was answered).
    async fn append(
        &self,
        conn: &mut MultiplexedConnection,
        mut pending: Vec<Queued>,
    ) -> Result<Vec<Written>, ()> {
        let replicas = self.config.ack.replicas();
        let wait = self.config.ack_wait();
        let publish_now = if replicas == 0 { "1" } else { "0" };
        let mut written = Vec::new();
        // A second round only for entries that met a flushed script cache.
        for _ in 0..2 {
            let mut pipe = ::redis::pipe();
            pipe.ignore_errors();
            for q in &pending {
                let r = &q.request;
                pipe.cmd("EVALSHA")
                    .arg(APPEND.get_hash())
                    .arg(2)
                    .arg(&r.meta_key)
                    .arg(&r.log_key)
                    .arg(self.config.log_capacity)
                    .arg(&r.channel)
                    .arg(&r.payload[..])
                    .arg(publish_now);
            }
            if replicas > 0 {
                pipe.cmd("WAIT").arg(replicas).arg(wait.as_millis() as u64);
            }
            let mut replies: Vec<Value> = match pipe.query_async(conn).await {
                Ok(replies) => replies,
                Err(e) => {
                    fail(pending, &e);
                    return Err(());
                }
            };
            let confirmed = match replicas {
                0 => Ok(()),
                _ => confirmation(replies.pop(), replicas, wait),
            };
            let mut missing_script = Vec::new();
            for (q, reply) in pending.into_iter().zip(replies) {
                match reply {
                    Value::ServerError(e) if e.kind() == Some(ServerErrorKind::NoScript) => {
                        missing_script.push(q)
                    }
                    reply => match (position(&q.request.room, reply), &confirmed) {
                        (Ok(at), Ok(())) if replicas > 0 => written.push(Written { queued: q, at }),
                        (Ok(_), Err(e)) => {
                            let _ = q.reply.send(Err(e.clone()));
                        }
                        (result, _) => {
                            let _ = q.reply.send(result);
                        }
                    },
                }
            }
            if missing_script.is_empty() {
                return Ok(written);
            }
            if let Err(e) = APPEND.load_async(conn).await {
                fail(missing_script, &e);
                fail(written.into_iter().map(|w| w.queued).collect(), &e);
                return Err(());
            }
            pending = missing_script;
        }
        fail(pending, &"the append script keeps disappearing from redis");
        Ok(written)
    }
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

/// Publishes entries confirmed by `WAIT` and answers their callers. `Err`
/// when the connection failed (every caller was answered).
async fn publish(conn: &mut MultiplexedConnection, written: Vec<Written>) -> Result<(), ()> {
    let mut pending = written;
    // A second round only if the script cache was flushed meanwhile.
    for _ in 0..2 {
        let mut pipe = ::redis::pipe();
        pipe.ignore_errors();
        for w in &pending {
            let r = &w.queued.request;
            pipe.cmd("EVALSHA")
                .arg(PUBLISH.get_hash())
                .arg(2)
                .arg(&r.meta_key)
                .arg(&r.log_key)
                .arg(&r.channel)
                .arg(w.at.n);
        }
        let replies: Vec<Value> = match pipe.query_async(conn).await {
            Ok(replies) => replies,
            Err(e) => {
                fail(pending.into_iter().map(|w| w.queued).collect(), &e);
                return Err(());
            }
        };
        let mut missing_script = Vec::new();
        for (w, reply) in pending.into_iter().zip(replies) {
            let result = match reply {
                Value::ServerError(e) if e.kind() == Some(ServerErrorKind::NoScript) => {
                    missing_script.push(w);
                    continue;
                }
                Value::ServerError(e) => Err(unavailable(format!("publish failed: {e:?}"))),
                // 0: the room was deleted meanwhile; the append did happen.
                _ => Ok(w.at),
            };
            let _ = w.queued.reply.send(result);
        }
        if missing_script.is_empty() {
            return Ok(());
        }
        if let Err(e) = PUBLISH.load_async(conn).await {
            fail(missing_script.into_iter().map(|w| w.queued).collect(), &e);
            return Err(());
        }
        pending = missing_script;
    }
    fail(
        pending.into_iter().map(|w| w.queued).collect(),
        &"the publish script keeps disappearing from redis",
    );
    Ok(())
}

fn fail(batch: Vec<Queued>, why: &dyn std::fmt::Display) {
    for q in batch {
        let _ = q.reply.send(Err(unavailable(why)));
    }
}

/// What `append.lua` answered: `{n, ts}`, or nil for an unknown room.
fn position(room: &str, reply: Value) -> Result<LogPosition, ClusterError> {
    match reply {
        Value::Nil => Err(ClusterError::RoomNotFound(room.to_owned())),
        Value::ServerError(e) => Err(unavailable(format!("append failed: {e:?}"))),
        reply => {
            let (n, ts): (u64, u64) = ::redis::from_redis_value(reply).map_err(unavailable)?;
            Ok(LogPosition { n, ts })
        }
    }
}
