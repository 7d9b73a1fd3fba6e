//! Plaza's HTTP transports as a load client uses them (docs/protocol.md,
//! "HTTP transports"): a session opened by `POST /v1/sessions`, client frames
//! sent by `POST .../send` on one keep-alive connection, server frames read
//! on a second one, from an event stream or by polls (held or not), as a
//! browser does with its connections to one host.

use std::io;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming as Body;
use hyper::client::conn::http1::{self, SendRequest};
use hyper::{Request, StatusCode};
use hyper_util::rt::TokioIo;
use serde::Deserialize;
use serde_json::value::RawValue;
use tokio::net::{TcpSocket, TcpStream};
use tokio::time::Instant;

use super::{Counted, Endpoint, SocketTally, Transport};
use crate::wsclient::Incoming;

/// Longest answer body read whole (a poll's frames, a response).
const MAX_BODY: usize = 16 * 1024 * 1024;
/// How long a long poll is held at most (the server's own bound).
const LONG_POLL_WAIT_MS: u64 = 25_000;

/// One keep-alive HTTP/1.1 connection to the server.
struct Connection {
    sender: SendRequest<Full<Bytes>>,
    host: String,
    tally: Option<Arc<SocketTally>>,
}

impl Connection {
    async fn open(at: &Endpoint<'_>) -> io::Result<Connection> {
        let stream = match at.bind {
            Some(ip) => {
                let socket = if at.addr.is_ipv4() {
                    TcpSocket::new_v4()?
                } else {
                    TcpSocket::new_v6()?
                };
                socket.bind(std::net::SocketAddr::new(ip, 0))?;
                socket.connect(at.addr).await?
            }
            None => TcpStream::connect(at.addr).await?,
        };
        stream.set_nodelay(true)?;
        let io = TokioIo::new(Counted::new(stream, at.tally.clone()));
        let (sender, conn) = http1::handshake(io).await.map_err(io::Error::other)?;
        tokio::spawn(async move {
            // Ends when the connection closes; its errors surface on requests.
            let _ = conn.await;
        });
        Ok(Connection {
            sender,
            host: at.host.to_owned(),
            tally: at.tally.clone(),
        })
    }

    /// Sends a request and returns the response with its body still to read.
    async fn request(
        &mut self,
        method: &str,
        path: &str,
        body: Option<&[u8]>,
        headers: &[(&str, &str)],
    ) -> io::Result<hyper::Response<Body>> {
        let mut req = Request::builder()
            .method(method)
            .uri(path)
            .header(hyper::header::HOST, &self.host);
        if body.is_some() {
            req = req.header(hyper::header::CONTENT_TYPE, "application/json");
        }
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        let req = req
            .body(Full::new(Bytes::copy_from_slice(body.unwrap_or_default())))
            .map_err(io::Error::other)?;
        self.sender.ready().await.map_err(io::Error::other)?;
        if let Some(t) = &self.tally {
            t.requests.fetch_add(1, Ordering::Relaxed);
        }
        self.sender
            .send_request(req)
            .await
            .map_err(io::Error::other)
    }

    /// Sends a request and reads its whole answer.
    async fn call(
        &mut self,
        method: &str,
        path: &str,
        body: Option<&[u8]>,
    ) -> io::Result<(StatusCode, Bytes)> {
        let resp = self.request(method, path, body, &[]).await?;
        let status = resp.status();
        Ok((status, read_body(resp.into_body()).await?))
    }
}

async fn read_body(body: Body) -> io::Result<Bytes> {
    let body = http_body_util::Limited::new(body, MAX_BODY);
    Ok(body.collect().await.map_err(io::Error::other)?.to_bytes())
}

fn refused(what: &str, status: StatusCode, body: &[u8]) -> io::Error {
    let text = String::from_utf8_lossy(&body[..body.len().min(200)]).into_owned();
    io::Error::other(format!("{what}: {status} {text}"))
}

/// Opens a transport session at `sessions_path` (which may carry a room
/// hint as its query) and the connection its frames are read on.
pub(super) async fn open(
    at: &Endpoint<'_>,
    transport: Transport,
    sessions_path: &str,
) -> io::Result<(HttpReader, HttpWriter)> {
    let (base, hint) = match sessions_path.split_once('?') {
        Some((base, query)) => (base, format!("?{query}")),
        None => (sessions_path, String::new()),
    };
    let mut conn = Connection::open(at).await?;
    let (status, body) = conn.call("POST", sessions_path, None).await?;
    if status != StatusCode::CREATED {
        return Err(refused("open session", status, &body));
    }
    #[derive(Deserialize)]
    struct Opened {
        session: String,
    }
    let opened: Opened = serde_json::from_slice(&body).map_err(io::Error::other)?;
    let session = format!("{base}/{}", opened.session);
    // Further parameters follow the hint in the query.
    let and = if hint.is_empty() { "?" } else { "&" };
    let read = Connection::open(at).await?;
    let reader = match transport {
        Transport::Sse => HttpReader::Sse(SseReader {
            conn: read,
            path: format!("{session}/events{hint}"),
            body: None,
            buf: BytesMut::new(),
        }),
        Transport::LongPolling | Transport::Polling { .. } => {
            let every = match transport {
                Transport::Polling { every } => Some(every),
                _ => None,
            };
            HttpReader::Poll(PollReader {
                conn: read,
                path: format!("{session}/poll{hint}{and}"),
                ack: 0,
                every,
                next_at: Instant::now(),
            })
        }
        Transport::WebSocket => unreachable!("opened by the WebSocket client"),
    };
    Ok((
        reader,
        HttpWriter {
            conn,
            send_path: format!("{session}/send{hint}"),
            session_path: format!("{session}{hint}"),
        },
    ))
}

/// Reads a session's server frames.
pub enum HttpReader {
    /// From an event stream.
    Sse(SseReader),
    /// By polls.
    Poll(PollReader),
}

impl HttpReader {
    /// Waits for frames and hands each to `on` (the session's end as a
    /// `Close`). Returns the bytes of body read; 0 means the server closed.
    pub async fn read_some(&mut self, mut on: impl FnMut(Incoming<'_>)) -> io::Result<usize> {
        match self {
            HttpReader::Sse(r) => r.read_some(&mut on).await,
            HttpReader::Poll(r) => r.read_some(&mut on).await,
        }
    }
}

/// Server frames from `GET .../events`.
pub struct SseReader {
    conn: Connection,
    path: String,
    /// The stream, once requested.
    body: Option<Body>,
    /// Received and not yet a whole event.
    buf: BytesMut,
}

impl SseReader {
    async fn read_some(&mut self, on: &mut impl FnMut(Incoming<'_>)) -> io::Result<usize> {
        let body = match &mut self.body {
            Some(body) => body,
            None => {
                let resp = self
                    .conn
                    .request("GET", &self.path, None, &[("accept", "text/event-stream")])
                    .await?;
                if resp.status() != StatusCode::OK {
                    let status = resp.status();
                    let body = read_body(resp.into_body()).await.unwrap_or_default();
                    return Err(refused("event stream", status, &body));
                }
                self.body.insert(resp.into_body())
            }
        };
        loop {
            let Some(frame) = body.frame().await else {
                return Ok(0);
            };
            let Ok(data) = frame.map_err(io::Error::other)?.into_data() else {
                continue;
            };
            if data.is_empty() {
                continue;
            }
            self.buf.extend_from_slice(&data);
            dispatch_events(&mut self.buf, on)?;
            return Ok(data.len());
        }
    }
}

/// Hands every whole event in `buf` to `on` and drops its bytes: `data` as a
/// message, `event: closed` as the session's close code; comments (pings)
/// and ids are skipped.
fn dispatch_events(buf: &mut BytesMut, on: &mut impl FnMut(Incoming<'_>)) -> io::Result<()> {
    while let Some(end) = crate::driver::finder!(b"\n\n").find(buf) {
        let event = buf.split_to(end + 2);
        let mut data: Option<&[u8]> = None;
        let mut closed = false;
        for line in event[..end].split(|&b| b == b'\n') {
            let field = |name: &[u8]| {
                line.strip_prefix(name)
                    .map(|v| v.strip_prefix(b" ").unwrap_or(v))
            };
            if let Some(v) = field(b"data:") {
                if data.is_some() {
                    // Plaza's frames are one line each.
                    return Err(io::Error::other("multi-line event data"));
                }
                data = Some(v);
            } else if field(b"event:") == Some(b"closed") {
                closed = true;
            }
        }
        match (closed, data) {
            (true, d) => {
                #[derive(Deserialize)]
                struct Closed {
                    code: u16,
                }
                let code = d
                    .and_then(|d| serde_json::from_slice::<Closed>(d).ok())
                    .map(|c| c.code);
                on(Incoming::Close(code));
            }
            (false, Some(d)) => on(Incoming::Message(d)),
            (false, None) => {}
        }
    }
    Ok(())
}

/// Server frames from `GET .../poll`: held by the server until frames are
/// ready (long polling) or answered at once on a fixed cadence (polling).
pub struct PollReader {
    conn: Connection,
    /// `.../poll?` (with the room hint, if any).
    path: String,
    /// The last position received: acknowledged by the next poll.
    ack: u64,
    /// Polling: time between polls; `None`: long polling.
    every: Option<Duration>,
    next_at: Instant,
}

#[derive(Deserialize)]
struct PollAnswer<'a> {
    #[serde(borrow)]
    frames: Vec<&'a RawValue>,
    last: u64,
    #[serde(default)]
    closed: Option<u16>,
}

impl PollReader {
    async fn read_some(&mut self, on: &mut impl FnMut(Incoming<'_>)) -> io::Result<usize> {
        loop {
            let wait_ms = match self.every {
                Some(every) => {
                    tokio::time::sleep_until(self.next_at).await;
                    self.next_at = (self.next_at + every).max(Instant::now());
                    0
                }
                None => LONG_POLL_WAIT_MS,
            };
            let path = format!("{}ack={}&wait_ms={wait_ms}", self.path, self.ack);
            let (status, body) = self.conn.call("GET", &path, None).await?;
            if status != StatusCode::OK {
                return Err(refused("poll", status, &body));
            }
            let answer: PollAnswer<'_> = serde_json::from_slice(&body).map_err(io::Error::other)?;
            for f in &answer.frames {
                on(Incoming::Message(f.get().as_bytes()));
            }
            self.ack = self.ack.max(answer.last);
            if let Some(code) = answer.closed {
                on(Incoming::Close(Some(code)));
            }
            if !answer.frames.is_empty() || answer.closed.is_some() {
                return Ok(body.len());
            }
        }
    }
}

/// Sends a session's client frames, one request each, and ends the session.
pub struct HttpWriter {
    conn: Connection,
    send_path: String,
    session_path: String,
}

impl HttpWriter {
    /// Sends one client frame; the server's answer (202) is awaited.
    pub async fn send(&mut self, frame: &[u8]) -> io::Result<()> {
        let (status, body) = self.conn.call("POST", &self.send_path, Some(frame)).await?;
        if status != StatusCode::ACCEPTED {
            return Err(refused("send", status, &body));
        }
        Ok(())
    }

    /// Ends the session (`DELETE`).
    pub async fn close(&mut self) -> io::Result<()> {
        let (status, body) = self.conn.call("DELETE", &self.session_path, None).await?;
        if !status.is_success() && status != StatusCode::NOT_FOUND {
            return Err(refused("close", status, &body));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn events(stream: &[&[u8]]) -> Vec<String> {
        let mut buf = BytesMut::new();
        let mut got = Vec::new();
        for chunk in stream {
            buf.extend_from_slice(chunk);
            dispatch_events(&mut buf, &mut |m| {
                got.push(match m {
                    Incoming::Message(d) => String::from_utf8_lossy(d).into_owned(),
                    Incoming::Close(c) => format!("close {c:?}"),
                    Incoming::Ping(_) => "ping".into(),
                })
            })
            .unwrap();
        }
        assert!(buf.is_empty(), "a whole stream leaves nothing behind");
        got
    }

    #[test]
    fn events_split_across_chunks_are_whole_and_comments_skipped() {
        let got = events(&[
            b"id: 1\ndata: {\"a\":1}\n\n: ping\n\nid: 2\nda",
            b"ta: {\"b\":2}\n",
            b"\nevent: closed\ndata: {\"code\":4002}\n\n",
        ]);
        assert_eq!(got, ["{\"a\":1}", "{\"b\":2}", "close Some(4002)"]);
    }
}
