//! What a webhook carries: the event types, the event a caller emits, and
//! the JSON body POSTed for it.

use bytes::Bytes;
use serde_json::{Map, Value};

/// The type of a webhook event; [`WebhookKind::as_str`] is its stable name
/// (the body's `type`, and the strings of a target's `events`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum WebhookKind {
    /// `room.created`
    RoomCreated,
    /// `room.deleted`
    RoomDeleted,
    /// `member.joined`
    MemberJoined,
    /// `member.left`
    MemberLeft,
    /// `message.published`
    MessagePublished,
    /// `entity.created`
    EntityCreated,
    /// `entity.updated`
    EntityUpdated,
    /// `entity.deleted`
    EntityDeleted,
    /// `lock.acquired`
    LockAcquired,
    /// `lock.released`
    LockReleased,
}

impl WebhookKind {
    /// Every type, in the order of the documentation.
    pub const ALL: [WebhookKind; 10] = [
        WebhookKind::RoomCreated,
        WebhookKind::RoomDeleted,
        WebhookKind::MemberJoined,
        WebhookKind::MemberLeft,
        WebhookKind::MessagePublished,
        WebhookKind::EntityCreated,
        WebhookKind::EntityUpdated,
        WebhookKind::EntityDeleted,
        WebhookKind::LockAcquired,
        WebhookKind::LockReleased,
    ];

    /// The stable name, e.g. `member.joined`.
    pub fn as_str(self) -> &'static str {
        match self {
            WebhookKind::RoomCreated => "room.created",
            WebhookKind::RoomDeleted => "room.deleted",
            WebhookKind::MemberJoined => "member.joined",
            WebhookKind::MemberLeft => "member.left",
            WebhookKind::MessagePublished => "message.published",
            WebhookKind::EntityCreated => "entity.created",
            WebhookKind::EntityUpdated => "entity.updated",
            WebhookKind::EntityDeleted => "entity.deleted",
            WebhookKind::LockAcquired => "lock.acquired",
            WebhookKind::LockReleased => "lock.released",
        }
    }

    /// The type named `name`, if any.
    pub fn parse(name: &str) -> Option<WebhookKind> {
        WebhookKind::ALL.into_iter().find(|k| k.as_str() == name)
    }

    /// This type's bit in a set of types.
    pub(crate) fn bit(self) -> u16 {
        1 << (self as u16)
    }
}

impl std::fmt::Display for WebhookKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One event for the webhook targets that want it.
#[derive(Debug, Clone, PartialEq)]
pub struct WebhookEvent {
    /// Stable across retries and targets (the `webhook-id` header), given by
    /// the caller: e.g. `{room}:{epoch}:{seq}`. Receivers deduplicate on it.
    pub id: String,
    /// The type.
    pub kind: WebhookKind,
    /// The room it happened in.
    pub room: String,
    /// The channel (`message.published` only).
    pub channel: Option<String>,
    /// When it happened, Unix milliseconds.
    pub timestamp_ms: u64,
    /// The payload: a JSON object, to which the body adds `room` (and
    /// `channel`). Anything else goes under `value`; `null` is `{}`.
    pub data: serde_json::Value,
}

impl WebhookEvent {
    /// The body POSTed for this event:
    /// `{"type", "timestamp" (RFC 3339, UTC, milliseconds), "data"}`.
    pub(crate) fn body(&self) -> Bytes {
        let mut data = match &self.data {
            Value::Object(m) => m.clone(),
            Value::Null => Map::new(),
            other => Map::from_iter([("value".to_owned(), other.clone())]),
        };
        data.insert("room".into(), Value::String(self.room.clone()));
        if let Some(c) = &self.channel {
            data.insert("channel".into(), Value::String(c.clone()));
        }
        let mut body = Map::new();
        body.insert("type".into(), self.kind.as_str().into());
        body.insert("timestamp".into(), rfc3339_millis(self.timestamp_ms).into());
        body.insert("data".into(), Value::Object(data));
        Bytes::from(serde_json::to_vec(&Value::Object(body)).expect("JSON values serialize"))
    }
}

/// Unix milliseconds as RFC 3339 in UTC with milliseconds:
/// `2023-11-14T22:13:20.123Z`.
pub(crate) fn rfc3339_millis(ms: u64) -> String {
    let secs = ms / 1000;
    let (days, in_day) = (secs / 86_400, secs % 86_400);
    let (y, m, d) = civil_from_days(days);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}.{:03}Z",
        in_day / 3600,
        in_day / 60 % 60,
        in_day % 60,
        ms % 1000
    )
}

/// The proleptic Gregorian date `days` after 1970-01-01 (H. Hinnant's
/// `civil_from_days`, for days from the epoch on).
fn civil_from_days(days: u64) -> (u64, u64, u64) {
    let z = days + 719_468;
    let era = z / 146_097;
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + u64::from(m <= 2);
    (y, m, d)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn kinds_have_stable_distinct_names() {
        for k in WebhookKind::ALL {
            assert_eq!(WebhookKind::parse(k.as_str()), Some(k));
        }
        let bits: u16 = WebhookKind::ALL.iter().map(|k| k.bit()).sum();
        assert_eq!(bits, (1 << 10) - 1);
        assert_eq!(
            WebhookKind::parse("member.joined"),
            Some(WebhookKind::MemberJoined)
        );
        assert_eq!(WebhookKind::parse("member.*"), None);
    }

    #[test]
    fn timestamps_are_rfc3339_utc_with_millis() {
        assert_eq!(rfc3339_millis(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(
            rfc3339_millis(1_700_000_000_123),
            "2023-11-14T22:13:20.123Z"
        );
        // A leap day, the last millisecond of a year, a century not leap.
        assert_eq!(rfc3339_millis(951_782_400_000), "2000-02-29T00:00:00.000Z");
        assert_eq!(
            rfc3339_millis(1_704_067_199_999),
            "2023-12-31T23:59:59.999Z"
        );
        assert_eq!(
            rfc3339_millis(4_107_542_400_000),
            "2100-03-01T00:00:00.000Z"
        );
    }

    #[test]
    fn the_body_adds_room_and_channel_to_the_data() {
        let ev = WebhookEvent {
            id: "r:1:2".into(),
            kind: WebhookKind::MessagePublished,
            room: "r".into(),
            channel: Some("chat".into()),
            timestamp_ms: 1_700_000_000_123,
            data: json!({"text": "hi", "room": "spoofed"}),
        };
        let body: Value = serde_json::from_slice(&ev.body()).unwrap();
        assert_eq!(
            body,
            json!({
                "type": "message.published",
                "timestamp": "2023-11-14T22:13:20.123Z",
                "data": {"text": "hi", "room": "r", "channel": "chat"},
            })
        );
        let bare = WebhookEvent {
            kind: WebhookKind::RoomDeleted,
            channel: None,
            data: Value::Null,
            ..ev.clone()
        };
        let body: Value = serde_json::from_slice(&bare.body()).unwrap();
        assert_eq!(body["data"], json!({"room": "r"}));
        let scalar = WebhookEvent {
            data: json!(7),
            ..bare
        };
        let body: Value = serde_json::from_slice(&scalar.body()).unwrap();
        assert_eq!(body["data"], json!({"room": "r", "value": 7}));
    }
}
