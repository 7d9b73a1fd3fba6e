//! The node's TCP listener: how many connections a node holds at once, and
//! what the next one gets when it is full.
//!
//! Every connection holds a file descriptor, and a process has a fixed number
//! of them. A server that runs out cannot even accept the connection it would
//! refuse (`accept` fails with `EMFILE`), so it stops answering at all while
//! its other sockets, log files and Redis connections start failing too. Plaza
//! keeps a margin instead: beyond `max_connections` a new connection is read
//! up to its request head, answered `503` with a JSON error `server_full` and
//! closed, and the connections the node holds are not touched. Monitoring
//! still works on a full node: `GET /metrics` and `GET /healthz` are answered
//! from the same margin, then closed.

use std::io;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use metrics::Counter;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// The error code of a connection refused because the node is full.
pub const SERVER_FULL: &str = plaza_protocol::HttpErrorCode::ServerFull.as_str();

/// The error code of a connection refused because its address holds
/// `max_connections_per_ip` connections.
pub const TOO_MANY_CONNECTIONS: &str = plaza_protocol::HttpErrorCode::TooManyConnections.as_str();

/// File descriptors kept for everything but client connections (the
/// runtime, log files, Redis, files of `web_dir`), and for answering the
/// connections refused.
pub const RESERVED_FILES: u64 = 256 + MAX_REFUSING as u64;

/// Refusals answered at once; beyond that a refused connection is closed
/// without an answer (a flood must not take the descriptors that were kept).
const MAX_REFUSING: usize = 64;

/// How long a refused connection may take to send its request head.
const REFUSE_TIMEOUT: Duration = Duration::from_secs(2);

/// `max_connections` when the configuration leaves it 0: what the process's
/// open-files limit allows after [`RESERVED_FILES`], at least 16.
pub fn default_max_connections() -> usize {
    let limit = open_files_limit().unwrap_or(1024);
    limit.saturating_sub(RESERVED_FILES).max(16) as usize
}

/// The soft limit on open files of this process (`RLIMIT_NOFILE`), from
/// `/proc/self/limits`; `None` where that cannot be read or is unlimited.
pub fn open_files_limit() -> Option<u64> {
    let limits = std::fs::read_to_string("/proc/self/limits").ok()?;
    parse_open_files(&limits)
}

fn parse_open_files(limits: &str) -> Option<u64> {
    let line = limits.lines().find(|l| l.starts_with("Max open files"))?;
    line["Max open files".len()..]
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// What a full node still answers: for a request path, the status line
/// (`200 OK`), content type and body, or `None` to refuse.
pub type AnswerWhenFull =
    Arc<dyn Fn(&str) -> Option<(&'static str, &'static str, String)> + Send + Sync>;

/// A listener that admits at most a fixed number of connections at once.
pub struct LimitedListener {
    inner: TcpListener,
    open: Arc<Semaphore>,
    refusing: Arc<Semaphore>,
    refused: Counter,
    /// Named in the refusal's `x-plaza-node`, as on every answer.
    node_id: Arc<str>,
    when_full: AnswerWhenFull,
    /// Connections each client address may hold (0: no limit), and how many
    /// each holds.
    per_ip: usize,
    by_ip: Arc<std::sync::Mutex<std::collections::HashMap<IpAddr, usize>>>,
}

/// Why a connection is refused.
#[derive(Debug, Clone, Copy)]
enum Refusal {
    /// The node holds `max_connections`.
    Full,
    /// Its address holds `max_connections_per_ip`.
    TooManyFromAddress,
}

impl Refusal {
    fn status(self) -> &'static str {
        match self {
            Refusal::Full => "503 Service Unavailable",
            Refusal::TooManyFromAddress => "429 Too Many Requests",
        }
    }

    fn body(self) -> String {
        let (code, message) = match self {
            Refusal::Full => (
                SERVER_FULL,
                "this node holds as many connections as it may; try again later or another node",
            ),
            Refusal::TooManyFromAddress => (
                TOO_MANY_CONNECTIONS,
                "this address holds as many connections as one address may; close one first",
            ),
        };
        serde_json::json!({"error": {"code": code, "message": message}}).to_string()
    }
}

impl LimitedListener {
    /// Admits at most `max` connections of `inner` at once; each refusal is
    /// counted in `refused` and answered as node `node_id`, but for the
    /// `GET` requests `when_full` answers.
    pub fn new(
        inner: TcpListener,
        max: usize,
        refused: Counter,
        node_id: &str,
        when_full: AnswerWhenFull,
    ) -> LimitedListener {
        LimitedListener {
            inner,
            open: Arc::new(Semaphore::new(max)),
            refusing: Arc::new(Semaphore::new(MAX_REFUSING)),
            refused,
            node_id: node_id.into(),
            when_full,
            per_ip: 0,
            by_ip: Default::default(),
        }
    }

    /// Also admits at most `max` connections from one client address at
    /// once (0: no limit); beyond it `429 too_many_connections`.
    pub fn per_ip(mut self, max: usize) -> LimitedListener {
        self.per_ip = max;
        self
    }

    /// A place for a connection from `ip`, if its address may hold one more.
    fn take_ip_slot(&self, ip: IpAddr) -> Result<Option<IpSlot>, Refusal> {
        if self.per_ip == 0 {
            return Ok(None);
        }
        let mut by_ip = self.by_ip.lock().unwrap_or_else(|p| p.into_inner());
        let held = by_ip.entry(ip).or_insert(0);
        if *held >= self.per_ip {
            return Err(Refusal::TooManyFromAddress);
        }
        *held += 1;
        Ok(Some(IpSlot {
            ip,
            by_ip: self.by_ip.clone(),
        }))
    }

    /// The next admitted connection; refusals are answered meanwhile.
    async fn next(&mut self) -> (AdmittedStream, SocketAddr) {
        loop {
            let (stream, addr) = match self.inner.accept().await {
                Ok(accepted) => accepted,
                Err(e) => {
                    accept_failed(e).await;
                    continue;
                }
            };
            let admitted = self
                .open
                .clone()
                .try_acquire_owned()
                .map_err(|_| Refusal::Full)
                .and_then(|permit| Ok((permit, self.take_ip_slot(addr.ip())?)));
            match admitted {
                Ok((permit, ip)) => {
                    let place = ConnectionPlace {
                        _permit: permit,
                        _ip: ip,
                    };
                    return (
                        AdmittedStream {
                            inner: stream,
                            place,
                        },
                        addr,
                    );
                }
                Err(why) => {
                    let Ok(slot) = self.refusing.clone().try_acquire_owned() else {
                        self.refused.increment(1);
                        continue;
                    };
                    let (node, when_full) = (self.node_id.clone(), self.when_full.clone());
                    let refused = self.refused.clone();
                    tokio::spawn(async move {
                        let answer = refuse(stream, why, &node, &when_full, &refused);
                        let _ = tokio::time::timeout(REFUSE_TIMEOUT, answer).await;
                        drop(slot);
                    });
                }
            }
        }
    }
}

/// Answers a connection the node does not take: reads its request head (so
/// that closing does not reset the answer away), then the refusal (`503
/// server_full`, `429 too_many_connections`), or what `when_full` answers for
/// a `GET` of its path.
async fn refuse(
    mut stream: TcpStream,
    why: Refusal,
    node: &str,
    when_full: &AnswerWhenFull,
    refused: &Counter,
) -> io::Result<()> {
    let mut head = [0u8; 4096];
    let mut got = 0;
    while got < head.len() {
        let n = stream.read(&mut head[got..]).await?;
        if n == 0 {
            return Ok(());
        }
        got += n;
        if head[..got].windows(4).any(|w| w == b"\r\n\r\n") {
            break;
        }
    }
    let answered = std::str::from_utf8(&head[..got])
        .ok()
        .and_then(|h| h.lines().next())
        .and_then(|line| line.strip_prefix("GET "))
        .and_then(|rest| rest.split(' ').next())
        .map(|target| target.split('?').next().unwrap_or_default())
        .and_then(|path| when_full(path));
    let (status, content_type, body) = match answered {
        Some(answer) => answer,
        None => {
            refused.increment(1);
            (why.status(), "application/json", why.body())
        }
    };
    let retry = if status.starts_with("200") {
        ""
    } else {
        "retry-after: 5\r\n"
    };
    let answer = format!(
        "HTTP/1.1 {status}\r\ncontent-type: {content_type}\r\ncontent-length: {}\r\n\
         {retry}x-plaza-node: {node}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(answer.as_bytes()).await?;
    stream.shutdown().await
}

/// Waits after an accept error that is not the client's doing (`EMFILE`:
/// the process is out of descriptors), so the loop does not spin.
async fn accept_failed(e: io::Error) {
    if matches!(
        e.kind(),
        io::ErrorKind::ConnectionRefused
            | io::ErrorKind::ConnectionAborted
            | io::ErrorKind::ConnectionReset
    ) {
        return;
    }
    tracing::error!(error = %e, "accept failed; retrying in 1 s");
    tokio::time::sleep(Duration::from_secs(1)).await;
}

impl axum::serve::Listener for LimitedListener {
    type Io = AdmittedStream;
    type Addr = SocketAddr;

    fn accept(&mut self) -> impl std::future::Future<Output = (Self::Io, Self::Addr)> + Send {
        self.next()
    }

    fn local_addr(&self) -> io::Result<SocketAddr> {
        self.inner.local_addr()
    }
}

/// A client's address as the listener saw it; handlers read it as
/// `ConnectInfo<PeerAddr>`.
#[derive(Debug, Clone, Copy)]
pub struct PeerAddr(pub SocketAddr);

impl axum::extract::connect_info::Connected<axum::serve::IncomingStream<'_, LimitedListener>>
    for PeerAddr
{
    fn connect_info(stream: axum::serve::IncomingStream<'_, LimitedListener>) -> Self {
        PeerAddr(*stream.remote_addr())
    }
}

/// An admitted connection: its place is given back when it is dropped.
pub struct AdmittedStream {
    inner: TcpStream,
    place: ConnectionPlace,
}

/// An admitted connection's place (in the node, and in its address's
/// share), given back when dropped.
pub struct ConnectionPlace {
    _permit: OwnedSemaphorePermit,
    _ip: Option<IpSlot>,
}

/// One of an address's connections.
struct IpSlot {
    ip: IpAddr,
    by_ip: Arc<std::sync::Mutex<std::collections::HashMap<IpAddr, usize>>>,
}

impl Drop for IpSlot {
    fn drop(&mut self) {
        let mut by_ip = self.by_ip.lock().unwrap_or_else(|p| p.into_inner());
        if let std::collections::hash_map::Entry::Occupied(mut held) = by_ip.entry(self.ip) {
            *held.get_mut() -= 1;
            // An address that holds nothing takes no memory.
            if *held.get() == 0 {
                held.remove();
            }
        }
    }
}

impl AdmittedStream {
    /// The socket, and its place to hold for as long as it is used.
    pub fn into_parts(self) -> (TcpStream, ConnectionPlace) {
        (self.inner, self.place)
    }
}

impl AsyncRead for AdmittedStream {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl AsyncWrite for AdmittedStream {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_open_files_limit_is_read_from_proc_limits() {
        let limits = "Limit                     Soft Limit           Hard Limit           Units     \n\
                      Max processes             95000                95000                processes \n\
                      Max open files            20000                20000                files     \n";
        assert_eq!(parse_open_files(limits), Some(20_000));
        let unlimited =
            "Max open files            unlimited            unlimited            files\n";
        assert_eq!(parse_open_files(unlimited), None);
        assert!(open_files_limit().is_some(), "this process has a limit");
        assert!(default_max_connections() >= 16);
    }
}
