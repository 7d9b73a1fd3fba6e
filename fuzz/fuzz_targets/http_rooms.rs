//! `POST /v1/rooms` bodies: created (then deleted, so the node stays the
//! same size) or refused with a JSON error, never a panic or a 5xx.
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

fuzz_target!(|data: &[u8]| {
    let api = api();
    let (status, body) = api.call(Method::POST, "/v1/rooms", Some("application/json"), data);
    api::check_answer(status, &body);
    if status == StatusCode::CREATED {
        let room: serde_json::Value = serde_json::from_slice(&body).expect("a room is JSON");
        let id = room["id"].as_str().expect("a room has an id");
        let (status, body) = api.call(Method::DELETE, &format!("/v1/rooms/{id}"), None, b"");
        assert_eq!(
            status,
            StatusCode::NO_CONTENT,
            "{}",
            String::from_utf8_lossy(&body)
        );
    }
});
