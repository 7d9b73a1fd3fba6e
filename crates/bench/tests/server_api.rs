//! The server-API scenarios (issue 36), run briefly at a low rate against an
//! in-process Plaza: every publish the API answered reaches every member,
//! and every publish on a webhook-enabled channel reaches the run's webhook
//! receiver once.

use std::sync::Arc;
use std::time::Duration;

use plaza_bench::driver::PlazaDriver;
use plaza_bench::{run, Check, Report, RunOptions, Scenario};
use plaza_broker::MemoryTicketStore;
use plaza_server::{Node, ServerConfig, WebhookTarget};

fn scenario_file(name: &str) -> String {
    let path = format!(
        "{}/../../bench/scenarios/{name}",
        env!("CARGO_MANIFEST_DIR")
    );
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
}

fn set(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// Serves a fresh Plaza with `config` and runs `scenario` against it.
async fn run_against(config: ServerConfig, scenario: &Scenario) -> Report {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let node = Node::new(config, Arc::new(MemoryTicketStore::new()));
    tokio::spawn(plaza_server::serve(node, listener));
    run(
        scenario,
        RunOptions {
            addr,
            host: addr.to_string(),
            driver: Arc::new(PlazaDriver::default()),
            observers_per_room: 20,
            server_pid: Some(std::process::id()),
            bind: vec![],
            timeout: Duration::from_secs(10),
            progress: None,
            shard: None,
        },
    )
    .await
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_answered_api_publish_reaches_every_member() {
    // 2 rooms × (3 members + 2 callers), 40 calls/s each: 160 publishes/s.
    let overrides = set(&[
        ("rooms", "2"),
        ("members", "3"),
        ("publishers", "2"),
        ("per_room", "5"),
        ("per_publisher_s", "40"),
        ("warmup_s", "0.3"),
        ("measure_s", "1"),
        ("min_rate", "50"),
        ("p99_ms", "1000"),
    ]);
    let scenario = Scenario::parse(&scenario_file("server-publish.yaml"), &overrides).unwrap();
    let report = run_against(ServerConfig::default(), &scenario).await;

    assert_eq!(report.users, 10);
    assert_eq!(report.joined, 6, "the callers never join: {report:#?}");
    assert!(report.errors.is_empty(), "{:?}", report.errors);
    assert_eq!(report.http_failed, 0);
    let answered = report.api_publishes_total;
    assert!(answered >= 100, "{answered} publishes answered");
    assert_eq!(report.http_ok, answered, "every call was a publish");
    // Publishes answered = messages received: each by its room's 3 members.
    assert_eq!(report.expected_deliveries_total, answered * 3);
    assert_eq!(report.deliveries_total, answered * 3, "{report:#?}");
    assert_eq!(report.publishes_total, 0, "no WebSocket publishes");
    // Both timings: the API's answer and the call → member receipt.
    let api = report.http_rt.as_ref().expect("API answers timed");
    let e2e = report.latency.as_ref().expect("receipts timed");
    assert!(api.count > 0 && e2e.count > 0);
    assert!(
        e2e.count <= report.deliveries,
        "observers time what they get"
    );
    // The rate and the p99s are measured and checked against the scenario's
    // limits (their verdict is the benchmark's, not this test's).
    let measured: Vec<&str> = report
        .checks
        .iter()
        .filter(|c| c.is_speed() && c.value.is_some())
        .map(|c| c.name.as_str())
        .collect();
    assert_eq!(
        measured,
        ["latency_p99_ms", "http_p99_ms", "api_publishes_per_s"],
        "{:?}",
        report.checks
    );
    assert!(report.webhook_latency.is_none() && report.webhooks_expected_total == 0);
    assert!(report.server_cpu_percent.is_some());
    assert_eq!(report.behaviour_failures(), Vec::<&Check>::new());
    let md = report.markdown();
    assert!(md.contains("server-API publishes accepted/s"), "{md}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_publish_on_an_enabled_channel_reaches_the_webhook_receiver_once() {
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let listen = format!("127.0.0.1:{port}");
    let config = ServerConfig {
        webhooks: vec![WebhookTarget {
            name: "bench".into(),
            url: format!("http://{listen}/hook"),
            secret: "whsec_cGxhemEtYmVuY2gtd2ViaG9vay1rZXktMzItYnl0ZXM=".into(),
            events: vec!["message.published".into()],
            channels: vec!["hook".into()],
            ..WebhookTarget::default()
        }],
        ..ServerConfig::default()
    };
    config.check_bounds().unwrap();
    // The shipped scenario, each caller also publishing on a channel the
    // target does not want: those must not arrive.
    let yaml = scenario_file("webhook-delivery.yaml");
    let hook_step =
        r#"- api_publish: { room: "hook-{room}", channel: hook, bytes: "${payload_bytes}" }"#;
    assert!(yaml.contains(hook_step));
    let yaml = yaml.replace(
        hook_step,
        &format!(
            "{hook_step}\n            - api_publish: {{ room: \"hook-{{room}}\", channel: other, bytes: 50 }}"
        ),
    );
    let overrides = set(&[
        ("rooms", "4"),
        ("per_room_s", "25"),
        ("warmup_s", "0.3"),
        ("measure_s", "1"),
        ("min_rate", "20"),
        ("listen", &listen),
    ]);
    let scenario = Scenario::parse(&yaml, &overrides).unwrap();
    let report = run_against(config, &scenario).await;

    assert!(report.errors.is_empty(), "{:?}", report.errors);
    assert_eq!(report.http_failed, 0);
    let answered = report.api_publishes_total;
    assert!(answered >= 80, "{answered} publishes answered");
    // Each caller's iteration publishes on hook, then on other; the run's
    // end may cut a caller's last one between the two.
    let on_hook = report.webhooks_expected_total;
    assert!(
        (answered / 2..=answered / 2 + 4).contains(&on_hook),
        "{on_hook} of {answered} on hook"
    );
    // Webhook requests received = publishes on the enabled channel.
    assert_eq!(report.webhooks_received_total, on_hook, "{report:#?}");
    assert_eq!(report.webhooks_distinct_total, on_hook);
    assert_eq!(report.webhook_ratio, Some(1.0));
    assert_eq!(
        report.webhook_types.get("message.published"),
        Some(&on_hook),
        "{:?}",
        report.webhook_types
    );
    assert_eq!(report.webhook_types.len(), 1, "{:?}", report.webhook_types);
    let latency = report.webhook_latency.as_ref().expect("webhooks timed");
    assert!(latency.count > 0 && latency.count <= on_hook);
    assert!(report.webhooks_per_s > 0.0);
    // Nobody joined: no member deliveries expected.
    assert_eq!(report.expected_deliveries_total, 0);
    // The server's own count, read after the drain.
    let delivered = report
        .server_webhook_metrics
        .get("plaza_webhook_delivered_total{target=\"bench\"}")
        .copied();
    assert_eq!(
        delivered,
        Some(on_hook as f64),
        "{:?}",
        report.server_webhook_metrics
    );
    assert_eq!(report.behaviour_failures(), Vec::<&Check>::new());
    let md = report.markdown();
    assert!(md.contains("webhooks received/s"), "{md}");
    assert!(md.contains("server plaza_webhook_*"), "{md}");
}
