//! The compact wire form, `plaza.v1.compact`: room messages as JSON arrays.
//!
//! Most of what a busy room sends is `message` events, and in v1 their field
//! names, room id and timestamp are most of their envelope. A client that
//! offers the WebSocket subprotocol [`COMPACT_SUBPROTOCOL`] gets each
//! `message` event as an array of its values in v1's field order, and every
//! other frame exactly as in v1:
//!
//! ```text
//! [alias, seq, ts - ts_base, from, event, data]
//! [alias, seq, ts - ts_base, from, event, data, {"channel": .., "topic": .., "reply_to": .., "id": ..}]
//! ```
//!
//! The room is named by its `alias`, and the time is counted from `ts_base`:
//! the [`CompactKey`] the connection's `joined` (or `resync`) for the room
//! carried. A key belongs to a room on one node, not to a connection, so a
//! message's compact form is made once for every recipient there.
//!
//! `data` is `null` when the message has none (v1 leaves it out; a published
//! `null` is no data in v1 as well). The seventh element is present only when
//! one of the rarer fields is, and holds exactly those, named as in v1. A
//! client tells the forms apart by the first byte: `[` is a compact message,
//! `{` a v1 frame.
//!
//! ```
//! use plaza_protocol::compact::{compact_message, expand, CompactKey};
//! let key = CompactKey { alias: 2, ts_base: 1_000 };
//! let v1 = br#"{"type":"event","room":"r","seq":3,"ts":1010,"from":"s1","kind":"message","event":"chat","data":{"t":"hi"}}"#;
//! let compact = compact_message(v1, key).unwrap();
//! assert_eq!(&compact[..], br#"[2,3,10,"s1","chat",{"t":"hi"}]"#);
//! let back = expand(&compact, &[("r".to_owned(), key)]).unwrap();
//! assert_eq!(back, serde_json::from_slice::<serde_json::Value>(v1).unwrap());
//! ```

use std::io::Write as _;

use bytes::Bytes;
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use serde_json::{Map, Value};

/// The WebSocket subprotocol of v1 with compact messages.
pub const COMPACT_SUBPROTOCOL: &str = "plaza.v1.compact";

/// The WebSocket subprotocol of plain v1 (what a client gets without asking).
pub const JSON_SUBPROTOCOL: &str = "plaza.v1";

/// How a room's compact messages name the room and count time on one node:
/// sent in `joined` and `resync` (field `compact`) to compact connections.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct CompactKey {
    /// Stands for the room id: unique among the rooms open on the node.
    pub alias: u32,
    /// A message's `ts` is sent as `ts - ts_base` (negative for one ordered
    /// before it).
    pub ts_base: u64,
}

/// The fields of a v1 `message` event, borrowed from its encoding: strings
/// keep their escapes and `data` its bytes, so nothing is decoded and
/// re-encoded.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct V1Message<'a> {
    #[serde(rename = "type", borrow)]
    ty: &'a str,
    /// Checked to be there; the alias stands for it.
    #[serde(rename = "room")]
    _room: serde::de::IgnoredAny,
    #[serde(borrow)]
    seq: &'a RawValue,
    ts: u64,
    #[serde(borrow, default)]
    from: Option<&'a RawValue>,
    #[serde(borrow)]
    kind: &'a str,
    #[serde(borrow, default)]
    channel: Option<&'a RawValue>,
    #[serde(borrow)]
    event: &'a RawValue,
    #[serde(borrow, default)]
    data: Option<&'a RawValue>,
    #[serde(borrow, default)]
    topic: Option<&'a RawValue>,
    #[serde(borrow, default)]
    reply_to: Option<&'a RawValue>,
    #[serde(borrow, default)]
    id: Option<&'a RawValue>,
}

/// The compact form of an encoded v1 server frame under the room's `key`:
/// `Some` for a `message` event, `None` for every other frame (which the
/// compact form sends as it is). Made once per event and shared by every
/// recipient on the node that asked for it.
pub fn compact_message(v1: &[u8], key: CompactKey) -> Option<Bytes> {
    // Every event the server encodes starts so; anything else is not looked into.
    // The searcher is built once: building it is most of a short search.
    static KIND: std::sync::LazyLock<memchr::memmem::Finder<'static>> =
        std::sync::LazyLock::new(|| memchr::memmem::Finder::new(br#""kind":"message""#));
    if !v1.starts_with(br#"{"type":"event","#) || KIND.find(v1).is_none() {
        return None;
    }
    let m: V1Message<'_> = serde_json::from_slice(v1).ok()?;
    if m.ty != "event" || m.kind != "message" {
        return None;
    }
    let mut out = Vec::with_capacity(v1.len());
    let ts = i128::from(m.ts) - i128::from(key.ts_base);
    // Writing into a Vec does not fail.
    let _ = write!(out, "[{},{},{ts}", key.alias, m.seq.get());
    for v in [m.from, Some(m.event), m.data] {
        out.push(b',');
        out.extend_from_slice(v.map_or("null", RawValue::get).as_bytes());
    }
    let rest = [
        ("channel", m.channel),
        ("topic", m.topic),
        ("reply_to", m.reply_to),
        ("id", m.id),
    ];
    if rest.iter().any(|(_, v)| v.is_some()) {
        out.extend_from_slice(b",{");
        let mut first = true;
        for (name, v) in rest {
            let Some(v) = v else { continue };
            if !first {
                out.push(b',');
            }
            first = false;
            out.push(b'"');
            out.extend_from_slice(name.as_bytes());
            out.extend_from_slice(b"\":");
            out.extend_from_slice(v.get().as_bytes());
        }
        out.push(b'}');
    }
    out.push(b']');
    Some(Bytes::from(out))
}

/// Why [`expand`] refused its input.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NotCompact(pub &'static str);

impl std::fmt::Display for NotCompact {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "not a compact message: {}", self.0)
    }
}

impl std::error::Error for NotCompact {}

/// The v1 `event` frame a compact message stands for, as a JSON value, given
/// the keys of the rooms the connection is in: the latest key of each, none
/// of a room it left (for clients and tests; the server only makes compact
/// forms).
pub fn expand(compact: &[u8], rooms: &[(String, CompactKey)]) -> Result<Value, NotCompact> {
    let items: Vec<Value> =
        serde_json::from_slice(compact).map_err(|_| NotCompact("not a JSON array"))?;
    if !(6..=7).contains(&items.len()) {
        return Err(NotCompact("an array of 6 or 7 elements"));
    }
    let mut items = items.into_iter();
    let mut next = || items.next().unwrap_or(Value::Null);
    let (alias, seq, ts, from, event, data, rest) =
        (next(), next(), next(), next(), next(), next(), next());
    if !alias.is_u64() || !seq.is_u64() || !ts.is_i64() || !event.is_string() {
        return Err(NotCompact("alias, seq, ts and event of the wrong types"));
    }
    let (room, key) = rooms
        .iter()
        .find(|(_, k)| Some(u64::from(k.alias)) == alias.as_u64())
        .ok_or(NotCompact("an alias no joined room has"))?;
    let ts = ts
        .as_i64()
        .and_then(|t| u64::try_from(i128::from(t) + i128::from(key.ts_base)).ok())
        .ok_or(NotCompact("a ts before 1970"))?;
    let mut rest = match rest {
        Value::Null => Map::new(),
        Value::Object(m) => m,
        _ => return Err(NotCompact("a seventh element that is not an object")),
    };
    let mut v1 = Map::new();
    v1.insert("type".into(), "event".into());
    v1.insert("room".into(), room.as_str().into());
    v1.insert("seq".into(), seq);
    v1.insert("ts".into(), ts.into());
    if !from.is_null() {
        v1.insert("from".into(), from);
    }
    v1.insert("kind".into(), "message".into());
    if let Some(channel) = rest.remove("channel") {
        v1.insert("channel".into(), channel);
    }
    v1.insert("event".into(), event);
    if !data.is_null() {
        v1.insert("data".into(), data);
    }
    for name in ["topic", "reply_to", "id"] {
        if let Some(value) = rest.remove(name) {
            v1.insert(name.into(), value);
        }
    }
    if !rest.is_empty() {
        return Err(NotCompact("an unknown field in the seventh element"));
    }
    Ok(Value::Object(v1))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn value(b: &[u8]) -> Value {
        serde_json::from_slice(b).unwrap()
    }

    const KEY: CompactKey = CompactKey {
        alias: 7,
        ts_base: 1732312400000,
    };

    fn rooms(room: &str) -> Vec<(String, CompactKey)> {
        vec![
            (
                "other".to_owned(),
                CompactKey {
                    alias: 1,
                    ts_base: 5,
                },
            ),
            (room.to_owned(), KEY),
        ]
    }

    #[test]
    fn every_field_round_trips_and_rare_ones_go_in_the_seventh_element() {
        let v1 = br#"{"type":"event","room":"lobby","seq":43,"ts":1732312400120,"from":"Hk3vQ9xLm2A","kind":"message","channel":"xr","event":"chat","data":{"text":"hi all"},"topic":"thread-3","reply_to":40,"id":"m-17"}"#;
        let c = compact_message(v1, KEY).unwrap();
        assert_eq!(
            std::str::from_utf8(&c).unwrap(),
            r#"[7,43,120,"Hk3vQ9xLm2A","chat",{"text":"hi all"},{"channel":"xr","topic":"thread-3","reply_to":40,"id":"m-17"}]"#
        );
        assert_eq!(expand(&c, &rooms("lobby")).unwrap(), value(v1));
    }

    #[test]
    fn no_data_is_null_and_escapes_are_kept_as_they_are() {
        let v1 = br#"{"type":"event","room":"r\"\u00e9","seq":1,"ts":2,"from":"s","kind":"message","event":"e\n"}"#;
        let c = compact_message(v1, KEY).unwrap();
        assert_eq!(&c[..], br#"[7,1,-1732312399998,"s","e\n",null]"#);
        assert_eq!(expand(&c, &rooms("r\"é")).unwrap(), value(v1));
    }

    #[test]
    fn other_frames_and_other_events_have_no_compact_form() {
        for f in [
            &br#"{"type":"event","room":"r","seq":1,"ts":2,"kind":"presence.leave","session":"x","reason":"left"}"#[..],
            br#"{"type":"ack","room":"r","seq":9}"#,
            br#"{"type":"batch","room":"r","events":[]}"#,
            br#"{"type":"event","room":"r","seq":1,"ts":2,"from":"s","kind":"message","event":"e","later":1}"#,
            b"not json",
        ] {
            assert_eq!(compact_message(f, KEY), None, "{}", String::from_utf8_lossy(f));
        }
    }

    #[test]
    fn expand_refuses_what_is_not_a_compact_message() {
        for c in [
            &b"{}"[..],
            b"[1,2,3]",
            br#"[1,2,3,4,5,6]"#,
            br#"[7,1,2,"s","e",null,[]]"#,
            br#"[7,1,2,"s","e",null,{"x":1}]"#,
            br#"["r",1,2,"s","e",null]"#,
            br#"[3,1,2,"s","e",null]"#,
            br#"[7,1,-1732312400001,"s","e",null]"#,
        ] {
            assert!(
                expand(c, &rooms("r")).is_err(),
                "{}",
                String::from_utf8_lossy(c)
            );
        }
    }
}
