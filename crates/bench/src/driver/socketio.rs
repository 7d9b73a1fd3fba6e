//! Socket.IO v4 (Engine.IO v4) straight over a WebSocket, without the
//! long-polling start a browser client makes.
//!
//! Every Engine.IO packet is one text message starting with its type digit;
//! Socket.IO packets ride in Engine.IO `4` (message) packets, so they start
//! with `4` and their own type: `40` connect, `41` disconnect, `42` event,
//! `44` connect error. The peer server this targets has two events: `join`
//! (join a room, no acknowledgement) and `msg` (relayed to the sender's rooms,
//! the sender excluded).

use super::{Driver, Handshake, Inbound, JoinSpec};

/// Socket.IO over `/socket.io/?EIO=4&transport=websocket`.
#[derive(Debug, Clone, Copy, Default)]
pub struct SocketIoDriver;

impl Driver for SocketIoDriver {
    fn name(&self) -> &'static str {
        "socketio"
    }

    fn ws_path(&self) -> String {
        "/socket.io/?EIO=4&transport=websocket".into()
    }

    fn handshake(&self, msg: Option<&[u8]>, join: &JoinSpec) -> Handshake {
        // The server speaks first (Engine.IO open), so there is nothing to
        // send when the socket opens.
        let Some(msg) = msg else {
            return Handshake::Wait;
        };
        match msg {
            // Engine.IO open: connect to the main namespace.
            [b'0', b'{', ..] => Handshake::Send(vec!["40".into()]),
            // Namespace connected. The `join` event has no acknowledgement,
            // so the user counts as joined once the event is sent; the server
            // handles one socket's packets in order, so its own later
            // publishes already go to the room.
            [b'4', b'0', ..] => {
                let room = serde_json::to_string(&join.room).unwrap_or_default();
                Handshake::Joined(vec![format!("42[\"join\",{room}]")])
            }
            [b'4', b'4', ..] => Handshake::Failed(String::from_utf8_lossy(msg).into_owned()),
            // An Engine.IO ping during a slow join: answer it, or the server
            // drops the connection.
            b"2" => Handshake::Send(vec!["3".into()]),
            _ => Handshake::Wait,
        }
    }

    fn publish(
        &self,
        _room: &str,
        _channel: Option<&str>,
        _event: &str,
        payload: &str,
        out: &mut String,
    ) {
        // The server relays `msg` to every room the sender joined, so the
        // room is implied and channels do not exist.
        out.push_str("42[\"msg\",");
        out.push_str(payload);
        out.push(']');
    }

    fn request(&self, _: &str, _: u64, _: &str, _: &serde_json::Value, _: &mut String) -> bool {
        false
    }

    fn classify(&self, msg: &[u8], replies: &mut Vec<String>) -> Inbound {
        match msg {
            [b'4', b'2', ..] => Inbound::markers_in(msg),
            // Engine.IO ping: a client that does not answer is dropped after
            // pingInterval + pingTimeout (45 s by default).
            b"2" => {
                replies.push("3".into());
                Inbound::Other
            }
            // The server left the namespace or refused it: the connection
            // may stay open but nothing more will arrive, so say so.
            b"41" => Inbound::Error("disconnected by the server".into()),
            [b'4', b'4', ..] => Inbound::Error(String::from_utf8_lossy(msg).into_owned()),
            _ => Inbound::Other,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::driver::classified;

    fn spec() -> JoinSpec {
        JoinSpec {
            room: "r\"0".into(),
            name: "u1".into(),
            platform: "browser".into(),
            channels: vec![],
            extra: Default::default(),
        }
    }

    #[test]
    fn waits_for_open_connects_the_namespace_then_joins_the_room() {
        let d = SocketIoDriver;
        assert_eq!(d.handshake(None, &spec()), Handshake::Wait);
        let open = br#"0{"sid":"a","upgrades":[],"pingInterval":25000,"pingTimeout":20000,"maxPayload":1000000}"#;
        assert_eq!(
            d.handshake(Some(open), &spec()),
            Handshake::Send(vec!["40".into()])
        );
        let Handshake::Joined(frames) = d.handshake(Some(br#"40{"sid":"b"}"#), &spec()) else {
            panic!()
        };
        assert_eq!(frames.len(), 1);
        let v: serde_json::Value = serde_json::from_str(&frames[0][2..]).unwrap();
        assert_eq!(v, serde_json::json!(["join", "r\"0"]));
        assert!(frames[0].starts_with("42"));
        assert!(matches!(
            d.handshake(Some(br#"44{"message":"Not authorized"}"#), &spec()),
            Handshake::Failed(_)
        ));
        assert_eq!(
            d.handshake(Some(b"2"), &spec()),
            Handshake::Send(vec!["3".into()])
        );
        assert_eq!(d.handshake(Some(b"6"), &spec()), Handshake::Wait);
    }

    #[test]
    fn publishes_msg_events_and_classifies_what_comes_back() {
        let d = SocketIoDriver;
        let mut out = String::new();
        d.publish("r", Some("c"), "b", r#"{"bt":12,"p":"x"}"#, &mut out);
        assert_eq!(out, r#"42["msg",{"bt":12,"p":"x"}]"#);
        assert!(!d.request("r", 1, "op", &serde_json::Value::Null, &mut out));
        assert!(!d.echoes_sender());
        assert_eq!(
            classified(&d, br#"42["msg",{"bt":12,"p":"x"}]"#).0,
            Inbound::Deliveries(1)
        );
        assert_eq!(classified(&d, br#"42["other",{}]"#).0, Inbound::Other);
        assert_eq!(classified(&d, b"2"), (Inbound::Other, vec!["3".into()]));
        assert!(matches!(classified(&d, b"41").0, Inbound::Error(_)));
        assert!(matches!(
            classified(&d, br#"44{"message":"x"}"#).0,
            Inbound::Error(_)
        ));
        assert_eq!(classified(&d, b"6").0, Inbound::Other);
        assert_eq!(classified(&d, b"").0, Inbound::Other);
    }

    /// Against a live Socket.IO peer (`PLAZA_BENCH_PEER_SOCKETIO=host:port`):
    /// two users join one room, one publishes, the other receives it.
    #[tokio::test]
    #[ignore = "needs a Socket.IO server: PLAZA_BENCH_PEER_SOCKETIO=127.0.0.1:3000"]
    async fn live_peer_relays_a_publish_to_the_other_member() {
        // Ignored unless asked for: asked for without its peer, it fails
        // rather than pass having checked nothing.
        let addr = std::env::var("PLAZA_BENCH_PEER_SOCKETIO")
            .expect("PLAZA_BENCH_PEER_SOCKETIO=host:port names the peer this test runs against");
        let addr: std::net::SocketAddr = addr.parse().expect("host:port");
        let d = SocketIoDriver;
        let room = format!("live-{}", rand::random::<u32>());
        let run = async {
            let (_ra, mut wa) = live_join(addr, &d, &room).await;
            let (mut rb, mut wb) = live_join(addr, &d, &room).await;
            let mut frame = String::new();
            d.publish(&room, None, "msg", r#"{"bt":123,"p":"x"}"#, &mut frame);
            // `join` has no acknowledgement: B may not be in the room when A
            // publishes, so publish again until B hears one.
            loop {
                wa.send_text(frame.as_bytes()).await.unwrap();
                let heard = tokio::time::timeout(std::time::Duration::from_millis(300), async {
                    loop {
                        for m in crate::session::next_messages(&mut rb, &mut wb)
                            .await
                            .unwrap()
                        {
                            match classified(&d, &m).0 {
                                Inbound::Other => {}
                                other => return other,
                            }
                        }
                    }
                })
                .await;
                if let Ok(inbound) = heard {
                    assert_eq!(inbound, Inbound::Deliveries(1));
                    return;
                }
            }
        };
        tokio::time::timeout(std::time::Duration::from_secs(10), run)
            .await
            .expect("timed out");
    }

    /// Connects and joins `room` as a user of driver `d`.
    async fn live_join(
        addr: std::net::SocketAddr,
        d: &dyn Driver,
        room: &str,
    ) -> (crate::transport::Reader, crate::transport::Writer) {
        let (mut r, mut w) = crate::session::connect(addr, &addr.to_string(), d, None)
            .await
            .unwrap();
        let spec = JoinSpec {
            room: room.into(),
            name: "u".into(),
            platform: "browser".into(),
            channels: vec![],
            extra: Default::default(),
        };
        crate::session::join(&mut r, &mut w, d, &spec)
            .await
            .unwrap();
        (r, w)
    }
}
