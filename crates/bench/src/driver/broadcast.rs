//! A plain WebSocket broadcast server: every text message a client sends goes
//! to every other client. The reference server speaks it, and so do many
//! minimal relays.

use super::{Driver, Handshake, Inbound, JoinSpec};

/// Plain broadcast over `/`.
#[derive(Debug, Clone, Copy, Default)]
pub struct BroadcastDriver;

impl Driver for BroadcastDriver {
    fn name(&self) -> &'static str {
        "broadcast"
    }

    fn ws_path(&self) -> String {
        "/".into()
    }

    fn handshake(&self, _msg: Option<&[u8]>, _join: &JoinSpec) -> Handshake {
        Handshake::Joined(Vec::new())
    }

    fn publish(
        &self,
        _room: &str,
        _channel: Option<&str>,
        _event: &str,
        payload: &str,
        out: &mut String,
    ) {
        out.push_str(payload);
    }

    fn request(&self, _: &str, _: u64, _: &str, _: &serde_json::Value, _: &mut String) -> bool {
        false
    }

    fn classify(&self, msg: &[u8], _replies: &mut Vec<String>) -> Inbound {
        Inbound::markers_in(msg)
    }
}
