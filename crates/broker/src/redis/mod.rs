//! The Redis broker: tickets ([`TicketStore`](crate::TicketStore)) and the cluster seam
//! ([`Cluster`](crate::Cluster)) in one Redis 7 server.
//!
//! # Key layout
//!
//! With the default prefix `plaza:` and a room `lobby`:
//!
//! | key | type | holds |
//! | --- | --- | --- |
//! | `plaza:room:{lobby}` | hash | `meta` (opaque bytes), `n` (last log position), `ts` (last timestamp), `wh` (the last log position whose webhooks are enqueued), `r` (the last log position reads return; only once a node used [`BrokerAck::Replicas`] in the room) |
//! | `plaza:room:{lobby}:log` | stream | one entry per log position, id `<n>-0`, fields `ts` and `p` (payload) |
//! | `plaza:room:{lobby}:snap` | hash | `n` (log position) and `data` (snapshot bytes) |
//! | `plaza:rooms` | set | every room id |
//! | `plaza:node:{node id}` | string | a node's heartbeat, expiring after [`NODE_TTL_MS`](crate::NODE_TTL_MS) |
//! | `plaza:webhooks:{target}` | stream | a webhook target's durable queue: fields `r` (room), `i` (event id), `b` (body), `t` (Unix ms); consumer group `plaza` |
//! | `plaza:webhooks:{target}:lease` | string | the node that reads that queue, expiring unless renewed |
//! | `plaza:ticket:{token}` | hash | `grant` (JSON), `exp` (Unix ms), `used` (0/1); expires an hour after `exp` |
//!
//! Pub/sub channel `plaza:room:{lobby}:ch` carries every new entry of the room
//! as 8 bytes `n` and 8 bytes `ts` (big-endian) followed by the payload.
//!
//! The braces around a room id are a Redis Cluster hash tag: all of a room's
//! keys (and its channel) hash to one slot, so its Lua scripts stay
//! single-slot. Only the `plaza:rooms` registry set lives elsewhere; moving
//! to Redis Cluster means maintaining it outside the room scripts.
//!
//! # Connections and tasks
//!
//! A node holds three connections: one for ordinary commands, one owned by
//! the append task (so one node's appends reach Redis in call order, several
//! per round trip), and one RESP3 connection for pub/sub. Background tasks
//! (appends, heartbeat, pub/sub dispatch and ping) end when the broker is
//! dropped or [`Cluster::leave`](crate::Cluster::leave) is called.
//!
//! On a Redis Cluster, commands and appends go through the node's own slot
//! routing (`shards`: one connection per server, the slot map read from
//! any server that answers), appends in one lane per primary, each with its
//! own batch in flight (`appender::lanes`), and pub/sub on a RESP3
//! connection per server (`subscriber::shard_pubsub`). So a primary that
//! hangs, dies or fails over delays only the calls on its own slots. (The
//! redis crate's cluster connection is not used: it holds every call while
//! it recovers from one server's failure.)
//!
//! # Sentinel
//!
//! With a `redis+sentinel://` URL the primary is the server the Sentinels
//! name. A task asks them every [`failover::FOLLOW_INTERVAL`]; when they
//! name another server (a failover), it opens the command and pub/sub
//! connections to it, the append task opens its own on its next batch, and
//! the lost subscriptions are made again, which tells each room
//! [`LogNotice::Resubscribed`](crate::LogNotice::Resubscribed): it reads the
//! log from where it is.
//!
//! # Acknowledgements
//!
//! With [`BrokerAck::Replicas`] the append script only writes; after the
//! batch, `WAIT` counts the replicas that have it, and only then a second
//! script per entry publishes it and moves the room's `r` field (the last
//! entry confirmed) past it. Log reads stop at `r`, so no member sees an
//! entry before it is replicated, whether by pub/sub or by reading the log.

mod ack;
mod appender;
mod cluster;
mod config;
mod connect;
mod endpoint;
mod errors;
mod failover;
#[cfg(test)]
mod golden;
mod heartbeat;
mod keys;
mod scripts;
mod shards;
mod subscriber;
mod tickets;
mod webhooks;
mod wire;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use ::redis::{Cmd, FromRedisValue, Pipeline, ScriptInvocation};
use futures_util::StreamExt;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

pub use ack::{BrokerAck, MAX_ACK_REPLICAS};
pub use config::RedisConfig;
pub use endpoint::{CLUSTER_SCHEME, SENTINEL_SCHEME};

use crate::ClusterError;
use appender::Appender;
use connect::{Commands, Conn, Servers};
use endpoint::Source;
use errors::on_conn;
use keys::Keys;
use shards::Shards;
use subscriber::Subscriber;

/// A Plaza node's connection to Redis, serving both [`crate::TicketStore`] and
/// [`crate::Cluster`].
pub struct RedisBroker {
    config: RedisConfig,
    /// The data is on a Redis Cluster.
    cluster: bool,
    keys: Keys,
    commands: Arc<Commands>,
    appender: Appender,
    subscriber: Arc<Subscriber>,
    heartbeat: Mutex<Option<JoinHandle<()>>>,
    left: AtomicBool,
    stop: CancellationToken,
}

impl RedisBroker {
    /// Connects node `node_id` to the Redis at `url` (`redis://host:port/db`)
    /// with the defaults of [`RedisConfig`]. Fails with
    /// [`ClusterError::Unavailable`] if Redis cannot be reached now.
    pub async fn connect(url: &str, node_id: &str) -> Result<Arc<Self>, ClusterError> {
        Self::connect_with(RedisConfig::new(url, node_id)).await
    }

    /// Connects as `config` says. Fails with [`ClusterError::Unavailable`] if
    /// Redis (or, with Sentinels, a primary) cannot be reached now;
    /// afterwards the connections are re-established on their own, to the
    /// new primary after a failover.
    pub async fn connect_with(config: RedisConfig) -> Result<Arc<Self>, ClusterError> {
        let stop = CancellationToken::new();
        // Stops the tasks already started if a later step fails.
        let started = stop.clone().drop_guard();
        let (servers, sentinels) = match Source::parse(&config.url)? {
            Source::Fixed(info) => (Servers::Primary(info), None),
            Source::Sentinel(sentinels) => {
                let mut sentinels = sentinels.connect()?;
                let primary = sentinels.find(config.timeout).await?;
                (Servers::Primary(primary), Some(sentinels))
            }
            Source::Cluster(seeds) => (Servers::Cluster(seeds), None),
        };
        let cluster = matches!(servers, Servers::Cluster(_));
        let keys = Keys::new(&config.key_prefix, cluster);
        // With a fixed primary or a Redis Cluster the sender is dropped:
        // nothing ever changes (a cluster connection follows failovers).
        let (primary_tx, primary_rx) = watch::channel(servers.clone());
        // On a Redis Cluster, commands and appends share the node's own
        // routing (one connection per server, no lock held across a call).
        let shards = match &servers {
            Servers::Cluster(seeds) => {
                Some(Arc::new(Shards::new(seeds, &config, scripts::all()).await?))
            }
            Servers::Primary(_) => None,
        };
        let commands = Arc::new(Commands::new(
            connect::command_conn(&servers, &config, shards.as_ref()).await?,
        ));
        let appender =
            Appender::start(&config, primary_rx, shards.clone(), stop.child_token()).await?;
        let subscriber = Arc::new(
            Subscriber::start(&config, &servers, shards.as_ref(), stop.child_token()).await?,
        );
        let node_key = keys.node(&config.node_id);
        // The first beat before returning: a node is alive as soon as it exists.
        heartbeat::beat(&commands.get(), &node_key, config.timeout).await?;
        let heartbeat =
            heartbeat::start(Arc::clone(&commands), node_key, &config, stop.child_token());
        if let Some(sentinels) = sentinels {
            tokio::spawn(failover::follow(
                sentinels,
                primary_tx,
                Arc::clone(&commands),
                Arc::clone(&subscriber),
                config.clone(),
                stop.child_token(),
            ));
        }
        started.disarm();
        Ok(Arc::new(Self {
            config,
            cluster,
            keys,
            commands,
            appender,
            subscriber,
            heartbeat: Mutex::new(Some(heartbeat)),
            left: AtomicBool::new(false),
            stop,
        }))
    }

    /// Sends `cmd` on the command connection.
    async fn query<T: FromRedisValue>(&self, cmd: &Cmd) -> Result<T, ClusterError> {
        let call = |mut conn: Conn| async move { cmd.query_async(&mut conn).await };
        on_conn(self.config.timeout, &self.commands.get(), call).await
    }

    /// Sends `pipe` on the command connection.
    async fn query_pipe<T: FromRedisValue>(&self, pipe: &Pipeline) -> Result<T, ClusterError> {
        let call = |mut conn: Conn| async move { pipe.query_async(&mut conn).await };
        on_conn(self.config.timeout, &self.commands.get(), call).await
    }

    /// Sends each of `cmds` on the command connection and returns their
    /// answers in order: one pipeline on one server; on a Redis Cluster,
    /// where a pipeline must stay in one slot, concurrent calls.
    async fn query_each<T: FromRedisValue>(&self, cmds: Vec<Cmd>) -> Result<Vec<T>, ClusterError> {
        if cmds.is_empty() {
            return Ok(Vec::new());
        }
        if !self.cluster {
            let mut pipe = ::redis::pipe();
            for cmd in cmds {
                pipe.add_command(cmd);
            }
            return self.query_pipe(&pipe).await;
        }
        futures_util::stream::iter(cmds)
            .map(|cmd| async move { self.query(&cmd).await })
            .buffered(CONCURRENT_CALLS)
            .collect::<Vec<_>>()
            .await
            .into_iter()
            .collect()
    }

    /// [`Self::query_each`], each answer on its own: on a Redis Cluster a
    /// shard without a primary fails only its own calls (on one server, a
    /// failure fails them all).
    async fn query_each_settled<T: FromRedisValue>(
        &self,
        cmds: Vec<Cmd>,
    ) -> Vec<Result<T, ClusterError>> {
        if !self.cluster {
            let count = cmds.len();
            return match self.query_each::<T>(cmds).await {
                Ok(values) => values.into_iter().map(Ok).collect(),
                Err(e) => (0..count).map(|_| Err(e.clone())).collect(),
            };
        }
        futures_util::stream::iter(cmds)
            .map(|cmd| async move { self.query(&cmd).await })
            .buffered(CONCURRENT_CALLS)
            .collect()
            .await
    }

    /// Whether the data is on a Redis Cluster.
    fn on_cluster(&self) -> bool {
        self.cluster
    }

    /// Runs a script on the command connection (EVALSHA, loading the script
    /// when Redis does not know it). Every script answers the same when run
    /// twice (a call made again after a broken connection).
    async fn invoke<T: FromRedisValue>(
        &self,
        script: &ScriptInvocation<'_>,
    ) -> Result<T, ClusterError> {
        let call = |mut conn: Conn| async move { script.invoke_async(&mut conn).await };
        on_conn(self.config.timeout, &self.commands.get(), call).await
    }

    /// Fails every call after [`Cluster::leave`](crate::Cluster::leave): other
    /// nodes may already have taken over, so writes from here would be a
    /// zombie's.
    fn check_member(&self) -> Result<(), ClusterError> {
        if self.left.load(Ordering::Acquire) {
            return Err(ClusterError::Unavailable(format!(
                "node {:?} has left the cluster",
                self.config.node_id
            )));
        }
        Ok(())
    }

    async fn ping(&self) -> bool {
        let ping = ::redis::cmd("PING");
        let call = |mut conn: Conn| {
            let ping = &ping;
            async move { ping.query_async::<String>(&mut conn).await }
        };
        matches!(
            on_conn(READY_TIMEOUT, &self.commands.get(), call).await,
            Ok(pong) if pong == "PONG"
        )
    }
}

/// Calls [`RedisBroker::query_each`] has in flight at once on a Redis Cluster.
const CONCURRENT_CALLS: usize = 64;

/// How long `/readyz` waits for Redis.
const READY_TIMEOUT: std::time::Duration = std::time::Duration::from_millis(500);

impl Drop for RedisBroker {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

impl std::fmt::Debug for RedisBroker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisBroker")
            .field("node_id", &self.config.node_id)
            .field("key_prefix", &self.config.key_prefix)
            .finish_non_exhaustive()
    }
}
