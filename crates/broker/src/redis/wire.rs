//! What entries look like in Redis: stream entries and pub/sub messages.

use ::redis::Value;
use bytes::Bytes;

use crate::LogEntry;

/// Length of the `n` and `ts` header of a pub/sub message.
const HEADER: usize = 16;

/// Decodes a pub/sub message made by `append.lua`: 8 bytes `n`, 8 bytes
/// `ts` (big-endian), then the payload.
/// A log entry as published on its room's channel: `n` and `ts`
/// (big-endian, 8 bytes each) followed by the payload.
pub(super) fn encode_message(n: u64, ts: u64, payload: &[u8]) -> Vec<u8> {
    let mut message = Vec::with_capacity(16 + payload.len());
    message.extend_from_slice(&n.to_be_bytes());
    message.extend_from_slice(&ts.to_be_bytes());
    message.extend_from_slice(payload);
    message
}

pub(super) fn decode_message(message: &[u8]) -> Option<LogEntry> {
    if message.len() < HEADER {
        return None;
    }
    let (n, rest) = message.split_at(8);
    let (ts, payload) = rest.split_at(8);
    Some(LogEntry {
        n: u64::from_be_bytes(n.try_into().ok()?),
        ts: u64::from_be_bytes(ts.try_into().ok()?),
        payload: Bytes::copy_from_slice(payload),
    })
}

/// Parses an XRANGE reply of a room log (ids `<n>-0`, fields `ts` and `p`).
pub(super) fn parse_entries(reply: Value) -> Result<Vec<LogEntry>, String> {
    let Value::Array(items) = reply else {
        return Err(format!("XRANGE answered {reply:?}"));
    };
    items.into_iter().map(parse_entry).collect()
}

fn parse_entry(item: Value) -> Result<LogEntry, String> {
    let bad = || "malformed stream entry".to_string();
    let Value::Array(mut parts) = item else {
        return Err(bad());
    };
    if parts.len() != 2 {
        return Err(bad());
    }
    let fields = parts.pop().ok_or_else(bad)?;
    let id = bulk(parts.pop().ok_or_else(bad)?).ok_or_else(bad)?;
    let n = std::str::from_utf8(&id)
        .ok()
        .and_then(|id| id.split_once('-'))
        .and_then(|(n, _)| n.parse().ok())
        .ok_or_else(bad)?;
    let Value::Array(fields) = fields else {
        return Err(bad());
    };
    let (mut ts, mut payload) = (None, None);
    let mut fields = fields.into_iter();
    while let (Some(name), Some(value)) = (fields.next(), fields.next()) {
        match bulk(name).as_deref() {
            Some(b"ts") => {
                ts = bulk(value)
                    .and_then(|v| String::from_utf8(v).ok())
                    .and_then(|v| v.parse().ok())
            }
            Some(b"p") => payload = bulk(value),
            _ => {}
        }
    }
    Ok(LogEntry {
        n,
        ts: ts.ok_or_else(bad)?,
        payload: Bytes::from(payload.ok_or_else(bad)?),
    })
}

fn bulk(v: Value) -> Option<Vec<u8>> {
    match v {
        Value::BulkString(b) => Some(b),
        Value::SimpleString(s) => Some(s.into_bytes()),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_decode_binary_payloads() {
        let mut m = 7u64.to_be_bytes().to_vec();
        m.extend(1_700_000_000_123u64.to_be_bytes());
        m.extend([0, 255, b'x']);
        let e = decode_message(&m).unwrap();
        assert_eq!((e.n, e.ts), (7, 1_700_000_000_123));
        assert_eq!(&e.payload[..], &[0, 255, b'x']);
        assert!(decode_message(&m[..15]).is_none());
    }

    #[test]
    fn stream_entries_parse() {
        let b = |s: &[u8]| Value::BulkString(s.to_vec());
        let reply = Value::Array(vec![Value::Array(vec![
            b(b"12-0"),
            Value::Array(vec![b(b"ts"), b(b"99"), b(b"p"), b(&[0, 1])]),
        ])]);
        let e = parse_entries(reply).unwrap();
        assert_eq!(e[0].n, 12);
        assert_eq!(e[0].ts, 99);
        assert_eq!(&e[0].payload[..], &[0, 1]);
        assert!(parse_entries(Value::Array(vec![b(b"x")])).is_err());
    }
}
