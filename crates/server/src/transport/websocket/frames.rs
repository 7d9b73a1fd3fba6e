//! Incremental WebSocket frame reading (client → server) and frame headers
//! for server → client frames.
//!
//! Header parsing and formatting are tungstenite's; what is here is the
//! RFC 6455 rules a server must enforce on what it reads: masking, control
//! frame limits, fragmentation, message size, UTF-8 of text and close reasons.

use std::io::Cursor;

use bytes::{Buf, Bytes, BytesMut};
use tungstenite::protocol::frame::coding::{Control, Data, OpCode};
use tungstenite::protocol::frame::FrameHeader;

use super::deflate::{self, Deflate, InflateError, Inflater};

/// What the reader found in the bytes it was given.
#[derive(Debug, PartialEq, Eq)]
pub enum Incoming {
    /// A complete text message (valid UTF-8).
    Text(Bytes),
    /// A complete binary message.
    Binary(Bytes),
    /// A ping with its payload (to be echoed in a pong).
    Ping(Bytes),
    /// A pong.
    Pong,
    /// The client's Close: its code (if any) and reason.
    Close(Option<u16>),
}

/// A violation that ends the connection with this close code.
#[derive(Debug, PartialEq, Eq)]
pub struct Violation {
    /// 1002 protocol error, 1007 invalid payload, 1009 too big.
    pub code: u16,
    /// What was wrong.
    pub reason: &'static str,
}

fn violation(code: u16, reason: &'static str) -> Violation {
    Violation { code, reason }
}

/// Reassembles client frames into messages.
#[derive(Debug)]
pub struct FrameReader {
    max_message: usize,
    /// The message being reassembled from fragments: (is text, is
    /// compressed, bytes so far).
    fragments: Option<(bool, bool, BytesMut)>,
    /// With permessage-deflate: reads compressed messages (RSV1 set).
    inflater: Option<Inflater>,
}

impl FrameReader {
    /// A reader refusing messages larger than `max_message` bytes (after
    /// inflating, with `deflate`).
    pub fn new(max_message: usize, deflate: Option<Deflate>) -> Self {
        FrameReader {
            max_message,
            fragments: None,
            inflater: deflate.map(Inflater::new),
        }
    }

    /// Takes the next complete frame off the front of `buf`, if there is one.
    /// Returns `Ok(None)` when `buf` holds only part of a frame (nothing is
    /// consumed), and also for a fragment that does not complete a message.
    pub fn next(&mut self, buf: &mut BytesMut) -> Result<Option<Incoming>, Violation> {
        loop {
            let mut cursor = Cursor::new(&buf[..]);
            let (header, len) = match FrameHeader::parse(&mut cursor) {
                Ok(Some(h)) => h,
                Ok(None) => return Ok(None),
                Err(_) => return Err(violation(1002, "invalid frame header")),
            };
            let header_len = cursor.position() as usize;
            // RSV1 marks a compressed message, on its first frame only.
            let first_data = matches!(header.opcode, OpCode::Data(Data::Text | Data::Binary));
            let compressed = header.rsv1 && first_data && self.inflater.is_some();
            if (header.rsv1 && !compressed) || header.rsv2 || header.rsv3 {
                return Err(violation(1002, "reserved bits set"));
            }
            let Some(mask) = header.mask else {
                return Err(violation(1002, "client frames must be masked"));
            };
            let is_control = matches!(header.opcode, OpCode::Control(_));
            if is_control && (!header.is_final || len > 125) {
                return Err(violation(1002, "invalid control frame"));
            }
            let held = self.fragments.as_ref().map_or(0, |(_, _, b)| b.len());
            if len > (self.max_message.saturating_sub(held)) as u64 {
                return Err(violation(1009, "message too big"));
            }
            let len = len as usize;
            if buf.len() < header_len + len {
                buf.reserve(header_len + len - buf.len());
                return Ok(None);
            }
            buf.advance(header_len);
            let mut payload = buf.split_to(len);
            unmask(&mut payload, mask);
            let fin = header.is_final;
            match header.opcode {
                OpCode::Control(Control::Ping) => {
                    return Ok(Some(Incoming::Ping(payload.freeze())))
                }
                OpCode::Control(Control::Pong) => return Ok(Some(Incoming::Pong)),
                OpCode::Control(Control::Close) => return close(&payload).map(Some),
                OpCode::Data(Data::Text) | OpCode::Data(Data::Binary) => {
                    if self.fragments.is_some() {
                        return Err(violation(1002, "new message inside a fragmented one"));
                    }
                    let text = header.opcode == OpCode::Data(Data::Text);
                    if fin {
                        return self.message(text, compressed, payload).map(Some);
                    }
                    self.fragments = Some((text, compressed, payload));
                }
                OpCode::Data(Data::Continue) => {
                    let Some((_, _, held)) = self.fragments.as_mut() else {
                        return Err(violation(1002, "continuation without a message"));
                    };
                    held.extend_from_slice(&payload);
                    if fin {
                        let (text, compressed, whole) =
                            self.fragments.take().expect("checked above");
                        return self.message(text, compressed, whole).map(Some);
                    }
                }
                OpCode::Data(Data::Reserved(_)) | OpCode::Control(Control::Reserved(_)) => {
                    return Err(violation(1002, "reserved opcode"));
                }
            }
        }
    }
}

impl FrameReader {
    /// A whole message, inflated if `compressed`.
    fn message(
        &mut self,
        text: bool,
        compressed: bool,
        payload: BytesMut,
    ) -> Result<Incoming, Violation> {
        let payload = match (compressed, self.inflater.as_mut()) {
            (true, Some(inflater)) => match inflater.inflate(&payload, self.max_message) {
                Ok(m) => Bytes::from(m),
                Err(InflateError::TooBig) => return Err(violation(1009, "message too big")),
                Err(InflateError::Invalid) => {
                    return Err(violation(1007, "invalid compressed message"))
                }
            },
            _ => payload.freeze(),
        };
        message(text, payload)
    }
}

fn message(text: bool, payload: Bytes) -> Result<Incoming, Violation> {
    if !text {
        return Ok(Incoming::Binary(payload));
    }
    match std::str::from_utf8(&payload) {
        Ok(_) => Ok(Incoming::Text(payload)),
        Err(_) => Err(violation(1007, "text message is not UTF-8")),
    }
}

fn close(payload: &[u8]) -> Result<Incoming, Violation> {
    match payload.len() {
        0 => Ok(Incoming::Close(None)),
        1 => Err(violation(1002, "close payload of one byte")),
        _ => {
            let code = u16::from_be_bytes([payload[0], payload[1]]);
            let valid = matches!(code, 1000..=1003 | 1007..=1011 | 3000..=4999);
            if !valid {
                return Err(violation(1002, "invalid close code"));
            }
            if std::str::from_utf8(&payload[2..]).is_err() {
                return Err(violation(1007, "close reason is not UTF-8"));
            }
            Ok(Incoming::Close(Some(code)))
        }
    }
}

fn unmask(buf: &mut [u8], mask: [u8; 4]) {
    for (i, b) in buf.iter_mut().enumerate() {
        *b ^= mask[i & 3];
    }
}

/// Server frame opcodes.
#[derive(Debug, Clone, Copy)]
pub enum ServerOp {
    /// Text message.
    Text,
    /// Ping.
    Ping,
    /// Pong.
    Pong,
    /// Close.
    Close,
}

/// Appends an unmasked, final server frame header for a `len`-byte payload.
pub fn put_header(out: &mut Vec<u8>, op: ServerOp, len: usize) {
    put_header_with(out, op, len, false);
}

/// Appends a server text frame: `msg` compressed (RSV1 set, RFC 7692) when
/// `deflate` is given and `msg` has at least `min_bytes`, else as it is.
pub fn put_text(out: &mut Vec<u8>, msg: &[u8], deflate: Option<(Deflate, usize)>) {
    match deflate {
        Some((d, min_bytes)) if msg.len() >= min_bytes => COMPRESSED.with(|cell| {
            let mut packed = cell.borrow_mut();
            packed.clear();
            deflate::compress(msg, d.server_window_bits, &mut packed);
            put_compressed(out, &packed);
            if packed.capacity() > 1 << 20 {
                *packed = Vec::new();
            }
        }),
        _ => {
            put_header(out, ServerOp::Text, msg.len());
            out.extend_from_slice(msg);
        }
    }
}

/// Appends a server text frame whose payload is already compressed.
pub fn put_compressed(out: &mut Vec<u8>, packed: &[u8]) {
    put_header_with(out, ServerOp::Text, packed.len(), true);
    out.extend_from_slice(packed);
}

thread_local! {
    /// Scratch space for one compressed message (its length goes first).
    static COMPRESSED: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
}

fn put_header_with(out: &mut Vec<u8>, op: ServerOp, len: usize, rsv1: bool) {
    let opcode = match op {
        ServerOp::Text => OpCode::Data(Data::Text),
        ServerOp::Ping => OpCode::Control(Control::Ping),
        ServerOp::Pong => OpCode::Control(Control::Pong),
        ServerOp::Close => OpCode::Control(Control::Close),
    };
    let header = FrameHeader {
        is_final: true,
        rsv1,
        rsv2: false,
        rsv3: false,
        opcode,
        mask: None,
    };
    header
        .format(len as u64, out)
        .expect("writing to a Vec cannot fail");
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A masked client frame.
    fn frame(first: u8, payload: &[u8]) -> Vec<u8> {
        let mask = [1, 2, 3, 4];
        let mut out = vec![first];
        match payload.len() {
            n if n < 126 => out.push(0x80 | n as u8),
            n if n < 65536 => {
                out.push(0x80 | 126);
                out.extend_from_slice(&(n as u16).to_be_bytes());
            }
            n => {
                out.push(0x80 | 127);
                out.extend_from_slice(&(n as u64).to_be_bytes());
            }
        }
        out.extend_from_slice(&mask);
        out.extend(payload.iter().enumerate().map(|(i, b)| b ^ mask[i & 3]));
        out
    }

    fn read_all(bytes: &[u8]) -> Vec<Result<Incoming, Violation>> {
        read_all_with(bytes, None)
    }

    fn read_all_with(bytes: &[u8], deflate: Option<Deflate>) -> Vec<Result<Incoming, Violation>> {
        let mut r = FrameReader::new(1 << 20, deflate);
        let mut buf = BytesMut::from(bytes);
        let mut out = Vec::new();
        loop {
            match r.next(&mut buf) {
                Ok(Some(m)) => out.push(Ok(m)),
                Ok(None) => return out,
                Err(e) => {
                    out.push(Err(e));
                    return out;
                }
            }
        }
    }

    const DEFLATE: Deflate = Deflate {
        server_window_bits: 15,
        client_no_context_takeover: true,
    };

    fn packed(msg: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        deflate::compress(msg, 15, &mut out);
        out
    }

    #[test]
    fn compressed_messages_are_inflated_only_when_negotiated() {
        let msg = br#"{"type":"publish","room":"r","event":"chat","data":"hello hello hello"}"#;
        let p = packed(msg);
        // RSV1 (0x40) on a final text frame.
        let whole = frame(0xC1, &p);
        assert_eq!(
            read_all_with(&whole, Some(DEFLATE)),
            vec![Ok(Incoming::Text(Bytes::copy_from_slice(msg)))]
        );
        // Fragmented: RSV1 on the first frame only.
        let (a, b) = p.split_at(p.len() / 2);
        let mut split = frame(0x41, a);
        split.extend(frame(0x80, b));
        assert_eq!(
            read_all_with(&split, Some(DEFLATE)),
            vec![Ok(Incoming::Text(Bytes::copy_from_slice(msg)))]
        );
        // Uncompressed messages still pass.
        assert_eq!(
            read_all_with(&frame(0x81, b"{}"), Some(DEFLATE)),
            vec![Ok(Incoming::Text(Bytes::from_static(b"{}")))]
        );
        // Without the extension, or on a continuation or control frame: a violation.
        assert_eq!(
            read_all(&whole),
            vec![Err(violation(1002, "reserved bits set"))]
        );
        let mut bad = frame(0x01, a);
        bad.extend(frame(0xC0, b));
        assert_eq!(
            read_all_with(&bad, Some(DEFLATE)),
            vec![Err(violation(1002, "reserved bits set"))]
        );
        assert_eq!(
            read_all_with(&frame(0xC9, b""), Some(DEFLATE)),
            vec![Err(violation(1002, "reserved bits set"))]
        );
        // Not deflate data.
        assert_eq!(
            read_all_with(&frame(0xC1, &[0xff, 0xfe, 0xfd]), Some(DEFLATE)),
            vec![Err(violation(1007, "invalid compressed message"))]
        );
        // Inflating past the limit.
        let big = vec![b' '; 2 << 20];
        assert_eq!(
            read_all_with(&frame(0xC1, &packed(&big)), Some(DEFLATE)),
            vec![Err(violation(1009, "message too big"))]
        );
    }

    #[test]
    fn server_text_frames_are_compressed_above_the_threshold() {
        let msg = vec![b'a'; 300];
        let mut out = Vec::new();
        put_text(&mut out, &msg, Some((DEFLATE, 256)));
        assert_eq!(out[0], 0xC1, "FIN, RSV1, text");
        let len = out[1] as usize;
        assert_eq!(out.len(), 2 + len);
        let mut inflater = Inflater::new(DEFLATE);
        assert_eq!(inflater.inflate(&out[2..], 1024).unwrap(), msg);
        let mut plain = Vec::new();
        put_text(&mut plain, &msg[..255], Some((DEFLATE, 256)));
        assert_eq!(plain[0], 0x81);
        assert_eq!(&plain[plain.len() - 255..], &msg[..255]);
        let mut off = Vec::new();
        put_text(&mut off, &msg, None);
        assert_eq!((off[0], off.len()), (0x81, 304));
    }

    #[test]
    fn text_binary_and_control_frames() {
        let mut bytes = frame(0x81, b"hello");
        bytes.extend(frame(0x82, &[0, 159]));
        bytes.extend(frame(0x89, b"p"));
        bytes.extend(frame(0x8A, b""));
        bytes.extend(frame(0x88, &[3, 232, b'o', b'k']));
        assert_eq!(
            read_all(&bytes),
            vec![
                Ok(Incoming::Text(Bytes::from_static(b"hello"))),
                Ok(Incoming::Binary(Bytes::from_static(&[0, 159]))),
                Ok(Incoming::Ping(Bytes::from_static(b"p"))),
                Ok(Incoming::Pong),
                Ok(Incoming::Close(Some(1000))),
            ]
        );
    }

    #[test]
    fn partial_input_consumes_nothing_until_complete() {
        let long = vec![b'x'; 300];
        let whole = frame(0x81, &long);
        let mut r = FrameReader::new(1 << 20, None);
        for cut in [0, 1, 2, 3, 7, 200, whole.len() - 1] {
            let mut buf = BytesMut::from(&whole[..cut]);
            assert_eq!(r.next(&mut buf), Ok(None), "cut at {cut}");
            assert_eq!(buf.len(), cut);
        }
        let mut buf = BytesMut::from(&whole[..]);
        assert_eq!(
            r.next(&mut buf),
            Ok(Some(Incoming::Text(Bytes::from(long))))
        );
        assert!(buf.is_empty());
    }

    #[test]
    fn fragments_reassemble_with_control_frames_between() {
        let mut bytes = frame(0x01, b"hel");
        bytes.extend(frame(0x89, b""));
        bytes.extend(frame(0x00, b"lo "));
        bytes.extend(frame(0x80, "wörld".as_bytes()));
        assert_eq!(
            read_all(&bytes),
            vec![
                Ok(Incoming::Ping(Bytes::new())),
                Ok(Incoming::Text(Bytes::from("hello wörld")))
            ]
        );
    }

    #[test]
    fn violations_carry_their_close_codes() {
        let code = |bytes: Vec<u8>| read_all(&bytes).pop().unwrap().unwrap_err().code;
        // unmasked
        assert_eq!(code(vec![0x81, 0x01, b'x']), 1002);
        // reserved bit, reserved opcode
        assert_eq!(code(frame(0xC1, b"x")), 1002);
        assert_eq!(code(frame(0x83, b"x")), 1002);
        // fragmented or oversize control frame
        assert_eq!(code(frame(0x09, b"")), 1002);
        assert_eq!(code(frame(0x89, &[0; 126])), 1002);
        // continuation without a start; a new message inside a fragmented one
        assert_eq!(code(frame(0x80, b"x")), 1002);
        let mut two = frame(0x01, b"a");
        two.extend(frame(0x81, b"b"));
        assert_eq!(code(two), 1002);
        // invalid UTF-8 in text (also split across fragments) and close reasons
        assert_eq!(code(frame(0x81, &[0xff])), 1007);
        let mut split = frame(0x01, &[0xc3]);
        split.extend(frame(0x80, &[0xb6]));
        assert_eq!(read_all(&split), vec![Ok(Incoming::Text(Bytes::from("ö")))]);
        assert_eq!(code(frame(0x88, &[3, 232, 0xff])), 1007);
        // close payloads: one byte, or a code that may not be sent
        assert_eq!(code(frame(0x88, &[3])), 1002);
        assert_eq!(code(frame(0x88, &[3, 237])), 1002);
    }

    #[test]
    fn size_limit_counts_the_whole_message() {
        let mut r = FrameReader::new(10, None);
        let mut buf = BytesMut::from(&frame(0x81, &[b'x'; 11])[..]);
        assert_eq!(r.next(&mut buf).unwrap_err().code, 1009);
        let mut r = FrameReader::new(10, None);
        let mut bytes = frame(0x01, &[b'x'; 6]);
        bytes.extend(frame(0x80, &[b'x'; 5]));
        let mut buf = BytesMut::from(&bytes[..]);
        assert_eq!(r.next(&mut buf).unwrap_err().code, 1009);
    }

    #[test]
    fn server_headers() {
        let mut out = Vec::new();
        put_header(&mut out, ServerOp::Text, 5);
        assert_eq!(out, [0x81, 5]);
        out.clear();
        put_header(&mut out, ServerOp::Text, 300);
        assert_eq!(out, [0x81, 126, 1, 44]);
        out.clear();
        put_header(&mut out, ServerOp::Close, 2);
        assert_eq!(out, [0x88, 2]);
    }
}
