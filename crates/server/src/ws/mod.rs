//! The WebSocket transport, written on the raw TCP socket.
//!
//! Why not tungstenite's message API: it frames every message anew for each
//! recipient and keeps a per-connection write buffer that never shrinks (it
//! grows to the largest frame ever sent, e.g. a big room's `joined` frame).
//! Here one task per connection reads frames into a buffer that exists only
//! while a frame is incomplete, and writes each batch of queued, already
//! encoded frames with one freshly built buffer and as few syscalls as the
//! socket allows. Header parsing and formatting are tungstenite's.

mod coalesce;
mod frames;

use std::io;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use bytes::{Bytes, BytesMut};
use hyper_util::rt::TokioIo;
use plaza_protocol::{CloseCode, ErrorCode};
use tokio::net::TcpStream;
use tokio::time::Instant;

use crate::connection::Connection;
use crate::http::ApiError;
use crate::outbox::{ConnectionControl, Outbox, OutboxReceiver, Outgoing};
use crate::Node;
use frames::{put_header, FrameReader, Incoming, ServerOp};

/// How long a server-initiated close waits for the client's Close.
const CLOSE_WAIT: Duration = Duration::from_secs(2);
/// Frames written per batch at most, so one busy connection cannot hog its task.
const MAX_BATCH: usize = 512;
/// Bytes read per read call.
const READ_CHUNK: usize = 4096;

/// `GET /v1/ws`: validates the upgrade request and hands the socket to
/// [`serve_socket`].
pub(crate) async fn upgrade(State(node): State<Arc<Node>>, mut req: Request) -> Response {
    if node.is_shutting_down() {
        return ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            ErrorCode::ShuttingDown,
            "shutting down",
        )
        .into_response();
    }
    let h = req.headers();
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
    let on_upgrade = hyper::upgrade::on(&mut req);
    tokio::spawn(async move {
        match on_upgrade.await {
            Ok(upgraded) => match hyper_util::server::conn::auto::upgrade::downcast::<
                TokioIo<TcpStream>,
            >(upgraded)
            {
                Ok(parts) => serve_socket(node, parts.io.into_inner(), parts.read_buf).await,
                Err(_) => tracing::error!("upgraded connection is not a TCP stream"),
            },
            Err(e) => tracing::debug!(error = %e, "websocket upgrade failed"),
        }
    });
    Response::builder()
        .status(StatusCode::SWITCHING_PROTOCOLS)
        .header(header::CONNECTION, "upgrade")
        .header(header::UPGRADE, "websocket")
        .header(header::SEC_WEBSOCKET_ACCEPT, accept)
        .body(Body::empty())
        .expect("valid response")
}

fn has_token(h: &HeaderMap, name: header::HeaderName, token: &str) -> bool {
    h.get_all(name)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|t| t.trim().eq_ignore_ascii_case(token))
}

/// How a connection's loop ended.
enum End {
    /// The server decided (close code in the control): send Close, await the client's.
    Server,
    /// The client sent Close; it was answered.
    ClientClosed,
    /// The socket is gone (EOF, reset, write error).
    Gone,
}

/// Runs one WebSocket connection until it closes.
pub(crate) async fn serve_socket(node: Arc<Node>, stream: TcpStream, pre: Bytes) {
    node.connection_opened();
    let _ = stream.set_nodelay(true);
    let config = node.config();
    let control = ConnectionControl::new();
    let (outbox, mut rx) = Outbox::new(config.send_queue_frames, control.clone());
    let mut conn = Connection::new(node.clone(), outbox, control.clone());
    let mut reader = FrameReader::new(config.max_frame_bytes.saturating_mul(4).max(1024));
    // `pre` is a view into hyper's 16 KiB HTTP read buffer: copy out what it
    // holds (usually nothing) and let the buffer go.
    let mut pending = BytesMut::from(&pre[..]);
    drop(pre);
    let heartbeat = Duration::from_millis(config.heartbeat_interval_ms.max(1));
    let idle = Duration::from_millis(config.idle_timeout_ms.max(1));
    let shutdown = node.shutdown_token();
    let mut last_heard = Instant::now();
    let mut next_ping = last_heard + heartbeat;
    let mut unfinished = Vec::new();
    let coalesce = Duration::from_millis(config.write_coalesce_ms);
    let mut last_write = None;

    let end = 'conn: loop {
        // Handle every complete frame already read.
        loop {
            match reader.next(&mut pending) {
                Ok(Some(Incoming::Text(m) | Incoming::Binary(m))) => {
                    // Boxed: the frame handler's state (~1.6 KB) is allocated
                    // only while a frame is handled, not kept in every idle
                    // connection's task.
                    Box::pin(conn.on_frame(&m)).await
                }
                Ok(Some(Incoming::Ping(payload))) => {
                    if write_control(&stream, &control, ServerOp::Pong, &payload, &mut unfinished)
                        .await
                        .is_err()
                    {
                        break 'conn failed_write(&control);
                    }
                }
                Ok(Some(Incoming::Pong)) => {}
                Ok(Some(Incoming::Close(code))) => {
                    let echo = code.map(u16::to_be_bytes);
                    let payload = echo.as_ref().map_or(&[][..], |c| &c[..]);
                    let _ =
                        write_control(&stream, &control, ServerOp::Close, payload, &mut unfinished)
                            .await;
                    break 'conn End::ClientClosed;
                }
                Ok(None) => break,
                Err(v) => {
                    control.close(match v.code {
                        1007 => CloseCode::InvalidPayload,
                        1009 => CloseCode::MessageTooBig,
                        _ => CloseCode::ProtocolError,
                    });
                    tracing::debug!(reason = v.reason, "websocket protocol violation");
                    break 'conn End::Server;
                }
            }
        }
        // An idle connection holds no read buffer.
        if pending.is_empty() && pending.capacity() > 0 {
            pending = BytesMut::new();
        }
        let deadline = next_ping.min(last_heard + idle);
        tokio::select! {
            biased;
            _ = control.closed.cancelled() => break End::Server,
            _ = shutdown.cancelled() => {
                control.close(CloseCode::Restarting);
                break End::Server;
            }
            ready = stream.readable() => {
                if ready.is_err() {
                    break End::Gone;
                }
                if pending.capacity() - pending.len() < READ_CHUNK / 4 {
                    pending.reserve(READ_CHUNK);
                }
                match stream.try_read_buf(&mut pending) {
                    Ok(0) => break End::Gone,
                    Ok(_) => last_heard = Instant::now(),
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                    Err(_) => break End::Gone,
                }
            }
            first = rx.recv() => {
                let hold = coalesce::hold_until(last_write, Instant::now(), coalesce);
                let batch = write_batch(&node, &stream, &control, hold, first, &mut rx, &mut unfinished);
                if Box::pin(batch).await.is_err() {
                    break failed_write(&control);
                }
                last_write = Some(Instant::now());
            }
            _ = tokio::time::sleep_until(deadline) => {
                let now = Instant::now();
                if now >= last_heard + idle {
                    control.close(CloseCode::HeartbeatTimeout);
                    break End::Server;
                }
                if now >= next_ping {
                    next_ping = now + heartbeat;
                    // Quiet for a heartbeat interval, most likely: keep nothing.
                    rx.release_idle_memory();
                    if write_control(&stream, &control, ServerOp::Ping, &[], &mut unfinished).await.is_err() {
                        break failed_write(&control);
                    }
                }
            }
        }
    };

    // The ending runs once: boxed, so its state is not part of every idle
    // connection's task.
    Box::pin(async {
        conn.disconnect_all().await;
        if let End::Server = end {
            let code = control.close_code().unwrap_or(CloseCode::Normal.code());
            if code == CloseCode::SlowConsumer.code() {
                node.metrics.slow_consumers.increment(1);
            }
            let mut payload = code.to_be_bytes().to_vec();
            payload.extend_from_slice(close_reason(code).as_bytes());
            // The control is cancelled by now: write without watching it.
            let wrote = tokio::time::timeout(CLOSE_WAIT, async {
                let mut out = std::mem::take(&mut unfinished);
                put_header(&mut out, ServerOp::Close, payload.len());
                out.extend_from_slice(&payload);
                write_all(&stream, &out).await
            })
            .await;
            if matches!(wrote, Ok(Ok(()))) {
                // Read (and drop) what the client still sends until its Close, so
                // the socket ends cleanly rather than with a reset that could
                // destroy our Close before the client reads it.
                let _ = tokio::time::timeout(CLOSE_WAIT, async {
                    loop {
                        match reader.next(&mut pending) {
                            Ok(Some(Incoming::Close(_))) | Err(_) => return,
                            Ok(Some(_)) => continue,
                            Ok(None) => {}
                        }
                        if stream.readable().await.is_err() {
                            return;
                        }
                        pending.reserve(READ_CHUNK);
                        match stream.try_read_buf(&mut pending) {
                            Ok(0) => return,
                            Ok(_) => {}
                            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                            Err(_) => return,
                        }
                    }
                })
                .await;
            }
        }
    })
    .await;
    control.close(CloseCode::Normal);
    drop(rx);
    node.connection_closed();
}

/// A write stopped: because the server closed the connection meanwhile
/// (then a Close frame follows), or because the socket failed.
fn failed_write(control: &ConnectionControl) -> End {
    if control.closed.is_cancelled() {
        End::Server
    } else {
        End::Gone
    }
}

fn close_reason(code: u16) -> &'static str {
    match code {
        1012 => "server restarting: reconnect and resume",
        4001 => "heartbeat timeout",
        4002 => "slow consumer: resume to catch up",
        4003 => "rate limit ignored",
        1009 => "message too big",
        1007 => "invalid payload",
        1002 => "protocol error",
        _ => "",
    }
}

/// Writes the first queued frame and everything else queued (up to
/// [`MAX_BATCH`]) in one buffer, after waiting until `hold` (see
/// [`coalesce`]) so that frames arriving meanwhile join the batch.
async fn write_batch(
    node: &Node,
    stream: &TcpStream,
    control: &ConnectionControl,
    hold: Option<Instant>,
    first: Outgoing,
    rx: &mut OutboxReceiver,
    unfinished: &mut Vec<u8>,
) -> io::Result<()> {
    if let Some(at) = hold {
        tokio::select! {
            biased;
            _ = control.closed.cancelled() => return Err(io::ErrorKind::ConnectionAborted.into()),
            _ = tokio::time::sleep_until(at) => {}
        }
    }
    let oldest = first.ordered_at;
    let mut out = Vec::with_capacity(first.frame.len() + 16);
    let mut frames = 0u64;
    let mut next = Some(first);
    while let Some(item) = next.take() {
        put_header(&mut out, ServerOp::Text, item.frame.len());
        out.extend_from_slice(&item.frame);
        frames += 1;
        if frames < MAX_BATCH as u64 {
            next = rx.try_recv().ok();
        }
    }
    guarded_write(stream, control, &out, unfinished).await?;
    let m = &node.metrics;
    m.frames_out.increment(frames);
    m.bytes_out.increment(out.len() as u64);
    if let Some(t) = oldest {
        m.latency(t.elapsed());
    }
    Ok(())
}

async fn write_control(
    stream: &TcpStream,
    control: &ConnectionControl,
    op: ServerOp,
    payload: &[u8],
    unfinished: &mut Vec<u8>,
) -> io::Result<()> {
    let mut out = Vec::with_capacity(payload.len() + 2);
    put_header(&mut out, op, payload.len());
    out.extend_from_slice(payload);
    guarded_write(stream, control, &out, unfinished).await
}

/// Writes everything, unless the connection is closed meanwhile (e.g. as a
/// slow consumer while this write waits for the client to read). Then the
/// unwritten rest goes to `unfinished`: a frame may be half written, and the
/// Close frame must follow its end, not cut into it.
async fn guarded_write(
    stream: &TcpStream,
    control: &ConnectionControl,
    buf: &[u8],
    unfinished: &mut Vec<u8>,
) -> io::Result<()> {
    let mut rest = buf;
    while !rest.is_empty() {
        tokio::select! {
            biased;
            ready = stream.writable() => ready?,
            _ = control.closed.cancelled() => {
                unfinished.extend_from_slice(rest);
                return Err(io::ErrorKind::ConnectionAborted.into());
            }
        }
        match stream.try_write(rest) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => rest = &rest[n..],
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

async fn write_all(stream: &TcpStream, mut buf: &[u8]) -> io::Result<()> {
    while !buf.is_empty() {
        stream.writable().await?;
        match stream.try_write(buf) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => buf = &buf[n..],
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use plaza_broker::MemoryBroker;

    use crate::{Node, ServerConfig};

    /// Each connection is one task holding this future: keep it small, since
    /// an idle connection's memory is mostly this plus its queue.
    #[tokio::test]
    async fn a_connection_task_stays_small() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let stream = tokio::net::TcpStream::connect(listener.local_addr().unwrap())
            .await
            .unwrap();
        let node = Node::new(ServerConfig::default(), Arc::new(MemoryBroker::new()));
        let task = super::serve_socket(node, stream, bytes::Bytes::new());
        let size = std::mem::size_of_val(&task);
        assert!(size <= 1280, "serve_socket future has {size} bytes");
    }
}
