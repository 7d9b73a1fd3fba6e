//! A room's state as stored in snapshots (a new room's first one included).

use bytes::Bytes;
use plaza_broker::SnapshotFormat;
use plaza_core::{Room, RoomState};

use crate::room::Sink;

/// Encodes `room` for the shared store: members are named by `node/conn`.
pub(crate) fn encode_state(room: &Room<Sink>, format: SnapshotFormat) -> Bytes {
    let state = room.export(|s: &Sink| s.owner());
    let bytes = match format {
        SnapshotFormat::Json => serde_json::to_vec(&state).expect("room state serializes"),
        // Named fields: optional fields may be left out, as in JSON.
        SnapshotFormat::MessagePack => {
            rmp_serde::to_vec_named(&state).expect("room state serializes")
        }
    };
    Bytes::from(bytes)
}

/// Decodes a snapshot in either format: JSON is an object (`{`); a
/// MessagePack map never starts with that byte.
pub(crate) fn decode_state(bytes: &[u8]) -> Result<RoomState, String> {
    if bytes.first() == Some(&b'{') {
        serde_json::from_slice(bytes).map_err(|e| e.to_string())
    } else {
        rmp_serde::from_slice(bytes).map_err(|e| e.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use plaza_core::RoomConfig;

    #[test]
    fn both_formats_decode_to_the_same_state() {
        let room: Room<Sink> = Room::new("r".into(), "R".into(), RoomConfig::default(), 7, 1_000);
        // A history event with a frame full of quotes and non-ASCII text,
        // which JSON escapes and MessagePack keeps as bytes.
        let mut v = serde_json::to_value(room.export(|s: &Sink| s.owner())).unwrap();
        v["seq"] = 1.into();
        v["history"] = serde_json::json!([{
            "seq": 1, "ts": 1_001, "from": "s1", "channel": "main",
            "frame": r#"{"type":"event","seq":1,"data":{"text":"\"é\" \\ ✓"}}"#
        }]);
        let state: RoomState = serde_json::from_value(v).unwrap();
        state.validate().unwrap();
        let room = Room::import(state.clone(), Sink::from_owner);
        for format in [SnapshotFormat::Json, SnapshotFormat::MessagePack] {
            let bytes = encode_state(&room, format);
            assert_eq!(bytes[0] == b'{', format == SnapshotFormat::Json);
            assert_eq!(decode_state(&bytes).unwrap(), state, "{format:?}");
        }
        let packed = encode_state(&room, SnapshotFormat::MessagePack);
        let json = encode_state(&room, SnapshotFormat::Json);
        assert!(
            packed.len() < json.len(),
            "{} >= {}",
            packed.len(),
            json.len()
        );
        assert!(decode_state(b"not a snapshot").is_err());
        assert!(decode_state(b"").is_err());
    }
}
