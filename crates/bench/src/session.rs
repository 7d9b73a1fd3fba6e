//! Opening a user's session: connect, then run the driver's join handshake.
//! One implementation for the runner and the drivers' live tests.

use std::io;
use std::net::{IpAddr, SocketAddr};

use crate::driver::{Driver, Handshake, JoinSpec};
use crate::transport::{self, Endpoint, Reader, Transport, Writer};
use crate::wsclient::Incoming;

/// Connects to `addr` on the driver's WebSocket path.
pub async fn connect(
    addr: SocketAddr,
    host: &str,
    driver: &dyn Driver,
    bind: Option<IpAddr>,
) -> io::Result<(Reader, Writer)> {
    let at = Endpoint {
        addr,
        host,
        bind,
        tally: None,
    };
    connect_for(&at, driver, None, Transport::WebSocket, false).await
}

/// Connects to `at` over `transport` for a user whose first join is to
/// `room` ([`Driver::ws_path_for`], [`Driver::sessions_path_for`]: Plaza
/// names it in the URL, for a cluster's load balancer to route on), offering
/// permessage-deflate if `deflate` (WebSocket).
pub async fn connect_for(
    at: &Endpoint<'_>,
    driver: &dyn Driver,
    room: Option<&str>,
    transport: Transport,
    deflate: bool,
) -> io::Result<(Reader, Writer)> {
    let sessions = driver.sessions_path_for(room);
    let path = driver.ws_path_for(room);
    let ws = transport::WsOffer {
        path: &path,
        subprotocol: driver.subprotocol(),
    };
    transport::connect(at, transport, ws, sessions.as_deref(), deflate).await
}

/// The messages of the next read (at least one), answering pings meanwhile.
pub async fn next_messages(r: &mut Reader, w: &mut Writer) -> Result<Vec<Vec<u8>>, String> {
    let mut out = Vec::new();
    while out.is_empty() {
        let mut pings: Vec<Vec<u8>> = Vec::new();
        let mut closed = None;
        let n = r
            .read_some(|m| match m {
                Incoming::Message(b) => out.push(b.to_vec()),
                Incoming::Ping(p) => pings.push(p.to_vec()),
                Incoming::Close(c) => closed = Some(c),
            })
            .await
            .map_err(|e| e.kind().to_string())?;
        if n == 0 {
            return Err("closed by server".into());
        }
        if let Some(code) = closed {
            return Err(format!("closed by server: {code:?}"));
        }
        for p in pings {
            w.pong(&p).await.map_err(|e| e.kind().to_string())?;
        }
    }
    Ok(out)
}

/// Runs the join handshake. Returns the messages that arrived in the same
/// read as the one completing the join, for the caller to count.
pub async fn join(
    r: &mut Reader,
    w: &mut Writer,
    driver: &dyn Driver,
    spec: &JoinSpec,
) -> Result<Vec<Vec<u8>>, String> {
    let mut step = driver.handshake(None, spec);
    let mut rest: Vec<Vec<u8>> = Vec::new();
    loop {
        match step {
            Handshake::Joined(frames) => {
                send_all(w, frames).await?;
                return Ok(rest);
            }
            Handshake::Send(frames) => send_all(w, frames).await?,
            Handshake::Failed(why) => {
                return Err(format!(
                    "join refused: {}",
                    why.chars().take(200).collect::<String>()
                ))
            }
            Handshake::Wait => {}
        }
        step = Handshake::Wait;
        let mut msgs = next_messages(r, w).await?.into_iter();
        for m in msgs.by_ref() {
            step = driver.handshake(Some(&m), spec);
            if step != Handshake::Wait {
                break;
            }
        }
        rest = msgs.collect();
    }
}

async fn send_all(w: &mut Writer, frames: Vec<String>) -> Result<(), String> {
    for f in frames {
        w.send_text(f.as_bytes())
            .await
            .map_err(|e| e.kind().to_string())?;
    }
    Ok(())
}
