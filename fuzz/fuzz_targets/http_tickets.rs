//! `POST /v1/rooms/{id}/tickets` bodies: a ticket or a JSON error, never a
//! panic or a 5xx. Tickets live 1 ms here, so the store does not grow.
#![no_main]

#[path = "common/api.rs"]
mod api;

use std::sync::OnceLock;

use axum::http::{Method, StatusCode};
use libfuzzer_sys::fuzz_target;
use plaza_server::ServerConfig;

fn api() -> &'static api::Api {
    static API: OnceLock<api::Api> = OnceLock::new();
    API.get_or_init(|| {
        let api = api::Api::new(ServerConfig {
            ticket_ttl_ms: 1,
            ..ServerConfig::default()
        });
        let (status, _) = api.call(
            Method::POST,
            "/v1/rooms",
            Some("application/json"),
            br#"{"id": "r"}"#,
        );
        assert_eq!(status, StatusCode::CREATED);
        api
    })
}

fuzz_target!(|data: &[u8]| {
    let (status, body) = api().call(
        Method::POST,
        "/v1/rooms/r/tickets",
        Some("application/json"),
        data,
    );
    api::check_answer(status, &body);
    if status == StatusCode::CREATED {
        let t: serde_json::Value = serde_json::from_slice(&body).expect("a ticket is JSON");
        assert!(t["ticket"].is_string() && t["expires_at"].is_u64(), "{t}");
    }
});
