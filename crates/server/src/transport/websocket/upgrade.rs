//! `GET /v1/ws`: the HTTP upgrade to a WebSocket, validated here; the raw
//! socket is then taken from hyper and served by [`super::serve_socket`].

use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use hyper_util::rt::TokioIo;
use plaza_protocol::compact::{COMPACT_SUBPROTOCOL, JSON_SUBPROTOCOL};
use plaza_protocol::ErrorCode;
use tokio::net::TcpStream;

use crate::listener::AdmittedStream;

use super::{deflate, serve_socket};
use crate::api_error::ApiError;
use crate::Node;

/// `GET /v1/ws`: validates the upgrade request and hands the socket to
/// [`serve_socket`].
pub(crate) async fn upgrade(State(node): State<Arc<Node>>, mut req: Request) -> Response {
    if node.is_shutting_down() {
        return ApiError::shutting_down().into_response();
    }
    let h = req.headers();
    if let Err(e) = crate::origin::check(h, &node.config().allowed_origins) {
        return e.into_response();
    }
    let is_upgrade = has_token(h, header::CONNECTION, "upgrade")
        && h.get(header::UPGRADE)
            .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"websocket"));
    if !is_upgrade {
        let msg = "expected a WebSocket upgrade (Connection: upgrade, Upgrade: websocket)";
        return ApiError::new(StatusCode::BAD_REQUEST, ErrorCode::InvalidRequest, msg)
            .into_response();
    }
    if h.get(header::SEC_WEBSOCKET_VERSION)
        .is_none_or(|v| v != "13")
    {
        let mut r = ApiError::new(
            StatusCode::UPGRADE_REQUIRED,
            ErrorCode::InvalidRequest,
            "WebSocket version 13 only",
        )
        .into_response();
        r.headers_mut().insert(
            header::SEC_WEBSOCKET_VERSION,
            "13".parse().expect("valid header"),
        );
        return r;
    }
    let Some(key) = h.get(header::SEC_WEBSOCKET_KEY) else {
        return ApiError::new(
            StatusCode::BAD_REQUEST,
            ErrorCode::InvalidRequest,
            "missing Sec-WebSocket-Key",
        )
        .into_response();
    };
    let accept = tungstenite::handshake::derive_accept_key(key.as_bytes());
    let deflate = if node.config().websocket_compression {
        let offers = h
            .get_all(header::SEC_WEBSOCKET_EXTENSIONS)
            .iter()
            .filter_map(|v| v.to_str().ok());
        deflate::negotiate(offers)
    } else {
        None
    };
    let subprotocol = match negotiate_subprotocol(h) {
        Ok(p) => p,
        Err(e) => return e.into_response(),
    };
    let compact = subprotocol == Some(COMPACT_SUBPROTOCOL);
    let token = crate::auth::query_token(req.uri().query());
    let extensions = deflate.as_ref().map(|(_, response)| response.clone());
    let deflate = deflate.map(|(d, _)| d);
    let on_upgrade = hyper::upgrade::on(&mut req);
    tokio::spawn(async move {
        match on_upgrade.await {
            Ok(upgraded) => {
                use hyper_util::server::conn::auto::upgrade::downcast;
                // Plaza's WebSocket layer works on the TCP socket itself;
                // the connection's place (see listener.rs) is held until it ends.
                match downcast::<TokioIo<AdmittedStream>>(upgraded) {
                    Ok(parts) => {
                        let (stream, place) = parts.io.into_inner().into_parts();
                        serve_socket(node, stream, parts.read_buf, deflate, compact, token).await;
                        drop(place);
                    }
                    Err(upgraded) => match downcast::<TokioIo<TcpStream>>(upgraded) {
                        Ok(parts) => {
                            serve_socket(
                                node,
                                parts.io.into_inner(),
                                parts.read_buf,
                                deflate,
                                compact,
                                token,
                            )
                            .await
                        }
                        Err(_) => tracing::error!("upgraded connection is not a TCP stream"),
                    },
                }
            }
            Err(e) => tracing::debug!(error = %e, "websocket upgrade failed"),
        }
    });
    let mut response = Response::builder()
        .status(StatusCode::SWITCHING_PROTOCOLS)
        .header(header::CONNECTION, "upgrade")
        .header(header::UPGRADE, "websocket")
        .header(header::SEC_WEBSOCKET_ACCEPT, accept);
    if let Some(p) = subprotocol {
        response = response.header(header::SEC_WEBSOCKET_PROTOCOL, p);
    }
    if let Some(e) = extensions {
        response = response.header(header::SEC_WEBSOCKET_EXTENSIONS, e);
    }
    response.body(Body::empty()).expect("valid response")
}

/// The subprotocol chosen among the client's offers: the first it lists
/// that Plaza speaks (`plaza.v1.compact` or `plaza.v1`), or none when it
/// offers none. Offers of only other subprotocols are refused: a browser
/// would fail the connection on an answer without one of them anyway.
fn negotiate_subprotocol(h: &HeaderMap) -> Result<Option<&'static str>, ApiError> {
    let mut offered = h
        .get_all(header::SEC_WEBSOCKET_PROTOCOL)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(str::trim)
        .filter(|t| !t.is_empty())
        .peekable();
    if offered.peek().is_none() {
        return Ok(None);
    }
    match offered.find_map(|t| {
        [COMPACT_SUBPROTOCOL, JSON_SUBPROTOCOL]
            .into_iter()
            .find(|p| *p == t)
    }) {
        Some(p) => Ok(Some(p)),
        None => Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            ErrorCode::InvalidRequest,
            "unsupported WebSocket subprotocol: Plaza speaks plaza.v1.compact and plaza.v1",
        )),
    }
}

fn has_token(h: &HeaderMap, name: header::HeaderName, token: &str) -> bool {
    h.get_all(name)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|t| t.trim().eq_ignore_ascii_case(token))
}
