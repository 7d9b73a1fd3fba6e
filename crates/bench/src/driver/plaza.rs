//! Plaza's own protocol (docs/protocol.md).

use serde_json::json;

use super::{finder, ChatMessage, Driver, Handshake, HttpCall, Inbound, JoinSpec};

/// Plaza over `/v1/ws`.
#[derive(Debug, Clone, Copy, Default)]
pub struct PlazaDriver {
    /// Offer `plaza.v1.compact` (room messages as arrays; the driver name
    /// `plaza-compact`).
    pub compact: bool,
}

impl Driver for PlazaDriver {
    fn name(&self) -> &'static str {
        "plaza"
    }

    fn ws_path(&self) -> String {
        "/v1/ws".into()
    }

    fn subprotocol(&self) -> Option<&'static str> {
        self.compact
            .then_some(plaza_protocol::compact::COMPACT_SUBPROTOCOL)
    }

    /// `/v1/ws?room=ID`: a cluster's load balancer hashes on it, so that a
    /// room's members share a node (deploy/README.md).
    fn ws_path_for(&self, room: Option<&str>) -> String {
        match room {
            Some(room) => format!("/v1/ws?room={}", query_escape(room)),
            None => self.ws_path(),
        }
    }

    /// `/v1/sessions?room=ID`: the same hint as the WebSocket URL's, which
    /// the HTTP transport then repeats on every request of the session.
    fn sessions_path_for(&self, room: Option<&str>) -> Option<String> {
        Some(match room {
            Some(room) => format!("/v1/sessions?room={}", query_escape(room)),
            None => "/v1/sessions".into(),
        })
    }

    fn setup(
        &self,
        rooms: &[String],
        options: &serde_json::Map<String, serde_json::Value>,
    ) -> Vec<HttpCall> {
        let mut opts = serde_json::Map::new();
        opts.insert("max_members".into(), json!(1_000_000));
        opts.extend(options.clone());
        rooms
            .iter()
            .map(|id| HttpCall {
                method: "POST",
                path: "/v1/rooms".into(),
                body: Some(json!({"id": id, "name": id, "options": opts})),
                also_ok: vec![409],
            })
            .collect()
    }

    fn handshake(&self, msg: Option<&[u8]>, join: &JoinSpec) -> Handshake {
        let Some(msg) = msg else {
            let mut frame = json!({
                "type": "join",
                "room": join.room,
                "name": join.name,
                "platform": join.platform,
                "channels": join.channels,
            });
            if let Some(f) = frame.as_object_mut() {
                f.extend(join.extra.clone());
            }
            return Handshake::Send(vec![frame.to_string()]);
        };
        if msg.starts_with(br#"{"type":"joined""#) {
            return Handshake::Joined(Vec::new());
        }
        if msg.starts_with(br#"{"type":"error""#) || msg.starts_with(br#"{"type":"resync""#) {
            return Handshake::Failed(String::from_utf8_lossy(msg).into_owned());
        }
        Handshake::Wait
    }

    fn publish(
        &self,
        room: &str,
        channel: Option<&str>,
        event: &str,
        payload: &str,
        out: &mut String,
    ) {
        let room = serde_json::to_string(room).unwrap_or_default();
        let event = serde_json::to_string(event).unwrap_or_default();
        out.push_str(r#"{"type":"publish","room":"#);
        out.push_str(&room);
        if let Some(c) = channel {
            out.push_str(r#","channel":"#);
            out.push_str(&serde_json::to_string(c).unwrap_or_default());
        }
        out.push_str(r#","event":"#);
        out.push_str(&event);
        out.push_str(r#","data":"#);
        out.push_str(payload);
        out.push('}');
    }

    fn publish_chat(
        &self,
        room: &str,
        msg: ChatMessage<'_>,
        payload: &str,
        out: &mut String,
    ) -> bool {
        out.push_str(r#"{"type":"publish","room":"#);
        out.push_str(&serde_json::to_string(room).unwrap_or_default());
        out.push_str(r#","event":"chat","topic":"#);
        out.push_str(&serde_json::to_string(msg.topic).unwrap_or_default());
        if let Some(r) = msg.reply_to {
            out.push_str(&format!(r#","reply_to":{r}"#));
        }
        out.push_str(r#","id":"#);
        out.push_str(&serde_json::to_string(msg.id).unwrap_or_default());
        out.push_str(r#","data":"#);
        out.push_str(payload);
        out.push('}');
        true
    }

    fn ack_id_seq(&self, msg: &[u8]) -> Option<(String, u64)> {
        #[derive(serde::Deserialize)]
        struct Ack {
            id: String,
            seq: u64,
        }
        let a: Ack = serde_json::from_slice(msg).ok()?;
        Some((a.id, a.seq))
    }

    fn request(
        &self,
        room: &str,
        nonce: u64,
        op: &str,
        args: &serde_json::Value,
        out: &mut String,
    ) -> bool {
        let frame =
            json!({"type": "request", "room": room, "nonce": nonce, "op": op, "args": args});
        out.push_str(&frame.to_string());
        true
    }

    fn classify(&self, msg: &[u8], _replies: &mut Vec<String>) -> Inbound {
        if msg.starts_with(b"[") {
            // A compact message (plaza.v1.compact): only messages are arrays.
            return Inbound::markers_in(msg);
        }
        if msg.starts_with(br#"{"type":"event""#) {
            if finder!(br#""kind":"space.moved""#).find(msg).is_some() {
                return Inbound::Deliveries(1);
            }
            if finder!(br#""kind":"proximity."#).find(msg).is_some() {
                return Inbound::Proximity;
            }
            return Inbound::markers_in(msg);
        }
        if msg.starts_with(br#"{"type":"batch""#) {
            // Held by a delivery policy: whole event frames, each with its marker.
            return Inbound::markers_in(msg);
        }
        if msg.starts_with(br#"{"type":"ack""#) {
            return Inbound::Ack;
        }
        if msg.starts_with(br#"{"type":"response""#) {
            let v: serde_json::Value = serde_json::from_slice(msg).unwrap_or_default();
            return match v["nonce"].as_u64() {
                Some(nonce) => Inbound::Response {
                    nonce,
                    ok: v["ok"] == true,
                },
                None => Inbound::Error(format!("response without a numeric nonce: {v}")),
            };
        }
        if msg.starts_with(br#"{"type":"error""#) {
            let v: serde_json::Value = serde_json::from_slice(msg).unwrap_or_default();
            return Inbound::Error(v["code"].as_str().unwrap_or("error").to_owned());
        }
        Inbound::Other
    }

    fn acks_publishes(&self) -> bool {
        true
    }

    fn sent_at_us(&self, msg: &[u8]) -> Option<u64> {
        // A movement's start (the server's clock, ms): its latency is from the
        // server's ordering to the receipt. A compact message (an array) is
        // always a room message: not looked through for one.
        if !msg.starts_with(b"[") && finder!(br#""kind":"space.moved""#).find(msg).is_some() {
            let at = finder!(br#""t0":"#).find(msg)? + 5;
            let digits = msg[at..].iter().take_while(|b| b.is_ascii_digit());
            let ms = digits.fold(0u64, |v, d| {
                v.saturating_mul(10).saturating_add(u64::from(d - b'0'))
            });
            return Some(ms.saturating_mul(1000));
        }
        super::first_timestamp(msg)
    }
}

/// Percent-encodes all but RFC 3986's unreserved characters, for a query
/// value.
fn query_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::driver::classified;

    fn spec() -> JoinSpec {
        JoinSpec {
            room: "r-0".into(),
            name: "u1".into(),
            platform: "browser".into(),
            channels: vec![],
            extra: Default::default(),
        }
    }

    #[test]
    fn the_url_names_the_room_for_the_load_balancer() {
        let d = PlazaDriver::default();
        assert_eq!(
            d.ws_path_for(Some("explorviz-3")),
            "/v1/ws?room=explorviz-3"
        );
        assert_eq!(
            d.ws_path_for(Some("a b&c/é")),
            "/v1/ws?room=a%20b%26c%2F%C3%A9"
        );
        assert_eq!(d.ws_path_for(None), "/v1/ws");
        // Other protocols keep their one path.
        let other = crate::driver::BroadcastDriver;
        assert_eq!(other.ws_path_for(Some("r")), other.ws_path());
    }

    #[test]
    fn chat_messages_carry_topic_reply_and_id_and_joins_their_extra_fields() {
        let d = PlazaDriver::default();
        let mut out = String::new();
        let msg = ChatMessage {
            topic: "t2",
            reply_to: Some(41),
            id: "c2-7",
        };
        assert!(d.publish_chat("r-0", msg, r#"{"bt":1}"#, &mut out));
        let v: serde_json::Value = serde_json::from_str(&out).unwrap();
        assert_eq!(
            v,
            json!({"type": "publish", "room": "r-0", "event": "chat", "topic": "t2",
                "reply_to": 41, "id": "c2-7", "data": {"bt": 1}})
        );
        let mut spec = spec();
        spec.extra.insert("history".into(), json!({"last": 100}));
        let Handshake::Send(frames) = d.handshake(None, &spec) else {
            panic!()
        };
        let v: serde_json::Value = serde_json::from_str(&frames[0]).unwrap();
        assert_eq!(v["history"], json!({"last": 100}));
    }

    #[test]
    fn joins_with_a_join_frame_and_waits_for_joined() {
        let d = PlazaDriver::default();
        let Handshake::Send(frames) = d.handshake(None, &spec()) else {
            panic!()
        };
        let v: serde_json::Value = serde_json::from_str(&frames[0]).unwrap();
        assert_eq!(v["type"], "join");
        assert_eq!(v["room"], "r-0");
        assert_eq!(
            d.handshake(Some(br#"{"type":"joined","room":"r-0"}"#), &spec()),
            Handshake::Joined(vec![])
        );
        assert!(matches!(
            d.handshake(Some(br#"{"type":"error","code":"room_full"}"#), &spec()),
            Handshake::Failed(_)
        ));
    }

    #[test]
    fn publishes_valid_frames_and_classifies_what_comes_back() {
        let d = PlazaDriver::default();
        let mut out = String::new();
        d.publish("r\"0", Some("xr"), "b", r#"{"bt":12,"p":"x"}"#, &mut out);
        let v: serde_json::Value = serde_json::from_str(&out).unwrap();
        assert_eq!(v["room"], "r\"0");
        assert_eq!(v["channel"], "xr");
        assert_eq!(v["data"]["bt"], 12);
        assert_eq!(
            classified(&d, br#"{"type":"event","kind":"message","data":{"bt":12}}"#).0,
            Inbound::Deliveries(1)
        );
        assert_eq!(
            classified(&d, br#"{"type":"event","kind":"presence.join"}"#).0,
            Inbound::Other
        );
        assert_eq!(classified(&d, br#"{"type":"ack","seq":4}"#).0, Inbound::Ack);
        assert_eq!(
            classified(
                &d,
                br#"{"type":"batch","events":[{"data":{"bt":1}},{"data":{"bt":2}}]}"#
            )
            .0,
            Inbound::Deliveries(2)
        );
        assert_eq!(
            d.ack_id_seq(br#"{"type":"ack","room":"r","seq":9,"id":"c1-4"}"#),
            Some(("c1-4".into(), 9))
        );
        assert_eq!(d.ack_id_seq(br#"{"type":"ack","room":"r","seq":9}"#), None);
        assert_eq!(
            classified(&d, br#"{"type":"response","room":"r","nonce":7,"ok":true}"#).0,
            Inbound::Response { nonce: 7, ok: true }
        );
        assert_eq!(
            classified(&d, br#"{"type":"error","code":"rate_limited"}"#).0,
            Inbound::Error("rate_limited".into())
        );
    }
}
