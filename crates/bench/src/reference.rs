//! The reference fan-out server: the machine's practical ceiling.
//!
//! No rooms, no protocol, no features: every text message a client sends is
//! relayed to every other connected client. What it does per delivery is the
//! least any relay must do — queue a shared buffer, wake the connection, write
//! — so comparing a server with it says how much that server's features cost,
//! and running the generator against it shows how much the generator can
//! receive.
//!
//! Each message is framed once into a shared [`Bytes`]; a connection's writer
//! copies what is queued into one buffer per write. Writes are coalesced: a
//! writer woken less than one window after its last write sleeps one window
//! from then, so a busy connection writes about once per window. The window
//! counts from when the writer runs (and, while frames keep coming, from its
//! last write), not from the frame: at the same window its frames wait longer
//! than Plaza's, whose window counts from the event.

use std::io;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use base64::Engine;
use bytes::{Buf, Bytes, BytesMut};
use sha1::{Digest, Sha1};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Notify;
use tokio::time::Instant;

/// Largest message relayed; a longer one closes its connection.
const MAX_MESSAGE: usize = 1024 * 1024;
/// Bytes asked for per read.
const READ_SIZE: usize = 64 * 1024;
/// The GUID of RFC 6455's accept key.
const WS_GUID: &str = "258EAFA5-E914-47DA-95CA-C5AB0DC65B11";

/// How the reference server behaves.
#[derive(Debug, Clone, Copy)]
pub struct ReferenceConfig {
    /// Write coalescing window (zero: write at once).
    pub coalesce: Duration,
}

impl Default for ReferenceConfig {
    fn default() -> Self {
        Self {
            coalesce: Duration::from_millis(2),
        }
    }
}

/// One connected client, as the others see it.
struct Peer {
    id: u64,
    queue: Mutex<Vec<Bytes>>,
    ready: Notify,
}

/// Everyone connected: replaced (not edited) on join and leave, so relaying a
/// message takes one read lock and one pointer copy.
#[derive(Default)]
struct Registry {
    peers: RwLock<Arc<Vec<Arc<Peer>>>>,
}

impl Registry {
    fn add(&self, peer: Arc<Peer>) {
        let mut all = self.peers.write().unwrap_or_else(|e| e.into_inner());
        let mut next = Vec::with_capacity(all.len() + 1);
        next.extend(all.iter().cloned());
        next.push(peer);
        *all = Arc::new(next);
    }

    fn remove(&self, id: u64) {
        let mut all = self.peers.write().unwrap_or_else(|e| e.into_inner());
        let next: Vec<_> = all.iter().filter(|p| p.id != id).cloned().collect();
        *all = Arc::new(next);
    }

    fn snapshot(&self) -> Arc<Vec<Arc<Peer>>> {
        self.peers.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Queues `frame` for everyone but `from`.
    fn relay(&self, from: u64, frame: &Bytes) {
        for peer in self.snapshot().iter().filter(|p| p.id != from) {
            let was_empty = {
                let mut q = peer.queue.lock().unwrap_or_else(|e| e.into_inner());
                q.push(frame.clone());
                q.len() == 1
            };
            if was_empty {
                peer.ready.notify_one();
            }
        }
    }
}

/// Accepts connections on `listener` and relays until the listener fails.
pub async fn serve(listener: TcpListener, config: ReferenceConfig) -> io::Result<()> {
    let registry = Arc::new(Registry::default());
    let mut next_id = 0u64;
    loop {
        let (stream, _) = match listener.accept().await {
            Ok(s) => s,
            // Out of file descriptors and the like: keep serving the others.
            Err(e) if is_per_connection(&e) => continue,
            Err(e) => return Err(e),
        };
        next_id += 1;
        let id = next_id;
        let registry = registry.clone();
        tokio::spawn(async move {
            if let Err(e) = connection(stream, id, &registry, config).await {
                tracing::debug!(id, error = %e, "reference connection ended");
            }
            registry.remove(id);
        });
    }
}

fn is_per_connection(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::ConnectionAborted | io::ErrorKind::ConnectionReset
    ) || e.raw_os_error() == Some(libc::EMFILE)
        || e.raw_os_error() == Some(libc::ENFILE)
}

/// Binds `addr` and serves; the bound address is reported through `bound`.
pub async fn bind_and_serve(
    addr: SocketAddr,
    config: ReferenceConfig,
    bound: impl FnOnce(SocketAddr),
) -> io::Result<()> {
    let listener = TcpListener::bind(addr).await?;
    bound(listener.local_addr()?);
    serve(listener, config).await
}

async fn connection(
    stream: TcpStream,
    id: u64,
    registry: &Registry,
    config: ReferenceConfig,
) -> io::Result<()> {
    stream.set_nodelay(true)?;
    let (mut read, mut write) = stream.into_split();
    let mut buf = BytesMut::with_capacity(4096);
    let response = upgrade(&mut read, &mut write, &mut buf).await?;
    let peer = Arc::new(Peer {
        id,
        queue: Mutex::new(Vec::new()),
        ready: Notify::new(),
    });
    // Registered before the client learns it is connected, so nothing sent
    // after its handshake completes can miss it; what is relayed meanwhile
    // waits in its queue.
    registry.add(peer.clone());
    write.write_all(response.as_bytes()).await?;
    let writer = tokio::spawn(write_loop(write, peer, config.coalesce));
    let result = read_loop(read, buf, id, registry).await;
    writer.abort();
    result
}

/// Reads the HTTP upgrade request and returns the response to send; leaves
/// in `buf` whatever followed the request.
async fn upgrade(
    read: &mut OwnedReadHalf,
    write: &mut OwnedWriteHalf,
    buf: &mut BytesMut,
) -> io::Result<String> {
    let end = loop {
        if let Some(at) = memchr::memmem::find(buf, b"\r\n\r\n") {
            break at + 4;
        }
        if buf.len() > 16 * 1024 {
            return Err(bad("request head too long"));
        }
        if read.read_buf(buf).await? == 0 {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
    };
    let head = String::from_utf8_lossy(&buf[..end]).into_owned();
    buf.advance(end);
    let key = head.lines().find_map(|line| {
        let (name, value) = line.split_once(':')?;
        name.trim()
            .eq_ignore_ascii_case("sec-websocket-key")
            .then(|| value.trim().to_owned())
    });
    let Some(key) = key else {
        write
            .write_all(
                b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
            )
            .await?;
        return Err(bad("not a WebSocket upgrade"));
    };
    let accept = base64::engine::general_purpose::STANDARD
        .encode(Sha1::digest(format!("{key}{WS_GUID}").as_bytes()));
    Ok(format!(
        "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
         Sec-WebSocket-Accept: {accept}\r\n\r\n"
    ))
}

/// Reads client frames; relays text and binary messages, ends on close.
async fn read_loop(
    mut read: OwnedReadHalf,
    mut buf: BytesMut,
    id: u64,
    registry: &Registry,
) -> io::Result<()> {
    loop {
        while let Some(frame) = client_frame(&mut buf)? {
            match frame {
                ClientFrame::Message(framed) => registry.relay(id, &framed),
                ClientFrame::Close => return Ok(()),
                ClientFrame::Ignored => {}
            }
        }
        if buf.capacity() - buf.len() < READ_SIZE / 4 {
            buf.reserve(READ_SIZE);
        }
        if read.read_buf(&mut buf).await? == 0 {
            return Ok(());
        }
    }
}

/// What one client frame means to the relay.
#[derive(Debug, PartialEq, Eq)]
enum ClientFrame {
    /// A message, already framed for sending to others (unmasked).
    Message(Bytes),
    /// The client is closing.
    Close,
    /// Pings, pongs and fragments: the reference server does not relay them.
    Ignored,
}

/// Takes the first complete masked frame off `buf`.
fn client_frame(buf: &mut BytesMut) -> io::Result<Option<ClientFrame>> {
    if buf.len() < 2 {
        return Ok(None);
    }
    let (b0, b1) = (buf[0], buf[1]);
    if b1 & 0x80 == 0 {
        return Err(bad("unmasked frame from a client"));
    }
    let (start, len) = match b1 & 0x7F {
        126 if buf.len() < 4 => return Ok(None),
        126 => (4, usize::from(u16::from_be_bytes([buf[2], buf[3]]))),
        127 if buf.len() < 10 => return Ok(None),
        127 => {
            let mut l = [0u8; 8];
            l.copy_from_slice(&buf[2..10]);
            (
                10,
                usize::try_from(u64::from_be_bytes(l)).unwrap_or(usize::MAX),
            )
        }
        n => (2, usize::from(n)),
    };
    if len > MAX_MESSAGE {
        return Err(bad("message too long"));
    }
    if buf.len() < start + 4 + len {
        return Ok(None);
    }
    let mut mask = [0u8; 4];
    mask.copy_from_slice(&buf[start..start + 4]);
    let opcode = b0 & 0x0F;
    let whole = b0 & 0x80 != 0 && (opcode == 0x1 || opcode == 0x2);
    let out = if whole {
        let mut framed = BytesMut::with_capacity(len + 10);
        put_header(&mut framed, b0, len);
        let from = framed.len();
        framed.extend_from_slice(&buf[start + 4..start + 4 + len]);
        for (i, b) in framed[from..].iter_mut().enumerate() {
            *b ^= mask[i & 3];
        }
        ClientFrame::Message(framed.freeze())
    } else if opcode == 0x8 {
        ClientFrame::Close
    } else {
        ClientFrame::Ignored
    };
    buf.advance(start + 4 + len);
    Ok(Some(out))
}

/// An unmasked server frame header with the client's first byte (FIN and opcode).
fn put_header(out: &mut BytesMut, first: u8, len: usize) {
    out.extend_from_slice(&[first]);
    match len {
        n if n < 126 => out.extend_from_slice(&[n as u8]),
        n if n <= usize::from(u16::MAX) => {
            out.extend_from_slice(&[126]);
            out.extend_from_slice(&(n as u16).to_be_bytes());
        }
        n => {
            out.extend_from_slice(&[127]);
            out.extend_from_slice(&(n as u64).to_be_bytes());
        }
    }
}

/// Writes what is queued for one connection, coalescing while it is busy.
async fn write_loop(mut write: OwnedWriteHalf, peer: Arc<Peer>, window: Duration) {
    let mut last_write: Option<Instant> = None;
    let mut out = Vec::new();
    loop {
        peer.ready.notified().await;
        let now = Instant::now();
        if !window.is_zero() && last_write.is_some_and(|t| now < t + window) {
            tokio::time::sleep_until(now + window).await;
        }
        let frames = std::mem::take(&mut *peer.queue.lock().unwrap_or_else(|e| e.into_inner()));
        if frames.is_empty() {
            continue;
        }
        out.clear();
        for f in &frames {
            out.extend_from_slice(f);
        }
        if write.write_all(&out).await.is_err() {
            return;
        }
        last_write = Some(Instant::now());
        // A burst's buffer is not kept by a connection that goes quiet.
        if out.capacity() > 64 * 1024 {
            out = Vec::new();
        }
    }
}

fn bad(what: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, what.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wsclient::{self, Incoming};

    fn masked(opcode: u8, payload: &[u8], mask: [u8; 4]) -> Vec<u8> {
        let mut f = vec![0x80 | opcode];
        match payload.len() {
            n if n < 126 => f.push(0x80 | n as u8),
            n => {
                f.push(0x80 | 126);
                f.extend_from_slice(&(n as u16).to_be_bytes());
            }
        }
        f.extend_from_slice(&mask);
        f.extend(payload.iter().enumerate().map(|(i, b)| b ^ mask[i & 3]));
        f
    }

    #[test]
    fn client_frames_are_unmasked_and_framed_for_others() {
        let mut buf = BytesMut::new();
        buf.extend_from_slice(&masked(0x1, b"hello", [1, 2, 3, 4]));
        buf.extend_from_slice(&masked(0x9, b"p", [9, 9, 9, 9]));
        let long = vec![b'x'; 300];
        buf.extend_from_slice(&masked(0x1, &long, [5, 6, 7, 8]));
        buf.extend_from_slice(&masked(0x8, &1000u16.to_be_bytes(), [0; 4]));
        assert_eq!(
            client_frame(&mut buf).unwrap(),
            Some(ClientFrame::Message(Bytes::from_static(b"\x81\x05hello")))
        );
        assert_eq!(client_frame(&mut buf).unwrap(), Some(ClientFrame::Ignored));
        let Some(ClientFrame::Message(f)) = client_frame(&mut buf).unwrap() else {
            panic!("expected the long message");
        };
        assert_eq!(&f[..4], &[0x81, 126, 1, 44]);
        assert_eq!(&f[4..], &long[..]);
        assert_eq!(client_frame(&mut buf).unwrap(), Some(ClientFrame::Close));
        assert_eq!(client_frame(&mut buf).unwrap(), None);
    }

    #[test]
    fn incomplete_and_unmasked_frames() {
        let whole = masked(0x1, b"hello", [1, 2, 3, 4]);
        let mut part = BytesMut::from(&whole[..6]);
        assert_eq!(client_frame(&mut part).unwrap(), None);
        assert_eq!(part.len(), 6, "nothing consumed");
        let mut unmasked = BytesMut::from(&b"\x81\x02hi"[..]);
        assert!(client_frame(&mut unmasked).is_err());
    }

    #[tokio::test]
    async fn a_request_that_is_not_an_upgrade_gets_400_and_others_go_on() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(serve(listener, ReferenceConfig::default()));
        let mut plain = TcpStream::connect(addr).await.unwrap();
        plain
            .write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            .await
            .unwrap();
        let mut answer = String::new();
        plain.read_to_string(&mut answer).await.unwrap();
        assert!(answer.starts_with("HTTP/1.1 400"), "{answer}");
        // The server still serves WebSocket clients.
        assert!(wsclient::connect(addr, "x", "/", None).await.is_ok());
    }

    #[tokio::test]
    async fn relays_to_everyone_but_the_sender() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(serve(listener, ReferenceConfig::default()));
        let (mut ra, mut wa) = wsclient::connect(addr, "x", "/", None).await.unwrap();
        let (mut rb, _wb) = wsclient::connect(addr, "x", "/", None).await.unwrap();
        let (mut rc, _wc) = wsclient::connect(addr, "x", "/", None).await.unwrap();
        // b and c are registered before their upgrade is answered: a's
        // messages reach both, in order.
        for i in 0..3 {
            wa.send_text(format!("m{i}").as_bytes()).await.unwrap();
        }
        for r in [&mut rb, &mut rc] {
            let mut got = Vec::new();
            while got.len() < 3 {
                r.read_some(|m| {
                    if let Incoming::Message(b) = m {
                        got.push(String::from_utf8_lossy(b).into_owned());
                    }
                })
                .await
                .unwrap();
            }
            assert_eq!(got, ["m0", "m1", "m2"]);
        }
        // Nothing came back to a: the first message it reads is d's.
        let (_rd, mut wd) = wsclient::connect(addr, "x", "/", None).await.unwrap();
        wd.send_text(b"from-d").await.unwrap();
        let mut first = None;
        while first.is_none() {
            ra.read_some(|m| {
                if let Incoming::Message(b) = m {
                    first.get_or_insert_with(|| String::from_utf8_lossy(b).into_owned());
                }
            })
            .await
            .unwrap();
        }
        assert_eq!(first.as_deref(), Some("from-d"));
    }
}
