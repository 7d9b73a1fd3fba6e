//! What a connection's task waits for between turns, and the one poll that
//! waits for all of it.
//!
//! Why not `select!`: it polls every branch on every wake-up, and a busy
//! connection wakes for every write. Each poll of a timer registers the
//! task's waker again.
//! Here a timer is polled once after it is armed, which registers the
//! waker, and after that only looked at ([`Sleep::is_elapsed`]): the task's
//! waker stays registered until the timer fires, since one task serves the
//! connection for its whole life. The close and the socket's readiness are
//! watched through one waker that notes its wake-ups beside the queue's
//! state ([`OutboxReceiver::transport_waker`]): a turn looks at them only
//! when they woke the task (polling the socket registers the waker under
//! its lock, twice per write otherwise; and their state would be two more
//! cache lines per turn).

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};

use tokio::net::TcpStream;
use tokio::time::Sleep;

use crate::outbox::{ConnectionControl, OutboxReceiver, Source};

/// Why the connection's task woke.
#[derive(Debug)]
pub(super) enum Wake {
    /// The server closed the connection.
    Closed,
    /// The timer fired: the held batch's write or the heartbeat is due.
    Timer,
    /// The socket has something to read (or failed).
    Readable(io::Result<()>),
    /// Something is queued, and no batch is held.
    Queued,
    /// The feeds it follows have events, and nothing else is queued: a
    /// busy connection's feed wakes it when its write is due.
    Fed,
}

/// What the connection's task knows of its waits across turns: which of
/// them know its waker.
#[derive(Debug, Default)]
pub(super) struct Waits {
    timer_registered: bool,
    /// The queue's transport waker ([`OutboxReceiver::transport_waker`]),
    /// made on the first poll and kept: the socket and the close keep it
    /// until they wake the task.
    transport: Option<Waker>,
}

impl Waits {
    /// The timer was just armed again: its new entry knows no waker.
    pub(super) fn timer_reset(&mut self) {
        self.timer_registered = false;
    }

    /// Ready with the first thing that happened, in order of precedence:
    /// a close, the timer, the socket, the queue. While a batch is
    /// `holding` (until the timer fires) the queue is not watched: what
    /// comes joins the held batch.
    pub(super) fn poll(
        &mut self,
        cx: &mut Context<'_>,
        control: &ConnectionControl,
        timer: Pin<&mut Sleep>,
        stream: &TcpStream,
        queue: &OutboxReceiver,
        holding: bool,
    ) -> Poll<Wake> {
        let transport = match &self.transport {
            Some(w) => w,
            None => {
                let w = self.transport.insert(queue.transport_waker(cx.waker()));
                // Registered once: a close wakes it, once.
                if control.poll_closed(&mut Context::from_waker(w)).is_ready() {
                    return Poll::Ready(Wake::Closed);
                }
                w
            }
        };
        // The socket and the close are looked at only when they woke the task.
        let transport_woke = queue.take_transport_wake();
        if transport_woke && control.close_code().is_some() {
            queue.keep_transport_wake();
            return Poll::Ready(Wake::Closed);
        }
        if timer_due(timer, &mut self.timer_registered, cx) {
            if transport_woke {
                queue.keep_transport_wake();
            }
            return Poll::Ready(Wake::Timer);
        }
        if transport_woke {
            if let Poll::Ready(r) = stream.poll_read_ready(&mut Context::from_waker(transport)) {
                // Still readable until a read says otherwise: look again
                // next turn.
                queue.keep_transport_wake();
                return Poll::Ready(Wake::Readable(r));
            }
        }
        if !holding {
            match queue.poll_source(cx) {
                Poll::Ready(Source::Queued) => return Poll::Ready(Wake::Queued),
                Poll::Ready(Source::Fed) => return Poll::Ready(Wake::Fed),
                Poll::Pending => {}
            }
        }
        Poll::Pending
    }
}

/// Whether `timer` has fired. Polled (registering the task's waker) until
/// a poll registers it, then only looked at.
fn timer_due(timer: Pin<&mut Sleep>, registered: &mut bool, cx: &mut Context<'_>) -> bool {
    if *registered {
        return timer.is_elapsed();
    }
    match std::future::Future::poll(timer, cx) {
        Poll::Ready(()) => true,
        Poll::Pending => {
            // A poll refused for the task's cooperative budget registered
            // nothing (it asked for the task to be polled again instead):
            // register on that poll.
            *registered = tokio::task::coop::has_budget_remaining();
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    /// A timer polled once is seen firing without being polled again: the
    /// task is woken by it, and `is_elapsed` says so.
    #[tokio::test]
    async fn a_registered_timer_wakes_the_task_and_is_seen_elapsed() {
        let timer = tokio::time::sleep(Duration::from_millis(5));
        tokio::pin!(timer);
        let mut registered = false;
        let polls = std::cell::Cell::new(0);
        std::future::poll_fn(|cx| {
            polls.set(polls.get() + 1);
            if timer_due(timer.as_mut(), &mut registered, cx) {
                Poll::Ready(())
            } else {
                Poll::Pending
            }
        })
        .await;
        assert!(registered);
        assert_eq!(polls.get(), 2, "one poll to register, one when it fired");
    }

    /// Armed again, a timer is polled again: its new entry knows no waker.
    #[tokio::test]
    async fn a_reset_timer_registers_again() {
        let timer = tokio::time::sleep(Duration::from_millis(5));
        tokio::pin!(timer);
        let mut waits = Waits::default();
        let fired = std::future::poll_fn(|cx| {
            Poll::Ready(timer_due(timer.as_mut(), &mut waits.timer_registered, cx))
        })
        .await;
        assert!(!fired);
        assert!(waits.timer_registered);
        timer
            .as_mut()
            .reset(tokio::time::Instant::now() + Duration::from_millis(3));
        waits.timer_reset();
        let woke = std::future::poll_fn(|cx| {
            if timer_due(timer.as_mut(), &mut waits.timer_registered, cx) {
                Poll::Ready(tokio::time::Instant::now())
            } else {
                Poll::Pending
            }
        })
        .await;
        assert!(timer.is_elapsed());
        assert!(woke >= timer.deadline());
    }

    /// Reads what the socket holds and clears its readiness, as the loop
    /// does; returns what was read.
    fn read_all(server: &TcpStream) -> Vec<u8> {
        let mut got = Vec::new();
        let _ = server.try_io(tokio::io::Interest::READABLE, || {
            let mut buf = [0u8; 64];
            loop {
                let n = server.try_read(&mut buf)?;
                if n == 0 {
                    return Ok(());
                }
                got.extend_from_slice(&buf[..n]);
            }
        });
        got
    }

    /// The socket's readiness reaches the loop through the transport waker:
    /// once the socket's data is read (and its readiness cleared) a poll
    /// waits, with the wake-up taken so later polls do not ask the socket
    /// again; data then wakes the task and the poll reports the socket
    /// readable. And a close wakes it the same way, after many turns.
    #[tokio::test]
    async fn the_socket_and_the_close_wake_the_loop_through_the_transport_waker() {
        use crate::outbox::{ConnectionControl, Outbox};
        use tokio::io::AsyncWriteExt;

        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let mut client = TcpStream::connect(listener.local_addr().unwrap())
            .await
            .unwrap();
        let (server, _) = listener.accept().await.unwrap();
        let control = ConnectionControl::new();
        let (_outbox, queue) = Outbox::new(16, control.clone());
        let timer = tokio::time::sleep(Duration::from_secs(3600));
        tokio::pin!(timer);
        let mut waits = Waits::default();

        for round in 0..3u8 {
            // A new socket may count as readable once: read (nothing) away.
            let mut spurious = 0;
            loop {
                let now = std::future::poll_fn(|cx| {
                    Poll::Ready(waits.poll(cx, &control, timer.as_mut(), &server, &queue, false))
                })
                .await;
                match now {
                    Poll::Pending => break,
                    Poll::Ready(Wake::Readable(Ok(()))) if spurious == 0 => {
                        assert_eq!(read_all(&server), b"", "round {round}");
                        spurious += 1;
                    }
                    other => panic!("round {round}: {other:?}"),
                }
            }
            let wake = waits.transport.clone().expect("registered");
            assert!(!queue.take_transport_wake(), "round {round}");

            client.write_all(&[round, round]).await.unwrap();
            let woke = tokio::time::timeout(
                Duration::from_secs(10),
                std::future::poll_fn(|cx| {
                    waits.poll(cx, &control, timer.as_mut(), &server, &queue, false)
                }),
            )
            .await
            .unwrap_or_else(|_| panic!("round {round}: the data did not wake the loop"));
            assert!(
                matches!(woke, Wake::Readable(Ok(()))),
                "round {round}: {woke:?}"
            );
            // Unread, it is still readable on the next turn.
            let again = std::future::poll_fn(|cx| {
                Poll::Ready(waits.poll(cx, &control, timer.as_mut(), &server, &queue, false))
            })
            .await;
            assert!(
                matches!(again, Poll::Ready(Wake::Readable(Ok(())))),
                "round {round}: {again:?}"
            );
            assert!(
                wake.will_wake(waits.transport.as_ref().unwrap()),
                "one transport waker for the connection's life"
            );
            assert_eq!(read_all(&server), [round, round]);
        }

        // Quiet again: the close alone wakes the loop.
        let quiet = std::future::poll_fn(|cx| {
            Poll::Ready(waits.poll(cx, &control, timer.as_mut(), &server, &queue, false))
        })
        .await;
        assert!(quiet.is_pending(), "{quiet:?}");
        let closing = control.clone();
        tokio::spawn(async move { closing.close(plaza_protocol::CloseCode::Restarting) });
        let woke = tokio::time::timeout(
            Duration::from_secs(10),
            std::future::poll_fn(|cx| {
                waits.poll(cx, &control, timer.as_mut(), &server, &queue, false)
            }),
        )
        .await
        .expect("the close did not wake the loop");
        assert!(matches!(woke, Wake::Closed), "{woke:?}");
    }
}
