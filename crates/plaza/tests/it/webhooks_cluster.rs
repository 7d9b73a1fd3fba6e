//! Durable webhooks with real processes: redis-server and two `plaza serve
//! --redis` nodes. The node that appends a room's entries, and reads the
//! webhook queue, is SIGKILLed in the middle of a stream of server-API
//! publishes: every message the room's log holds still reaches the receiver
//! (each id at least once, none that the log does not hold), and what the
//! dead node had read without acknowledging is counted as redelivered.

use std::collections::{BTreeSet, HashMap};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::http::HeaderMap;
use plaza_launch::{ClusterOptions, LbKind, LocalCluster};
use serde_json::{json, Value};

const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";

/// Webhook ids received, with how often each came.
type Received = Arc<Mutex<HashMap<String, usize>>>;

async fn receiver() -> (String, Received) {
    let got: Received = Arc::default();
    let app = axum::Router::new().route(
        "/hook",
        axum::routing::post({
            let got = got.clone();
            move |headers: HeaderMap, _body: Bytes| {
                let got = got.clone();
                async move {
                    if let Some(id) = headers.get("webhook-id").and_then(|v| v.to_str().ok()) {
                        *got.lock().unwrap().entry(id.to_owned()).or_default() += 1;
                    }
                    axum::http::StatusCode::NO_CONTENT
                }
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    (format!("http://{addr}/hook"), got)
}

fn distinct(got: &Received) -> BTreeSet<String> {
    got.lock().unwrap().keys().cloned().collect()
}

/// Waits until `done` holds, checking every 100 ms, for at most `limit`.
async fn until(limit: Duration, mut done: impl FnMut() -> bool) -> bool {
    let start = Instant::now();
    while start.elapsed() < limit {
        if done() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    done()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn webhooks_of_a_killed_nodes_appends_are_still_sent() {
    killed_nodes_webhooks_are_sent(None).await;
}

/// The same on a Redis Cluster of three primaries: each target's queue,
/// lease and per-room cursors share a slot, the room's own cursor is in
/// another, and the lagging room is found through the split registry.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn webhooks_of_a_killed_nodes_appends_are_still_sent_on_a_redis_cluster() {
    killed_nodes_webhooks_are_sent(Some(3)).await;
}

async fn killed_nodes_webhooks_are_sent(redis_cluster: Option<usize>) {
    let (url, got) = receiver().await;
    let dir = tempfile::Builder::new()
        .prefix("plaza-webhooks-")
        .tempdir()
        .unwrap();
    let config = dir.path().join("plaza.toml");
    std::fs::write(
        &config,
        format!(
            "[[webhooks]]\nname = \"backend\"\nurl = \"{url}\"\nsecret = \"{SECRET}\"\n\
             events = [\"message.published\"]\nchannels = [\"*\"]\n"
        ),
    )
    .unwrap();
    let mut cluster = LocalCluster::start(ClusterOptions {
        plaza_bin: PathBuf::from(env!("CARGO_BIN_EXE_plaza")),
        nodes: 2,
        lb: LbKind::Nginx,
        listen_port: 0,
        dir: dir.path().to_owned(),
        node_args: vec!["--config".into(), config.display().to_string()],
        embedded: false,
        cpu_quotas: Default::default(),
        lb_workers: None,
        node_ports: None,
        redis_sentinel: false,
        redis_cluster,
    })
    .unwrap_or_else(|e| panic!("cannot start the cluster (run scripts/test.sh): {e}"));
    let http = reqwest::Client::new();
    let (a, b) = (cluster.node(0).url(), cluster.node(1).url());
    let created = http
        .post(format!("{a}/v1/rooms"))
        .json(&json!({"id": "hooks"}))
        .send()
        .await
        .unwrap();
    assert_eq!(created.status(), 201);

    // Node 0 hosts the room alone (nobody is connected anywhere): it
    // appends every publish, and its replica is the only one to queue
    // their webhooks. It is killed after the first 150 answers, with
    // publishes in flight.
    let answered = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let mut senders = Vec::new();
    for s in 0..4 {
        let (http, a, answered) = (http.clone(), a.clone(), answered.clone());
        senders.push(tokio::spawn(async move {
            for i in 0..100 {
                let body = json!({"event": "m", "data": i, "idempotency_key": format!("{s}-{i}")});
                let sent = http
                    .post(format!("{a}/v1/rooms/hooks/publish"))
                    .json(&body)
                    .timeout(Duration::from_secs(5))
                    .send()
                    .await;
                match sent {
                    Ok(r) if r.status() == 200 => {
                        answered.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    }
                    _ => return,
                }
            }
        }));
    }
    assert!(
        until(Duration::from_secs(30), || answered
            .load(std::sync::atomic::Ordering::SeqCst)
            >= 150)
        .await,
        "publishes answered"
    );
    cluster.kill_node(0).unwrap();
    for s in senders {
        s.await.unwrap();
    }
    let acknowledged = answered.load(std::sync::atomic::Ordering::SeqCst);

    // Node 1 finds the room lagging, hosts it, queues what was missing, and
    // takes over the queue's reading.
    assert!(
        until(Duration::from_secs(40), || distinct(&got).len()
            >= acknowledged)
        .await,
        "{} of {acknowledged} acknowledged publishes reached the receiver",
        distinct(&got).len()
    );
    let history: Value = http
        .get(format!("{b}/v1/rooms/hooks/history?last=10000"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let epoch = {
        let state: Value = http
            .get(format!("{b}/v1/rooms/hooks/state"))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        state["epoch"].as_u64().unwrap()
    };
    let logged: BTreeSet<String> = history["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| format!("hooks:{epoch}:{}", e["seq"]))
        .collect();
    assert!(logged.len() >= acknowledged, "{} logged", logged.len());
    assert!(
        until(Duration::from_secs(20), || distinct(&got) == logged).await,
        "received {} distinct ids, the log holds {}; missing {:?}, not logged {:?}",
        distinct(&got).len(),
        logged.len(),
        logged
            .difference(&distinct(&got))
            .take(5)
            .collect::<Vec<_>>(),
        distinct(&got)
            .difference(&logged)
            .take(5)
            .collect::<Vec<_>>()
    );
    let metrics = http
        .get(format!("{b}/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let duplicates: usize = got.lock().unwrap().values().map(|n| n - 1).sum();
    let redelivered = metrics
        .lines()
        .find_map(|l| l.strip_prefix("plaza_webhook_redelivered_total{target=\"backend\"} "))
        .and_then(|v| v.trim().parse::<f64>().ok())
        .unwrap_or(0.0);
    assert!(
        duplicates as f64 <= redelivered,
        "{duplicates} duplicates, {redelivered} counted as redelivered"
    );
    cluster.stop().unwrap();
}

/// Entries that no replica queued (here: appended by a node without webhook
/// targets, as a node that died before queuing leaves them) are found by a
/// node with targets, which hosts the room, queues their events and sends
/// them, although nobody is connected to the room anywhere.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_room_nobody_hosts_has_its_unqueued_events_sent() {
    let (url, got) = receiver().await;
    let dir = tempfile::Builder::new()
        .prefix("plaza-webhooks-sweep-")
        .tempdir()
        .unwrap();
    let config = dir.path().join("plaza.toml");
    std::fs::write(
        &config,
        format!(
            "[[webhooks]]\nname = \"backend\"\nurl = \"{url}\"\nsecret = \"{SECRET}\"\n\
             events = [\"message.published\"]\nchannels = [\"*\"]\n"
        ),
    )
    .unwrap();
    // One node without targets behind the balancer...
    let mut cluster = LocalCluster::start(ClusterOptions {
        plaza_bin: PathBuf::from(env!("CARGO_BIN_EXE_plaza")),
        nodes: 1,
        lb: LbKind::Nginx,
        listen_port: 0,
        dir: dir.path().to_owned(),
        node_args: vec![],
        embedded: false,
        cpu_quotas: Default::default(),
        lb_workers: None,
        node_ports: None,
        redis_sentinel: false,
        redis_cluster: None,
    })
    .unwrap_or_else(|e| panic!("cannot start the cluster (run scripts/test.sh): {e}"));
    let plain = cluster.node(0).url();
    let http = reqwest::Client::new();
    let created = http
        .post(format!("{plain}/v1/rooms"))
        .json(&json!({"id": "quiet"}))
        .send()
        .await
        .unwrap();
    assert_eq!(created.status(), 201);
    let mut seqs = Vec::new();
    for i in 0..20 {
        let r: Value = http
            .post(format!("{plain}/v1/rooms/quiet/publish"))
            .json(&json!({"event": "m", "data": i}))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        seqs.push(r["seq"].as_u64().unwrap());
    }
    // ...then it dies, and a node with targets joins the cluster.
    cluster.kill_node(0).unwrap();
    let mut options = plaza_launch::NodeOptions::new("hooked");
    options.redis_url = Some(cluster.redis().unwrap().url());
    options.extra_args = vec!["--config".into(), config.display().to_string()];
    options.log_dir = Some(dir.path().to_owned());
    let mut hooked =
        plaza_launch::NodeProcess::start(&PathBuf::from(env!("CARGO_BIN_EXE_plaza")), options)
            .unwrap();
    assert!(
        until(Duration::from_secs(40), || distinct(&got).len()
            >= seqs.len())
        .await,
        "{} of {} events sent",
        distinct(&got).len(),
        seqs.len()
    );
    let state: Value = http
        .get(format!("{}/v1/rooms/quiet/state", hooked.url()))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let epoch = state["epoch"].as_u64().unwrap();
    let want: BTreeSet<String> = seqs.iter().map(|s| format!("quiet:{epoch}:{s}")).collect();
    assert_eq!(distinct(&got), want);
    hooked.stop().unwrap();
    cluster.stop().unwrap();
}
