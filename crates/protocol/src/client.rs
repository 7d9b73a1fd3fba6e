//! Frames a client sends to the server, and their decoder.
//!
//! Decoding reads the `type` first and then decodes the matching frame, so a
//! frame of a known type with a bad field is reported as
//! [`ErrorCode::InvalidFrame`] and an unknown type as [`ErrorCode::UnknownType`].
//! Message payloads (`data`) stay raw JSON: the server never parses what it only
//! relays. Unknown fields in a frame are ignored (a tolerant reader lets newer
//! clients talk to older servers); unknown fields in request `args` are errors.

use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

use crate::ErrorCode;

/// A decoded client frame.
#[derive(Debug)]
pub enum ClientFrame {
    /// Join a room (or resume a session in it).
    Join(Join),
    /// Leave a room for good.
    Leave(Leave),
    /// Broadcast a message to the room's members on a channel.
    Publish(Publish),
    /// Ask the server to do something; answered by exactly one `response`.
    Request(Request),
    /// Send a message to one session of the room.
    Direct(Direct),
    /// Application-level heartbeat; answered by `pong`.
    Ping(Ping),
    /// Present (or refresh) the connection's identity token; answered by
    /// `authed` or an error.
    Auth(Auth),
}

/// `auth`: the token the application's backend signed for this client.
#[derive(Debug, Deserialize)]
pub struct Auth {
    /// A JWT (JWS compact form).
    pub token: String,
}

/// `join`: enter a room with a ticket, or by room id and name if the room is open.
#[derive(Debug, Deserialize)]
pub struct Join {
    /// Room id; required unless a ticket is given (the ticket names the room).
    #[serde(default)]
    pub room: Option<String>,
    /// A ticket from `POST /v1/rooms/{id}/tickets`.
    #[serde(default)]
    pub ticket: Option<String>,
    /// Display name (ignored when a ticket is given: the ticket fixes it).
    #[serde(default)]
    pub name: Option<String>,
    /// Client platform, e.g. `browser` or `xr` (ignored with a ticket).
    #[serde(default)]
    pub platform: Option<String>,
    /// Channels to subscribe to in addition to `main`.
    #[serde(default)]
    pub channels: Vec<String>,
    /// Resume an earlier session instead of starting a new one.
    #[serde(default)]
    pub resume: Option<Resume>,
    /// A delivery policy for this member (on a resume: replaces the session's).
    #[serde(default)]
    pub policy: Option<crate::policy::DeliveryPolicy>,
    /// Past messages of one channel to receive in `joined` (ignored on a
    /// successful resume: the missed events follow instead).
    #[serde(default)]
    pub history: Option<HistoryRequest>,
}

/// The most messages one `join` may ask for in `history` (the room's
/// history bounds it further).
pub const MAX_JOIN_HISTORY: u32 = 10_000;

/// `join.history`: which past messages of a channel the joining member wants.
///
/// `last` keeps the newest `last` of them, `since` those after a seq; given
/// both, the newest `last` after `since`. One of the two is required.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HistoryRequest {
    /// The channel (default `main`); the member must subscribe to it.
    #[serde(default = "main_channel")]
    pub channel: String,
    /// At most this many (1 to [`MAX_JOIN_HISTORY`]), the newest.
    #[serde(default)]
    pub last: Option<u32>,
    /// Only messages with a greater seq.
    #[serde(default)]
    pub since: Option<u64>,
}

fn main_channel() -> String {
    "main".to_owned()
}

impl HistoryRequest {
    /// Checks the bounds; the error names the field.
    pub fn validate(&self) -> Result<(), String> {
        match (self.last, self.since) {
            (None, None) => Err("history needs `last`, `since` or both".into()),
            (Some(n), _) if n == 0 || n > MAX_JOIN_HISTORY => Err(format!(
                "history.last must be 1 to {MAX_JOIN_HISTORY}, not {n}"
            )),
            _ => Ok(()),
        }
    }
}

/// The session to resume and the last sequence number the client has seen.
#[derive(Debug, Deserialize)]
pub struct Resume {
    /// The `resume_token` from the earlier `joined`.
    pub token: String,
    /// The highest `seq` the client received in this room.
    pub last_seq: u64,
}

/// `leave`: leave a room; the session cannot be resumed afterwards.
#[derive(Debug, Deserialize)]
pub struct Leave {
    /// Room id.
    pub room: String,
}

/// `publish`: a message for the other members of the room.
#[derive(Debug, Deserialize)]
pub struct Publish {
    /// Room id.
    pub room: String,
    /// Channel; members receive only channels they subscribe to.
    #[serde(default = "default_channel")]
    pub channel: String,
    /// Application event name, e.g. `chat` or `pose`.
    pub event: String,
    /// Payload, any JSON value; relayed untouched.
    #[serde(default)]
    pub data: Option<Box<RawValue>>,
    /// Client message id: makes a retried publish idempotent.
    #[serde(default)]
    pub id: Option<String>,
    /// Optional topic, used by delivery policies.
    #[serde(default)]
    pub topic: Option<String>,
    /// The `seq` of the message this one answers.
    #[serde(default)]
    pub reply_to: Option<u64>,
    /// Deliver the message back to the sender too.
    #[serde(default)]
    pub echo: bool,
}

fn default_channel() -> String {
    crate::DEFAULT_CHANNEL.to_owned()
}

/// `request`: an operation validated by the server, answered once by `nonce`.
#[derive(Debug, Deserialize)]
pub struct Request {
    /// Room id.
    pub room: String,
    /// Any JSON string or number; echoed in the `response`.
    pub nonce: Box<RawValue>,
    /// Operation name, e.g. `entity.create` (see [`Op`]).
    pub op: String,
    /// Operation arguments.
    #[serde(default)]
    pub args: Option<Box<RawValue>>,
}

/// `direct`: a message to exactly one session of the room.
#[derive(Debug, Deserialize)]
pub struct Direct {
    /// Room id.
    pub room: String,
    /// Target session id.
    pub to: String,
    /// Application event name, e.g. `rtc.offer`.
    pub event: String,
    /// Payload, relayed untouched.
    #[serde(default)]
    pub data: Option<Box<RawValue>>,
}

/// `ping`: answered by `pong` carrying the same `ts`.
#[derive(Debug, Default, Deserialize)]
pub struct Ping {
    /// Any number the client wants echoed (e.g. its clock).
    #[serde(default)]
    pub ts: Option<serde_json::Number>,
}

/// A decoding failure: the stable code plus a human-readable message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DecodeError {
    /// Stable code.
    pub code: ErrorCode,
    /// What was wrong, for humans.
    pub message: String,
    /// The frame's `type`, when it could be read.
    pub frame_type: Option<String>,
    /// Its `room`, when the frame is a JSON object with a string `room`.
    pub room: Option<String>,
    /// Its client message id, for a `publish` with a string `id`.
    pub id: Option<String>,
}

impl DecodeError {
    fn new(code: ErrorCode, message: String, frame_type: Option<String>) -> DecodeError {
        DecodeError {
            code,
            message,
            frame_type,
            room: None,
            id: None,
        }
    }

    /// Adds what the frame says of itself that an error's `ref` names (its
    /// `room`, and a publish's `id`), read leniently: only on the error path.
    fn naming(mut self, bytes: &[u8]) -> DecodeError {
        #[derive(Deserialize)]
        struct Names {
            #[serde(default)]
            room: serde_json::Value,
            #[serde(default)]
            id: serde_json::Value,
        }
        if let Ok(names) = serde_json::from_slice::<Names>(bytes) {
            let text = |v: serde_json::Value| v.as_str().map(str::to_owned);
            self.room = text(names.room);
            if self.frame_type.as_deref() == Some("publish") {
                self.id = text(names.id);
            }
        }
        self
    }
}

#[derive(Deserialize)]
struct TypeOnly<'a> {
    #[serde(borrow, rename = "type")]
    frame_type: Option<std::borrow::Cow<'a, str>>,
}

/// Decodes one client frame.
///
/// ```
/// use plaza_protocol::{client::decode, ErrorCode};
/// assert_eq!(decode(b"{").unwrap_err().code, ErrorCode::BadJson);
/// assert_eq!(decode(br#"{"type":"dance"}"#).unwrap_err().code, ErrorCode::UnknownType);
/// assert_eq!(decode(br#"{"type":"leave"}"#).unwrap_err().code, ErrorCode::InvalidFrame);
/// ```
pub fn decode(bytes: &[u8]) -> Result<ClientFrame, DecodeError> {
    // serde also reads a struct from a JSON array (fields by position), so
    // `["leave"]` would otherwise decode as a `leave` of room "leave".
    let first = bytes
        .iter()
        .find(|b| !matches!(b, b' ' | b'\t' | b'\n' | b'\r'));
    if first != Some(&b'{') {
        return Err(DecodeError::new(
            ErrorCode::BadJson,
            "frame is not a JSON object".into(),
            None,
        ));
    }
    // A binary message is not checked as UTF-8 by the WebSocket layer, and
    // serde skips what it ignores unchecked: every frame is JSON text.
    if let Err(e) = std::str::from_utf8(bytes) {
        return Err(DecodeError::new(
            ErrorCode::BadJson,
            format!("frame is not UTF-8: {e}"),
            None,
        ));
    }
    let head: TypeOnly = serde_json::from_slice(bytes).map_err(|e| {
        DecodeError::new(
            ErrorCode::BadJson,
            format!("frame is not a JSON object: {e}"),
            None,
        )
    })?;
    let Some(frame_type) = head.frame_type else {
        return Err(DecodeError::new(
            ErrorCode::UnknownType,
            "frame has no \"type\" field".into(),
            None,
        ));
    };
    fn body<'de, T: Deserialize<'de>>(bytes: &'de [u8], t: &str) -> Result<T, DecodeError> {
        serde_json::from_slice(bytes).map_err(|e| {
            // Read again, off the hot path, for the path of the field at
            // fault (`history.last: invalid value: integer `-1`, ...`).
            let de = &mut serde_json::Deserializer::from_slice(bytes);
            let message = match serde_path_to_error::deserialize::<_, T>(de) {
                Err(p) if p.path().iter().next().is_some() => p.to_string(),
                _ => e.to_string(),
            };
            DecodeError::new(
                ErrorCode::InvalidFrame,
                format!("invalid {t} frame: {message}"),
                Some(t.to_owned()),
            )
            .naming(bytes)
        })
    }
    let t = frame_type.as_ref();
    match t {
        "join" => body::<Join>(bytes, t).map(ClientFrame::Join),
        "leave" => body::<Leave>(bytes, t).map(ClientFrame::Leave),
        "publish" => body::<Publish>(bytes, t).map(ClientFrame::Publish),
        "request" => {
            let req = body::<Request>(bytes, t)?;
            let n = req.nonce.get().as_bytes()[0];
            if !(n == b'"' || n == b'-' || n.is_ascii_digit()) {
                return Err(DecodeError::new(
                    ErrorCode::InvalidFrame,
                    "invalid request frame: nonce must be a string or a number".into(),
                    Some(t.to_owned()),
                )
                .naming(bytes));
            }
            Ok(ClientFrame::Request(req))
        }
        "direct" => body::<Direct>(bytes, t).map(ClientFrame::Direct),
        "ping" => body::<Ping>(bytes, t).map(ClientFrame::Ping),
        "auth" => body::<Auth>(bytes, t).map(ClientFrame::Auth),
        other => Err(DecodeError::new(
            ErrorCode::UnknownType,
            format!("unknown frame type {other:?}"),
            Some(other.to_owned()),
        )),
    }
}

/// The operations a `request` can name, with their decoded arguments.
///
/// Serializable so that a cluster node can put a decoded request into a room's
/// shared log (that encoding is internal, not the wire format of `request`).
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub enum Op {
    /// `entity.create {kind?, data}`: the server assigns the id.
    EntityCreate {
        /// Application-defined kind, e.g. `node`.
        kind: Option<String>,
        /// Initial state of the entity.
        data: serde_json::Value,
    },
    /// `entity.set {id, data, version?}`: replace the entity's data.
    EntitySet {
        /// Entity id.
        id: String,
        /// New data.
        data: serde_json::Value,
        /// Expected current version; omitted means "any".
        version: Option<u64>,
    },
    /// `entity.patch {id, data, version?}`: merge top-level fields (`null` deletes one).
    EntityPatch {
        /// Entity id.
        id: String,
        /// Fields to merge.
        data: serde_json::Map<String, serde_json::Value>,
        /// Expected current version; omitted means "any".
        version: Option<u64>,
    },
    /// `entity.delete {id, version?}`.
    EntityDelete {
        /// Entity id.
        id: String,
        /// Expected current version; omitted means "any".
        version: Option<u64>,
    },
    /// `lock.acquire {object, ttl_ms?}`: take a lease on an object.
    LockAcquire {
        /// Object key, usually an entity id.
        object: String,
        /// Lease length; the server's default when omitted, capped by its maximum.
        ttl_ms: Option<u64>,
    },
    /// `lock.renew {object, ttl_ms?}`: extend a lease the session holds.
    LockRenew {
        /// Object key.
        object: String,
        /// New lease length from now.
        ttl_ms: Option<u64>,
    },
    /// `lock.release {object}`.
    LockRelease {
        /// Object key.
        object: String,
    },
    /// `channel.subscribe {channel}`.
    ChannelSubscribe {
        /// Channel name.
        channel: String,
    },
    /// `channel.unsubscribe {channel}`.
    ChannelUnsubscribe {
        /// Channel name.
        channel: String,
    },
    /// `space.move {to: [x, y], speed}`: walk towards `to` at `speed` units
    /// per second (spatial rooms).
    SpaceMove {
        /// Target `[x, y]`, clamped into the plane.
        to: [f64; 2],
        /// Units per second, positive.
        speed: f64,
    },
    /// `space.jump {to: [x, y]}`: be at `to` at once (a teleport).
    SpaceJump {
        /// Where, clamped into the plane.
        to: [f64; 2],
    },
    /// `policy.update {...}`: change this member's delivery policy (or set
    /// one), keeping what the update does not name.
    PolicyUpdate(crate::policy::PolicyUpdate),
    /// `policy.clear`: back to receiving everything at once.
    PolicyClear,
}

/// Every operation name, in documentation order.
pub const OPS: &[&str] = &[
    "entity.create",
    "entity.set",
    "entity.patch",
    "entity.delete",
    "lock.acquire",
    "lock.renew",
    "lock.release",
    "channel.subscribe",
    "channel.unsubscribe",
    "space.move",
    "space.jump",
    "policy.update",
    "policy.clear",
];

impl Request {
    /// Decodes `op` and `args` into an [`Op`].
    pub fn op(&self) -> Result<Op, (ErrorCode, String)> {
        #[derive(Deserialize)]
        #[serde(deny_unknown_fields)]
        struct Create {
            #[serde(default)]
            kind: Option<String>,
            #[serde(default)]
            data: serde_json::Value,
        }
        #[derive(Deserialize)]
        #[serde(deny_unknown_fields)]
        struct Set {
            id: String,
            data: serde_json::Value,
            #[serde(default)]
            version: Option<u64>,
        }
        #[derive(Deserialize)]
        #[serde(deny_unknown_fields)]
        struct Patch {
            id: String,
            data: serde_json::Map<String, serde_json::Value>,
            #[serde(default)]
            version: Option<u64>,
        }
        #[derive(Deserialize)]
        #[serde(deny_unknown_fields)]
        struct Delete {
            id: String,
            #[serde(default)]
            version: Option<u64>,
        }
        #[derive(Deserialize)]
        #[serde(deny_unknown_fields)]
        struct Lock {
            object: String,
            #[serde(default)]
            ttl_ms: Option<u64>,
        }
        #[derive(Deserialize)]
        #[serde(deny_unknown_fields)]
        struct Release {
            object: String,
        }
        #[derive(Deserialize)]
        #[serde(deny_unknown_fields)]
        struct Channel {
            channel: String,
        }
        #[derive(Deserialize)]
        #[serde(deny_unknown_fields)]
        struct Move {
            to: [f64; 2],
            speed: f64,
        }
        #[derive(Deserialize)]
        #[serde(deny_unknown_fields)]
        struct Jump {
            to: [f64; 2],
        }
        fn args<'a, T: Deserialize<'a>>(
            op: &str,
            raw: &'a Option<Box<RawValue>>,
        ) -> Result<T, (ErrorCode, String)> {
            let text = raw.as_deref().map(RawValue::get).unwrap_or("{}");
            if !text.starts_with('{') {
                // Reject arrays, which serde would read as positional fields.
                return Err((
                    ErrorCode::InvalidArgs,
                    format!("invalid args for {op}: args must be a JSON object"),
                ));
            }
            // The path names the arg at fault (`ttl_ms: invalid value: ...`).
            let de = &mut serde_json::Deserializer::from_str(text);
            serde_path_to_error::deserialize(de).map_err(|e| {
                (
                    ErrorCode::InvalidArgs,
                    format!("invalid args for {op}: {e}"),
                )
            })
        }
        let a = &self.args;
        let op = self.op.as_str();
        Ok(match op {
            "entity.create" => {
                let c: Create = args(op, a)?;
                Op::EntityCreate {
                    kind: c.kind,
                    data: c.data,
                }
            }
            "entity.set" => {
                let s: Set = args(op, a)?;
                Op::EntitySet {
                    id: s.id,
                    data: s.data,
                    version: s.version,
                }
            }
            "entity.patch" => {
                let p: Patch = args(op, a)?;
                Op::EntityPatch {
                    id: p.id,
                    data: p.data,
                    version: p.version,
                }
            }
            "entity.delete" => {
                let d: Delete = args(op, a)?;
                Op::EntityDelete {
                    id: d.id,
                    version: d.version,
                }
            }
            "lock.acquire" => {
                let l: Lock = args(op, a)?;
                Op::LockAcquire {
                    object: l.object,
                    ttl_ms: l.ttl_ms,
                }
            }
            "lock.renew" => {
                let l: Lock = args(op, a)?;
                Op::LockRenew {
                    object: l.object,
                    ttl_ms: l.ttl_ms,
                }
            }
            "lock.release" => {
                let r: Release = args(op, a)?;
                Op::LockRelease { object: r.object }
            }
            "channel.subscribe" => {
                let c: Channel = args(op, a)?;
                Op::ChannelSubscribe { channel: c.channel }
            }
            "channel.unsubscribe" => {
                let c: Channel = args(op, a)?;
                Op::ChannelUnsubscribe { channel: c.channel }
            }
            "space.move" => {
                let m: Move = args(op, a)?;
                Op::SpaceMove {
                    to: m.to,
                    speed: m.speed,
                }
            }
            "space.jump" => {
                let j: Jump = args(op, a)?;
                Op::SpaceJump { to: j.to }
            }
            "policy.update" => Op::PolicyUpdate(args(op, a)?),
            "policy.clear" => {
                #[derive(Deserialize)]
                #[serde(deny_unknown_fields)]
                struct Nothing {}
                let Nothing {} = args(op, a)?;
                Op::PolicyClear
            }
            other => {
                return Err((ErrorCode::UnknownOp, format!("unknown op {other:?}")));
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn publish_defaults_to_main_channel_and_keeps_raw_data() {
        let f = decode(br#"{"type":"publish","room":"r","event":"chat","data":{"a": [1, 2]}}"#)
            .unwrap();
        let ClientFrame::Publish(p) = f else {
            panic!("not a publish")
        };
        assert_eq!(p.channel, "main");
        assert_eq!(p.data.unwrap().get(), r#"{"a": [1, 2]}"#);
        assert!(!p.echo);
    }

    #[test]
    fn unknown_frame_fields_are_ignored_but_wrong_types_are_not() {
        assert!(decode(br#"{"type":"leave","room":"r","extra":1}"#).is_ok());
        let e = decode(br#"{"type":"leave","room":5}"#).unwrap_err();
        assert_eq!(e.code, ErrorCode::InvalidFrame);
        assert_eq!(e.frame_type.as_deref(), Some("leave"));
    }

    #[test]
    fn missing_type_and_non_objects() {
        assert_eq!(
            decode(br#"{"room":"r"}"#).unwrap_err().code,
            ErrorCode::UnknownType
        );
        assert_eq!(decode(b"[1,2]").unwrap_err().code, ErrorCode::BadJson);
        assert_eq!(decode(b"").unwrap_err().code, ErrorCode::BadJson);
        assert_eq!(
            decode(br#"{"type":7}"#).unwrap_err().code,
            ErrorCode::BadJson
        );
        // arrays are not frames, even when serde could read them positionally
        assert_eq!(
            decode(br#"["leave"]"#).unwrap_err().code,
            ErrorCode::BadJson
        );
        assert_eq!(decode(br#"["join"]"#).unwrap_err().code, ErrorCode::BadJson);
        assert!(decode(b" \r\n\t{\"type\":\"ping\"} ").is_ok());
    }

    #[test]
    fn request_ops_decode_and_reject_bad_args() {
        let f = decode(
            br#"{"type":"request","room":"r","nonce":7,"op":"lock.acquire","args":{"object":"e1","ttl_ms":500}}"#,
        )
        .unwrap();
        let ClientFrame::Request(r) = f else { panic!() };
        assert_eq!(r.nonce.get(), "7");
        assert_eq!(
            r.op().unwrap(),
            Op::LockAcquire {
                object: "e1".into(),
                ttl_ms: Some(500)
            }
        );

        let f = decode(br#"{"type":"request","room":"r","nonce":"n","op":"entity.set","args":{}}"#)
            .unwrap();
        let ClientFrame::Request(r) = f else { panic!() };
        assert_eq!(r.op().unwrap_err().0, ErrorCode::InvalidArgs);

        let f = decode(br#"{"type":"request","room":"r","nonce":"n","op":"fly"}"#).unwrap();
        let ClientFrame::Request(r) = f else { panic!() };
        assert_eq!(r.op().unwrap_err().0, ErrorCode::UnknownOp);

        let f = decode(
            br#"{"type":"request","room":"r","nonce":1,"op":"entity.set","args":["e1",{"x":1}]}"#,
        )
        .unwrap();
        let ClientFrame::Request(r) = f else { panic!() };
        assert_eq!(r.op().unwrap_err().0, ErrorCode::InvalidArgs);

        let f =
            decode(br#"{"type":"request","room":"r","nonce":1,"op":"lock.release","args":null}"#)
                .unwrap();
        let ClientFrame::Request(r) = f else { panic!() };
        assert_eq!(r.op().unwrap_err().0, ErrorCode::InvalidArgs);

        let e = decode(br#"{"type":"request","room":"r","nonce":{},"op":"fly"}"#).unwrap_err();
        assert_eq!(e.code, ErrorCode::InvalidFrame);
    }

    /// `lock.acquire`'s op decoded from `args`.
    fn lock_op(args: &str) -> Result<Op, (ErrorCode, String)> {
        let frame = format!(
            r#"{{"type":"request","room":"r","nonce":1,"op":"lock.acquire","args":{args}}}"#
        );
        let ClientFrame::Request(r) = decode(frame.as_bytes()).unwrap() else {
            panic!()
        };
        r.op()
    }

    #[test]
    fn a_number_out_of_its_type_is_invalid_args_naming_the_arg() {
        for ttl in ["-1", "1.5", "1e400", "18446744073709551616", "\"5\""] {
            let (code, message) =
                lock_op(&format!(r#"{{"object":"e1","ttl_ms":{ttl}}}"#)).unwrap_err();
            assert_eq!(code, ErrorCode::InvalidArgs, "{ttl}");
            assert!(
                message.starts_with("invalid args for lock.acquire: ttl_ms: "),
                "{ttl}: {message}"
            );
        }
        // The type's edge decodes (the room cuts it to its longest lease).
        assert_eq!(
            lock_op(r#"{"object":"e1","ttl_ms":18446744073709551615}"#).unwrap(),
            Op::LockAcquire {
                object: "e1".into(),
                ttl_ms: Some(u64::MAX)
            }
        );
    }
}
