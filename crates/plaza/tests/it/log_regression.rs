//! The log going back (close code 4005) on a real Redis failover, on Sentinel and on a Redis
//! Cluster, with real `plaza serve` nodes and WebSocket clients.
//!
//! With `--broker-ack primary` a primary acknowledges entries its replicas may not have. The
//! test makes that happen for certain: each replica of the room's primary is cut off from it
//! (a wrong `masterauth`, and its replication link killed, so that its reconnects fail), the
//! members publish entries that are acknowledged and delivered, the replicas' logs are checked
//! to lack them, the primary is SIGKILLed and a replica promoted. The new primary's log then
//! ends before the members' last seq, and new entries take the lost ones' positions.
//!
//! What must follow, in a room that goes on after the failover and in one where nobody
//! publishes again: every member that saw the lost entries is closed with 4005; it joins
//! again without `resume` and gets the new history (the snapshot without what was lost, the
//! messages from before the cut, none of the lost ones); each node counts the regression in
//! `plaza_log_regressions_total`; and nothing acknowledged after it is lost.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use futures_util::SinkExt;
use serde_json::{json, Value};
use tokio_tungstenite::tungstenite::Message;

use crate::cluster_support::{
    count_id, log_entries, start_cluster, start_on_redis_cluster, ws_url, Ws, LIMIT,
};
use crate::redis_cluster::neighbour_of;
use crate::sentinel::{kill_primary, promoted};
use futures_util::StreamExt;
use plaza_launch::{http_get, slot_of, LbKind, LocalCluster};

/// Close code: the room's history was rewritten.
const HISTORY_REWRITTEN: u16 = 4005;
/// Messages each member publishes in each phase.
const EACH: usize = 3;
/// What a replica cut off from its primary is told to authenticate with: the primary has no
/// password, so every reconnect is refused and the link stays down.
const WRONG_MASTERAUTH: &str = "plaza-test-cut-off";

/// Which Redis setup fails over.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Setup {
    Sentinel,
    RedisCluster,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sentinel_failover_that_loses_delivered_entries_closes_their_members_with_4005() {
    let (cluster, _dir) = start_cluster(
        "regress-sentinel",
        2,
        LbKind::Nginx,
        &["--broker-ack", "primary"],
        true,
    );
    lose_delivered_entries(cluster, Setup::Sentinel).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_cluster_failover_that_loses_delivered_entries_closes_their_members_with_4005() {
    let (cluster, _dir) =
        start_on_redis_cluster("regress-cluster", 2, &["--broker-ack", "primary"], 3);
    lose_delivered_entries(cluster, Setup::RedisCluster).await;
}

async fn lose_delivered_entries(mut cluster: LocalCluster, setup: Setup) {
    // Two rooms on the same primary: one that goes on after the failover, one where nobody
    // publishes again.
    let mut busy = Pair::start(&cluster, "rewound").await;
    let mut idle = Pair::start(&cluster, &neighbour_of("rewound")).await;
    assert_eq!(regressions(&cluster), [0, 0]);

    let primary = primary_of(&cluster, setup, &busy.room);
    assert_eq!(primary, primary_of(&cluster, setup, &idle.room));
    let replicas = replicas_of(primary);
    assert!(!replicas.is_empty(), "{primary} has no replica");
    cut_off(primary, &replicas, setup).await;

    for pair in [&mut busy, &mut idle] {
        pair.lose().await;
        for &r in &replicas {
            pair.check_lacks_lost(r, setup);
        }
    }
    let seen = busy.a.last_seq.min(busy.b.last_seq);
    let offset = |addr, field: &str| -> u64 { replication(addr)[field].parse().unwrap() };
    let primary_offset = offset(primary, "master_repl_offset");
    for &r in &replicas {
        let replica_offset = offset(r, "slave_repl_offset");
        assert!(
            replica_offset < primary_offset,
            "replica {r} at offset {replica_offset}, its primary at {primary_offset}"
        );
    }

    let new = fail_over(&mut cluster, setup, &busy.room, primary, &replicas).await;
    assert!(
        replicas.contains(&new),
        "{new} was promoted, not a replica of {primary}"
    );

    // Nobody publishes in the idle room: each node tells from the promoted primary's log,
    // which ends before the last entry it applied, when it subscribes there.
    for m in [&mut idle.a, &mut idle.b] {
        let code = m.until_closed().await;
        assert_eq!(code, HISTORY_REWRITTEN, "{}'s close code", m.name);
    }
    // A publishes again in the busy room, until closed: its node tells on subscribing again
    // too, or else from the entries that take lost positions. Whether the publishes answered
    // by the close landed is unknown; any acknowledged is checked at the end like the others.
    let acked_after = busy.a.publish_until_closed("after-a").await;
    let code = busy.b.until_closed().await;
    assert_eq!(busy.a.closed, Some(HISTORY_REWRITTEN), "a's close code");
    assert_eq!(code, HISTORY_REWRITTEN, "b's close code");
    assert_eq!(
        regressions(&cluster),
        [2, 2],
        "each node counts each room's regression once"
    );

    for (pair, mut acked) in [(&mut busy, acked_after), (&mut idle, BTreeMap::new())] {
        pair.rejoin().await;
        acked.extend(pair.after().await);
        pair.check_after(&acked, new).await;
    }
    assert_eq!(regressions(&cluster), [2, 2], "no further regression");
    println!(
        "{setup:?}: {primary} killed with {} acknowledged entries of each room on no replica \
         (seq up to {seen}), {new} promoted; new history at seq {} after the rejoin",
        busy.lost.len() + 1,
        busy.a.joined["seq"]
    );
}

/// Two members of one room, one on each node (so both nodes apply every entry), and the
/// messages acknowledged in it.
struct Pair {
    room: String,
    /// Each node's WebSocket URL for the room.
    urls: [String; 2],
    a: Client,
    b: Client,
    /// Acknowledged before the replicas were cut off: id → seq.
    before: BTreeMap<String, u64>,
    /// Acknowledged while they were: on the primary only.
    lost: BTreeMap<String, u64>,
}

impl Pair {
    /// Joins a and b, creates an entity of kind `kept` and publishes the `before` messages.
    async fn start(cluster: &LocalCluster, room: &str) -> Pair {
        let urls = [0, 1].map(|i| ws_url(&cluster.node(i).url(), room));
        let mut a = Client::join(&urls[0], room, "a").await;
        let mut b = Client::join(&urls[1], room, "b").await;
        a.create_entity("kept").await;
        let before = publish_phase(&mut a, &mut b, "before").await;
        Pair {
            room: room.to_owned(),
            urls,
            a,
            b,
            before,
            lost: BTreeMap::new(),
        }
    }

    /// Creates an entity of kind `lost` and publishes the `lost` messages.
    async fn lose(&mut self) {
        self.a.create_entity("lost").await;
        self.lost = publish_phase(&mut self.a, &mut self.b, "lost").await;
    }

    /// Checks that the replica at `r` holds the `before` messages and none of the `lost` ones.
    fn check_lacks_lost(&self, r: SocketAddr, setup: Setup) {
        let url = format!("redis://{r}/");
        let log = log_entries(&url, &self.room, setup == Setup::RedisCluster);
        let payloads: Vec<Vec<u8>> = log.into_iter().map(|(_, p)| p).collect();
        for id in self.before.keys() {
            assert_eq!(count_id(&payloads, id), 1, "replica {r} lacks {id}");
        }
        for id in self.lost.keys() {
            assert_eq!(count_id(&payloads, id), 0, "replica {r} has {id}");
        }
    }

    /// Joins a and b again, without resuming, and checks the new history they get: the
    /// `kept` entity and the `before` messages under their seqs, nothing lost.
    async fn rejoin(&mut self) {
        self.a = Client::join(&self.urls[0], &self.room, "a").await;
        self.b = Client::join(&self.urls[1], &self.room, "b").await;
        for m in [&self.a, &self.b] {
            assert_eq!(m.joined["resumed"], false, "{}", m.joined);
            let kinds = m.entity_kinds();
            assert!(kinds.contains("kept"), "{}: {kinds:?}", m.name);
            assert!(!kinds.contains("lost"), "{}: {kinds:?}", m.name);
            for (id, seq) in &self.before {
                assert_eq!(
                    m.seq_of(id),
                    Some(*seq),
                    "{}: {id} in the new history",
                    m.name
                );
            }
            for id in self.lost.keys() {
                assert_eq!(m.seq_of(id), None, "{}: {id} in the new history", m.name);
            }
        }
    }

    /// Publishes the `after` messages (each received by both); the acknowledged ones.
    async fn after(&mut self) -> BTreeMap<String, u64> {
        publish_phase(&mut self.a, &mut self.b, "after").await
    }

    /// Checks that a newcomer's history holds every message of `acked` under its seq and none
    /// lost, and that the new primary `new`'s log has other entries at the lost positions.
    async fn check_after(&self, acked: &BTreeMap<String, u64>, new: SocketAddr) {
        let c = Client::join(&self.urls[1], &self.room, "c").await;
        for (id, seq) in acked {
            assert_eq!(
                c.seq_of(id),
                Some(*seq),
                "c: {id} lost after the regression"
            );
        }
        for id in self.lost.keys() {
            assert_eq!(c.seq_of(id), None, "c: {id} came back");
        }
        let url = format!("redis://{new}/");
        let log: BTreeMap<u64, Vec<u8>> =
            log_entries(&url, &self.room, false).into_iter().collect();
        for (id, seq) in &self.lost {
            let entry = log
                .get(seq)
                .unwrap_or_else(|| panic!("position {seq} ({id}'s) not taken again"));
            assert_eq!(count_id(std::slice::from_ref(entry), id), 0, "{id} is back");
        }
    }
}

/// Each of `a` and `b` publishes [`EACH`] messages `{phase}-{name}-{i}`, each acknowledged,
/// and receives the other's; the acknowledged ids with their seqs.
async fn publish_phase(a: &mut Client, b: &mut Client, phase: &str) -> BTreeMap<String, u64> {
    let mut acked = BTreeMap::new();
    for m in [&mut *a, &mut *b] {
        for i in 0..EACH {
            let id = format!("{phase}-{}-{i}", m.name);
            let seq = m.publish_acked(&id).await;
            acked.insert(id, seq);
        }
    }
    for m in [a, b] {
        let want: Vec<&String> = acked.keys().collect();
        m.until(|m| want.iter().all(|id| m.seq_of(id).is_some()))
            .await;
        for (id, seq) in &acked {
            assert_eq!(m.seq_of(id), Some(*seq), "{}: {id}", m.name);
        }
    }
    acked
}

/// A WebSocket client in one room that notes what it receives, and how its connection ended.
struct Client {
    name: String,
    room: String,
    ws: Ws,
    /// The `joined` frame.
    joined: Value,
    last_seq: u64,
    /// Message ids received (in `joined`'s history or live) → seq.
    messages: BTreeMap<String, u64>,
    /// Acknowledged publishes: id → seq.
    acked: BTreeMap<String, u64>,
    errors: Vec<Value>,
    responses: BTreeMap<u64, Value>,
    next_nonce: u64,
    /// The close code, once the server closed the connection.
    closed: Option<u16>,
}

impl Client {
    /// Connects to `url` and joins `room` as `name`, asking for the room's message history.
    async fn join(url: &str, room: &str, name: &str) -> Client {
        let (ws, _) = tokio_tungstenite::connect_async(url)
            .await
            .unwrap_or_else(|e| panic!("{name}: connect {url}: {e}"));
        let mut c = Client {
            name: name.to_owned(),
            room: room.to_owned(),
            ws,
            joined: Value::Null,
            last_seq: 0,
            messages: BTreeMap::new(),
            acked: BTreeMap::new(),
            errors: Vec::new(),
            responses: BTreeMap::new(),
            next_nonce: 0,
            closed: None,
        };
        let join = json!({"type": "join", "room": room, "name": name, "history": {"last": 1000}});
        c.send(join).await;
        c.until(|c| !c.joined.is_null() || !c.errors.is_empty())
            .await;
        assert!(c.errors.is_empty(), "{name}: join refused: {:?}", c.errors);
        let history = c.joined["history"]["events"].as_array().cloned();
        for event in history.unwrap_or_default() {
            c.note_message(&event);
        }
        c.last_seq = c.joined["seq"].as_u64().unwrap();
        c
    }

    /// Sends a frame. A failure is left to the next read, which sees how the connection
    /// ended: the server may have closed it already (4005), and the close is read next.
    async fn send(&mut self, frame: Value) {
        let _ = self.ws.send(Message::text(frame.to_string())).await;
    }

    /// Reads frames until `done` holds; panics after [`LIMIT`] or if the connection ends.
    async fn until(&mut self, mut done: impl FnMut(&Client) -> bool) {
        let deadline = Instant::now() + LIMIT;
        while !done(self) {
            assert!(
                self.closed.is_none(),
                "{}: closed ({:?})",
                self.name,
                self.closed
            );
            self.read_one(deadline).await;
        }
    }

    /// Reads one frame; panics at `deadline`.
    async fn read_one(&mut self, deadline: Instant) {
        let wait = deadline.saturating_duration_since(Instant::now());
        let next = tokio::time::timeout(wait, self.ws.next())
            .await
            .unwrap_or_else(|_| panic!("{}: nothing within {LIMIT:?}", self.name));
        match next {
            Some(Ok(Message::Text(t))) => self.on_frame(serde_json::from_str(&t).unwrap()),
            Some(Ok(Message::Close(frame))) => {
                self.closed = Some(frame.map_or(1005, |f| u16::from(f.code)));
            }
            Some(Ok(_)) => {}
            Some(Err(e)) => panic!("{}: connection failed without a close: {e}", self.name),
            None => panic!("{}: connection ended without a close", self.name),
        }
    }

    fn on_frame(&mut self, v: Value) {
        match v["type"].as_str() {
            Some("joined") => self.joined = v,
            Some("resync") => panic!("{}: a fresh join got resync: {v}", self.name),
            Some("event") => {
                let seq = v["seq"].as_u64().unwrap();
                assert!(
                    seq > self.last_seq,
                    "{}: seq {seq} after {}: {v}",
                    self.name,
                    self.last_seq
                );
                self.last_seq = seq;
                self.note_message(&v);
            }
            Some("ack") => {
                let id = v["id"].as_str().unwrap().to_owned();
                self.acked.insert(id, v["seq"].as_u64().unwrap());
            }
            Some("response") => {
                self.responses.insert(v["nonce"].as_u64().unwrap(), v);
            }
            Some("error") => self.errors.push(v),
            _ => {}
        }
    }

    fn note_message(&mut self, event: &Value) {
        if event["kind"] == "message" {
            if let Some(id) = event["data"].as_str() {
                self.messages
                    .insert(id.to_owned(), event["seq"].as_u64().unwrap());
            }
        }
    }

    /// The seq message `id` was received under.
    fn seq_of(&self, id: &str) -> Option<u64> {
        self.messages.get(id).copied()
    }

    /// The kinds of the entities in `joined`'s snapshot.
    fn entity_kinds(&self) -> BTreeSet<String> {
        self.joined["snapshot"]["entities"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|e| e["kind"].as_str().map(str::to_owned))
            .collect()
    }

    async fn send_publish(&mut self, id: &str) {
        let frame = json!({"type": "publish", "room": self.room, "event": "m", "id": id, "data": id, "echo": true});
        self.send(frame).await;
    }

    /// Publishes message `id` until it is acknowledged (the same id again after
    /// `broker_unavailable`, as a client would); its seq.
    async fn publish_acked(&mut self, id: &str) -> u64 {
        self.send_publish(id).await;
        loop {
            self.until(|c| c.acked.contains_key(id) || !c.errors.is_empty())
                .await;
            if let Some(seq) = self.acked.get(id) {
                return *seq;
            }
            self.retry_after_errors().await;
            self.send_publish(id).await;
        }
    }

    /// Checks that every error is `broker_unavailable` and backs off before a retry.
    async fn retry_after_errors(&mut self) {
        for e in self.errors.drain(..) {
            assert_eq!(e["code"], "broker_unavailable", "{}: {e}", self.name);
        }
        // A client's backoff while the broker fails over, not a synchronisation.
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    /// Publishes `{prefix}-0`, `{prefix}-1`, … one after another (each retried after
    /// `broker_unavailable`) until the server closes the connection; the acknowledged ones.
    async fn publish_until_closed(&mut self, prefix: &str) -> BTreeMap<String, u64> {
        let deadline = Instant::now() + LIMIT;
        let mut i = 0;
        let mut id = format!("{prefix}-{i}");
        self.send_publish(&id).await;
        while self.closed.is_none() {
            self.read_one(deadline).await;
            if self.acked.contains_key(&id) {
                i += 1;
                id = format!("{prefix}-{i}");
                self.send_publish(&id).await;
            } else if !self.errors.is_empty() {
                self.retry_after_errors().await;
                self.send_publish(&id).await;
            }
        }
        let mine = |(k, _): &(&String, &u64)| k.starts_with(prefix);
        self.acked
            .iter()
            .filter(mine)
            .map(|(k, v)| (k.clone(), *v))
            .collect()
    }

    /// Reads until the server closes the connection; the close code.
    async fn until_closed(&mut self) -> u16 {
        let deadline = Instant::now() + LIMIT;
        while self.closed.is_none() {
            self.read_one(deadline).await;
        }
        self.closed.unwrap()
    }

    /// Creates an entity of kind `kind` and waits for its response.
    async fn create_entity(&mut self, kind: &str) {
        self.next_nonce += 1;
        let nonce = self.next_nonce;
        let frame = json!({"type": "request", "room": self.room, "nonce": nonce,
            "op": "entity.create", "args": {"kind": kind}});
        self.send(frame).await;
        self.until(|c| c.responses.contains_key(&nonce)).await;
        let response = &self.responses[&nonce];
        assert_eq!(response["ok"], true, "{}: {response}", self.name);
    }
}

/// `plaza_log_regressions_total` on each node (0 while absent).
fn regressions(cluster: &LocalCluster) -> Vec<u64> {
    let name = "plaza_log_regressions_total";
    cluster
        .nodes()
        .iter()
        .map(|node| {
            let metrics = http_get(node.addr(), "/metrics", Duration::from_secs(10))
                .unwrap()
                .text();
            metrics
                .lines()
                .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
                .unwrap_or(0)
        })
        .collect()
}

/// One Redis command to the server at `addr`.
fn query<T: redis::FromRedisValue>(addr: SocketAddr, cmd: &redis::Cmd) -> T {
    let client = redis::Client::open(format!("redis://{addr}/")).unwrap();
    let mut conn = client.get_connection().unwrap();
    cmd.query(&mut conn)
        .unwrap_or_else(|e| panic!("{addr}: {e}"))
}

/// `INFO replication` of the server at `addr`, as field → value.
fn replication(addr: SocketAddr) -> BTreeMap<String, String> {
    let info: String = query(addr, redis::cmd("INFO").arg("replication"));
    info.lines()
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.to_owned(), v.trim().to_owned()))
        .collect()
}

/// The primary serving `room`'s keys now.
fn primary_of(cluster: &LocalCluster, setup: Setup, room: &str) -> SocketAddr {
    match setup {
        Setup::Sentinel => {
            let sentinels = cluster.sentinels().unwrap();
            sentinels.servers()[sentinels.primary().unwrap()].addr()
        }
        Setup::RedisCluster => cluster
            .redis_cluster()
            .unwrap()
            .primary_of(slot_of(format!("plaza:room:{{{room}}}")))
            .unwrap(),
    }
}

/// The replicas the primary at `addr` lists (`slaveN:ip=…,port=…,…`).
fn replicas_of(primary: SocketAddr) -> Vec<SocketAddr> {
    replication(primary)
        .iter()
        .filter(|(k, _)| k.starts_with("slave") && k[5..].parse::<u32>().is_ok())
        .map(|(_, v)| {
            let field = |name: &str| {
                v.split(',')
                    .find_map(|kv| kv.strip_prefix(name)?.strip_prefix('='))
                    .unwrap()
                    .to_owned()
            };
            format!("{}:{}", field("ip"), field("port"))
                .parse()
                .unwrap()
        })
        .collect()
}

/// Cuts `replicas` off from `primary`: each is to authenticate with a password the primary
/// does not have, and its replication link is killed, so that it cannot sync again. Returns
/// once the primary has no replica left and each replica's link is down.
async fn cut_off(primary: SocketAddr, replicas: &[SocketAddr], setup: Setup) {
    for &r in replicas {
        let set = |key: &str, value: &str| {
            let _: () = query(r, redis::cmd("CONFIG").arg("SET").arg(key).arg(value));
        };
        set("masterauth", WRONG_MASTERAUTH);
        if setup == Setup::RedisCluster {
            // A replica whose link has been down long refuses to fail over; on a busy machine
            // the test may take long, and this one must be promoted whatever the time.
            set("cluster-replica-validity-factor", "0");
        }
        let _: i64 = query(
            r,
            redis::cmd("CLIENT").arg("KILL").arg("TYPE").arg("master"),
        );
    }
    let deadline = Instant::now() + LIMIT;
    loop {
        let connected = replication(primary)["connected_slaves"].clone();
        let down = replicas
            .iter()
            .all(|&r| replication(r)["master_link_status"] == "down");
        if connected == "0" && down {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "replicas not cut off: {connected} connected"
        );
        // Redis gives no event for a replication link's state: poll it.
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// SIGKILLs `primary`, lets the replicas sync again (with whatever primary they get), and waits
/// until one of them is promoted; its address.
async fn fail_over(
    cluster: &mut LocalCluster,
    setup: Setup,
    room: &str,
    primary: SocketAddr,
    replicas: &[SocketAddr],
) -> SocketAddr {
    let heal = || {
        for &r in replicas {
            let _: () = query(r, redis::cmd("CONFIG").arg("SET").arg("masterauth").arg(""));
        }
    };
    match setup {
        Setup::Sentinel => {
            let old = kill_primary(cluster);
            assert_eq!(cluster.sentinels().unwrap().servers()[old].addr(), primary);
            heal();
            let new = promoted(cluster, old).await;
            cluster.sentinels().unwrap().servers()[new].addr()
        }
        Setup::RedisCluster => {
            let slot = slot_of(format!("plaza:room:{{{room}}}"));
            let new = cluster
                .redis_cluster_mut()
                .unwrap()
                .kill_primary(slot)
                .unwrap();
            heal();
            new
        }
    }
}
