//! What a member wants at once: predicates on an event's kind, channel,
//! event name, topic, sender, or on a field of its payload addressed by a
//! JSON pointer.

use std::cell::OnceCell;

use serde::Deserialize;
use serde_json::Value;

use crate::HistoryEntry;
use plaza_protocol::policy::{Field, Filter, MatchOp};

/// An event as filters see it. What the history entry does not keep apart
/// (kind, event name, payload) is parsed from its frame on first use, once
/// per event whatever the number of members that test it.
#[derive(Debug)]
pub struct EventView<'a> {
    entry: &'a HistoryEntry,
    parsed: OnceCell<Parsed>,
}

#[derive(Debug, Default, Deserialize)]
struct Parsed {
    #[serde(default)]
    kind: Option<String>,
    #[serde(default)]
    event: Option<String>,
    #[serde(default)]
    data: Option<Value>,
}

impl<'a> EventView<'a> {
    /// A view of `entry`.
    pub fn new(entry: &'a HistoryEntry) -> Self {
        EventView {
            entry,
            parsed: OnceCell::new(),
        }
    }

    /// The entry.
    pub fn entry(&self) -> &'a HistoryEntry {
        self.entry
    }

    fn parsed(&self) -> &Parsed {
        // A frame the room encoded always parses; a default (no kind, no
        // payload) would only make filters not match.
        self.parsed
            .get_or_init(|| serde_json::from_slice(&self.entry.frame).unwrap_or_default())
    }

    /// The event kind (`message`, `presence.join`, ...).
    pub fn kind(&self) -> Option<&str> {
        if self.entry.channel.is_some() {
            return Some("message");
        }
        self.parsed().kind.as_deref()
    }

    fn event(&self) -> Option<&str> {
        self.entry.channel.as_ref()?;
        self.parsed().event.as_deref()
    }

    fn payload(&self) -> Option<&Value> {
        self.entry.channel.as_ref()?;
        self.parsed().data.as_ref()
    }
}

/// A field of an event as found, borrowed.
enum FieldValue<'a> {
    Text(&'a str),
    Json(&'a Value),
}

impl FieldValue<'_> {
    fn equals(&self, want: &Value) -> bool {
        match self {
            FieldValue::Text(s) => want.as_str() == Some(*s),
            FieldValue::Json(v) => *v == want,
        }
    }
}

/// Whether `event` matches `filter` (a disabled filter matches nothing).
pub fn matches(filter: &Filter, event: &EventView<'_>) -> bool {
    if !filter.enabled {
        return false;
    }
    let e = event.entry;
    // Runs per recipient: compared in place, nothing cloned.
    let value = match &filter.field {
        Field::Kind => event.kind().map(FieldValue::Text),
        Field::Channel => e.channel.as_deref().map(FieldValue::Text),
        Field::Event => event.event().map(FieldValue::Text),
        Field::Topic => e.topic.as_deref().map(FieldValue::Text),
        Field::Sender => e.from.as_deref().map(FieldValue::Text),
        Field::Payload(pointer) => event
            .payload()
            .and_then(|p| p.pointer(pointer))
            .map(FieldValue::Json),
    };
    match (&filter.op, value) {
        (MatchOp::Exists, v) => v.is_some(),
        (MatchOp::Equals(want), Some(v)) => v.equals(want),
        (MatchOp::In(wants), Some(v)) => wants.iter().any(|w| v.equals(w)),
        (_, None) => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Scope;
    use plaza_protocol::server::{Event, EventBody, LeaveReason, ServerFrame};
    use serde_json::json;

    fn filter(field: Field, op: MatchOp) -> Filter {
        Filter {
            id: "f".into(),
            enabled: true,
            field,
            op,
        }
    }

    fn entry(channel: Option<&str>, body: EventBody) -> HistoryEntry {
        let frame = ServerFrame::Event(Event {
            room: "r".into(),
            seq: 4,
            ts: 9,
            from: Some("s1".into()),
            body,
        })
        .encode();
        HistoryEntry {
            seq: 4,
            ts: 9,
            from: Some("s1".into()),
            channel: channel.map(str::to_owned),
            echo: false,
            replay_to_sender: false,
            topic: channel.map(|_| "xmpp".to_owned()),
            reply_to: None,
            scope: Scope::All,
            frame,
            wire: Default::default(),
        }
    }

    fn message() -> HistoryEntry {
        let data =
            serde_json::value::to_raw_value(&json!({"priority": "high", "to": ["ann"]})).unwrap();
        entry(
            Some("chat"),
            EventBody::Message {
                channel: "chat".into(),
                event: "say".into(),
                data: Some(data),
                topic: Some("xmpp".into()),
                reply_to: None,
                id: None,
            },
        )
    }

    #[test]
    fn filters_test_their_field() {
        let m = message();
        let m = EventView::new(&m);
        assert!(matches(
            &filter(Field::Topic, MatchOp::Equals(json!("xmpp"))),
            &m
        ));
        assert!(!matches(
            &filter(Field::Topic, MatchOp::Equals(json!("irc"))),
            &m
        ));
        assert!(matches(
            &filter(Field::Channel, MatchOp::In(vec![json!("a"), json!("chat")])),
            &m
        ));
        assert!(matches(
            &filter(Field::Event, MatchOp::Equals(json!("say"))),
            &m
        ));
        assert!(matches(
            &filter(Field::Kind, MatchOp::Equals(json!("message"))),
            &m
        ));
        assert!(matches(
            &filter(
                Field::Payload("/priority".into()),
                MatchOp::Equals(json!("high"))
            ),
            &m
        ));
        assert!(matches(
            &filter(Field::Payload("/to/0".into()), MatchOp::Exists),
            &m
        ));
        assert!(matches(
            &filter(
                Field::Payload("/to".into()),
                MatchOp::In(vec![json!("ann"), json!(["ann"])])
            ),
            &m
        ));
        // A text field equals text only.
        assert!(!matches(
            &filter(Field::Topic, MatchOp::Equals(json!(["xmpp"]))),
            &m
        ));
        assert!(!matches(
            &filter(Field::Payload("/to/1".into()), MatchOp::Exists),
            &m
        ));
        let mut off = filter(Field::Sender, MatchOp::Exists);
        assert!(matches(&off, &m));
        off.enabled = false;
        assert!(!matches(&off, &m));
    }

    #[test]
    fn other_events_have_a_kind_and_a_sender_but_no_message_fields() {
        let e = entry(
            None,
            EventBody::PresenceLeave {
                session: "s1".into(),
                reason: LeaveReason::Left,
            },
        );
        let v = EventView::new(&e);
        assert_eq!(v.kind(), Some("presence.leave"));
        assert!(matches(
            &filter(Field::Kind, MatchOp::Equals(json!("presence.leave"))),
            &v
        ));
        assert!(matches(
            &filter(Field::Sender, MatchOp::Equals(json!("s1"))),
            &v
        ));
        for field in [
            Field::Topic,
            Field::Channel,
            Field::Event,
            Field::Payload("".into()),
        ] {
            assert!(!matches(&filter(field, MatchOp::Exists), &v));
        }
    }
}
