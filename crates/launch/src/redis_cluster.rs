//! A Redis Cluster on loopback — N primaries with a replica each — formed without redis-cli;
//! and the two events a cluster client must live through: a failover and a live resharding.

use std::io;
use std::net::{IpAddr, SocketAddr};
use std::ops::RangeInclusive;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use ::redis::{cmd, FromRedisValue, Value};

use crate::proc::READY_TIMEOUT;
use crate::redis::query;
use crate::RedisProcess;

/// Hash slots in a Redis Cluster: a key's slot is [`slot_of`] it, in `0..CLUSTER_SLOTS`.
pub const CLUSTER_SLOTS: u16 = 16384;
/// The fewest primaries [`RedisCluster::start`] accepts: a failover needs the votes of a
/// majority of primaries, which one or two cannot give once one of them is gone.
pub const MIN_PRIMARIES: usize = 3;
/// The most primaries [`RedisCluster::start`] accepts (each with a replica: 32 servers).
pub const MAX_PRIMARIES: usize = 16;
/// `cluster-node-timeout`: a node silent this long is suspected down, and failed over once a
/// majority of primaries agree. Short, for development and tests on one machine (Redis's
/// default is 15 s).
pub const NODE_TIMEOUT_MS: u64 = 1000;
/// How long [`RedisCluster::kill_primary`] waits for the failover to be seen everywhere.
pub const FAILOVER_TIMEOUT: Duration = Duration::from_secs(15);
/// How often waits ask the servers again: a cluster gives no event when it changes.
const POLL: Duration = Duration::from_millis(50);
/// Keys per `CLUSTER GETKEYSINSLOT` and `MIGRATE` while resharding.
const MIGRATE_BATCH: usize = 100;
/// `MIGRATE`'s timeout, in milliseconds, for one batch.
const MIGRATE_TIMEOUT_MS: u64 = 5000;

/// The hash slot of `key` (as `CLUSTER KEYSLOT`): CRC16-XMODEM of the key, or of its hash tag
/// — what lies between the first `{` and the next `}` if that is not empty — modulo
/// [`CLUSTER_SLOTS`]. Keys sharing a tag share a slot, so one command may use them together.
pub fn slot_of(key: impl AsRef<[u8]>) -> u16 {
    let key = key.as_ref();
    let tag = key.iter().position(|&b| b == b'{').and_then(|open| {
        let rest = &key[open + 1..];
        let len = rest.iter().position(|&b| b == b'}')?;
        (len > 0).then(|| &rest[..len])
    });
    crc16_xmodem(tag.unwrap_or(key)) % CLUSTER_SLOTS
}

/// CRC16 with polynomial 0x1021, initial value 0, no reflection (the Redis Cluster spec's).
fn crc16_xmodem(data: &[u8]) -> u16 {
    let mut crc = 0u16;
    for &b in data {
        crc ^= u16::from(b) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc
}

/// A Redis Cluster on 127.0.0.1: `N` primaries splitting the slots evenly, each with one
/// replica, every server killed (SIGKILL) when dropped.
///
/// Roles change: after [`kill_primary`](Self::kill_primary) a replica serves the slots, and
/// after [`migrate_slot`](Self::migrate_slot) another primary serves that slot; ask
/// [`primary_of`](Self::primary_of) rather than counting on the start order.
pub struct RedisCluster {
    /// Primaries first, then the replica of each in the same order.
    servers: Vec<RedisProcess>,
    primaries: usize,
    dir: PathBuf,
}

/// A slot between [`RedisCluster::begin_migration`] and
/// [`finish_migration`](RedisCluster::finish_migration): its source answers `ASK` for the keys
/// it no longer has, its target serves them to clients that say `ASKING`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Migration {
    slot: u16,
    from: SocketAddr,
    to: SocketAddr,
    to_id: String,
}

impl Migration {
    /// The slot that moves.
    pub fn slot(&self) -> u16 {
        self.slot
    }

    /// The primary it moves from (which still owns it).
    pub fn from(&self) -> SocketAddr {
        self.from
    }

    /// The primary it moves to.
    pub fn to(&self) -> SocketAddr {
        self.to
    }
}

impl RedisCluster {
    /// Starts `primaries` primaries (`dir/redis-1` …) and as many replicas (the next
    /// directories, `redis-{primaries + i}` replicating `redis-i`), assigns the slots, makes
    /// the servers meet, and waits until every server sees the whole cluster with its roles and
    /// `cluster_state:ok`, and every replica's link to its primary is up.
    ///
    /// `primaries` must be in [`MIN_PRIMARIES`]`..=`[`MAX_PRIMARIES`].
    pub fn start(dir: &Path, primaries: usize) -> io::Result<RedisCluster> {
        if !(MIN_PRIMARIES..=MAX_PRIMARIES).contains(&primaries) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "a Redis Cluster takes {MIN_PRIMARIES} to {MAX_PRIMARIES} primaries \
                     (failover needs a majority of at least 3), not {primaries}"
                ),
            ));
        }
        std::fs::create_dir_all(dir)?;
        let dir = dir.canonicalize()?;
        let mut servers = Vec::with_capacity(2 * primaries);
        for i in 0..2 * primaries {
            servers.push(start_node(&dir.join(format!("redis-{}", i + 1)))?);
        }
        let mut cluster = RedisCluster {
            servers,
            primaries,
            dir,
        };
        cluster.form()?;
        Ok(cluster)
    }

    /// Slots, meetings, replicas, as redis-cli's `--cluster create` does them.
    fn form(&mut self) -> io::Result<()> {
        let n = self.primaries;
        let addrs = self.addrs();
        let mut ids = Vec::with_capacity(addrs.len());
        for (i, &addr) in addrs.iter().enumerate() {
            if let Some(slots) = initial_slots(i, n) {
                run(
                    addr,
                    cmd("CLUSTER")
                        .arg("ADDSLOTSRANGE")
                        .arg(slots.start())
                        .arg(slots.end()),
                )?;
            }
            // Distinct epochs from the start: otherwise the nodes first resolve the collision
            // of all having epoch 0, one bump at a time.
            run(addr, cmd("CLUSTER").arg("SET-CONFIG-EPOCH").arg(i + 1))?;
            ids.push(query::<String>(addr, cmd("CLUSTER").arg("MYID")).map_err(io::Error::other)?);
        }
        for &addr in &addrs[1..] {
            // Gossip tells the others about each other; the bus port is not port + 10000.
            let bus = bus_port(addr)?;
            run(
                addrs[0],
                cmd("CLUSTER")
                    .arg("MEET")
                    .arg(addr.ip().to_string())
                    .arg(addr.port())
                    .arg(bus),
            )?;
        }
        self.wait("know each other", READY_TIMEOUT, || {
            for &addr in &addrs {
                let known = nodes(addr)?;
                for id in &ids {
                    let node = known.iter().find(|k| &k.id == id);
                    match node {
                        Some(k) if !k.has("handshake") && !k.has("noaddr") => {}
                        _ => return Err(format!("{addr} does not know node {id} yet")),
                    }
                }
            }
            Ok(())
        })?;
        for i in 0..n {
            run(addrs[n + i], cmd("CLUSTER").arg("REPLICATE").arg(&ids[i]))?;
        }
        self.wait("agree on roles, cluster_state:ok", READY_TIMEOUT, || {
            for &addr in &addrs {
                let known = nodes(addr)?;
                for i in 0..n {
                    let replica = known.iter().find(|k| k.id == ids[n + i]);
                    if replica.and_then(|r| r.primary_id.as_ref()) != Some(&ids[i]) {
                        return Err(format!("{addr} does not see replica {} yet", addrs[n + i]));
                    }
                }
                cluster_state_ok(addr)?;
            }
            for &addr in &addrs[n..] {
                let info: String = query(addr, cmd("INFO").arg("replication"))?;
                if !info.contains("master_link_status:up") {
                    return Err(format!("replica {addr}: link to its primary not up"));
                }
            }
            Ok(())
        })
    }

    /// `redis+cluster://127.0.0.1:P1,127.0.0.1:P2,…` listing every server (primaries and
    /// replicas, dead or alive), for `plaza serve --redis`: a client needs only one to answer
    /// to learn the rest.
    pub fn seed_url(&self) -> String {
        let addrs: Vec<String> = self.addrs().iter().map(SocketAddr::to_string).collect();
        format!("redis+cluster://{}", addrs.join(","))
    }

    /// The servers: the [`primaries`](Self::primaries) started as primaries first (server `i`
    /// with the `i`-th even share of the slots), then server `primaries + i` started as the
    /// replica of server `i`.
    pub fn servers(&self) -> &[RedisProcess] {
        &self.servers
    }

    /// The servers, to kill or restart one (a restarted server keeps its port, bus port and
    /// `nodes.conf`, so Redis has it rejoin the cluster).
    pub fn servers_mut(&mut self) -> &mut [RedisProcess] {
        &mut self.servers
    }

    /// How many primaries it started with.
    pub fn primaries(&self) -> usize {
        self.primaries
    }

    /// The directory holding each server's directory (`redis-1`, …).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Every server's address, in [`servers`](Self::servers) order.
    pub fn addrs(&self) -> Vec<SocketAddr> {
        self.servers.iter().map(RedisProcess::addr).collect()
    }

    /// The process ids of the servers that have not exited.
    pub fn pids(&self) -> Vec<u32> {
        self.servers.iter().filter_map(RedisProcess::pid).collect()
    }

    /// The slots server `i` of [`servers`](Self::servers) was given at start (`None` for a
    /// replica).
    pub fn initial_slots(&self, i: usize) -> Option<RangeInclusive<u16>> {
        initial_slots(i, self.primaries)
    }

    /// The address of the primary serving `slot`, as the first live server that answers says
    /// (`CLUSTER SLOTS`).
    pub fn primary_of(&self, slot: u16) -> io::Result<SocketAddr> {
        check_slot(slot)?;
        let mut last = String::from("no live server");
        for addr in self.live_addrs() {
            match slot_map(addr) {
                Ok(map) => return owner(&map, slot).map_err(io::Error::other),
                Err(e) => last = e,
            }
        }
        Err(io::Error::other(format!(
            "no server answers CLUSTER SLOTS: {last}"
        )))
    }

    /// The primaries serving slots now (one per slot range, in slot order, deduplicated), as
    /// the first live server that answers says.
    pub fn primary_addrs(&self) -> io::Result<Vec<SocketAddr>> {
        let mut last = String::from("no live server");
        for addr in self.live_addrs() {
            match slot_map(addr) {
                Ok(map) => {
                    let mut primaries: Vec<SocketAddr> = Vec::new();
                    for (_, p) in map {
                        if !primaries.contains(&p) {
                            primaries.push(p);
                        }
                    }
                    return Ok(primaries);
                }
                Err(e) => last = e,
            }
        }
        Err(io::Error::other(format!(
            "no server answers CLUSTER SLOTS: {last}"
        )))
    }

    /// The replicas of the primary at `primary`, as `CLUSTER NODES` at that primary lists them.
    pub fn replicas_of(&self, primary: SocketAddr) -> io::Result<Vec<SocketAddr>> {
        let known = nodes(primary).map_err(io::Error::other)?;
        let id = known
            .iter()
            .find(|k| k.has("myself"))
            .map(|k| k.id.clone())
            .ok_or_else(|| io::Error::other(format!("{primary} does not name itself")))?;
        Ok(known
            .iter()
            .filter(|k| k.primary_id.as_deref() == Some(id.as_str()))
            .filter_map(|k| k.addr)
            .collect())
    }

    /// Pauses (SIGSTOP) the server at `addr`: it hangs with its connections open. While a
    /// primary and all its replicas are paused, no failover can happen, and its slots stay
    /// unserved until [`resume`](Self::resume).
    pub fn pause(&mut self, addr: SocketAddr) -> io::Result<()> {
        let i = self.index_of(addr)?;
        self.servers[i].pause()
    }

    /// Resumes (SIGCONT) a server [`pause`](Self::pause)d.
    pub fn resume(&mut self, addr: SocketAddr) -> io::Result<()> {
        let i = self.index_of(addr)?;
        self.servers[i].resume()
    }

    /// SIGKILLs the primary serving `slot` and waits (up to [`FAILOVER_TIMEOUT`]) until every
    /// surviving server names the same other server as its primary and reports
    /// `cluster_state:ok`; returns that new primary's address.
    pub fn kill_primary(&mut self, slot: u16) -> io::Result<SocketAddr> {
        let old = self.primary_of(slot)?;
        let i = self.index_of(old)?;
        self.servers[i].kill()?;
        let survivors = self.live_addrs();
        self.wait(
            &format!("fail slot {slot} over from {old}"),
            FAILOVER_TIMEOUT,
            || {
                let mut new = None;
                for &addr in &survivors {
                    let named = owner(&slot_map(addr)?, slot)?;
                    if named == old {
                        return Err(format!("{addr} still names {old} for slot {slot}"));
                    }
                    if *new.get_or_insert(named) != named {
                        return Err(format!("survivors disagree on slot {slot}'s primary"));
                    }
                    cluster_state_ok(addr)?;
                }
                new.ok_or_else(|| "no survivor".to_owned())
            },
        )
    }

    /// Moves `slot` with its keys to the primary at `to`, live (clients reading and writing
    /// keys of the slot meanwhile are redirected with `ASK`, then `MOVED`), and waits until
    /// every live server names `to` for it; returns how many keys were sent over. A slot
    /// served by `to` already is refused.
    pub fn migrate_slot(&mut self, slot: u16, to: SocketAddr) -> io::Result<usize> {
        let m = self.begin_migration(slot, to)?;
        self.finish_migration(m)
    }

    /// The first half of [`migrate_slot`](Self::migrate_slot): marks `slot` as importing on
    /// `to` and migrating on its primary, moving no key yet, so that a test can hold it in
    /// that state.
    pub fn begin_migration(&self, slot: u16, to: SocketAddr) -> io::Result<Migration> {
        let from = self.primary_of(slot)?;
        if from == to {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("slot {slot} is served by {to} already"),
            ));
        }
        let id = |addr| query::<String>(addr, cmd("CLUSTER").arg("MYID"));
        let (from_id, to_id) = (id(from), id(to));
        let (from_id, to_id) = (
            from_id.map_err(io::Error::other)?,
            to_id.map_err(io::Error::other)?,
        );
        // The target first: when the source starts answering ASK, the target accepts ASKING.
        run(
            to,
            cmd("CLUSTER")
                .arg("SETSLOT")
                .arg(slot)
                .arg("IMPORTING")
                .arg(&from_id),
        )?;
        run(
            from,
            cmd("CLUSTER")
                .arg("SETSLOT")
                .arg(slot)
                .arg("MIGRATING")
                .arg(&to_id),
        )?;
        Ok(Migration {
            slot,
            from,
            to,
            to_id,
        })
    }

    /// Sends `keys` (of the migrating slot) to the target in one `MIGRATE`, as a resharding
    /// tool does batch after batch, and leaves the slot migrating: until
    /// [`finish_migration`](Self::finish_migration), the source answers `ASK` for them, so
    /// clients reach them at the target with `ASKING`. Keys that do not exist are skipped.
    pub fn migrate_keys(&self, m: &Migration, keys: &[String]) -> io::Result<()> {
        run(
            m.from,
            cmd("MIGRATE")
                .arg(m.to.ip().to_string())
                .arg(m.to.port())
                .arg("")
                .arg(0)
                .arg(MIGRATE_TIMEOUT_MS)
                .arg("KEYS")
                .arg(keys),
        )
    }

    /// The second half of [`migrate_slot`](Self::migrate_slot): sends the keys over in batches
    /// until the source has none left, assigns the slot to the target (on the target, the
    /// source, then every other primary), and waits until every live server names the target;
    /// returns how many keys were sent. On an error the slot stays where the steps left it
    /// (migrating, or owned by the target on some servers only).
    pub fn finish_migration(&mut self, m: Migration) -> io::Result<usize> {
        let Migration {
            slot,
            from,
            to,
            to_id,
        } = m;
        let mut moved = 0;
        loop {
            let keys: Vec<Vec<u8>> = query(
                from,
                cmd("CLUSTER")
                    .arg("GETKEYSINSLOT")
                    .arg(slot)
                    .arg(MIGRATE_BATCH),
            )
            .map_err(io::Error::other)?;
            if keys.is_empty() {
                break;
            }
            // A key deleted meanwhile is skipped by MIGRATE (NOKEY when all are); the count
            // is of the keys asked for. New keys of the slot go to the target (ASK), so the
            // loop ends.
            run(
                from,
                cmd("MIGRATE")
                    .arg(to.ip().to_string())
                    .arg(to.port())
                    .arg("")
                    .arg(0)
                    .arg(MIGRATE_TIMEOUT_MS)
                    .arg("KEYS")
                    .arg(&keys),
            )?;
            moved += keys.len();
        }
        let set_node = |addr| {
            run(
                addr,
                cmd("CLUSTER")
                    .arg("SETSLOT")
                    .arg(slot)
                    .arg("NODE")
                    .arg(&to_id),
            )
        };
        // The target first: once the source lets go, clients are sent there with MOVED, and
        // it must then serve them without ASKING.
        set_node(to)?;
        set_node(from)?;
        let others: Vec<SocketAddr> = nodes(to)
            .map_err(io::Error::other)?
            .into_iter()
            .filter(|k| k.has("master") && !k.has("fail"))
            .filter_map(|k| k.addr)
            .filter(|a| *a != to && *a != from)
            .collect();
        for addr in others {
            set_node(addr)?;
        }
        // The replicas learn it by gossip.
        let live = self.live_addrs();
        self.wait(
            &format!("agree that slot {slot} moved to {to}"),
            FAILOVER_TIMEOUT,
            || {
                for &addr in &live {
                    let named = owner(&slot_map(addr)?, slot)?;
                    if named != to {
                        return Err(format!("{addr} names {named} for slot {slot}"));
                    }
                }
                Ok(())
            },
        )?;
        Ok(moved)
    }

    /// Stops every server (SIGTERM, waited for); the first error.
    pub fn stop(&mut self) -> io::Result<()> {
        let mut first_err = None;
        for r in &mut self.servers {
            if let Err(e) = r.stop() {
                first_err.get_or_insert(e);
            }
        }
        first_err.map_or(Ok(()), Err)
    }

    /// The servers not reaped yet (not killed nor stopped through this handle).
    fn live_addrs(&self) -> Vec<SocketAddr> {
        self.servers
            .iter()
            .filter(|s| s.pid().is_some())
            .map(RedisProcess::addr)
            .collect()
    }

    fn index_of(&self, addr: SocketAddr) -> io::Result<usize> {
        self.servers
            .iter()
            .position(|s| s.addr() == addr)
            .ok_or_else(|| io::Error::other(format!("{addr} is not a server of this cluster")))
    }

    /// Polls `probe` every [`POLL`] until it answers `Ok`, a server exits unbidden, or
    /// `timeout` passes; `probe` describes what it saw last, quoted on timeout.
    fn wait<T>(
        &mut self,
        what: &str,
        timeout: Duration,
        mut probe: impl FnMut() -> Result<T, String>,
    ) -> io::Result<T> {
        let deadline = Instant::now() + timeout;
        loop {
            let last = match probe() {
                Ok(v) => return Ok(v),
                Err(e) => e,
            };
            for s in &mut self.servers {
                s.check_running(&format!("the cluster should {what}"))?;
            }
            if Instant::now() >= deadline {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!(
                        "the Redis Cluster in {} did not {what} within {:.1}s (last: {last})",
                        self.dir.display(),
                        timeout.as_secs_f64()
                    ),
                ));
            }
            std::thread::sleep(POLL);
        }
    }
}

/// Starts one cluster-enabled server in `dir`, its bus on a free port of its own.
fn start_node(dir: &Path) -> io::Result<RedisProcess> {
    std::fs::create_dir_all(dir)?;
    let dir = dir.canonicalize()?;
    let nodes_conf = dir.join("nodes.conf");
    RedisProcess::start_with_args_per_attempt(&dir, |_port| {
        // Not port + 10000, Redis's default: past 55535 that does not exist.
        let bus = crate::free_port()?;
        let args = [
            "--cluster-enabled",
            "yes",
            "--cluster-config-file",
            &nodes_conf.to_string_lossy(),
            "--cluster-port",
            &bus.to_string(),
            "--cluster-node-timeout",
            &NODE_TIMEOUT_MS.to_string(),
            // Otherwise a node learns its own address only from the packets of others.
            "--cluster-announce-ip",
            "127.0.0.1",
            // A shard without a primary (killed, not failed over yet) leaves the others
            // serving their slots: one shard's failover must not stop every room.
            "--cluster-require-full-coverage",
            "no",
            // A replica syncs (and a new one after a failover) as soon as it asks.
            "--repl-diskless-sync-delay",
            "0",
        ];
        Ok(args.map(str::to_owned).to_vec())
    })
}

/// Primary `i`'s even share of the slots (the last takes the rest); `None` for `i >= n`.
fn initial_slots(i: usize, n: usize) -> Option<RangeInclusive<u16>> {
    let total = usize::from(CLUSTER_SLOTS);
    (i < n).then(|| {
        // Below 16384: fits.
        let first = (i * total / n) as u16;
        let last = ((i + 1) * total / n - 1) as u16;
        first..=last
    })
}

fn check_slot(slot: u16) -> io::Result<()> {
    match slot < CLUSTER_SLOTS {
        true => Ok(()),
        false => Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("slot {slot} is not below {CLUSTER_SLOTS}"),
        )),
    }
}

/// A command whose reply does not matter, only its success; an error quotes the command.
fn run(addr: SocketAddr, cmd: &::redis::Cmd) -> io::Result<()> {
    query::<Value>(addr, cmd).map(drop).map_err(|e| {
        let words: Vec<String> = cmd
            .args_iter()
            .map(|a| match a {
                ::redis::Arg::Simple(bytes) => String::from_utf8_lossy(bytes).into_owned(),
                _ => "?".to_owned(),
            })
            .collect();
        io::Error::other(format!("{}: {e}", words.join(" ")))
    })
}

/// The server's cluster bus port (`cluster-port`).
fn bus_port(addr: SocketAddr) -> io::Result<u16> {
    let (_, port): (String, u16) =
        query(addr, cmd("CONFIG").arg("GET").arg("cluster-port")).map_err(io::Error::other)?;
    Ok(port)
}

fn cluster_state_ok(addr: SocketAddr) -> Result<(), String> {
    let info: String = query(addr, cmd("CLUSTER").arg("INFO"))?;
    match info.contains("cluster_state:ok") {
        true => Ok(()),
        false => Err(format!("{addr}: cluster_state not ok")),
    }
}

/// The slot ranges and their primaries as `CLUSTER SLOTS` at `addr` answers.
fn slot_map(addr: SocketAddr) -> Result<Vec<(RangeInclusive<u16>, SocketAddr)>, String> {
    let ranges: Vec<Value> = query(addr, cmd("CLUSTER").arg("SLOTS"))?;
    let bad = |what: &str| format!("{addr}: CLUSTER SLOTS: {what}");
    let mut map = Vec::with_capacity(ranges.len());
    for range in ranges {
        // [first, last, [ip, port, id, …], replicas…]
        let Value::Array(items) = range else {
            return Err(bad("a range is not an array"));
        };
        let [first, last, Value::Array(primary), ..] = items.as_slice() else {
            return Err(bad("a range without a primary"));
        };
        let [ip, port, ..] = primary.as_slice() else {
            return Err(bad("a primary without an address"));
        };
        let parse = || -> Result<_, ::redis::ParsingError> {
            Ok((
                u16::from_redis_value_ref(first)?,
                u16::from_redis_value_ref(last)?,
                String::from_redis_value_ref(ip)?,
                u16::from_redis_value_ref(port)?,
            ))
        };
        let (first, last, ip, port) = parse().map_err(|e| bad(&e.to_string()))?;
        let ip: IpAddr = ip.parse().map_err(|_| bad(&format!("address {ip:?}")))?;
        map.push((first..=last, SocketAddr::new(ip, port)));
    }
    Ok(map)
}

fn owner(map: &[(RangeInclusive<u16>, SocketAddr)], slot: u16) -> Result<SocketAddr, String> {
    map.iter()
        .find(|(range, _)| range.contains(&slot))
        .map(|(_, primary)| *primary)
        .ok_or_else(|| format!("no primary serves slot {slot}"))
}

/// One line of `CLUSTER NODES`: `<id> <ip:port@bus[,host]> <flags> <primary id or -> …`.
struct Known {
    id: String,
    addr: Option<SocketAddr>,
    flags: Vec<String>,
    primary_id: Option<String>,
}

impl Known {
    fn has(&self, flag: &str) -> bool {
        self.flags.iter().any(|f| f == flag)
    }
}

/// The nodes the server at `addr` knows, itself included (`CLUSTER NODES`).
fn nodes(addr: SocketAddr) -> Result<Vec<Known>, String> {
    let text: String = query(addr, cmd("CLUSTER").arg("NODES"))?;
    let mut known = Vec::new();
    for line in text.lines().filter(|l| !l.is_empty()) {
        let fields: Vec<&str> = line.split(' ').collect();
        let [id, node_addr, flags, primary, ..] = fields.as_slice() else {
            return Err(format!("{addr}: CLUSTER NODES line {line:?}"));
        };
        let ip_port = node_addr.split(['@', ',']).next().unwrap_or_default();
        known.push(Known {
            id: (*id).to_owned(),
            // ":0" while a node's address is unknown.
            addr: ip_port.parse().ok(),
            flags: flags.split(',').map(str::to_owned).collect(),
            primary_id: (*primary != "-").then(|| (*primary).to_owned()),
        });
    }
    Ok(known)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_follow_the_cluster_spec() {
        // The spec's CRC16 check value, and values CLUSTER KEYSLOT gives.
        assert_eq!(crc16_xmodem(b"123456789"), 0x31C3);
        assert_eq!(slot_of("123456789"), 12739);
        assert_eq!(slot_of("foo"), 12182);
        assert_eq!(slot_of("bar"), 5061);
        assert_eq!(slot_of(""), 0);
        // A hash tag: only what is between the first { and the next }.
        assert_eq!(
            slot_of("{user1000}.following"),
            slot_of("{user1000}.followers")
        );
        assert_eq!(slot_of("{user1000}.following"), slot_of("user1000"));
        assert_eq!(slot_of("foo{bar}{zap}"), slot_of("bar"));
        assert_eq!(slot_of("foo{{bar}}zap"), slot_of("{bar"));
        // An empty tag is no tag: the whole key is hashed.
        assert_eq!(
            slot_of("foo{}{bar}"),
            crc16_xmodem(b"foo{}{bar}") % CLUSTER_SLOTS
        );
        assert_ne!(slot_of("foo{}{bar}"), slot_of("bar"));
        assert_eq!(slot_of("foo{bar"), slot_of("foo{bar".as_bytes()));
    }

    #[test]
    fn initial_slots_cover_every_slot_once() {
        for n in MIN_PRIMARIES..=MAX_PRIMARIES {
            let mut next = 0usize;
            for i in 0..n {
                let r = initial_slots(i, n).unwrap();
                assert_eq!(usize::from(*r.start()), next, "{n} primaries, primary {i}");
                assert!(r.end() >= r.start());
                next = usize::from(*r.end()) + 1;
            }
            assert_eq!(next, usize::from(CLUSTER_SLOTS));
            assert_eq!(initial_slots(n, n), None);
        }
    }
}
