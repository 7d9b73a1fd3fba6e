//! The append task's own routing on a Redis Cluster: a connection to each
//! primary and the map of which primary serves which slot, so that a batch
//! goes as one pipeline per primary.
//!
//! The redis crate's cluster connection sends each call on its own, and
//! retries or fails a whole pipeline when one of its commands is
//! redirected, which would run the others twice. Here each command's answer
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
use std::time::Duration;

use ::redis::aio::MultiplexedConnection;
use ::redis::cluster_async::ClusterConnection;
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

/// Connections to a Redis Cluster's primaries, and its slot map.
pub(super) struct Shards {
    /// Asked for the slot map (any server answers).
    cluster: ClusterConnection,
    /// Credentials and TCP settings for every primary.
    template: ConnectionInfo,
    settings: AsyncConnectionConfig,
    timeout: Duration,
    /// The primary of each slot range, by the range's first slot.
    map: Vec<(u16, u16, (String, u16))>,
    conns: HashMap<(String, u16), MultiplexedConnection>,
    /// Loaded on every connection opened.
    scripts: Vec<&'static ::redis::Script>,
}

/// Where a command goes next, and whether it was told to wait.
enum Next {
    Done,
    Ask((String, u16)),
    Moved,
    Pause,
}

impl Shards {
    /// Reads the slot map through `cluster`; connections to the primaries
    /// are opened when first needed, with `scripts` loaded.
    pub(super) async fn new(
        cluster: ClusterConnection,
        template: ConnectionInfo,
        config: &RedisConfig,
        scripts: Vec<&'static ::redis::Script>,
    ) -> Result<Self, ClusterError> {
        let mut shards = Self {
            cluster,
            template,
            settings: super::connect::plain_config(config),
            timeout: config.timeout,
            map: Vec::new(),
            conns: HashMap::new(),
            scripts,
        };
        shards.refresh().await?;
        Ok(shards)
    }

    /// Reads the slot map again (`CLUSTER SLOTS`).
    async fn refresh(&mut self) -> Result<(), ClusterError> {
        let mut slots = ::redis::cmd("CLUSTER");
        slots.arg("SLOTS");
        let reply: Value = guarded(self.timeout, slots.query_async(&mut self.cluster)).await?;
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
        self.map = map;
        Ok(())
    }

    fn primary_of(&self, slot: u16) -> Option<(String, u16)> {
        let at = self.map.partition_point(|r| r.0 <= slot).checked_sub(1)?;
        let (_, end, addr) = &self.map[at];
        (slot <= *end).then(|| addr.clone())
    }

    /// The connection to `addr`, opened (with the scripts loaded) if there
    /// is none. `Err` means nothing was sent.
    async fn conn(&mut self, addr: &(String, u16)) -> Result<MultiplexedConnection, RedisError> {
        if let Some(conn) = self.conns.get(addr) {
            return Ok(conn.clone());
        }
        let info = self
            .template
            .clone()
            .set_addr(ConnectionAddr::Tcp(addr.0.clone(), addr.1));
        let client = Client::open(info)?;
        let mut conn = client
            .get_multiplexed_async_connection_with_config(&self.settings)
            .await?;
        for script in &self.scripts {
            script.load_async(&mut conn).await?;
        }
        self.conns.insert(addr.clone(), conn.clone());
        Ok(conn)
    }

    /// Forgets every connection: the next batch opens them again, loading
    /// the scripts (after someone flushed them).
    pub(super) fn reset(&mut self) {
        self.conns.clear();
    }

    /// Sends every command to its slot's primary, each primary's share as
    /// one pipeline (ended by `trailer`, if any), all at once; commands that
    /// did not run are sent again where they now belong until the call
    /// timeout. Answers are in the order of `cmds`, each with the primary
    /// that answered `ASK` if it was sent on to the importing one: that
    /// primary still serves the slot's shard channels, so what the command
    /// published there reached no subscriber (see [`Self::publish_at`]).
    pub(super) async fn send(
        &mut self,
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
            for (addr, items) in by_primary {
                match self.conn(&addr).await {
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
                        self.conns.remove(&addr);
                        refresh = true;
                        pause = true;
                        todo.extend(items.into_iter().map(|(i, _)| (i, None)));
                        continue;
                    }
                    failed => {
                        // They may have run: fail them, and connect anew.
                        self.conns.remove(&addr);
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
                if let Err(e) = self.refresh().await {
                    tracing::debug!("reading the redis cluster's slot map failed: {e}");
                }
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
    pub(super) async fn publish_at(&mut self, at: &Addr, channel: &str, messages: Vec<Vec<u8>>) {
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
