//! The WebSocket transport, written on the raw TCP socket.
//!
//! Why not tungstenite's message API: it frames every message anew for each
//! recipient and keeps a per-connection write buffer that never shrinks (it
//! grows to the largest frame ever sent, e.g. a big room's `joined` frame).
//! Here one task per connection reads frames into a buffer that exists only
//! while a frame is incomplete, and writes each batch of queued, already
//! encoded frames with one freshly built buffer and as few syscalls as the
//! socket allows. Header parsing and formatting are tungstenite's.

mod deflate;
mod frames;
mod upgrade;
mod waits;
mod writer;

use std::io;
use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use plaza_protocol::CloseCode;
use tokio::io::Interest;
use tokio::net::TcpStream;
use tokio::time::Instant;

use super::coalesce;
use super::session::{ClientSession, Heartbeat};
use crate::Node;
use deflate::Deflate;
use frames::{put_header, FrameReader, Incoming, ServerOp};
pub(crate) use upgrade::upgrade;
use waits::{Waits, Wake};
use writer::{close_reason, failed_write, write_all, write_control, Batch, WireForm};

/// How long a server-initiated close waits for the client's Close.
const CLOSE_WAIT: Duration = Duration::from_secs(2);
/// Bytes read per read call.
const READ_CHUNK: usize = 4096;

/// How a connection's loop ended.
pub(super) enum End {
    /// The server decided (close code in the control): send Close, await the client's.
    Server,
    /// The client sent Close; it was answered.
    ClientClosed,
    /// The socket is gone (EOF, reset, write error).
    Gone,
}

/// Runs one WebSocket connection until it closes.
pub(crate) async fn serve_socket(
    node: Arc<Node>,
    stream: TcpStream,
    pre: Bytes,
    deflate: Option<Deflate>,
    compact: bool,
    token: Option<String>,
) {
    let _ = stream.set_nodelay(true);
    let config = node.config();
    let max_message = config.max_frame_bytes.saturating_mul(4).max(1024);
    let mut reader = FrameReader::new(max_message, deflate);
    let coalesce = Duration::from_millis(config.write_coalesce_ms);
    let form = WireForm {
        deflate: deflate.map(|d| (d, config.compression_min_bytes)),
        compact,
    };
    let peer = stream.peer_addr().ok().map(|a| a.ip());
    let mut session = ClientSession::open(node, peer, compact);
    if let Some(t) = token {
        session.authenticate(&t);
    }
    // `pre` is a view into hyper's 16 KiB HTTP read buffer: copy out what it
    // holds (usually nothing) and let the buffer go.
    let mut pending = BytesMut::from(&pre[..]);
    drop(pre);
    let control = session.control.clone();
    let mut unfinished = Vec::new();
    let mut last_write = None;
    // The size of the last batch written, the next one's first guess.
    let mut batch_size = 0;
    // The loop wakes many times a second in a busy room, for every write:
    // a wake-up must cost little more than the write. So what lives as long
    // as the connection is made once, and each thing the loop waits for
    // registers its waker once per arming, not on every turn (see `Waits`).
    // One timer serves both deadlines, a held batch's write and the
    // heartbeat: a feed holds a busy follower's wake-ups itself, so the
    // connection holds only its own frames (acks, answers), and its timer
    // is moved only when those are held or the timer fires.
    let timer = tokio::time::sleep_until(session.heartbeat_deadline());
    tokio::pin!(timer);
    let mut waits = Waits::default();
    // When the held batch is written, while one is held.
    let mut write_at: Option<Instant> = None;

    let end = 'conn: loop {
        // Handle every complete frame already read.
        loop {
            match reader.next(&mut pending) {
                Ok(Some(Incoming::Text(m) | Incoming::Binary(m))) => session.receive(&m).await,
                Ok(Some(Incoming::Ping(payload))) => {
                    // Control frames are rare: boxed, their state is not part of
                    // every connection's task.
                    let pong =
                        write_control(&stream, &control, ServerOp::Pong, &payload, &mut unfinished);
                    if Box::pin(pong).await.is_err() {
                        break 'conn failed_write(&control);
                    }
                }
                Ok(Some(Incoming::Pong)) => {}
                Ok(Some(Incoming::Close(code))) => {
                    let echo = code.map(u16::to_be_bytes);
                    let payload = echo.as_ref().map_or(&[][..], |c| &c[..]);
                    let close =
                        write_control(&stream, &control, ServerOp::Close, payload, &mut unfinished);
                    let _ = Box::pin(close).await;
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
        let wake = std::future::poll_fn(|cx| {
            waits.poll(
                cx,
                &control,
                timer.as_mut(),
                &stream,
                &session.queue,
                write_at.is_some(),
            )
        })
        .await;
        let write = match wake {
            // Closed by the server: a slow consumer, a kick, shutdown (the
            // node closes every session with 1012), …
            Wake::Closed => break End::Server,
            // Only feeds' events: a feed holds a busy connection's wake-up
            // itself, for a window from the event (see `outbox::feed`).
            Wake::Fed => true,
            // Something was queued: written now, or held while the
            // connection is busy (see `coalesce`).
            Wake::Queued => match coalesce::hold_until(last_write, Instant::now(), coalesce) {
                Some(at) => {
                    write_at = Some(at);
                    arm(timer.as_mut(), &mut waits, write_at, &session);
                    false
                }
                None => true,
            },
            // A held batch is due, or the heartbeat (the session says what
            // is due, maybe nothing yet). Reading went on while the batch
            // waited: holding the writes must not hold the client's
            // messages.
            Wake::Timer => {
                let now = Instant::now();
                let due = write_at.is_some_and(|at| at <= now);
                if due {
                    write_at = None;
                }
                match session.heartbeat(now) {
                    Heartbeat::Nothing => {}
                    Heartbeat::Expired => break End::Server,
                    Heartbeat::Ping => {
                        let ping =
                            write_control(&stream, &control, ServerOp::Ping, &[], &mut unfinished);
                        if Box::pin(ping).await.is_err() {
                            break failed_write(&control);
                        }
                    }
                }
                arm(timer.as_mut(), &mut waits, write_at, &session);
                due
            }
            Wake::Readable(Err(_)) => break End::Gone,
            Wake::Readable(Ok(())) => {
                if pending.capacity() - pending.len() < READ_CHUNK / 4 {
                    pending.reserve(READ_CHUNK);
                }
                match read_some(&stream, &mut pending) {
                    Ok(0) => break End::Gone,
                    // The heartbeat's timer is not moved: when it fires, the
                    // session says whether anything is due yet.
                    Ok(_) => session.heard(),
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                    Err(_) => break End::Gone,
                }
                false
            }
        };
        if write {
            match Batch::start(&stream, form, &mut session.queue, &mut batch_size) {
                Ok(None) => {}
                Ok(Some(mut batch)) => {
                    // The socket's buffer is full: the rest is written as
                    // the client reads, unless the connection closes first.
                    // Rare, so boxed: its state is not part of every task.
                    if !batch.is_written() {
                        let rest = batch.write_rest(&stream, &control, &mut unfinished);
                        if Box::pin(rest).await.is_err() {
                            break failed_write(&control);
                        }
                    }
                    let done = batch.finish(&session.node);
                    // The feeds it follows hold its wake-ups for a window.
                    session.queue.wrote(done.into_std());
                    last_write = Some(done);
                }
                Err(_) => break failed_write(&control),
            }
        }
    };

    // The ending runs once: boxed, so its state is not part of every idle
    // connection's task.
    Box::pin(async {
        let code = session.disconnect().await;
        if let End::Server = end {
            let code = code.unwrap_or(CloseCode::Normal.code());
            let mut payload = code.to_be_bytes().to_vec();
            payload.extend_from_slice(close_reason(code).as_bytes());
            // The control is cancelled by now: write without watching it.
            let mut out = std::mem::take(&mut unfinished);
            // What was queued before the close (the error that explains it,
            // say) goes first; a slow consumer's backlog does not.
            if code != CloseCode::SlowConsumer.code() {
                session
                    .queue
                    .drain_into(super::LAST_FRAMES, |f| form.put(&mut out, f));
            }
            let wrote = tokio::time::timeout(CLOSE_WAIT, async {
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
    session.finish();
}

/// Sets the connection's one timer to its next deadline: the held batch's
/// write, or the heartbeat.
fn arm(
    timer: std::pin::Pin<&mut tokio::time::Sleep>,
    waits: &mut Waits,
    write_at: Option<Instant>,
    session: &ClientSession,
) {
    let heartbeat = session.heartbeat_deadline();
    timer.reset(write_at.map_or(heartbeat, |at| at.min(heartbeat)));
    waits.timer_reset();
}

/// Reads what the socket holds into `buf`. A read that does not fill the
/// buffer's spare room emptied the socket: then the socket's readiness is
/// cleared (as of before the read, so an event since is not lost), and the
/// connection waits for the next event rather than read again only to be
/// told "would block", as tokio's own reads do. One syscall less per client
/// message.
fn read_some(stream: &TcpStream, buf: &mut BytesMut) -> io::Result<usize> {
    let room = buf.capacity() - buf.len();
    let mut read = None;
    let _ = stream.try_io(Interest::READABLE, || {
        let r = stream.try_read_buf(buf);
        let emptied = matches!(r, Ok(n) if n > 0 && n < room);
        read = Some(r);
        if emptied {
            Err(io::ErrorKind::WouldBlock.into())
        } else {
            Ok(())
        }
    });
    read.unwrap_or_else(|| Err(io::ErrorKind::WouldBlock.into()))
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use plaza_broker::MemoryTicketStore;

    use crate::{Node, ServerConfig};

    /// Whether the socket counts as readable, without reading it.
    fn readable_now(stream: &tokio::net::TcpStream) -> bool {
        stream
            .try_io(tokio::io::Interest::READABLE, || Ok(()))
            .is_ok()
    }

    /// A read that empties the socket clears its readiness (the next turn
    /// waits for an event rather than read again); one that fills the
    /// buffer does not (more may be waiting).
    #[tokio::test]
    async fn a_read_that_empties_the_socket_clears_its_readiness() {
        use tokio::io::AsyncWriteExt;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let mut client = tokio::net::TcpStream::connect(listener.local_addr().unwrap())
            .await
            .unwrap();
        let (server, _) = listener.accept().await.unwrap();

        client.write_all(b"0123456789").await.unwrap();
        server.readable().await.unwrap();
        let mut buf = bytes::BytesMut::with_capacity(4);
        assert_eq!(super::read_some(&server, &mut buf).unwrap(), 4);
        assert!(readable_now(&server), "6 bytes are still waiting");
        let mut buf = bytes::BytesMut::with_capacity(64);
        assert_eq!(super::read_some(&server, &mut buf).unwrap(), 6);
        assert!(!readable_now(&server), "the socket is empty");

        // Readable again with the next bytes.
        client.write_all(b"ab").await.unwrap();
        server.readable().await.unwrap();
        assert_eq!(super::read_some(&server, &mut buf).unwrap(), 2);
        assert_eq!(&buf[..], b"456789ab");
    }

    /// Each connection is one task holding this future: keep it small, since
    /// an idle connection's memory is mostly this plus its queue.
    #[tokio::test]
    async fn a_connection_task_stays_small() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let stream = tokio::net::TcpStream::connect(listener.local_addr().unwrap())
            .await
            .unwrap();
        let node = Node::new(ServerConfig::default(), Arc::new(MemoryTicketStore::new()));
        let task = super::serve_socket(node, stream, bytes::Bytes::new(), None, false, None);
        let size = std::mem::size_of_val(&task);
        assert!(size <= 1152, "serve_socket future has {size} bytes");
    }
}
