//! The HTTP API of a real node, called in process through its router: the
//! same handlers, extractors and body limits a client reaches over TCP.

use std::sync::Arc;

use axum::body::{Body, Bytes};
use axum::http::{Method, Request, StatusCode};
use http_body_util::BodyExt;
use plaza_broker::MemoryTicketStore;
use plaza_server::{Node, ServerConfig};
use tower::ServiceExt;

/// A node and a runtime to call it on.
pub struct Api {
    rt: tokio::runtime::Runtime,
    router: axum::Router,
}

impl Api {
    pub fn new(config: ServerConfig) -> Api {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        let node = rt.block_on(async { Node::new(config, Arc::new(MemoryTicketStore::new())) });
        Api {
            rt,
            router: plaza_server::router(node),
        }
    }

    /// `method path` with `body` (and `content_type`, if any): the status and body.
    pub fn call(
        &self,
        method: Method,
        path: &str,
        content_type: Option<&str>,
        body: &[u8],
    ) -> (StatusCode, Bytes) {
        let mut req = Request::builder().method(method).uri(path);
        if let Some(ct) = content_type {
            req = req.header("content-type", ct);
        }
        let req = req.body(Body::from(body.to_vec())).expect("request");
        self.rt.block_on(async {
            let res = self.router.clone().oneshot(req).await.expect("infallible");
            let status = res.status();
            let body = res.into_body().collect().await.expect("body").to_bytes();
            (status, body)
        })
    }
}

/// What every answer must be: never a 5xx, and an error is a JSON body with
/// a string code, the documented shape.
pub fn check_answer(status: StatusCode, body: &[u8]) {
    assert!(
        !status.is_server_error(),
        "{status}: {}",
        String::from_utf8_lossy(body)
    );
    if status.is_client_error() {
        let v: serde_json::Value = serde_json::from_slice(body).expect("an error body is JSON");
        assert!(v["error"]["code"].is_string(), "{v}");
    }
}
