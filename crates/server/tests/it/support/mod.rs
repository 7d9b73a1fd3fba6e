//! Test harness: a real node on an ephemeral port, real WebSocket clients.
#![allow(dead_code)]

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use futures_util::{SinkExt, StreamExt};
use plaza_broker::{Cluster, MemoryCluster, MemoryTicketStore};
use plaza_server::{Node, ServerConfig};
use serde_json::{json, Value};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::protocol::frame::coding::{Data, OpCode};
use tokio_tungstenite::tungstenite::protocol::frame::Frame;
use tokio_tungstenite::tungstenite::protocol::CloseFrame;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::WebSocketStream;

/// How long a test waits for an expected frame before failing: a deadline,
/// not a speed. Frames take milliseconds; a busy 2-core machine running the
/// suite beside other work can hold one for seconds, and the coalescing tests
/// hold frames for seconds by design.
pub const WAIT: Duration = Duration::from_secs(30);

/// A node serving on 127.0.0.1 with an ephemeral port.
pub struct TestServer {
    pub addr: SocketAddr,
    pub node: Arc<Node>,
    pub task: tokio::task::JoinHandle<std::io::Result<()>>,
    pub http: reqwest::Client,
}

impl TestServer {
    pub async fn start() -> TestServer {
        Self::with_config(ServerConfig::default()).await
    }

    /// A node with `config`. With `TEST_PLAZA_CLUSTER=memory` in the
    /// environment it runs in cluster mode (alone, over an in-process
    /// cluster), so that every test checks cluster mode behaves the same.
    pub async fn with_config(config: ServerConfig) -> TestServer {
        if std::env::var("TEST_PLAZA_CLUSTER").as_deref() == Ok("memory") {
            let hub = MemoryCluster::new();
            return Self::clustered(config, Arc::new(MemoryTicketStore::new()), hub.node("solo"))
                .await;
        }
        Self::serve(config, |config| {
            Node::new(config, Arc::new(MemoryTicketStore::new()))
        })
        .await
    }

    /// A cluster-mode node sharing `broker` (tickets) and `cluster` with others.
    pub async fn clustered(
        config: ServerConfig,
        broker: Arc<MemoryTicketStore>,
        cluster: Arc<dyn Cluster>,
    ) -> TestServer {
        Self::serve(config, |config| Node::clustered(config, broker, cluster)).await
    }

    async fn serve(
        mut config: ServerConfig,
        node: impl FnOnce(ServerConfig) -> Arc<Node>,
    ) -> TestServer {
        config.listen = "127.0.0.1:0".into();
        let listener = tokio::net::TcpListener::bind(&config.listen).await.unwrap();
        let addr = listener.local_addr().unwrap();
        let node = node(config);
        let task = tokio::spawn(plaza_server::serve(node.clone(), listener));
        TestServer {
            addr,
            node,
            task,
            http: reqwest::Client::new(),
        }
    }

    /// Like [`TestServer::with_config`], but serves the router with plain
    /// `axum::serve`, without the node's graceful shutdown: after
    /// `node.shutdown()` the HTTP API keeps answering, so what the handlers say
    /// while the node shuts down can be observed.
    pub async fn without_graceful_shutdown(mut config: ServerConfig) -> TestServer {
        config.listen = "127.0.0.1:0".into();
        let listener = tokio::net::TcpListener::bind(&config.listen).await.unwrap();
        let addr = listener.local_addr().unwrap();
        let node = Node::new(config, Arc::new(MemoryTicketStore::new()));
        let app = plaza_server::router(node.clone());
        let task = tokio::spawn(async move { axum::serve(listener, app).await });
        TestServer {
            addr,
            node,
            task,
            http: reqwest::Client::new(),
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{}", self.addr, path)
    }

    /// POST /v1/rooms; panics unless 201.
    pub async fn create_room(&self, body: Value) -> Value {
        let r = self
            .http
            .post(self.url("/v1/rooms"))
            .json(&body)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 201, "create room {body}");
        r.json().await.unwrap()
    }

    /// POST /v1/rooms/{id}/tickets; panics unless 201. Returns the ticket.
    pub async fn ticket(&self, room: &str, name: &str, platform: &str) -> String {
        let r = self
            .http
            .post(self.url(&format!("/v1/rooms/{room}/tickets")))
            .json(&json!({"name": name, "platform": platform}))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 201);
        let v: Value = r.json().await.unwrap();
        v["ticket"].as_str().unwrap().to_owned()
    }

    /// GET a path; returns the status and the JSON body (`Null` if the body is not JSON).
    pub async fn get(&self, path: &str) -> (u16, Value) {
        let r = self.http.get(self.url(path)).send().await.unwrap();
        let status = r.status().as_u16();
        let text = r.text().await.unwrap();
        (status, serde_json::from_str(&text).unwrap_or(Value::Null))
    }

    /// GET a path; returns the status and the body text.
    pub async fn get_text(&self, path: &str) -> (u16, String) {
        let r = self.http.get(self.url(path)).send().await.unwrap();
        let status = r.status().as_u16();
        (status, r.text().await.unwrap())
    }

    /// POST a JSON body; returns the status and the JSON body.
    pub async fn post(&self, path: &str, body: &Value) -> (u16, Value) {
        let r = self
            .http
            .post(self.url(path))
            .json(body)
            .send()
            .await
            .unwrap();
        let status = r.status().as_u16();
        let text = r.text().await.unwrap();
        (status, serde_json::from_str(&text).unwrap_or(Value::Null))
    }

    /// POST a raw body with a JSON content type; returns the status and the JSON body.
    pub async fn post_raw(&self, path: &str, body: &str) -> (u16, Value) {
        let r = self
            .http
            .post(self.url(path))
            .header("content-type", "application/json")
            .body(body.to_owned())
            .send()
            .await
            .unwrap();
        let status = r.status().as_u16();
        let text = r.text().await.unwrap();
        (status, serde_json::from_str(&text).unwrap_or(Value::Null))
    }

    /// POST `body` with the given `Content-Type` (none when `None`); returns the
    /// status, the response's content type and the JSON body (`Null` if not JSON).
    pub async fn post_body(
        &self,
        path: &str,
        content_type: Option<&str>,
        body: impl Into<reqwest::Body>,
    ) -> (u16, String, Value) {
        let mut req = self.http.post(self.url(path)).body(body);
        if let Some(ct) = content_type {
            req = req.header("content-type", ct);
        }
        let r = req.send().await.unwrap();
        let status = r.status().as_u16();
        let ct = r
            .headers()
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_owned();
        let text = r.text().await.unwrap();
        (
            status,
            ct,
            serde_json::from_str(&text).unwrap_or(Value::Null),
        )
    }

    /// DELETE a path; returns the status and the JSON body (`Null` when empty).
    pub async fn delete(&self, path: &str) -> (u16, Value) {
        let r = self.http.delete(self.url(path)).send().await.unwrap();
        let status = r.status().as_u16();
        let text = r.text().await.unwrap();
        (status, serde_json::from_str(&text).unwrap_or(Value::Null))
    }

    /// The value of one sample in `/metrics`, e.g. `plaza_errors_total{code="bad_json"}`.
    pub async fn metric(&self, sample: &str) -> Option<f64> {
        let (status, text) = self.get_text("/metrics").await;
        assert_eq!(status, 200);
        text.lines().find_map(|l| {
            let rest = l.strip_prefix(sample)?;
            rest.strip_prefix(' ')?.trim().parse().ok()
        })
    }

    /// Polls GET /v1/rooms/{id} until its member count is `n` (bounded by [`WAIT`]).
    pub async fn wait_members(&self, room: &str, n: u64) {
        let path = format!("/v1/rooms/{room}");
        let start = Instant::now();
        loop {
            let (status, v) = self.get(&path).await;
            assert_eq!(status, 200, "GET {path}: {v}");
            if v["members"] == n {
                return;
            }
            assert!(
                start.elapsed() < WAIT,
                "room {room} never had {n} members; last: {v}"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    pub async fn connect(&self) -> Client {
        Client::connect(self.addr).await
    }

    /// Connects and sends a `join` frame; returns the client and the answer
    /// (`joined`, `resync` or `error`).
    pub async fn join_with(&self, join: Value) -> (Client, Value) {
        let mut c = self.connect().await;
        c.send(join).await;
        let answer = c.recv().await;
        (c, answer)
    }

    /// Joins `names` to an open room one after the other, then waits until
    /// every client has seen the `presence.join` of every later one, so that
    /// nothing from the joins is left in flight.
    pub async fn join_all(&self, room: &str, names: &[&str]) -> Vec<(Client, Value)> {
        let mut out: Vec<(Client, Value)> = Vec::new();
        for name in names {
            let (c, joined) = self.join(room, name).await;
            out.push((c, joined));
        }
        let sessions: Vec<Value> = out.iter().map(|(_, j)| j["session"].clone()).collect();
        for (i, (c, _)) in out.iter_mut().enumerate() {
            for s in &sessions[i + 1..] {
                let ev = c.recv_type("event").await;
                assert_eq!(ev["kind"], "presence.join", "{ev}");
                assert_eq!(&ev["member"]["session"], s, "{ev}");
            }
        }
        for (c, _) in out.iter_mut() {
            assert_eq!(c.drain().await, Vec::<Value>::new());
        }
        out
    }

    /// Connects and joins an open room; returns the client and its `joined` frame.
    pub async fn join(&self, room: &str, name: &str) -> (Client, Value) {
        let mut c = self.connect().await;
        c.send(json!({"type": "join", "room": room, "name": name}))
            .await;
        let joined = c.recv_type("joined").await;
        (c, joined)
    }
}

/// A TCP stream whose outgoing bytes can be cut: once muted, writes are
/// silently discarded, so not even tungstenite's automatic pongs reach the
/// server, while everything the server sends can still be read.
pub struct Mutable {
    tcp: TcpStream,
    muted: Arc<AtomicBool>,
}

impl AsyncRead for Mutable {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.tcp).poll_read(cx, buf)
    }
}

impl AsyncWrite for Mutable {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        if self.muted.load(Ordering::Acquire) {
            return Poll::Ready(Ok(buf.len()));
        }
        Pin::new(&mut self.tcp).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        if self.muted.load(Ordering::Acquire) {
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut self.tcp).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        if self.muted.load(Ordering::Acquire) {
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut self.tcp).poll_shutdown(cx)
    }
}

/// A WebSocket client speaking Plaza JSON frames.
pub struct Client {
    pub ws: WebSocketStream<Mutable>,
    muted: Arc<AtomicBool>,
}

/// What ended a connection, as seen by the client.
#[derive(Debug, PartialEq)]
pub enum Closed {
    Code(u16),
    NoFrame,
}

impl Client {
    pub async fn connect(addr: SocketAddr) -> Client {
        Self::try_connect(addr).await.unwrap()
    }

    /// Connects to `path` (`/v1/ws?token=...`, say) rather than `/v1/ws`.
    pub async fn connect_to(addr: SocketAddr, path: &str) -> Client {
        let tcp = TcpStream::connect(addr).await.unwrap();
        let muted = Arc::new(AtomicBool::new(false));
        let stream = Mutable {
            tcp,
            muted: muted.clone(),
        };
        let (ws, _) = tokio_tungstenite::client_async(format!("ws://{addr}{path}"), stream)
            .await
            .unwrap();
        Client { ws, muted }
    }

    /// Connects with a receive buffer of about `bytes` (SO_RCVBUF, set
    /// before connecting so that the TCP window is small from the start): a
    /// client that then stops reading holds little in its kernel, and the
    /// server's send queue fills after fewer frames.
    pub async fn connect_with_receive_buffer(addr: SocketAddr, bytes: u32) -> Client {
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket.set_recv_buffer_size(bytes).unwrap();
        let tcp = socket.connect(addr).await.unwrap();
        let muted = Arc::new(AtomicBool::new(false));
        let stream = Mutable {
            tcp,
            muted: muted.clone(),
        };
        let (ws, _) = tokio_tungstenite::client_async(format!("ws://{addr}/v1/ws"), stream)
            .await
            .unwrap();
        Client { ws, muted }
    }

    /// Connects offering the WebSocket subprotocols `offer` (e.g.
    /// `plaza.v1.compact`); returns the client and the one the server chose.
    pub async fn connect_offering(addr: SocketAddr, offer: &str) -> (Client, Option<String>) {
        use tokio_tungstenite::tungstenite::client::IntoClientRequest;
        let tcp = TcpStream::connect(addr).await.unwrap();
        let muted = Arc::new(AtomicBool::new(false));
        let stream = Mutable {
            tcp,
            muted: muted.clone(),
        };
        let mut req = format!("ws://{addr}/v1/ws").into_client_request().unwrap();
        req.headers_mut()
            .insert("sec-websocket-protocol", offer.parse().unwrap());
        let (ws, response) = tokio_tungstenite::client_async(req, stream).await.unwrap();
        let chosen = response
            .headers()
            .get("sec-websocket-protocol")
            .map(|v| v.to_str().unwrap().to_owned());
        (Client { ws, muted }, chosen)
    }

    /// Connects, returning the handshake error instead of panicking.
    pub async fn try_connect(
        addr: SocketAddr,
    ) -> Result<Client, tokio_tungstenite::tungstenite::Error> {
        let tcp = TcpStream::connect(addr).await?;
        let muted = Arc::new(AtomicBool::new(false));
        let stream = Mutable {
            tcp,
            muted: muted.clone(),
        };
        let (ws, _) = tokio_tungstenite::client_async(format!("ws://{addr}/v1/ws"), stream).await?;
        Ok(Client { ws, muted })
    }

    /// From now on nothing this client writes reaches the server, not even
    /// the automatic answers to the server's WebSocket pings.
    pub fn mute(&self) {
        self.muted.store(true, Ordering::Release);
    }

    /// Sends any WebSocket message.
    pub async fn send_message(&mut self, m: Message) {
        self.ws.send(m).await.unwrap();
    }

    /// Sends a text frame whose payload is `bytes`, valid UTF-8 or not.
    pub async fn send_text_bytes(&mut self, bytes: &[u8]) {
        let frame = Frame::message(bytes.to_vec(), OpCode::Data(Data::Text), true);
        self.ws.send(Message::Frame(frame)).await.unwrap();
    }

    /// Sends a `publish` and waits for its `ack`; returns the ack and the frames before it.
    pub async fn publish(&mut self, room: &str, event: &str, data: Value) -> (Value, Vec<Value>) {
        self.send(json!({"type": "publish", "room": room, "event": event, "data": data}))
            .await;
        self.recv_until(|v| v["type"] == "ack").await
    }

    /// Receives until a frame matches `pred`; returns it and the frames before it.
    pub async fn recv_until(
        &mut self,
        mut pred: impl FnMut(&Value) -> bool,
    ) -> (Value, Vec<Value>) {
        let mut before = Vec::new();
        loop {
            let v = self.recv().await;
            if pred(&v) {
                return (v, before);
            }
            before.push(v);
        }
    }

    /// The next room event of this `kind`; returns it and the frames before it.
    pub async fn recv_event(&mut self, kind: &str) -> (Value, Vec<Value>) {
        self.recv_until(|v| v["type"] == "event" && v["kind"] == kind)
            .await
    }

    /// The next text frame, unparsed (skipping WebSocket pings/pongs).
    pub async fn recv_text(&mut self) -> String {
        loop {
            let msg = tokio::time::timeout(WAIT, self.ws.next())
                .await
                .expect("timed out waiting for a frame")
                .expect("connection ended")
                .expect("websocket error");
            match msg {
                Message::Text(t) => return t.to_string(),
                Message::Ping(_) | Message::Pong(_) | Message::Frame(_) => continue,
                other => panic!("expected a text frame, got {other:?}"),
            }
        }
    }

    /// Sends a ping and expects its pong right away: the connection still works.
    pub async fn assert_alive(&mut self) {
        assert_eq!(self.drain().await, Vec::<Value>::new());
    }

    pub async fn send(&mut self, v: Value) {
        self.ws.send(Message::text(v.to_string())).await.unwrap();
    }

    pub async fn send_raw(&mut self, text: &str) {
        self.ws.send(Message::text(text.to_owned())).await.unwrap();
    }

    /// The next Plaza frame (skipping WebSocket pings/pongs); panics on close or timeout.
    pub async fn recv(&mut self) -> Value {
        loop {
            let msg = tokio::time::timeout(WAIT, self.ws.next())
                .await
                .expect("timed out waiting for a frame")
                .expect("connection ended")
                .expect("websocket error");
            match msg {
                Message::Text(t) => return serde_json::from_str(&t).unwrap(),
                Message::Binary(b) => return serde_json::from_slice(&b).unwrap(),
                Message::Ping(_) | Message::Pong(_) | Message::Frame(_) => continue,
                Message::Close(c) => panic!("connection closed: {c:?}"),
            }
        }
    }

    /// The next frame, which must have this `type`.
    pub async fn recv_type(&mut self, t: &str) -> Value {
        let v = self.recv().await;
        assert_eq!(v["type"], t, "expected a {t} frame, got {v}");
        v
    }

    /// Sends an application ping and returns every frame received before its pong.
    /// Everything the server queued for this connection before reading the ping
    /// arrives first, so this is a barrier, not a sleep.
    pub async fn drain(&mut self) -> Vec<Value> {
        self.send(json!({"type": "ping", "ts": -1.0})).await;
        let mut out = Vec::new();
        loop {
            let v = self.recv().await;
            if v["type"] == "pong" && v["ts"] == -1.0 {
                return out;
            }
            out.push(v);
        }
    }

    /// Sends a request and returns its response (frames before it are returned too).
    pub async fn request(
        &mut self,
        room: &str,
        nonce: Value,
        op: &str,
        args: Value,
    ) -> (Value, Vec<Value>) {
        self.send(json!({"type": "request", "room": room, "nonce": nonce, "op": op, "args": args}))
            .await;
        let mut before = Vec::new();
        loop {
            let v = self.recv().await;
            if v["type"] == "response" && v["nonce"] == nonce {
                return (v, before);
            }
            before.push(v);
        }
    }

    /// Sends a ready-made `request` frame and returns the response with its nonce
    /// (frames before it are returned too).
    pub async fn send_and_response(&mut self, frame: Value) -> (Value, Vec<Value>) {
        let nonce = frame["nonce"].clone();
        self.send(frame).await;
        self.recv_until(|v| v["type"] == "response" && v["nonce"] == nonce)
            .await
    }

    /// Waits for the server to close the connection and returns its close code.
    pub async fn closed(&mut self) -> Closed {
        loop {
            match tokio::time::timeout(WAIT, self.ws.next())
                .await
                .expect("timed out waiting for close")
            {
                None => return Closed::NoFrame,
                Some(Err(e)) => {
                    eprintln!("closed(): read error {e}");
                    return Closed::NoFrame;
                }
                Some(Ok(Message::Close(Some(CloseFrame { code, .. })))) => {
                    return Closed::Code(code.into())
                }
                Some(Ok(Message::Close(None))) => return Closed::NoFrame,
                Some(Ok(_)) => continue,
            }
        }
    }
}

/// Wall-clock Unix milliseconds, as the server reads them.
pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

/// Polls `cond` until it holds, at most for [`WAIT`]; returns whether it did.
/// Only for what no frame announces (time passing, counters the server updates
/// after writing); never a substitute for awaiting a frame.
pub async fn wait_until<F, Fut>(mut cond: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let start = Instant::now();
    loop {
        if cond().await {
            return true;
        }
        if start.elapsed() > WAIT {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Only the frames of a list that are room events of `kind`.
pub fn of_kind<'a>(frames: &'a [Value], kind: &str) -> Vec<&'a Value> {
    frames
        .iter()
        .filter(|v| v["type"] == "event" && v["kind"] == kind)
        .collect()
}
