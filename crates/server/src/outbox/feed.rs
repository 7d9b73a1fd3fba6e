//! A room's feed: its live events, appended once by the room and read by
//! each member connection that follows the room, from its own cursor.
//!
//! Why: fanning an event out by queueing it on every member's outbox costs
//! a lock, a queue slot and maybe a wake-up per member per event; in a room
//! of a thousand busy members that was a quarter of the server's CPU
//! (docs/benchmarks.md, issue 19). With a feed the room appends each event
//! once and wakes only the followers that wait for one; a follower reads
//! what it has not read yet when it writes, in the same pass that builds the
//! write. Members the feed does not serve (those with a delivery policy;
//! events for some members only) are still handed their events one by one.
//!
//! Coalescing: a follower whose connection wrote less than one window
//! ago (busy, see `transport::coalesce`) is not woken by a new event; its
//! wake-up is held for one window, with everything fed meanwhile, and the
//! room's task releases it ([`RoomFeed::release_due`]). So a busy
//! connection wakes once per write, where holding the write itself would
//! wake it twice (for the event, then for its own timer) and set a timer
//! per connection per write.
//!
//! Order: every frame a room queues for a member carries the feed's end at
//! that moment (a [`Barrier`]), and the member's reader takes the feed's
//! events before that end first. So a member gets the room's events and
//! the room's other frames to it (acks, answers, direct messages) in the
//! order the room made them, as if all were queued.

use std::collections::VecDeque;
use std::ops::ControlFlow;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use plaza_core::HistoryEntry;

use super::Queue;

/// How a room's feed serves its followers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FeedConfig {
    /// Events kept for followers that have not read them; a follower further
    /// behind than this is a slow consumer (`send_queue_frames`).
    pub capacity: usize,
    /// The write coalescing window (`write_coalesce_ms`): a busy follower's
    /// wake-up is held this long. Zero wakes every follower at once.
    pub hold: Duration,
}

/// A room's live events, for the members that follow it.
#[derive(Debug)]
pub struct RoomFeed {
    /// Tells barriers of different feeds apart.
    id: u64,
    /// Events kept for followers that have not read them; a follower further
    /// behind than this is a slow consumer.
    capacity: usize,
    hold: Duration,
    /// Position of the next event appended: events are numbered from 0 in
    /// the order appended (not the room's seq: not every event is fed).
    end: AtomicU64,
    ring: RwLock<Ring>,
    /// Followers waiting for the next event.
    waiting: Mutex<Vec<Arc<Follower>>>,
    /// Busy followers' wake-ups, held until their window passes: batches by
    /// release time, oldest first. Only the room's task touches it.
    held: Mutex<VecDeque<HeldWakes>>,
}

/// The followers to wake at `at`: one batch per event that found busy
/// followers waiting (batches are not merged: a wake-up released before
/// its follower's window passed would have its connection hold the write
/// again, for a whole window).
#[derive(Debug)]
struct HeldWakes {
    at: Instant,
    followers: Vec<Arc<Follower>>,
}

#[derive(Debug, Default)]
struct Ring {
    /// Position of `events[0]`.
    first: u64,
    events: VecDeque<FedEvent>,
}

/// One event in the feed.
#[derive(Debug, Clone)]
pub(crate) struct FedEvent {
    pub(super) entry: Arc<HistoryEntry>,
    /// When the room ordered it (the delivery latency's start).
    pub(super) ordered_at: Option<Instant>,
}

/// A point in a feed: "after the events before `pos` of feed `feed`".
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Barrier {
    pub(super) feed: u64,
    pub(super) pos: u64,
}

/// The events before `first` are gone: the reader fell too far behind.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct Lagged;

impl RoomFeed {
    /// An empty feed keeping up to `capacity` unread events, which wakes
    /// every follower at once.
    pub fn new(capacity: usize) -> Arc<RoomFeed> {
        RoomFeed::with_config(FeedConfig {
            capacity,
            hold: Duration::ZERO,
        })
    }

    /// An empty feed as `config` says.
    pub fn with_config(config: FeedConfig) -> Arc<RoomFeed> {
        static NEXT_ID: AtomicU64 = AtomicU64::new(1);
        Arc::new(RoomFeed {
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            capacity: config.capacity.max(1),
            hold: config.hold,
            end: AtomicU64::new(0),
            ring: RwLock::new(Ring::default()),
            waiting: Mutex::new(Vec::new()),
            held: Mutex::new(VecDeque::new()),
        })
    }

    /// How many unread events it keeps for a follower.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// The position the next event gets.
    pub fn end(&self) -> u64 {
        self.end.load(Ordering::Acquire)
    }

    pub(super) fn id(&self) -> u64 {
        self.id
    }

    /// Where the feed is now, for a frame queued now.
    pub(super) fn barrier(&self) -> Barrier {
        Barrier {
            feed: self.id,
            pos: self.end(),
        }
    }

    /// Appends an event and wakes the followers waiting for one, but for
    /// the busy ones: theirs is held for one window (see the module's
    /// docs). For the room's task only: one appender, so positions follow
    /// the room's order. `ordered_at` is now (else the clock is read).
    pub fn append(&self, entry: Arc<HistoryEntry>, ordered_at: Option<Instant>) {
        {
            let mut ring = self.ring.write().unwrap_or_else(|p| p.into_inner());
            if ring.events.len() >= self.capacity {
                ring.events.pop_front();
                ring.first += 1;
            }
            ring.events.push_back(FedEvent { entry, ordered_at });
            // Under the lock: a reader that sees the new end finds the event.
            self.end.fetch_add(1, Ordering::Release);
        }
        let mut busy = std::mem::take(&mut *self.waiting.lock().unwrap_or_else(|p| p.into_inner()));
        if busy.is_empty() {
            return;
        }
        let now = (!self.hold.is_zero()).then(|| ordered_at.unwrap_or_else(Instant::now));
        busy.retain(|f| {
            let held = now.is_some_and(|now| f.queue.busy_at(now, self.hold));
            if !held {
                wake(f);
            }
            held
        });
        let Some(now) = now.filter(|_| !busy.is_empty()) else {
            return;
        };
        // Still listed while held: a follower that waits again meanwhile is
        // not listed twice, and is woken with this batch.
        let mut held = self.held.lock().unwrap_or_else(|p| p.into_inner());
        held.push_back(HeldWakes {
            at: now + self.hold,
            followers: busy,
        });
    }

    /// When the next held wake-up is due, if one is held.
    pub fn next_release(&self) -> Option<Instant> {
        let held = self.held.lock().unwrap_or_else(|p| p.into_inner());
        held.front().map(|h| h.at)
    }

    /// Wakes the followers whose held wake-up is due at `now`.
    pub fn release_due(&self, now: Instant) {
        loop {
            let due = {
                let mut held = self.held.lock().unwrap_or_else(|p| p.into_inner());
                match held.front() {
                    Some(h) if h.at <= now => held.pop_front(),
                    _ => None,
                }
            };
            let Some(due) = due else {
                return;
            };
            due.followers.iter().for_each(wake);
        }
    }

    /// Forgets the events before `pos` (every follower has read them).
    pub fn trim(&self, pos: u64) {
        let mut ring = self.ring.write().unwrap_or_else(|p| p.into_inner());
        let drop = pos.saturating_sub(ring.first).min(ring.events.len() as u64) as usize;
        ring.events.drain(..drop);
        ring.first += drop as u64;
        if ring.events.is_empty() && ring.events.capacity() > 0 {
            // A quiet room keeps no buffer.
            ring.events = VecDeque::new();
        }
    }

    /// Calls `f` with the events from `from` up to `to` (or the end), in
    /// order, until it breaks; returns the position of the first event it
    /// did not take. `Lagged` if some of them are gone.
    pub(super) fn read(
        &self,
        from: u64,
        to: u64,
        mut f: impl FnMut(&FedEvent) -> ControlFlow<()>,
    ) -> Result<u64, Lagged> {
        let ring = self.ring.read().unwrap_or_else(|p| p.into_inner());
        if from < ring.first {
            return Err(Lagged);
        }
        let end = ring.first + ring.events.len() as u64;
        let mut pos = from;
        for e in ring.events.range((from - ring.first) as usize..) {
            if pos >= to.min(end) || f(e).is_break() {
                break;
            }
            pos += 1;
        }
        Ok(pos)
    }

    /// Takes `follower` off the waiting list: it follows no more. (A room
    /// whose members come and go without an event, presence off, would
    /// otherwise keep every one that ever waited.) A held wake-up goes with
    /// its batch, a window later at most.
    pub fn forget(&self, follower: &Arc<Follower>) {
        if follower.listed.swap(false, Ordering::AcqRel) {
            self.waiting
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .retain(|f| !Arc::ptr_eq(f, follower));
        }
    }

    /// Takes every follower off the waiting list at once (the room closes:
    /// nobody follows it any more), where [`RoomFeed::forget`] for each
    /// would walk the list once per follower.
    pub fn forget_all(&self) {
        let waiting = std::mem::take(&mut *self.waiting.lock().unwrap_or_else(|p| p.into_inner()));
        let held = std::mem::take(&mut *self.held.lock().unwrap_or_else(|p| p.into_inner()));
        for f in waiting
            .into_iter()
            .chain(held.into_iter().flat_map(|h| h.followers))
        {
            f.listed.store(false, Ordering::Release);
        }
    }

    /// Lists `follower` to be woken by the next event, unless it is already.
    pub(super) fn wait(&self, follower: &Arc<Follower>) {
        if !follower.listed.swap(true, Ordering::AcqRel) {
            self.waiting
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push(follower.clone());
        }
    }
}

/// Takes a listed follower off the list and wakes its connection's task.
fn wake(f: &Arc<Follower>) {
    f.listed.store(false, Ordering::Release);
    f.queue.feed_waker.wake();
}

/// A member connection's following of one feed, as its room and its reader
/// both see it.
#[derive(Debug)]
pub struct Follower {
    /// How far the reader has read: the room closes a follower that falls
    /// more than the feed's capacity behind, and forgets what all have read.
    pos: AtomicU64,
    /// On the feed's waiting list.
    listed: AtomicBool,
    /// The connection's queue, whose task an event wakes.
    queue: Arc<Queue>,
}

impl Follower {
    pub(super) fn new(queue: Arc<Queue>, pos: u64) -> Arc<Follower> {
        Arc::new(Follower {
            pos: AtomicU64::new(pos),
            listed: AtomicBool::new(false),
            queue,
        })
    }

    /// The position of the first event its reader has not read.
    pub fn pos(&self) -> u64 {
        self.pos.load(Ordering::Acquire)
    }

    pub(super) fn read_up_to(&self, pos: u64) {
        self.pos.store(pos, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::{counting_waker, entry, woken, CountingWake};
    use super::*;

    fn seqs(feed: &RoomFeed, from: u64, to: u64) -> Result<(Vec<u64>, u64), Lagged> {
        let mut v = Vec::new();
        let next = feed.read(from, to, |e| {
            v.push(e.entry.seq);
            ControlFlow::Continue(())
        })?;
        Ok((v, next))
    }

    #[test]
    fn events_are_read_in_order_between_positions() {
        let feed = RoomFeed::new(8);
        for s in 10..15 {
            feed.append(entry(s), None);
        }
        assert_eq!(feed.end(), 5);
        assert_eq!(seqs(&feed, 0, u64::MAX), Ok((vec![10, 11, 12, 13, 14], 5)));
        assert_eq!(seqs(&feed, 2, 4), Ok((vec![12, 13], 4)));
        assert_eq!(seqs(&feed, 5, u64::MAX), Ok((vec![], 5)));
        // A barrier behind the reader reads nothing and keeps its place.
        assert_eq!(seqs(&feed, 4, 2), Ok((vec![], 4)));
        // A reader that stops early is told where it stopped.
        let mut taken = Vec::new();
        let stop = feed.read(1, u64::MAX, |e| {
            if taken.len() == 2 {
                return ControlFlow::Break(());
            }
            taken.push(e.entry.seq);
            ControlFlow::Continue(())
        });
        assert_eq!((stop, &taken[..]), (Ok(3), &[11, 12][..]));
    }

    #[test]
    fn a_reader_further_behind_than_the_capacity_has_lagged() {
        let feed = RoomFeed::new(3);
        for s in 0..5 {
            feed.append(entry(s), None);
        }
        assert_eq!(seqs(&feed, 1, u64::MAX), Err(Lagged));
        assert_eq!(seqs(&feed, 2, u64::MAX), Ok((vec![2, 3, 4], 5)));
    }

    #[test]
    fn trimming_forgets_what_everyone_read_and_a_quiet_feed_keeps_no_buffer() {
        let feed = RoomFeed::new(8);
        for s in 0..4 {
            feed.append(entry(s), None);
        }
        feed.trim(2);
        assert_eq!(seqs(&feed, 1, u64::MAX), Err(Lagged));
        assert_eq!(seqs(&feed, 2, u64::MAX), Ok((vec![2, 3], 4)));
        feed.trim(4);
        assert_eq!(feed.ring.read().unwrap().events.capacity(), 0);
        feed.append(entry(4), None);
        assert_eq!(seqs(&feed, 4, u64::MAX), Ok((vec![4], 5)));
    }

    /// A follower's task, as the feed sees it: its queue, and whether the
    /// feed woke it.
    struct Waiter {
        rx: super::super::OutboxReceiver,
        follower: Arc<Follower>,
        woken: Arc<CountingWake>,
    }

    impl Waiter {
        fn new() -> Waiter {
            let (out, rx) = super::super::Outbox::new(4, super::super::ConnectionControl::new());
            let (woken, waker) = counting_waker();
            out.queue.feed_waker.register(&waker);
            Waiter {
                follower: Follower::new(out.queue.clone(), 0),
                rx,
                woken,
            }
        }

        fn woken(&self) -> usize {
            woken(&self.woken)
        }
    }

    const HOLD: Duration = Duration::from_millis(2);

    fn holding_feed() -> Arc<RoomFeed> {
        RoomFeed::with_config(FeedConfig {
            capacity: 8,
            hold: HOLD,
        })
    }

    #[test]
    fn a_quiet_follower_is_woken_at_once_and_a_busy_one_a_window_after_the_event() {
        let feed = holding_feed();
        let t0 = Instant::now();
        let (quiet, busy) = (Waiter::new(), Waiter::new());
        // `quiet` wrote long ago; `busy` half a window before the event.
        quiet.rx.wrote(t0);
        let event_at = t0 + 10 * HOLD;
        busy.rx.wrote(event_at - HOLD / 2);
        feed.wait(&quiet.follower);
        feed.wait(&busy.follower);
        feed.append(entry(1), Some(event_at));
        assert_eq!((quiet.woken(), busy.woken()), (1, 0));
        assert_eq!(feed.next_release(), Some(event_at + HOLD));
        // A follower that waits again while held is not listed twice.
        feed.wait(&busy.follower);
        assert!(feed.waiting.lock().unwrap().is_empty());
        feed.release_due(event_at + HOLD - Duration::from_micros(1));
        assert_eq!(busy.woken(), 0, "released before its window passed");
        feed.release_due(event_at + HOLD);
        assert_eq!(busy.woken(), 1);
        assert_eq!(feed.next_release(), None);
        // Released, it is listed again when it waits.
        feed.wait(&busy.follower);
        assert_eq!(feed.waiting.lock().unwrap().len(), 1);
    }

    #[test]
    fn held_wake_ups_are_released_in_order_each_when_due() {
        let feed = holding_feed();
        let t0 = Instant::now() + Duration::from_secs(1);
        let (a, b) = (Waiter::new(), Waiter::new());
        a.rx.wrote(t0);
        b.rx.wrote(t0);
        feed.wait(&a.follower);
        feed.append(entry(1), Some(t0 + HOLD / 4));
        feed.wait(&b.follower);
        feed.append(entry(2), Some(t0 + HOLD / 2));
        assert_eq!(feed.next_release(), Some(t0 + HOLD / 4 + HOLD));
        feed.release_due(t0 + HOLD / 4 + HOLD);
        assert_eq!((a.woken(), b.woken()), (1, 0));
        assert_eq!(feed.next_release(), Some(t0 + HOLD / 2 + HOLD));
        feed.release_due(t0 + 10 * HOLD);
        assert_eq!((a.woken(), b.woken()), (1, 1));
    }

    #[test]
    fn a_feed_without_a_window_and_a_transport_that_never_wrote_wake_at_once() {
        let t0 = Instant::now();
        let plain = RoomFeed::new(8);
        let w = Waiter::new();
        w.rx.wrote(t0);
        plain.wait(&w.follower);
        plain.append(entry(1), Some(t0));
        assert_eq!(w.woken(), 1);
        assert_eq!(plain.next_release(), None);
        let feed = holding_feed();
        let never = Waiter::new();
        feed.wait(&never.follower);
        feed.append(entry(1), Some(t0));
        assert_eq!(never.woken(), 1);
    }

    #[test]
    fn closing_the_room_drops_held_wake_ups() {
        let feed = holding_feed();
        let t0 = Instant::now();
        let w = Waiter::new();
        w.rx.wrote(t0);
        feed.wait(&w.follower);
        feed.append(entry(1), Some(t0));
        assert!(feed.next_release().is_some());
        feed.forget_all();
        assert_eq!(feed.next_release(), None);
        assert!(!w.follower.listed.load(Ordering::SeqCst));
    }

    #[test]
    fn a_forgotten_follower_leaves_the_waiting_list() {
        let feed = RoomFeed::new(8);
        let (out, _rx) = super::super::Outbox::new(4, super::super::ConnectionControl::new());
        let followers: Vec<_> = (0..3)
            .map(|_| Follower::new(out.queue.clone(), 0))
            .collect();
        for f in &followers {
            feed.wait(f);
            feed.wait(f);
        }
        assert_eq!(feed.waiting.lock().unwrap().len(), 3, "listed once each");
        feed.forget(&followers[1]);
        feed.forget(&followers[1]);
        let waiting = feed.waiting.lock().unwrap();
        assert_eq!(waiting.len(), 2);
        assert!(waiting.iter().all(|w| !Arc::ptr_eq(w, &followers[1])));
        drop(waiting);
        feed.forget_all();
        assert!(feed.waiting.lock().unwrap().is_empty());
        // Unlisted: a follower that waits again is listed again.
        feed.wait(&followers[0]);
        assert_eq!(feed.waiting.lock().unwrap().len(), 1);
    }
}
