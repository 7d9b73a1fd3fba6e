//! A room member for failure tests: it keeps its session across reconnects
//! (resume with the last seq seen), retries unacknowledged publishes with the
//! same ids, and checks on the way that it never sees a seq twice.
#![allow(dead_code)]

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

use futures_util::{SinkExt, StreamExt};
use serde_json::{json, Value};
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};

pub type Ws = WebSocketStream<MaybeTlsStream<TcpStream>>;

/// Starts `nodes` nodes of this build (with `--auto-create-rooms` and
/// `node_args`) behind `lb`, on one Redis or (`redis_sentinel`) on a
/// Sentinel-watched primary with replicas, in a fresh directory named
/// after `name`.
pub fn start_cluster(
    name: &str,
    nodes: usize,
    lb: plaza_launch::LbKind,
    node_args: &[&str],
    redis_sentinel: bool,
) -> (plaza_launch::LocalCluster, tempfile::TempDir) {
    start_on(name, nodes, lb, node_args, redis_sentinel, None)
}

/// [`start_cluster`] on a Redis Cluster of `primaries` primaries with a
/// replica each (`plaza cluster up --redis-cluster`).
pub fn start_on_redis_cluster(
    name: &str,
    nodes: usize,
    node_args: &[&str],
    primaries: usize,
) -> (plaza_launch::LocalCluster, tempfile::TempDir) {
    start_on(
        name,
        nodes,
        plaza_launch::LbKind::Nginx,
        node_args,
        false,
        Some(primaries),
    )
}

fn start_on(
    name: &str,
    nodes: usize,
    lb: plaza_launch::LbKind,
    node_args: &[&str],
    redis_sentinel: bool,
    redis_cluster: Option<usize>,
) -> (plaza_launch::LocalCluster, tempfile::TempDir) {
    let dir = tempfile::Builder::new()
        .prefix(&format!("plaza-{name}-"))
        .tempdir()
        .unwrap();
    let mut args = vec!["--auto-create-rooms".to_owned()];
    args.extend(node_args.iter().map(|a| (*a).to_owned()));
    let cluster = plaza_launch::LocalCluster::start(plaza_launch::ClusterOptions {
        plaza_bin: std::path::PathBuf::from(env!("CARGO_BIN_EXE_plaza")),
        nodes,
        lb,
        listen_port: 0,
        dir: dir.path().to_owned(),
        node_args: args,
        embedded: false,
        cpu_quotas: Default::default(),
        lb_workers: None,
        node_ports: None,
        redis_sentinel,
        redis_cluster,
    })
    .unwrap_or_else(|e| {
        panic!(
            "cannot start the cluster (run scripts/test.sh to install redis-server and nginx): {e}"
        )
    });
    (cluster, dir)
}

/// The WebSocket URL of `room` at the node or balancer `http`.
pub fn ws_url(http: &str, room: &str) -> String {
    format!("{}/v1/ws?room={room}", http.replacen("http://", "ws://", 1))
}

/// One member of a room, resuming wherever `url` leads it.
pub struct Member {
    pub name: String,
    pub room: String,
    /// `ws://…/v1/ws?room=…`: a load balancer or one node.
    pub url: String,
    ws: Option<Ws>,
    /// The node the current connection landed on (`x-plaza-node`).
    pub node: String,
    pub session: String,
    token: String,
    pub last_seq: u64,
    /// Message events received: seq → (sender session, data).
    pub received: BTreeMap<u64, (String, Value)>,
    /// Published, not acknowledged yet: id → data.
    unacked: BTreeMap<String, Value>,
    /// Acknowledged: id → seq.
    pub acked: HashMap<String, u64>,
    /// Errors received, by code.
    pub errors: Vec<Value>,
    /// Responses received, by nonce.
    pub responses: HashMap<u64, Value>,
    /// Other room events (kind, frame).
    pub events: Vec<Value>,
    pub reconnects: usize,
    /// The server closed the connection with 4005: the room's history was rewritten (a
    /// failover lost entries this member saw). The member stops there: resuming would get
    /// `resync`.
    pub history_rewritten: bool,
    /// `pong` frames received.
    pub pongs: usize,
    /// When set, a connection silent this long gets an application `ping`,
    /// and one still silent as long again is taken for dead: the member
    /// reconnects (a path cut somewhere between it and its node sends no
    /// close, nor anything else). See [`Member::with_liveness`].
    liveness: Option<Duration>,
    /// When the current connection last gave a frame (or a ping went out).
    heard: Instant,
    /// Whether a ping is unanswered.
    pinged: bool,
}

/// How long a member tries to reconnect before the test fails.
pub const RECONNECT_FOR: Duration = Duration::from_secs(30);
/// How long one connect and join may take when watching for liveness.
pub const CONNECT_FOR: Duration = Duration::from_secs(10);

impl Member {
    /// Connects to `url` and joins `room` as `name`.
    pub async fn join(url: &str, room: &str, name: &str) -> Member {
        let mut m = Member {
            name: name.to_owned(),
            room: room.to_owned(),
            url: url.to_owned(),
            ws: None,
            node: String::new(),
            session: String::new(),
            token: String::new(),
            last_seq: 0,
            received: BTreeMap::new(),
            unacked: BTreeMap::new(),
            acked: HashMap::new(),
            errors: Vec::new(),
            responses: HashMap::new(),
            events: Vec::new(),
            reconnects: 0,
            history_rewritten: false,
            pongs: 0,
            liveness: None,
            heard: Instant::now(),
            pinged: false,
        };
        m.connect(None).await.expect("first join");
        m
    }

    /// [`Member::join`], watching the connection for silence (see `liveness`):
    /// how a client finds out that a path it cannot see was cut.
    pub async fn with_liveness(url: &str, room: &str, name: &str, liveness: Duration) -> Member {
        let mut m = Member::join(url, room, name).await;
        m.liveness = Some(liveness);
        m
    }

    /// Connects and joins, giving up after [`CONNECT_FOR`] when watching for
    /// liveness (a cut path may swallow the handshake).
    async fn connect(&mut self, resume: Option<Value>) -> Result<(), String> {
        if self.liveness.is_none() {
            return self.connect_once(resume).await;
        }
        match tokio::time::timeout(CONNECT_FOR, self.connect_once(resume)).await {
            Ok(r) => r,
            Err(_) => Err(format!("no joined within {CONNECT_FOR:?}")),
        }
    }

    async fn connect_once(&mut self, resume: Option<Value>) -> Result<(), String> {
        let (mut ws, response) = tokio_tungstenite::connect_async(self.url.as_str())
            .await
            .map_err(|e| format!("connect {}: {e}", self.url))?;
        self.node = response
            .headers()
            .get("x-plaza-node")
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_owned();
        let mut join = json!({"type": "join", "room": self.room, "name": self.name});
        if let Some(r) = resume {
            join["resume"] = r;
        }
        ws.send(Message::text(join.to_string()))
            .await
            .map_err(|e| e.to_string())?;
        loop {
            let v = next_frame(&mut ws).await?;
            match v["type"].as_str() {
                Some("joined") => {
                    if !self.session.is_empty() {
                        assert_eq!(v["resumed"], true, "{} must resume: {v}", self.name);
                        assert_eq!(v["session"], self.session.as_str());
                    }
                    self.session = v["session"].as_str().unwrap().to_owned();
                    self.token = v["resume_token"].as_str().unwrap().to_owned();
                    if self.last_seq == 0 {
                        self.last_seq = v["seq"].as_u64().unwrap();
                    }
                    break;
                }
                Some("resync") => panic!("{} lost its stream: {v}", self.name),
                Some("error") => return Err(format!("join refused: {v}")),
                _ => self.on_frame(v),
            }
        }
        self.ws = Some(ws);
        self.heard = Instant::now();
        self.pinged = false;
        // Whatever was not acknowledged is sent again, with the same ids.
        self.resend_unacked().await;
        Ok(())
    }

    /// Reconnects (through `url`) and resumes, retrying until [`RECONNECT_FOR`].
    pub async fn reconnect(&mut self) {
        self.ws = None;
        self.reconnects += 1;
        let start = Instant::now();
        let mut wait = Duration::from_millis(20);
        loop {
            let resume = json!({"token": self.token, "last_seq": self.last_seq});
            match self.connect(Some(resume)).await {
                Ok(()) => return,
                Err(e) => {
                    assert!(
                        start.elapsed() < RECONNECT_FOR,
                        "{} could not reconnect: {e}",
                        self.name
                    );
                    // Backoff between attempts while the cluster recovers.
                    tokio::time::sleep(wait).await;
                    wait = (wait * 2).min(Duration::from_millis(500));
                }
            }
        }
    }

    /// Publishes a message with client id `id` (retried until acknowledged).
    pub async fn publish(&mut self, id: &str, data: Value) {
        self.unacked.insert(id.to_owned(), data.clone());
        self.send_publish(id, &data).await;
    }

    async fn send_publish(&mut self, id: &str, data: &Value) {
        let frame =
            json!({"type": "publish", "room": self.room, "event": "m", "id": id, "data": data});
        self.send(frame).await;
    }

    /// Sends a frame; a broken connection is left for [`Member::pump`] to notice.
    pub async fn send(&mut self, frame: Value) {
        if let Some(ws) = &mut self.ws {
            if ws.send(Message::text(frame.to_string())).await.is_err() {
                self.ws = None;
            }
        }
    }

    /// Reads frames (reconnecting when the connection ends) until `done`
    /// holds; panics after `limit`.
    pub async fn pump_until(&mut self, limit: Duration, mut done: impl FnMut(&Member) -> bool) {
        let deadline = Instant::now() + limit;
        while !done(self) {
            assert!(
                !self.history_rewritten,
                "{}: closed with 4005 (history rewritten)",
                self.name
            );
            assert!(
                Instant::now() < deadline,
                "{}: condition not met in {limit:?}; acked {}/{} received {}",
                self.name,
                self.acked.len(),
                self.acked.len() + self.unacked.len(),
                self.received.len()
            );
            self.pump_once(deadline).await;
        }
    }

    /// Reads one frame or handles one disconnect.
    pub async fn pump_once(&mut self, deadline: Instant) {
        let Some(ws) = &mut self.ws else {
            return self.reconnect().await;
        };
        let now = Instant::now();
        let mut wait = deadline.saturating_duration_since(now);
        if let Some(l) = self.liveness {
            wait = wait.min((self.heard + l).saturating_duration_since(now));
        }
        match tokio::time::timeout(wait, next_frame(ws)).await {
            Err(_) => match self.liveness {
                Some(l) if self.heard.elapsed() >= l && self.pinged => {
                    // Silent through a ping: the path is gone.
                    self.reconnect().await;
                }
                Some(l) if self.heard.elapsed() >= l => {
                    self.pinged = true;
                    self.heard = Instant::now();
                    self.send(json!({"type": "ping"})).await;
                }
                _ => {}
            },
            Ok(Ok(v)) => {
                self.heard = Instant::now();
                self.pinged = false;
                if v["type"] == "closed" {
                    self.reconnect().await;
                } else {
                    self.on_frame(v);
                }
            }
            Ok(Err(e)) if e == CLOSED_HISTORY_REWRITTEN => {
                self.ws = None;
                self.history_rewritten = true;
            }
            Ok(Err(_)) => self.reconnect().await,
        }
    }

    fn on_frame(&mut self, v: Value) {
        match v["type"].as_str() {
            Some("event") => {
                let seq = v["seq"].as_u64().unwrap();
                assert!(
                    seq > self.last_seq,
                    "{}: seq {seq} after {} (a duplicate or out of order): {v}",
                    self.name,
                    self.last_seq
                );
                self.last_seq = seq;
                if v["kind"] == "message" {
                    let from = v["from"].as_str().unwrap_or_default().to_owned();
                    self.received.insert(seq, (from, v["data"].clone()));
                } else {
                    self.events.push(v);
                }
            }
            Some("ack") => {
                let id = v["id"].as_str().unwrap().to_owned();
                let seq = v["seq"].as_u64().unwrap();
                self.unacked.remove(&id);
                if let Some(earlier) = self.acked.insert(id.clone(), seq) {
                    assert_eq!(
                        earlier, seq,
                        "{}: {id} acknowledged twice with two seqs",
                        self.name
                    );
                }
            }
            Some("response") => {
                let nonce = v["nonce"].as_u64().unwrap();
                self.responses.insert(nonce, v);
            }
            Some("error") => self.errors.push(v),
            Some("pong") => self.pongs += 1,
            _ => {}
        }
    }

    /// Sends every unacknowledged publish again, with the same ids (after
    /// errors such as `broker_unavailable`).
    pub async fn resend_unacked(&mut self) {
        let retry: Vec<(String, Value)> = self
            .unacked
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        for (id, data) in retry {
            self.send_publish(&id, &data).await;
        }
    }

    /// Whether every published message was acknowledged.
    pub fn all_acked(&self) -> bool {
        self.unacked.is_empty()
    }

    /// Drops the connection without a close handshake (as a crash would).
    pub fn drop_connection(&mut self) {
        self.ws = None;
    }
}

/// [`next_frame`]'s error for a close with 4005 (history rewritten).
pub const CLOSED_HISTORY_REWRITTEN: &str = "closed with 4005 (history rewritten)";

/// The next JSON frame, or why there is none (the connection ended).
pub async fn next_frame(ws: &mut Ws) -> Result<Value, String> {
    loop {
        match ws.next().await {
            None => return Err("connection ended".into()),
            Some(Err(e)) => return Err(e.to_string()),
            Some(Ok(Message::Text(t))) => {
                return serde_json::from_str(&t).map_err(|e| e.to_string())
            }
            Some(Ok(Message::Close(Some(f)))) if u16::from(f.code) == 4005 => {
                return Err(CLOSED_HISTORY_REWRITTEN.into())
            }
            Some(Ok(Message::Close(_))) => return Err("closed".into()),
            Some(Ok(_)) => continue,
        }
    }
}

/// Checks that every member received every acknowledged message of every
/// other member exactly once, under the seq it was acknowledged with.
pub fn assert_exactly_once(members: &[&Member]) {
    for m in members {
        for other in members {
            if other.session == m.session {
                continue;
            }
            for (id, seq) in &other.acked {
                let got = m.received.get(seq).unwrap_or_else(|| {
                    panic!(
                        "{} never received {id} (seq {seq}) from {}",
                        m.name, other.name
                    )
                });
                assert_eq!(
                    got.0, other.session,
                    "{}: seq {seq} is from someone else",
                    m.name
                );
                assert_eq!(got.1, json!(id), "{}: seq {seq} carries other data", m.name);
            }
        }
        // Nothing arrived that nobody acknowledged (retries are applied once).
        let acked: usize = members
            .iter()
            .filter(|o| o.session != m.session)
            .map(|o| o.acked.len())
            .sum();
        assert_eq!(
            m.received.len(),
            acked,
            "{} received extra messages",
            m.name
        );
    }
}

/// How long failure tests wait for anything.
pub const LIMIT: Duration = Duration::from_secs(60);

/// The id of `m`'s `i`th message: fixed width, so no id is part of another.
pub fn id(m: &Member, i: usize) -> String {
    format!("{}-{i:05}", m.name)
}

/// Publishes `count` messages as `m`, one at a time, each retried (same id)
/// after `broker_unavailable` as a client would; returns how many errors it
/// met. `on_ack` gets the number acknowledged so far.
pub async fn publish_all_retrying(m: &mut Member, count: usize, on_ack: impl Fn(usize)) -> usize {
    let mut errors = 0;
    for i in 0..count {
        let id = id(m, i);
        m.publish(&id, json!(id)).await;
        while !m.all_acked() {
            m.pump_until(LIMIT, |m| m.all_acked() || !m.errors.is_empty())
                .await;
            for e in m.errors.drain(..) {
                assert_eq!(e["code"], "broker_unavailable", "{}: {e}", m.name);
                errors += 1;
            }
            if !m.all_acked() {
                assert!(errors < 200, "{}: never acknowledged", m.name);
                // A client's backoff before retrying, not a synchronisation.
                tokio::time::sleep(Duration::from_millis(100)).await;
                m.resend_unacked().await;
            }
        }
        on_ack(m.acked.len());
    }
    errors
}

/// A room's log payloads as the Redis at `url` holds them (`XRANGE`).
pub fn log_payloads(url: &str, room: &str) -> Vec<Vec<u8>> {
    log_entries(url, room, false)
        .into_iter()
        .map(|(_, p)| p)
        .collect()
}

/// A room's log as the Redis at `url` holds them (`XRANGE`): each entry's position and
/// payload. `replica_of_cluster`: the server is a Redis Cluster replica, which serves reads
/// only after `READONLY`.
pub fn log_entries(url: &str, room: &str, replica_of_cluster: bool) -> Vec<(u64, Vec<u8>)> {
    /// A stream entry as XRANGE gives it: id, then field and value pairs.
    type StreamEntry = (String, Vec<(String, Vec<u8>)>);
    let client = redis::Client::open(url).unwrap();
    let mut conn = client.get_connection().unwrap();
    if replica_of_cluster {
        let _: () = redis::cmd("READONLY").query(&mut conn).unwrap();
    }
    let log: Vec<StreamEntry> = redis::cmd("XRANGE")
        .arg(format!("plaza:room:{{{room}}}:log"))
        .arg("-")
        .arg("+")
        .query(&mut conn)
        .unwrap();
    log.into_iter()
        .flat_map(|(id, fields)| {
            // Entry ids are `<position>-0`.
            let n: u64 = id.split('-').next().unwrap().parse().unwrap();
            fields
                .into_iter()
                .filter(|(k, _)| k == "p")
                .map(move |(_, v)| (n, v))
        })
        .collect()
}

/// How many of `payloads` carry message id `id`.
pub fn count_id(payloads: &[Vec<u8>], id: &str) -> usize {
    payloads
        .iter()
        .filter(|p| p.windows(id.len()).any(|w| w == id.as_bytes()))
        .count()
}

/// Publishes `n` messages from each member at once (each retried after
/// `broker_unavailable`, as a client would); `progress` gets the first
/// member's acknowledgements so far. Returns the members and the errors met.
pub fn publish_from_all(
    members: Vec<Member>,
    n: usize,
    progress: tokio::sync::watch::Sender<usize>,
) -> Vec<tokio::task::JoinHandle<(Member, usize)>> {
    members
        .into_iter()
        .enumerate()
        .map(|(i, mut m)| {
            let progress = progress.clone();
            tokio::spawn(async move {
                let errors = publish_all_retrying(&mut m, n, |acked| {
                    if i == 0 {
                        progress.send_replace(acked);
                    }
                })
                .await;
                (m, errors)
            })
        })
        .collect()
}

/// Waits for the publishing tasks, then until every member received every
/// other member's acknowledged messages, and checks them.
pub async fn finish(tasks: Vec<tokio::task::JoinHandle<(Member, usize)>>, each: usize) -> usize {
    let mut members = Vec::new();
    let mut errors = 0;
    for t in tasks {
        let (m, e) = t.await.unwrap();
        members.push(m);
        errors += e;
    }
    let expected: usize = members.iter().map(|m| m.acked.len()).sum();
    assert_eq!(
        expected,
        members.len() * each,
        "every publish was acknowledged"
    );
    for m in members.iter_mut() {
        let want = expected - m.acked.len();
        m.pump_until(LIMIT, |m| m.received.len() >= want).await;
    }
    let refs: Vec<&Member> = members.iter().collect();
    assert_exactly_once(&refs);
    errors
}
