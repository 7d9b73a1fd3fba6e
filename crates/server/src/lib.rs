//! The Plaza node runtime.
//!
//! A [`Node`] owns the rooms of this process. Each room is one task owning a
//! [`plaza_core::Room`]: it orders events, encodes each once and hands the same
//! buffer to every recipient's [`Outbox`](outbox::Outbox). Each connection has a
//! reader (decode, validate, route to room tasks) and a writer (drain its outbox
//! into as few socket writes as possible). [`router`] wires the HTTP API and the
//! WebSocket endpoint; [`serve`] runs them until shutdown.

mod admin;
pub mod allocator;
mod api_error;
pub mod auth;
mod bucket_histogram;
mod clock;
mod cluster;
pub mod config;
mod connection;
mod directory;
#[cfg(test)]
mod golden;
mod http;
pub mod listener;
pub mod metrics;
mod node;
pub mod origin;
pub mod outbox;
mod room;
mod server_api;
mod status;
mod trajectory;
mod transport;
pub mod webhooks;

pub use config::ServerConfig;
pub use directory::{CreateRoom, InitialEntity, RoomList, RoomOptions, RoomSummary, SpaceOptions};
pub use node::Node;
pub use status::{ErrorTotals, LatencySummary, Status};
pub use webhooks::{WebhookEvent, WebhookKind, WebhookTarget, Webhooks};

use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;

/// Checks that the `jwt_*` keys of `config` load: `Ok(true)` when tokens are
/// verified, `Ok(false)` in development mode (no key), or why a key cannot
/// be used. A node whose keys fail to load refuses every token.
pub fn check_token_keys(config: &ServerConfig) -> Result<bool, String> {
    auth::TokenVerifier::from_config(config).map(|v| v.is_some())
}

/// Builds the HTTP + WebSocket router for a node.
pub fn router(node: Arc<Node>) -> axum::Router {
    http::router(node)
}

/// Serves `node` on `listener` until `node.shutdown()` is triggered, then tells
/// every client to reconnect (close code 1012) and waits up to
/// `shutdown_grace_ms` for connections to finish.
pub async fn serve(node: Arc<Node>, listener: TcpListener) -> std::io::Result<()> {
    match listener.local_addr() {
        Ok(addr) => tracing::info!(%addr, broker = node.broker_kind(), "plaza listening"),
        Err(_) => tracing::info!(broker = node.broker_kind(), "plaza listening"),
    }
    if let Some(dir) = &node.config().web_dir {
        tracing::info!(web_dir = %dir.display(), "serving the web app in web_dir at /");
    }
    node.listen_for_user_calls();
    node.sweep_webhook_rooms();
    let token = node.shutdown_token();
    tokio::spawn({
        let node = node.clone();
        let token = token.clone();
        async move {
            let mut tick = tokio::time::interval(Duration::from_secs(1));
            loop {
                tokio::select! {
                    _ = tick.tick() => {
                        node.metrics.upkeep();
                        node.metrics.sample();
                    }
                    _ = token.cancelled() => return,
                }
            }
        }
    });
    let max_connections = match node.config().max_connections {
        0 => listener::default_max_connections(),
        n => n,
    };
    tracing::info!(max_connections, "connection limit");
    let listener = listener::LimitedListener::new(
        listener,
        max_connections,
        node.metrics.connections_refused.clone(),
        &node.config().node_id,
        {
            // A full node can still be watched.
            let node = Arc::downgrade(&node);
            Arc::new(move |path: &str| {
                let node = node.upgrade()?;
                let json = "application/json";
                match path {
                    "/metrics" => {
                        Some(("200 OK", "text/plain; version=0.0.4", node.render_metrics()))
                    }
                    "/healthz" => Some(("200 OK", json, r#"{"status":"ok"}"#.to_owned())),
                    // A full node serves what it holds: a balancer must not take it out (and
                    // send its sessions' requests elsewhere). The broker is not asked here.
                    "/readyz" => {
                        let draining = node.is_shutting_down();
                        let body = serde_json::json!({
                            "ready": !draining,
                            "broker": node.broker_kind(),
                            "node": node.id(),
                            "shutting_down": draining,
                            "full": true,
                        });
                        let status = if draining {
                            "503 Service Unavailable"
                        } else {
                            "200 OK"
                        };
                        Some((status, json, body.to_string()))
                    }
                    _ => None,
                }
            })
        },
    )
    .per_ip(node.config().max_connections_per_ip);
    let app = router(node.clone()).into_make_service_with_connect_info::<listener::PeerAddr>();
    let server =
        axum::serve(listener, app).with_graceful_shutdown(async move { token.cancelled().await });
    let grace = Duration::from_millis(node.config().shutdown_grace_ms);
    let wait_connections = {
        let node = node.clone();
        async move {
            node.shutdown_token().cancelled().await;
            node.wait_connections_closed(grace).await;
        }
    };
    let (res, ()) = tokio::join!(server, wait_connections);
    tracing::info!("plaza stopped");
    res
}
