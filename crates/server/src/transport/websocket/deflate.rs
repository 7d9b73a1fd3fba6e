//! permessage-deflate (RFC 7692): the negotiation, and compressing and
//! inflating whole messages.
//!
//! The server always answers with `server_no_context_takeover`: each message
//! it sends is compressed on its own, so one compressor per thread serves
//! every connection (a deflate state is hundreds of KiB; one per connection
//! would cost more than the connection itself), and what a member is sent
//! never depends on what it was sent before. What clients send may keep
//! their context (browsers do unless told otherwise, and a server may only
//! say so when the client offered it): the inflater then lives with the
//! connection, created on its first compressed message. Deflate itself is
//! flate2's, on the zlib-rs backend (window sizes below 15 need a zlib).

use std::cell::RefCell;

use flate2::{Compress, Compression, Decompress, FlushCompress, FlushDecompress, Status};

/// The tail a sync flush ends with, left off on the wire (RFC 7692 §7.2.1).
const SYNC_TAIL: [u8; 4] = [0x00, 0x00, 0xff, 0xff];

/// Compression level: JSON frames of a few hundred bytes gain little from
/// more effort, and every delivery pays it.
const LEVEL: u32 = 3;

/// What a connection agreed to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Deflate {
    /// The LZ77 window the server compresses with (the client may ask for a
    /// smaller one than 15).
    pub server_window_bits: u8,
    /// The client compresses each message on its own.
    pub client_no_context_takeover: bool,
}

/// Picks the first offer of `permessage-deflate` in the request's
/// `Sec-WebSocket-Extensions` values that the server can honour, and
/// returns it with the response header's value. Offers with unknown or
/// repeated parameters, or bad values, are skipped (RFC 7692 §5).
pub(crate) fn negotiate<'a>(offers: impl Iterator<Item = &'a str>) -> Option<(Deflate, String)> {
    offers
        .flat_map(|v| v.split(','))
        .find_map(|offer| accept(offer.trim()))
}

fn accept(offer: &str) -> Option<(Deflate, String)> {
    let mut parts = offer.split(';').map(str::trim);
    if !parts.next()?.eq_ignore_ascii_case("permessage-deflate") {
        return None;
    }
    let mut seen: Vec<String> = Vec::new();
    let mut d = Deflate {
        server_window_bits: 15,
        client_no_context_takeover: false,
    };
    let mut asked_server_bits = false;
    for p in parts.filter(|p| !p.is_empty()) {
        let (name, value) = match p.split_once('=') {
            Some((n, v)) => (n.trim(), Some(v.trim().trim_matches('"'))),
            None => (p, None),
        };
        let name = name.to_ascii_lowercase();
        if seen.contains(&name) {
            return None;
        }
        match (name.as_str(), value) {
            ("server_no_context_takeover", None) => {}
            ("client_no_context_takeover", None) => d.client_no_context_takeover = true,
            ("server_max_window_bits", Some(v)) => {
                // zlib cannot keep to a 256-byte window (it uses 512).
                d.server_window_bits = v.parse().ok().filter(|b| (9..=15).contains(b))?;
                asked_server_bits = true;
            }
            // Any window the client uses is one the inflater (15) can read.
            ("client_max_window_bits", None) => {}
            ("client_max_window_bits", Some(v)) => {
                v.parse::<u8>().ok().filter(|b| (8..=15).contains(b))?;
            }
            _ => return None,
        }
        seen.push(name);
    }
    let mut response = String::from("permessage-deflate; server_no_context_takeover");
    if d.client_no_context_takeover {
        response.push_str("; client_no_context_takeover");
    }
    if asked_server_bits {
        response.push_str(&format!(
            "; server_max_window_bits={}",
            d.server_window_bits
        ));
    }
    Some((d, response))
}

thread_local! {
    /// This thread's compressor and its window bits.
    static COMPRESSOR: RefCell<Option<(u8, Compress)>> = const { RefCell::new(None) };
}

/// Appends `msg` compressed as one message (no context: the compressor
/// starts afresh), without the sync flush's tail.
pub(crate) fn compress(msg: &[u8], window_bits: u8, out: &mut Vec<u8>) {
    COMPRESSOR.with(|cell| {
        let mut slot = cell.borrow_mut();
        let c = match slot.as_mut() {
            Some((bits, c)) if *bits == window_bits => {
                c.reset();
                c
            }
            _ => {
                let c = Compress::new_with_window_bits(Compression::new(LEVEL), false, window_bits);
                &mut slot.insert((window_bits, c)).1
            }
        };
        let start = out.len();
        let base_in = c.total_in();
        loop {
            out.reserve(msg.len() / 2 + 64);
            let read = (c.total_in() - base_in) as usize;
            let status = c
                .compress_vec(&msg[read..], out, FlushCompress::Sync)
                .expect("deflate of a byte slice cannot fail");
            let done = (c.total_in() - base_in) as usize == msg.len();
            // Finished once all is read and the flush left spare room.
            if done && out.len() < out.capacity() && status != Status::BufError {
                break;
            }
        }
        if out[start..].ends_with(&SYNC_TAIL) {
            out.truncate(out.len() - SYNC_TAIL.len());
        }
    });
}

/// Why a compressed message could not be read.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum InflateError {
    /// It inflates to more than the limit.
    TooBig,
    /// It is not valid deflate data.
    Invalid,
}

/// A connection's inflater for what its client sends.
pub(crate) struct Inflater {
    state: Option<Box<Decompress>>,
    keep_context: bool,
}

impl std::fmt::Debug for Inflater {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Inflater")
            .field("active", &self.state.is_some())
            .field("keep_context", &self.keep_context)
            .finish()
    }
}

impl Inflater {
    /// An inflater for a connection that agreed to `d`.
    pub(crate) fn new(d: Deflate) -> Inflater {
        Inflater {
            state: None,
            keep_context: !d.client_no_context_takeover,
        }
    }

    /// The message `data` (a compressed message's payload) stands for, at
    /// most `limit` bytes.
    pub(crate) fn inflate(&mut self, data: &[u8], limit: usize) -> Result<Vec<u8>, InflateError> {
        let d = self
            .state
            .get_or_insert_with(|| Box::new(Decompress::new(false)));
        let mut out = Vec::with_capacity((data.len() * 3).min(limit).max(64));
        let result = inflate_into(d, data, limit, &mut out)
            .and_then(|()| inflate_into(d, &SYNC_TAIL, limit, &mut out));
        if result.is_err() || !self.keep_context {
            // A broken stream cannot go on; without context nothing is kept.
            self.state = None;
        }
        result.map(|()| out)
    }
}

fn inflate_into(
    d: &mut Decompress,
    mut input: &[u8],
    limit: usize,
    out: &mut Vec<u8>,
) -> Result<(), InflateError> {
    loop {
        if out.len() == out.capacity() {
            if out.len() >= limit {
                return Err(InflateError::TooBig);
            }
            out.reserve((out.len()).clamp(256, limit - out.len()));
        }
        let before = d.total_in();
        let status = d
            .decompress_vec(input, out, FlushDecompress::Sync)
            .map_err(|_| InflateError::Invalid)?;
        input = &input[(d.total_in() - before) as usize..];
        if out.len() > limit {
            return Err(InflateError::TooBig);
        }
        match status {
            Status::StreamEnd => return Ok(()),
            _ if input.is_empty() && out.len() < out.capacity() => return Ok(()),
            Status::BufError if !input.is_empty() && out.len() < out.capacity() => {
                return Err(InflateError::Invalid)
            }
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn offer(v: &str) -> Option<(Deflate, String)> {
        negotiate(std::iter::once(v))
    }

    #[test]
    fn browsers_offers_are_accepted_without_context_on_the_server_side() {
        // Chrome's and Firefox's offer.
        let (d, r) = offer("permessage-deflate; client_max_window_bits").unwrap();
        assert_eq!(r, "permessage-deflate; server_no_context_takeover");
        assert_eq!(d.server_window_bits, 15);
        assert!(!d.client_no_context_takeover);
        let (d, r) =
            offer("permessage-deflate; client_no_context_takeover; server_max_window_bits=10")
                .unwrap();
        assert_eq!(
            r,
            "permessage-deflate; server_no_context_takeover; client_no_context_takeover; \
             server_max_window_bits=10"
        );
        assert_eq!(d.server_window_bits, 10);
        assert!(d.client_no_context_takeover);
    }

    #[test]
    fn offers_the_server_cannot_honour_are_skipped_for_the_next() {
        assert_eq!(offer("x-webkit-deflate-frame"), None);
        assert_eq!(offer("permessage-deflate; server_max_window_bits=8"), None);
        assert_eq!(offer("permessage-deflate; server_max_window_bits"), None);
        assert_eq!(offer("permessage-deflate; client_max_window_bits=20"), None);
        assert_eq!(offer("permessage-deflate; mystery"), None);
        assert_eq!(
            offer("permessage-deflate; client_no_context_takeover; client_no_context_takeover"),
            None
        );
        let (d, _) = offer(
            "permessage-deflate; server_max_window_bits=8, permessage-deflate; \
             server_max_window_bits=\"12\"",
        )
        .unwrap();
        assert_eq!(d.server_window_bits, 12);
        assert_eq!(
            negotiate(["foo", "permessage-deflate"].into_iter())
                .unwrap()
                .0
                .server_window_bits,
            15
        );
    }

    fn message(n: usize) -> Vec<u8> {
        (0..n)
            .map(|i| format!(r#"{{"type":"event","seq":{i},"data":{{"text":"hello {i}"}}}}"#))
            .collect::<String>()
            .into_bytes()
    }

    #[test]
    fn messages_round_trip_and_each_stands_alone() {
        for (n, bits) in [(0, 15), (1, 15), (40, 15), (3000, 15), (200, 9)] {
            let msg = message(n);
            let mut out = b"head".to_vec();
            compress(&msg, bits, &mut out);
            assert_eq!(&out[..4], b"head");
            let packed = out[4..].to_vec();
            assert!(!packed.ends_with(&SYNC_TAIL));
            if n >= 40 {
                assert!(
                    packed.len() * 3 < msg.len(),
                    "{n}: {} of {}",
                    packed.len(),
                    msg.len()
                );
            }
            // No context: the same message compresses the same every time.
            let mut again = Vec::new();
            compress(&msg, bits, &mut again);
            assert_eq!(again, packed);
            let mut inflater = Inflater::new(Deflate {
                server_window_bits: 15,
                client_no_context_takeover: true,
            });
            assert_eq!(inflater.inflate(&packed, 1 << 24).unwrap(), msg, "{n}");
        }
    }

    /// What a client keeping its context sends: one deflate stream, each
    /// message sync-flushed, tails cut.
    fn with_context(messages: &[Vec<u8>]) -> Vec<Vec<u8>> {
        let mut c = Compress::new(Compression::default(), false);
        messages
            .iter()
            .map(|m| {
                let mut out = Vec::with_capacity(m.len() + 64);
                c.compress_vec(m, &mut out, FlushCompress::Sync).unwrap();
                assert!(out.ends_with(&SYNC_TAIL));
                out.truncate(out.len() - 4);
                out
            })
            .collect()
    }

    #[test]
    fn a_client_keeping_its_context_is_read_message_by_message() {
        let msgs = vec![message(5), message(5), message(7)];
        let packed = with_context(&msgs);
        // The second refers back to the first.
        assert!(packed[1].len() < packed[0].len() / 2);
        let mut inflater = Inflater::new(Deflate {
            server_window_bits: 15,
            client_no_context_takeover: false,
        });
        for (p, m) in packed.iter().zip(&msgs) {
            assert_eq!(&inflater.inflate(p, 1 << 20).unwrap(), m);
        }
    }

    #[test]
    fn bombs_and_garbage_are_refused() {
        let zeros = vec![b'0'; 1 << 20];
        let mut packed = Vec::new();
        compress(&zeros, 15, &mut packed);
        assert!(packed.len() < 5000);
        let d = Deflate {
            server_window_bits: 15,
            client_no_context_takeover: false,
        };
        let mut inflater = Inflater::new(d);
        assert_eq!(
            inflater.inflate(&packed, 64 * 1024),
            Err(InflateError::TooBig)
        );
        assert_eq!(
            Inflater::new(d).inflate(&[0xff, 0xff, 0xff, 0x00, 0x13], 1024),
            Err(InflateError::Invalid)
        );
        // After a failure the next message starts afresh.
        let mut ok = Vec::new();
        compress(b"{}", 15, &mut ok);
        assert_eq!(inflater.inflate(&ok, 1024).unwrap(), b"{}");
    }
}
