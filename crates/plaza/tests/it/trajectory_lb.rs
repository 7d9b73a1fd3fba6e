//! Source document 001's load-test client, as it calls the trajectory filters, through the
//! real nginx and HAProxy configurations of deploy/: its request shape (JSON with the CSV of a
//! recorded track, `lat,long`, and the interval) at its paths (`/trajectory/mean`,
//! `/trajectory/median`), spread over the nodes by least connections.

use std::collections::BTreeSet;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::time::Duration;

use plaza_launch::{LbKind, LoadBalancer, NodeOptions, NodeProcess};
use serde_json::{json, Value};

const PLAZA: &str = env!("CARGO_BIN_EXE_plaza");

/// A POST with a JSON body, as artillery sends it: status, `x-plaza-node` and the JSON body.
fn post_json(addr: SocketAddr, path: &str, body: &str) -> (u16, String, Value) {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(10)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(
        s,
        "POST {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).unwrap();
    let text = String::from_utf8(raw).unwrap();
    let (head, rest) = text.split_once("\r\n\r\n").expect("a response head");
    let status: u16 = head.split(' ').nth(1).unwrap().parse().unwrap();
    let header = |name: &str| {
        head.lines()
            .find_map(|l| {
                let (k, v) = l.split_once(':')?;
                k.trim()
                    .eq_ignore_ascii_case(name)
                    .then(|| v.trim().to_owned())
            })
            .unwrap_or_default()
    };
    let body = if header("transfer-encoding").eq_ignore_ascii_case("chunked") {
        dechunk(rest)
    } else {
        rest.to_owned()
    };
    let value = serde_json::from_str(&body).unwrap_or_else(|e| panic!("{e}: {body}"));
    (status, header("x-plaza-node"), value)
}

fn dechunk(mut rest: &str) -> String {
    let mut out = String::new();
    loop {
        let (size, tail) = rest.split_once("\r\n").unwrap();
        let n = usize::from_str_radix(size.trim(), 16).unwrap();
        if n == 0 {
            return out;
        }
        out.push_str(&tail[..n]);
        rest = &tail[n + 2..];
    }
}

fn documents_client_through(kind: LbKind) {
    let dir = tempfile::tempdir().unwrap();
    let nodes: Vec<NodeProcess> = ["a", "b"]
        .iter()
        .map(|id| {
            let opts = NodeOptions {
                log_dir: Some(dir.path().join("nodes")),
                ..NodeOptions::new(format!("{kind}-{id}"))
            };
            NodeProcess::start(Path::new(PLAZA), opts).unwrap()
        })
        .collect();
    let upstreams: Vec<SocketAddr> = nodes.iter().map(NodeProcess::addr).collect();
    let lb = LoadBalancer::start(kind, 0, &upstreams, &dir.path().join("lb")).unwrap();

    // A recorded running track as the document's CSV files hold it: `lat,long`, no time.
    let mut csv = String::from("lat,long\n");
    for i in 0..200 {
        let f = f64::from(i);
        csv.push_str(&format!(
            "{:.10},{:.10}\n",
            56.2568605075 + f * 0.00001,
            10.0688809242 + (f * 0.3).sin() * 0.0001
        ));
    }
    let body = json!({"csv_data": csv, "interval": 10}).to_string();
    let mut answered_by = BTreeSet::new();
    for i in 0..20 {
        let path = if i % 2 == 0 {
            "/trajectory/mean"
        } else {
            "/trajectory/median"
        };
        let (status, node, v) = post_json(lb.addr(), path, &body);
        assert_eq!(status, 200, "{kind} {path}: {v}");
        let props = &v["features"][0]["properties"];
        assert_eq!(props["points"], 200, "{kind}: {v}");
        assert_eq!(props["filter"], &path["/trajectory/".len()..]);
        assert!(props.get("timestamps").is_none());
        answered_by.insert(node);
    }
    assert_eq!(
        answered_by.len(),
        2,
        "{kind}: the stateless calls reach both nodes, not {answered_by:?}"
    );
}

#[test]
fn the_documents_client_runs_unchanged_through_nginx() {
    documents_client_through(LbKind::Nginx);
}

#[test]
fn the_documents_client_runs_unchanged_through_haproxy() {
    documents_client_through(LbKind::Haproxy);
}
