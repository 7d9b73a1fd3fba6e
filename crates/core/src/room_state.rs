//! A room's state as plain data, for replicas.
//!
//! In cluster mode a node that starts hosting a room loads it from a
//! [`RoomState`] exported by a node that already runs it
//! ([`Room::export`](crate::Room::export), [`Room::import`](crate::Room::import)),
//! then applies the room's ordered inputs like every other replica. The state
//! therefore holds everything a room's future behaviour depends on: counters
//! (seq, entity ids, fencing tokens), the history for resumes, the members
//! with their resume tokens and recent client ids in order. Only the sinks
//! are left out: they are local to a node, and travel as an owner string.

use std::collections::HashSet;
use std::sync::Arc;

use plaza_protocol::DEFAULT_CHANNEL;
use serde::{Deserialize, Serialize};

use crate::{EntityStore, HistoryEntry, LockTable, Millis, RoomConfig};

/// Everything a [`Room`](crate::Room) holds except its members' sinks.
///
/// Plain serde data: the server encodes it with `serde_json` (every u64 and
/// every frame survives that exactly). Two replicas of a room export equal
/// states: members are ordered by session id.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RoomState {
    /// The layout of this data (`v`; absent in states written before it was
    /// recorded, which are format 1). A node refuses a state whose format it
    /// does not know (see [`validate`](Self::validate)) rather than misread a
    /// newer node's snapshot during a rolling upgrade.
    #[serde(rename = "v", default = "first_format")]
    pub format: u32,
    /// Room id.
    pub id: String,
    /// Display name.
    pub name: String,
    /// Creation time.
    pub created_at: Millis,
    /// This incarnation's epoch.
    pub epoch: u64,
    /// Limits and timings.
    pub config: RoomConfig,
    /// The last seq ordered.
    pub seq: u64,
    /// The history kept for resume, oldest first, gap-free up to `seq`.
    pub history: Vec<Arc<HistoryEntry>>,
    /// The entities, with the counter that keeps ids unique.
    pub entities: EntityStore,
    /// The leases, with the fencing-token counter.
    pub locks: LockTable,
    /// Every session, connected or resumable, ordered by session id.
    pub members: Vec<MemberState>,
    /// A spatial room's members in its plane (absent otherwise).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub space: Option<crate::spatial::RoomSpaceState>,
    /// The application backend's idempotency keys, oldest first: (key, seq,
    /// digest of the message).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub server_keys: Vec<(String, u64, u64)>,
}

/// One session of a [`RoomState`].
///
/// A big room's snapshot is mostly these (up to twice `max_members`), so the
/// field names are one letter on the wire (given below) and defaults are left
/// out.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MemberState {
    /// Session id (`s`).
    #[serde(rename = "s")]
    pub session: String,
    /// Display name (`n`).
    #[serde(rename = "n")]
    pub name: String,
    /// Platform (`p`).
    #[serde(rename = "p")]
    pub platform: String,
    /// The user id its token vouched for (`u`), if any.
    #[serde(rename = "u", default, skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
    /// Subscribed channels, in subscription order (`c`; left out when only `main`).
    #[serde(
        rename = "c",
        default = "main_only",
        skip_serializing_if = "is_main_only"
    )]
    pub channels: Vec<String>,
    /// The secret that resumes this session (`t`).
    #[serde(rename = "t")]
    pub resume_token: String,
    /// Where a connected member's frames go, as named by the exporting
    /// node's `owner` function (`o`); `None` while disconnected.
    #[serde(rename = "o", default, skip_serializing_if = "Option::is_none")]
    pub owner: Option<String>,
    /// When the connection dropped, for the resume window (`d`).
    #[serde(rename = "d", default, skip_serializing_if = "Option::is_none")]
    pub disconnected_at: Option<Millis>,
    /// Recent client message ids and the seqs they got, oldest first (`r`):
    /// the order decides which id the dedup window forgets next.
    #[serde(rename = "r", default, skip_serializing_if = "Vec::is_empty")]
    pub recent: Vec<(String, u64)>,
    /// Channels subscribed after joining, with the room's seq then, ordered
    /// by channel (`a`): a resume replays their messages only from there on.
    #[serde(rename = "a", default, skip_serializing_if = "Vec::is_empty")]
    pub subscribed_at: Vec<(String, u64)>,
    /// Its delivery policy (`y`), if it set one.
    #[serde(rename = "y", default, skip_serializing_if = "Option::is_none")]
    pub policy: Option<crate::policy::DeliveryPolicy>,
}

fn main_only() -> Vec<String> {
    vec![DEFAULT_CHANNEL.to_owned()]
}

fn is_main_only(channels: &[String]) -> bool {
    matches!(channels, [c] if c == DEFAULT_CHANNEL)
}

/// Why a [`RoomState`] cannot be imported.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InvalidRoomState(pub String);

impl std::fmt::Display for InvalidRoomState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "invalid room state: {}", self.0)
    }
}

impl std::error::Error for InvalidRoomState {}

fn first_format() -> u32 {
    1
}

impl RoomState {
    /// The format this version of Plaza writes and reads.
    pub const FORMAT: u32 = 1;

    /// Checks what an imported room relies on and an exported state always
    /// satisfies: a gap-free history ending at `seq`, unique sessions and
    /// resume tokens, unique recent ids within the dedup window, and counters
    /// ahead of every entity id and fencing token in use (ids and tokens are
    /// never reused).
    pub fn validate(&self) -> Result<(), InvalidRoomState> {
        let bad = |m: String| Err(InvalidRoomState(m));
        if self.format != Self::FORMAT {
            return bad(format!(
                "state format {} (this node reads format {}: a newer node wrote it?)",
                self.format,
                Self::FORMAT
            ));
        }
        for pair in self.history.windows(2) {
            if pair[0].seq.checked_add(1) != Some(pair[1].seq) {
                return bad(format!(
                    "history jumps from seq {} to {}",
                    pair[0].seq, pair[1].seq
                ));
            }
        }
        match self.history.last() {
            Some(last) if last.seq != self.seq || self.history[0].seq == 0 => {
                return bad(format!(
                    "history covers seqs {}..={}, room is at {}",
                    self.history[0].seq, last.seq, self.seq
                ))
            }
            // A room always holds its last event: without it a resume could
            // not tell that events were missed.
            None if self.seq > 0 => return bad(format!("no history up to seq {}", self.seq)),
            _ => {}
        }
        let mut sessions = HashSet::with_capacity(self.members.len());
        let mut tokens = HashSet::with_capacity(self.members.len());
        for m in &self.members {
            if !sessions.insert(m.session.as_str()) {
                return bad(format!("session {:?} appears twice", m.session));
            }
            if !tokens.insert(m.resume_token.as_str()) {
                return bad(format!("a resume token of {:?} is reused", m.session));
            }
            if m.recent.len() > self.config.dedup_window {
                // The window forgets one id per new one: it would never shrink.
                return bad(format!("{:?} holds more ids than the window", m.session));
            }
            let mut ids = HashSet::with_capacity(m.recent.len());
            if let Some((id, _)) = m.recent.iter().find(|(id, _)| !ids.insert(id)) {
                return bad(format!("client id {id:?} of {:?} appears twice", m.session));
            }
            if let Some(Err(e)) = m.policy.as_ref().map(|p| p.validate_stored()) {
                return bad(format!("the policy of {:?}: {e}", m.session));
            }
        }
        if !self.entities.ids_below_counter() {
            return bad("an entity id is ahead of the id counter".into());
        }
        if !self.locks.tokens_below_counter() {
            return bad("a fencing token is ahead of the token counter".into());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;

    fn entry(seq: u64, frame: &[u8]) -> Arc<HistoryEntry> {
        Arc::new(HistoryEntry {
            seq,
            ts: u64::MAX,
            from: Some("s1".into()),
            channel: None,
            echo: seq == 2,
            replay_to_sender: seq == 3,
            topic: None,
            reply_to: Some(u64::MAX - 1),
            scope: if seq == 4 {
                crate::Scope::Only(vec!["s1".into()])
            } else {
                crate::Scope::All
            },
            frame: Bytes::copy_from_slice(frame),
            wire: Default::default(),
        })
    }

    fn state(history: Vec<Arc<HistoryEntry>>) -> RoomState {
        RoomState {
            format: RoomState::FORMAT,
            id: "r".into(),
            name: "R".into(),
            created_at: 0,
            epoch: u64::MAX,
            config: RoomConfig::default(),
            seq: history.last().map_or(0, |e| e.seq),
            history,
            entities: EntityStore::default(),
            locks: LockTable::default(),
            members: Vec::new(),
            space: None,
            server_keys: Vec::new(),
        }
    }

    #[test]
    fn a_state_without_a_format_is_format_1() {
        let mut v = serde_json::to_value(state(Vec::new())).unwrap();
        assert_eq!(v["v"], 1);
        v.as_object_mut().unwrap().remove("v");
        let read: RoomState = serde_json::from_value(v).unwrap();
        assert_eq!(read.format, 1);
        assert_eq!(read.validate(), Ok(()));
    }

    #[test]
    fn frames_and_u64s_survive_json_byte_for_byte() {
        let text = br#"{"type":"event","data":{"t":"h\u00e9 \"x\" \\ caf\u00e9 \u2603"}}"#;
        let utf8 = "{\"t\":\"h\u{e9} \u{2603} \u{1F600}\"}".as_bytes();
        let binary = [0xff, 0x00, b'"', 0xc3];
        let s = state(vec![entry(1, text), entry(2, utf8), entry(3, &binary)]);
        let json = serde_json::to_string(&s).unwrap();
        // Text frames travel as strings, not arrays of numbers.
        assert!(json.contains(r#""frame":"{\"type\":\"event\""#), "{json}");
        assert!(json.contains(r#""frame":[255,0,34,195]"#), "{json}");
        let back: RoomState = serde_json::from_str(&json).unwrap();
        assert_eq!(back, s);
        assert_eq!(back.history[0].ts, u64::MAX);
        assert_eq!(back.epoch, u64::MAX);
        assert_eq!(&back.history[2].frame[..], &binary);
        // Through a `serde_json::Value` too (e.g. inside a larger message).
        let value = serde_json::to_value(&s).unwrap();
        assert_eq!(serde_json::from_value::<RoomState>(value).unwrap(), s);
    }

    #[test]
    fn members_leave_out_their_defaults() {
        let m = MemberState {
            session: "s1".into(),
            name: "n".into(),
            platform: "p".into(),
            user: None,
            channels: main_only(),
            resume_token: "t".into(),
            owner: None,
            disconnected_at: Some(5),
            recent: Vec::new(),
            subscribed_at: Vec::new(),
            policy: None,
        };
        let json = serde_json::to_string(&m).unwrap();
        assert_eq!(json, r#"{"s":"s1","n":"n","p":"p","t":"t","d":5}"#);
        assert_eq!(serde_json::from_str::<MemberState>(&json).unwrap(), m);
        let m = MemberState {
            channels: vec!["side".into()],
            owner: Some("node-2".into()),
            disconnected_at: None,
            recent: vec![("b".into(), 9), ("a".into(), u64::MAX)],
            subscribed_at: vec![("side".into(), 7)],
            policy: None,
            user: Some("u-42".into()),
            ..m
        };
        let json = serde_json::to_string(&m).unwrap();
        assert_eq!(
            json,
            r#"{"s":"s1","n":"n","p":"p","u":"u-42","c":["side"],"t":"t","o":"node-2","r":[["b",9],["a",18446744073709551615]],"a":[["side",7]]}"#
        );
        assert_eq!(serde_json::from_str::<MemberState>(&json).unwrap(), m);
    }

    #[test]
    fn validate_refuses_what_import_cannot_continue_from() {
        let ok = state(vec![entry(4, b"a"), entry(5, b"b")]);
        assert_eq!(ok.validate(), Ok(()));
        let mut newer = ok.clone();
        newer.format = RoomState::FORMAT + 1;
        assert!(newer
            .validate()
            .unwrap_err()
            .to_string()
            .contains("format 2"));
        assert!(state(vec![entry(4, b"a"), entry(6, b"b")])
            .validate()
            .is_err());
        let mut behind = ok.clone();
        behind.seq = 6;
        assert!(behind.validate().is_err());
        let mut forgotten = ok.clone();
        forgotten.history.clear();
        assert!(forgotten.validate().is_err());
        forgotten.seq = 0;
        assert_eq!(forgotten.validate(), Ok(()));

        let member = |s: &str, t: &str| MemberState {
            session: s.into(),
            name: String::new(),
            platform: String::new(),
            user: None,
            channels: main_only(),
            resume_token: t.into(),
            owner: None,
            disconnected_at: Some(0),
            recent: Vec::new(),
            subscribed_at: Vec::new(),
            policy: None,
        };
        let mut s = ok.clone();
        s.members = vec![member("a", "t1"), member("b", "t2")];
        assert_eq!(s.validate(), Ok(()));
        s.members = vec![member("a", "t1"), member("a", "t2")];
        assert!(s.validate().is_err());
        s.members = vec![member("a", "t1"), member("b", "t1")];
        assert!(s.validate().is_err());
        let mut m = member("a", "t1");
        m.recent = vec![("x".into(), 1), ("y".into(), 2)];
        s.members = vec![m.clone()];
        assert_eq!(s.validate(), Ok(()));
        m.recent[1].0 = "x".into();
        s.members = vec![m.clone()];
        assert!(s.validate().is_err());
        m.recent = (0..=s.config.dedup_window as u64)
            .map(|i| (i.to_string(), i))
            .collect();
        s.members = vec![m];
        assert!(s.validate().is_err());
        // A policy from a snapshot is checked like one from a client.
        let mut m = member("a", "t1");
        m.policy = Some(serde_json::from_value(serde_json::json!({"max_held": 0})).unwrap());
        s.members = vec![m.clone()];
        assert!(s.validate().unwrap_err().to_string().contains("policy"));
        m.policy = Some(serde_json::from_value(serde_json::json!({"max_held": 3})).unwrap());
        s.members = vec![m];
        assert_eq!(s.validate(), Ok(()));

        let mut s = ok.clone();
        s.entities.create(None, serde_json::Value::Null);
        s.locks.acquire("o", "a", 10, 0).unwrap();
        assert_eq!(s.validate(), Ok(()));
        let mut json = serde_json::to_value(&s).unwrap();
        json["entities"]["next_id"] = 0.into();
        let stale: RoomState = serde_json::from_value(json).unwrap();
        assert!(stale.validate().is_err());
        let mut json = serde_json::to_value(&s).unwrap();
        json["locks"]["last_token"] = 0.into();
        let stale: RoomState = serde_json::from_value(json).unwrap();
        assert!(stale.validate().is_err());
    }
}
