//! A room's events as webhooks: which of them the application's backend can
//! be told of, and with what payload.

use plaza_core::HistoryEntry;
use serde_json::{Map, Value};

use crate::webhooks::{WebhookEvent, WebhookKind};

/// The webhook type of an event frame's `kind`, if it has one.
fn kind_of(kind: &str) -> Option<WebhookKind> {
    Some(match kind {
        "presence.join" => WebhookKind::MemberJoined,
        "presence.leave" => WebhookKind::MemberLeft,
        "message" => WebhookKind::MessagePublished,
        "entity.created" => WebhookKind::EntityCreated,
        "entity.updated" => WebhookKind::EntityUpdated,
        "entity.deleted" => WebhookKind::EntityDeleted,
        "lock.acquired" => WebhookKind::LockAcquired,
        "lock.released" => WebhookKind::LockReleased,
        _ => return None,
    })
}

/// The webhook of a room event, id `{room}:{epoch}:{seq}`: the frame's own
/// fields but `type`, `room`, `ts` and `kind` (a joining member's fields
/// flattened). `None` for events no webhook tells of (spatial ones, and
/// events for some members only).
pub(crate) fn webhook_event(
    room: &str,
    epoch: u64,
    entry: &HistoryEntry,
    wants: impl Fn(WebhookKind, Option<&str>) -> bool,
) -> Option<WebhookEvent> {
    if !entry.scope.is_all() {
        return None;
    }
    let Ok(Value::Object(mut frame)) = serde_json::from_slice::<Value>(&entry.frame) else {
        return None;
    };
    let kind = kind_of(frame.get("kind")?.as_str()?)?;
    let channel = match kind {
        WebhookKind::MessagePublished => Some(
            entry
                .channel
                .clone()
                .unwrap_or_else(|| plaza_protocol::DEFAULT_CHANNEL.to_owned()),
        ),
        _ => None,
    };
    if !wants(kind, channel.as_deref()) {
        return None;
    }
    for field in ["type", "room", "ts", "kind", "channel"] {
        frame.remove(field);
    }
    if let Some(Value::Object(member)) = frame.remove("member") {
        frame.extend(member);
    }
    Some(WebhookEvent {
        id: format!("{room}:{epoch}:{}", entry.seq),
        kind,
        room: room.to_owned(),
        channel,
        timestamp_ms: entry.ts,
        data: Value::Object(Map::from_iter(frame)),
    })
}
