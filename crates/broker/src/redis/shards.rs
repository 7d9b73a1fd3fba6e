//! A node's own routing on a Redis Cluster: a connection to each server and
//! the map of which primary serves which slot, shared by the append task
//! (a batch goes as one pipeline per primary) and the command calls.
//!
//! Why not the redis crate's cluster connection: it holds every call while
//! it recovers from one server's failure (reconnecting to the seeds,
//! reading the slot map), so one shard's failover stalled the rooms of all
//! the others; and it retries or fails a whole pipeline when one of its
//! commands is redirected, which would run the others twice. Here each command's answer
//! is taken on its own: a command redirected (`MOVED`, `ASK`), refused for
//! a slot in migration (`TRYAGAIN`) or a cluster in failover (`CLUSTERDOWN`,
//! `MASTERDOWN`, `READONLY`, `LOADING`) did not run, and is sent again where
//! it now belongs; the others keep their answers. A connection that fails
//! with commands in flight fails them (they may have run) and is opened
//! anew for the next batch.
//!
//! `WAIT N` ends each primary's pipeline: it counts the replicas that have
//! every write sent before it on that connection.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, RwLock};
use std::time::Duration;

use ::redis::aio::{ConnectionLike, MultiplexedConnection};
use ::redis::{
    AsyncConnectionConfig, Client, Cmd, ConnectionAddr, ConnectionInfo, RedisError,
    ServerErrorKind, Value,
};
use futures_util::future::join_all;
use tokio::time::Instant;

use super::errors::{guarded, unavailable};
use super::RedisConfig;
use crate::ClusterError;

/// Slots of a Redis Cluster.
const SLOTS: u16 = 16384;

/// The first pause before commands told to wait are sent again, doubled
/// each time up to [`MOST_BACKOFF`].
const LEAST_BACKOFF: Duration = Duration::from_millis(5);
const MOST_BACKOFF: Duration = Duration::from_millis(200);

/// The hash slot of `key`: CRC16 (XMODEM) of its hash tag, the part between
/// the first `{` and the next `}` when that is not empty, else of the key.
pub(super) fn slot_of(key: &[u8]) -> u16 {
    let tagged = key.iter().position(|&b| b == b'{').and_then(|open| {
        let rest = &key[open + 1..];
        let close = rest.iter().position(|&b| b == b'}')?;
        (close > 0).then(|| &rest[..close])
    });
    crc16::State::<crc16::XMODEM>::calculate(tagged.unwrap_or(key)) % SLOTS
}

/// One command to send, with the key that decides its slot.
pub(super) struct Routed {
    pub(super) key: String,
    pub(super) cmd: Cmd,
}

/// A command's reply, with the reply of the `WAIT` that ended its pipeline.
pub(super) type Replied = Result<(Value, Option<Value>), ClusterError>;

/// A primary's address.
pub(super) type Addr = (String, u16);

/// The primary of each slot range, by the range's first slot.
type SlotMap = Vec<(u16, u16, Addr)>;

/// How long one server may take to answer `CLUSTER SLOTS` before the map
/// is taken from another: a hung server must not hold up a refresh.
const SLOTS_PATIENCE: Duration = Duration::from_millis(500);

/// Connections to a Redis Cluster's servers, and its slot map, shared by
/// every caller on a node (the append task's lanes, the command calls).
///
/// Nothing here waits on one server on behalf of another: the map and the
/// connection table are behind short locks never held across an await;
/// connections are opened outside them; the map is read anew from every
/// known server at once, the first answer taken.
pub(super) struct Shards {
    /// Asked for the slot map besides the primaries known.
    seeds: Vec<Addr>,
    settings: AsyncConnectionConfig,
    timeout: Duration,
    map: RwLock<SlotMap>,
    conns: Connections,
    /// Loaded on every connection opened.
    scripts: Vec<&'static ::redis::Script>,
    /// Held by the one refresh under way; a caller that waited for it takes
    /// its map rather than reading another.
    refreshing: tokio::sync::Mutex<()>,
    /// Counts maps read.
    generation: AtomicU64,
    /// The server keyless commands go to (`PUBLISH` on a classic channel,
    /// which every server relays): the last that answered one, cleared when
    /// one fails.
    preferred: Mutex<Option<Addr>>,
}

/// Connections by server, opened outside the table's lock: a server slow
/// to accept delays only its own callers.
pub(super) struct Connections {
    /// Credentials and settings for every server.
    template: ConnectionInfo,
    conns: Mutex<HashMap<Addr, MultiplexedConnection>>,
}

impl Connections {
    pub(super) fn new(template: ConnectionInfo) -> Self {
        Self {
            template,
            conns: Mutex::new(HashMap::new()),
        }
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<Addr, MultiplexedConnection>> {
        self.conns.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The connection to `addr`, or the one `open` makes from the
    /// template's settings at that address. Two callers may open one at
    /// once: the first kept is everyone's.
    pub(super) async fn get_or_open<F>(
        &self,
        addr: &Addr,
        open: impl FnOnce(ConnectionInfo) -> F,
    ) -> Result<MultiplexedConnection, RedisError>
    where
        F: std::future::Future<Output = Result<MultiplexedConnection, RedisError>>,
    {
        if let Some(conn) = self.lock().get(addr) {
            return Ok(conn.clone());
        }
        let info = self
            .template
            .clone()
            .set_addr(ConnectionAddr::Tcp(addr.0.clone(), addr.1));
        let conn = open(info).await?;
        Ok(self.lock().entry(addr.clone()).or_insert(conn).clone())
    }

    /// The connection to `addr`, if one is open.
    pub(super) fn get(&self, addr: &Addr) -> Option<MultiplexedConnection> {
        self.lock().get(addr).cloned()
    }

    /// Every open connection.
    pub(super) fn all(&self) -> Vec<(Addr, MultiplexedConnection)> {
        self.lock()
            .iter()
            .map(|(a, c)| (a.clone(), c.clone()))
            .collect()
    }

    pub(super) fn remove(&self, addr: &Addr) {
        self.lock().remove(addr);
    }

    pub(super) fn clear(&self) {
        self.lock().clear();
    }
}

/// Where a command goes next, and whether it was told to wait.
enum Next {
    Done,
    Ask((String, u16)),
    Moved,
    Pause,
}

impl Shards {
    /// Reads the slot map from `seeds`; connections to the primaries are
    /// opened when first needed, with `scripts` loaded.
    pub(super) async fn new(
        seeds: &[ConnectionInfo],
        config: &RedisConfig,
        scripts: Vec<&'static ::redis::Script>,
    ) -> Result<Self, ClusterError> {
        let template = seeds
            .first()
            .ok_or_else(|| unavailable("a Redis Cluster URL needs at least one server"))?
            .clone()
            .set_tcp_settings(super::connect::tcp_settings(config.timeout));
        let seeds = seeds
            .iter()
            .filter_map(|info| match info.addr() {
                ConnectionAddr::Tcp(host, port) => Some((host.clone(), *port)),
                ConnectionAddr::TcpTls { host, port, .. } => Some((host.clone(), *port)),
                _ => None,
            })
            .collect();
        let shards = Self {
            seeds,
            settings: super::connect::plain_config(config),
            timeout: config.timeout,
            map: RwLock::new(Vec::new()),
            conns: Connections::new(template),
            scripts,
            refreshing: tokio::sync::Mutex::new(()),
            generation: AtomicU64::new(0),
            preferred: Mutex::new(None),
        };
        shards.refresh().await;
        if shards.read_map().is_empty() {
            return Err(unavailable(
                "no server of the Redis Cluster answered CLUSTER SLOTS",
            ));
        }
        Ok(shards)
    }

    fn read_map(&self) -> std::sync::RwLockReadGuard<'_, SlotMap> {
        self.map.read().unwrap_or_else(|p| p.into_inner())
    }

    /// Reads the slot map again (`CLUSTER SLOTS`), from every known server
    /// at once, taking the first full answer. A caller that finds a refresh
    /// under way waits for it and takes its map.
    pub(super) async fn refresh(&self) {
        let seen = self.generation.load(Ordering::Acquire);
        let _one = self.refreshing.lock().await;
        if self.generation.load(Ordering::Acquire) != seen {
            return;
        }
        let mut servers: Vec<Addr> = self.read_map().iter().map(|r| r.2.clone()).collect();
        servers.extend(self.seeds.iter().cloned());
        servers.sort();
        servers.dedup();
        let asks = servers
            .into_iter()
            .map(|addr| Box::pin(async move { self.slots_at(&addr).await }));
        match futures_util::future::select_ok(asks).await {
            Ok((map, _)) => {
                *self.map.write().unwrap_or_else(|p| p.into_inner()) = map;
                self.generation.fetch_add(1, Ordering::AcqRel);
            }
            Err(e) => tracing::debug!("reading the redis cluster's slot map failed: {e}"),
        }
    }

    /// The slot map as the server at `addr` sees it.
    async fn slots_at(&self, addr: &Addr) -> Result<SlotMap, ClusterError> {
        let patience = self.timeout.min(SLOTS_PATIENCE);
        let mut conn = guarded(patience, self.conn(addr)).await?;
        let mut slots = ::redis::cmd("CLUSTER");
        slots.arg("SLOTS");
        let reply: Value = guarded(patience, slots.query_async(&mut conn)).await?;
        let map = parse_slots(reply)?;
        if map.is_empty() {
            return Err(unavailable(format!("{addr:?} serves no slot")));
        }
        Ok(map)
    }

    /// The primary serving `slot`, as far as the map knows.
    pub(super) fn primary_of(&self, slot: u16) -> Option<Addr> {
        let map = self.read_map();
        let at = map.partition_point(|r| r.0 <= slot).checked_sub(1)?;
        let (_, end, addr) = &map[at];
        (slot <= *end).then(|| addr.clone())
    }

    /// Learns from a `MOVED` answer that `slot` is served at `addr` now,
    /// without reading the whole map.
    fn moved(&self, slot: u16, addr: Addr) {
        let mut map = self.map.write().unwrap_or_else(|p| p.into_inner());
        let Some(at) = map.partition_point(|r| r.0 <= slot).checked_sub(1) else {
            return;
        };
        let (start, end, owner) = map[at].clone();
        if slot > end || owner == addr {
            return;
        }
        // Split the range around the slot.
        let mut pieces = Vec::with_capacity(3);
        if start < slot {
            pieces.push((start, slot - 1, owner.clone()));
        }
        pieces.push((slot, slot, addr));
        if slot < end {
            pieces.push((slot + 1, end, owner));
        }
        map.splice(at..=at, pieces);
    }

    /// [`Self::moved`], from a `MOVED` answer's `host:port`.
    pub(super) fn moved_to(&self, slot: u16, to: &str) {
        if let Some(to) = parse_addr(to) {
            self.moved(slot, to);
        }
    }

    /// A server to send a keyless command to: the one that last answered
    /// such a command, else the first primary of the map.
    pub(super) fn any_server(&self) -> Option<Addr> {
        let preferred = self
            .preferred
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        preferred.or_else(|| self.read_map().first().map(|r| r.2.clone()))
    }

    fn answered(&self, addr: &Addr, ok: bool) {
        let mut preferred = self.preferred.lock().unwrap_or_else(|p| p.into_inner());
        match (ok, preferred.as_ref() == Some(addr)) {
            (true, false) if preferred.is_none() => *preferred = Some(addr.clone()),
            (false, true) => {
                // The next keyless command tries the next primary.
                let map = self.read_map();
                let next = map.iter().map(|r| &r.2).find(|a| *a != addr).cloned();
                *preferred = next;
            }
            _ => {}
        }
    }

    /// The connection to `addr`, opened (with the scripts loaded) if there
    /// is none. `Err` means nothing was sent. Opening happens outside the
    /// table's lock: a server slow to accept delays only its own callers.
    pub(super) async fn conn(&self, addr: &Addr) -> Result<MultiplexedConnection, RedisError> {
        self.conns
            .get_or_open(addr, |info| async move {
                let client = Client::open(info)?;
                let mut conn = client
                    .get_multiplexed_async_connection_with_config(&self.settings)
                    .await?;
                for script in &self.scripts {
                    script.load_async(&mut conn).await?;
                }
                Ok(conn)
            })
            .await
    }

    /// Forgets the connection to `addr`: the next call opens a new one.
    pub(super) fn drop_conn(&self, addr: &Addr) {
        self.conns.remove(addr);
    }

    /// Forgets every connection: the next batch opens them again, loading
    /// the scripts (after someone flushed them).
    pub(super) fn reset(&self) {
        self.conns.clear();
    }

    /// Sends `pipe` to the server of `slot` (any server for `None`), or to
    /// `asking` after `ASKING` (see [`super::connect::Conn`]). Failures that
    /// may mean the map is stale (no connection, a broken one, `MOVED`)
    /// make it read anew; the caller decides whether to send again.
    pub(super) async fn route(
        &self,
        slot: Option<u16>,
        pipe: &::redis::Pipeline,
        offset: usize,
        count: usize,
    ) -> ::redis::RedisResult<Vec<Value>> {
        let addr = match slot {
            Some(slot) => self.primary_of(slot),
            None => self.any_server(),
        };
        let Some(addr) = addr else {
            self.refresh().await;
            return Err(RedisError::from((
                ::redis::ErrorKind::ClusterConnectionNotFound,
                "no primary known for the slot",
            )));
        };
        self.route_to(&addr, pipe, offset, count).await
    }

    /// [`Self::route`] to the server at `addr`.
    pub(super) async fn route_to(
        &self,
        addr: &Addr,
        pipe: &::redis::Pipeline,
        offset: usize,
        count: usize,
    ) -> ::redis::RedisResult<Vec<Value>> {
        let mut conn = match self.conn(addr).await {
            Ok(conn) => conn,
            Err(e) => {
                self.answered(addr, false);
                self.refresh().await;
                return Err(e);
            }
        };
        let sent =
            tokio::time::timeout(self.timeout, conn.req_packed_commands(pipe, offset, count)).await;
        let replies = match sent {
            Ok(Ok(replies)) => replies,
            Ok(Err(e)) => {
                self.answered(addr, false);
                if e.is_io_error() || e.is_connection_dropped() {
                    self.drop_conn(addr);
                    self.refresh().await;
                }
                if let (::redis::ErrorKind::Server(ServerErrorKind::Moved), Some((to, slot))) =
                    (e.kind(), e.redirect_node())
                {
                    if let Some(to) = parse_addr(to) {
                        self.moved(slot, to);
                    }
                }
                return Err(e);
            }
            Err(_) => {
                // Replies still to come would be taken for the next call's.
                self.answered(addr, false);
                self.drop_conn(addr);
                return Err(RedisError::from(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    format!("no answer from {addr:?} within {:?}", self.timeout),
                )));
            }
        };
        self.answered(addr, true);
        for value in &replies {
            if let Value::ServerError(e) = value {
                if e.kind() == Some(ServerErrorKind::Moved) {
                    let e: RedisError = e.clone().into();
                    if let Some((to, slot)) = e.redirect_node() {
                        if let Some(to) = parse_addr(to) {
                            self.moved(slot, to);
                        }
                    }
                }
            }
        }
        Ok(replies)
    }

    /// Sends `pipe` to every primary of the map at once (loading a script:
    /// calls that use it may go to any of them); the first primary's
    /// replies, or the first failure.
    pub(super) async fn on_every_primary(
        &self,
        pipe: &::redis::Pipeline,
    ) -> ::redis::RedisResult<Vec<Value>> {
        let mut primaries: Vec<Addr> = self.read_map().iter().map(|r| r.2.clone()).collect();
        primaries.sort();
        primaries.dedup();
        let count = pipe.len();
        let replies = join_all(
            primaries
                .iter()
                .map(|addr| self.route_to(addr, pipe, 0, count)),
        )
        .await;
        // A primary that did not take it would answer NOSCRIPT later: fail.
        let mut first = None;
        for reply in replies {
            match reply {
                Err(e) => return Err(e),
                Ok(values) => {
                    first.get_or_insert(values);
                }
            }
        }
        first.ok_or_else(|| {
            RedisError::from((
                ::redis::ErrorKind::ClusterConnectionNotFound,
                "no primary known",
            ))
        })
    }

    /// Sends every command to its slot's primary, each primary's share as
    /// one pipeline (ended by `trailer`, if any), all at once; commands that
    /// did not run are sent again where they now belong until the call
    /// timeout. Answers are in the order of `cmds`, each with the primary
    /// that answered `ASK` if it was sent on to the importing one: that
    /// primary still serves the slot's shard channels, so what the command
    /// published there reached no subscriber (see [`Self::publish_at`]).
    pub(super) async fn send(
        &self,
        cmds: Vec<Routed>,
        trailer: Option<Cmd>,
    ) -> Vec<(Replied, Option<Addr>)> {
        let deadline = Instant::now() + self.timeout;
        let mut answers: Vec<Option<Replied>> = (0..cmds.len()).map(|_| None).collect();
        let mut asked: Vec<Option<Addr>> = vec![None; cmds.len()];
        let slots: Vec<u16> = cmds.iter().map(|c| slot_of(c.key.as_bytes())).collect();
        // Commands still to send, with the server an ASK named.
        let mut todo: Vec<(usize, Option<(String, u16)>)> =
            (0..cmds.len()).map(|i| (i, None)).collect();
        let mut backoff = LEAST_BACKOFF;
        while !todo.is_empty() {
            let mut by_primary: HashMap<(String, u16), Vec<(usize, bool)>> = HashMap::new();
            let mut unmapped = false;
            for (i, ask) in std::mem::take(&mut todo) {
                let asking = ask.is_some();
                match ask.or_else(|| self.primary_of(slots[i])) {
                    Some(addr) => by_primary.entry(addr).or_default().push((i, asking)),
                    None => {
                        unmapped = true;
                        todo.push((i, None));
                    }
                }
            }
            let mut sends = Vec::with_capacity(by_primary.len());
            let mut refused = Vec::new();
            // At once: a primary slow to accept delays only its own share.
            let opened = join_all(by_primary.into_iter().map(|(addr, items)| async move {
                let conn = self.conn(&addr).await;
                (addr, items, conn)
            }))
            .await;
            for (addr, items, conn) in opened {
                match conn {
                    Ok(conn) => sends.push((addr, items, conn)),
                    // Nothing was sent: try again once the map is read anew.
                    Err(e) => {
                        tracing::debug!(?addr, "redis cluster primary unreachable: {e}");
                        refused.extend(items.into_iter().map(|(i, _)| (i, None)));
                    }
                }
            }
            let remaining = deadline.saturating_duration_since(Instant::now());
            let replies = join_all(sends.into_iter().map(|(addr, items, mut conn)| {
                let mut pipe = ::redis::pipe();
                pipe.ignore_errors();
                for &(i, asking) in &items {
                    if asking {
                        pipe.cmd("ASKING").ignore();
                    }
                    pipe.add_command(cmds[i].cmd.clone());
                }
                if let Some(trailer) = &trailer {
                    pipe.add_command(trailer.clone());
                }
                async move {
                    let sent =
                        tokio::time::timeout(remaining, pipe.query_async::<Vec<Value>>(&mut conn))
                            .await;
                    (addr, items, sent)
                }
            }))
            .await;
            let mut refresh = unmapped || !refused.is_empty();
            let mut pause = refresh;
            todo.extend(refused);
            for (addr, items, sent) in replies {
                let mut values = match sent {
                    Ok(Ok(values)) => values.into_iter(),
                    Ok(Err(e)) if never_sent(&e) => {
                        // The primary was gone before the pipeline was
                        // written (it died): nothing ran. Connect anew,
                        // wherever the slot map now says.
                        self.drop_conn(&addr);
                        refresh = true;
                        pause = true;
                        todo.extend(items.into_iter().map(|(i, _)| (i, None)));
                        continue;
                    }
                    failed => {
                        // They may have run: fail them, and connect anew.
                        self.drop_conn(&addr);
                        let e = match failed {
                            Ok(Err(e)) => unavailable(e),
                            _ => unavailable(format!(
                                "no answer from redis within {:?}",
                                self.timeout
                            )),
                        };
                        for (i, _) in items {
                            answers[i] = Some(Err(e.clone()));
                        }
                        continue;
                    }
                };
                let waited = match trailer {
                    Some(_) => values.next_back(),
                    None => None,
                };
                for (i, _) in items {
                    let value = values.next().unwrap_or(Value::Nil);
                    match next_step(&value) {
                        Next::Done => answers[i] = Some(Ok((value, waited.clone()))),
                        Next::Ask(to) => {
                            asked[i] = Some(addr.clone());
                            todo.push((i, Some(to)));
                        }
                        Next::Moved => {
                            refresh = true;
                            todo.push((i, None));
                        }
                        Next::Pause => {
                            pause = true;
                            todo.push((i, None));
                        }
                    }
                }
            }
            if todo.is_empty() {
                break;
            }
            if Instant::now() >= deadline {
                let e = unavailable(format!(
                    "the redis cluster did not take the call within {:?}",
                    self.timeout
                ));
                for (i, _) in todo.drain(..) {
                    answers[i] = Some(Err(e.clone()));
                }
                break;
            }
            if pause {
                tokio::time::sleep(backoff.min(deadline.saturating_duration_since(Instant::now())))
                    .await;
                backoff = (backoff * 2).min(MOST_BACKOFF);
            }
            if refresh {
                self.refresh().await;
            }
        }
        answers
            .into_iter()
            .map(|a| a.unwrap_or_else(|| Err(unavailable("no answer"))))
            .zip(asked)
            .collect()
    }

    /// Publishes `messages` on shard channel `channel` at primary `at` (one
    /// that answered `ASK`: it still holds the channel's subscribers while
    /// the keys are on the importing primary). Best effort: a failure is
    /// only logged, and a subscriber that misses an entry reads it from the
    /// log when the next one shows the gap, or when the slot's move ends
    /// its subscription.
    pub(super) async fn publish_at(&self, at: &Addr, channel: &str, messages: Vec<Vec<u8>>) {
        let mut pipe = ::redis::pipe();
        for message in messages {
            pipe.cmd("SPUBLISH").arg(channel).arg(message).ignore();
        }
        let sent = match self.conn(at).await {
            Ok(mut conn) => guarded(self.timeout, pipe.query_async::<()>(&mut conn)).await,
            Err(e) => Err(unavailable(e)),
        };
        if let Err(e) = sent {
            tracing::debug!(?at, "publishing at the migrating primary failed: {e}");
        }
    }
}

/// A `CLUSTER SLOTS` reply as a map sorted by first slot.
fn parse_slots(reply: Value) -> Result<SlotMap, ClusterError> {
    let Value::Array(ranges) = reply else {
        return Err(unavailable(format!(
            "unexpected CLUSTER SLOTS reply: {reply:?}"
        )));
    };
    let mut map = Vec::with_capacity(ranges.len());
    for range in ranges {
        let Value::Array(parts) = range else { continue };
        let (Some(start), Some(end), Some(Value::Array(primary))) =
            (parts.first(), parts.get(1), parts.get(2))
        else {
            continue;
        };
        let (Value::Int(start), Value::Int(end)) = (start, end) else {
            continue;
        };
        let (Some(Value::BulkString(host)), Some(Value::Int(port))) =
            (primary.first(), primary.get(1))
        else {
            continue;
        };
        let (Ok(start), Ok(end), Ok(port)) = (
            u16::try_from(*start),
            u16::try_from(*end),
            u16::try_from(*port),
        ) else {
            continue;
        };
        let host = String::from_utf8_lossy(host).into_owned();
        map.push((start, end, (host, port)));
    }
    map.sort_by_key(|r| r.0);
    Ok(map)
}

/// Whether a failed pipeline certainly never reached the server: the
/// socket was closed before it was written (broken pipe), or there was no
/// connection. A reset or an end of stream may come after the server read
/// it.
fn never_sent(e: &RedisError) -> bool {
    // redis 1.8 keeps the io::Error's kind private (its Display is the
    // kind's own text).
    e.is_connection_refusal()
        || (e.kind() == ::redis::ErrorKind::Io
            && matches!(e.to_string().as_str(), "broken pipe" | "not connected"))
}

/// What a command's reply says of where it goes next.
fn next_step(value: &Value) -> Next {
    let Value::ServerError(e) = value else {
        return Next::Done;
    };
    match e.kind() {
        Some(ServerErrorKind::Moved) => Next::Moved,
        Some(ServerErrorKind::Ask) => {
            let e: RedisError = e.clone().into();
            match e.redirect_node().and_then(|(addr, _)| parse_addr(addr)) {
                Some(to) => Next::Ask(to),
                None => Next::Moved,
            }
        }
        Some(
            ServerErrorKind::TryAgain
            | ServerErrorKind::ClusterDown
            | ServerErrorKind::MasterDown
            | ServerErrorKind::ReadOnly
            | ServerErrorKind::BusyLoading,
        ) => Next::Pause,
        _ => Next::Done,
    }
}

fn parse_addr(addr: &str) -> Option<(String, u16)> {
    let (host, port) = addr.rsplit_once(':')?;
    Some((host.to_owned(), port.parse().ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_follow_the_cluster_spec() {
        // Values from CLUSTER KEYSLOT.
        assert_eq!(slot_of(b"foo"), 12182);
        assert_eq!(slot_of(b"123456789"), 12739);
        assert_eq!(slot_of(b"plaza:room:{lobby}"), slot_of(b"lobby"));
        assert_eq!(slot_of(b"{lobby}"), 10294);
        // An empty tag is no tag.
        assert_eq!(
            slot_of(b"a{}b"),
            crc16::State::<crc16::XMODEM>::calculate(b"a{}b") % SLOTS
        );
    }
}
