//! Webhook receivers that fail, with real processes: one down for a minute
//! gets every event afterwards, in order per room (cluster mode, the
//! queue in Redis); one that never answers does not hold up the rooms (every
//! message arrives, in order; the latency members see is printed with and
//! without it, for docs/benchmarks.md, not asserted).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::http::HeaderMap;
use futures_util::{SinkExt, StreamExt};
use plaza_launch::{ClusterOptions, LbKind, LocalCluster};
use serde_json::{json, Value};
use tokio_tungstenite::tungstenite::Message;

const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";

/// The body of every request, in arrival order.
type Bodies = Arc<Mutex<Vec<Value>>>;

/// Serves webhooks on `listener`, answering each after `hold` (a stalled
/// receiver: longer than the target's timeout).
fn serve_receiver(listener: tokio::net::TcpListener, hold: Duration) -> Bodies {
    let got: Bodies = Arc::default();
    let app = axum::Router::new().route(
        "/hook",
        axum::routing::post({
            let got = got.clone();
            move |_: HeaderMap, body: Bytes| {
                let got = got.clone();
                async move {
                    if let Ok(v) = serde_json::from_slice(&body) {
                        got.lock().unwrap().push(v);
                    }
                    tokio::time::sleep(hold).await;
                    axum::http::StatusCode::NO_CONTENT
                }
            }
        }),
    );
    tokio::spawn(async move { axum::serve(listener, app).await });
    got
}

fn config_file(dir: &std::path::Path, url: &str, extra: &str) -> PathBuf {
    let path = dir.join("plaza.toml");
    std::fs::write(
        &path,
        format!(
            "[[webhooks]]\nname = \"backend\"\nurl = \"{url}\"\nsecret = \"{SECRET}\"\n\
             events = [\"message.published\"]\nchannels = [\"*\"]\n{extra}"
        ),
    )
    .unwrap();
    path
}

async fn until(limit: Duration, mut done: impl FnMut() -> bool) -> bool {
    let start = Instant::now();
    while start.elapsed() < limit {
        if done() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    done()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_receiver_down_for_a_minute_gets_every_event_in_order_per_room() {
    // The receiver's port, closed for now.
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let dir = tempfile::Builder::new()
        .prefix("plaza-webhook-down-")
        .tempdir()
        .unwrap();
    let config = config_file(dir.path(), &format!("http://127.0.0.1:{port}/hook"), "");
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
        redis_cluster: None,
    })
    .unwrap_or_else(|e| panic!("cannot start the cluster (run scripts/test.sh): {e}"));
    let http = reqwest::Client::new();
    let nodes = [cluster.node(0).url(), cluster.node(1).url()];
    let rooms = ["r1", "r2", "r3"];
    for room in rooms {
        let r = http
            .post(format!("{}/v1/rooms", nodes[0]))
            .json(&json!({"id": room}))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 201);
    }
    let mut published = 0;
    for i in 0..20 {
        for (k, room) in rooms.iter().enumerate() {
            let node = &nodes[(i + k) % 2];
            let r = http
                .post(format!("{node}/v1/rooms/{room}/publish"))
                .json(&json!({"event": "m", "data": i}))
                .send()
                .await
                .unwrap();
            assert_eq!(r.status(), 200);
            published += 1;
        }
    }
    // The outage is the scenario: a minute with nothing listening.
    tokio::time::sleep(Duration::from_secs(60)).await;
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port))
        .await
        .unwrap();
    let got = serve_receiver(listener, Duration::ZERO);
    // The backoff ceiling is 60 s by then: the next attempt is within it.
    let firsts = |got: &Bodies| -> BTreeMap<String, Vec<u64>> {
        let mut seen = std::collections::HashSet::new();
        let mut per_room: BTreeMap<String, Vec<u64>> = BTreeMap::new();
        for b in got.lock().unwrap().iter() {
            let (room, seq) = (
                b["data"]["room"].as_str().unwrap(),
                b["data"]["seq"].as_u64().unwrap(),
            );
            if seen.insert((room.to_owned(), seq)) {
                per_room.entry(room.to_owned()).or_default().push(seq);
            }
        }
        per_room
    };
    assert!(
        until(Duration::from_secs(120), || firsts(&got)
            .values()
            .map(Vec::len)
            .sum::<usize>()
            >= published)
        .await,
        "{:?}",
        firsts(&got)
    );
    for (room, seqs) in firsts(&got) {
        assert_eq!(seqs.len(), 20, "{room}: {seqs:?}");
        assert!(
            seqs.windows(2).all(|w| w[0] < w[1]),
            "{room} out of order: {seqs:?}"
        );
    }
    let mut retries = 0.0;
    for node in &nodes {
        let metrics = http
            .get(format!("{node}/metrics"))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        retries += metrics
            .lines()
            .find_map(|l| l.strip_prefix("plaza_webhook_retries_total{target=\"backend\"} "))
            .and_then(|v| v.trim().parse::<f64>().ok())
            .unwrap_or(0.0);
    }
    assert!(retries >= 3.0, "{retries} retries counted");
    cluster.stop().unwrap();
}

/// Member-to-member latency of `count` messages in one room of the node at
/// `addr`, in ms, sorted; panics unless every message arrived, in the order
/// sent.
async fn member_latencies(addr: &str, count: usize) -> Vec<f64> {
    let url = format!("ws://{addr}/v1/ws");
    let (mut sender, _) = tokio_tungstenite::connect_async(&url).await.unwrap();
    let (mut receiver, _) = tokio_tungstenite::connect_async(&url).await.unwrap();
    for (ws, name) in [(&mut sender, "s"), (&mut receiver, "r")] {
        let join = json!({"type": "join", "room": "lat", "name": name});
        ws.send(Message::text(join.to_string())).await.unwrap();
        loop {
            let Some(Ok(Message::Text(t))) = ws.next().await else {
                panic!("no joined")
            };
            if serde_json::from_str::<Value>(&t).unwrap()["type"] == "joined" {
                break;
            }
        }
    }
    let start = Instant::now();
    let reading = tokio::spawn(async move {
        let mut latencies = Vec::new();
        let mut last_sent = -1.0;
        while latencies.len() < count {
            let frame = tokio::time::timeout(Duration::from_secs(20), receiver.next())
                .await
                .expect("messages keep coming");
            let Some(Ok(Message::Text(t))) = frame else {
                continue;
            };
            let v: Value = serde_json::from_str(&t).unwrap();
            if v["type"] == "event" && v["kind"] == "message" {
                let sent = v["data"].as_f64().unwrap();
                assert!(sent > last_sent, "{sent} ms arrived after {last_sent} ms");
                last_sent = sent;
                latencies.push(start.elapsed().as_secs_f64() * 1000.0 - sent);
            }
        }
        latencies
    });
    for _ in 0..count {
        let at = start.elapsed().as_secs_f64() * 1000.0;
        let publish = json!({"type": "publish", "room": "lat", "event": "m", "data": at});
        sender
            .send(Message::text(publish.to_string()))
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let mut latencies = reading.await.unwrap();
    latencies.sort_by(f64::total_cmp);
    latencies
}

fn quantile(sorted: &[f64], q: f64) -> f64 {
    sorted[((sorted.len() - 1) as f64 * q).round() as usize]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_receiver_that_never_answers_does_not_hold_up_the_rooms() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/hook", listener.local_addr().unwrap());
    let got = serve_receiver(listener, Duration::from_secs(3600));
    let dir = tempfile::Builder::new()
        .prefix("plaza-webhook-slow-")
        .tempdir()
        .unwrap();
    let config = config_file(dir.path(), &url, "timeout_ms = 60000\n");
    let config = config.display().to_string();
    let plain = crate::support::start(&["--auto-create-rooms"], &[]);
    let hooked = crate::support::start(&["--auto-create-rooms", "--config", &config], &[]);
    let count = 300;
    let base = member_latencies(&plain.addr, count).await;
    let slow = member_latencies(&hooked.addr, count).await;
    let (base_p50, base_p99) = (quantile(&base, 0.5), quantile(&base, 0.99));
    let (slow_p50, slow_p99) = (quantile(&slow, 0.5), quantile(&slow, 0.99));
    println!(
        "member latency, ms: no webhooks p50 {base_p50:.2} p99 {base_p99:.2}; \
         receiver never answering p50 {slow_p50:.2} p99 {slow_p99:.2}"
    );
    // The receiver holds every request it got (max_in_flight rooms at most:
    // here the one room's head), so nothing was delivered meanwhile.
    let held = got.lock().unwrap().len();
    assert!(held >= 1, "the receiver got the webhook requests");
    let metrics = crate::support::http_get(&hooked.addr, "/metrics");
    assert!(
        metrics.contains("plaza_webhook_delivered_total{target=\"backend\"} 0"),
        "nothing delivered while the receiver holds its requests"
    );
    // Every message arrived, in order (member_latencies checks it), while
    // the receiver held the webhooks. How fast is printed above, not
    // asserted: a busy machine moves it, and speed belongs in a benchmark.
    assert_eq!(slow.len(), count);
    assert_eq!(base.len(), count);
}
