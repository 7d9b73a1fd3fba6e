//! How each of a node's connections is made, and [`Conn`], a connection to
//! one server or to a Redis Cluster.

use std::sync::{Arc, RwLock};
use std::time::Duration;

use ::redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use ::redis::io::tcp::TcpSettings;
use ::redis::{
    AsyncConnectionConfig, Client, Cmd, ConnectionInfo, Pipeline, ProtocolVersion, RedisFuture,
    Value,
};

use super::errors::unavailable;
use super::shards::{slot_of, Addr, Shards};
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

/// The servers a connection goes to.
#[derive(Clone)]
pub(super) enum Servers {
    /// One server: the fixed one, or the primary the Sentinels name.
    Primary(ConnectionInfo),
    /// A Redis Cluster's seeds.
    Cluster(Vec<ConnectionInfo>),
}

/// The command connection to `servers`; on a Redis Cluster, calls go
/// through `shards`, the node's own routing.
pub(super) async fn command_conn(
    servers: &Servers,
    config: &RedisConfig,
    shards: Option<&Arc<Shards>>,
) -> Result<Conn, ClusterError> {
    match (servers, shards) {
        (Servers::Cluster(_), Some(shards)) => Ok(Conn::Cluster(Arc::clone(shards))),
        (Servers::Primary(info), _) => command_manager(info, config).await.map(Conn::Single),
        (Servers::Cluster(_), None) => Err(ClusterError::Unavailable(
            "a Redis Cluster needs its slot routing".into(),
        )),
    }
}

/// A connection to one server (which reconnects on its own), or to a Redis
/// Cluster (each command sent to the primary of its keys' slot by
/// [`Shards`], which shares no connection or lock between servers, so that
/// a hung or dead primary delays only the calls that need it).
#[derive(Clone)]
pub(super) enum Conn {
    Single(ConnectionManager),
    Cluster(Arc<Shards>),
    /// Sending each command to the server at `to` after `ASKING`: that
    /// server is importing the slot, and the keys the command needs have
    /// moved there already (an `ASK` reply).
    Asking {
        shards: Arc<Shards>,
        to: Addr,
    },
}

impl Conn {
    /// The same connection, sending to the server an `ASK` reply named
    /// (`host:port`); `None` for a connection to one server, or an address
    /// that cannot be read.
    pub(super) fn asking(&self, addr: &str) -> Option<Conn> {
        let shards = match self {
            Conn::Single(_) => return None,
            Conn::Cluster(shards) | Conn::Asking { shards, .. } => Arc::clone(shards),
        };
        let (host, port) = addr.rsplit_once(':')?;
        Some(Conn::Asking {
            shards,
            to: (host.to_owned(), port.parse().ok()?),
        })
    }

    /// The connection routed by slot again (after a one-off `ASK`).
    pub(super) fn routed(&self) -> Conn {
        match self {
            Conn::Asking { shards, .. } => Conn::Cluster(Arc::clone(shards)),
            conn => conn.clone(),
        }
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

/// The slot of the first command of `cmds` that names a key.
fn slot_of_first<'a>(cmds: impl IntoIterator<Item = &'a Cmd>) -> Option<u16> {
    cmds.into_iter().find_map(slot_of_cmd)
}

/// The slot of the key `cmd` acts on, if it names one. Plaza's commands
/// name their key first, but for scripts (after the key count), stream
/// reads (after `STREAMS`) and `XGROUP` (after the subcommand).
pub(super) fn slot_of_cmd(cmd: &Cmd) -> Option<u16> {
    let mut args = cmd.args_iter().map(|a| match a {
        ::redis::Arg::Simple(bytes) => bytes,
        _ => &b"0"[..],
    });
    let name = args.next()?.to_ascii_uppercase();
    let key = match name.as_slice() {
        b"EVAL" | b"EVALSHA" | b"EVAL_RO" | b"EVALSHA_RO" | b"FCALL" | b"FCALL_RO" => {
            let _script = args.next()?;
            let keys: usize = std::str::from_utf8(args.next()?).ok()?.parse().ok()?;
            if keys == 0 {
                return None;
            }
            args.next()?
        }
        b"XREAD" | b"XREADGROUP" => {
            args.find(|a| a.eq_ignore_ascii_case(b"STREAMS"))?;
            args.next()?
        }
        b"XGROUP" | b"XINFO" => args.nth(1)?,
        b"PING" | b"PUBLISH" | b"MULTI" | b"EXEC" | b"DISCARD" | b"WAIT" | b"CLUSTER"
        | b"SCRIPT" | b"INFO" | b"ASKING" | b"CLIENT" | b"HELLO" | b"SELECT" | b"ECHO"
        | b"FUNCTION" | b"DBSIZE" | b"TIME" => return None,
        _ => args.next()?,
    };
    Some(slot_of(key))
}

/// Whether `cmd` is `SCRIPT …`: a script is loaded on every primary, as the
/// calls that use it may go to any of them.
fn is_script_cmd(cmd: &Cmd) -> bool {
    cmd.args_iter()
        .next()
        .is_some_and(|a| matches!(a, ::redis::Arg::Simple(n) if n.eq_ignore_ascii_case(b"SCRIPT")))
}

impl ConnectionLike for Conn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Conn::Single(conn) => conn.req_packed_command(cmd),
            Conn::Cluster(shards) => {
                let mut pipe = ::redis::pipe();
                pipe.add_command(cmd.clone());
                Box::pin(async move {
                    let replies = if is_script_cmd(cmd) {
                        shards.on_every_primary(&pipe).await?
                    } else {
                        shards.route(slot_of_cmd(cmd), &pipe, 0, 1).await?
                    };
                    one_reply(replies)
                })
            }
            Conn::Asking { shards, to } => {
                let mut pipe = ::redis::pipe();
                pipe.cmd("ASKING").add_command(cmd.clone());
                Box::pin(async move {
                    let mut replies = shards.route_to(to, &pipe, 1, 1).await?;
                    replies.pop().ok_or_else(no_reply)
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
            Conn::Cluster(shards) => Box::pin(async move {
                let slot = slot_of_first(cmd.cmd_iter());
                shards.route(slot, cmd, offset, count).await
            }),
            Conn::Asking { shards, to } => {
                let pipe = after_asking(cmd);
                let sent = pipe.len();
                let transaction = cmd.is_transaction();
                Box::pin(async move {
                    let replies = shards.route_to(to, &pipe, 0, sent).await?;
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
            Conn::Cluster(_) | Conn::Asking { .. } => 0,
        }
    }
}

fn no_reply() -> ::redis::RedisError {
    ::redis::RedisError::from((
        ::redis::ErrorKind::UnexpectedReturnType,
        "no reply from the redis cluster",
    ))
}

fn one_reply(replies: Vec<Value>) -> ::redis::RedisResult<Value> {
    replies.into_iter().next().ok_or_else(no_reply)
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commands_are_routed_by_the_key_they_name() {
        let key = "plaza:room:{lobby}";
        let slot = Some(slot_of(key.as_bytes()));
        let mut get = ::redis::cmd("HGET");
        get.arg(key).arg("meta");
        assert_eq!(slot_of_cmd(&get), slot);
        let mut eval = ::redis::cmd("EVALSHA");
        eval.arg("abc").arg(2).arg(key).arg("other").arg("x");
        assert_eq!(slot_of_cmd(&eval), slot);
        let mut keyless = ::redis::cmd("EVALSHA");
        keyless.arg("abc").arg(0).arg("x");
        assert_eq!(slot_of_cmd(&keyless), None);
        let mut read = ::redis::cmd("XREADGROUP");
        read.arg("GROUP").arg("g").arg("c").arg("COUNT").arg(1);
        read.arg("STREAMS").arg(key).arg(">");
        assert_eq!(slot_of_cmd(&read), slot);
        let mut group = ::redis::cmd("XGROUP");
        group.arg("CREATE").arg(key).arg("g").arg("0");
        assert_eq!(slot_of_cmd(&group), slot);
        for name in ["PING", "PUBLISH", "MULTI", "WAIT", "SCRIPT"] {
            let mut cmd = ::redis::cmd(name);
            cmd.arg("x");
            assert_eq!(slot_of_cmd(&cmd), None, "{name}");
        }
        let mut pipe = ::redis::pipe();
        pipe.cmd("MULTI")
            .cmd("HSET")
            .arg(key)
            .arg("a")
            .arg(1)
            .cmd("EXEC");
        assert_eq!(slot_of_first(pipe.cmd_iter()), slot);
    }
}
