//! The status endpoint (`GET /v1/status`) and the status page (`GET /status`).

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use crate::support::{TestServer, WAIT};
use serde_json::{json, Value};

fn is_ms_or_null(v: &Value) -> bool {
    v.is_null() || v.as_f64().is_some_and(|x| x >= 0.0)
}

/// Checks every field of a status body has its documented type.
fn assert_shape(v: &Value) {
    let keys: BTreeSet<&str> = v.as_object().unwrap().keys().map(String::as_str).collect();
    let want: BTreeSet<&str> = [
        "node",
        "broker",
        "uptime_s",
        "connections",
        "rooms",
        "frames_in",
        "frames_out",
        "bytes_in",
        "bytes_out",
        "window_s",
        "messages_in_per_s",
        "messages_out_per_s",
        "delivery_latency_ms",
        "errors",
        "demo_tokens",
    ]
    .into();
    assert_eq!(keys, want, "{v}");
    assert!(v["demo_tokens"].is_boolean(), "{v}");
    assert!(v["node"].is_string(), "{v}");
    assert!(v["broker"].is_string(), "{v}");
    for k in [
        "uptime_s",
        "connections",
        "rooms",
        "frames_in",
        "frames_out",
        "bytes_in",
        "bytes_out",
    ] {
        assert!(v[k].is_u64(), "{k} is not an unsigned integer: {v}");
    }
    for k in ["window_s", "messages_in_per_s", "messages_out_per_s"] {
        assert!(
            v[k].as_f64().is_some_and(|x| x >= 0.0),
            "{k} is not a non-negative number: {v}"
        );
    }
    assert!(v["window_s"].as_f64().unwrap() <= 5.5, "{v}");
    let lat = v["delivery_latency_ms"].as_object().unwrap();
    let keys: BTreeSet<&str> = lat.keys().map(String::as_str).collect();
    assert_eq!(keys, ["max", "p50", "p90", "p99"].into(), "{v}");
    for (k, x) in lat {
        assert!(is_ms_or_null(x), "latency {k}: {v}");
    }
    let errors = v["errors"].as_object().unwrap();
    assert!(errors["total"].is_u64(), "{v}");
    let by_code = errors["by_code"].as_object().unwrap();
    let sum: u64 = by_code.values().map(|n| n.as_u64().unwrap()).sum();
    assert_eq!(errors["total"].as_u64().unwrap(), sum, "{v}");
}

async fn status(s: &TestServer) -> Value {
    let (code, v) = s.get("/v1/status").await;
    assert_eq!(code, 200, "{v}");
    assert_shape(&v);
    v
}

/// Polls `/v1/status` until `cond` holds (bounded by [`WAIT`]); returns the last body.
async fn status_until(s: &TestServer, what: &str, cond: impl Fn(&Value) -> bool) -> Value {
    let start = Instant::now();
    loop {
        let v = status(s).await;
        if cond(&v) {
            return v;
        }
        assert!(start.elapsed() < WAIT, "status never showed {what}: {v}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn a_fresh_node_reports_every_field() {
    let s = TestServer::start().await;
    let v = status(&s).await;
    assert_eq!(v["node"], s.node.id());
    assert_eq!(v["broker"], "memory");
    for k in [
        "connections",
        "rooms",
        "frames_in",
        "frames_out",
        "bytes_in",
        "bytes_out",
    ] {
        assert_eq!(v[k], 0, "{k}: {v}");
    }
    assert_eq!(v["errors"], json!({"total": 0, "by_code": {}}));
    // Nothing delivered yet: no latency, and the rates are zero.
    assert_eq!(
        v["delivery_latency_ms"],
        json!({"p50": null, "p90": null, "p99": null, "max": null})
    );
    assert_eq!(v["messages_in_per_s"], 0.0);
    assert_eq!(v["messages_out_per_s"], 0.0);
    // The sampler ticks once a second: the window soon covers some time.
    status_until(&s, "a window", |v| v["window_s"].as_f64().unwrap() > 0.0).await;
}

#[tokio::test]
async fn traffic_shows_in_totals_rates_and_latency() {
    const N: u64 = 20;
    let s = TestServer::start().await;
    s.create_room(json!({"id": "r"})).await;
    let mut c = s.join_all("r", &["ann", "bob"]).await;
    let (mut bob, _) = c.pop().unwrap();
    let (mut ann, _) = c.pop().unwrap();
    for i in 0..N {
        ann.publish("r", "move", json!({"i": i})).await;
    }
    for i in 0..N {
        let (ev, _) = bob.recv_event("message").await;
        assert_eq!(ev["data"]["i"], i, "{ev}");
    }

    let v = status(&s).await;
    assert_eq!(v["connections"], 2, "{v}");
    assert_eq!(v["rooms"], 1, "{v}");
    // In: 2 joins, N publishes and join_all's two pings.
    let frames_in = v["frames_in"].as_u64().unwrap();
    assert!(frames_in >= 2 + N, "{v}");
    // Out: 2 joined, 1 presence.join, N acks to ann, N events to bob.
    let frames_out = v["frames_out"].as_u64().unwrap();
    assert!(frames_out >= 3 + 2 * N, "{v}");
    assert!(v["bytes_in"].as_u64().unwrap() > frames_in, "{v}");
    assert!(v["bytes_out"].as_u64().unwrap() > frames_out, "{v}");

    // Rates and latency come from the once-a-second samples: poll for them.
    let v = status_until(&s, "the traffic's rates and latency", |v| {
        v["messages_in_per_s"].as_f64().unwrap() > 0.0
            && v["messages_out_per_s"].as_f64().unwrap() > 0.0
            && !v["delivery_latency_ms"]["max"].is_null()
    })
    .await;
    let lat = &v["delivery_latency_ms"];
    let q = |k: &str| lat[k].as_f64().unwrap_or_else(|| panic!("{k}: {v}"));
    assert!(
        q("p50") <= q("p90") && q("p90") <= q("p99") && q("p99") <= q("max"),
        "{v}"
    );
    // The rates cannot exceed what was sent over the window.
    let window = v["window_s"].as_f64().unwrap();
    assert!(window > 0.0, "{v}");
    let total_in = v["frames_in"].as_f64().unwrap();
    assert!(
        v["messages_in_per_s"].as_f64().unwrap() * window <= total_in + 0.5,
        "{v}"
    );

    // Errors sent to clients are counted by code.
    ann.send_raw("not json").await;
    assert_eq!(ann.recv_type("error").await["code"], "bad_json");
    let v = status_until(&s, "the error", |v| v["errors"]["total"] == 1).await;
    assert_eq!(v["errors"]["by_code"], json!({"bad_json": 1}), "{v}");

    // Leaving shows too.
    drop(ann);
    drop(bob);
    status_until(&s, "no connections", |v| v["connections"] == 0).await;
}

#[tokio::test]
async fn the_status_page_is_served_and_linked() {
    let s = TestServer::start().await;
    let r = s.http.get(s.url("/status")).send().await.unwrap();
    assert_eq!(r.status(), 200);
    let ct = r.headers()["content-type"].to_str().unwrap().to_owned();
    assert!(ct.starts_with("text/html"), "{ct}");
    let page = r.text().await.unwrap();
    assert!(page.contains("<title>Plaza status</title>"));
    assert!(page.contains(r#"fetch("/v1/status""#));
    assert!(page.contains("<canvas"));
    // Self-contained: no external scripts, styles or images.
    assert!(!page.contains("src=\"http"), "external resource");
    assert!(!page.contains("href=\"http"), "external resource");
    let (status, index) = s.get_text("/").await;
    assert_eq!(status, 200);
    assert!(
        index.contains(r#"href="/status""#),
        "the index links to /status"
    );
}
