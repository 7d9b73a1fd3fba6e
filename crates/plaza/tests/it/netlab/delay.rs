//! A fixed delay on packets, through an NFQUEUE: iptables hands each packet
//! to this process, which lets it through `delay` later, in arrival order.
//!
//! This is what `tc qdisc … netem delay` does; it is done here because the
//! kernels the tests run on may lack netem (`CONFIG_NET_SCH_NETEM`), while
//! NFQUEUE is common. The packets are real: TCP on both ends sees the delay.

use std::collections::VecDeque;
use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Arc};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use nfq::{Queue, Verdict};

/// How long the loop sleeps at most when nothing is due: the delay's jitter.
const TICK: Duration = Duration::from_millis(1);

/// A running delay; stopped (held packets let through) when dropped.
pub struct Delay {
    stop: Arc<AtomicBool>,
    packets: Arc<AtomicU64>,
    thread: Option<JoinHandle<()>>,
}

impl Delay {
    /// Reads NFQUEUE `queue` in the network namespace `netns` on a thread of
    /// its own, and returns once it is bound. Panics if it cannot be.
    pub fn start(netns: &Path, queue: u16, delay: Duration) -> Delay {
        let stop = Arc::new(AtomicBool::new(false));
        let packets = Arc::new(AtomicU64::new(0));
        let (ready_tx, ready_rx) = mpsc::channel();
        let ns = File::open(netns).unwrap_or_else(|e| panic!("{}: {e}", netns.display()));
        let thread = std::thread::spawn({
            let (stop, packets) = (stop.clone(), packets.clone());
            move || {
                // setns(2) moves only this thread: the queue's netlink socket
                // is then the namespace's.
                if unsafe { libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
                    let _ = ready_tx.send(Err(io::Error::last_os_error()));
                    return;
                }
                let mut q = match bind(queue) {
                    Ok(q) => q,
                    Err(e) => {
                        let _ = ready_tx.send(Err(e));
                        return;
                    }
                };
                let _ = ready_tx.send(Ok(()));
                if let Err(e) = pass_late(&mut q, delay, &stop, &packets) {
                    // Held packets are dropped with the queue: TCP resends them.
                    eprintln!("network lab: delay on queue {queue} stopped: {e}");
                }
                let _ = q.unbind(queue);
            }
        });
        match ready_rx.recv() {
            Ok(Ok(())) => {}
            Ok(Err(e)) => panic!("network lab: NFQUEUE {queue}: {e}"),
            Err(_) => panic!("network lab: the delay thread ended"),
        }
        Delay {
            stop,
            packets,
            thread: Some(thread),
        }
    }

    /// Packets let through so far.
    pub fn packets(&self) -> u64 {
        self.packets.load(Ordering::Relaxed)
    }
}

fn bind(queue: u16) -> io::Result<Queue> {
    let mut q = Queue::open()?;
    q.bind(queue)?;
    q.set_queue_max_len(queue, 1 << 16)?;
    q.set_nonblocking(true);
    Ok(q)
}

/// Lets every packet through `delay` after it came, until `stop`; then lets
/// the held ones through at once.
fn pass_late(
    q: &mut Queue,
    delay: Duration,
    stop: &AtomicBool,
    packets: &AtomicU64,
) -> io::Result<()> {
    let mut held = VecDeque::new();
    while !stop.load(Ordering::Relaxed) {
        loop {
            match q.recv() {
                Ok(msg) => held.push_back((Instant::now() + delay, msg)),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) => return Err(e),
            }
        }
        let now = Instant::now();
        while held.front().is_some_and(|(due, _)| *due <= now) {
            let (_, mut msg) = held.pop_front().expect("a front");
            msg.set_verdict(Verdict::Accept);
            q.verdict(msg)?;
            packets.fetch_add(1, Ordering::Relaxed);
        }
        let next = held
            .front()
            .map_or(TICK, |(due, _)| due.saturating_duration_since(now));
        std::thread::sleep(next.min(TICK));
    }
    for (_, mut msg) in held {
        msg.set_verdict(Verdict::Accept);
        q.verdict(msg)?;
    }
    Ok(())
}

impl Drop for Delay {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
