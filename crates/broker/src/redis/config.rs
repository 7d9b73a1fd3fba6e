use std::time::Duration;

use super::BrokerAck;
use crate::memory_cluster::DEFAULT_LOG_CAPACITY;

/// How a [`super::RedisBroker`] connects and lays out its keys.
#[derive(Clone)]
pub struct RedisConfig {
    /// `redis://[user:password@]host:port[/db]`, or the Sentinels watching
    /// the primary:
    /// `redis+sentinel://[user:password@]host:port[,host:port…]/master_name[/db]`
    /// (the credentials are the data nodes'). The broker picks the wire
    /// protocol of each connection itself.
    pub url: String,
    /// This node's id, unique in the cluster.
    pub node_id: String,
    /// Put before every key and channel name, so several Plaza clusters can
    /// share one Redis. Default `plaza:`.
    pub key_prefix: String,
    /// Log entries each room keeps at least (Redis trims whole blocks, so a
    /// few more may stay). Default 10,000.
    pub log_capacity: usize,
    /// The longest any call waits for Redis before failing with
    /// [`crate::ClusterError::Unavailable`]. Default 2 s.
    pub timeout: Duration,
    /// When an append counts as done. Default [`BrokerAck::Primary`].
    pub ack: BrokerAck,
}

impl RedisConfig {
    /// The defaults for node `node_id` of the Redis at `url`.
    pub fn new(url: impl Into<String>, node_id: impl Into<String>) -> Self {
        Self {
            url: url.into(),
            node_id: node_id.into(),
            key_prefix: "plaza:".into(),
            log_capacity: DEFAULT_LOG_CAPACITY,
            timeout: Duration::from_secs(2),
            ack: BrokerAck::Primary,
        }
    }

    /// With rooms keeping at least `capacity` log entries (at least one).
    pub fn with_log_capacity(mut self, capacity: usize) -> Self {
        self.log_capacity = capacity.max(1);
        self
    }

    /// With every key and channel name starting with `prefix`.
    pub fn with_key_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.key_prefix = prefix.into();
        self
    }

    /// With calls failing after `timeout` without an answer from Redis.
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// With appends done as `ack` says.
    pub fn with_ack(mut self, ack: BrokerAck) -> Self {
        self.ack = ack;
        self
    }

    /// How long `WAIT` waits for replicas under [`BrokerAck::Replicas`]:
    /// half the call timeout, so that its answer (a count, maybe short)
    /// arrives well within the connection's response timeout.
    pub fn ack_wait(&self) -> Duration {
        (self.timeout / 2).max(Duration::from_millis(1))
    }
}

impl std::fmt::Debug for RedisConfig {
    // The URL may carry a password.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisConfig")
            .field("node_id", &self.node_id)
            .field("key_prefix", &self.key_prefix)
            .field("log_capacity", &self.log_capacity)
            .field("timeout", &self.timeout)
            .field("ack", &self.ack)
            .finish_non_exhaustive()
    }
}
