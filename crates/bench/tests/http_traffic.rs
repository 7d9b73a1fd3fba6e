//! HTTP traffic figures: bytes as they cross the wire, the span from the
//! first request sent to the last response read, and `until_done` phases
//! that end with the work rather than at their bound.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use plaza_bench::driver::PlazaDriver;
use plaza_bench::{run, RunOptions, Scenario, Step};
use plaza_broker::MemoryTicketStore;
use plaza_server::{Node, ServerConfig};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

fn options(addr: SocketAddr) -> RunOptions {
    RunOptions {
        addr,
        host: addr.to_string(),
        driver: Arc::new(PlazaDriver::default()),
        observers_per_room: 1,
        server_pid: None,
        bind: vec![],
        timeout: Duration::from_secs(10),
        progress: None,
        shard: None,
    }
}

/// 2 users × 5 calls to the mean filter; the last phase may last 60 s but
/// ends when the 10 calls are done.
const TRAJECTORY: &str = r#"
name: trajectory-small
params: { calls: 5 }
phases:
  - { name: arrive, arrival_rate: 100, users: 2, record: true }
  - { name: finish, duration_s: 60, until_done: true, record: true }
flows:
  - name: mean
    steps:
      - loop:
          count: ${calls}
          steps:
            - http: { method: POST, path: /v1/trajectory/mean, body: { interval: 2, points: [{"t":0,"lat":54.32,"lon":10.1202},{"t":1,"lat":54.320668,"lon":10.120753},{"t":2,"lat":54.321182,"lon":10.121229},{"t":3,"lat":54.321528,"lon":10.121955}] } }
expect: { error_rate: 0.0 }
drain: { quiet_ms: 100, max_ms: 1000 }
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_calls_are_counted_in_bytes_and_span_and_until_done_ends_with_them() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let node = Node::new(ServerConfig::default(), Arc::new(MemoryTicketStore::new()));
    tokio::spawn(plaza_server::serve(node, listener));
    let scenario = Scenario::parse(TRAJECTORY, &[]).unwrap();
    let Step::Loop { steps, .. } = &scenario.flows[0].steps[0] else {
        panic!("{:?}", scenario.flows[0].steps[0]);
    };
    let Step::Http {
        body: Some(body), ..
    } = &steps[0]
    else {
        panic!("{:?}", steps[0]);
    };
    let body_len = serde_json::to_vec(body).unwrap().len();
    // What one answer's body weighs, asked directly.
    let answer = reqwest::Client::new()
        .post(format!("http://{addr}/v1/trajectory/mean"))
        .json(body)
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status(), 200);
    let answer_len = answer.bytes().await.unwrap().len();
    assert!(answer_len > 0);

    let began = Instant::now();
    let report = run(&scenario, options(addr)).await.unwrap();
    let wall = began.elapsed().as_secs_f64();

    assert_eq!((report.http_ok, report.http_failed), (10, 0), "{report:#?}");
    assert!(report.errors.is_empty(), "{:?}", report.errors);
    assert_eq!(report.http_rt.as_ref().map(|l| l.count), Some(10));
    // Every request is the request line, the four headers the runner sets
    // and the JSON body, byte for byte.
    let head = format!(
        "POST /v1/trajectory/mean HTTP/1.1\r\nhost: {addr}\r\naccept: */*\r\n\
         content-type: application/json\r\ncontent-length: {body_len}\r\n\r\n"
    );
    assert_eq!(report.http_bytes_out, 10 * (head.len() + body_len) as u64);
    // Every response is at least a status line, the blank line and the body.
    let least_in = 10 * ("HTTP/1.1 200 OK\r\n\r\n".len() + answer_len) as u64;
    assert!(
        report.http_bytes_in >= least_in && report.http_bytes_in < least_in + 10 * 1024,
        "{} for {least_in}",
        report.http_bytes_in
    );

    let duration = report.http_duration_s.expect("calls were made");
    assert!(
        duration > 0.0 && duration <= wall,
        "{duration} s of {wall} s"
    );
    let per_s = report.http_calls_per_s.unwrap();
    assert!((per_s - 10.0 / duration).abs() < 1e-6 * per_s, "{per_s}");
    let out_per_s = report.http_bytes_out_per_s.unwrap();
    assert!((out_per_s * duration - report.http_bytes_out as f64).abs() < 1e-3);
    assert!(report.http_calls_per_recorded_s > 0.0);
    assert_eq!(report.ws_duration_s, None, "no WebSocket traffic");

    // The 60 s phase ended with the calls: the run took a fraction of it,
    // and so did the recorded window.
    assert!(wall < 30.0, "the run took {wall} s");
    assert!(
        report.recorded_s > 0.0 && report.recorded_s < 30.0,
        "{} s recorded",
        report.recorded_s
    );
    let md = report.markdown();
    assert!(md.contains("HTTP duration"), "{md}");
    assert!(md.contains(&report.http_bytes_out.to_string()), "{md}");
    let json = serde_json::to_value(&report).unwrap();
    assert_eq!(json["http_bytes_out"], report.http_bytes_out);
    assert!(json["http_duration_s"].is_f64());
}

/// The answer of the capturing server to every request.
const CANNED: &[u8] =
    b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 11\r\n\r\n{\"ok\":true}";

/// Reads HTTP/1.1 requests off one keep-alive connection, adds up their
/// bytes and answers each with [`CANNED`].
async fn capture(mut sock: TcpStream, read: Arc<AtomicU64>, requests: Arc<AtomicU64>) {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&buf[..end]).to_ascii_lowercase();
            let body: usize = head
                .lines()
                .find_map(|l| l.strip_prefix("content-length:"))
                .map_or(0, |v| v.trim().parse().unwrap());
            let total = end + 4 + body;
            if buf.len() >= total {
                buf.drain(..total);
                // Counted before answering: once the client has every
                // answer, the counts are complete.
                read.fetch_add(total as u64, Ordering::SeqCst);
                requests.fetch_add(1, Ordering::SeqCst);
                sock.write_all(CANNED).await.unwrap();
                continue;
            }
        }
        match sock.read(&mut chunk).await {
            Ok(0) | Err(_) => return,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    }
}

/// Bodies with multi-byte characters and escapes, paths with templates and
/// a query, and body-less GETs.
const WIRE: &str = r#"
name: wire
phases:
  - { name: run, arrival_rate: 100, users: 3, record: true }
  - { name: finish, duration_s: 60, until_done: true, record: true }
flows:
  - name: api
    steps:
      - loop:
          count: 4
          steps:
            - http: { method: POST, path: "/echo/{vu}", body: { who: "u{vu}", text: "é ü \"q\"", n: [1, 2.5, -3] } }
            - http: { path: "/look?who={vu}&x=a%20b" }
expect: { error_rate: 0.0 }
drain: { quiet_ms: 50, max_ms: 1000 }
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn counted_http_bytes_are_the_bytes_on_the_wire() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let read = Arc::new(AtomicU64::new(0));
    let requests = Arc::new(AtomicU64::new(0));
    {
        let (read, requests) = (read.clone(), requests.clone());
        tokio::spawn(async move {
            while let Ok((sock, _)) = listener.accept().await {
                tokio::spawn(capture(sock, read.clone(), requests.clone()));
            }
        });
    }
    let scenario = Scenario::parse(WIRE, &[]).unwrap();
    let report = run(&scenario, options(addr)).await.unwrap();
    assert_eq!(report.http_ok, 24, "{report:#?}");
    assert_eq!(requests.load(Ordering::SeqCst), 24);
    assert_eq!(report.http_bytes_out, read.load(Ordering::SeqCst));
    assert_eq!(report.http_bytes_in, 24 * CANNED.len() as u64);
}

#[tokio::test]
async fn an_until_done_phase_whose_flows_do_not_end_lasts_its_bound() {
    let yaml = r#"
name: slow
phases:
  - { name: start, arrival_rate: 100, users: 1 }
  - { name: wait, duration_s: 0.3, until_done: true, record: true }
flows:
  - name: f
    steps: [ { think: { ms: 600000 } } ]
drain: { quiet_ms: 50, max_ms: 1000 }
"#;
    let scenario = Scenario::parse(yaml, &[]).unwrap();
    // No HTTP calls, no rooms: nothing is sent to the address.
    let began = Instant::now();
    let report = run(&scenario, options("127.0.0.1:9".parse().unwrap()))
        .await
        .unwrap();
    let wall = began.elapsed().as_secs_f64();
    assert!(
        (report.recorded_s - 0.3).abs() < 1e-6,
        "{}",
        report.recorded_s
    );
    assert!(wall >= 0.3, "{wall}");
    assert!(wall < 30.0, "the think step ends with the run: {wall}");
    assert_eq!(report.http_duration_s, None);
    assert_eq!((report.http_bytes_out, report.http_bytes_in), (0, 0));
}
