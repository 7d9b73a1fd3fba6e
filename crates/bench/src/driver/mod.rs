//! Protocol drivers: how a virtual user joins, publishes, requests and
//! recognises what it receives, for each kind of server.
//!
//! The runner owns sockets, timing and counting; a driver only builds frames
//! and classifies received messages. Classification runs for every received
//! message, so it looks at a few bytes first and parses JSON only for the rare
//! frames that need it (joins, responses, errors).

mod broadcast;
mod centrifugo;
mod plaza;
mod socketio;

pub use broadcast::BroadcastDriver;
pub use centrifugo::CentrifugoDriver;
pub use plaza::PlazaDriver;
pub use socketio::SocketIoDriver;

/// The marker publishers put before their send timestamp in every payload:
/// `{"bt":<unix µs>,...}`. Receivers count deliveries by counting markers, so
/// servers that pack several messages in one frame are counted right.
pub const MARKER: &[u8] = b"\"bt\":";

/// The searcher for a constant needle, built once. `memchr::memmem::find`
/// builds one on every call: at a few million messages a second that was a
/// third of the generator's time, and more for a driver that looks for more
/// needles in each message.
macro_rules! finder {
    ($needle:expr) => {{
        static FINDER: std::sync::LazyLock<memchr::memmem::Finder<'static>> =
            std::sync::LazyLock::new(|| memchr::memmem::Finder::new($needle));
        &*FINDER
    }};
}
pub(crate) use finder;

/// What a virtual user joins with.
#[derive(Debug, Clone)]
pub struct JoinSpec {
    /// Room id.
    pub room: String,
    /// Display name.
    pub name: String,
    /// Platform (Plaza).
    pub platform: String,
    /// Channels besides the main one.
    pub channels: Vec<String>,
    /// More fields of the join (Plaza: `policy`, `history`); other
    /// protocols have no such thing and ignore them.
    pub extra: serde_json::Map<String, serde_json::Value>,
}

/// One message of a replayed chat ([`Driver::publish_chat`]).
#[derive(Debug, Clone, Copy)]
pub struct ChatMessage<'a> {
    /// Its topic.
    pub topic: &'a str,
    /// The seq of the message it answers.
    pub reply_to: Option<u64>,
    /// A client message id, unique in the run (its ack names it).
    pub id: &'a str,
}

/// The next step of a join handshake.
#[derive(Debug, PartialEq, Eq)]
pub enum Handshake {
    /// Send these messages, then wait for more.
    Send(Vec<String>),
    /// Send these messages; the user has joined.
    Joined(Vec<String>),
    /// Nothing to do: wait for the next message.
    Wait,
    /// The join failed.
    Failed(String),
}

/// What a received message is, once the user has joined. Messages to send
/// back (protocol-level pings of some servers) are not a kind of message but
/// an output of [`Driver::classify`]: a server may batch a ping with
/// publications in one frame, and both must be acted on.
#[derive(Debug, PartialEq, Eq)]
pub enum Inbound {
    /// This many published messages (markers).
    Deliveries(usize),
    /// The acknowledgement of one of this user's publishes.
    Ack,
    /// The response to request `nonce`.
    Response {
        /// The nonce the runner gave the request.
        nonce: u64,
        /// Whether it succeeded.
        ok: bool,
    },
    /// The server reported an error.
    Error(String),
    /// A spatial room's proximity change (`proximity.enter` / `proximity.leave`).
    Proximity,
    /// Anything else (presence, other events).
    Other,
}

/// Setup the server needs before users arrive (Plaza: create the rooms).
#[derive(Debug, Clone, PartialEq)]
pub struct HttpCall {
    /// `POST`, `GET`, ...
    pub method: &'static str,
    /// Path under the target's base URL.
    pub path: String,
    /// JSON body.
    pub body: Option<serde_json::Value>,
    /// Status codes that count as success besides 2xx (e.g. 409: exists).
    pub also_ok: Vec<u16>,
}

/// A protocol.
pub trait Driver: Send + Sync {
    /// Short name (`plaza`, `broadcast`, ...).
    fn name(&self) -> &'static str;
    /// Path (and query) of the WebSocket endpoint.
    fn ws_path(&self) -> String;

    /// The WebSocket subprotocol to offer, if the protocol has one worth asking for.
    fn subprotocol(&self) -> Option<&'static str> {
        None
    }
    /// Path (and query) of the WebSocket endpoint for a user whose first join
    /// is to `room` (`None`: unknown). A protocol whose clients name the room
    /// in the URL, for a load balancer to route on, puts it there; the
    /// default is [`ws_path`](Self::ws_path).
    fn ws_path_for(&self, room: Option<&str>) -> String {
        let _ = room;
        self.ws_path()
    }
    /// Path (and query) where an HTTP transport session is opened for a user
    /// whose first join is to `room`; `None` (the default): the protocol
    /// has WebSocket only.
    fn sessions_path_for(&self, room: Option<&str>) -> Option<String> {
        let _ = room;
        None
    }
    /// Whether the publisher receives its own messages (then it counts as a
    /// recipient).
    fn echoes_sender(&self) -> bool {
        false
    }
    /// HTTP calls to make once before the run, for these room ids, with
    /// the scenario's `room_options`.
    fn setup(
        &self,
        rooms: &[String],
        options: &serde_json::Map<String, serde_json::Value>,
    ) -> Vec<HttpCall> {
        let _ = (rooms, options);
        Vec::new()
    }
    /// The handshake step after the socket opened (`msg` is `None`) or after
    /// message `msg` arrived.
    fn handshake(&self, msg: Option<&[u8]>, join: &JoinSpec) -> Handshake;
    /// Appends one publish message carrying `payload` (a JSON object) to `out`.
    fn publish(
        &self,
        room: &str,
        channel: Option<&str>,
        event: &str,
        payload: &str,
        out: &mut String,
    );
    /// Appends one chat message (topic, reply, id) carrying `payload` to
    /// `out`; false if the protocol has no such thing (the default).
    fn publish_chat(
        &self,
        room: &str,
        msg: ChatMessage<'_>,
        payload: &str,
        out: &mut String,
    ) -> bool {
        let _ = (room, msg, payload, out);
        false
    }
    /// The client message id and seq an acknowledgement names, if any.
    fn ack_id_seq(&self, msg: &[u8]) -> Option<(String, u64)> {
        let _ = msg;
        None
    }
    /// Appends one request message to `out`; false if the protocol has no requests.
    fn request(
        &self,
        room: &str,
        nonce: u64,
        op: &str,
        args: &serde_json::Value,
        out: &mut String,
    ) -> bool;
    /// When a delivered message was sent, unix µs, for its latency: the
    /// timestamp a publish carries after its marker (Plaza's `space.moved`
    /// events carry the server's start of the movement instead).
    fn sent_at_us(&self, msg: &[u8]) -> Option<u64> {
        first_timestamp(msg)
    }

    /// Classifies a message received after joining, pushing onto `replies`
    /// anything the protocol requires sending back (e.g. pongs).
    fn classify(&self, msg: &[u8], replies: &mut Vec<String>) -> Inbound;
    /// Whether this user's publishes are acknowledged (then the runner
    /// counts acks).
    fn acks_publishes(&self) -> bool {
        false
    }
}

/// The driver called `name`.
pub fn by_name(name: &str) -> Result<std::sync::Arc<dyn Driver>, String> {
    match name {
        "plaza" => Ok(std::sync::Arc::new(PlazaDriver::default())),
        "plaza-compact" => Ok(std::sync::Arc::new(PlazaDriver { compact: true })),
        "broadcast" | "reference" => Ok(std::sync::Arc::new(BroadcastDriver)),
        "socketio" => Ok(std::sync::Arc::new(SocketIoDriver)),
        "centrifugo" => Ok(std::sync::Arc::new(CentrifugoDriver)),
        _ => Err(format!(
            "unknown driver {name:?} (one of: {})",
            DRIVERS.join(", ")
        )),
    }
}

/// Names accepted by [`by_name`].
pub const DRIVERS: &[&str] = &[
    "plaza",
    "plaza-compact",
    "broadcast",
    "socketio",
    "centrifugo",
];

impl Inbound {
    /// The published messages in `msg`: `Deliveries` when it holds markers,
    /// else `Other`.
    pub fn markers_in(msg: &[u8]) -> Inbound {
        match count_markers(msg) {
            0 => Inbound::Other,
            n => Inbound::Deliveries(n),
        }
    }
}

/// Counts markers in `msg`.
pub fn count_markers(msg: &[u8]) -> usize {
    finder!(MARKER).find_iter(msg).count()
}

/// The send timestamp after the first marker in `msg`, in unix µs.
pub fn first_timestamp(msg: &[u8]) -> Option<u64> {
    let at = finder!(MARKER).find(msg)? + MARKER.len();
    number_at(msg, at)
}

/// The send timestamps after every marker in `msg` (several messages in
/// one frame: a batch), in unix µs, with the position after each.
pub fn timestamps(msg: &[u8]) -> impl Iterator<Item = (u64, usize)> + '_ {
    finder!(MARKER).find_iter(msg).filter_map(move |at| {
        let at = at + MARKER.len();
        let v = number_at(msg, at)?;
        let digits = msg[at..].iter().take_while(|b| b.is_ascii_digit()).count();
        Some((v, at + digits))
    })
}

/// The decimal number at `at`.
fn number_at(msg: &[u8], at: usize) -> Option<u64> {
    let digits = msg[at..].iter().take_while(|b| b.is_ascii_digit());
    let mut v: u64 = 0;
    let mut any = false;
    for d in digits {
        v = v.checked_mul(10)?.checked_add(u64::from(d - b'0'))?;
        any = true;
    }
    any.then_some(v)
}

/// A message's classification and the replies it asks for (for tests).
#[cfg(test)]
pub(crate) fn classified(d: &dyn Driver, msg: &[u8]) -> (Inbound, Vec<String>) {
    let mut replies = Vec::new();
    let kind = d.classify(msg, &mut replies);
    (kind, replies)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn markers_are_counted_and_the_first_timestamp_read() {
        let one = br#"{"type":"event","data":{"bt":1732350000123456,"p":"xx"}}"#;
        assert_eq!(count_markers(one), 1);
        assert_eq!(first_timestamp(one), Some(1_732_350_000_123_456));
        let two = b"{\"push\":{\"data\":{\"bt\":5}}}\n{\"push\":{\"data\":{\"bt\":6}}}";
        assert_eq!(count_markers(two), 2);
        assert_eq!(first_timestamp(two), Some(5));
        assert_eq!(count_markers(b"{\"type\":\"ack\"}"), 0);
        assert_eq!(first_timestamp(b"{\"bt\":x}"), None);
        let stamps: Vec<u64> = timestamps(two).map(|(t, _)| t).collect();
        assert_eq!(stamps, [5, 6]);
    }
}
