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
}
