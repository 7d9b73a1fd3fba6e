//! How each of a node's connections is made.

use std::sync::RwLock;
use std::time::Duration;

use ::redis::aio::{ConnectionManager, ConnectionManagerConfig};
use ::redis::io::tcp::TcpSettings;
use ::redis::{AsyncConnectionConfig, Client, ConnectionInfo, ProtocolVersion};

use super::errors::unavailable;
use super::RedisConfig;
use crate::ClusterError;

/// A client for the server at `info` speaking `protocol`, whatever the URL
/// asks for: replies are parsed assuming that protocol.
pub(super) fn client(
    info: &ConnectionInfo,
    config: &RedisConfig,
    protocol: ProtocolVersion,
) -> Result<Client, ClusterError> {
    let info = info.clone();
    let redis = info.redis_settings().clone().set_protocol(protocol);
    let info = info
        .set_redis_settings(redis)
        .set_tcp_settings(tcp_settings(config.timeout));
    Client::open(info).map_err(unavailable)
}

/// Nagle's algorithm would hold back small pipelined commands (not the
/// default in redis 1.x). TCP_USER_TIMEOUT turns a peer that stopped
/// acknowledging (a dead host, a cut network) into a connection error, so
/// the pings on the subscriber connection notice it.
fn tcp_settings(timeout: Duration) -> TcpSettings {
    let settings = TcpSettings::default().set_nodelay(true);
    #[cfg(target_os = "linux")]
    let settings = settings.set_user_timeout(timeout * 2);
    #[cfg(not(target_os = "linux"))]
    let _ = timeout;
    settings
}

/// How long a connection attempt may take: part of a call's time budget.
pub(super) fn connection_timeout(config: &RedisConfig) -> Duration {
    (config.timeout / 2).max(Duration::from_millis(100))
}

/// Settings of a reconnecting connection. No retries inside one attempt: a
/// call during an outage must fail promptly, and the next call (or ping)
/// starts the next attempt.
pub(super) fn manager_config(config: &RedisConfig) -> ConnectionManagerConfig {
    ConnectionManagerConfig::new()
        .set_number_of_retries(0)
        .set_connection_timeout(Some(connection_timeout(config)))
        .set_response_timeout(Some(config.timeout))
}

/// The connection for ordinary commands, to the primary at `info`.
pub(super) async fn command_manager(
    info: &ConnectionInfo,
    config: &RedisConfig,
) -> Result<ConnectionManager, ClusterError> {
    let client = client(info, config, ProtocolVersion::RESP2)?;
    let connect = ConnectionManager::new_with_config(client, manager_config(config));
    super::errors::guarded(config.timeout, connect).await
}

/// Settings of the append task's own connection.
pub(super) fn plain_config(config: &RedisConfig) -> AsyncConnectionConfig {
    AsyncConnectionConfig::new()
        .set_connection_timeout(Some(connection_timeout(config)))
        .set_response_timeout(Some(config.timeout))
}

/// The command connection, replaced when a failover names a new primary
/// (a connection manager reconnects to one address only).
pub(super) struct Commands(RwLock<ConnectionManager>);

impl Commands {
    pub(super) fn new(conn: ConnectionManager) -> Self {
        Self(RwLock::new(conn))
    }

    /// The current connection (a cheap clone).
    pub(super) fn get(&self) -> ConnectionManager {
        self.0.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Calls from now on go to `conn`; calls in flight finish on the old one.
    pub(super) fn replace(&self, conn: ConnectionManager) {
        *self.0.write().unwrap_or_else(|p| p.into_inner()) = conn;
    }
}
