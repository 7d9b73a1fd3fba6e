//! How each of a node's connections is made, and [`Conn`], a connection to
//! one server or to a Redis Cluster.

use std::sync::RwLock;
use std::time::Duration;

use ::redis::aio::{AsyncPushSender, ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use ::redis::cluster::ClusterClientBuilder;
use ::redis::cluster_async::ClusterConnection;
use ::redis::cluster_routing::SingleNodeRoutingInfo;
use ::redis::io::tcp::TcpSettings;
use ::redis::{
    AsyncConnectionConfig, Client, Cmd, ConnectionInfo, Pipeline, ProtocolVersion, RedisFuture,
    Value,
};

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
pub(super) fn tcp_settings(timeout: Duration) -> TcpSettings {
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

/// A connection to a Redis Cluster through `seeds`, speaking `protocol`,
/// its pushes (RESP3 only) sent to `pushes`.
///
/// The redis crate retries nothing on a command connection
/// (`idempotent` false): a command that met a broken connection may have
/// run, and running an append twice would log it twice. Redirections
/// (which say the command did not run) are followed by
/// [`super::errors::on_conn`] instead. On the pub/sub connection, whose
/// commands can be repeated, it follows them itself.
pub(super) async fn cluster_connection(
    seeds: &[ConnectionInfo],
    config: &RedisConfig,
    protocol: ProtocolVersion,
    pushes: Option<impl AsyncPushSender>,
    idempotent: bool,
) -> Result<ClusterConnection, ClusterError> {
    let mut builder = ClusterClientBuilder::new(seeds.to_vec())
        .retries(if idempotent { IDEMPOTENT_RETRIES } else { 0 })
        .use_protocol(protocol)
        .connection_timeout(connection_timeout(config))
        .response_timeout(config.timeout)
        .tcp_settings(tcp_settings(config.timeout));
    if let Some(pushes) = pushes {
        builder = builder.push_sender(pushes);
    }
    let client = builder.build().map_err(unavailable)?;
    super::errors::guarded(config.timeout, client.get_async_connection()).await
}

/// How often the redis crate sends a pub/sub command again (after a
/// redirection, a slot in migration or a lost connection).
const IDEMPOTENT_RETRIES: u32 = 5;

/// The servers a connection goes to.
#[derive(Clone)]
pub(super) enum Servers {
    /// One server: the fixed one, or the primary the Sentinels name.
    Primary(ConnectionInfo),
    /// A Redis Cluster's seeds.
    Cluster(Vec<ConnectionInfo>),
}

/// The command connection to `servers`.
pub(super) async fn command_conn(
    servers: &Servers,
    config: &RedisConfig,
) -> Result<Conn, ClusterError> {
    match servers {
        Servers::Primary(info) => command_manager(info, config).await.map(Conn::Single),
        Servers::Cluster(seeds) => {
            let none: Option<fn(::redis::PushInfo) -> Result<(), ()>> = None;
            cluster_connection(seeds, config, ProtocolVersion::RESP2, none, false)
                .await
                .map(Conn::Cluster)
        }
    }
}

/// A connection to one server (which reconnects on its own), or to a Redis
/// Cluster (which routes each command to the primary of its keys' slot).
#[derive(Clone)]
pub(super) enum Conn {
    Single(ConnectionManager),
    Cluster(ClusterConnection),
    /// The cluster connection, sending each command to the server at `host`
    /// `port` after `ASKING`: that server is importing the slot, and the
    /// keys the command needs have moved there already (an `ASK` reply).
    Asking {
        conn: ClusterConnection,
        host: String,
        port: u16,
    },
}

impl Conn {
    /// The same connection, sending to the server an `ASK` reply named
    /// (`host:port`); `None` for a connection to one server, or an address
    /// that cannot be read.
    pub(super) fn asking(&self, addr: &str) -> Option<Conn> {
        let conn = match self {
            Conn::Single(_) => return None,
            Conn::Cluster(conn) | Conn::Asking { conn, .. } => conn.clone(),
        };
        let (host, port) = addr.rsplit_once(':')?;
        Some(Conn::Asking {
            conn,
            host: host.to_owned(),
            port: port.parse().ok()?,
        })
    }
}

/// The commands of `pipeline`, each after an `ASKING` (which holds for the
/// next command only); a transaction (`MULTI` … `EXEC`) after one `ASKING`
/// for the whole of it, as Redis takes it.
fn after_asking(pipeline: &Pipeline) -> Pipeline {
    let mut asking = ::redis::pipe();
    if pipeline.is_transaction() {
        asking.cmd("ASKING").cmd("MULTI");
        for cmd in pipeline.cmd_iter() {
            asking.add_command(cmd.clone());
        }
        asking.cmd("EXEC");
        return asking;
    }
    for cmd in pipeline.cmd_iter() {
        asking.cmd("ASKING");
        asking.add_command(cmd.clone());
    }
    asking
}

impl ConnectionLike for Conn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Conn::Single(conn) => conn.req_packed_command(cmd),
            Conn::Cluster(conn) => conn.req_packed_command(cmd),
            Conn::Asking { conn, host, port } => {
                let mut pipe = ::redis::pipe();
                pipe.cmd("ASKING").add_command(cmd.clone());
                let route = SingleNodeRoutingInfo::ByAddress {
                    host: host.clone(),
                    port: *port,
                };
                Box::pin(async move {
                    let mut replies = conn.route_pipeline(pipe, 1, 1, route).await?;
                    replies.pop().ok_or_else(|| {
                        ::redis::RedisError::from((
                            ::redis::ErrorKind::UnexpectedReturnType,
                            "no reply after ASKING",
                        ))
                    })
                })
            }
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        cmd: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Conn::Single(conn) => conn.req_packed_commands(cmd, offset, count),
            Conn::Cluster(conn) => conn.req_packed_commands(cmd, offset, count),
            Conn::Asking { conn, host, port } => {
                let route = SingleNodeRoutingInfo::ByAddress {
                    host: host.clone(),
                    port: *port,
                };
                let pipe = after_asking(cmd);
                let sent = pipe.len();
                let transaction = cmd.is_transaction();
                Box::pin(async move {
                    let replies = conn.route_pipeline(pipe, 0, sent, route).await?;
                    if transaction {
                        // ASKING, then MULTI … EXEC as the caller packed it.
                        return Ok(replies.into_iter().skip(1 + offset).take(count).collect());
                    }
                    // Every other reply is an ASKING's.
                    let own = replies.into_iter().skip(1).step_by(2);
                    Ok(own.skip(offset).take(count).collect())
                })
            }
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Conn::Single(conn) => conn.get_db(),
            Conn::Cluster(conn) | Conn::Asking { conn, .. } => conn.get_db(),
        }
    }
}

/// The command connection, replaced when a failover names a new primary
/// (a connection manager reconnects to one address only).
pub(super) struct Commands(RwLock<Conn>);

impl Commands {
    pub(super) fn new(conn: Conn) -> Self {
        Self(RwLock::new(conn))
    }

    /// The current connection (a cheap clone).
    pub(super) fn get(&self) -> Conn {
        self.0.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Calls from now on go to `conn`; calls in flight finish on the old one.
    pub(super) fn replace(&self, conn: Conn) {
        *self.0.write().unwrap_or_else(|p| p.into_inner()) = conn;
    }
}
