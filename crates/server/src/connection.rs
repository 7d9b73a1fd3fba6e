//! One WebSocket connection: a reader that decodes, checks and routes client
//! frames, and a writer that drains the connection's outbox.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::ws::{CloseFrame, Message, Utf8Bytes, WebSocket};
use bytes::Bytes;
use futures_util::stream::{SplitSink, SplitStream};
use futures_util::{SinkExt, StreamExt};
use plaza_core::{JoinParams, PublishParams, Resume, TokenBucket};
use plaza_protocol::client::{self, ClientFrame};
use plaza_protocol::server::{ErrorBody, ErrorRef, ServerFrame};
use plaza_protocol::{CloseCode, ErrorCode};
use tokio::sync::oneshot;

use crate::clock::now_ms;
use crate::outbox::{ConnectionControl, Outbox, OutboxReceiver};
use crate::room_task::{RoomCommand, RoomHandle};
use crate::Node;

/// How long a server-initiated close waits for the client's Close.
const CLOSE_WAIT: Duration = Duration::from_secs(2);

/// Frames written per flush at most, so one busy connection cannot hog its writer.
const MAX_BATCH: usize = 512;

/// Runs a connection until it closes.
pub(crate) async fn run(node: Arc<Node>, socket: WebSocket) {
    node.connection_opened();
    let control = ConnectionControl::new();
    let (outbox, rx) = Outbox::new(node.config().send_queue_frames, control.clone());
    let (sink, mut stream) = socket.split();
    let writer = tokio::spawn(write_loop(node.clone(), sink, rx, control.clone()));
    let mut conn = Connection {
        bucket: TokenBucket::new(
            node.config().rate_limit_per_sec,
            node.config().rate_limit_burst,
            now_ms(),
        ),
        refused_in_a_row: 0,
        node: node.clone(),
        outbox,
        control: control.clone(),
        rooms: HashMap::new(),
    };
    let peer_done = conn.read_loop(&mut stream).await;
    for (_, (room, session)) in conn.rooms.drain() {
        room.send(RoomCommand::Disconnect {
            session,
            outbox: conn.outbox.clone(),
        })
        .await;
    }
    control.close(CloseCode::Normal);
    let _ = writer.await;
    if !peer_done {
        // We sent Close: read (and drop) what the client still sends until
        // its Close, so the socket ends cleanly instead of with a reset that
        // could destroy our Close frame before the client reads it.
        let _ = tokio::time::timeout(CLOSE_WAIT, async {
            while let Some(Ok(m)) = stream.next().await {
                if matches!(m, Message::Close(_)) {
                    break;
                }
            }
        })
        .await;
    }
    node.connection_closed();
}

struct Connection {
    node: Arc<Node>,
    outbox: Outbox,
    control: Arc<ConnectionControl>,
    bucket: TokenBucket,
    /// Frames refused by the rate limit since the last accepted one.
    refused_in_a_row: u32,
    /// Joined rooms: room id → (room, this connection's session there).
    rooms: HashMap<String, (RoomHandle, String)>,
}

impl Connection {
    /// Reads until the connection ends. Returns true when the peer ended it
    /// (Close, EOF or a broken stream), false when the server decided to.
    async fn read_loop(&mut self, stream: &mut SplitStream<WebSocket>) -> bool {
        let idle = Duration::from_millis(self.node.config().idle_timeout_ms);
        let shutdown = self.node.shutdown_token();
        loop {
            let next = tokio::select! {
                _ = self.control.closed.cancelled() => return false,
                _ = shutdown.cancelled() => {
                    self.control.close(CloseCode::Restarting);
                    return false;
                }
                next = tokio::time::timeout(idle, stream.next()) => next,
            };
            let msg = match next {
                Err(_) => {
                    self.control.close(CloseCode::HeartbeatTimeout);
                    return false;
                }
                Ok(None) => return true,
                Ok(Some(Err(e))) => {
                    let text = e.to_string();
                    tracing::debug!(error = %text, "websocket read failed");
                    if text.contains("too long") || text.contains("too big") {
                        self.control.close(CloseCode::MessageTooBig);
                    } else {
                        self.control.close(CloseCode::ProtocolError);
                    }
                    return true;
                }
                Ok(Some(Ok(msg))) => msg,
            };
            match msg {
                Message::Text(t) => self.on_frame(t.as_bytes()).await,
                Message::Binary(b) => self.on_frame(&b).await,
                Message::Ping(_) | Message::Pong(_) => {}
                Message::Close(_) => return true,
            }
        }
    }

    async fn on_frame(&mut self, bytes: &[u8]) {
        let m = &self.node.metrics;
        m.frames_in.increment(1);
        m.bytes_in.increment(bytes.len() as u64);
        let max = self.node.config().max_frame_bytes;
        if bytes.len() > max {
            let msg = format!("frame has {} bytes, the limit is {max}", bytes.len());
            return self.error(ErrorCode::FrameTooLarge, msg, None);
        }
        if !self.bucket.try_take(now_ms()) {
            self.refused_in_a_row += 1;
            // A client that keeps sending through this many refusals is not
            // reading its errors: cut it off rather than spend CPU on it.
            let limit = self
                .node
                .config()
                .rate_limit_burst
                .saturating_mul(10)
                .max(100);
            if self.refused_in_a_row > limit {
                self.control.close(CloseCode::PolicyViolation);
                return;
            }
            return self.error(
                ErrorCode::RateLimited,
                "too many frames; this one was dropped".into(),
                None,
            );
        }
        self.refused_in_a_row = 0;
        let frame = match client::decode(bytes) {
            Ok(f) => f,
            Err(e) => {
                let r = e.frame_type.map(|t| ErrorRef {
                    frame: Some(t),
                    ..Default::default()
                });
                return self.error(e.code, e.message, r);
            }
        };
        match frame {
            ClientFrame::Join(j) => self.join(j).await,
            ClientFrame::Leave(l) => {
                let Some((room, session)) = self.rooms.remove(&l.room) else {
                    return self.not_joined("leave", l.room, None);
                };
                let delivered = room
                    .send(RoomCommand::Leave {
                        session,
                        outbox: self.outbox.clone(),
                    })
                    .await;
                if !delivered {
                    // The room was deleted meanwhile: the member is out all the same.
                    self.outbox
                        .send(ServerFrame::Left { room: l.room }.encode(), None);
                }
            }
            ClientFrame::Publish(p) => {
                let Some((_, session)) = self.rooms.get(&p.room) else {
                    return self.not_joined("publish", p.room, p.id);
                };
                let params = PublishParams {
                    channel: p.channel,
                    event: p.event,
                    data: p.data,
                    id: p.id,
                    topic: p.topic,
                    reply_to: p.reply_to,
                    echo: p.echo,
                };
                let cmd = RoomCommand::Publish {
                    session: session.clone(),
                    outbox: self.outbox.clone(),
                    params,
                };
                self.route(&p.room, cmd, "publish").await;
            }
            ClientFrame::Request(r) => {
                let op = match r.op() {
                    Ok(op) => op,
                    Err((code, message)) => {
                        self.node.metrics.error(code);
                        let frame = ServerFrame::Response {
                            room: r.room,
                            nonce: r.nonce,
                            ok: false,
                            result: None,
                            error: Some(ErrorBody { code, message }),
                        };
                        self.outbox.send(frame.encode(), None);
                        return;
                    }
                };
                let Some((_, session)) = self.rooms.get(&r.room) else {
                    self.node.metrics.error(ErrorCode::NotJoined);
                    let frame = ServerFrame::Response {
                        room: r.room,
                        nonce: r.nonce,
                        ok: false,
                        result: None,
                        error: Some(ErrorBody {
                            code: ErrorCode::NotJoined,
                            message: "this connection has not joined the room".into(),
                        }),
                    };
                    self.outbox.send(frame.encode(), None);
                    return;
                };
                let cmd = RoomCommand::Request {
                    session: session.clone(),
                    outbox: self.outbox.clone(),
                    nonce: r.nonce.clone(),
                    op,
                };
                if !self.forward(&r.room, cmd).await {
                    // A request is answered by a response with its nonce, always.
                    let code = ErrorCode::RoomNotFound;
                    self.node.metrics.error(code);
                    let message = format!("room {:?} was deleted", r.room);
                    let frame = ServerFrame::Response {
                        room: r.room,
                        nonce: r.nonce,
                        ok: false,
                        result: None,
                        error: Some(ErrorBody { code, message }),
                    };
                    self.outbox.send(frame.encode(), None);
                }
            }
            ClientFrame::Direct(d) => {
                let Some((_, session)) = self.rooms.get(&d.room) else {
                    return self.not_joined("direct", d.room, None);
                };
                let cmd = RoomCommand::Direct {
                    session: session.clone(),
                    outbox: self.outbox.clone(),
                    to: d.to,
                    event: d.event,
                    data: d.data,
                };
                self.route(&d.room, cmd, "direct").await;
            }
            ClientFrame::Ping(p) => {
                self.outbox
                    .send(ServerFrame::Pong { ts: p.ts }.encode(), None);
            }
        }
    }

    /// Sends a command to a joined room; false (and the room is forgotten) if
    /// the room is gone.
    async fn forward(&mut self, room_id: &str, cmd: RoomCommand) -> bool {
        let Some((room, _)) = self.rooms.get(room_id) else {
            return false;
        };
        if room.send(cmd).await {
            return true;
        }
        self.rooms.remove(room_id);
        false
    }

    /// Sends a command to a joined room; if the room is gone, says so and forgets it.
    async fn route(&mut self, room_id: &str, cmd: RoomCommand, frame: &str) {
        if !self.forward(room_id, cmd).await {
            let r = ErrorRef {
                frame: Some(frame.into()),
                room: Some(room_id.into()),
                id: None,
            };
            self.error(
                ErrorCode::RoomNotFound,
                format!("room {room_id:?} was deleted"),
                Some(r),
            );
        }
    }

    async fn join(&mut self, j: client::Join) {
        let mut r = ErrorRef {
            frame: Some("join".into()),
            room: j.room.clone(),
            id: None,
        };
        if self.node.is_shutting_down() {
            return self.error(
                ErrorCode::ShuttingDown,
                "the server is shutting down".into(),
                Some(r),
            );
        }
        // Checks that need no ticket come first, so a refused join does not
        // spend the ticket.
        self.rooms.retain(|_, (room, _)| !room.is_closed());
        for room in self.control.take_evicted() {
            self.rooms.remove(&room);
        }
        let max_rooms = self.node.config().max_rooms_per_connection;
        if self.rooms.len() >= max_rooms {
            let msg = format!("a connection may join {max_rooms} rooms at most");
            return self.error(ErrorCode::TooManyRooms, msg, Some(r));
        }
        if j.room
            .as_ref()
            .is_some_and(|room| self.rooms.contains_key(room))
        {
            let msg = format!(
                "already in room {:?}",
                j.room.as_deref().unwrap_or_default()
            );
            return self.error(ErrorCode::AlreadyJoined, msg, Some(r));
        }
        let (room_id, name, platform, ticket) = match &j.ticket {
            Some(t) => match self.node.broker().redeem_ticket(t, now_ms()).await {
                Ok(g) => {
                    if j.room.as_ref().is_some_and(|room| *room != g.room) {
                        return self.error(
                            ErrorCode::InvalidFrame,
                            "the ticket is for another room".into(),
                            Some(r),
                        );
                    }
                    (g.room, g.name, g.platform, true)
                }
                Err(e) => return self.error(e.code, e.message, Some(r)),
            },
            None => {
                let (Some(room), Some(name)) = (j.room.clone(), j.name.clone()) else {
                    let msg = "join needs a ticket, or a room and a name".into();
                    return self.error(ErrorCode::InvalidFrame, msg, Some(r));
                };
                (
                    room,
                    name,
                    j.platform.clone().unwrap_or_else(|| "browser".into()),
                    false,
                )
            }
        };
        r.room = Some(room_id.clone());
        if name.is_empty() || name.len() > 64 || platform.is_empty() || platform.len() > 32 {
            let msg = "name must have 1 to 64 bytes and platform 1 to 32".into();
            return self.error(ErrorCode::InvalidFrame, msg, Some(r));
        }
        if self.rooms.contains_key(&room_id) {
            return self.error(
                ErrorCode::AlreadyJoined,
                format!("already in room {room_id:?}"),
                Some(r),
            );
        }
        let room = match self.node.room_for_join(&room_id) {
            Ok(h) => h,
            Err(e) => return self.error(e.code, e.message, Some(r)),
        };
        let params = JoinParams {
            session: plaza_broker::new_session_id(),
            resume_token: plaza_broker::new_resume_token(),
            name,
            platform,
            channels: j.channels,
            ticket,
            sink: self.outbox.clone(),
        };
        let resume = j.resume.map(|x| Resume {
            token: x.token,
            last_seq: x.last_seq,
        });
        let (reply, answer) = oneshot::channel();
        if !room
            .send(RoomCommand::Join {
                params,
                resume,
                reply,
            })
            .await
        {
            return self.error(
                ErrorCode::RoomNotFound,
                format!("no room {room_id:?}"),
                Some(r),
            );
        }
        match answer.await {
            Ok(Ok(session)) => {
                self.rooms.insert(room.id().to_owned(), (room, session));
            }
            Ok(Err(e)) => self.error(e.code, e.message, Some(r)),
            Err(_) => self.error(
                ErrorCode::RoomNotFound,
                format!("room {room_id:?} was deleted"),
                Some(r),
            ),
        }
    }

    fn not_joined(&self, frame: &str, room: String, id: Option<String>) {
        let r = ErrorRef {
            frame: Some(frame.into()),
            room: Some(room),
            id,
        };
        self.error(
            ErrorCode::NotJoined,
            "this connection has not joined the room".into(),
            Some(r),
        );
    }

    fn error(&self, code: ErrorCode, message: String, reference: Option<ErrorRef>) {
        self.node.metrics.error(code);
        self.outbox.send(
            ServerFrame::Error {
                code,
                message,
                reference,
            }
            .encode(),
            None,
        );
    }
}

/// Drains the outbox: everything queued goes out with one flush.
async fn write_loop(
    node: Arc<Node>,
    mut sink: SplitSink<WebSocket, Message>,
    mut rx: OutboxReceiver,
    control: Arc<ConnectionControl>,
) {
    let period = Duration::from_millis(node.config().heartbeat_interval_ms.max(1));
    let mut heartbeat = tokio::time::interval_at(tokio::time::Instant::now() + period, period);
    heartbeat.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let m = &node.metrics;
    loop {
        tokio::select! {
            biased;
            _ = control.closed.cancelled() => break,
            _ = heartbeat.tick() => {
                if sink.send(Message::Ping(Bytes::new())).await.is_err() {
                    break;
                }
            }
            first = rx.recv() => {
                let Some(first) = first else { break };
                let oldest = first.ordered_at;
                let (mut frames, mut bytes) = (0u64, 0u64);
                let mut next = Some(first);
                let mut ok = true;
                while let Some(item) = next.take() {
                    frames += 1;
                    bytes += item.frame.len() as u64;
                    let text = match Utf8Bytes::try_from(item.frame) {
                        Ok(t) => t,
                        Err(_) => continue, // frames are encoded by serde_json: always UTF-8
                    };
                    if sink.feed(Message::Text(text)).await.is_err() {
                        ok = false;
                        break;
                    }
                    if frames < MAX_BATCH as u64 {
                        next = rx.try_recv().ok();
                    }
                }
                if !ok || sink.flush().await.is_err() {
                    break;
                }
                m.frames_out.increment(frames);
                m.bytes_out.increment(bytes);
                if let Some(t) = oldest {
                    m.latency(t.elapsed());
                }
            }
        }
    }
    let code = control.close_code().unwrap_or(CloseCode::Normal.code());
    let reason = match code {
        1012 => "server restarting: reconnect and resume",
        4001 => "heartbeat timeout",
        4002 => "slow consumer: resume to catch up",
        1009 => "message too big",
        1002 => "protocol error",
        4003 => "rate limit ignored",
        _ => "",
    };
    if code == CloseCode::SlowConsumer.code() {
        node.metrics.slow_consumers.increment(1);
    }
    let close = CloseFrame {
        code,
        reason: Utf8Bytes::from_static(reason),
    };
    let _ = tokio::time::timeout(Duration::from_secs(2), async {
        if sink.send(Message::Close(Some(close))).await.is_err() {
            // The client closed first: the WebSocket refuses a Close of ours
            // but holds the echo of the client's; flushing it completes the
            // closing handshake.
            let _ = sink.close().await;
        }
    })
    .await;
}
