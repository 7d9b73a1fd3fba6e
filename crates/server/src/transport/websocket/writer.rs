//! Writing to the socket: batches of queued frames in one buffer, control
//! frames, and writes that stop when the connection is closed meanwhile.

use std::io;

use bytes::Bytes;

use super::deflate::{self, Deflate};
use super::frames::{put_compressed, put_header, put_text, ServerOp};
use super::End;
use crate::outbox::{ConnectionControl, FrameRef, OutboxReceiver};
use crate::Node;
use tokio::net::TcpStream;
use tokio::time::Instant;

/// The window every browser gets (nobody asks for less): the one whose
/// compressed events are shared by all recipients.
const SHARED_WINDOW_BITS: u8 = 15;

/// Frames written per batch at most, so one busy connection cannot hog its task.
const MAX_BATCH: usize = 512;

/// A batch's buffer at least: a quiet member's few events fit.
const FIRST_BUFFER: usize = 2048;

/// A batch's buffer at most to begin with: what a larger batch needs beyond
/// it is grown as it is filled.
const MAX_FIRST_BUFFER: usize = 64 * 1024;

/// How the frames of a connection go on the wire: what its client
/// negotiated at the upgrade.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct WireForm {
    /// permessage-deflate, and the size from which a message is compressed.
    pub(crate) deflate: Option<(Deflate, usize)>,
    /// The subprotocol `plaza.v1.compact`: room messages as arrays
    /// ([`plaza_protocol::compact`]).
    pub(crate) compact: bool,
}

impl WireForm {
    /// The text of a queued frame in this form: a room message's compact
    /// form (made once by its room for all who asked for it), else the
    /// frame.
    fn text<'a>(&self, item: FrameRef<'a>) -> &'a Bytes {
        match item.entry() {
            Some(entry) if self.compact => match entry.wire.compact() {
                Some(compact) => compact,
                None => {
                    // Every room message has its compact form by now: its room
                    // made it on delivery, or when it loaded its history.
                    debug_assert!(
                        plaza_protocol::compact::compact_message(
                            &entry.frame,
                            plaza_protocol::compact::CompactKey {
                                alias: 0,
                                ts_base: 0
                            }
                        )
                        .is_none(),
                        "a room message without its compact form"
                    );
                    &entry.frame
                }
            },
            _ => item.frame(),
        }
    }

    /// Puts a queued frame, compressed if the connection deflates and it is
    /// large enough. A room event goes to many: it is compressed once, for
    /// all of them.
    pub(super) fn put(&self, out: &mut Vec<u8>, item: FrameRef<'_>) {
        let text = self.text(item);
        match (item.entry(), self.deflate) {
            (Some(entry), Some((d, min_bytes)))
                if d.server_window_bits == SHARED_WINDOW_BITS && text.len() >= min_bytes =>
            {
                let make = || {
                    let mut packed = Vec::with_capacity(text.len() / 2 + 16);
                    deflate::compress(text, SHARED_WINDOW_BITS, &mut packed);
                    Bytes::from(packed)
                };
                let packed = if std::ptr::eq(text, &entry.frame) {
                    entry.wire.deflated(make)
                } else {
                    entry.wire.compact_deflated(make)
                };
                put_compressed(out, packed);
            }
            _ => put_text(out, text, self.deflate),
        }
    }
}

/// A write stopped: because the server closed the connection meanwhile
/// (then a Close frame follows), or because the socket failed.
pub(super) fn failed_write(control: &ConnectionControl) -> End {
    if control.closed.is_cancelled() {
        End::Server
    } else {
        End::Gone
    }
}

pub(super) fn close_reason(code: u16) -> &'static str {
    match code {
        1012 => "server restarting: reconnect and resume",
        4001 => "heartbeat timeout",
        4002 => "slow consumer: resume to catch up",
        4003 => "rate limit ignored",
        4004 => "token expired: reconnect with a fresh token and resume",
        4005 => "history rewritten: join again without resuming",
        1009 => "message too big",
        1007 => "invalid payload",
        1002 => "protocol error",
        _ => "",
    }
}

/// One write of queued frames: taken from the queue at once, encoded into
/// one buffer, and written with as few syscalls as the socket allows.
pub(super) struct Batch {
    out: Vec<u8>,
    /// How much of `out` the socket has taken.
    written: usize,
    frames: u64,
    /// When the oldest room event in it was ordered (the latency sample).
    oldest: Option<std::time::Instant>,
}

impl Batch {
    /// Takes what is queued (up to [`MAX_BATCH`] frames) and writes as much
    /// of it as the socket takes now, without waiting: nearly always all of
    /// it, and then the write costs no future and no allocation but its
    /// buffer. `None` when there was nothing to write (a followed feed's new
    /// events were none of this member's). When to call it is the
    /// connection loop's decision (see [`super::super::coalesce`]).
    /// `last_size` is the size of the connection's previous batch: its
    /// buffer starts that large, since a busy connection's batches are
    /// alike (growing it frame by frame was 1 % of a busy server's time).
    pub(super) fn start(
        stream: &TcpStream,
        form: WireForm,
        rx: &mut OutboxReceiver,
        last_size: &mut usize,
    ) -> io::Result<Option<Batch>> {
        // Each frame is copied into the write as it is taken: a followed
        // feed's events straight from the feed, without taking a reference
        // to each.
        let mut out = Vec::with_capacity((*last_size).clamp(FIRST_BUFFER, MAX_FIRST_BUFFER));
        // The first live event stands for the batch: the queue and each feed
        // hand theirs oldest first.
        let mut oldest = None;
        let frames = rx.drain_into(MAX_BATCH, |item| {
            if oldest.is_none() {
                oldest = item.ordered_at();
            }
            form.put(&mut out, item);
        });
        if frames == 0 {
            return Ok(None);
        }
        // A little more than this one: the next batch of a steady stream is
        // as often a frame longer as shorter.
        *last_size = out.len() + out.len() / 8;
        let mut batch = Batch {
            out,
            written: 0,
            frames: frames as u64,
            oldest,
        };
        batch.written = write_now(stream, &batch.out)?;
        Ok(Some(batch))
    }

    /// Whether the socket took all of it.
    pub(super) fn is_written(&self) -> bool {
        self.written == self.out.len()
    }

    /// Writes the rest once the socket takes it, unless the connection is
    /// closed meanwhile (see [`guarded_write`]).
    pub(super) async fn write_rest(
        &mut self,
        stream: &TcpStream,
        control: &ConnectionControl,
        unfinished: &mut Vec<u8>,
    ) -> io::Result<()> {
        guarded_write(stream, control, &self.out[self.written..], unfinished).await?;
        self.written = self.out.len();
        Ok(())
    }

    /// Counts the written batch; returns when its write ended, the start
    /// of the next coalescing window.
    pub(super) fn finish(self, node: &Node) -> Instant {
        debug_assert!(self.is_written());
        // One clock reading for both: the latency sample and the window's start.
        let done = std::time::Instant::now();
        node.metrics.wrote(
            self.frames,
            self.out.len() as u64,
            self.oldest.map(|t| done.saturating_duration_since(t)),
        );
        Instant::from_std(done)
    }
}

pub(super) async fn write_control(
    stream: &TcpStream,
    control: &ConnectionControl,
    op: ServerOp,
    payload: &[u8],
    unfinished: &mut Vec<u8>,
) -> io::Result<()> {
    let mut out = Vec::with_capacity(payload.len() + 2);
    put_header(&mut out, op, payload.len());
    out.extend_from_slice(payload);
    guarded_write(stream, control, &out, unfinished).await
}

/// Writes everything, unless the connection is closed meanwhile (e.g. as a
/// slow consumer while this write waits for the client to read). Then the
/// unwritten rest goes to `unfinished`: a frame may be half written, and the
/// Close frame must follow its end, not cut into it.
async fn guarded_write(
    stream: &TcpStream,
    control: &ConnectionControl,
    buf: &[u8],
    unfinished: &mut Vec<u8>,
) -> io::Result<()> {
    let mut rest = buf;
    loop {
        // Written at once nearly always: waiting for the socket (and for a
        // close meanwhile) only when its buffer is full.
        rest = &rest[write_now(stream, rest)?..];
        if rest.is_empty() {
            return Ok(());
        }
        tokio::select! {
            biased;
            ready = stream.writable() => ready?,
            _ = control.closed.cancelled() => {
                unfinished.extend_from_slice(rest);
                return Err(io::ErrorKind::ConnectionAborted.into());
            }
        }
    }
}

/// Writes as much of `buf` as the socket takes without waiting; returns how
/// much that was.
fn write_now(stream: &TcpStream, buf: &[u8]) -> io::Result<usize> {
    let mut written = 0;
    while written < buf.len() {
        match stream.try_write(&buf[written..]) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => written += n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
            Err(e) => return Err(e),
        }
    }
    Ok(written)
}

pub(super) async fn write_all(stream: &TcpStream, mut buf: &[u8]) -> io::Result<()> {
    loop {
        buf = &buf[write_now(stream, buf)?..];
        if buf.is_empty() {
            return Ok(());
        }
        stream.writable().await?;
    }
}

#[cfg(test)]
mod tests {
    use tokio::io::AsyncReadExt;
    use tokio::net::{TcpListener, TcpSocket, TcpStream};

    use super::*;

    /// A connected pair whose writer (`.0`) has small socket buffers, so a
    /// few hundred KiB fill them while the reader (`.1`) does not read.
    async fn small_buffered_pair() -> (TcpStream, TcpStream) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let socket = TcpSocket::new_v4().unwrap();
        socket.set_send_buffer_size(4096).unwrap();
        let writer = socket
            .connect(listener.local_addr().unwrap())
            .await
            .unwrap();
        let (reader, _) = listener.accept().await.unwrap();
        (writer, reader)
    }

    fn payload() -> Vec<u8> {
        (0..4 << 20).map(|i: u32| (i % 251) as u8).collect()
    }

    /// Everything the reader gets until the writer's end closes.
    async fn read_to_end(mut reader: TcpStream) -> Vec<u8> {
        let mut got = Vec::new();
        reader.read_to_end(&mut got).await.unwrap();
        got
    }

    #[tokio::test]
    async fn a_full_socket_takes_part_now_and_the_rest_as_the_client_reads() {
        let (writer, reader) = small_buffered_pair().await;
        let buf = payload();
        let now = write_now(&writer, &buf).unwrap();
        assert!(now > 0 && now < buf.len(), "took {now} of {}", buf.len());
        let reading = tokio::spawn(read_to_end(reader));
        write_all(&writer, &buf[now..]).await.unwrap();
        drop(writer);
        assert!(reading.await.unwrap() == buf);
    }

    #[tokio::test]
    async fn a_close_while_the_socket_is_full_keeps_what_was_not_written() {
        let (writer, reader) = small_buffered_pair().await;
        let buf = payload();
        let control = ConnectionControl::new();
        let mut unfinished = Vec::new();
        {
            let write = guarded_write(&writer, &control, &buf, &mut unfinished);
            tokio::pin!(write);
            // The socket fills before the client reads anything: the write waits.
            assert!(futures_util::poll!(write.as_mut()).is_pending());
            control.close(plaza_protocol::CloseCode::SlowConsumer);
            let err = write.await.unwrap_err();
            assert_eq!(err.kind(), io::ErrorKind::ConnectionAborted);
        }
        drop(writer);
        // What went out and what was kept make the whole, in order.
        let mut got = read_to_end(reader).await;
        assert!(!unfinished.is_empty());
        got.extend_from_slice(&unfinished);
        assert!(got == buf);
    }
}
