//! No room stalls the node (the real binary): the settings that once wedged
//! it are refused, and the worst room the bounds allow, driven flat out,
//! leaves `/healthz`, `/metrics`, another room and SIGTERM answering.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::{SinkExt, StreamExt};
use serde_json::{json, Value};
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};

use crate::support::{exit_within, http_get, http_post, start};

type Ws = WebSocketStream<MaybeTlsStream<TcpStream>>;

/// How long an answer may take while the worst room runs: a deadline for an
/// answer that takes milliseconds, generous enough for a 2-core debug build
/// sharing the machine with other work (3 s was not, issue 44), and still a
/// stall detector: the node that wedged never answered.
const PROMPT: Duration = Duration::from_secs(15);

/// Members of the worst room: every pair of them in proximity.
const CROWD: usize = 120;

async fn send(ws: &mut Ws, v: Value) {
    ws.send(Message::text(v.to_string())).await.unwrap();
}

/// The next frame that `want` accepts (the frames before it are dropped).
async fn recv_until(ws: &mut Ws, want: impl Fn(&Value) -> bool) -> Value {
    loop {
        let msg = tokio::time::timeout(Duration::from_secs(30), ws.next())
            .await
            .expect("a frame within 30 s")
            .expect("the connection is open")
            .unwrap();
        if let Message::Text(t) = msg {
            let v: Value = serde_json::from_str(&t).unwrap();
            if want(&v) {
                return v;
            }
        }
    }
}

async fn joined(addr: &str, room: &str, name: &str) -> Ws {
    let (mut ws, _) = tokio_tungstenite::connect_async(format!("ws://{addr}/v1/ws"))
        .await
        .unwrap();
    send(&mut ws, json!({"type": "join", "room": room, "name": name})).await;
    let j = recv_until(&mut ws, |v| v["type"] == "joined" || v["type"] == "error").await;
    assert_eq!(j["type"], "joined", "{j}");
    ws
}

async fn request(ws: &mut Ws, room: &str, nonce: u64, op: &str, args: Value) -> Value {
    send(
        ws,
        json!({"type": "request", "room": room, "nonce": nonce, "op": op, "args": args}),
    )
    .await;
    recv_until(ws, |v| v["type"] == "response" && v["nonce"] == nonce).await
}

/// Runs `f` on a blocking thread and returns what it took.
async fn timed<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> (T, Duration) {
    let t = Instant::now();
    let out = tokio::task::spawn_blocking(f).await.unwrap();
    (out, t.elapsed())
}

#[test]
fn the_worst_allowed_room_run_flat_out_starves_nothing() {
    let mut p = start(&["--shutdown-grace-ms", "3000"], &[]);
    let addr = p.addr.clone();

    // The request that wedged the node: refused, naming the field and its bounds.
    let r = http_post(
        &addr,
        "/v1/rooms",
        r#"{"id":"big","options":{"space":{"width":1e308,"height":1e308,"aoi_radius":1e308}}}"#,
    );
    assert!(r.starts_with("HTTP/1.1 400"), "{r}");
    assert!(
        r.contains("invalid_request") && r.contains("space.width") && r.contains("1e9"),
        "{r}"
    );

    // The worst the bounds allow: the largest plane with the most grid cells,
    // the shortest tick, no dwell, one spot for everyone (every pair in
    // proximity), and walks at the fastest speed allowed.
    let side = 1e9_f64;
    let r = http_post(
        &addr,
        "/v1/rooms",
        &json!({"id": "worst", "options": {"space": {
            "width": side, "height": side, "aoi_radius": 1e5, "proximity_radius": 1e5,
            "hysteresis": 1.0, "min_dwell_ms": 0, "tick_ms": 10}}})
        .to_string(),
    );
    assert!(r.starts_with("HTTP/1.1 201"), "{r}");
    let fastest = side.hypot(side) * 1000.0 / 10.0;
    let r = http_post(&addr, "/v1/rooms", r#"{"id":"calm"}"#);
    assert!(r.starts_with("HTTP/1.1 201"), "{r}");

    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let mut crowd = Vec::new();
        for i in 0..CROWD {
            crowd.push(joined(&addr, "worst", &format!("m{i}")).await);
        }
        // One past the fastest allowed is refused, naming the bound.
        let r = request(
            &mut crowd[0],
            "worst",
            1,
            "space.move",
            json!({"to": [0, 0], "speed": fastest * 1.01}),
        )
        .await;
        assert_eq!(r["error"]["code"], "invalid_args", "{r}");
        assert!(
            r["error"]["message"].as_str().unwrap().contains("speed"),
            "{r}"
        );
        for (i, ws) in crowd.iter_mut().enumerate() {
            let r = request(ws, "worst", 2, "space.jump", json!({"to": [side / 2.0, side / 2.0]}))
                .await;
            assert_eq!(r["ok"], true, "member {i}: {r}");
        }

        // Flat out: each member walks corner to corner at the fastest speed,
        // the next walk as soon as the last is answered, until the node goes.
        let moves = Arc::new(AtomicU64::new(0));
        for (i, mut ws) in crowd.into_iter().enumerate() {
            let moves = moves.clone();
            tokio::spawn(async move {
                for nonce in 10u64.. {
                    let corner = if (nonce + i as u64).is_multiple_of(2) { 0.0 } else { side };
                    let walk = json!({"type": "request", "room": "worst", "nonce": nonce,
                        "op": "space.move", "args": {"to": [corner, side - corner], "speed": fastest}});
                    if ws.send(Message::text(walk.to_string())).await.is_err() {
                        return;
                    }
                    loop {
                        let Some(Ok(msg)) = ws.next().await else { return };
                        let Message::Text(t) = msg else { continue };
                        let v: Value = serde_json::from_str(&t).unwrap();
                        if v["type"] == "response" && v["nonce"] == nonce {
                            assert_eq!(v["ok"], true, "{v}");
                            moves.fetch_add(1, Ordering::Relaxed);
                            break;
                        }
                    }
                }
            });
        }

        // Meanwhile: another room, /healthz and /metrics answer promptly.
        let walks_before = moves.load(Ordering::Relaxed);
        let mut calm = joined(&addr, "calm", "calm").await;
        for round in 0..10u64 {
            let t = Instant::now();
            send(
                &mut calm,
                json!({"type": "publish", "room": "calm", "event": "e", "data": round}),
            )
            .await;
            let ack = recv_until(&mut calm, |v| v["type"] == "ack").await;
            assert!(ack["seq"].is_u64(), "{ack}");
            let took = t.elapsed();
            assert!(took < PROMPT, "a publish in another room took {took:?}");
            let a = addr.clone();
            let (health, took) = timed(move || http_get(&a, "/healthz")).await;
            assert!(health.starts_with("HTTP/1.1 200"), "{health}");
            assert!(took < PROMPT, "/healthz took {took:?}");
            let a = addr.clone();
            let (metrics, took) = timed(move || http_get(&a, "/metrics")).await;
            assert!(metrics.contains("plaza_rooms"), "{metrics}");
            assert!(took < PROMPT, "/metrics took {took:?}");
        }

        assert!(
            moves.load(Ordering::Relaxed) > walks_before,
            "the crowd walked while the probes ran"
        );
        // SIGTERM while the room still runs flat out: the node exits within
        // its grace (3 s), with a margin for a loaded machine.
        unsafe { libc::kill(p.child.id() as i32, libc::SIGTERM) };
        let status = exit_within(
            &mut p.child,
            Duration::from_secs(8),
            "within its grace after SIGTERM",
        )
        .await;
        assert!(status.success(), "exit status {status:?}");
        eprintln!(
            "{} walks in the worst room, {walks_before} before the probes",
            moves.load(Ordering::Relaxed)
        );
    });
}
