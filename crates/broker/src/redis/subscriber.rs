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
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::errors::guarded;
use super::wire::decode_message;
use super::{connect, RedisConfig};
use crate::{ClusterError, LogListener, LogNotice};

/// How often the subscriber connection is pinged: a dead socket otherwise
/// stays silent, and reconnecting after an outage is driven by these pings.
pub(super) const PING_INTERVAL: Duration = Duration::from_secs(1);

/// A push, with the generation of the connection it came on.
type Push = (u64, PushInfo);

/// The current subscriber connection and its generation.
struct Link {
    conn: RwLock<ConnectionManager>,
    /// Counts connections replaced by [`Subscriber::reconnect`].
    generation: AtomicU64,
    pushes: mpsc::UnboundedSender<Push>,
}

impl Link {
    fn conn(&self) -> ConnectionManager {
        self.conn.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }
}

/// A RESP3 connection to `primary` whose pushes go to `pushes`, tagged
/// `generation`.
async fn open(
    primary: &ConnectionInfo,
    config: &RedisConfig,
    generation: u64,
    pushes: mpsc::UnboundedSender<Push>,
) -> Result<ConnectionManager, ClusterError> {
    let client = connect::client(primary, config, ProtocolVersion::RESP3)?;
    let tag = move |push: PushInfo| pushes.send((generation, push));
    let settings = connect::manager_config(config).set_push_sender(tag);
    guarded(
        config.timeout,
        ConnectionManager::new_with_config(client, settings),
    )
    .await
}

/// Handle of the subscriber connection and its tasks.
pub(super) struct Subscriber {
    link: Arc<Link>,
    subs: Arc<Subscriptions>,
    timeout: Duration,
}

impl Subscriber {
    /// Connects to `primary` and starts the dispatch and ping tasks; they
    /// end with `stop`.
    pub(super) async fn start(
        config: &RedisConfig,
        primary: &ConnectionInfo,
        stop: CancellationToken,
    ) -> Result<Self, ClusterError> {
        let (pushes, rx) = mpsc::unbounded_channel();
        let conn = open(primary, config, 0, pushes.clone()).await?;
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
        let conn = open(primary, config, generation, self.link.pushes.clone()).await?;
        {
            let mut current = self.link.conn.write().unwrap_or_else(|p| p.into_inner());
            *current = conn;
            self.link.generation.store(generation, Ordering::Release);
        }
        self.subs.connection_lost();
        Ok(())
    }

    /// Subscribes `channel`; returns once Redis confirmed it.
    pub(super) async fn subscribe(
        &self,
        channel: String,
        listener: LogListener,
    ) -> Result<(), ClusterError> {
        let key = channel.clone().into_bytes();
        let earlier = self.subs.insert(key.clone(), listener);
        let generation = self.link.generation();
        let result = guarded(self.timeout, self.link.conn().subscribe(&channel)).await;
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
                    self.subs.insert(key, listener);
                }
                None => {
                    self.subs.remove(&key);
                }
            }
        }
        result
    }

    /// Stops delivering `channel`. Unsubscribing in Redis is best effort: if
    /// it fails, the connection is gone and took the subscription with it.
    pub(super) async fn unsubscribe(&self, channel: String) {
        if self.subs.remove(channel.as_bytes()) {
            let _ = guarded(self.timeout, self.link.conn().unsubscribe(&channel)).await;
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
}

/// The subscribed channels with their listeners and states.
#[derive(Default)]
struct Subscriptions {
    by_channel: Mutex<HashMap<Vec<u8>, Sub>>,
}

impl Subscriptions {
    fn lock(&self) -> MutexGuard<'_, HashMap<Vec<u8>, Sub>> {
        self.by_channel.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Sets the channel's listener; returns the one it replaced.
    fn insert(&self, channel: Vec<u8>, listener: LogListener) -> Option<LogListener> {
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
                    },
                );
                None
            }
        }
    }

    fn remove(&self, channel: &[u8]) -> bool {
        self.lock().remove(channel).is_some()
    }

    fn listener(&self, channel: &[u8]) -> Option<LogListener> {
        self.lock().get(channel).map(|s| Arc::clone(&s.listener))
    }

    /// Redis confirmed `channel`; the listener to tell `Resubscribed` if the
    /// subscription had been lost.
    fn confirmed(&self, channel: &[u8]) -> Option<LogListener> {
        let mut subs = self.lock();
        let sub = subs.get_mut(channel)?;
        let was = std::mem::replace(&mut sub.state, State::Live);
        (was == State::Lost).then(|| Arc::clone(&sub.listener))
    }

    fn connection_lost(&self) {
        for sub in self.lock().values_mut() {
            // A pending SUBSCRIBE may have reached the dead connection only.
            sub.state = State::Lost;
        }
    }

    fn mark_lost(&self, channel: &[u8]) {
        if let Some(sub) = self.lock().get_mut(channel) {
            sub.state = State::Lost;
        }
    }

    fn lost(&self) -> Vec<Vec<u8>> {
        self.lock()
            .iter()
            .filter(|(_, s)| s.state == State::Lost)
            .map(|(c, _)| c.clone())
            .collect()
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
        let (generation, push) = tokio::select! {
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
            PushKind::Message => {
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
            PushKind::Subscribe => {
                if let Some(listener) = subs.confirmed(channel) {
                    listener(LogNotice::Resubscribed);
                }
            }
            PushKind::Disconnection => {
                tracing::warn!("redis subscriber connection lost; resubscribing once it is back");
                subs.connection_lost();
            }
            _ => {}
        }
    }
}

/// Pings the subscriber connection. A failed ping makes the connection
/// manager reconnect; a successful one after a loss resubscribes the lost
/// channels.
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
        }
        let mut conn = link.conn();
        let pong = guarded(
            timeout,
            ::redis::cmd("PING").query_async::<Value>(&mut conn),
        )
        .await;
        if let Err(e) = pong {
            tracing::debug!("redis subscriber ping failed: {e}");
            continue;
        }
        let lost = subs.lost();
        if lost.is_empty() {
            continue;
        }
        if let Err(e) = guarded(timeout, conn.subscribe(&lost)).await {
            tracing::warn!("resubscribing {} room channels failed: {e}", lost.len());
        }
    }
}
