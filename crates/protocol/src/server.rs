//! Frames the server sends to clients, and their encoder.
//!
//! A frame is encoded once into [`Bytes`]; the same buffer then goes to every
//! recipient (and stays in the room history for resume).

use bytes::Bytes;
use serde::Serialize;
use serde_json::value::RawValue;

use crate::ErrorCode;

/// A member of a room as others see it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct MemberInfo {
    /// Session id, the address for `direct` messages.
    pub session: String,
    /// Display name.
    pub name: String,
    /// Platform, e.g. `browser` or `xr`.
    pub platform: String,
    /// The user id its token vouched for (the same on every device and
    /// session of that user); absent for members without a token.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
}

/// One entity of the room state.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct EntityInfo {
    /// Server-assigned id, unique in the room.
    pub id: String,
    /// Application-defined kind.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    /// Current data.
    pub data: serde_json::Value,
    /// Starts at 1, grows by one with every change.
    pub version: u64,
}

/// A lock lease.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct LockInfo {
    /// The locked object's key.
    pub object: String,
    /// Holder's session id.
    pub owner: String,
    /// Fencing token: grows with every grant in the room, never reused.
    pub token: u64,
    /// When the lease ends unless renewed, in Unix milliseconds.
    pub expires_at: u64,
}

/// The room state handed to a joining member.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Snapshot {
    /// Every entity, ordered by id.
    pub entities: Vec<EntityInfo>,
    /// Every live lock, ordered by object.
    pub locks: Vec<LockInfo>,
}

/// Why a member left the room.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum LeaveReason {
    /// It sent `leave`.
    Left,
    /// Its connection dropped; it may still resume.
    Disconnected,
    /// Its resume window passed without a resume.
    Expired,
    /// The room was deleted.
    RoomClosed,
    /// An admin removed it (`POST /v1/rooms/{id}/members/{session}/kick`).
    Kicked,
}

/// Why a lock ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum UnlockReason {
    /// The holder released it.
    Released,
    /// The lease ran out.
    Expired,
    /// The holder's connection dropped or it left.
    Disconnected,
}

/// Why a resume did not continue the stream and a fresh snapshot follows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ResyncReason {
    /// The history no longer reaches back to `last_seq`.
    HistoryTruncated,
    /// The resume token is unknown or its window passed; a new session was started.
    SessionExpired,
    /// `last_seq` is ahead of the room (the room was recreated).
    EpochChanged,
}

fn is_default_channel(channel: &str) -> bool {
    channel == crate::DEFAULT_CHANNEL
}

/// The room-specific part of an event.
#[derive(Debug, Clone, Serialize)]
#[serde(tag = "kind")]
pub enum EventBody {
    /// A published message.
    #[serde(rename = "message")]
    Message {
        /// Channel it was published on; not sent when it is
        /// [`DEFAULT_CHANNEL`](crate::DEFAULT_CHANNEL), the channel of most
        /// messages (17 bytes of every delivery).
        #[serde(skip_serializing_if = "is_default_channel")]
        channel: String,
        /// Application event name.
        event: String,
        /// Payload, relayed untouched.
        #[serde(skip_serializing_if = "Option::is_none")]
        data: Option<Box<RawValue>>,
        /// Topic, if the sender gave one.
        #[serde(skip_serializing_if = "Option::is_none")]
        topic: Option<String>,
        /// The seq this message answers.
        #[serde(skip_serializing_if = "Option::is_none")]
        reply_to: Option<u64>,
        /// The sender's client message id.
        #[serde(skip_serializing_if = "Option::is_none")]
        id: Option<String>,
    },
    /// A member joined (or resumed).
    #[serde(rename = "presence.join")]
    PresenceJoin {
        /// Who.
        member: MemberInfo,
    },
    /// A member left.
    #[serde(rename = "presence.leave")]
    PresenceLeave {
        /// Who.
        session: String,
        /// Why.
        reason: LeaveReason,
    },
    /// An entity was created.
    #[serde(rename = "entity.created")]
    EntityCreated {
        /// The new entity.
        entity: EntityInfo,
    },
    /// An entity was set or patched.
    #[serde(rename = "entity.updated")]
    EntityUpdated {
        /// The entity after the change.
        entity: EntityInfo,
    },
    /// An entity was deleted.
    #[serde(rename = "entity.deleted")]
    EntityDeleted {
        /// Its id.
        id: String,
        /// The version it had when deleted.
        version: u64,
    },
    /// A lock was granted (or renewed).
    #[serde(rename = "lock.acquired")]
    LockAcquired {
        /// The lease.
        lock: LockInfo,
    },
    /// A lock ended.
    #[serde(rename = "lock.released")]
    LockReleased {
        /// The object.
        object: String,
        /// The holder.
        owner: String,
        /// The lease's fencing token.
        token: u64,
        /// Why it ended.
        reason: UnlockReason,
    },
    /// A member of a spatial room started a movement (told to the members
    /// whose area of interest holds it).
    #[serde(rename = "space.moved")]
    SpaceMoved {
        /// The member.
        session: String,
        /// `{from: [x, y], to: [x, y], t0, speed}`.
        movement: serde_json::Value,
    },
    /// `a` and `b` now see each other (told to both), with both movements.
    #[serde(rename = "interest.enter")]
    InterestEnter {
        /// The member with the smaller session id.
        a: String,
        /// The other.
        b: String,
        /// Both members' movements, by session id.
        movements: serde_json::Value,
    },
    /// `a` and `b` no longer see each other (told to both).
    #[serde(rename = "interest.leave")]
    InterestLeave {
        /// The member with the smaller session id.
        a: String,
        /// The other.
        b: String,
    },
    /// `a` and `b` came into proximity (told to both): `initiator` starts the call.
    #[serde(rename = "proximity.enter")]
    ProximityEnter {
        /// The pair's id, the same for both.
        pair: u64,
        /// The member with the smaller session id.
        a: String,
        /// The other.
        b: String,
        /// Who starts the call: `a`.
        initiator: String,
    },
    /// The pair left proximity, or one of its members left (told to both).
    #[serde(rename = "proximity.leave")]
    ProximityLeave {
        /// The pair's id.
        pair: u64,
        /// The member with the smaller session id.
        a: String,
        /// The other.
        b: String,
    },
}

/// A room event: sequenced, kept in history, delivered in order.
#[derive(Debug, Clone, Serialize)]
pub struct Event {
    /// Room id.
    pub room: String,
    /// Position in the room's total order, gap-free from 1.
    pub seq: u64,
    /// Server time the event was ordered, Unix milliseconds.
    pub ts: u64,
    /// Session that caused it, if a member did.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub from: Option<String>,
    /// What happened.
    #[serde(flatten)]
    pub body: EventBody,
}

/// The body of a `joined` or `resync` frame.
#[derive(Debug, Clone, Serialize)]
pub struct Joined {
    /// Room id.
    pub room: String,
    /// This member's session id.
    pub session: String,
    /// Secret token to resume this session after a reconnect.
    pub resume_token: String,
    /// Identifies this incarnation of the room; changes if it is recreated.
    pub epoch: u64,
    /// The room's current seq: the snapshot includes every event up to it.
    pub seq: u64,
    /// Connected members, this one included.
    pub members: Vec<MemberInfo>,
    /// Room state at `seq` (absent on a successful resume: missed events follow instead).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub snapshot: Option<Snapshot>,
    /// This member's channels.
    pub channels: Vec<String>,
    /// True when an earlier session continues and the missed events follow.
    pub resumed: bool,
    /// Only on `resync`: why the stream could not simply continue.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<ResyncReason>,
    /// Spatial rooms only: the plane, every member's movement, and the pairs
    /// in proximity this member is in.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub space: Option<serde_json::Value>,
    /// Only when the join asked for `history`: the past messages it named.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub history: Option<JoinHistory>,
    /// Only on a connection with compact messages: how they name this room
    /// and count its time ([`crate::compact`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub compact: Option<crate::compact::CompactKey>,
}

/// Past messages in a `joined` frame, as the join's `history` asked.
#[derive(Debug, Clone, Serialize)]
pub struct JoinHistory {
    /// Whole `event` frames as they were sent live, oldest first.
    pub events: Vec<Box<serde_json::value::RawValue>>,
    /// False when the room's history no longer reaches back as far as asked:
    /// older messages that would have qualified are gone.
    pub complete: bool,
}

/// Where an error frame points back to.
#[derive(Debug, Clone, Default, Serialize)]
pub struct ErrorRef {
    /// The `type` of the frame that caused the error.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub frame: Option<String>,
    /// Its room.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub room: Option<String>,
    /// Its client message id (publish).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
}

/// An error's code and message, as inside `error` and failed `response` frames.
#[derive(Debug, Clone, Serialize)]
pub struct ErrorBody {
    /// Stable code.
    pub code: ErrorCode,
    /// Human-readable explanation.
    pub message: String,
}

/// Why a `closed` frame ended a member's presence on a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ClosedReason {
    /// The room was deleted; the session is gone.
    RoomDeleted,
    /// Another connection resumed the session; it continues there.
    ResumedElsewhere,
    /// An admin removed the member; the session is gone.
    Kicked,
}

/// A request's outcome: on the wire `"ok": true, "result": …` or
/// `"ok": false, "error": {…}`, never both.
#[derive(Debug, Clone)]
pub enum Outcome {
    /// It succeeded with this result.
    Ok(serde_json::Value),
    /// It was refused.
    Err(ErrorBody),
}

impl Serialize for Outcome {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeStruct;
        let mut st = s.serialize_struct("Outcome", 2)?;
        match self {
            Outcome::Ok(result) => {
                st.serialize_field("ok", &true)?;
                st.serialize_field("result", result)?;
            }
            Outcome::Err(error) => {
                st.serialize_field("ok", &false)?;
                st.serialize_field("error", error)?;
            }
        }
        st.end()
    }
}

/// Every frame the server sends.
#[derive(Debug, Clone, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ServerFrame {
    /// Answer to `join`.
    Joined(Joined),
    /// Answer to a `join` with `resume` that could not continue the stream.
    Resync(Joined),
    /// Answer to `leave`.
    Left {
        /// Room id.
        room: String,
    },
    /// The member is out of the room on this connection.
    Closed {
        /// Room id.
        room: String,
        /// Why.
        reason: ClosedReason,
        /// The admin's words, for a kick that gave some.
        #[serde(skip_serializing_if = "Option::is_none")]
        message: Option<String>,
    },
    /// Acknowledges a `publish`: it is ordered and stored.
    Ack {
        /// Room id.
        room: String,
        /// The message's seq.
        seq: u64,
        /// The client message id, if given.
        #[serde(skip_serializing_if = "Option::is_none")]
        id: Option<String>,
        /// True when this id was already published: not delivered again.
        #[serde(skip_serializing_if = "std::ops::Not::not")]
        duplicate: bool,
    },
    /// Answer to `request`, exactly one per nonce.
    Response {
        /// Room id.
        room: String,
        /// The request's nonce.
        nonce: Box<RawValue>,
        /// `ok` and its `result` or `error`.
        #[serde(flatten)]
        outcome: Outcome,
    },
    /// A sequenced room event.
    Event(Event),
    /// Events a delivery policy held, flushed together in seq order; each is
    /// a whole `event` frame with its own seq and ts.
    Batch {
        /// Room id.
        room: String,
        /// The events, oldest first: each a [`ServerFrame::Event`].
        events: Vec<ServerFrame>,
    },
    /// A message from one session to this one.
    Direct {
        /// Room id.
        room: String,
        /// Sender's session id.
        from: String,
        /// Application event name.
        event: String,
        /// Payload, relayed untouched.
        #[serde(skip_serializing_if = "Option::is_none")]
        data: Option<Box<RawValue>>,
    },
    /// Something the client sent was refused.
    Error {
        /// Stable code.
        code: ErrorCode,
        /// Human-readable explanation.
        message: String,
        /// The frame it concerns.
        #[serde(rename = "ref", skip_serializing_if = "Option::is_none")]
        reference: Option<ErrorRef>,
    },
    /// Answer to `ping`.
    Pong {
        /// The ping's `ts`.
        #[serde(skip_serializing_if = "Option::is_none")]
        ts: Option<serde_json::Number>,
    },
    /// Answer to `auth` (and to a token given on connect): the identity the
    /// connection now has.
    Authed {
        /// The token's `sub`.
        user: String,
        /// The token's `name`, if it has one.
        #[serde(skip_serializing_if = "Option::is_none")]
        name: Option<String>,
        /// When the token expires (Unix ms): send a fresh one in `auth` before.
        expires_at: u64,
    },
}

impl ServerFrame {
    /// Encodes the frame as JSON text, once.
    pub fn encode(&self) -> Bytes {
        // Serializing these types cannot fail: every map key is a string.
        Bytes::from(serde_json::to_vec(self).expect("server frames always serialize"))
    }
}

/// Encodes a `batch` frame from already encoded `event` frames: the bytes of
/// [`ServerFrame::Batch`] without decoding or encoding any event again (a
/// held event is encoded once, when its room orders it).
pub fn encode_batch<'a>(room: &str, events: impl IntoIterator<Item = &'a [u8]>) -> Bytes {
    let mut out = Vec::with_capacity(64);
    out.extend_from_slice(br#"{"type":"batch","room":"#);
    serde_json::to_writer(&mut out, room).expect("a string always serializes");
    out.extend_from_slice(br#","events":["#);
    for (i, e) in events.into_iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        out.extend_from_slice(e);
    }
    out.extend_from_slice(b"]}");
    Bytes::from(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_batch_from_encoded_events_equals_the_typed_encoding() {
        let ev = |seq| Event {
            room: "r\"1".into(),
            seq,
            ts: 10 + seq,
            from: Some("s".into()),
            body: EventBody::PresenceLeave {
                session: "x".into(),
                reason: LeaveReason::Left,
            },
        };
        let events = vec![ev(3), ev(5)];
        let frames: Vec<Bytes> = events
            .iter()
            .map(|e| ServerFrame::Event(e.clone()).encode())
            .collect();
        let typed = ServerFrame::Batch {
            room: "r\"1".into(),
            events: events.into_iter().map(ServerFrame::Event).collect(),
        }
        .encode();
        assert_eq!(encode_batch("r\"1", frames.iter().map(|f| &f[..])), typed);
    }

    #[test]
    fn event_is_flat_with_type_and_kind() {
        let f = ServerFrame::Event(Event {
            room: "r".into(),
            seq: 3,
            ts: 10,
            from: Some("s1".into()),
            body: EventBody::Message {
                channel: "main".into(),
                event: "chat".into(),
                data: Some(RawValue::from_string("{\"t\":\"hi\"}".into()).unwrap()),
                topic: None,
                reply_to: Some(2),
                id: None,
            },
        });
        assert_eq!(
            std::str::from_utf8(&f.encode()).unwrap(),
            r#"{"type":"event","room":"r","seq":3,"ts":10,"from":"s1","kind":"message","event":"chat","data":{"t":"hi"},"reply_to":2}"#
        );
    }

    #[test]
    fn a_message_names_its_channel_only_when_it_is_not_main() {
        let on = |channel: &str| {
            ServerFrame::Event(Event {
                room: "r".into(),
                seq: 1,
                ts: 1,
                from: None,
                body: EventBody::Message {
                    channel: channel.into(),
                    event: "e".into(),
                    data: None,
                    topic: None,
                    reply_to: None,
                    id: None,
                },
            })
            .encode()
        };
        let xr: serde_json::Value = serde_json::from_slice(&on("xr")).unwrap();
        assert_eq!(xr["channel"], "xr");
        let main: serde_json::Value = serde_json::from_slice(&on("main")).unwrap();
        assert!(main.get("channel").is_none(), "{main}");
        // Not a prefix match: a channel named like main is still named.
        let mainly: serde_json::Value = serde_json::from_slice(&on("main2")).unwrap();
        assert_eq!(mainly["channel"], "main2");
    }

    #[test]
    fn responses_carry_ok_with_either_result_or_error() {
        let nonce = || RawValue::from_string("7".into()).unwrap();
        let ok = ServerFrame::Response {
            room: "r".into(),
            nonce: nonce(),
            outcome: Outcome::Ok(serde_json::json!({"x": 1})),
        };
        assert_eq!(
            std::str::from_utf8(&ok.encode()).unwrap(),
            r#"{"type":"response","room":"r","nonce":7,"ok":true,"result":{"x":1}}"#
        );
        let err = ServerFrame::Response {
            room: "r".into(),
            nonce: nonce(),
            outcome: Outcome::Err(ErrorBody {
                code: ErrorCode::NotFound,
                message: "no".into(),
            }),
        };
        assert_eq!(
            std::str::from_utf8(&err.encode()).unwrap(),
            r#"{"type":"response","room":"r","nonce":7,"ok":false,"error":{"code":"not_found","message":"no"}}"#
        );
        let closed = ServerFrame::Closed {
            room: "r".into(),
            reason: ClosedReason::ResumedElsewhere,
            message: None,
        };
        assert_eq!(
            std::str::from_utf8(&closed.encode()).unwrap(),
            r#"{"type":"closed","room":"r","reason":"resumed_elsewhere"}"#
        );
    }

    #[test]
    fn error_codes_serialize_as_their_wire_names() {
        for code in ErrorCode::ALL {
            assert_eq!(serde_json::to_value(code).unwrap(), code.as_str());
        }
    }
}
