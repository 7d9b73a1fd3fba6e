//! Pub/sub on a Redis Cluster through a RESP3 connection per server, so
//! that a server that hangs, dies or fails over costs only the
//! subscriptions it served: each connection's pushes come tagged with its
//! server, and a lost connection loses only that server's channels.
//!
//! A shard channel is subscribed at its slot's primary as the node's slot
//! map ([`Shards`]) names it (`SSUBSCRIBE`, whose confirmation is the
//! command's reply); the control channel, a classic one that every server
//! relays, at any one server.

use std::sync::Arc;
use std::time::Duration;

use ::redis::aio::{ConnectionLike, MultiplexedConnection};
use ::redis::{
    AsyncConnectionConfig, Client, ConnectionInfo, ProtocolVersion, PushInfo, RedisError,
    RedisResult, ServerErrorKind, Value,
};
use futures_util::future::join_all;
use tokio::sync::mpsc;

use super::Push;
use crate::redis::connect::{self, tcp_settings};
use crate::redis::shards::{slot_of, Addr, Connections, Shards};
use crate::redis::RedisConfig;

/// The node's pub/sub connections to a Redis Cluster's servers.
pub(super) struct ShardPubSub {
    shards: Arc<Shards>,
    config: RedisConfig,
    /// Speaking RESP3.
    conns: Connections,
    /// Where every connection's pushes go, tagged with its server.
    pushes: mpsc::UnboundedSender<Push>,
}

impl ShardPubSub {
    pub(super) fn new(
        shards: Arc<Shards>,
        seed: &ConnectionInfo,
        config: &RedisConfig,
        pushes: mpsc::UnboundedSender<Push>,
    ) -> Self {
        let redis = seed
            .redis_settings()
            .clone()
            .set_protocol(ProtocolVersion::RESP3);
        let template = seed
            .clone()
            .set_redis_settings(redis)
            .set_tcp_settings(tcp_settings(config.timeout));
        Self {
            shards,
            config: config.clone(),
            conns: Connections::new(template),
            pushes,
        }
    }

    /// The connection to `addr`, its pushes tagged with it.
    async fn conn(&self, addr: &Addr) -> RedisResult<MultiplexedConnection> {
        self.conns
            .get_or_open(addr, |info| async move {
                let pushes = self.pushes.clone();
                let server = addr.clone();
                let tag = move |push: PushInfo| pushes.send((0, Some(server.clone()), push));
                let settings = AsyncConnectionConfig::new()
                    .set_connection_timeout(Some(connect::connection_timeout(&self.config)))
                    .set_response_timeout(Some(self.config.timeout))
                    .set_push_sender(tag);
                Client::open(info)?
                    .get_multiplexed_async_connection_with_config(&settings)
                    .await
            })
            .await
    }

    /// Forgets the connection to `addr` (its subscriptions count as lost).
    pub(super) fn drop_conn(&self, addr: &Addr) {
        self.conns.remove(addr);
    }

    /// Where `channel` is subscribed: its slot's primary for a shard
    /// channel, any primary for a classic one.
    async fn server_for(&self, channel: &[u8], sharded: bool) -> RedisResult<Addr> {
        let slot = sharded.then(|| slot_of(channel));
        let pick = || match slot {
            Some(slot) => self.shards.primary_of(slot),
            None => self.shards.any_server(),
        };
        if let Some(addr) = pick() {
            return Ok(addr);
        }
        self.shards.refresh().await;
        pick().ok_or_else(|| {
            RedisError::from((
                ::redis::ErrorKind::ClusterConnectionNotFound,
                "no primary known for the channel",
            ))
        })
    }

    /// Subscribes `channel` at its server; returns once that server
    /// confirmed it. A `MOVED` answer teaches the slot map where the slot
    /// went (the caller tries again).
    pub(super) async fn subscribe(&self, channel: &[u8], sharded: bool) -> RedisResult<()> {
        match self.subscribe_once(channel, sharded).await {
            // The map now names the slot's primary: once more, there.
            Err(e) if e.kind() == ::redis::ErrorKind::Server(ServerErrorKind::Moved) => {
                self.subscribe_once(channel, sharded).await
            }
            result => result,
        }
    }

    async fn subscribe_once(&self, channel: &[u8], sharded: bool) -> RedisResult<()> {
        let addr = self.server_for(channel, sharded).await?;
        let mut conn = match self.conn(&addr).await {
            Ok(conn) => conn,
            Err(e) => {
                self.shards.refresh().await;
                return Err(e);
            }
        };
        if !sharded {
            return conn.subscribe(channel).await;
        }
        let mut ssubscribe = ::redis::cmd("SSUBSCRIBE");
        ssubscribe.arg(channel);
        match conn.req_packed_command(&ssubscribe).await {
            Ok(Value::ServerError(e)) => {
                let e: RedisError = e.into();
                if e.kind() == ::redis::ErrorKind::Server(ServerErrorKind::Moved) {
                    match e.redirect_node() {
                        Some((to, slot)) => self.shards.moved_to(slot, to),
                        None => self.shards.refresh().await,
                    }
                }
                Err(e)
            }
            Ok(_) => Ok(()),
            Err(e) => {
                if e.is_io_error() || e.is_connection_dropped() || e.is_timeout() {
                    self.drop_conn(&addr);
                }
                Err(e)
            }
        }
    }

    /// Ends `channel`'s subscription at `at`, the server that confirmed it.
    pub(super) async fn unsubscribe(&self, channel: &[u8], sharded: bool, at: Option<&Addr>) {
        let Some(at) = at else { return };
        let Some(mut conn) = self.conns.get(at) else {
            // The connection is gone, and its subscriptions with it.
            return;
        };
        let result = if sharded {
            let mut sunsubscribe = ::redis::cmd("SUNSUBSCRIBE");
            sunsubscribe.arg(channel);
            conn.req_packed_command(&sunsubscribe).await.map(drop)
        } else {
            conn.unsubscribe(channel).await
        };
        if let Err(e) = result {
            tracing::debug!(
                ?at,
                "unsubscribing failed (the connection took it along): {e}"
            );
        }
    }

    /// Pings every connection at once; the servers that did not answer
    /// within `timeout`, whose connections are dropped (their channels are
    /// then lost, and subscribed again where the map says).
    pub(super) async fn check(&self, timeout: Duration) -> Vec<Addr> {
        let pings = self
            .conns
            .all()
            .into_iter()
            .map(|(addr, mut conn)| async move {
                let ping = ::redis::cmd("PING");
                let answered = tokio::time::timeout(timeout, ping.query_async::<Value>(&mut conn))
                    .await
                    .is_ok_and(|r| r.is_ok());
                (addr, answered)
            });
        let mut failed = Vec::new();
        for (addr, answered) in join_all(pings).await {
            if !answered {
                self.drop_conn(&addr);
                failed.push(addr);
            }
        }
        failed
    }
}
