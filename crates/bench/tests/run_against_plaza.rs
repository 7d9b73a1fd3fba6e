//! A small scenario against an in-process Plaza: every publish reaches every
//! other member, and the runner's count says exactly that.

use std::sync::Arc;
use std::time::Duration;

use plaza_bench::driver::PlazaDriver;
use plaza_bench::{run, Check, RunOptions, Scenario};
use plaza_broker::MemoryTicketStore;
use plaza_server::{Node, ServerConfig};

const SCENARIO: &str = r#"
name: count-check
params: { members: 6, rooms: 2, publishes: 5 }
rooms: ${rooms}
phases:
  - { name: join, arrival_rate: 200, users: 12 }
  - { name: publish, duration_s: 0.5, record: true }
flows:
  - name: member
    steps:
      - connect
      - join: { room: "count-{room}" }
      - wait_all_joined
      - loop:
          count: ${publishes}
          every_ms: 20
          steps:
            - publish: { bytes: 100 }
      - request: { op: entity.create, args: { kind: "note", data: { by: "{vu}" } } }
      - idle
expect: { delivery_ratio: 1.0, error_rate: 0.0 }
drain: { quiet_ms: 300, max_ms: 10000 }
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_publish_is_counted_once_for_every_other_member() {
    count_check(Arc::new(PlazaDriver::default())).await;
}

/// With `plaza.v1.compact` the same messages arrive, counted the same, in
/// fewer bytes: 72 fewer for every delivery of a message on main.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compact_messages_are_counted_the_same_in_fewer_bytes() {
    let (plain, plain_out) = count_check(Arc::new(PlazaDriver::default())).await;
    let (compact, compact_out) =
        count_check(plaza_bench::driver::by_name("plaza-compact").unwrap()).await;
    assert_eq!(plain.deliveries_total, compact.deliveries_total);
    // What the server wrote in all (not only while recording), so timing
    // cannot move it: every delivery of a message on main is 72 bytes
    // shorter, all else is the same size.
    let saved = plain_out as i64 - compact_out as i64;
    assert!(
        saved >= compact.deliveries_total as i64 * 70,
        "plain {plain_out} bytes, compact {compact_out} bytes, {} deliveries",
        compact.deliveries_total
    );
}

/// Runs [`SCENARIO`] against a fresh in-process Plaza with `driver`, checks
/// that every publish was counted once for every other member, and returns
/// the report and the bytes the server wrote.
async fn count_check(driver: Arc<dyn plaza_bench::driver::Driver>) -> (plaza_bench::Report, u64) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let node = Node::new(ServerConfig::default(), Arc::new(MemoryTicketStore::new()));
    tokio::spawn(plaza_server::serve(node.clone(), listener));

    let scenario = Scenario::parse(SCENARIO, &[]).unwrap();
    let told = Arc::new(std::sync::Mutex::new(Vec::new()));
    let tell = told.clone();
    let report = run(
        &scenario,
        RunOptions {
            addr,
            host: addr.to_string(),
            driver,
            observers_per_room: 2,
            server_pid: Some(std::process::id()),
            bind: vec![],
            timeout: Duration::from_secs(10),
            progress: Some(Arc::new(move |p: &plaza_bench::Progress| {
                tell.lock().unwrap().push((p.phase.clone(), p.users));
            })),
            shard: None,
        },
    )
    .await
    .unwrap();
    // Progress is told at every phase edge at least.
    let told = told.lock().unwrap().clone();
    assert!(told.iter().any(|(phase, _)| phase == "publish"), "{told:?}");
    assert!(told.iter().all(|&(_, users)| users == 12));

    // 12 users in 2 rooms of 6, 5 publishes each, 5 other members per room.
    assert_eq!(report.users, 12);
    assert_eq!(report.joined, 12, "{report:#?}");
    assert_eq!(report.publishes_total, 60);
    assert_eq!(report.expected_deliveries_total, 60 * 5);
    assert_eq!(report.deliveries_total, 300, "{report:#?}");
    assert_eq!(report.acks, 60);
    assert_eq!(report.requests_ok, 12);
    assert!(report.errors.is_empty(), "{:?}", report.errors);
    assert_eq!(report.behaviour_failures(), Vec::<&Check>::new());
    // Observers timed what they received while recording.
    let latency = report
        .latency
        .as_ref()
        .expect("observers recorded latencies");
    assert!(latency.count > 0 && latency.count <= 2 * 2 * 5 * 5);
    assert!(report.server_cpu_us_per_delivery.is_some());
    assert!(report.markdown().contains("count-check"));
    // The server's own account of where the time went, from its /metrics
    // (this process is the server): commands waited for their rooms, and
    // events went from their rooms to socket writes, while recording.
    let stages = report.server_stages.expect("Plaza reports its stages");
    assert!(stages.room_wait_samples >= 1, "{stages:?}");
    assert!(stages.to_write_samples >= 1, "{stages:?}");
    let (wait, write) = (stages.room_wait_ms.unwrap(), stages.to_write_ms.unwrap());
    assert!(
        wait >= 0.0 && (0.0..10_000.0).contains(&write),
        "{stages:?}"
    );
    assert!(report.markdown().contains("in the server (its /metrics)"));
    // From the first publish to the last message received: at least the
    // 5 publishes 20 ms apart, at most the run.
    let ws = report.ws_duration_s.expect("WebSocket traffic");
    assert!((0.08..30.0).contains(&ws), "{ws} s");
    assert_eq!(report.http_duration_s, None);
    // The rooms exist, with their members still in them.
    let rooms = node.list_rooms().await.unwrap().rooms;
    assert_eq!(rooms.len(), 2);
    (report, node.status().bytes_out)
}

const JOIN_ONLY: &str = r#"
name: join-only
rooms: 1
phases:
  - { name: join, arrival_rate: 100, users: 3 }
  - { name: hold, duration_s: 0.2, record: true }
flows:
  - name: member
    steps: [connect, { join: { room: "locked-{room}" } }, idle]
expect: { delivery_ratio: 1.0 }
drain: { quiet_ms: 100, max_ms: 1000 }
"#;

fn options(addr: std::net::SocketAddr, driver: Arc<dyn plaza_bench::driver::Driver>) -> RunOptions {
    RunOptions {
        addr,
        host: addr.to_string(),
        driver,
        observers_per_room: 1,
        server_pid: None,
        bind: vec![],
        timeout: Duration::from_secs(5),
        progress: None,
        shard: None,
    }
}

#[tokio::test]
async fn refused_joins_are_errors_and_fail_the_expectations() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let node = Node::new(ServerConfig::default(), Arc::new(MemoryTicketStore::new()));
    tokio::spawn(plaza_server::serve(node, listener));
    // The room exists already (setup's 409 is fine) and admits ticket holders only.
    let created = reqwest::Client::new()
        .post(format!("http://{addr}/v1/rooms"))
        .json(&serde_json::json!({"id": "locked-0", "options": {"access": "ticket"}}))
        .send()
        .await
        .unwrap();
    assert_eq!(created.status(), 201);

    let scenario = Scenario::parse(JOIN_ONLY, &[]).unwrap();
    let report = run(&scenario, options(addr, Arc::new(PlazaDriver::default())))
        .await
        .unwrap();
    assert_eq!(report.joined, 0);
    let refused: u64 = report
        .errors
        .iter()
        .filter(|(k, _)| k.starts_with("join: join refused"))
        .map(|(_, v)| v)
        .sum();
    assert_eq!(refused, 3, "{:?}", report.errors);
    assert!(
        report.warnings.iter().any(|w| w.contains("0 of 3")),
        "{:?}",
        report.warnings
    );
    assert!(!report.passed, "no deliveries cannot meet delivery_ratio");
    assert!(report.markdown().contains("FAIL"));
}

#[tokio::test]
async fn an_unreachable_target_fails_setup_or_counts_connect_errors() {
    let addr = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap()
    };
    let scenario = Scenario::parse(JOIN_ONLY, &[]).unwrap();
    // Plaza needs its rooms created first: the run cannot start.
    let e = run(&scenario, options(addr, Arc::new(PlazaDriver::default())))
        .await
        .unwrap_err();
    assert!(e.to_string().starts_with("setup:"), "{e}");
    // A plain relay has no setup: every user fails to connect, and says so.
    let report = run(
        &scenario,
        options(addr, Arc::new(plaza_bench::driver::BroadcastDriver)),
    )
    .await
    .unwrap();
    assert_eq!(report.joined, 0);
    assert_eq!(
        report.errors.get("connect: connection refused"),
        Some(&3),
        "{:?}",
        report.errors
    );
}

/// The cross-platform shape in small: per room 2 browser and 2 XR users
/// (mixed within the room), XR users publishing poses on the `xr` channel in
/// parallel with the usage loop. Poses reach only the other XR member; the
/// usage messages reach every other member.
const CROSS_PLATFORM: &str = r#"
name: channel-count
params: { per_room: 4 }
rooms: 2
phases:
  - { name: join, arrival_rate: 200, users_per_room: "${per_room}" }
  - { name: run, duration_s: 1.0, record: true }
flows:
  - name: browser
    steps:
      - connect
      - join: { room: "cp-{room}" }
      - wait_all_joined
      - loop: { count: 1, steps: &usage [ { publish: { event: a } }, { request: { op: entity.create, args: { kind: popup } } }, { publish: { event: b } } ] }
      - idle
  - name: xr
    steps:
      - connect
      - join: { room: "cp-{room}", platform: xr, channels: [xr] }
      - wait_all_joined
      - parallel:
          - - loop: { count: 1, steps: *usage }
          - - loop: { count: 5, every_ms: 10, steps: [ { publish: { channel: xr, event: pose } } ] }
      - idle
expect: { delivery_ratio: 1.0, error_rate: 0.0 }
drain: { quiet_ms: 300, max_ms: 10000 }
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn channel_publishes_count_only_subscribers_and_parallel_branches_both_run() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let node = Node::new(ServerConfig::default(), Arc::new(MemoryTicketStore::new()));
    tokio::spawn(plaza_server::serve(node.clone(), listener));
    let scenario = Scenario::parse(CROSS_PLATFORM, &[]).unwrap();
    assert_eq!(scenario.phases[0].users, Some(8), "users_per_room × rooms");
    let report = run(&scenario, options(addr, Arc::new(PlazaDriver::default())))
        .await
        .unwrap();
    assert_eq!(report.joined, 8, "{report:#?}");
    // Per room: 4 users × 2 main publishes × 3 others = 24, and 2 XR users ×
    // 5 poses × 1 other XR member = 10.
    assert_eq!(report.publishes_total, 2 * (4 * 2 + 2 * 5));
    assert_eq!(report.expected_deliveries_total, 2 * (24 + 10));
    assert_eq!(report.deliveries_total, 68, "{report:#?}");
    assert_eq!(report.requests_ok, 8);
    assert!(report.errors.is_empty(), "{:?}", report.errors);
    assert_eq!(report.behaviour_failures(), Vec::<&Check>::new());
}

/// The idle-capacity shape in small: everyone joins and idles, then the
/// room's first user publishes once when the recorded phase starts, and every
/// other member times it.
const ONE_BROADCAST: &str = r#"
name: one-broadcast
rooms: 1
phases:
  - { name: join, arrival_rate: 200, users: 5 }
  - { name: settle, duration_s: 0.1 }
  - { name: broadcast, duration_s: 0.5, record: true }
flows:
  - name: member
    steps:
      - connect
      - join: { room: "idle-{room}" }
      - wait_all_joined
      - wait_phase: broadcast
      - leader: [ { publish: { event: announce } } ]
      - idle
expect: { delivery_ratio: 1.0, error_rate: 0.0 }
drain: { quiet_ms: 300, max_ms: 10000 }
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_leader_publishes_once_when_the_phase_starts_and_everyone_times_it() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let node = Node::new(ServerConfig::default(), Arc::new(MemoryTicketStore::new()));
    tokio::spawn(plaza_server::serve(node.clone(), listener));
    let scenario = Scenario::parse(ONE_BROADCAST, &[]).unwrap();
    let mut opts = options(addr, Arc::new(PlazaDriver::default()));
    opts.observers_per_room = 5;
    opts.server_pid = Some(std::process::id());
    let report = run(&scenario, opts).await.unwrap();
    assert_eq!(report.publishes_total, 1, "{report:#?}");
    assert_eq!(report.publishes, 1, "sent inside the recorded phase");
    assert_eq!(report.deliveries_total, 4);
    let latency = report.latency.as_ref().expect("timed");
    assert_eq!(latency.count, 4, "every other member timed it");
    assert!(latency.min_ms <= latency.max_ms);
    assert!(report.server_rss_start_kib.is_some());
    assert!(report.server_rss_per_user_kib.is_some());
    assert_eq!(report.behaviour_failures(), Vec::<&Check>::new());
}

/// HTTP steps: each user creates a room over the API (201), reads it back
/// (any 2xx), and asks for one that does not exist (a failed call: 404).
const HTTP_CALLS: &str = r#"
name: http-calls
rooms: 1
phases:
  - { name: run, arrival_rate: 100, users: 4, record: true }
  # Recording lasts until the last call is answered (a fixed rest of 0.2 s
  # missed calls on a loaded machine).
  - { name: rest, duration_s: 60, until_done: true, record: true }
flows:
  - name: api
    steps:
      - http: { method: POST, path: /v1/rooms, body: { id: "h-{vu}" }, status: 201 }
      - http: { path: "/v1/rooms/h-{vu}" }
      - http: { path: "/v1/rooms/missing-{vu}" }
expect: { http_p95_ms: 10000 }
drain: { quiet_ms: 100, max_ms: 1000 }
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_steps_are_timed_and_unexpected_statuses_fail() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let node = Node::new(ServerConfig::default(), Arc::new(MemoryTicketStore::new()));
    tokio::spawn(plaza_server::serve(node.clone(), listener));
    let scenario = Scenario::parse(HTTP_CALLS, &[]).unwrap();
    let report = run(&scenario, options(addr, Arc::new(PlazaDriver::default())))
        .await
        .unwrap();
    assert_eq!(report.http_ok, 8, "{report:#?}");
    assert_eq!(report.http_failed, 4);
    assert_eq!(report.errors.get("http: status 404 Not Found"), Some(&4));
    assert_eq!(report.http_rt.as_ref().map(|l| l.count), Some(8));
    assert_eq!(
        node.list_rooms().await.unwrap().rooms.len(),
        4,
        "every POST created its room"
    );
    // The scenario's limit on the calls' p95 is checked against a measured
    // value (whether it held is the benchmark's business).
    assert!(
        report
            .checks
            .iter()
            .any(|c| c.name == "http_p95_ms" && c.value.is_some()),
        "{:?}",
        report.checks
    );
    assert_eq!(report.behaviour_failures(), Vec::<&Check>::new());
}

/// Runs `bench/scenarios/{file}` with `set` against a fresh in-process
/// Plaza that creates rooms on the first join, every user observing.
async fn run_scenario_file(file: &str, set: &[(&str, &str)]) -> plaza_bench::Report {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let node = Node::new(
        ServerConfig {
            auto_create_rooms: true,
            ..ServerConfig::default()
        },
        Arc::new(MemoryTicketStore::new()),
    );
    tokio::spawn(plaza_server::serve(node.clone(), listener));
    let yaml = std::fs::read_to_string(format!(
        "{}/../../bench/scenarios/{file}",
        env!("CARGO_MANIFEST_DIR")
    ))
    .unwrap();
    let set: Vec<(String, String)> = set
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    let scenario = Scenario::parse(&yaml, &set).unwrap();
    run(
        &scenario,
        RunOptions {
            addr,
            host: addr.to_string(),
            driver: Arc::new(PlazaDriver::default()),
            observers_per_room: 100,
            server_pid: None,
            bind: vec![],
            timeout: Duration::from_secs(10),
            progress: None,
            shard: None,
        },
    )
    .await
    .unwrap()
}

/// The chat-replay scenario, short: `overrides` on top of a small room.
async fn chat_replay(overrides: &[(&str, &str)]) -> plaza_bench::Report {
    let set: Vec<(&str, &str)> = [
        ("members", "24"),
        ("arrival_rate", "100"),
        ("chat_s", "3"),
        ("per_stream_per_s", "4"),
        ("reply_ratio", "0.5"),
        ("volume", "6"),
    ]
    .iter()
    .chain(overrides)
    .copied()
    .collect();
    run_scenario_file("chat-replay.yaml", &set).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chat_replay_holds_by_volume_answers_replies_at_once_and_loses_nothing() {
    let held = chat_replay(&[]).await;
    assert!(held.errors.is_empty(), "{:?}", held.errors);
    assert_eq!(held.joined, 24);
    assert!(held.publishes_total > 40, "{held:#?}");
    // Everything arrives (what is still held at the end comes with the
    // policy.clear), once.
    let ratio = held.delivery_ratio.unwrap();
    assert!((0.99..=1.01).contains(&ratio), "{held:#?}");
    // Replies to a member's own messages were sent and timed at their authors.
    let replies = held.reply_latency.as_ref().expect("replies were timed");
    assert!(replies.count > 5, "{replies:?}");
    assert!(held.chat_replies >= replies.count, "{held:#?}");
    // Held messages come in batches: far fewer frames than messages.
    assert!(
        held.frames_in_per_s * 2.0 < held.received_per_s,
        "{} frames/s for {} deliveries/s",
        held.frames_in_per_s,
        held.received_per_s
    );

    let plain = chat_replay(&[("policy", "false")]).await;
    assert!(plain.errors.is_empty(), "{:?}", plain.errors);
    let ratio = plain.delivery_ratio.unwrap();
    assert!((0.99..=1.01).contains(&ratio), "{plain:#?}");
    // Without a policy every message is a frame of its own (acks and
    // presence add a few).
    assert!(plain.frames_in_per_s >= plain.received_per_s, "{plain:#?}");

    // With permessage-deflate the same messages arrive, in fewer bytes.
    let packed = chat_replay(&[("compression", "true")]).await;
    assert!(packed.errors.is_empty(), "{:?}", packed.errors);
    let ratio = packed.delivery_ratio.unwrap();
    assert!((0.99..=1.01).contains(&ratio), "{packed:#?}");
    let per_delivery = |r: &plaza_bench::Report| r.bytes_in_per_s / r.received_per_s;
    assert!(
        per_delivery(&packed) * 2.0 < per_delivery(&held),
        "{} vs {} bytes per delivery",
        per_delivery(&packed),
        per_delivery(&held)
    );
}

/// Source document 004's transport chat, shortened, over `transport`.
async fn transport_chat(transport: &str) -> plaza_bench::Report {
    let set = [
        ("transport", transport),
        ("every_ms", "100"),
        ("chat_s", "1"),
        ("messages_each", "5"),
        // Other tests share the loopback interface: no budget here.
        ("budget", "1e12"),
    ];
    run_scenario_file("transport-chat.yaml", &set).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_transport_chat_runs_over_every_transport_and_counts_its_bytes() {
    let mut by_transport = std::collections::HashMap::new();
    for transport in ["websocket", "sse", "long-polling", "polling:200"] {
        let r = transport_chat(transport).await;
        assert_eq!(r.transport, transport);
        assert!(r.errors.is_empty(), "{transport}: {:?}", r.errors);
        assert_eq!(r.joined, 2, "{transport}");
        // 2 users × 5 messages, each delivered to the other, acknowledged.
        assert_eq!(r.publishes_total, 10, "{transport}: {r:#?}");
        assert_eq!(r.deliveries_total, 10, "{transport}: {r:#?}");
        assert_eq!(r.acks, 10, "{transport}");
        assert_eq!(r.behaviour_failures(), Vec::<&Check>::new(), "{transport}");
        // Timed at the receiver, whatever carried it.
        assert_eq!(r.latency.as_ref().map(|l| l.count), Some(10), "{transport}");
        assert!(
            r.socket_bytes_in > 0 && r.socket_bytes_out > 0,
            "{transport}"
        );
        by_transport.insert(transport, r);
    }
    let requests = |t: &str| by_transport[t].transport_requests;
    // A WebSocket makes no HTTP request once open; each HTTP transport
    // sends every message as a request (10), and polls make more.
    assert_eq!(requests("websocket"), 0);
    assert_eq!(requests("sse"), 10);
    assert!(requests("long-polling") > 10);
    // Polling asks every 200 ms whatever happens: 2 users × about 5 polls.
    assert!(
        requests("polling:200") >= 10 + 2 * 4,
        "{}",
        requests("polling:200")
    );
    // The same chat costs fewer bytes at the sockets (both ways) on a
    // WebSocket than as an event stream, and than as polls.
    let socket_bytes = |t: &str| by_transport[t].socket_bytes_in + by_transport[t].socket_bytes_out;
    assert!(socket_bytes("websocket") < socket_bytes("sse"));
    assert!(socket_bytes("sse") < socket_bytes("long-polling"));
}

#[tokio::test]
async fn a_transport_the_protocol_lacks_is_refused_before_the_run() {
    let yaml = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../bench/scenarios/transport-chat.yaml"
    ))
    .unwrap();
    let scenario = Scenario::parse(&yaml, &[("transport".into(), "sse".into())]).unwrap();
    let addr: std::net::SocketAddr = "127.0.0.1:9".parse().unwrap();
    let err = run(
        &scenario,
        RunOptions {
            addr,
            host: addr.to_string(),
            driver: Arc::new(plaza_bench::driver::BroadcastDriver),
            observers_per_room: 2,
            server_pid: None,
            bind: vec![],
            timeout: Duration::from_secs(1),
            progress: None,
            shard: None,
        },
    )
    .await
    .expect_err("refused");
    assert!(err.to_string().contains("no sse transport"), "{err}");
}

/// Issue 18, item 7: `plaza bench`'s slow-consumers scenario runs; its
/// `stall` step makes the server close every stalled member as a slow
/// consumer; and the scenario's expectations are evaluated and reported. How
/// fast the readers were served is the benchmark's business
/// (docs/benchmarks.md), and that exactly the stalled members are closed while
/// every reader gets every message is proven without timing in
/// crates/server/tests/it/limits.rs (issue 44, item 5).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stalled_readers_are_closed_as_slow_consumers_and_the_others_go_on() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let node = Node::new(
        ServerConfig {
            auto_create_rooms: true,
            // A short queue, which the stalled members fill within the run
            // (after the sockets' buffers).
            send_queue_frames: 512,
            ..ServerConfig::default()
        },
        Arc::new(MemoryTicketStore::new()),
    );
    tokio::spawn(plaza_server::serve(node.clone(), listener));
    let yaml = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../bench/scenarios/slow-consumers.yaml"
    ))
    .unwrap();
    let set: Vec<(String, String)> = [
        ("members", "20"),
        ("stalled", "10"),
        ("readers", "90"),
        ("payload_bytes", "4000"),
        ("publish_every_ms", "20"),
        ("warmup_s", "0.5"),
        ("measure_s", "5"),
    ]
    .iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    let scenario = Scenario::parse(&yaml, &set).unwrap();
    let every_user_observes = RunOptions {
        observers_per_room: 100,
        ..options(addr, Arc::new(PlazaDriver::default()))
    };
    let report = run(&scenario, every_user_observes).await.unwrap();
    assert_eq!(report.joined, 20, "{report:#?}");
    assert!(report.publishes_total > 0, "{report:#?}");
    // A reader the busy machine did not run for long enough is closed too:
    // that is an error in the report, and the only kind allowed here.
    assert!(
        report
            .errors
            .keys()
            .all(|e| e.starts_with("closed by server")),
        "{:?}",
        report.errors
    );
    let checked: Vec<&str> = report.checks.iter().map(|c| c.name.as_str()).collect();
    assert_eq!(
        checked,
        ["latency_mean_ms", "error_rate"],
        "{:?}",
        report.checks
    );
    let slow = || {
        node.render_metrics()
            .lines()
            .find_map(|l| {
                l.strip_prefix("plaza_slow_consumers_total ")?
                    .trim()
                    .parse::<f64>()
                    .ok()
            })
            .unwrap_or(0.0)
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while slow() < 2.0 && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Both stalled members, and one more for each reader the report counts
    // as closed.
    let closed_readers: u64 = report.errors.values().sum();
    assert_eq!(slow(), (2 + closed_readers) as f64, "{:?}", report.errors);
}
