//! permessage-deflate over a real socket, with a client written here from
//! RFC 6455 and RFC 7692 (tungstenite has no deflate): the negotiation, the
//! server's compressed messages, and the client's, context kept.

use std::time::Duration;

use flate2::{Compress, Compression, Decompress, FlushCompress, FlushDecompress};
use plaza_server::ServerConfig;
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::support::TestServer;

const LIMIT: Duration = Duration::from_secs(5);

/// A WebSocket client that may offer permessage-deflate.
struct RawClient {
    tcp: TcpStream,
    buf: Vec<u8>,
    /// The server's answer to the offer, if it accepted.
    extensions: Option<String>,
    /// The client's compressor: one stream for the whole connection (its
    /// context is kept, as browsers do).
    compress: Compress,
}

impl RawClient {
    async fn connect(s: &TestServer, offer: Option<&str>) -> RawClient {
        Self::connect_with(s, offer, None).await
    }

    /// Connects offering permessage-deflate (`offer`) and a subprotocol.
    async fn connect_with(
        s: &TestServer,
        offer: Option<&str>,
        protocol: Option<&str>,
    ) -> RawClient {
        let mut tcp = TcpStream::connect(s.addr).await.unwrap();
        let mut req = format!(
            "GET /v1/ws HTTP/1.1\r\nHost: {}\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\
             Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n",
            s.addr
        );
        if let Some(o) = offer {
            req.push_str(&format!("Sec-WebSocket-Extensions: {o}\r\n"));
        }
        if let Some(p) = protocol {
            req.push_str(&format!("Sec-WebSocket-Protocol: {p}\r\n"));
        }
        req.push_str("\r\n");
        tcp.write_all(req.as_bytes()).await.unwrap();
        let mut buf = Vec::new();
        let end = loop {
            let mut chunk = [0u8; 1024];
            let n = tcp.read(&mut chunk).await.unwrap();
            assert!(n > 0, "closed during the handshake");
            buf.extend_from_slice(&chunk[..n]);
            if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                break i + 4;
            }
        };
        let head = String::from_utf8(buf[..end].to_vec()).unwrap();
        assert!(head.starts_with("HTTP/1.1 101"), "{head}");
        let extensions = head.lines().find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.eq_ignore_ascii_case("sec-websocket-extensions")
                .then(|| v.trim().to_owned())
        });
        RawClient {
            tcp,
            buf: buf[end..].to_vec(),
            extensions,
            compress: Compress::new(Compression::default(), false),
        }
    }

    /// Sends `v` as a masked text frame, compressed (RSV1) if asked.
    async fn send(&mut self, v: &Value, compressed: bool) {
        let mut payload = v.to_string().into_bytes();
        let mut first = 0x81u8;
        if compressed {
            let mut out = Vec::with_capacity(payload.len() + 64);
            self.compress
                .compress_vec(&payload, &mut out, FlushCompress::Sync)
                .unwrap();
            assert!(out.ends_with(&[0, 0, 0xff, 0xff]));
            out.truncate(out.len() - 4);
            payload = out;
            first |= 0x40;
        }
        let mask = [9u8, 8, 7, 6];
        let mut frame = vec![first];
        match payload.len() {
            n if n < 126 => frame.push(0x80 | n as u8),
            n => {
                frame.push(0x80 | 126);
                frame.extend_from_slice(&(n as u16).to_be_bytes());
            }
        }
        frame.extend_from_slice(&mask);
        frame.extend(payload.iter().enumerate().map(|(i, b)| b ^ mask[i & 3]));
        self.tcp.write_all(&frame).await.unwrap();
    }

    /// The next data frame: (RSV1 set, payload as sent, payload inflated).
    async fn recv(&mut self) -> (bool, usize, Value) {
        loop {
            if let Some((first, payload, used)) = parse(&self.buf) {
                self.buf.drain(..used);
                if first & 0x0f == 0x9 || first & 0x0f == 0xA {
                    continue; // ping/pong
                }
                assert_eq!(first & 0x0f, 0x1, "a text frame");
                let rsv1 = first & 0x40 != 0;
                let sent = payload.len();
                let text = if rsv1 { inflate(&payload) } else { payload };
                return (rsv1, sent, serde_json::from_slice(&text).unwrap());
            }
            let mut chunk = [0u8; 4096];
            let n = tokio::time::timeout(LIMIT, self.tcp.read(&mut chunk))
                .await
                .expect("a frame in time")
                .unwrap();
            assert!(n > 0, "closed");
            self.buf.extend_from_slice(&chunk[..n]);
        }
    }
}

/// A whole unmasked server frame at the start of `buf`: (first byte,
/// payload, bytes used).
fn parse(buf: &[u8]) -> Option<(u8, Vec<u8>, usize)> {
    if buf.len() < 2 {
        return None;
    }
    let (len, at) = match buf[1] & 0x7f {
        126 if buf.len() >= 4 => (u16::from_be_bytes([buf[2], buf[3]]) as usize, 4),
        127 if buf.len() >= 10 => (
            u64::from_be_bytes(buf[2..10].try_into().unwrap()) as usize,
            10,
        ),
        126 | 127 => return None,
        n => (n as usize, 2),
    };
    (buf.len() >= at + len).then(|| (buf[0], buf[at..at + len].to_vec(), at + len))
}

/// A server message stands alone (server_no_context_takeover): a fresh
/// inflater reads it.
fn inflate(data: &[u8]) -> Vec<u8> {
    let mut d = Decompress::new(false);
    let mut input = data.to_vec();
    input.extend_from_slice(&[0, 0, 0xff, 0xff]);
    let mut out = Vec::with_capacity(64 * 1024);
    d.decompress_vec(&input, &mut out, FlushDecompress::Sync)
        .unwrap();
    out
}

async fn server(min_bytes: usize, on: bool) -> TestServer {
    let s = TestServer::with_config(ServerConfig {
        websocket_compression: on,
        compression_min_bytes: min_bytes,
        ..ServerConfig::default()
    })
    .await;
    s.create_room(json!({"id": "z"})).await;
    s
}

#[tokio::test]
async fn a_browser_offer_gets_compressed_messages_and_may_send_compressed_ones() {
    let s = server(100, true).await;
    let mut ann = RawClient::connect(&s, Some("permessage-deflate; client_max_window_bits")).await;
    assert_eq!(
        ann.extensions.as_deref(),
        Some("permessage-deflate; server_no_context_takeover")
    );
    // A compressed join, then compressed publishes sharing one deflate
    // stream (the second refers back to the first).
    ann.send(&json!({"type": "join", "room": "z", "name": "ann"}), true)
        .await;
    let (rsv1, sent, joined) = ann.recv().await;
    assert_eq!(joined["type"], "joined", "{joined}");
    assert!(rsv1, "joined is over 100 bytes: compressed");
    assert!(sent < joined.to_string().len());
    let (mut bob, _) = s.join("z", "bob").await;
    let (_, _, presence) = ann.recv().await;
    assert_eq!(presence["kind"], "presence.join");
    let text = "the same words again and again; ".repeat(8);
    for i in 0..3 {
        ann.send(
            &json!({"type": "publish", "room": "z", "event": "chat", "id": format!("m{i}"),
                "data": {"text": text}}),
            true,
        )
        .await;
        let (rsv1, _, ack) = ann.recv().await;
        assert_eq!(ack["type"], "ack", "{ack}");
        assert!(!rsv1, "an ack is under 100 bytes: sent as it is");
        let (ev, _) = bob.recv_until(|v| v["kind"] == "message").await;
        assert_eq!(ev["data"]["text"], text.as_str());
        assert_eq!(ev["id"], format!("m{i}"));
    }
    // An uncompressed message is fine too, and what bob says reaches ann compressed.
    ann.send(&json!({"type": "ping", "ts": 1}), false).await;
    let (_, _, pong) = ann.recv().await;
    assert_eq!(pong["type"], "pong");
    bob.send(json!({"type": "publish", "room": "z", "event": "chat", "data": {"text": text}}))
        .await;
    let (rsv1, sent, ev) = ann.recv().await;
    assert_eq!(ev["data"]["text"], text.as_str());
    assert!(rsv1);
    assert!(sent * 2 < ev.to_string().len(), "{sent}");
}

#[tokio::test]
async fn compact_messages_are_compressed_too_and_each_form_is_made_for_its_own_clients() {
    let s = server(100, true).await;
    let deflate = Some("permessage-deflate");
    let mut compact = RawClient::connect_with(&s, deflate, Some("plaza.v1.compact")).await;
    let mut plain = RawClient::connect(&s, deflate).await;
    let mut key = None;
    for (c, name) in [(&mut compact, "ann"), (&mut plain, "bob")] {
        c.send(&json!({"type": "join", "room": "z", "name": name}), false)
            .await;
        let (_, _, joined) = c.recv().await;
        assert_eq!(joined["type"], "joined", "{joined}");
        key = key.or_else(|| serde_json::from_value(joined["compact"].clone()).ok());
    }
    let key: plaza_protocol::compact::CompactKey = key.expect("the compact client's key");
    let (_, _, presence) = compact.recv().await;
    assert_eq!(presence["kind"], "presence.join");
    let (mut cid, _) = s.join("z", "cid").await;
    for c in [&mut compact, &mut plain] {
        let (_, _, presence) = c.recv().await;
        assert_eq!(presence["member"]["name"], "cid", "{presence}");
    }
    let text = "the same words again and again; ".repeat(8);
    cid.send(json!({"type": "publish", "room": "z", "event": "chat", "data": {"text": text}}))
        .await;
    let (rsv1, compact_sent, c) = compact.recv().await;
    assert!(rsv1, "{c}");
    assert_eq!(c[4], "chat", "{c}");
    assert_eq!(c[5]["text"], text.as_str(), "{c}");
    let (rsv1, plain_sent, v1) = plain.recv().await;
    assert!(rsv1);
    assert_eq!(v1["data"]["text"], text.as_str());
    assert_eq!(
        plaza_protocol::compact::expand(c.to_string().as_bytes(), &[("z".into(), key)]).unwrap(),
        v1
    );
    assert!(compact_sent < plain_sent, "{compact_sent} < {plain_sent}");
    // A small message goes uncompressed, as an array.
    cid.send(json!({"type": "publish", "room": "z", "event": "e"}))
        .await;
    let (rsv1, _, c) = compact.recv().await;
    assert!(!rsv1);
    assert_eq!(c[5], Value::Null, "{c}");
}

#[tokio::test]
async fn without_an_offer_or_when_turned_off_nothing_is_compressed() {
    for (on, offer) in [(true, None), (false, Some("permessage-deflate"))] {
        let s = server(0, on).await;
        let mut c = RawClient::connect(&s, offer).await;
        assert_eq!(c.extensions, None);
        c.send(&json!({"type": "join", "room": "z", "name": "ann"}), false)
            .await;
        let (rsv1, _, joined) = c.recv().await;
        assert_eq!(joined["type"], "joined");
        assert!(!rsv1);
    }
}

#[tokio::test]
async fn offers_it_cannot_honour_are_declined_and_bad_compressed_data_closes_with_1007() {
    let s = server(0, true).await;
    let c = RawClient::connect(&s, Some("permessage-deflate; server_max_window_bits=8")).await;
    assert_eq!(c.extensions, None);
    let mut c = RawClient::connect(
        &s,
        Some("permessage-deflate; server_max_window_bits=8, permessage-deflate; client_no_context_takeover"),
    )
    .await;
    assert_eq!(
        c.extensions.as_deref(),
        Some("permessage-deflate; server_no_context_takeover; client_no_context_takeover")
    );
    // RSV1 with a payload that is not deflate data.
    c.tcp
        .write_all(&[0xC1, 0x83, 0, 0, 0, 0, 0xff, 0xfe, 0xfd])
        .await
        .unwrap();
    let mut got = Vec::new();
    let closed = tokio::time::timeout(LIMIT, async {
        loop {
            if let Some((first, payload, used)) = parse(&c.buf) {
                c.buf.drain(..used);
                if first & 0x0f == 0x8 {
                    return u16::from_be_bytes([payload[0], payload[1]]);
                }
                got.push(first);
                continue;
            }
            let mut chunk = [0u8; 1024];
            let n = c.tcp.read(&mut chunk).await.unwrap();
            assert!(n > 0, "closed without a Close frame");
            c.buf.extend_from_slice(&chunk[..n]);
        }
    })
    .await
    .expect("closed in time");
    assert_eq!(closed, 1007);
}
