//! HTTP transports for networks that block WebSocket: server-sent events
//! (SSE) and long polling, over one session model.
//!
//! `POST /v1/sessions` opens a transport session and names it by an
//! unguessable id (the id is the session's secret). Client frames go by
//! `POST /v1/sessions/{id}/send` (one frame, or an array of frames, handled
//! in order exactly like WebSocket messages); server frames come by
//! `GET /v1/sessions/{id}/events` (an SSE stream whose event ids let a
//! browser's `EventSource` reconnect where it stopped) or
//! `GET /v1/sessions/{id}/poll?ack=N` (held until frames are ready or
//! `poll_timeout_ms` passes). See docs/protocol.md, "Transports".

mod session;

use std::collections::HashMap;
use std::convert::Infallible;
use std::io::Write;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::{ConnectInfo, Path, Query, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;

use crate::listener::PeerAddr;
use plaza_protocol::{ErrorCode, HttpErrorCode};
use serde::Deserialize;
use serde_json::json;
use serde_json::value::RawValue;

use crate::api_error::ApiError;
use crate::Node;
use session::HttpSession;

/// How long a poll waits for frames before it answers with none.
pub const POLL_TIMEOUT: Duration = Duration::from_secs(25);

/// The node's open HTTP transport sessions, by id.
#[derive(Default)]
pub(crate) struct HttpSessions {
    open: Mutex<HashMap<String, Arc<HttpSession>>>,
}

impl HttpSessions {
    fn get(&self, id: &str) -> Option<Arc<HttpSession>> {
        self.open
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(id)
            .cloned()
    }
}

fn not_found() -> ApiError {
    ApiError::http(
        StatusCode::NOT_FOUND,
        HttpErrorCode::TransportNotFound,
        "no such transport session: it ended or never existed; open a new one and resume",
    )
}

/// `POST /v1/sessions`: opens a transport session.
pub(crate) async fn open(
    State(node): State<Arc<Node>>,
    peer: Option<axum::Extension<ConnectInfo<PeerAddr>>>,
    uri: axum::http::Uri,
    headers: HeaderMap,
) -> Response {
    if node.is_shutting_down() {
        return ApiError::shutting_down().into_response();
    }
    if let Err(e) = crate::origin::check(&headers, &node.config().allowed_origins) {
        return e.into_response();
    }
    let id = plaza_broker::new_resume_token();
    let registry = Arc::downgrade(&node);
    let peer = peer.map(|axum::Extension(ConnectInfo(PeerAddr(addr)))| addr.ip());
    let token = crate::auth::query_token(uri.query());
    let s = session::open(node.clone(), id.clone(), peer, token, move |id| {
        if let Some(node) = registry.upgrade() {
            node.http_sessions
                .open
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .remove(id);
        }
    });
    node.http_sessions
        .open
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .insert(id.clone(), s);
    let body = json!({
        "session": id,
        "poll_timeout_ms": POLL_TIMEOUT.as_millis() as u64,
        "idle_timeout_ms": node.config().idle_timeout_ms,
    });
    (StatusCode::CREATED, Json(body)).into_response()
}

/// `DELETE /v1/sessions/{id}`: ends the session (its rooms can be resumed).
pub(crate) async fn close(State(node): State<Arc<Node>>, Path(id): Path<String>) -> Response {
    let Some(s) = node.http_sessions.get(&id) else {
        return not_found().into_response();
    };
    s.close();
    StatusCode::NO_CONTENT.into_response()
}

/// `POST /v1/sessions/{id}/send`: one client frame (a JSON object) or an
/// array of them, each handled as one WebSocket message would be.
pub(crate) async fn send(
    State(node): State<Arc<Node>>,
    Path(id): Path<String>,
    body: Body,
) -> Response {
    let Some(s) = node.http_sessions.get(&id) else {
        return not_found().into_response();
    };
    // The body limit is the node's own (16 messages of the largest size), read
    // here rather than by the framework's default limit, whose answer is not JSON.
    let max = node
        .config()
        .max_frame_bytes
        .saturating_mul(4)
        .max(1024)
        .saturating_mul(16);
    let Ok(body) = axum::body::to_bytes(body, max).await else {
        return ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            ErrorCode::FrameTooLarge,
            format!("a body has at most {max} bytes"),
        )
        .into_response();
    };
    let first = body.iter().copied().find(|b| !b.is_ascii_whitespace());
    let frames: Vec<Bytes> = if first == Some(b'[') {
        match serde_json::from_slice::<Vec<Box<RawValue>>>(&body) {
            Ok(list) => list
                .iter()
                .map(|f| Bytes::copy_from_slice(f.get().as_bytes()))
                .collect(),
            Err(e) => {
                return ApiError::new(
                    StatusCode::BAD_REQUEST,
                    ErrorCode::BadJson,
                    format!("a batch is a JSON array of frames: {e}"),
                )
                .into_response()
            }
        }
    } else {
        // One frame: handled (and refused, if it must be) like a WebSocket message.
        vec![body]
    };
    let count = frames.len();
    for f in frames {
        if s.send(f).await.is_err() {
            return not_found().into_response();
        }
    }
    (StatusCode::ACCEPTED, Json(json!({"accepted": count}))).into_response()
}

/// Marks a session read by one request at a time; released on drop.
struct Reading(Arc<HttpSession>);

impl Reading {
    fn take(s: &Arc<HttpSession>) -> Result<Reading, ApiError> {
        if s.reading.swap(true, Ordering::AcqRel) {
            return Err(ApiError::http(
                StatusCode::CONFLICT,
                HttpErrorCode::AlreadyReading,
                "another poll or event stream is reading this session",
            ));
        }
        s.heard();
        Ok(Reading(s.clone()))
    }
}

impl Drop for Reading {
    fn drop(&mut self) {
        self.0.heard();
        self.0.reading.store(false, Ordering::Release);
    }
}

/// The query of a poll.
#[derive(Debug, Deserialize)]
pub(crate) struct PollQuery {
    /// The last position the client has (0: none yet).
    #[serde(default)]
    ack: u64,
    /// How long to wait for frames, in ms (at most, and by default,
    /// [`POLL_TIMEOUT`]); 0 answers at once.
    #[serde(default)]
    wait_ms: Option<u64>,
}

/// `GET /v1/sessions/{id}/poll?ack=N[&wait_ms=W]`: the frames after
/// position `N`, as soon as there are any (or none after `W`, at most
/// [`POLL_TIMEOUT`]).
pub(crate) async fn poll(
    State(node): State<Arc<Node>>,
    Path(id): Path<String>,
    query: Result<Query<PollQuery>, axum::extract::rejection::QueryRejection>,
) -> Response {
    let q = match query {
        Ok(Query(q)) => q,
        // The rejection names the parameter at fault (`ack: invalid digit
        // found in string`).
        Err(e) => {
            return ApiError::new(
                StatusCode::BAD_REQUEST,
                ErrorCode::InvalidRequest,
                format!(
                    "ack must be a position and wait_ms a duration in ms, integers from 0 to \
                     {} (wait_ms above {} is cut to it): {}",
                    u64::MAX,
                    POLL_TIMEOUT.as_millis(),
                    e.body_text()
                ),
            )
            .into_response();
        }
    };
    let Some(s) = node.http_sessions.get(&id) else {
        return not_found().into_response();
    };
    let reading = match Reading::take(&s) {
        Ok(r) => r,
        Err(e) => return e.into_response(),
    };
    let wait = q.wait_ms.map_or(POLL_TIMEOUT, |ms| {
        Duration::from_millis(ms).min(POLL_TIMEOUT)
    });
    let deadline = tokio::time::Instant::now() + wait;
    loop {
        let notified = s.changed.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        {
            let mut out = s.out.lock().unwrap_or_else(|p| p.into_inner());
            if q.ack >= out.next {
                return beyond("ack", q.ack, out.next - 1).into_response();
            }
            if q.ack + 1 < out.first() {
                return gone(q.ack).into_response();
            }
            out.ack(q.ack);
            if !out.frames.is_empty() || out.ended.is_some() {
                let last = out.frames.back().map_or(q.ack, |f| f.pos);
                let sending = out.send(q.ack, last);
                let frames: Vec<&[u8]> = out.frames.iter().map(|f| &f.frame[..]).collect();
                let body = poll_body(&frames, last, out.ended);
                drop(out);
                drop(reading);
                sending.count(&node, body.len());
                return ([(header::CONTENT_TYPE, "application/json")], body).into_response();
            }
        }
        tokio::select! {
            _ = &mut notified => {}
            _ = tokio::time::sleep_until(deadline) => {
                drop(reading);
                return ([(header::CONTENT_TYPE, "application/json")], poll_body(&[], q.ack, None))
                    .into_response();
            }
        }
    }
}

/// `{"frames":[...],"last":N}` (and `"closed":code` once the session ended),
/// the frames spliced in as they were encoded.
fn poll_body(frames: &[&[u8]], last: u64, closed: Option<u16>) -> Vec<u8> {
    let mut body = Vec::with_capacity(frames.iter().map(|f| f.len() + 1).sum::<usize>() + 48);
    body.extend_from_slice(b"{\"frames\":[");
    for (i, f) in frames.iter().enumerate() {
        if i > 0 {
            body.push(b',');
        }
        body.extend_from_slice(f);
    }
    body.extend_from_slice(format!("],\"last\":{last}").as_bytes());
    if let Some(code) = closed {
        body.extend_from_slice(format!(",\"closed\":{code}").as_bytes());
    }
    body.push(b'}');
    body
}

/// 400 `invalid_request`: a reader asked to start after a position the
/// session never produced (a poll's `ack`, a stream's `Last-Event-ID`).
/// A client error, not frames the server let go (`frames_gone`): the
/// session has no frames there, and never had.
fn beyond(what: &str, pos: u64, last: u64) -> ApiError {
    ApiError::new(
        StatusCode::BAD_REQUEST,
        ErrorCode::InvalidRequest,
        format!("{what} {pos} is beyond the last position this session produced, {last}"),
    )
}

fn gone(pos: u64) -> ApiError {
    ApiError::http(
        StatusCode::GONE,
        HttpErrorCode::FramesGone,
        format!(
            "frames after position {pos} are no longer held: open a new session and resume the \
             rooms (nothing is lost: the rooms replay what was missed)"
        ),
    )
}

/// The query of an event stream (for clients that cannot set headers).
#[derive(Debug, Deserialize)]
pub(crate) struct EventsQuery {
    /// Same as the `Last-Event-ID` header.
    #[serde(default)]
    last_event_id: Option<u64>,
}

/// `GET /v1/sessions/{id}/events`: an SSE stream of the session's frames,
/// each an event whose id is its position, from after `Last-Event-ID`.
pub(crate) async fn events(
    State(node): State<Arc<Node>>,
    Path(id): Path<String>,
    headers: HeaderMap,
    query: Result<Query<EventsQuery>, axum::extract::rejection::QueryRejection>,
) -> Response {
    let header_id = headers
        .get("last-event-id")
        .map(|v| v.to_str().ok().and_then(|v| v.trim().parse::<u64>().ok()));
    let from = match (header_id, query) {
        (Some(None), _) | (_, Err(_)) => {
            return ApiError::new(
                StatusCode::BAD_REQUEST,
                ErrorCode::InvalidRequest,
                "Last-Event-ID must be a position (a non-negative integer)",
            )
            .into_response()
        }
        (Some(Some(h)), _) => h,
        (None, Ok(Query(q))) => q.last_event_id.unwrap_or(0),
    };
    let Some(s) = node.http_sessions.get(&id) else {
        return not_found().into_response();
    };
    let reading = match Reading::take(&s) {
        Ok(r) => r,
        Err(e) => return e.into_response(),
    };
    {
        let mut out = s.out.lock().unwrap_or_else(|p| p.into_inner());
        if from >= out.next {
            let last = out.next - 1;
            drop(out);
            return beyond("Last-Event-ID", from, last).into_response();
        }
        if from + 1 < out.first() {
            drop(out);
            return gone(from).into_response();
        }
        out.ack(from);
    }
    let heartbeat = Duration::from_millis(node.config().heartbeat_interval_ms);
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<Bytes, Infallible>>(4);
    tokio::spawn(async move {
        let _reading = reading;
        let mut cursor = from;
        // Tell the browser how soon to reconnect, and open the stream at once.
        if tx
            .send(Ok(Bytes::from_static(b"retry: 1000\n\n")))
            .await
            .is_err()
        {
            return;
        }
        loop {
            let notified = s.changed.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let (chunk, sending, ended) = {
                let mut out = s.out.lock().unwrap_or_else(|p| p.into_inner());
                let mut chunk = Vec::new();
                let from = cursor;
                for f in out.frames.iter().filter(|f| f.pos > from) {
                    // Into the chunk itself: no string per frame.
                    let _ = write!(chunk, "id: {}\ndata: ", f.pos);
                    chunk.extend_from_slice(&f.frame);
                    chunk.extend_from_slice(b"\n\n");
                    cursor = f.pos;
                }
                let sending = out.send(from, cursor);
                (chunk, sending, out.ended)
            };
            if !chunk.is_empty() {
                let bytes = chunk.len();
                if tx.send(Ok(Bytes::from(chunk))).await.is_err() {
                    return;
                }
                sending.count(&node, bytes);
            }
            if let Some(code) = ended {
                let end = format!("event: closed\ndata: {{\"code\":{code}}}\n\n");
                let _ = tx.send(Ok(Bytes::from(end))).await;
                return;
            }
            tokio::select! {
                _ = &mut notified => {}
                _ = tokio::time::sleep(heartbeat) => {
                    if tx.send(Ok(Bytes::from_static(b": ping\n\n"))).await.is_err() {
                        return;
                    }
                }
                _ = tx.closed() => return,
            }
        }
    });
    let stream = tokio_stream_from(rx);
    Response::builder()
        .header(header::CONTENT_TYPE, "text/event-stream")
        .header(header::CACHE_CONTROL, "no-cache")
        // nginx: pass events on as they come.
        .header("x-accel-buffering", "no")
        .body(Body::from_stream(stream))
        .expect("valid response")
}

/// The receiver as a stream of body chunks.
fn tokio_stream_from(
    rx: tokio::sync::mpsc::Receiver<Result<Bytes, Infallible>>,
) -> impl futures_util::Stream<Item = Result<Bytes, Infallible>> {
    futures_util::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|c| (c, rx)) })
}
