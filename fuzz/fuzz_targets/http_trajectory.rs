//! The trajectory filters' bodies in every format they take, with the query
//! parameters that change how a body is read: GeoJSON or a JSON error,
//! never a panic or a 5xx.
#![no_main]

#[path = "common/api.rs"]
mod api;

use std::sync::OnceLock;

use axum::http::{Method, StatusCode};
use libfuzzer_sys::fuzz_target;
use plaza_server::ServerConfig;

fn api() -> &'static api::Api {
    static API: OnceLock<api::Api> = OnceLock::new();
    API.get_or_init(|| api::Api::new(ServerConfig::default()))
}

const CONTENT_TYPES: [&str; 6] = [
    "text/csv",
    "text/plain",
    "application/json",
    "application/gpx+xml",
    "application/geo+json",
    "application/octet-stream",
];

const QUERIES: [&str; 8] = [
    "",
    "?interval=3",
    "?interval=1",
    "?interval=0",
    "?delimiter=;",
    "?delimiter=tab&interval=5",
    "?interval=999999999999",
    "?delimiter=x",
];

fuzz_target!(|data: &[u8]| {
    let [a, b, body @ ..] = data else {
        return;
    };
    let path = if a & 1 == 0 {
        "/v1/trajectory/mean"
    } else {
        "/trajectory/median"
    };
    let ct = CONTENT_TYPES[usize::from(a >> 1) % CONTENT_TYPES.len()];
    let query = QUERIES[usize::from(*b) % QUERIES.len()];
    let (status, answer) = api().call(Method::POST, &format!("{path}{query}"), Some(ct), body);
    api::check_answer(status, &answer);
    if status == StatusCode::OK {
        let v: serde_json::Value = serde_json::from_slice(&answer).expect("GeoJSON is JSON");
        assert!(v["type"].is_string(), "{v}");
    }
});
