//! Test harness: a real node on an ephemeral port, real WebSocket clients.
#![allow(dead_code)]

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use plaza_broker::MemoryBroker;
use plaza_server::{Node, ServerConfig};
use serde_json::{json, Value};
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::protocol::CloseFrame;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};

/// How long a test waits for an expected frame before failing.
pub const WAIT: Duration = Duration::from_secs(10);

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

    pub async fn with_config(mut config: ServerConfig) -> TestServer {
        config.listen = "127.0.0.1:0".into();
        let listener = tokio::net::TcpListener::bind(&config.listen).await.unwrap();
        let addr = listener.local_addr().unwrap();
        let node = Node::new(config, Arc::new(MemoryBroker::new()));
        let task = tokio::spawn(plaza_server::serve(node.clone(), listener));
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

    pub async fn connect(&self) -> Client {
        Client::connect(self.addr).await
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

/// A WebSocket client speaking Plaza JSON frames.
pub struct Client {
    pub ws: WebSocketStream<MaybeTlsStream<TcpStream>>,
}

/// What ended a connection, as seen by the client.
#[derive(Debug, PartialEq)]
pub enum Closed {
    Code(u16),
    NoFrame,
}

impl Client {
    pub async fn connect(addr: SocketAddr) -> Client {
        let (ws, _) = tokio_tungstenite::connect_async(format!("ws://{addr}/v1/ws"))
            .await
            .unwrap();
        Client { ws }
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

    /// Waits for the server to close the connection and returns its close code.
    pub async fn closed(&mut self) -> Closed {
        loop {
            match tokio::time::timeout(WAIT, self.ws.next())
                .await
                .expect("timed out waiting for close")
            {
                None | Some(Err(_)) => return Closed::NoFrame,
                Some(Ok(Message::Close(Some(CloseFrame { code, .. })))) => {
                    return Closed::Code(code.into())
                }
                Some(Ok(Message::Close(None))) => return Closed::NoFrame,
                Some(Ok(_)) => continue,
            }
        }
    }
}
