//! What a node writes into a room's shared log: one [`LogRecord`] per change.
//!
//! Records are inputs, not outcomes: every replica applies them to its own
//! [`plaza_core::Room`] and, the room being deterministic, gets the same
//! outcome. The encoding (JSON) is internal to Plaza's nodes; clients never
//! see it. A record names the connection it came from, so that a late
//! `Disconnect` of an old connection cannot touch a session that meanwhile
//! resumed elsewhere.

use bytes::Bytes;
use plaza_core::PublishParams;
use plaza_protocol::client::Op;
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

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

/// A change to a room, as asked for.
#[derive(Debug, Serialize, Deserialize)]
// Externally tagged: an internally tagged enum buffers its fields, which
// `RawValue` payloads do not survive.
#[serde(rename_all = "snake_case")]
pub(crate) enum Intent {
    /// A member joins, or resumes with `resume` = (token, last seq).
    Join {
        session: String,
        resume_token: String,
        name: String,
        platform: String,
        channels: Vec<String>,
        ticket: bool,
        resume: Option<(String, u64)>,
    },
    /// A member leaves for good.
    Leave { session: String },
    /// A member's connection dropped (it may resume).
    Disconnect { session: String },
    /// A message.
    Publish {
        session: String,
        params: PublishParams,
    },
    /// A request, answered by `nonce`.
    Request {
        session: String,
        nonce: Box<RawValue>,
        op: Op,
    },
    /// A message for one session.
    Direct {
        session: String,
        to: String,
        event: String,
        data: Option<Box<RawValue>>,
    },
    /// The clock moved: expire leases and resume windows due by the entry's time.
    Tick,
    /// `node` stopped renewing its heartbeat: its members are disconnected.
    NodeDown { node: String },
    /// The room was deleted.
    Close,
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
}
