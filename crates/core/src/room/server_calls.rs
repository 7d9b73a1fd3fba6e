//! What the application's backend does to a room through the server API:
//! messages with idempotency keys, and entity changes. The backend is no
//! member: its events carry [`SERVER_SENDER`] as `from`, and nobody sees it
//! in presence.

use std::hash::{Hash, Hasher};

use super::*;

/// The `from` of events the application's backend caused. Session ids are
/// URL-safe base64, so no session can have it.
pub const SERVER_SENDER: &str = "@server";

/// Server idempotency keys a room remembers (the oldest is forgotten first).
pub const SERVER_KEYS_KEPT: usize = 1024;

/// The longest server idempotency key, in bytes.
pub const MAX_SERVER_KEY_BYTES: usize = 128;

/// A message the application's backend publishes. Serializable: cluster mode
/// puts it into a room's shared log as it is.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
pub struct ServerPublish {
    /// Channel.
    pub channel: String,
    /// Application event name.
    pub event: String,
    /// Raw JSON payload.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data: Option<Box<serde_json::value::RawValue>>,
    /// Topic, for delivery policies.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub topic: Option<String>,
    /// The seq this message answers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reply_to: Option<u64>,
    /// Idempotency key: a retry with the same key and body gets the first
    /// seq and is not delivered again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
}

impl ServerPublish {
    /// A digest of everything but the key: a key used again with another
    /// body is a conflict, not a retry. `data` counts as parsed JSON (see
    /// [`hash_json`]), so a retry that another JSON library wrote again is
    /// still a retry. FxHash is deterministic for one build, so every
    /// replica of a cluster (one version, see architecture.md) computes the
    /// same.
    fn digest(&self) -> u64 {
        let mut h = rustc_hash::FxHasher::default();
        self.channel.hash(&mut h);
        self.event.hash(&mut h);
        match self.data.as_ref().map(|d| d.get()) {
            None => 0u8.hash(&mut h),
            Some(raw) => {
                1u8.hash(&mut h);
                // A `RawValue` was valid JSON when it was read: the error
                // arm is only a fallback that still tells bodies apart.
                match serde_json::from_str::<serde_json::Value>(raw) {
                    Ok(v) => hash_json(&v, &mut h),
                    Err(_) => raw.hash(&mut h),
                }
            }
        }
        self.topic.hash(&mut h);
        self.reply_to.hash(&mut h);
        h.finish()
    }
}

impl ServerPublish {
    /// The digest builds before issue 44 kept: `data` as raw bytes.
    fn raw_digest(&self) -> u64 {
        let mut h = rustc_hash::FxHasher::default();
        self.channel.hash(&mut h);
        self.event.hash(&mut h);
        self.data.as_ref().map(|d| d.get()).hash(&mut h);
        self.topic.hash(&mut h);
        self.reply_to.hash(&mut h);
        h.finish()
    }
}

/// Hashes a parsed JSON value so that equal values hash alike however they
/// were written: object keys in sorted order (whatever order the map keeps),
/// strings unescaped (`"\u00e9"` is `"é"`, `"\/"` is `"/"`), no whitespace,
/// and numbers by value: an integral number is the integer (`1`, `1.0` and
/// `1e0` are one value), any other the 64-bit float it parses to.
fn hash_json(v: &serde_json::Value, h: &mut impl Hasher) {
    use serde_json::Value;
    match v {
        Value::Null => 0u8.hash(h),
        Value::Bool(b) => (1u8, b).hash(h),
        Value::Number(n) => {
            2u8.hash(h);
            hash_number(n, h);
        }
        Value::String(s) => (3u8, s).hash(h),
        Value::Array(items) => {
            (4u8, items.len() as u64).hash(h);
            for item in items {
                hash_json(item, h);
            }
        }
        Value::Object(fields) => {
            (5u8, fields.len() as u64).hash(h);
            let mut sorted: Vec<_> = fields.iter().collect();
            sorted.sort_unstable_by(|a, b| a.0.cmp(b.0));
            for (k, item) in sorted {
                k.hash(h);
                hash_json(item, h);
            }
        }
    }
}

/// A JSON number by its value: integers (and integral floats within the
/// 64-bit integer range) as integers, anything else as its float's bits.
fn hash_number(n: &serde_json::Number, h: &mut impl Hasher) {
    // 2^63 and 2^64 are exact as f64.
    const TWO_63: f64 = 9_223_372_036_854_775_808.0;
    if let Some(i) = n.as_i64() {
        (0u8, i).hash(h);
    } else if let Some(u) = n.as_u64() {
        (1u8, u).hash(h);
    } else if let Some(f) = n.as_f64() {
        if f.fract() == 0.0 && (-TWO_63..TWO_63).contains(&f) {
            // `-0.0` lands here too, as 0.
            (0u8, f as i64).hash(h);
        } else if f.fract() == 0.0 && (TWO_63..2.0 * TWO_63).contains(&f) {
            (1u8, f as u64).hash(h);
        } else {
            (2u8, f.to_bits()).hash(h);
        }
    }
}

/// The server idempotency keys a room remembers, with the seq each got and
/// its body's digest.
#[derive(Debug, Default, Clone)]
pub(super) struct ServerKeys {
    by_key: HashMap<String, (u64, u64)>,
    order: VecDeque<String>,
}

impl ServerKeys {
    /// As a snapshot keeps them: (key, seq, digest), oldest first.
    pub(super) fn export(&self) -> Vec<(String, u64, u64)> {
        self.order
            .iter()
            .map(|k| {
                let (seq, digest) = self.by_key[k];
                (k.clone(), seq, digest)
            })
            .collect()
    }

    pub(super) fn import(kept: Vec<(String, u64, u64)>) -> ServerKeys {
        let mut keys = ServerKeys::default();
        for (k, seq, digest) in kept {
            keys.remember(k, seq, digest);
        }
        keys
    }

    fn remember(&mut self, key: String, seq: u64, digest: u64) {
        if self.order.len() >= SERVER_KEYS_KEPT {
            if let Some(old) = self.order.pop_front() {
                self.by_key.remove(&old);
            }
        }
        self.by_key.insert(key.clone(), (seq, digest));
        self.order.push_back(key);
    }
}

impl<S> Room<S> {
    /// Orders a message of the application's backend, or answers a retry of
    /// one (same key, same body) with its first seq. The same key with
    /// another body is `idempotency_conflict`.
    pub fn server_publish(
        &mut self,
        p: ServerPublish,
        now: Millis,
    ) -> Result<Published, RoomError> {
        if p.channel.is_empty() || p.channel.len() > 64 {
            return Err(RoomError::new(
                ErrorCode::InvalidRequest,
                format!("channel names have 1 to 64 bytes: {:?}", p.channel),
            ));
        }
        if p.key
            .as_ref()
            .is_some_and(|k| k.is_empty() || k.len() > MAX_SERVER_KEY_BYTES)
        {
            return Err(RoomError::new(
                ErrorCode::InvalidRequest,
                format!("idempotency_key has 1 to {MAX_SERVER_KEY_BYTES} bytes"),
            ));
        }
        // Only a keyed message is ever compared: others skip the parse.
        let digest = if p.key.is_some() { p.digest() } else { 0 };
        if let Some(key) = &p.key {
            if let Some(&(seq, seen)) = self.server_keys.by_key.get(key) {
                // A key a room remembers from a build that digested the
                // raw bytes (snapshots kept across an upgrade) still
                // matches a byte-identical retry.
                if seen != digest && seen != p.raw_digest() {
                    return Err(RoomError::new(
                        ErrorCode::IdempotencyConflict,
                        format!("idempotency_key {key:?} was used for another message (seq {seq})"),
                    ));
                }
                return Ok(Published { seq, entry: None });
            }
        }
        let seq = self.seq;
        if p.reply_to.is_some_and(|r| r == 0 || r > seq) {
            return Err(RoomError::new(
                ErrorCode::InvalidRequest,
                format!("reply_to must name an earlier seq (1..={seq})"),
            ));
        }
        if let Some(key) = &p.key {
            self.server_keys.remember(key.clone(), seq + 1, digest);
        }
        let body = EventBody::Message {
            channel: p.channel.clone(),
            event: p.event,
            data: p.data,
            topic: p.topic.clone(),
            reply_to: p.reply_to,
            id: p.key,
        };
        let entry = self.push_full(
            Some(SERVER_SENDER),
            Some(p.channel),
            SenderCopy::None,
            p.topic,
            p.reply_to,
            Scope::All,
            body,
            now,
        );
        Ok(Published {
            seq: entry.seq,
            entry: Some(entry),
        })
    }

    /// Applies an entity change of the application's backend, with the
    /// validation and version check a member's request gets: an entity
    /// locked by a member is `lock_held`. Other operations are
    /// `invalid_args`.
    pub fn server_request(&mut self, op: Op, now: Millis) -> Result<RequestOutcome, RoomError> {
        let from = SERVER_SENDER;
        let push = |room: &mut Self, body| {
            room.push_full(
                Some(from),
                None,
                SenderCopy::None,
                None,
                None,
                Scope::All,
                body,
                now,
            )
        };
        match op {
            Op::EntityCreate { kind, data } => {
                let entity = self.entities.create(kind, data);
                let e = push(
                    self,
                    EventBody::EntityCreated {
                        entity: entity.clone(),
                    },
                );
                Ok(requests::outcome(
                    json!({"entity": entity, "seq": e.seq}),
                    vec![e],
                ))
            }
            Op::EntitySet { id, data, version } => {
                self.check_lock(&id, from, now)?;
                let entity = self.entities.set(&id, data, version)?;
                let e = push(
                    self,
                    EventBody::EntityUpdated {
                        entity: entity.clone(),
                    },
                );
                Ok(requests::outcome(
                    json!({"entity": entity, "seq": e.seq}),
                    vec![e],
                ))
            }
            Op::EntityDelete { id, version } => {
                self.check_lock(&id, from, now)?;
                let version = self.entities.delete(&id, version)?;
                let body = EventBody::EntityDeleted {
                    id: id.clone(),
                    version,
                };
                let e = push(self, body);
                Ok(requests::outcome(
                    json!({"id": id, "version": version, "seq": e.seq}),
                    vec![e],
                ))
            }
            other => Err(RoomError::new(
                ErrorCode::InvalidArgs,
                format!("the server API does not take {other:?}"),
            )),
        }
    }

    /// The messages `h` names, newest last, as whole event frames: what a
    /// join's `history` gets, for the server API.
    pub fn history(
        &self,
        h: &plaza_protocol::client::HistoryRequest,
    ) -> plaza_protocol::server::JoinHistory {
        self.join_history(h)
    }

    /// The connected sessions of user `user` (a token's `sub`), ordered by
    /// session id.
    pub fn sessions_of_user(&self, user: &str) -> Vec<&Member<S>> {
        self.members
            .values()
            .filter(|m| m.sink.is_some() && m.info.user.as_deref() == Some(user))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn room() -> Room<()> {
        Room::new("r".into(), "R".into(), RoomConfig::default(), 1, 0)
    }

    fn message(key: &str, text: &str) -> ServerPublish {
        ServerPublish {
            channel: "main".into(),
            event: "e".into(),
            data: Some(serde_json::value::RawValue::from_string(format!("{text:?}")).unwrap()),
            topic: None,
            reply_to: None,
            key: Some(key.into()),
        }
    }

    #[test]
    fn a_key_is_a_retry_with_its_body_and_a_conflict_with_another() {
        let mut r = room();
        let first = r.server_publish(message("k", "a"), 10).unwrap();
        assert_eq!((first.seq, first.entry.is_some()), (1, true));
        assert_eq!(first.entry.unwrap().from.as_deref(), Some(SERVER_SENDER));
        let again = r.server_publish(message("k", "a"), 11).unwrap();
        assert_eq!((again.seq, again.entry.is_none()), (1, true));
        let e = r.server_publish(message("k", "b"), 12).unwrap_err();
        assert_eq!(e.code, ErrorCode::IdempotencyConflict);
        assert_eq!(r.seq(), 1);
    }

    fn raw_message(key: &str, data: &str) -> ServerPublish {
        ServerPublish {
            data: Some(serde_json::value::RawValue::from_string(data.into()).unwrap()),
            ..message(key, "")
        }
    }

    #[test]
    fn a_retry_is_compared_as_parsed_json() {
        let first = r#"{"a": 1, "b": ["é", "x/y", 2.5, null, true], "n": 10}"#;
        let same = [
            r#"{"n":10,"b":["\u00e9","x\/y",2.5,null,true],"a":1}"#,
            "{ \"a\" :1.0,\n \"b\":[\"é\",\"x/y\",25e-1,null,true],\"n\":1e1}",
        ];
        let changed = [
            r#"{"a": 1, "b": ["é", "x/y", 2.5, null, false], "n": 10}"#,
            r#"{"a": 1, "b": ["é", "x/y", 2.5, null, true], "n": 11}"#,
            r#"{"a": 1, "b": ["é", "x/y", 2.5, null, true]}"#,
            r#"{"a": 1, "b": ["x/y", "é", 2.5, null, true], "n": 10}"#,
            r#"{"a": "1", "b": ["é", "x/y", 2.5, null, true], "n": 10}"#,
        ];
        let mut r = room();
        assert_eq!(r.server_publish(raw_message("k", first), 1).unwrap().seq, 1);
        for body in same {
            let again = r.server_publish(raw_message("k", body), 2).unwrap();
            assert_eq!((again.seq, again.entry.is_none()), (1, true), "{body}");
        }
        for body in changed {
            let e = r.server_publish(raw_message("k", body), 3).unwrap_err();
            assert_eq!(e.code, ErrorCode::IdempotencyConflict, "{body}");
        }
        assert_eq!(r.seq(), 1);
    }

    #[test]
    fn a_key_remembered_with_the_raw_digest_of_an_older_build_still_matches_its_retry() {
        let body = r#"{"a": 1}"#;
        let mut r = room();
        assert_eq!(r.server_publish(raw_message("k", body), 1).unwrap().seq, 1);
        // As a snapshot from before the parsed comparison holds it.
        let old = raw_message("k", body).raw_digest();
        r.server_keys.by_key.get_mut("k").unwrap().1 = old;
        let again = r.server_publish(raw_message("k", body), 2).unwrap();
        assert_eq!((again.seq, again.entry.is_none()), (1, true));
        let e = r
            .server_publish(raw_message("k", r#"{"a": 2}"#), 3)
            .unwrap_err();
        assert_eq!(e.code, ErrorCode::IdempotencyConflict);
    }

    #[test]
    fn keys_survive_a_snapshot_and_the_oldest_is_forgotten_first() {
        let mut r = room();
        for i in 0..=SERVER_KEYS_KEPT {
            r.server_publish(message(&format!("k{i}"), "x"), 1).unwrap();
        }
        let state = r.export(|_| String::new());
        assert_eq!(state.server_keys.len(), SERVER_KEYS_KEPT);
        let json = serde_json::to_string(&state).unwrap();
        let mut back: Room<()> = Room::import(serde_json::from_str(&json).unwrap(), |_| ());
        // The last key is still a retry; the first was forgotten.
        let last = format!("k{SERVER_KEYS_KEPT}");
        let seq = back.seq();
        assert_eq!(
            back.server_publish(message(&last, "x"), 2).unwrap().seq,
            seq
        );
        let fresh = back.server_publish(message("k0", "x"), 2).unwrap();
        assert_eq!((fresh.seq, fresh.entry.is_some()), (seq + 1, true));
    }

    #[test]
    fn the_server_changes_entities_but_takes_no_other_request() {
        let mut r = room();
        let created = r
            .server_request(
                Op::EntityCreate {
                    kind: None,
                    data: json!({"a": 1}),
                },
                1,
            )
            .unwrap();
        let id = created.result["entity"]["id"].as_str().unwrap().to_owned();
        let stale = Op::EntitySet {
            id: id.clone(),
            data: json!({}),
            version: Some(9),
        };
        assert_eq!(
            r.server_request(stale, 2).unwrap_err().code,
            ErrorCode::VersionConflict
        );
        let lock = Op::LockAcquire {
            object: id,
            ttl_ms: None,
        };
        assert_eq!(
            r.server_request(lock, 3).unwrap_err().code,
            ErrorCode::InvalidArgs
        );
        assert_eq!(r.seq(), 1);
    }
}
