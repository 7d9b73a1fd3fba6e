//! Webhooks: a real receiver on a socket gets the node's events, signed per
//! Standard Webhooks (verified here with `hmac` independently), retried in
//! order per room, given up after `retry_for_ms`, dropped at `queue_max`.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use axum::http::{HeaderMap, StatusCode};
use base64::Engine as _;
use bytes::Bytes;
use hmac::{Hmac, Mac};
use plaza_server::{ServerConfig, WebhookEvent, WebhookKind, WebhookTarget, Webhooks};
use serde_json::{json, Value};
use sha2::Sha256;
use tokio::sync::{mpsc, Semaphore};

use crate::support::{TestServer, WAIT};

const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";

/// One request the receiver got, and what it answered.
#[derive(Debug, Clone)]
struct Received {
    headers: HeaderMap,
    body: Bytes,
    status: u16,
}

impl Received {
    fn header(&self, name: &str) -> &str {
        self.headers
            .get(name)
            .unwrap_or_else(|| panic!("no {name} header"))
            .to_str()
            .unwrap()
    }

    fn id(&self) -> &str {
        self.header("webhook-id")
    }

    fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap()
    }
}

/// How the receiver answers its `n`-th request (from 0) with this id.
type Answer = Arc<dyn Fn(&str, usize) -> u16 + Send + Sync>;

/// An HTTP receiver on 127.0.0.1: every request goes to `requests` as it
/// arrives; with a `gate`, the answers wait for a permit of it.
struct Receiver {
    url: String,
    requests: mpsc::UnboundedReceiver<Received>,
}

impl Receiver {
    async fn start(answer: Answer, gate: Option<Arc<Semaphore>>) -> Receiver {
        let (tx, requests) = mpsc::unbounded_channel();
        let count = Arc::new(AtomicUsize::new(0));
        let app = axum::Router::new().route(
            "/hook",
            axum::routing::post(move |headers: HeaderMap, body: Bytes| {
                let (tx, answer, gate) = (tx.clone(), answer.clone(), gate.clone());
                let n = count.fetch_add(1, Ordering::SeqCst);
                async move {
                    let id = headers
                        .get("webhook-id")
                        .and_then(|v| v.to_str().ok())
                        .unwrap_or("")
                        .to_owned();
                    let status = answer(&id, n);
                    let _ = tx.send(Received {
                        headers,
                        body,
                        status,
                    });
                    if let Some(gate) = gate {
                        let _open = gate.acquire().await.unwrap();
                    }
                    StatusCode::from_u16(status).unwrap()
                }
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await });
        Receiver {
            url: format!("http://{addr}/hook"),
            requests,
        }
    }

    async fn next(&mut self) -> Received {
        tokio::time::timeout(WAIT, self.requests.recv())
            .await
            .expect("a webhook request in time")
            .expect("the receiver runs")
    }

    /// Requests until every id of `ids` was answered 2xx.
    async fn until_delivered(&mut self, ids: &[&str]) -> Vec<Received> {
        let mut got = Vec::new();
        while !ids.iter().all(|id| {
            got.iter()
                .any(|r: &Received| r.id() == *id && r.status < 300)
        }) {
            got.push(self.next().await);
        }
        got
    }

    /// Nothing more arrives within `d` (for what must not come).
    async fn nothing_within(&mut self, d: Duration) {
        if let Ok(Some(r)) = tokio::time::timeout(d, self.requests.recv()).await {
            panic!("unexpected webhook request {}: {:?}", r.id(), r.body);
        }
    }
}

fn target(url: &str, edit: impl FnOnce(&mut WebhookTarget)) -> WebhookTarget {
    let mut t = WebhookTarget {
        name: "backend".into(),
        url: url.into(),
        secret: SECRET.into(),
        events: vec!["*".into()],
        ..WebhookTarget::default()
    };
    edit(&mut t);
    t
}

async fn node_with(target: WebhookTarget) -> TestServer {
    let config = ServerConfig {
        webhooks: vec![target],
        ..ServerConfig::default()
    };
    config.check_bounds().unwrap();
    TestServer::with_config(config).await
}

/// Polls `/metrics` until `sample` has `value` (counters move once the
/// answer is read, a moment after the receiver saw the request).
async fn wait_metric(server: &TestServer, sample: &str, value: f64) {
    let start = Instant::now();
    loop {
        let now = server.metric(sample).await;
        if now == Some(value) {
            return;
        }
        assert!(start.elapsed() < WAIT, "{sample} is {now:?}, never {value}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// The signature the Standard Webhooks spec gives for this request.
fn expected_signature(r: &Received) -> String {
    let key = base64::engine::general_purpose::STANDARD
        .decode(SECRET.strip_prefix("whsec_").unwrap())
        .unwrap();
    let mut mac = Hmac::<Sha256>::new_from_slice(&key).unwrap();
    mac.update(format!("{}.{}.", r.id(), r.header("webhook-timestamp")).as_bytes());
    mac.update(&r.body);
    format!(
        "v1,{}",
        base64::engine::general_purpose::STANDARD.encode(mac.finalize().into_bytes())
    )
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

fn metric(name: &str) -> String {
    format!("{name}{{target=\"backend\"}}")
}

#[tokio::test]
async fn created_and_deleted_rooms_are_posted_signed() {
    let mut rx = Receiver::start(Arc::new(|_, _| 204), None).await;
    let server = node_with(target(&rx.url, |_| {})).await;
    let room = server
        .create_room(json!({"id": "hooked", "name": "Hooked"}))
        .await;
    let created_at = room["created_at"].as_u64().unwrap();
    let (status, _) = server.delete("/v1/rooms/hooked").await;
    assert_eq!(status, 204);

    let created = rx.next().await;
    let deleted = rx.next().await;
    for r in [&created, &deleted] {
        assert_eq!(r.header("content-type"), "application/json");
        assert_eq!(r.header("webhook-signature"), expected_signature(r));
        let ts: u64 = r.header("webhook-timestamp").parse().unwrap();
        assert!(ts.abs_diff(unix_now()) <= 5, "webhook-timestamp {ts}");
        let body = r.json();
        let when = body["timestamp"].as_str().unwrap();
        // RFC 3339, UTC, milliseconds: 2025-05-01T12:00:00.123Z
        assert_eq!((when.len(), &when[10..11], &when[19..20]), (24, "T", "."));
        assert!(when.ends_with('Z'), "{when}");
        assert_eq!(body["data"]["room"], "hooked");
    }
    assert_eq!(created.id(), format!("hooked:created:{created_at}"));
    let body = created.json();
    assert_eq!(body["type"], "room.created");
    assert_eq!(body["data"]["name"], "Hooked");
    assert_eq!(body["data"]["created_at"], created_at);
    assert_eq!(body["data"]["access"], room["access"]);
    assert!(body["data"].get("id").is_none(), "{body}");
    assert!(
        deleted.id().starts_with("hooked:deleted:"),
        "{}",
        deleted.id()
    );
    let body = deleted.json();
    assert_eq!(body["type"], "room.deleted");
    assert_eq!(body["data"], json!({"room": "hooked"}));

    wait_metric(&server, &metric("plaza_webhook_delivered_total"), 2.0).await;
    wait_metric(&server, &metric("plaza_webhook_queue_depth"), 0.0).await;
    let text = server.get_text("/metrics").await.1;
    assert!(
        text.contains("plaza_webhook_delivery_seconds_count{target=\"backend\"} 2"),
        "{text}"
    );
    assert_eq!(
        server.metric(&metric("plaza_webhook_retries_total")).await,
        Some(0.0)
    );
}

#[tokio::test]
async fn failed_attempts_are_retried_and_every_room_stays_in_order() {
    // The first three requests fail, whichever they are.
    let mut rx = Receiver::start(Arc::new(|_, n| if n < 3 { 500 } else { 200 }), None).await;
    let server = node_with(target(&rx.url, |_| {})).await;
    let mut ids = Vec::new();
    for room in ["ra", "rb"] {
        let r = server.create_room(json!({"id": room})).await;
        ids.push(format!("{room}:created:{}", r["created_at"]));
    }
    for room in ["ra", "rb"] {
        assert_eq!(server.delete(&format!("/v1/rooms/{room}")).await.0, 204);
    }
    let mut got = rx.until_delivered(&[&ids[0], &ids[1]]).await;
    // The deleted events' ids carry the time: found by room and type.
    while ["ra", "rb"].iter().any(|room| {
        !got.iter().any(|r| {
            r.status == 200
                && r.json()["type"] == "room.deleted"
                && r.json()["data"]["room"] == *room
        })
    }) {
        got.push(rx.next().await);
    }
    assert_eq!(got.iter().filter(|r| r.status == 500).count(), 3);
    for room in ["ra", "rb"] {
        let kinds: Vec<(String, u16)> = got
            .iter()
            .filter(|r| r.json()["data"]["room"] == room)
            .map(|r| (r.json()["type"].as_str().unwrap().to_owned(), r.status))
            .collect();
        // Every attempt of `created` (the last one its 200) before `deleted`.
        let first_deleted = kinds.iter().position(|(k, _)| k == "room.deleted").unwrap();
        assert!(
            kinds[..first_deleted]
                .iter()
                .all(|(k, _)| k == "room.created")
                && kinds[first_deleted - 1].1 == 200
                && kinds[first_deleted..]
                    .iter()
                    .all(|(k, _)| k == "room.deleted"),
            "{room}: {kinds:?}"
        );
    }
    // The same id and body on every attempt of an event.
    for r in &got {
        let same: Vec<&Received> = got.iter().filter(|o| o.id() == r.id()).collect();
        assert!(same.iter().all(|o| o.body == r.body), "{}", r.id());
        assert_eq!(r.header("webhook-signature"), expected_signature(r));
    }
    wait_metric(&server, &metric("plaza_webhook_delivered_total"), 4.0).await;
    assert_eq!(
        server.metric(&metric("plaza_webhook_retries_total")).await,
        Some(3.0)
    );
    assert_eq!(
        server.metric(&metric("plaza_webhook_failed_total")).await,
        Some(0.0)
    );
    rx.nothing_within(Duration::from_millis(300)).await;
}

#[tokio::test]
async fn an_event_failing_past_retry_for_is_given_up_and_its_room_goes_on() {
    let mut rx = Receiver::start(
        Arc::new(|id, _| if id.contains(":created:") { 503 } else { 200 }),
        None,
    )
    .await;
    let server = node_with(target(&rx.url, |t| t.retry_for_ms = 1_000)).await;
    let started = Instant::now();
    server.create_room(json!({"id": "doomed"})).await;
    assert_eq!(server.delete("/v1/rooms/doomed").await.0, 204);
    let mut got = Vec::new();
    loop {
        let r = rx.next().await;
        let done = r.status == 200;
        got.push(r);
        if done {
            break;
        }
    }
    let (last, tries) = got.split_last().unwrap();
    assert_eq!(last.json()["type"], "room.deleted");
    assert!(tries.len() >= 2, "{} attempts", tries.len());
    assert!(tries.iter().all(|r| r.json()["type"] == "room.created"));
    // Given up no earlier than retry_for_ms after the first attempt.
    assert!(started.elapsed() >= Duration::from_millis(1_000));
    wait_metric(&server, &metric("plaza_webhook_delivered_total"), 1.0).await;
    assert_eq!(
        server.metric(&metric("plaza_webhook_failed_total")).await,
        Some(1.0)
    );
    assert_eq!(
        server.metric(&metric("plaza_webhook_retries_total")).await,
        Some(tries.len() as f64 - 1.0)
    );
    rx.nothing_within(Duration::from_millis(300)).await;
}

#[tokio::test]
async fn past_queue_max_events_are_dropped_and_counted() {
    let gate = Arc::new(Semaphore::new(0));
    let mut rx = Receiver::start(Arc::new(|_, _| 200), Some(gate.clone())).await;
    let server = node_with(target(&rx.url, |t| t.queue_max = 2)).await;
    for room in ["q1", "q2", "q3"] {
        server.create_room(json!({"id": room})).await;
    }
    // Both held events went out (two rooms at once) and wait for the gate.
    let a = rx.next().await;
    let b = rx.next().await;
    let mut rooms = [
        a.json()["data"]["room"].clone(),
        b.json()["data"]["room"].clone(),
    ];
    rooms.sort_by_key(|v| v.to_string());
    assert_eq!(rooms, [json!("q1"), json!("q2")]);
    assert_eq!(
        server.metric(&metric("plaza_webhook_dropped_total")).await,
        Some(1.0)
    );
    assert_eq!(
        server.metric(&metric("plaza_webhook_queue_depth")).await,
        Some(2.0)
    );
    gate.add_permits(1_000);
    wait_metric(&server, &metric("plaza_webhook_delivered_total"), 2.0).await;
    wait_metric(&server, &metric("plaza_webhook_queue_depth"), 0.0).await;
    rx.nothing_within(Duration::from_millis(300)).await;
}

/// `Webhooks` used directly, as the room machine will: only the types and
/// channels a target asked for are sent.
#[tokio::test]
async fn targets_get_only_the_types_and_channels_they_want() {
    let mut rx = Receiver::start(Arc::new(|_, _| 200), None).await;
    let metrics = plaza_server::metrics::NodeMetrics::new();
    let hooks = Webhooks::new(
        &[target(&rx.url, |t| {
            t.events = vec!["message.published".into(), "member.joined".into()];
            t.channels = vec!["chat".into()];
        })],
        &metrics,
    )
    .expect("a target");
    assert!(Webhooks::new(&[], &metrics).is_none());
    assert!(hooks.wants(WebhookKind::MessagePublished, Some("chat")));
    assert!(!hooks.wants(WebhookKind::MessagePublished, Some("main")));
    assert!(!hooks.wants(WebhookKind::LockAcquired, None));
    let event = |id: &str, kind, channel: Option<&str>| WebhookEvent {
        id: id.into(),
        kind,
        room: "r".into(),
        channel: channel.map(str::to_owned),
        timestamp_ms: 1_700_000_000_123,
        data: json!({"text": "hi"}),
    };
    hooks.emit(event("r:1:1", WebhookKind::MessagePublished, Some("main")));
    hooks.emit(event("r:1:2", WebhookKind::LockAcquired, None));
    hooks.emit(event("r:1:3", WebhookKind::MessagePublished, Some("chat")));
    hooks.emit(event("r:1:4", WebhookKind::MemberJoined, None));
    let got = rx.until_delivered(&["r:1:3", "r:1:4"]).await;
    assert_eq!(
        got.iter().map(Received::id).collect::<Vec<_>>(),
        ["r:1:3", "r:1:4"]
    );
    assert_eq!(
        got[0].json(),
        json!({
            "type": "message.published",
            "timestamp": "2023-11-14T22:13:20.123Z",
            "data": {"text": "hi", "room": "r", "channel": "chat"},
        })
    );
    rx.nothing_within(Duration::from_millis(200)).await;
}

/// The data of each received event, by type, in arrival order (room events only).
fn room_events(got: &[Received]) -> Vec<(String, Value)> {
    got.iter()
        .filter(|r| r.status < 300)
        .map(|r| {
            let v = r.json();
            (v["type"].as_str().unwrap().to_owned(), v["data"].clone())
        })
        .filter(|(t, _)| !t.starts_with("room."))
        .collect()
}

#[tokio::test]
async fn a_rooms_events_are_posted_once_each_in_order() {
    let mut rx = Receiver::start(Arc::new(|_, _| 200), None).await;
    let s = node_with(target(&rx.url, |t| t.channels = vec!["*".into()])).await;
    let room = s.create_room(json!({"id": "r"})).await;
    let (mut ann, aj) = s.join("r", "ann").await;
    let ann_session = aj["session"].as_str().unwrap().to_owned();
    ann.publish("r", "chat", json!({"text": "hi"})).await;
    let (res, _) = ann
        .request(
            "r",
            json!(1),
            "entity.create",
            json!({"kind": "note", "data": {"n": 1}}),
        )
        .await;
    let entity = res["result"]["entity"]["id"].as_str().unwrap().to_owned();
    ann.request("r", json!(2), "lock.acquire", json!({"object": entity}))
        .await;
    ann.request("r", json!(3), "lock.release", json!({"object": entity}))
        .await;
    ann.send(json!({"type": "leave", "room": "r"})).await;
    ann.recv_type("left").await;

    let epoch = aj["epoch"].as_u64().unwrap();
    let last = format!("r:{epoch}:6");
    let got = rx.until_delivered(&[&last]).await;
    let events = room_events(&got);
    let types: Vec<&str> = events.iter().map(|(t, _)| t.as_str()).collect();
    assert_eq!(
        types,
        [
            "member.joined",
            "message.published",
            "entity.created",
            "lock.acquired",
            "lock.released",
            "member.left"
        ],
        "{events:?}"
    );
    let ids: Vec<&str> = got
        .iter()
        .filter(|r| !r.json()["type"].as_str().unwrap().starts_with("room."))
        .map(Received::id)
        .collect();
    let want: Vec<String> = (1..=6).map(|seq| format!("r:{epoch}:{seq}")).collect();
    assert_eq!(ids, want, "ids are room:epoch:seq");
    let (_, joined) = &events[0];
    assert_eq!(joined["session"], ann_session.as_str());
    assert_eq!(
        (&joined["name"], &joined["room"]),
        (&json!("ann"), &json!("r"))
    );
    let (_, message) = &events[1];
    assert_eq!(message["channel"], "main");
    assert_eq!(message["data"], json!({"text": "hi"}));
    assert_eq!(message["from"], ann_session.as_str());
    let (_, created) = &events[2];
    assert_eq!(created["entity"]["data"], json!({"n": 1}));
    let (_, left) = &events[5];
    assert_eq!(
        (&left["session"], &left["reason"]),
        (&json!(ann_session), &json!("left"))
    );
    assert_eq!(room["id"], "r");
    rx.nothing_within(Duration::from_millis(300)).await;
}

/// In cluster mode every node hosting a room applies its events; only the
/// node that appended each one posts it.
#[tokio::test]
async fn a_cluster_posts_each_event_once() {
    let mut rx = Receiver::start(Arc::new(|_, _| 200), None).await;
    let hub = plaza_broker::MemoryCluster::new();
    let tickets = Arc::new(plaza_broker::MemoryTicketStore::new());
    let config = ServerConfig {
        webhooks: vec![target(&rx.url, |t| {
            t.events = vec!["member.joined".into(), "message.published".into()];
            t.channels = vec!["*".into()];
        })],
        ..ServerConfig::default()
    };
    let a = TestServer::clustered(config.clone(), tickets.clone(), hub.node("a")).await;
    let b = TestServer::clustered(config, tickets, hub.node("b")).await;
    a.create_room(json!({"id": "r"})).await;
    let (mut on_a, aj) = a.join("r", "ann").await;
    let (mut on_b, bj) = b.join("r", "bob").await;
    on_a.recv_event("presence.join").await;
    on_b.publish("r", "chat", json!(1)).await;
    on_a.recv_event("message").await;
    let epoch = aj["epoch"].as_u64().unwrap();
    let ids: Vec<String> = (1..=3).map(|seq| format!("r:{epoch}:{seq}")).collect();
    let refs: Vec<&str> = ids.iter().map(String::as_str).collect();
    let got = rx.until_delivered(&refs).await;
    let seen: Vec<&str> = got.iter().map(Received::id).collect();
    assert_eq!(seen, refs, "each once, in order");
    assert_eq!(got[1].json()["data"]["session"], bj["session"]);
    rx.nothing_within(Duration::from_millis(300)).await;
}
