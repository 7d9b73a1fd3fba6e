//! What a member wants at once: predicates on a message's channel, event,
//! topic, sender, or on a field of its payload addressed by a JSON pointer.

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// The parts of a message a filter looks at.
#[derive(Debug, Clone, Copy, Default)]
pub struct MessageView<'a> {
    /// Its channel.
    pub channel: Option<&'a str>,
    /// Its application event name.
    pub event: Option<&'a str>,
    /// Its topic.
    pub topic: Option<&'a str>,
    /// The session that sent it.
    pub sender: Option<&'a str>,
    /// Its payload, parsed (only when a filter looks into it).
    pub payload: Option<&'a Value>,
}

/// Which part of a message a filter tests.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Field {
    /// The channel.
    Channel,
    /// The application event name.
    Event,
    /// The topic.
    Topic,
    /// The sender's session id.
    Sender,
    /// A field of the payload, addressed by a JSON pointer (RFC 6901), e.g. `/priority`.
    Payload(String),
}

/// How a filter tests its field.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MatchOp {
    /// The field equals this value.
    Equals(Value),
    /// The field equals one of these values.
    In(Vec<Value>),
    /// The field is present.
    Exists,
}

/// A message's field as found, borrowed.
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

/// One filter of a delivery policy: a message that matches any enabled
/// filter is delivered at once.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Filter {
    /// The member's name for it (to switch it off or remove it).
    pub id: String,
    /// Whether it is in force.
    #[serde(default = "enabled")]
    pub enabled: bool,
    /// What it tests.
    pub field: Field,
    /// How.
    pub op: MatchOp,
}

fn enabled() -> bool {
    true
}

/// At most this many values in an `in` test.
pub const MAX_IN_VALUES: usize = 64;

impl Filter {
    /// Whether `m` matches (a disabled filter matches nothing).
    pub fn matches(&self, m: &MessageView<'_>) -> bool {
        if !self.enabled {
            return false;
        }
        // Runs per recipient once wired in: compared in place, nothing cloned.
        let value = match &self.field {
            Field::Channel => m.channel.map(FieldValue::Text),
            Field::Event => m.event.map(FieldValue::Text),
            Field::Topic => m.topic.map(FieldValue::Text),
            Field::Sender => m.sender.map(FieldValue::Text),
            Field::Payload(pointer) => m
                .payload
                .and_then(|p| p.pointer(pointer))
                .map(FieldValue::Json),
        };
        match (&self.op, value) {
            (MatchOp::Exists, v) => v.is_some(),
            (MatchOp::Equals(want), Some(v)) => v.equals(want),
            (MatchOp::In(wants), Some(v)) => wants.iter().any(|w| v.equals(w)),
            (_, None) => false,
        }
    }

    /// Whether it looks into payloads (which must then be parsed).
    pub fn reads_payload(&self) -> bool {
        matches!(self.field, Field::Payload(_))
    }

    /// Checks it; the error names the field at fault.
    pub fn validate(&self) -> Result<(), String> {
        if self.id.is_empty() || self.id.len() > 64 {
            return Err(format!(
                "filter id must have 1 to 64 bytes, not {:?}",
                self.id
            ));
        }
        if let Field::Payload(pointer) = &self.field {
            if !(pointer.is_empty() || pointer.starts_with('/')) || pointer.len() > 256 {
                return Err(format!(
                    "filter {:?}: field.payload must be a JSON pointer (\"\" or starting with \"/\", at most 256 bytes), not {pointer:?}",
                    self.id
                ));
            }
        }
        if let MatchOp::In(values) = &self.op {
            if values.is_empty() || values.len() > MAX_IN_VALUES {
                return Err(format!(
                    "filter {:?}: op.in must hold 1 to {MAX_IN_VALUES} values",
                    self.id
                ));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn filter(field: Field, op: MatchOp) -> Filter {
        Filter {
            id: "f".into(),
            enabled: true,
            field,
            op,
        }
    }

    #[test]
    fn filters_test_their_field() {
        let payload = json!({"priority": "high", "to": ["ann"]});
        let m = MessageView {
            channel: Some("chat"),
            event: Some("say"),
            topic: Some("xmpp"),
            sender: Some("s1"),
            payload: Some(&payload),
        };
        assert!(filter(Field::Topic, MatchOp::Equals(json!("xmpp"))).matches(&m));
        assert!(!filter(Field::Topic, MatchOp::Equals(json!("irc"))).matches(&m));
        assert!(filter(Field::Channel, MatchOp::In(vec![json!("a"), json!("chat")])).matches(&m));
        assert!(filter(
            Field::Payload("/priority".into()),
            MatchOp::Equals(json!("high"))
        )
        .matches(&m));
        assert!(filter(Field::Payload("/to/0".into()), MatchOp::Exists).matches(&m));
        assert!(filter(
            Field::Payload("/to".into()),
            MatchOp::In(vec![json!("ann"), json!(["ann"])])
        )
        .matches(&m));
        // A text field equals text only.
        assert!(!filter(Field::Topic, MatchOp::Equals(json!(["xmpp"]))).matches(&m));
        assert!(!filter(Field::Payload("/to/1".into()), MatchOp::Exists).matches(&m));
        assert!(!filter(Field::Topic, MatchOp::Exists).matches(&MessageView::default()));
        let mut off = filter(Field::Sender, MatchOp::Exists);
        off.enabled = false;
        assert!(!off.matches(&m));
    }

    #[test]
    fn bad_filters_name_their_fault() {
        assert!(filter(Field::Payload("priority".into()), MatchOp::Exists)
            .validate()
            .unwrap_err()
            .contains("JSON pointer"));
        assert!(filter(Field::Topic, MatchOp::In(vec![]))
            .validate()
            .unwrap_err()
            .contains("op.in"));
        let mut long = filter(Field::Topic, MatchOp::Exists);
        long.id = "x".repeat(65);
        assert!(long.validate().unwrap_err().contains("filter id"));
        // The wire form.
        let f: Filter = serde_json::from_value(
            json!({"id": "xmpp", "field": "topic", "op": {"equals": "xmpp"}}),
        )
        .unwrap();
        assert!(f.enabled);
        let p: Filter = serde_json::from_value(
            json!({"id": "p", "field": {"payload": "/priority"}, "op": "exists"}),
        )
        .unwrap();
        assert!(p.reads_payload());
        assert!(serde_json::from_value::<Filter>(
            json!({"id": "x", "field": "topic", "op": {"near": 1}})
        )
        .is_err());
    }
}
