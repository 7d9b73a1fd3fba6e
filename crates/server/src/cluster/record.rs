//! What a node writes into a room's shared log: one [`LogRecord`] per change.
//!
//! Records are inputs, not outcomes: every replica applies them to its own
//! [`plaza_core::Room`] and, the room being deterministic, gets the same
//! outcome. The encoding (JSON) is internal to Plaza's nodes; clients never
//! see it. A record names the connection it came from, so that a late
//! `Disconnect` of an old connection cannot touch a session that meanwhile
//! resumed elsewhere.

use bytes::Bytes;
use serde::{Deserialize, Serialize};

use crate::room::Intent;

/// One entry's payload.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct LogRecord {
    /// The node that appended it.
    pub(crate) node: String,
    /// That node's connection, for records a connection caused (0 otherwise).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub(crate) conn: u64,
    /// That node's number for the record, to find who waits for its outcome
    /// (0 when nobody does).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub(crate) req: u64,
    /// The change.
    pub(crate) intent: Intent,
}

fn is_zero(v: &u64) -> bool {
    *v == 0
}

impl LogRecord {
    pub(crate) fn encode(&self) -> Bytes {
        Bytes::from(serde_json::to_vec(self).expect("records serialize"))
    }

    pub(crate) fn decode(bytes: &[u8]) -> Result<LogRecord, serde_json::Error> {
        serde_json::from_slice(bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use plaza_core::PublishParams;
    use plaza_protocol::ErrorCode;
    use serde_json::value::RawValue;

    #[test]
    fn records_round_trip_with_raw_payloads() {
        let r = LogRecord {
            node: "a".into(),
            conn: 7,
            req: 9,
            intent: Intent::Publish {
                session: "s".into(),
                params: PublishParams {
                    channel: "main".into(),
                    event: "chat".into(),
                    data: Some(RawValue::from_string(r#"{"x": [1, 2.5e3]}"#.into()).unwrap()),
                    id: Some("m1".into()),
                    topic: None,
                    reply_to: Some(3),
                    echo: false,
                },
            },
        };
        let back = LogRecord::decode(&r.encode()).unwrap();
        assert_eq!(back.node, "a");
        assert_eq!((back.conn, back.req), (7, 9));
        match back.intent {
            Intent::Publish { params, .. } => {
                assert_eq!(params.data.unwrap().get(), r#"{"x": [1, 2.5e3]}"#);
                assert_eq!(params.reply_to, Some(3));
            }
            other => panic!("unexpected {other:?}"),
        }
        let tick = LogRecord {
            node: "b".into(),
            conn: 0,
            req: 0,
            intent: Intent::Tick,
        };
        assert_eq!(&tick.encode()[..], br#"{"node":"b","intent":"tick"}"#);
    }

    fn join(resume_only: Option<(ErrorCode, String)>) -> LogRecord {
        LogRecord {
            node: "a".into(),
            conn: 3,
            req: 4,
            intent: Intent::Join {
                session: "s".into(),
                resume_token: "t".into(),
                name: "-".into(),
                platform: "-".into(),
                user: None,
                channels: Vec::new(),
                ticket: false,
                resume: Some(("r".repeat(32), 12)),
                resume_only,
                policy: None,
                history: None,
            },
        }
    }

    /// `resume_only` survives the log; a join without it is written as
    /// before it existed, and such a record (an older node's) reads as
    /// `None`.
    #[test]
    fn a_join_record_keeps_resume_only() {
        let refusal = (ErrorCode::TokenRequired, "no token".to_owned());
        let bytes = join(Some(refusal.clone())).encode();
        let v: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
        assert_eq!(
            v["intent"]["join"]["resume_only"],
            serde_json::json!(["token_required", "no token"]),
            "{v}"
        );
        match LogRecord::decode(&bytes).unwrap().intent {
            Intent::Join {
                resume_only,
                resume,
                ..
            } => {
                assert_eq!(resume_only, Some(refusal));
                assert_eq!(resume, Some(("r".repeat(32), 12)));
            }
            other => panic!("unexpected {other:?}"),
        }
        let plain = join(None).encode();
        let v: serde_json::Value = serde_json::from_slice(&plain).unwrap();
        assert!(v["intent"]["join"].get("resume_only").is_none(), "{v}");
        match LogRecord::decode(&plain).unwrap().intent {
            Intent::Join { resume_only, .. } => assert_eq!(resume_only, None),
            other => panic!("unexpected {other:?}"),
        }
    }
}
