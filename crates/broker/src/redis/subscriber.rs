//! The pub/sub side: one RESP3 connection per node, a task handing its push
//! messages to the rooms' listeners, and a task pinging it.
//!
//! # Noticing a lost subscription
//!
//! Redis forgets a connection's subscriptions when the connection drops. The
//! connection reports its end as a `Disconnection` push, which marks every
//! subscription *lost*; the connection manager reconnects in the background.
//! Once a ping succeeds again, the ping task subscribes the lost channels
//! anew, and the confirmation Redis sends for a lost channel makes the
//! dispatcher tell its listener [`LogNotice::Resubscribed`]. So a listener
//! hears `Resubscribed` exactly when Redis confirmed its channel again after
//! a gap in which entries may have been missed.
//!
//! # A new primary
//!
//! After a Sentinel failover, [`Subscriber::reconnect`] replaces the
//! connection with one to the new primary and marks every subscription lost;
//! the ping task then subscribes them there, as after an outage. Pushes carry
//! the generation of the connection they came on, so late ones from the old
//! connection (its confirmations, its disconnection) are ignored.
//!
//! # Redis Cluster
//!
//! Room channels are shard channels there (`SSUBSCRIBE`, delivered by the
//! primary of the room's slot only); the control channel stays a classic
//! channel, which every server relays. The node keeps one RESP3 connection
//! per server ([`shard_pubsub`]), and each push says which server it came
//! from. A subscription is kept lost, and made again, just as on one
//! server, when the connection to *its* server is lost (a `Disconnection`
//! push from that connection, or a ping it left unanswered: other servers'
//! channels are untouched), and when a server ends a shard subscription
//! itself (`SUNSUBSCRIBE`) because the slot moved to another primary, by a
//! migration or a failover. A lost channel is subscribed again at the
//! primary the slot map now names, as soon as it is lost rather than on the
//! next ping.
//!
//! The redis crate's own automatic resubscription is not used: in 1.8 it
//! sends one SUBSCRIBE for all channels but waits for one confirmation only,
//! so the others would be taken as replies to the next commands on the
//! connection (a ping, or a `subscribe` that would then return before its
//! confirmation).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock};
use std::time::Duration;

use ::redis::aio::ConnectionManager;
use ::redis::{ConnectionInfo, ProtocolVersion, PushInfo, PushKind, Value};
use futures_util::stream::{self, StreamExt};
use tokio::sync::{mpsc, Notify};
use tokio_util::sync::CancellationToken;

use super::connect::{self, Servers};
use super::errors::guarded;
use super::shards::{Addr, Shards};
use super::wire::decode_message;
use super::RedisConfig;
use crate::{ClusterError, LogListener, LogNotice};
use shard_pubsub::ShardPubSub;

/// How often the subscriber connection is pinged: a dead socket otherwise
/// stays silent, and reconnecting after an outage is driven by these pings.
pub(super) const PING_INTERVAL: Duration = Duration::from_secs(1);

mod shard_pubsub;

/// A push, with the generation of the connection it came on and, on a
/// Redis Cluster, the server it came from.
type Push = (u64, Option<Addr>, PushInfo);

/// Lost shard channels subscribed again at the same time, at most.
const RESUBSCRIBING: usize = 64;

/// A subscriber connection: to one server, or one per server of a Redis
/// Cluster.
#[derive(Clone)]
enum PubSub {
    Single(ConnectionManager),
    Cluster(Arc<ShardPubSub>),
}

impl PubSub {
    async fn subscribe(&mut self, channel: &[u8], sharded: bool) -> ::redis::RedisResult<()> {
        match self {
            PubSub::Single(conn) => conn.subscribe(channel).await,
            PubSub::Cluster(conns) => conns.subscribe(channel, sharded).await,
        }
    }
}

/// The current subscriber connection and its generation.
struct Link {
    conn: RwLock<PubSub>,
    /// Counts connections replaced by [`Subscriber::reconnect`].
    generation: AtomicU64,
    pushes: mpsc::UnboundedSender<Push>,
}

impl Link {
    fn conn(&self) -> PubSub {
        self.conn.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }
}

/// A RESP3 connection to `servers` whose pushes go to `pushes`, tagged
/// `generation`.
async fn open(
    servers: &Servers,
    shards: Option<&Arc<Shards>>,
    config: &RedisConfig,
    generation: u64,
    pushes: mpsc::UnboundedSender<Push>,
) -> Result<PubSub, ClusterError> {
    match (servers, shards) {
        (Servers::Cluster(seeds), Some(shards)) => {
            let seed = seeds
                .first()
                .ok_or_else(|| ClusterError::Unavailable("no Redis Cluster server given".into()))?;
            Ok(PubSub::Cluster(Arc::new(ShardPubSub::new(
                Arc::clone(shards),
                seed,
                config,
                pushes,
            ))))
        }
        (Servers::Cluster(_), None) => Err(ClusterError::Unavailable(
            "a Redis Cluster needs its slot routing".into(),
        )),
        (Servers::Primary(primary), _) => {
            let tag = move |push: PushInfo| pushes.send((generation, None, push));
            let client = connect::client(primary, config, ProtocolVersion::RESP3)?;
            let settings = connect::manager_config(config).set_push_sender(tag);
            guarded(
                config.timeout,
                ConnectionManager::new_with_config(client, settings),
            )
            .await
            .map(PubSub::Single)
        }
    }
}

/// Handle of the subscriber connection and its tasks.
pub(super) struct Subscriber {
    link: Arc<Link>,
    subs: Arc<Subscriptions>,
    timeout: Duration,
}

impl Subscriber {
    /// Connects to `servers` and starts the dispatch and ping tasks; they
    /// end with `stop`.
    pub(super) async fn start(
        config: &RedisConfig,
        servers: &Servers,
        shards: Option<&Arc<Shards>>,
        stop: CancellationToken,
    ) -> Result<Self, ClusterError> {
        let (pushes, rx) = mpsc::unbounded_channel();
        let conn = open(servers, shards, config, 0, pushes.clone()).await?;
        let link = Arc::new(Link {
            conn: RwLock::new(conn),
            generation: AtomicU64::new(0),
            pushes,
        });
        let subs = Arc::new(Subscriptions::default());
        tokio::spawn(dispatch(
            rx,
            Arc::clone(&link),
            Arc::clone(&subs),
            stop.clone(),
        ));
        tokio::spawn(ping(
            Arc::clone(&link),
            Arc::clone(&subs),
            config.timeout,
            stop,
        ));
        Ok(Self {
            link,
            subs,
            timeout: config.timeout,
        })
    }

    /// Moves to a connection to `primary` (a failover): every subscription
    /// is lost, and the ping task makes them again there.
    pub(super) async fn reconnect(
        &self,
        primary: &ConnectionInfo,
        config: &RedisConfig,
    ) -> Result<(), ClusterError> {
        let generation = self.link.generation() + 1;
        let servers = Servers::Primary(primary.clone());
        let conn = open(&servers, None, config, generation, self.link.pushes.clone()).await?;
        {
            let mut current = self.link.conn.write().unwrap_or_else(|p| p.into_inner());
            *current = conn;
            self.link.generation.store(generation, Ordering::Release);
        }
        self.subs.connection_lost();
        Ok(())
    }

    /// Subscribes `channel` (a shard channel on a Redis Cluster if
    /// `sharded`); returns once Redis confirmed it.
    pub(super) async fn subscribe(
        &self,
        channel: String,
        sharded: bool,
        listener: LogListener,
    ) -> Result<(), ClusterError> {
        let key = channel.into_bytes();
        let earlier = self.subs.insert(key.clone(), sharded, listener);
        let generation = self.link.generation();
        let result = self.subscribe_now(&key, sharded).await;
        if result.is_ok() && self.link.generation() != generation {
            // Confirmed on a connection replaced meanwhile: made again on
            // the new one by the ping task.
            self.subs.mark_lost(&key);
        }
        if result.is_err() {
            // A failed call changes nothing: an earlier subscription stays
            // (and is restored by the ping task if it was lost).
            match earlier {
                Some(listener) => {
                    self.subs.insert(key, sharded, listener);
                }
                None => {
                    self.subs.remove(&key);
                }
            }
        }
        result
    }

    /// Sends the subscription. On a Redis Cluster a failure is tried again
    /// until the timeout: the server of the channel's slot may have died
    /// moments ago, which the cluster connection learns from the failure
    /// (subscribing twice is harmless).
    async fn subscribe_now(&self, channel: &[u8], sharded: bool) -> Result<(), ClusterError> {
        let deadline = tokio::time::Instant::now() + self.timeout;
        let mut pause = Duration::from_millis(5);
        loop {
            let mut conn = self.link.conn();
            let cluster = matches!(conn, PubSub::Cluster(_));
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            let result = guarded(left, conn.subscribe(channel, sharded)).await;
            if result.is_ok() || !cluster || tokio::time::Instant::now() + pause >= deadline {
                return result;
            }
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(Duration::from_millis(200));
        }
    }

    /// Stops delivering `channel`. Unsubscribing in Redis is best effort: if
    /// it fails, the connection is gone and took the subscription with it.
    pub(super) async fn unsubscribe(&self, channel: String) {
        let Some((sharded, server)) = self.subs.remove(channel.as_bytes()) else {
            return;
        };
        match self.link.conn() {
            PubSub::Single(mut conn) => {
                let _ = guarded(self.timeout, conn.unsubscribe(channel.as_bytes())).await;
            }
            PubSub::Cluster(conns) => {
                let at = server.as_ref();
                let unsubscribe = conns.unsubscribe(channel.as_bytes(), sharded, at);
                let _ = tokio::time::timeout(self.timeout, unsubscribe).await;
            }
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// SUBSCRIBE sent, not yet confirmed.
    Pending,
    /// Confirmed on the current connection.
    Live,
    /// The connection it was on dropped.
    Lost,
}

struct Sub {
    listener: LogListener,
    state: State,
    /// A shard channel on a Redis Cluster.
    sharded: bool,
    /// On a Redis Cluster, the server that confirmed it last.
    server: Option<Addr>,
}

/// The subscribed channels with their listeners and states.
#[derive(Default)]
struct Subscriptions {
    by_channel: Mutex<HashMap<Vec<u8>, Sub>>,
    /// Woken when a subscription is lost, so that it is made again now
    /// rather than on the next ping.
    lost: Notify,
}

impl Subscriptions {
    fn lock(&self) -> MutexGuard<'_, HashMap<Vec<u8>, Sub>> {
        self.by_channel.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Sets the channel's listener; returns the one it replaced.
    fn insert(
        &self,
        channel: Vec<u8>,
        sharded: bool,
        listener: LogListener,
    ) -> Option<LogListener> {
        let mut subs = self.lock();
        match subs.get_mut(&channel) {
            // Replacing the listener of a live subscription keeps it live: a
            // second SUBSCRIBE is only confirmed again, nothing was missed.
            Some(sub) => Some(std::mem::replace(&mut sub.listener, listener)),
            None => {
                subs.insert(
                    channel,
                    Sub {
                        listener,
                        state: State::Pending,
                        sharded,
                        server: None,
                    },
                );
                None
            }
        }
    }

    /// Forgets the channel; whether it was a shard channel, and the server
    /// that confirmed it, if it was there.
    fn remove(&self, channel: &[u8]) -> Option<(bool, Option<Addr>)> {
        self.lock().remove(channel).map(|s| (s.sharded, s.server))
    }

    fn listener(&self, channel: &[u8]) -> Option<LogListener> {
        self.lock().get(channel).map(|s| Arc::clone(&s.listener))
    }

    /// Redis confirmed `channel`; the listener to tell `Resubscribed` if the
    /// subscription had been lost.
    fn confirmed(&self, channel: &[u8], server: Option<Addr>) -> Option<LogListener> {
        let mut subs = self.lock();
        let sub = subs.get_mut(channel)?;
        sub.server = server;
        let was = std::mem::replace(&mut sub.state, State::Live);
        (was == State::Lost).then(|| Arc::clone(&sub.listener))
    }

    fn connection_lost(&self) {
        for sub in self.lock().values_mut() {
            // A pending SUBSCRIBE may have reached the dead connection only.
            sub.state = State::Lost;
        }
        self.lost.notify_one();
    }

    /// The connection to one server of a Redis Cluster was lost: the
    /// channels it served are, and those not confirmed yet (their
    /// subscription may have gone there).
    fn lost_at(&self, server: &Addr) {
        let mut any = false;
        for sub in self.lock().values_mut() {
            if sub.state == State::Pending || sub.server.as_ref() == Some(server) {
                sub.state = State::Lost;
                any = true;
            }
        }
        if any {
            self.lost.notify_one();
        }
    }

    fn mark_lost(&self, channel: &[u8]) {
        if let Some(sub) = self.lock().get_mut(channel) {
            sub.state = State::Lost;
            self.lost.notify_one();
        }
    }

    /// The lost channels: classic ones, then shard ones.
    fn lost(&self) -> (Vec<Vec<u8>>, Vec<Vec<u8>>) {
        let subs = self.lock();
        let lost = subs.iter().filter(|(_, s)| s.state == State::Lost);
        let (sharded, classic): (Vec<_>, Vec<_>) = lost.partition(|(_, s)| s.sharded);
        let names = |v: Vec<(&Vec<u8>, &Sub)>| v.into_iter().map(|(c, _)| c.clone()).collect();
        (names(classic), names(sharded))
    }
}

/// Hands the connection's pushes to the listeners, in the order Redis sent
/// them. Listeners are called without holding the subscription lock.
async fn dispatch(
    mut pushes: mpsc::UnboundedReceiver<Push>,
    link: Arc<Link>,
    subs: Arc<Subscriptions>,
    stop: CancellationToken,
) {
    loop {
        let (generation, server, push) = tokio::select! {
            biased;
            _ = stop.cancelled() => return,
            push = pushes.recv() => match push {
                Some(push) => push,
                None => return,
            },
        };
        if generation != link.generation() {
            // From a connection replaced since: its subscriptions are lost
            // already, and made again on the current one.
            continue;
        }
        let channel = match push.data.first() {
            Some(Value::BulkString(c)) => c.as_slice(),
            _ => &[],
        };
        match push.kind {
            PushKind::Message | PushKind::SMessage => {
                let Some(listener) = subs.listener(channel) else {
                    continue;
                };
                match push.data.get(1) {
                    Some(Value::BulkString(m)) => match decode_message(m) {
                        Some(entry) => listener(LogNotice::Entry(entry)),
                        None => tracing::warn!("malformed message on a room channel"),
                    },
                    _ => tracing::warn!("room channel message without payload"),
                }
            }
            PushKind::Subscribe | PushKind::SSubscribe => {
                if let Some(listener) = subs.confirmed(channel, server) {
                    listener(LogNotice::Resubscribed);
                }
            }
            // The server ended a shard subscription (its slot moved); one
            // this node ended itself is no longer listed.
            PushKind::SUnsubscribe => {
                tracing::debug!("a shard channel's slot moved; subscribing it again");
                subs.mark_lost(channel);
            }
            PushKind::Disconnection => match server {
                Some(server) => {
                    tracing::warn!(
                        ?server,
                        "redis subscriber connection lost; resubscribing its channels"
                    );
                    if let PubSub::Cluster(conns) = link.conn() {
                        conns.drop_conn(&server);
                    }
                    subs.lost_at(&server);
                }
                None => {
                    tracing::warn!(
                        "redis subscriber connection lost; resubscribing once it is back"
                    );
                    subs.connection_lost();
                }
            },
            _ => {}
        }
    }
}

/// Pings the subscriber connection. A failed ping makes the connection
/// manager reconnect; a successful one after a loss resubscribes the lost
/// channels. A loss reported meanwhile starts that at once.
async fn ping(
    link: Arc<Link>,
    subs: Arc<Subscriptions>,
    timeout: Duration,
    stop: CancellationToken,
) {
    let mut tick = tokio::time::interval(PING_INTERVAL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            biased;
            _ = stop.cancelled() => return,
            _ = tick.tick() => {}
            _ = subs.lost.notified() => {}
        }
        let conn = link.conn();
        match &conn {
            PubSub::Single(c) => {
                let ping = ::redis::cmd("PING");
                let mut c = c.clone();
                if let Err(e) = guarded(timeout, ping.query_async::<Value>(&mut c)).await {
                    tracing::debug!("redis subscriber ping failed: {e}");
                    continue;
                }
            }
            // Each server's connection on its own: a silent one loses its
            // own channels only.
            PubSub::Cluster(conns) => {
                for server in conns.check(timeout).await {
                    tracing::debug!(?server, "redis subscriber ping failed");
                    subs.lost_at(&server);
                }
            }
        }
        let (classic, sharded) = subs.lost();
        for channel in classic {
            let mut conn = conn.clone();
            if let Err(e) = guarded(timeout, conn.subscribe(&channel, false)).await {
                tracing::warn!("resubscribing a channel failed: {e}");
            }
        }
        // One at a time: each shard channel goes to its own slot's primary.
        let failed = stream::iter(sharded)
            .map(|channel| {
                let mut conn = conn.clone();
                async move { guarded(timeout, conn.subscribe(&channel, true)).await.err() }
            })
            .buffer_unordered(RESUBSCRIBING)
            .filter_map(std::future::ready)
            .collect::<Vec<_>>()
            .await;
        if let Some(e) = failed.first() {
            tracing::warn!("resubscribing {} room channels failed: {e}", failed.len());
        }
    }
}
