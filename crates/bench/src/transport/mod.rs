//! How a virtual user's frames travel: a WebSocket, or one of Plaza's HTTP
//! transports (server-sent events, long polling, interval polling).
//!
//! The runner reads and writes through [`Reader`] and [`Writer`] whatever the
//! transport; every byte they move is counted at the socket in a
//! [`SocketTally`], so transports compare by what they put on the wire
//! (source document 004's experiment).

mod counted;
mod http;

use std::io;
use std::net::{IpAddr, SocketAddr};
use std::str::FromStr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

pub use counted::Counted;
pub use http::{HttpReader, HttpWriter};

use crate::wsclient::{self, Incoming, WsReader, WsWriter};

/// A transport a user connects over.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Transport {
    /// One WebSocket (every driver).
    #[default]
    WebSocket,
    /// Plaza: an event stream (`GET .../events`) for server frames, `POST
    /// .../send` for client frames.
    Sse,
    /// Plaza: a poll held until frames are ready (`GET .../poll`), `POST
    /// .../send` for client frames.
    LongPolling,
    /// Plaza: a poll answered at once (`wait_ms=0`), made on a fixed
    /// cadence: the document's "polling" prototype, which asked every second.
    Polling {
        /// Time between the starts of two polls.
        every: Duration,
    },
}

/// The interval of [`Transport::Polling`] when none is given: source
/// document 004's polling prototype asked once a second.
pub const DEFAULT_POLL_EVERY: Duration = Duration::from_secs(1);

impl Transport {
    /// Short name, as accepted by [`FromStr`].
    pub fn name(&self) -> String {
        match self {
            Transport::WebSocket => "websocket".into(),
            Transport::Sse => "sse".into(),
            Transport::LongPolling => "long-polling".into(),
            Transport::Polling { every } if *every == DEFAULT_POLL_EVERY => "polling".into(),
            Transport::Polling { every } => format!("polling:{}", every.as_millis()),
        }
    }
}

impl FromStr for Transport {
    type Err = String;

    /// `websocket`, `sse`, `long-polling`, `polling` or `polling:<ms>`.
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "websocket" | "ws" => Ok(Transport::WebSocket),
            "sse" => Ok(Transport::Sse),
            "long-polling" | "long_polling" => Ok(Transport::LongPolling),
            "polling" => Ok(Transport::Polling {
                every: DEFAULT_POLL_EVERY,
            }),
            _ => match s.strip_prefix("polling:").map(str::parse::<u64>) {
                Some(Ok(ms)) if ms > 0 => Ok(Transport::Polling {
                    every: Duration::from_millis(ms),
                }),
                _ => Err(format!(
                    "unknown transport {s:?} (one of: websocket, sse, long-polling, polling, polling:<ms>)"
                )),
            },
        }
    }
}

impl<'de> serde::Deserialize<'de> for Transport {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

/// Bytes moved at the sockets of a run's connections (TCP payload: HTTP
/// headers and WebSocket framing included, IP and TCP headers not), and the
/// HTTP requests the transports made.
#[derive(Debug, Default)]
pub struct SocketTally {
    /// Bytes read from the server.
    pub read: AtomicU64,
    /// Bytes written to the server.
    pub written: AtomicU64,
    /// HTTP requests made by HTTP transports (opening, sends, polls, streams, closing).
    pub requests: AtomicU64,
}

impl SocketTally {
    /// `(read, written, requests)` now.
    pub fn load(&self) -> (u64, u64, u64) {
        (
            self.read.load(Ordering::Relaxed),
            self.written.load(Ordering::Relaxed),
            self.requests.load(Ordering::Relaxed),
        )
    }

    pub(crate) fn add_read(&self, n: usize) {
        self.read.fetch_add(n as u64, Ordering::Relaxed);
    }

    pub(crate) fn add_written(&self, n: usize) {
        self.written.fetch_add(n as u64, Ordering::Relaxed);
    }
}

/// Where to connect and how.
#[derive(Debug, Clone)]
pub struct Endpoint<'a> {
    /// The server.
    pub addr: SocketAddr,
    /// Host header value.
    pub host: &'a str,
    /// Local address to connect from (spreads many users over 127.0.0.x).
    pub bind: Option<IpAddr>,
    /// Counts the bytes of the connection.
    pub tally: Option<Arc<SocketTally>>,
}

/// The receiving side of a user's connection.
pub enum Reader {
    /// A WebSocket.
    Ws(WsReader),
    /// An HTTP transport.
    Http(HttpReader),
}

/// The sending side of a user's connection.
pub enum Writer {
    /// A WebSocket.
    Ws(WsWriter),
    /// An HTTP transport.
    Http(HttpWriter),
}

impl Reader {
    /// Waits for data and hands every complete message (and WebSocket control
    /// frame) to `on`. Returns the bytes read; 0 means the server closed.
    pub async fn read_some(&mut self, on: impl FnMut(Incoming<'_>)) -> io::Result<usize> {
        match self {
            Reader::Ws(r) => r.read_some(on).await,
            Reader::Http(r) => r.read_some(on).await,
        }
    }
}

impl Writer {
    /// Sends one text message (one client frame).
    pub async fn send_text(&mut self, msg: &[u8]) -> io::Result<()> {
        match self {
            Writer::Ws(w) => w.send_text(msg).await,
            Writer::Http(w) => w.send(msg).await,
        }
    }

    /// Answers a WebSocket ping (HTTP transports have none).
    pub async fn pong(&mut self, payload: &[u8]) -> io::Result<()> {
        match self {
            Writer::Ws(w) => w.pong(payload).await,
            Writer::Http(_) => Ok(()),
        }
    }

    /// Ends the connection (an HTTP transport ends its session).
    pub async fn close(&mut self, code: u16) -> io::Result<()> {
        match self {
            Writer::Ws(w) => w.close(code).await,
            Writer::Http(w) => w.close().await,
        }
    }
}

/// Opens a connection over `transport`: a WebSocket at `ws.path` (offering
/// permessage-deflate if `deflate`, and `ws.subprotocol`), or an HTTP
/// transport session opened at `sessions_path` (`None`: the protocol has none).
pub async fn connect(
    at: &Endpoint<'_>,
    transport: Transport,
    ws: WsOffer<'_>,
    sessions_path: Option<&str>,
    deflate: bool,
) -> io::Result<(Reader, Writer)> {
    if transport == Transport::WebSocket {
        let (r, w) = wsclient::connect_counted(
            at.addr,
            at.host,
            ws.path,
            at.bind,
            deflate,
            ws.subprotocol,
            at.tally.clone(),
        )
        .await?;
        return Ok((Reader::Ws(r), Writer::Ws(w)));
    }
    let Some(sessions) = sessions_path else {
        return Err(io::Error::other(format!(
            "the protocol has no {} transport",
            transport.name()
        )));
    };
    let (r, w) = http::open(at, transport, sessions).await?;
    Ok((Reader::Http(r), Writer::Http(w)))
}

/// Where a WebSocket connects and which subprotocol it offers.
#[derive(Debug, Clone, Copy)]
pub struct WsOffer<'a> {
    /// The path (and query) of the upgrade request.
    pub path: &'a str,
    /// The subprotocol to offer, if any.
    pub subprotocol: Option<&'a str>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transports_are_named_and_parsed_back() {
        for t in [
            Transport::WebSocket,
            Transport::Sse,
            Transport::LongPolling,
            Transport::Polling {
                every: DEFAULT_POLL_EVERY,
            },
            Transport::Polling {
                every: Duration::from_millis(250),
            },
        ] {
            assert_eq!(t.name().parse::<Transport>(), Ok(t));
        }
        assert_eq!("ws".parse(), Ok(Transport::WebSocket));
        assert!("polling:0".parse::<Transport>().is_err());
        assert!("carrier-pigeon"
            .parse::<Transport>()
            .unwrap_err()
            .contains("one of"));
    }
}
