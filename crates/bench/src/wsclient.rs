//! A minimal WebSocket client made for receiving fast.
//!
//! A load generator must receive several million messages a second on one
//! core, so the reader does what a general client cannot: large reads, frame
//! headers scanned in place, each message handed to a callback as a slice of
//! the read buffer — no allocation and no copy per message. Fragmented
//! messages (rare from servers) are assembled in a side buffer.

use std::io;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use base64::Engine;
use bytes::{Buf, BytesMut};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpSocket, TcpStream};

use crate::transport::SocketTally;

/// Bytes asked for per read.
const READ_SIZE: usize = 64 * 1024;
/// Largest message accepted.
const MAX_MESSAGE: usize = 16 * 1024 * 1024;

/// One message or control frame received.
#[derive(Debug, PartialEq, Eq)]
pub enum Incoming<'a> {
    /// A complete text or binary message.
    Message(&'a [u8]),
    /// A ping: answer it with a pong carrying the same payload.
    Ping(&'a [u8]),
    /// A close frame with its code, if any.
    Close(Option<u16>),
}

/// The receiving half of a connection.
pub struct WsReader {
    read: OwnedReadHalf,
    buf: BytesMut,
    /// A fragmented message being assembled.
    partial: Option<Vec<u8>>,
    /// Frames that came with the handshake response, not handed out yet.
    unparsed: bool,
    /// With permessage-deflate: reads compressed messages.
    inflater: Option<Inflater>,
    /// Counts the bytes read.
    tally: Option<Arc<SocketTally>>,
}

/// A connection's inflater (RFC 7692).
struct Inflater {
    state: flate2::Decompress,
    /// The server compresses each message on its own (reset after each).
    fresh_each_time: bool,
    /// The last message inflated.
    out: Vec<u8>,
}

impl Inflater {
    fn inflate(&mut self, data: &[u8]) -> io::Result<&[u8]> {
        use flate2::FlushDecompress;
        self.out.clear();
        for input in [data, &[0, 0, 0xff, 0xff][..]] {
            let mut input = input;
            loop {
                if self.out.len() == self.out.capacity() {
                    if self.out.len() >= MAX_MESSAGE {
                        return Err(bad("inflated message too long"));
                    }
                    self.out.reserve(self.out.len().max(4096));
                }
                let before = self.state.total_in();
                self.state
                    .decompress_vec(input, &mut self.out, FlushDecompress::Sync)
                    .map_err(|_| bad("invalid compressed message"))?;
                input = &input[(self.state.total_in() - before) as usize..];
                if input.is_empty() && self.out.len() < self.out.capacity() {
                    break;
                }
            }
        }
        if self.fresh_each_time {
            self.state.reset(false);
        }
        Ok(&self.out)
    }
}

/// The sending half: every frame masked, as clients must.
pub struct WsWriter {
    write: OwnedWriteHalf,
    mask: [u8; 4],
    out: Vec<u8>,
    /// Counts the bytes written.
    tally: Option<Arc<SocketTally>>,
}

/// Opens a WebSocket to `addr` (`host` for the Host header), optionally from
/// a given local address (to spread many connections over 127.0.0.x).
pub async fn connect(
    addr: SocketAddr,
    host: &str,
    path: &str,
    bind: Option<IpAddr>,
) -> io::Result<(WsReader, WsWriter)> {
    connect_with(addr, host, path, bind, false).await
}

/// What a browser offers for permessage-deflate (RFC 7692).
pub const DEFLATE_OFFER: &str = "permessage-deflate; client_max_window_bits";

/// [`connect`], offering permessage-deflate as browsers do when `deflate`:
/// if the server accepts, compressed messages are inflated before they are
/// handed out (this client itself sends uncompressed messages, which the
/// extension allows).
pub async fn connect_with(
    addr: SocketAddr,
    host: &str,
    path: &str,
    bind: Option<IpAddr>,
    deflate: bool,
) -> io::Result<(WsReader, WsWriter)> {
    connect_counted(addr, host, path, bind, deflate, None, None).await
}

/// [`connect_with`], offering the WebSocket subprotocol `subprotocol` if
/// given (the server must choose it) and counting every byte read and
/// written (the handshake included) in `tally`.
pub async fn connect_counted(
    addr: SocketAddr,
    host: &str,
    path: &str,
    bind: Option<IpAddr>,
    deflate: bool,
    subprotocol: Option<&str>,
    tally: Option<Arc<SocketTally>>,
) -> io::Result<(WsReader, WsWriter)> {
    let stream = match bind {
        Some(ip) => {
            let socket = if addr.is_ipv4() {
                TcpSocket::new_v4()?
            } else {
                TcpSocket::new_v6()?
            };
            socket.bind(SocketAddr::new(ip, 0))?;
            socket.connect(addr).await?
        }
        None => TcpStream::connect(addr).await?,
    };
    stream.set_nodelay(true)?;
    let key = base64::engine::general_purpose::STANDARD.encode(rand::random::<[u8; 16]>());
    let mut offer = if deflate {
        format!("Sec-WebSocket-Extensions: {DEFLATE_OFFER}\r\n")
    } else {
        String::new()
    };
    if let Some(p) = subprotocol {
        offer.push_str(&format!("Sec-WebSocket-Protocol: {p}\r\n"));
    }
    let request = format!(
        "GET {path} HTTP/1.1\r\nHost: {host}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
         Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n{offer}\r\n"
    );
    let (mut read, mut write) = stream.into_split();
    write.write_all(request.as_bytes()).await?;
    if let Some(t) = &tally {
        t.add_written(request.len());
    }
    let mut buf = BytesMut::with_capacity(4096);
    let header_end = loop {
        if let Some(at) = memchr::memmem::find(&buf, b"\r\n\r\n") {
            break at + 4;
        }
        if buf.len() > 16 * 1024 {
            return Err(io::Error::other("handshake response too long"));
        }
        let n = read.read_buf(&mut buf).await?;
        if n == 0 {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        if let Some(t) = &tally {
            t.add_read(n);
        }
    };
    let status_line = buf[..header_end]
        .split(|&b| b == b'\n')
        .next()
        .unwrap_or(b"");
    if !status_line.starts_with(b"HTTP/1.1 101") {
        let text = String::from_utf8_lossy(&buf[..header_end]).into_owned();
        return Err(io::Error::other(format!(
            "upgrade refused: {}",
            text.trim()
        )));
    }
    let head = String::from_utf8_lossy(&buf[..header_end]).to_ascii_lowercase();
    if let Some(p) = subprotocol {
        let chosen = head.lines().find_map(|l| {
            let (k, v) = l.split_once(':')?;
            (k.trim() == "sec-websocket-protocol").then(|| v.trim().to_owned())
        });
        if chosen.as_deref() != Some(&p.to_ascii_lowercase()) {
            return Err(io::Error::other(format!(
                "the server did not choose the subprotocol {p} (it chose {chosen:?})"
            )));
        }
    }
    let accepted = head.lines().find_map(|l| {
        let (k, v) = l.split_once(':')?;
        (k.trim() == "sec-websocket-extensions" && v.contains("permessage-deflate"))
            .then(|| v.contains("server_no_context_takeover"))
    });
    buf.advance(header_end);
    Ok((
        WsReader {
            read,
            unparsed: !buf.is_empty(),
            buf,
            partial: None,
            inflater: accepted.map(|fresh_each_time| Inflater {
                state: flate2::Decompress::new(false),
                fresh_each_time,
                out: Vec::new(),
            }),
            tally: tally.clone(),
        },
        WsWriter {
            write,
            mask: rand::random(),
            out: Vec::with_capacity(256),
            tally,
        },
    ))
}

impl WsReader {
    /// Reads once (waiting for data) and hands every complete message and
    /// control frame to `on`. Returns the bytes read; 0 means the peer closed.
    pub async fn read_some(&mut self, mut on: impl FnMut(Incoming<'_>)) -> io::Result<usize> {
        if std::mem::take(&mut self.unparsed) {
            let had = self.buf.len();
            self.parse(&mut on)?;
            return Ok(had.max(1));
        }
        if self.buf.capacity() - self.buf.len() < READ_SIZE / 4 {
            self.buf.reserve(READ_SIZE);
        }
        let n = self.read.read_buf(&mut self.buf).await?;
        if n == 0 {
            return Ok(0);
        }
        if let Some(t) = &self.tally {
            t.add_read(n);
        }
        self.parse(&mut on)?;
        Ok(n)
    }

    /// Hands every complete frame in the buffer to `on` and drops its bytes.
    fn parse(&mut self, on: &mut impl FnMut(Incoming<'_>)) -> io::Result<()> {
        let mut at = 0;
        while let Some((fin, opcode, start, len)) = header(&self.buf[at..])? {
            let body = &self.buf[at + start..at + start + len];
            let compressed = self.buf[at] & 0x40 != 0;
            if compressed && (self.inflater.is_none() || !fin || self.partial.is_some()) {
                // Fragmented compressed messages: not from the servers measured.
                return Err(bad("unexpected RSV1"));
            }
            match opcode {
                0x1 | 0x2 if compressed => {
                    let inflater = self.inflater.as_mut().expect("checked above");
                    on(Incoming::Message(inflater.inflate(body)?));
                }
                0x1 | 0x2 if fin && self.partial.is_none() => on(Incoming::Message(body)),
                0x1 | 0x2 => {
                    if self.partial.is_some() {
                        return Err(bad("new message inside a fragmented one"));
                    }
                    self.partial = Some(body.to_vec());
                }
                0x0 => {
                    let Some(p) = self.partial.as_mut() else {
                        return Err(bad("continuation without a message"));
                    };
                    if p.len() + body.len() > MAX_MESSAGE {
                        return Err(bad("message too long"));
                    }
                    p.extend_from_slice(body);
                    if fin {
                        let whole = self.partial.take().unwrap_or_default();
                        on(Incoming::Message(&whole));
                    }
                }
                0x8 => {
                    let code = (body.len() >= 2).then(|| u16::from_be_bytes([body[0], body[1]]));
                    on(Incoming::Close(code));
                }
                0x9 => on(Incoming::Ping(body)),
                0xA => {}
                _ => return Err(bad("unknown opcode")),
            }
            at += start + len;
        }
        self.buf.advance(at);
        Ok(())
    }
}

/// Parses the frame header at the start of `b`: (fin, opcode, header length,
/// payload length), or `None` if the frame is not complete yet.
fn header(b: &[u8]) -> io::Result<Option<(bool, u8, usize, usize)>> {
    if b.len() < 2 {
        return Ok(None);
    }
    let fin = b[0] & 0x80 != 0;
    let opcode = b[0] & 0x0F;
    if b[1] & 0x80 != 0 {
        return Err(bad("masked frame from the server"));
    }
    let (start, len) = match b[1] & 0x7F {
        126 => {
            if b.len() < 4 {
                return Ok(None);
            }
            (4, usize::from(u16::from_be_bytes([b[2], b[3]])))
        }
        127 => {
            if b.len() < 10 {
                return Ok(None);
            }
            let mut l = [0u8; 8];
            l.copy_from_slice(&b[2..10]);
            let len = u64::from_be_bytes(l);
            if len > MAX_MESSAGE as u64 {
                return Err(bad("frame too long"));
            }
            (10, len as usize)
        }
        n => (2, usize::from(n)),
    };
    if b.len() < start + len {
        return Ok(None);
    }
    Ok(Some((fin, opcode, start, len)))
}

fn bad(what: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, what.to_owned())
}

impl WsWriter {
    /// Sends one text message.
    pub async fn send_text(&mut self, payload: &[u8]) -> io::Result<()> {
        self.send(0x1, payload).await
    }

    /// Answers a ping.
    pub async fn pong(&mut self, payload: &[u8]) -> io::Result<()> {
        self.send(0xA, payload).await
    }

    /// Sends a close frame with `code`.
    pub async fn close(&mut self, code: u16) -> io::Result<()> {
        self.send(0x8, &code.to_be_bytes()).await
    }

    async fn send(&mut self, opcode: u8, payload: &[u8]) -> io::Result<()> {
        self.out.clear();
        self.out.push(0x80 | opcode);
        match payload.len() {
            n if n < 126 => self.out.push(0x80 | n as u8),
            n if n <= usize::from(u16::MAX) => {
                self.out.push(0x80 | 126);
                self.out.extend_from_slice(&(n as u16).to_be_bytes());
            }
            n => {
                self.out.push(0x80 | 127);
                self.out.extend_from_slice(&(n as u64).to_be_bytes());
            }
        }
        self.out.extend_from_slice(&self.mask);
        let from = self.out.len();
        self.out.extend_from_slice(payload);
        for (i, b) in self.out[from..].iter_mut().enumerate() {
            *b ^= self.mask[i & 3];
        }
        self.write.write_all(&self.out).await?;
        if let Some(t) = &self.tally {
            t.add_written(self.out.len());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(fin: bool, opcode: u8, payload: &[u8]) -> Vec<u8> {
        let mut f = vec![if fin { 0x80 } else { 0 } | opcode];
        match payload.len() {
            n if n < 126 => f.push(n as u8),
            n if n <= 65535 => {
                f.push(126);
                f.extend_from_slice(&(n as u16).to_be_bytes());
            }
            n => {
                f.push(127);
                f.extend_from_slice(&(n as u64).to_be_bytes());
            }
        }
        f.extend_from_slice(payload);
        f
    }

    /// A server that ignores the subprotocol offered (the reference relay
    /// speaks none) is refused: the run would otherwise count frames of a
    /// form it did not ask for.
    #[tokio::test]
    async fn a_subprotocol_the_server_did_not_choose_fails_the_connect() {
        let (tx, rx) = tokio::sync::oneshot::channel();
        tokio::spawn(crate::reference::bind_and_serve(
            "127.0.0.1:0".parse().unwrap(),
            Default::default(),
            move |a| {
                let _ = tx.send(a);
            },
        ));
        let addr = rx.await.unwrap();
        let host = addr.to_string();
        let plain = connect_counted(addr, &host, "/", None, false, None, None).await;
        assert!(plain.is_ok(), "{:?}", plain.err());
        let offered = connect_counted(
            addr,
            &host,
            "/",
            None,
            false,
            Some("plaza.v1.compact"),
            None,
        )
        .await;
        let err = offered.err().expect("refused");
        assert!(err.to_string().contains("did not choose"), "{err}");
    }

    #[test]
    fn headers_of_every_length_form_and_incomplete_frames() {
        let small = frame(true, 1, b"hi");
        assert_eq!(header(&small).unwrap(), Some((true, 1, 2, 2)));
        assert_eq!(header(&small[..3]).unwrap(), None);
        let mid = frame(true, 2, &[7; 300]);
        assert_eq!(header(&mid).unwrap(), Some((true, 2, 4, 300)));
        assert_eq!(header(&mid[..3]).unwrap(), None);
        let big = frame(false, 1, &[7; 70_000]);
        assert_eq!(header(&big).unwrap(), Some((false, 1, 10, 70_000)));
        assert_eq!(header(&big[..70_000]).unwrap(), None);
        assert!(header(&[0x81, 0x82, 0, 0, 0, 0]).is_err(), "masked");
    }

    #[tokio::test]
    async fn reads_batches_fragments_and_control_frames_from_a_socket() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let server = tokio::spawn(async move {
            let (mut s, _) = listener.accept().await.unwrap();
            let mut req = vec![0u8; 4096];
            let mut got = 0;
            while !req[..got].windows(4).any(|w| w == b"\r\n\r\n") {
                got += s.read(&mut req[got..]).await.unwrap();
            }
            let mut out =
                b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n\r\n".to_vec();
            out.extend(frame(true, 1, b"one"));
            out.extend(frame(true, 9, b"p"));
            out.extend(frame(false, 1, b"fr"));
            out.extend(frame(true, 0, b"ag"));
            out.extend(frame(true, 8, &1000u16.to_be_bytes()));
            s.write_all(&out).await.unwrap();
            // What the client sends back, unmasked: a text message.
            let mut head = [0u8; 6];
            s.read_exact(&mut head).await.unwrap();
            assert_eq!(head[0], 0x81);
            assert_eq!(head[1], 0x80 | 3, "masked, 3 bytes");
            let mut body = [0u8; 3];
            s.read_exact(&mut body).await.unwrap();
            for (i, b) in body.iter_mut().enumerate() {
                *b ^= head[2 + (i & 3)];
            }
            assert_eq!(&body, b"abc");
        });
        let (mut r, mut w) = connect(addr, "x", "/", None).await.unwrap();
        let mut seen: Vec<String> = Vec::new();
        while seen.len() < 4 {
            let n = r
                .read_some(|m| {
                    seen.push(match m {
                        Incoming::Message(b) => String::from_utf8_lossy(b).into_owned(),
                        Incoming::Ping(p) => format!("ping {}", String::from_utf8_lossy(p)),
                        Incoming::Close(c) => format!("close {c:?}"),
                    })
                })
                .await
                .unwrap();
            assert!(n > 0);
        }
        assert_eq!(seen, ["one", "ping p", "frag", "close Some(1000)"]);
        w.send_text(b"abc").await.unwrap();
        server.await.unwrap();
    }
}
