//! The append task: one connection, one batch in flight, so one node's
//! appends reach Redis in the order they were called while many share a
//! round trip.

use std::time::Duration;

use ::redis::aio::MultiplexedConnection;
use ::redis::{AsyncConnectionConfig, Client, ProtocolVersion, ServerErrorKind, Value};
use bytes::Bytes;
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;

use super::errors::{guarded, unavailable};
use super::scripts::APPEND;
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
    /// Connects and starts the task; it ends with `stop` or when the handle
    /// is dropped.
    pub(super) async fn start(
        config: &RedisConfig,
        stop: CancellationToken,
    ) -> Result<Self, ClusterError> {
        let client = connect::client(config, ProtocolVersion::RESP2)?;
        let settings = connect::plain_config(config);
        let conn = guarded(config.timeout, open(&client, &settings)).await?;
        let (queue, rx) = mpsc::unbounded_channel();
        let task = Task {
            client,
            settings,
            conn: Some(conn),
            capacity: config.log_capacity,
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

/// A fresh connection with the append script loaded, so EVALSHA only misses
/// it if someone flushes the script cache.
async fn open(
    client: &Client,
    settings: &AsyncConnectionConfig,
) -> ::redis::RedisResult<MultiplexedConnection> {
    let mut conn = client
        .get_multiplexed_async_connection_with_config(settings)
        .await?;
    APPEND.load_async(&mut conn).await?;
    Ok(conn)
}

struct Task {
    client: Client,
    settings: AsyncConnectionConfig,
    /// `None` after a failure: the next batch connects anew.
    conn: Option<MultiplexedConnection>,
    capacity: usize,
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
        let conn = match &mut self.conn {
            Some(conn) => conn,
            None => match open(&self.client, &self.settings).await {
                Ok(conn) => self.conn.insert(conn),
                Err(e) => return fail(batch, &e),
            },
        };
        // A caller that stopped waiting was told the append failed (and may
        // append the record again): sending it now could land it twice.
        let mut pending: Vec<Queued> = batch.into_iter().filter(|q| !q.reply.is_closed()).collect();
        if pending.is_empty() {
            return;
        }
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
                    .arg(self.capacity)
                    .arg(&r.channel)
                    .arg(&r.payload[..]);
            }
            let replies: Vec<Value> = match pipe.query_async(conn).await {
                Ok(replies) => replies,
                Err(e) => {
                    // Whether a timed-out batch ran is unknown; a fresh
                    // connection at least drops its late replies.
                    self.conn = None;
                    return fail(pending, &e);
                }
            };
            let mut missing_script = Vec::new();
            for (q, reply) in pending.into_iter().zip(replies) {
                match reply {
                    Value::ServerError(e) if e.kind() == Some(ServerErrorKind::NoScript) => {
                        missing_script.push(q)
                    }
                    reply => {
                        let result = position(&q.request.room, reply);
                        let _ = q.reply.send(result);
                    }
                }
            }
            if missing_script.is_empty() {
                return;
            }
            if let Err(e) = APPEND.load_async(conn).await {
                self.conn = None;
                return fail(missing_script, &e);
            }
            pending = missing_script;
        }
        fail(pending, &"the append script keeps disappearing from redis");
    }
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
