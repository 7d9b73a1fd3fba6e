//! Delivery policies on the wire: what a member wants at once and what may
//! wait, as `join.policy` and the `policy.update` request carry them.
//!
//! This module only defines and validates the forms; matching messages and
//! holding them is `plaza-core`'s `policy` module.

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Which part of an event a filter tests.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Field {
    /// The event kind: `message`, `presence.join`, `entity.updated`, ...
    Kind,
    /// A message's channel.
    Channel,
    /// A message's application event name.
    Event,
    /// A message's topic.
    Topic,
    /// The session that caused the event.
    Sender,
    /// A field of a message's payload, addressed by a JSON pointer (RFC 6901),
    /// e.g. `/priority`.
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

/// One filter of a delivery policy: an event that matches any enabled filter
/// is delivered at once.
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

fn aggregate() -> bool {
    true
}

/// At most this many values in an `in` test.
pub const MAX_IN_VALUES: usize = 64;
/// At most this many filters in a policy.
pub const MAX_FILTERS: usize = 32;
/// The longest `max_delay_ms`: five minutes.
pub const MAX_DELAY_MS: u64 = 300_000;
/// The largest `max_held`.
pub const MAX_HELD: u32 = 10_000;

/// A member's delivery policy: events that match a filter go out at once;
/// the others are held until the oldest held one is `max_delay_ms` old or
/// `max_held` are held, then flushed together.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DeliveryPolicy {
    /// Deliver at once what matches any enabled one of these.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub filters: Vec<Filter>,
    /// Time: the longest an event is held.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_delay_ms: Option<u64>,
    /// Volume: the most events held before all are flushed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_held: Option<u32>,
    /// Flush held events as one `batch` frame (default) or as separate
    /// `event` frames sent together.
    #[serde(default = "aggregate")]
    pub aggregate: bool,
}

/// A change to a member's policy: only what it names changes. Applied in
/// field order: `filters` replaces the list, then `add`, `remove`, `enable`,
/// `disable`; `max_delay_ms` and `max_held` set a bound (`null` removes it).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PolicyUpdate {
    /// Replaces every filter.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub filters: Option<Vec<Filter>>,
    /// Adds filters, replacing those with the same id.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub add: Vec<Filter>,
    /// Removes filters by id.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub remove: Vec<String>,
    /// Switches filters on by id.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub enable: Vec<String>,
    /// Switches filters off by id.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub disable: Vec<String>,
    /// Sets (a number) or removes (`null`) the Time bound.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        with = "serde_with_null"
    )]
    pub max_delay_ms: Option<Option<u64>>,
    /// Sets (a number) or removes (`null`) the Volume bound.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        with = "serde_with_null"
    )]
    pub max_held: Option<Option<u32>>,
    /// Sets aggregation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub aggregate: Option<bool>,
}

/// `Option<Option<T>>` with an absent field as `None` and `null` as `Some(None)`.
mod serde_with_null {
    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    pub fn serialize<T: Serialize, S: Serializer>(
        v: &Option<Option<T>>,
        s: S,
    ) -> Result<S::Ok, S::Error> {
        match v {
            Some(inner) => inner.serialize(s),
            None => s.serialize_none(),
        }
    }

    pub fn deserialize<'de, T: Deserialize<'de>, D: Deserializer<'de>>(
        d: D,
    ) -> Result<Option<Option<T>>, D::Error> {
        Option::<T>::deserialize(d).map(Some)
    }
}

impl Filter {
    /// Checks it; the error names the field at fault.
    pub fn validate(&self) -> Result<(), String> {
        self.check(is_json_pointer)
    }

    /// Checks only that a payload pointer is an RFC 6901 pointer (`~` only
    /// as `~0` or `~1`): the part of [`validate`](Self::validate) that
    /// earlier versions did not check. A node checks it where a client's
    /// new filter comes in, before the room (replicated, and lenient about
    /// it, see [`DeliveryPolicy::validate_stored`]) sees it.
    pub fn validate_pointer(&self) -> Result<(), String> {
        match &self.field {
            Field::Payload(pointer) if !is_json_pointer(pointer) => {
                Err(pointer_error(&self.id, pointer))
            }
            _ => Ok(()),
        }
    }

    /// Checks it, `pointer_ok` judging a payload pointer.
    fn check(&self, pointer_ok: fn(&str) -> bool) -> Result<(), String> {
        if self.id.is_empty() || self.id.len() > 64 {
            return Err(format!(
                "filter id must have 1 to 64 bytes, not {:?}",
                self.id
            ));
        }
        if let Field::Payload(pointer) = &self.field {
            if !pointer_ok(pointer) || pointer.len() > 256 {
                return Err(pointer_error(&self.id, pointer));
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

    /// Whether it looks into payloads (which must then be parsed).
    pub fn reads_payload(&self) -> bool {
        matches!(self.field, Field::Payload(_))
    }
}

fn pointer_error(id: &str, pointer: &str) -> String {
    format!(
        "filter {id:?}: field.payload must be a JSON pointer (RFC 6901: \"\" or starting with \"/\", \"~\" only as \"~0\" or \"~1\", at most 256 bytes), not {pointer:?}"
    )
}

/// Whether `p` is a JSON pointer (RFC 6901): empty, or `/`-separated
/// reference tokens in which `~` appears only escaped, as `~0` (`~`) or
/// `~1` (`/`).
pub fn is_json_pointer(p: &str) -> bool {
    if !(p.is_empty() || p.starts_with('/')) {
        return false;
    }
    let mut chars = p.chars();
    while let Some(c) = chars.next() {
        if c == '~' && !matches!(chars.next(), Some('0' | '1')) {
            return false;
        }
    }
    true
}

impl DeliveryPolicy {
    /// Checks it: every filter, unique filter ids, and bounds in range. A
    /// policy must bound holding by time, volume or both: held events must
    /// go out at some point.
    pub fn validate(&self) -> Result<(), String> {
        self.check(is_json_pointer)
    }

    /// Checks a policy as the room does, in the replicated state machine (a
    /// join's record, a snapshot): as [`validate`](Self::validate), except
    /// that a payload pointer need only be `""` or start with `/`, as
    /// earlier versions accepted it (a stray `~` in it matches literally).
    /// Every replica, of this version or an earlier one, must decide a
    /// record alike; new filters get the strict check at the connection,
    /// before their record is written ([`validate_pointers`](Self::validate_pointers),
    /// [`PolicyUpdate::validate_pointers`]).
    pub fn validate_stored(&self) -> Result<(), String> {
        self.check(|p| p.is_empty() || p.starts_with('/'))
    }

    /// Checks only that every payload pointer is an RFC 6901 pointer (see
    /// [`Filter::validate_pointer`]).
    pub fn validate_pointers(&self) -> Result<(), String> {
        self.filters.iter().try_for_each(Filter::validate_pointer)
    }

    fn check(&self, pointer_ok: fn(&str) -> bool) -> Result<(), String> {
        if self.filters.len() > MAX_FILTERS {
            return Err(format!("a policy has at most {MAX_FILTERS} filters"));
        }
        for (i, f) in self.filters.iter().enumerate() {
            f.check(pointer_ok)?;
            if self.filters[..i].iter().any(|g| g.id == f.id) {
                return Err(format!("filter id {:?} is used twice", f.id));
            }
        }
        if self.max_delay_ms.is_none() && self.max_held.is_none() {
            return Err(
                "a policy needs max_delay_ms, max_held or both: held events must go out at some point"
                    .into(),
            );
        }
        if let Some(ms) = self.max_delay_ms {
            if ms == 0 || ms > MAX_DELAY_MS {
                return Err(format!(
                    "max_delay_ms must be 1 to {MAX_DELAY_MS}, not {ms}"
                ));
            }
        }
        if let Some(n) = self.max_held {
            if n == 0 || n > MAX_HELD {
                return Err(format!("max_held must be 1 to {MAX_HELD}, not {n}"));
            }
        }
        Ok(())
    }

    /// Whether a filter looks into payloads.
    pub fn reads_payload(&self) -> bool {
        self.filters.iter().any(|f| f.enabled && f.reads_payload())
    }

    /// The policy after `update`, validated as a room does
    /// ([`validate_stored`](Self::validate_stored): a filter a member holds
    /// from an earlier version does not stop it changing its policy; the
    /// update's own filters are checked strictly before, by
    /// [`PolicyUpdate::validate_pointers`]); `self` is left as it was when
    /// the update is refused. A policy that does not exist yet starts from
    /// no filters, no bounds and aggregation on.
    pub fn updated(
        current: Option<&DeliveryPolicy>,
        update: &PolicyUpdate,
    ) -> Result<Self, String> {
        let mut p = current.cloned().unwrap_or(DeliveryPolicy {
            filters: Vec::new(),
            max_delay_ms: None,
            max_held: None,
            aggregate: true,
        });
        if let Some(filters) = &update.filters {
            p.filters = filters.clone();
        }
        for f in &update.add {
            match p.filters.iter_mut().find(|g| g.id == f.id) {
                Some(g) => *g = f.clone(),
                None => p.filters.push(f.clone()),
            }
        }
        fn find(filters: &[Filter], id: &str) -> Result<usize, String> {
            filters
                .iter()
                .position(|f| f.id == id)
                .ok_or_else(|| format!("no filter {id:?}"))
        }
        let mut removed = Vec::new();
        for id in &update.remove {
            removed.push(find(&p.filters, id)?);
        }
        for id in &update.enable {
            let i = find(&p.filters, id)?;
            p.filters[i].enabled = true;
        }
        for id in &update.disable {
            let i = find(&p.filters, id)?;
            p.filters[i].enabled = false;
        }
        removed.sort_unstable();
        removed.dedup();
        for i in removed.into_iter().rev() {
            p.filters.remove(i);
        }
        if let Some(ms) = update.max_delay_ms {
            p.max_delay_ms = ms;
        }
        if let Some(n) = update.max_held {
            p.max_held = n;
        }
        if let Some(a) = update.aggregate {
            p.aggregate = a;
        }
        p.validate_stored()?;
        Ok(p)
    }
}

impl PolicyUpdate {
    /// Checks only that the filters it brings (`filters`, `add`) have RFC
    /// 6901 payload pointers (see [`Filter::validate_pointer`]); the rest
    /// is checked by [`DeliveryPolicy::updated`].
    pub fn validate_pointers(&self) -> Result<(), String> {
        self.filters
            .iter()
            .flatten()
            .chain(&self.add)
            .try_for_each(Filter::validate_pointer)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn topic(id: &str, t: &str) -> Filter {
        Filter {
            id: id.into(),
            enabled: true,
            field: Field::Topic,
            op: MatchOp::Equals(json!(t)),
        }
    }

    #[test]
    fn bad_filters_and_policies_name_their_fault() {
        let mut f = topic("t", "x");
        f.field = Field::Payload("priority".into());
        assert!(f.validate().unwrap_err().contains("JSON pointer"));
        // RFC 6901: "~" only as "~0" or "~1".
        for bad in ["/a~2b", "/a~", "/~", "/a/~x/b", "/~~0"] {
            f.field = Field::Payload(bad.into());
            assert!(
                f.validate().unwrap_err().contains("JSON pointer"),
                "{bad:?} passed"
            );
        }
        for good in ["", "/", "/a~0b", "/a~1b", "/~01", "/a//b", "/0/x y"] {
            f.field = Field::Payload(good.into());
            assert_eq!(f.validate(), Ok(()), "{good:?} refused");
        }
        // A policy an earlier version stored with such a pointer still loads.
        let mut stored = DeliveryPolicy {
            filters: vec![f.clone()],
            max_delay_ms: None,
            max_held: Some(3),
            aggregate: true,
        };
        stored.filters[0].field = Field::Payload("/a~2b".into());
        assert!(stored.validate().is_err());
        assert_eq!(stored.validate_stored(), Ok(()));
        // Its member may still change it: the room's check is the stored
        // one; only the filters an update brings are checked strictly.
        let bound: PolicyUpdate = serde_json::from_value(json!({"max_held": 10})).unwrap();
        assert_eq!(bound.validate_pointers(), Ok(()));
        let changed = DeliveryPolicy::updated(Some(&stored), &bound).unwrap();
        assert_eq!(changed.max_held, Some(10));
        for update in [
            json!({"add": [{"id": "q", "field": {"payload": "/x~2"}, "op": "exists"}]}),
            json!({"filters": [{"id": "q", "field": {"payload": "/~"}, "op": "exists"}]}),
        ] {
            let u: PolicyUpdate = serde_json::from_value(update).unwrap();
            assert!(u.validate_pointers().unwrap_err().contains("JSON pointer"));
        }
        assert!(stored.validate_pointers().is_err());
        stored.filters[0].field = Field::Payload("a".into());
        assert!(stored.validate_stored().is_err());
        let mut f = topic("t", "x");
        f.op = MatchOp::In(vec![]);
        assert!(f.validate().unwrap_err().contains("op.in"));
        assert!(topic(&"x".repeat(65), "x")
            .validate()
            .unwrap_err()
            .contains("filter id"));
        let p = |v: Value| serde_json::from_value::<DeliveryPolicy>(v);
        assert!(p(
            json!({"filters": [{"id": "x", "field": "topic", "op": {"near": 1}}], "max_held": 3})
        )
        .is_err());
        assert!(p(json!({"max_held": 3, "hold": true})).is_err());
        let unbounded = p(json!({"filters": []})).unwrap();
        assert!(unbounded.validate().unwrap_err().contains("max_delay_ms"));
        let zero = p(json!({"max_delay_ms": 0})).unwrap();
        assert!(zero
            .validate()
            .unwrap_err()
            .contains("max_delay_ms must be"));
        let twice = p(json!({"max_held": 5, "filters": [
            {"id": "a", "field": "topic", "op": "exists"},
            {"id": "a", "field": "kind", "op": "exists"}]}))
        .unwrap();
        assert!(twice.validate().unwrap_err().contains("used twice"));
        let ok = p(json!({"max_held": 5, "filters": [
            {"id": "p", "field": {"payload": "/priority"}, "op": "exists"}]}))
        .unwrap();
        assert!(ok.aggregate && ok.filters[0].enabled && ok.reads_payload());
        ok.validate().unwrap();
    }

    #[test]
    fn updates_change_only_what_they_name() {
        let base = DeliveryPolicy {
            filters: vec![topic("a", "xmpp"), topic("b", "irc")],
            max_delay_ms: Some(500),
            max_held: Some(30),
            aggregate: true,
        };
        let u: PolicyUpdate = serde_json::from_value(json!({
            "add": [{"id": "c", "field": "sender", "op": {"equals": "s1"}}],
            "disable": ["a"],
            "remove": ["b"],
            "max_delay_ms": null
        }))
        .unwrap();
        let p = DeliveryPolicy::updated(Some(&base), &u).unwrap();
        assert_eq!(
            p.filters
                .iter()
                .map(|f| (f.id.as_str(), f.enabled))
                .collect::<Vec<_>>(),
            [("a", false), ("c", true)]
        );
        assert_eq!(
            (p.max_delay_ms, p.max_held, p.aggregate),
            (None, Some(30), true)
        );
        // An update naming an unknown filter, or leaving no bound, changes nothing.
        let bad: PolicyUpdate = serde_json::from_value(json!({"enable": ["zz"]})).unwrap();
        assert!(DeliveryPolicy::updated(Some(&base), &bad)
            .unwrap_err()
            .contains("no filter \"zz\""));
        let unbounded: PolicyUpdate =
            serde_json::from_value(json!({"max_delay_ms": null, "max_held": null})).unwrap();
        assert!(DeliveryPolicy::updated(Some(&base), &unbounded).is_err());
        // From no policy: the update must give a bound.
        let first: PolicyUpdate =
            serde_json::from_value(json!({"max_held": 10, "aggregate": false})).unwrap();
        let p = DeliveryPolicy::updated(None, &first).unwrap();
        assert_eq!(
            (p.max_held, p.aggregate, p.filters.len()),
            (Some(10), false, 0)
        );
        // The wire form of an update round-trips, null included.
        let back: PolicyUpdate = serde_json::from_value(serde_json::to_value(&u).unwrap()).unwrap();
        assert_eq!(back, u);
    }
}
