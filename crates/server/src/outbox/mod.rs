//! A connection's bounded send queue.
//!
//! Room tasks push already-encoded frames with [`Outbox::send`], which never
//! waits: if the queue is full the connection is marked a slow consumer and
//! closed (close code 4002), so one slow client can never stall a room or grow
//! the server's memory without bound. The client resumes and catches up from
//! the room history.
//!
//! A member that follows its room's [`RoomFeed`] is not queued the room's
//! events one by one: its receiver reads them from the feed, in order with
//! what is queued (see `feed.rs`).

mod feed;

use std::collections::VecDeque;
use std::ops::ControlFlow;
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU16, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, RawWakerVTable, Wake, Waker};
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures_util::task::AtomicWaker;
use plaza_core::{HistoryEntry, LiveFilter};
use plaza_protocol::CloseCode;
use tokio_util::sync::CancellationToken;

use feed::{Barrier, Lagged};
pub use feed::{FeedConfig, Follower, RoomFeed};

/// One queued frame.
///
/// A room event is queued as its history entry, not only its bytes: per-member
/// delivery (delivery policies, interest management) decides on its seq,
/// channel and topic, and the entry costs the same reference count as its
/// bytes would.
#[derive(Debug)]
pub enum Outgoing {
    /// A room event.
    Event {
        /// The entry; its `frame` is what is sent.
        entry: Arc<HistoryEntry>,
        /// When the room ordered it, for the delivery latency: taken once per
        /// event and shared by every recipient, so sampling costs nothing per
        /// recipient. `None` for events a delivery policy held.
        ordered_at: Option<Instant>,
    },
    /// A room event a resume replays (it missed it): over and above the
    /// queue's bound until read (see [`Outbox::replay`]).
    Replayed(Arc<HistoryEntry>),
    /// Any other frame: an answer, an error, a direct message.
    Frame(Bytes),
}

impl Outgoing {
    /// The encoded frame.
    pub fn frame(&self) -> &Bytes {
        match self {
            Outgoing::Event { entry, .. } | Outgoing::Replayed(entry) => &entry.frame,
            Outgoing::Frame(f) => f,
        }
    }

    /// The room event, for an event (live or replayed).
    pub fn entry(&self) -> Option<&Arc<HistoryEntry>> {
        match self {
            Outgoing::Event { entry, .. } | Outgoing::Replayed(entry) => Some(entry),
            Outgoing::Frame(_) => None,
        }
    }

    /// Whether a resume replays it.
    pub fn is_replayed(&self) -> bool {
        matches!(self, Outgoing::Replayed(_))
    }

    /// When the room ordered it, for a live room event.
    pub fn ordered_at(&self) -> Option<Instant> {
        match self {
            Outgoing::Event { ordered_at, .. } => *ordered_at,
            Outgoing::Replayed(_) | Outgoing::Frame(_) => None,
        }
    }

    /// The frame by reference, as [`OutboxReceiver::drain_into`] hands it.
    pub fn as_ref(&self) -> FrameRef<'_> {
        match self {
            Outgoing::Event { entry, ordered_at } => FrameRef::Event {
                entry,
                ordered_at: *ordered_at,
            },
            Outgoing::Replayed(entry) => FrameRef::Event {
                entry,
                ordered_at: None,
            },
            Outgoing::Frame(f) => FrameRef::Frame(f),
        }
    }
}

/// A frame handed to a writer by reference ([`OutboxReceiver::drain_into`]):
/// a followed feed's events are written from the feed, not copied out of it.
#[derive(Debug, Clone, Copy)]
pub enum FrameRef<'a> {
    /// A room event, live or replayed.
    Event {
        /// The entry; its `frame` is what is sent.
        entry: &'a HistoryEntry,
        /// When the room ordered it, for a live event (see [`Outgoing::Event`]).
        ordered_at: Option<Instant>,
    },
    /// Any other frame.
    Frame(&'a Bytes),
}

impl<'a> FrameRef<'a> {
    /// The encoded frame.
    pub fn frame(&self) -> &'a Bytes {
        match self {
            FrameRef::Event { entry, .. } => &entry.frame,
            FrameRef::Frame(f) => f,
        }
    }

    /// The room event, for an event.
    pub fn entry(&self) -> Option<&'a HistoryEntry> {
        match self {
            FrameRef::Event { entry, .. } => Some(entry),
            FrameRef::Frame(_) => None,
        }
    }

    /// When the room ordered it, for a live room event.
    pub fn ordered_at(&self) -> Option<Instant> {
        match self {
            FrameRef::Event { ordered_at, .. } => *ordered_at,
            FrameRef::Frame(_) => None,
        }
    }
}

/// Where a receiver puts what it takes, in order.
trait Emit {
    /// How many frames it has taken.
    fn taken(&self) -> usize;
    /// An event of a followed feed that the member receives.
    fn fed(&mut self, e: &feed::FedEvent);
    /// A queued frame.
    fn queued(&mut self, o: Outgoing);
}

/// Frames kept to hand out later ([`OutboxReceiver::take_batch`]).
impl Emit for VecDeque<Outgoing> {
    fn taken(&self) -> usize {
        self.len()
    }

    fn fed(&mut self, e: &feed::FedEvent) {
        self.push_back(Outgoing::Event {
            entry: e.entry.clone(),
            ordered_at: e.ordered_at,
        });
    }

    fn queued(&mut self, o: Outgoing) {
        self.push_back(o);
    }
}

/// Frames handed at once to a writer ([`OutboxReceiver::drain_into`]).
struct Handing<F> {
    put: F,
    taken: usize,
}

impl<F: FnMut(FrameRef<'_>)> Emit for Handing<F> {
    fn taken(&self) -> usize {
        self.taken
    }

    fn fed(&mut self, e: &feed::FedEvent) {
        self.taken += 1;
        (self.put)(FrameRef::Event {
            entry: &e.entry,
            ordered_at: e.ordered_at,
        });
    }

    fn queued(&mut self, o: Outgoing) {
        self.taken += 1;
        (self.put)(o.as_ref());
    }
}

/// State shared by a connection's reader, writer and every outbox handle.
#[derive(Debug)]
pub struct ConnectionControl {
    /// Unique among this process's connections (cluster mode names a member's
    /// connection by node id and this number).
    id: u64,
    /// Cancelled when the connection must close.
    pub closed: CancellationToken,
    close_code: AtomicU16,
    /// The connection's task, woken by [`ConnectionControl::close`]: it
    /// checks one atomic per wake-up, where polling `closed` takes a lock.
    task: AtomicWaker,
    /// Rooms whose session on this connection was taken over by a resume on
    /// another connection; the reader forgets them.
    evicted: Mutex<Vec<String>>,
    /// Its client gets room messages in the compact form (`plaza.v1.compact`),
    /// so its `joined` frames carry each room's key.
    compact: bool,
}

impl ConnectionControl {
    /// A live connection whose client gets every frame in v1.
    pub fn new() -> Arc<Self> {
        ConnectionControl::with_compact(false)
    }

    /// A live connection, whose client gets room messages in the compact
    /// form if `compact`.
    pub fn with_compact(compact: bool) -> Arc<Self> {
        static NEXT_ID: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
        Arc::new(ConnectionControl {
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            closed: CancellationToken::new(),
            close_code: AtomicU16::new(0),
            task: AtomicWaker::new(),
            evicted: Mutex::new(Vec::new()),
            compact,
        })
    }

    /// Whether its client gets room messages in the compact form.
    pub fn is_compact(&self) -> bool {
        self.compact
    }

    /// This connection's id, unique in this process.
    pub fn id(&self) -> u64 {
        self.id
    }

    /// Notes that this connection's session in `room` now lives on another connection.
    pub fn evict(&self, room: &str) {
        self.evicted
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(room.to_owned());
    }

    /// Takes the rooms evicted since the last call.
    pub fn take_evicted(&self) -> Vec<String> {
        std::mem::take(&mut *self.evicted.lock().unwrap_or_else(|p| p.into_inner()))
    }

    /// Closes the connection with `code`, unless it is closing already.
    pub fn close(&self, code: CloseCode) {
        if self
            .close_code
            .compare_exchange(0, code.code(), Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
        {
            self.closed.cancel();
            self.task.wake();
        }
    }

    /// Ready once the connection is closing ([`ConnectionControl::close`]);
    /// else the task is woken when it is. For the one task that serves the
    /// connection: a later poll from another task takes the wake-up over.
    pub fn poll_closed(&self, cx: &mut Context<'_>) -> Poll<()> {
        if self.close_code().is_some() {
            return Poll::Ready(());
        }
        self.task.register(cx.waker());
        // A close between the check and the registration woke nobody.
        if self.close_code().is_some() {
            return Poll::Ready(());
        }
        Poll::Pending
    }

    /// The close code, once closing.
    pub fn close_code(&self) -> Option<u16> {
        match self.close_code.load(Ordering::Acquire) {
            0 => None,
            c => Some(c),
        }
    }
}

/// The queue between room tasks (producers) and the connection's task.
///
/// A `VecDeque` under a mutex rather than a channel: it holds no memory while
/// empty (a channel keeps its blocks), and the consumer gives the memory of a
/// burst back once it has drained it. The waiting consumer's waker sits under
/// the same lock, so queueing a frame and waking the connection take one lock
/// (for a member handed its room's events, that is per delivery).
///
/// Laid out in declaration order: what a connection's task looks at on
/// every turn comes first, next to the reference counts, so that a turn
/// loads one or two cache lines of it (and none of the control's).
#[derive(Debug)]
#[repr(C)]
struct Queue {
    /// The consumer found nothing queued and left its waker: set by the
    /// consumer, cleared by whoever queues or takes the waker, both under
    /// the `items` lock. While it is set the consumer knows, without the
    /// lock, that nothing is queued and that a producer will wake it (a
    /// busy connection's turns meet the lock only when something was
    /// queued: two lock round trips per write otherwise).
    consumer_waits: AtomicBool,
    /// The connection's transport waker woke its task (see
    /// [`OutboxReceiver::transport_waker`]).
    transport_woken: AtomicBool,
    open: AtomicBool,
    /// When the connection last wrote, in µs of [`process_micros`] (0: never):
    /// the feeds it follows hold its wake-ups while it is busy.
    last_write: AtomicU64,
    /// The connection's task, woken by an event in a feed it follows.
    feed_waker: AtomicWaker,
    items: Mutex<Frames>,
    capacity: usize,
    /// Replayed events still queued, over and above `capacity` (changed
    /// only under the `items` lock): a resume's replay is as long as the
    /// room's history allows, and a client that reads it is no slow consumer.
    replaying: AtomicUsize,
    /// The connection's task, for its transport waker: behind a lock,
    /// since transport wake-ups are rare (a client's message, the close)
    /// and the receiver lets the task go when it is dropped (rooms and
    /// feeds may hold the queue a little longer; the task's memory must
    /// not wait for them).
    task: Mutex<Option<Waker>>,
}

/// The transport waker: it notes that it woke the task, in the line the
/// task looks at anyway, and wakes the task.
impl Wake for Queue {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.transport_woken.store(true, Ordering::Release);
        let task = self.task.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(task) = &*task {
            task.wake_by_ref();
        }
    }
}

impl Queue {
    /// Whether the connection wrote less than `window` before `now`.
    fn busy_at(&self, now: Instant, window: Duration) -> bool {
        let last = self.last_write.load(Ordering::Relaxed);
        last != 0 && process_micros(now) < last.saturating_add(window.as_micros() as u64)
    }
}

/// Microseconds from the first call in this process, plus one (so never 0):
/// an instant that fits an atomic.
fn process_micros(t: Instant) -> u64 {
    static START: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    let start = *START.get_or_init(Instant::now);
    t.saturating_duration_since(start).as_micros() as u64 + 1
}

/// What the queue's lock guards.
#[derive(Debug, Default)]
struct Frames {
    queued: VecDeque<Queued>,
    /// The consumer, while it waits for a frame.
    waiter: Option<Waker>,
}

/// One queued item and, for an item a room queued, where the room's feed
/// was then: the receiver takes the feed's events before it first.
#[derive(Debug)]
struct Queued {
    item: Item,
    after: Option<Barrier>,
}

#[derive(Debug)]
enum Item {
    /// A frame to send.
    Out(Outgoing),
    /// From here on, read the room's events from its feed.
    Follow(Box<Follow>),
    /// Stop reading the feed with this id.
    Unfollow(u64),
    /// The member's channels changed: the feed's events from here on are
    /// picked by these.
    Rechannel(u64, Arc<[String]>),
}

#[derive(Debug)]
struct Follow {
    feed: Arc<RoomFeed>,
    follower: Arc<Follower>,
    session: Arc<str>,
    channels: Arc<[String]>,
    /// The feed's end when the receiver took this from the queue (read
    /// under the queue's lock): the new cursor's `seen`.
    seen: u64,
}

impl Queued {
    fn is_replayed(&self) -> bool {
        matches!(&self.item, Item::Out(o) if o.is_replayed())
    }
}

/// A member's place in one feed, kept by its connection's receiver.
#[derive(Debug)]
struct Cursor {
    feed: Arc<RoomFeed>,
    follower: Arc<Follower>,
    /// The next position to read.
    next: u64,
    /// Which of the feed's events are the member's.
    filter: LiveFilter,
    /// The feed's end when the receiver last looked at its queue: the
    /// events before it were fed before anything queued since, so they are
    /// taken now; those after wait for the next look.
    seen: u64,
}

impl Cursor {
    fn unread(&self) -> bool {
        self.feed.end() > self.next
    }

    /// Puts the events it receives up to `to` (or the feed's end) in `out`,
    /// until `out` has taken `max`. False if it fell too far behind.
    fn read(&mut self, to: u64, max: usize, out: &mut impl Emit) -> bool {
        let filter = &self.filter;
        let result = self.feed.read(self.next, to, |e| {
            if out.taken() >= max {
                return ControlFlow::Break(());
            }
            if filter.receives(&e.entry) {
                out.fed(e);
            }
            ControlFlow::Continue(())
        });
        match result {
            Ok(next) => {
                self.next = next;
                self.follower.read_up_to(next);
                true
            }
            Err(Lagged) => false,
        }
    }
}

impl Frames {
    /// The waiting consumer, to wake once the lock is released.
    fn take_waiter(&mut self) -> Option<Waker> {
        self.waiter.take()
    }
}

/// A cheap, clonable handle that queues frames for one connection.
#[derive(Debug, Clone)]
pub struct Outbox {
    queue: Arc<Queue>,
    control: Arc<ConnectionControl>,
    /// The room's feed, for a handle a room queues through: what it queues
    /// comes after the room's events fed so far.
    feed: Option<Arc<RoomFeed>>,
}

/// The receiving end, owned by the connection's task.
#[derive(Debug)]
pub struct OutboxReceiver {
    queue: Arc<Queue>,
    control: Arc<ConnectionControl>,
    /// The feeds it follows.
    cursors: Vec<Cursor>,
    /// Frames taken from the queue and the feeds, not yet handed out.
    staged: VecDeque<Outgoing>,
    /// Which waker it left in the queue when it last found it empty.
    waiter: RegisteredWaker,
}

/// Which waker a consumer left in its queue (the waker itself is in the
/// queue, under its lock): kept by the consumer, so that it can tell
/// without the lock whether the waker it polls with is the one left.
/// Atomics only so that the receiver can be shared by reference
/// ([`OutboxReceiver::ready`]); only its consumer touches them.
#[derive(Debug)]
struct RegisteredWaker {
    data: AtomicPtr<()>,
    vtable: AtomicPtr<RawWakerVTable>,
}

impl Default for RegisteredWaker {
    fn default() -> Self {
        RegisteredWaker {
            data: AtomicPtr::new(std::ptr::null_mut()),
            vtable: AtomicPtr::new(std::ptr::null_mut()),
        }
    }
}

impl RegisteredWaker {
    fn set(&self, w: &Waker) {
        self.data.store(w.data().cast_mut(), Ordering::Relaxed);
        self.vtable
            .store(std::ptr::from_ref(w.vtable()).cast_mut(), Ordering::Relaxed);
    }

    /// Whether `w` wakes the same task in the same way as the waker left
    /// (as [`Waker::will_wake`] compares them).
    fn is(&self, w: &Waker) -> bool {
        self.data.load(Ordering::Relaxed) == w.data().cast_mut()
            && std::ptr::eq(self.vtable.load(Ordering::Relaxed), w.vtable())
    }
}

/// Where the frames ready to be taken come from
/// ([`OutboxReceiver::poll_source`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// The connection's queue (and maybe feeds too).
    Queued,
    /// Only the feeds it follows. A feed wakes a busy connection a
    /// coalescing window after the event (see [`RoomFeed`]): by then, its write
    /// is due.
    Fed,
}

/// Returned by [`OutboxReceiver::try_recv`] when nothing is queued.
#[cfg(test)]
#[derive(Debug, PartialEq, Eq)]
pub struct Empty;

impl Outbox {
    /// A queue holding at most `capacity` frames.
    pub fn new(capacity: usize, control: Arc<ConnectionControl>) -> (Outbox, OutboxReceiver) {
        let queue = Arc::new(Queue {
            consumer_waits: AtomicBool::new(false),
            // The first turn looks at the transport.
            transport_woken: AtomicBool::new(true),
            open: AtomicBool::new(true),
            last_write: AtomicU64::new(0),
            feed_waker: AtomicWaker::new(),
            items: Mutex::new(Frames::default()),
            capacity: capacity.max(1),
            replaying: AtomicUsize::new(0),
            task: Mutex::new(None),
        });
        (
            Outbox {
                queue: queue.clone(),
                control: control.clone(),
                feed: None,
            },
            OutboxReceiver {
                queue,
                control,
                cursors: Vec::new(),
                staged: VecDeque::new(),
                waiter: RegisteredWaker::default(),
            },
        )
    }

    /// This handle for `feed`'s room: what is queued through it is ordered
    /// after the events fed so far.
    pub fn with_feed(&self, feed: &Arc<RoomFeed>) -> Outbox {
        Outbox {
            queue: self.queue.clone(),
            control: self.control.clone(),
            feed: Some(feed.clone()),
        }
    }

    /// Whether its connection still reads it.
    pub fn is_open(&self) -> bool {
        self.queue.open.load(Ordering::Acquire)
    }

    /// From the feed's end on, the connection reads the room's events for
    /// `session` (on `channels`) from the room's feed ([`Outbox::with_feed`])
    /// instead of being queued them. `None` for a handle without a feed or
    /// a connection that is gone.
    pub fn follow(
        &self,
        session: impl Into<Arc<str>>,
        channels: impl Into<Arc<[String]>>,
    ) -> Option<Arc<Follower>> {
        let feed = self.feed.as_ref()?;
        let follower = Follower::new(self.queue.clone(), feed.end());
        let follow = Follow {
            feed: feed.clone(),
            follower: follower.clone(),
            session: session.into(),
            channels: channels.into(),
            seen: 0,
        };
        self.push_control(Item::Follow(Box::new(follow)))
            .then_some(follower)
    }

    /// The connection stops reading the room's feed after its events so far.
    pub fn unfollow(&self) {
        if let Some(feed) = &self.feed {
            self.push_control(Item::Unfollow(feed.id()));
        }
    }

    /// The room's events after those fed so far are picked by `channels`.
    pub fn rechannel(&self, channels: impl Into<Arc<[String]>>) {
        if let Some(feed) = &self.feed {
            self.push_control(Item::Rechannel(feed.id(), channels.into()));
        }
    }

    /// Queues what tells the receiver how to read a feed: never refused
    /// for a full queue (membership changes bound them, not traffic).
    fn push_control(&self, item: Item) -> bool {
        self.enqueue(item, false)
    }

    /// Queues a frame without waiting. Returns false if the connection is
    /// gone or was just closed as a slow consumer.
    pub fn send(&self, frame: Bytes) -> bool {
        self.push(Outgoing::Frame(frame))
    }

    /// Queues a room event (see [`Outgoing::Event`]); false as for [`Outbox::send`].
    pub fn send_event(&self, entry: &Arc<HistoryEntry>, ordered_at: Option<Instant>) -> bool {
        self.push(Outgoing::Event {
            entry: entry.clone(),
            ordered_at,
        })
    }

    fn push(&self, item: Outgoing) -> bool {
        self.enqueue(Item::Out(item), true)
    }

    /// Queues `item` after the room's events fed so far; a `bounded` item
    /// finding the queue full closes the connection as a slow consumer.
    fn enqueue(&self, item: Item, bounded: bool) -> bool {
        let q = &self.queue;
        if !q.open.load(Ordering::Acquire) {
            return false;
        }
        let after = self.feed.as_ref().map(|f| f.barrier());
        let mut items = q.items.lock().unwrap_or_else(|p| p.into_inner());
        if bounded && items.queued.len() >= q.capacity + q.replaying.load(Ordering::Relaxed) {
            drop(items);
            self.control.close(CloseCode::SlowConsumer);
            return false;
        }
        items.queued.push_back(Queued { item, after });
        q.consumer_waits.store(false, Ordering::Relaxed);
        let waiter = items.take_waiter();
        drop(items);
        if let Some(w) = waiter {
            w.wake();
        }
        true
    }

    /// Queues the events a resume replays, all of them, whatever the queue
    /// holds: they count against the slow-consumer bound only once read. The
    /// room's history bounds them, and they are shared buffers (a pointer
    /// each). False as for [`Outbox::send`].
    pub fn replay(&self, entries: &[Arc<HistoryEntry>]) -> bool {
        let q = &self.queue;
        if !q.open.load(Ordering::Acquire) {
            return false;
        }
        if entries.is_empty() {
            return true;
        }
        let after = self.feed.as_ref().map(|f| f.barrier());
        let mut items = q.items.lock().unwrap_or_else(|p| p.into_inner());
        items.queued.extend(entries.iter().map(|e| Queued {
            item: Item::Out(Outgoing::Replayed(e.clone())),
            after,
        }));
        q.replaying.fetch_add(entries.len(), Ordering::Relaxed);
        q.consumer_waits.store(false, Ordering::Relaxed);
        let waiter = items.take_waiter();
        drop(items);
        if let Some(w) = waiter {
            w.wake();
        }
        true
    }

    /// The connection this outbox feeds.
    pub fn control(&self) -> &Arc<ConnectionControl> {
        &self.control
    }
}

impl OutboxReceiver {
    /// The connection wrote at `at`: the feeds it follows hold its wake-ups
    /// for a window from then (see [`RoomFeed`]). Transports that do not
    /// coalesce their writes never call it, and are woken at once.
    pub fn wrote(&self, at: Instant) {
        self.queue
            .last_write
            .store(process_micros(at), Ordering::Relaxed);
    }

    /// A waker for what the connection's transport waits for besides its
    /// queue (its socket's readiness, the close): waking it notes the
    /// wake-up beside the queue's state, which the task looks at on every
    /// turn anyway, and wakes `task`. So a turn learns whether the socket
    /// or the close woke it without loading their state. For the one task
    /// that serves the connection for its whole life: the first `task` is
    /// the one woken.
    pub fn transport_waker(&self, task: &Waker) -> Waker {
        self.queue
            .task
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get_or_insert_with(|| task.clone());
        Waker::from(self.queue.clone())
    }

    /// Whether the transport waker woke the task since the last call (true
    /// on the first).
    pub fn take_transport_wake(&self) -> bool {
        // A load first: most turns were woken by something else, and find
        // it down without a read-modify-write.
        self.queue.transport_woken.load(Ordering::Relaxed)
            && self.queue.transport_woken.swap(false, Ordering::AcqRel)
    }

    /// Notes a transport wake-up for the next turn to see: what woke this
    /// turn (a readable socket) is still there.
    pub fn keep_transport_wake(&self) {
        self.queue.transport_woken.store(true, Ordering::Release);
    }

    /// Waits until something is queued, taking nothing: a writer that
    /// holds its next write (coalescing) keeps the frames where producers
    /// can still add to them and the connection's close can still find them.
    pub fn ready(&self) -> impl std::future::Future<Output = ()> + '_ {
        std::future::poll_fn(|cx| self.poll_ready(cx))
    }

    /// [`OutboxReceiver::ready`] as a poll: ready when something is queued
    /// (or unread in a followed feed), else the task is woken by the next
    /// frame queued or event fed.
    pub fn poll_ready(&self, cx: &mut Context<'_>) -> Poll<()> {
        self.poll_source(cx).map(|_| ())
    }

    /// [`OutboxReceiver::poll_ready`], saying where what is ready comes from.
    pub fn poll_source(&self, cx: &mut Context<'_>) -> Poll<Source> {
        if !self.staged.is_empty() {
            return Poll::Ready(Source::Queued);
        }
        if !self.waits_with(cx.waker()) {
            let mut items = self.frames();
            if !items.queued.is_empty() {
                return Poll::Ready(Source::Queued);
            }
            match &mut items.waiter {
                Some(w) if w.will_wake(cx.waker()) => {}
                slot => *slot = Some(cx.waker().clone()),
            }
            self.waiter.set(cx.waker());
            self.queue.consumer_waits.store(true, Ordering::Relaxed);
        }
        if self.cursors.is_empty() {
            return Poll::Pending;
        }
        if self.cursors.iter().any(Cursor::unread) {
            return Poll::Ready(Source::Fed);
        }
        self.queue.feed_waker.register(cx.waker());
        for c in &self.cursors {
            c.feed.wait(&c.follower);
        }
        // An event fed between the look and the listing woke nobody.
        if self.cursors.iter().any(Cursor::unread) {
            return Poll::Ready(Source::Fed);
        }
        Poll::Pending
    }

    /// Whether nothing was queued since it last looked and its waker left
    /// then is `waker`: a producer will wake it, and the lock need not be
    /// taken to know the queue is empty.
    fn waits_with(&self, waker: &Waker) -> bool {
        // Set and cleared under the lock; a stale "set" only delays the look
        // to the producer's wake-up, which follows its clear.
        self.queue.consumer_waits.load(Ordering::Relaxed) && self.waiter.is(waker)
    }

    /// Takes up to `max` frames, oldest first: what is queued, under one
    /// lock (producers, the room fanning out, meet the lock once per batch),
    /// with the followed feeds' events in their place.
    pub fn take_batch(&mut self, max: usize) -> VecDeque<Outgoing> {
        if self.staged.len() < max {
            let mut staged = std::mem::take(&mut self.staged);
            self.stage(max, &mut staged);
            self.staged = staged;
        }
        if self.staged.len() <= max {
            std::mem::take(&mut self.staged)
        } else {
            self.staged.drain(..max).collect()
        }
    }

    /// Takes the next frame if one is queued (for tests: the transports
    /// take batches).
    #[cfg(test)]
    pub fn try_recv(&mut self) -> Result<Outgoing, Empty> {
        self.take_batch(1).pop_front().ok_or(Empty)
    }

    /// [`OutboxReceiver::take_batch`] for a writer that copies each frame
    /// into its write at once: hands `max` frames (or more, as there) to
    /// `put`, by reference. Returns how many.
    pub fn drain_into(&mut self, max: usize, put: impl FnMut(FrameRef<'_>)) -> usize {
        let mut out = Handing { put, taken: 0 };
        // What an earlier take left staged goes first.
        while out.taken < max {
            match self.staged.pop_front() {
                Some(o) => out.queued(o),
                None => break,
            }
        }
        if out.taken < max && self.staged.is_empty() {
            self.stage(max, &mut out);
        }
        out.taken
    }

    /// Puts what is queued in `out`, the feeds' events in their place,
    /// until it has taken `max` frames, or more: the feeds' events before a
    /// queued frame always go with it, up to a feed's capacity
    /// (`send_queue_frames`) for a connection that was far behind.
    fn stage(&mut self, max: usize, out: &mut impl Emit) {
        // Control items take a place in a round but give no frame: go on
        // until `max` frames or an empty queue.
        loop {
            let room = max.saturating_sub(out.taken());
            if room == 0 {
                return;
            }
            // The feeds' ends before the queue is looked at: a frame queued
            // after the look was queued after these events, so they go
            // first, and the events fed meanwhile wait for the next look.
            for c in &mut self.cursors {
                c.seen = c.feed.end();
            }
            if !self.take_queued(room, out) {
                break;
            }
        }
        // With nothing queued, no frame waits for the feeds' events.
        let mut i = 0;
        while i < self.cursors.len() {
            let seen = self.cursors[i].seen;
            if self.read_cursor(i, seen, max, out) {
                i += 1;
            }
        }
    }

    /// Takes up to `room` queued items, each after the feed's events before
    /// it; true if more is queued.
    fn take_queued(&mut self, room: usize, out: &mut impl Emit) -> bool {
        // Set under the lock by its last look, which found nothing, and
        // cleared under it by every producer since. A frame queued before
        // the feeds' ends read by `stage` (with Acquire) has its clear seen.
        if self.queue.consumer_waits.load(Ordering::Relaxed) {
            return false;
        }
        let (mut taken, more) = {
            let mut items = self.frames();
            let queued = &mut items.queued;
            // The queue's own buffer goes with what is taken: a connection
            // that follows a feed is queued little, and keeps no buffer for it.
            let mut taken: VecDeque<Queued> = if queued.len() <= room {
                std::mem::take(queued)
            } else {
                queued.drain(..room).collect()
            };
            // A feed newly followed is seen as `stage` saw the others: its end
            // before anything still queued, or queued from now on, was.
            for q in &mut taken {
                if let Item::Follow(f) = &mut q.item {
                    f.seen = f.feed.end();
                }
            }
            (taken, !queued.is_empty())
        };
        let replayed = taken.iter().filter(|q| q.is_replayed()).count();
        if replayed > 0 {
            self.queue.replaying.fetch_sub(replayed, Ordering::Relaxed);
        }
        while let Some(q) = taken.pop_front() {
            match q.after {
                Some(b) => self.read_feed(b.feed, b.pos, usize::MAX, out),
                // The connection's own frame (a pong, an error about a frame):
                // after every event fed before it was queued, as it would be
                // were those queued too (a ping is the client's barrier).
                // Those may be many: the batch grows past its size rather
                // than hold the frame back.
                None => self.read_feeds_before(&taken, out),
            }
            match q.item {
                Item::Out(o) => out.queued(o),
                Item::Follow(f) => {
                    let Follow {
                        feed,
                        follower,
                        session,
                        channels,
                        seen,
                    } = *f;
                    self.cursors.retain(|c| c.feed.id() != feed.id());
                    self.cursors.push(Cursor {
                        next: follower.pos(),
                        feed,
                        follower,
                        filter: LiveFilter::new(session, channels),
                        seen,
                    });
                }
                Item::Unfollow(id) => self.cursors.retain(|c| c.feed.id() != id),
                Item::Rechannel(id, channels) => {
                    if let Some(c) = self.cursors.iter_mut().find(|c| c.feed.id() == id) {
                        c.filter = c.filter.with_channels(channels);
                    }
                }
            }
        }
        more
    }

    /// Puts the events of feed `id` up to `to` in `out`, while it has taken
    /// fewer than `max` frames. A follower that fell too far behind is a slow
    /// consumer: it is closed, and catches up by resuming.
    fn read_feed(&mut self, id: u64, to: u64, max: usize, out: &mut impl Emit) {
        if let Some(i) = self.cursors.iter().position(|c| c.feed.id() == id) {
            self.read_cursor(i, to, max, out);
        }
    }

    /// Every followed feed up to what the receiver saw before it looked at
    /// its queue (`seen`: every event fed before a frame it found there),
    /// and not past the barrier of a frame `later` in the queue: an event
    /// fed after that frame was queued goes after it.
    fn read_feeds_before(&mut self, later: &VecDeque<Queued>, out: &mut impl Emit) {
        let mut i = 0;
        while i < self.cursors.len() {
            let (id, seen) = (self.cursors[i].feed.id(), self.cursors[i].seen);
            let to = later
                .iter()
                .find_map(|q| q.after.filter(|b| b.feed == id))
                .map_or(seen, |b| b.pos.min(seen));
            if self.read_cursor(i, to, usize::MAX, out) {
                i += 1;
            }
        }
    }

    /// Reads cursor `i`; false if it fell too far behind and is gone.
    fn read_cursor(&mut self, i: usize, to: u64, max: usize, out: &mut impl Emit) -> bool {
        if self.cursors[i].read(to, max, out) {
            return true;
        }
        self.control.close(CloseCode::SlowConsumer);
        self.cursors.swap_remove(i);
        false
    }

    fn frames(&self) -> std::sync::MutexGuard<'_, Frames> {
        self.queue.items.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl Drop for OutboxReceiver {
    fn drop(&mut self) {
        self.queue.open.store(false, Ordering::Release);
        let mut items = self.frames();
        items.queued.clear();
        items.waiter = None;
        drop(items);
        // The task's wakers go with it: what still holds the queue (a room's
        // handle, a feed's follower) must not keep the task's memory.
        self.queue.feed_waker.take();
        self.queue
            .task
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_queue_closes_the_connection_as_slow_consumer() {
        let control = ConnectionControl::new();
        let (out, mut rx) = Outbox::new(2, control.clone());
        assert!(out.send(Bytes::from_static(b"1")));
        assert!(out.send(Bytes::from_static(b"2")));
        assert!(!out.send(Bytes::from_static(b"3")));
        assert_eq!(control.close_code(), Some(CloseCode::SlowConsumer.code()));
        assert!(control.closed.is_cancelled());
        assert_eq!(rx.try_recv().unwrap().frame(), "1");
        // a later close does not overwrite the first reason
        control.close(CloseCode::Restarting);
        assert_eq!(control.close_code(), Some(4002));
    }

    #[test]
    fn a_drained_burst_gives_its_memory_back_and_a_dropped_receiver_refuses() {
        let (out, mut rx) = Outbox::new(1000, ConnectionControl::new());
        for i in 0..100u8 {
            assert!(out.send(Bytes::from(vec![i])));
        }
        for i in 0..100u8 {
            assert_eq!(*rx.try_recv().unwrap().frame(), Bytes::from(vec![i]));
        }
        assert_eq!(rx.try_recv().unwrap_err(), Empty);
        assert_eq!(kept(&rx), 0, "the last take took the queue's buffer");
        drop(rx);
        assert!(!out.send(Bytes::from_static(b"late")));
        assert!(
            out.control().close_code().is_none(),
            "a closed connection is not a slow consumer"
        );
    }

    /// Queue slots a receiver keeps.
    fn kept(rx: &OutboxReceiver) -> usize {
        rx.queue.items.lock().unwrap().queued.capacity()
    }

    #[test]
    fn a_quiet_connection_keeps_no_queue_memory() {
        let (out, mut rx) = Outbox::new(1000, ConnectionControl::new());
        out.send(Bytes::from_static(b"a"));
        out.send(Bytes::from_static(b"b"));
        assert_eq!(rx.try_recv().unwrap().frame(), "a");
        assert!(kept(&rx) > 0, "a partial take leaves the queue its buffer");
        // The take that empties the queue takes its buffer along: an idle
        // connection holds none, with nothing to give back later.
        assert_eq!(rx.try_recv().unwrap().frame(), "b");
        assert_eq!(kept(&rx), 0);
        out.send(Bytes::from_static(b"c"));
        out.send(Bytes::from_static(b"d"));
        assert_eq!(rx.take_batch(10).len(), 2);
        assert_eq!(kept(&rx), 0);
    }

    /// A room-wide event (no sender, no channel) with this seq.
    pub(super) fn entry(seq: u64) -> Arc<HistoryEntry> {
        event(seq, None, None, false)
    }

    /// A message on `channel` from `from`, echoed to it or not.
    fn message(seq: u64, from: &str, channel: &str, echo: bool) -> Arc<HistoryEntry> {
        event(seq, Some(from), Some(channel), echo)
    }

    fn event(seq: u64, from: Option<&str>, channel: Option<&str>, echo: bool) -> Arc<HistoryEntry> {
        Arc::new(HistoryEntry {
            seq,
            ts: 1,
            from: from.map(Into::into),
            channel: channel.map(Into::into),
            echo,
            replay_to_sender: false,
            topic: None,
            reply_to: None,
            scope: plaza_core::Scope::All,
            frame: Bytes::from(format!("{{\"seq\":{seq}}}")),
            wire: Default::default(),
        })
    }

    #[test]
    fn a_replay_longer_than_the_queue_is_no_slow_consumer_until_it_is_read() {
        let control = ConnectionControl::new();
        let (out, mut rx) = Outbox::new(2, control.clone());
        assert!(out.send(Bytes::from_static(b"joined")));
        let missed: Vec<_> = (1..=10).map(entry).collect();
        assert!(out.replay(&missed));
        assert!(out.send(Bytes::from_static(b"live")));
        assert_eq!(control.close_code(), None);
        // Reading gives the allowance back: with the replay read, the queue's
        // own bound holds again.
        assert_eq!(rx.try_recv().unwrap().frame(), "joined");
        for seq in 1..=10 {
            assert_eq!(
                rx.try_recv().unwrap().frame(),
                &format!("{{\"seq\":{seq}}}")
            );
        }
        assert!(out.send(Bytes::from_static(b"live 2")));
        assert!(!out.send(Bytes::from_static(b"live 3")));
        assert_eq!(control.close_code(), Some(CloseCode::SlowConsumer.code()));
    }

    #[test]
    fn a_room_event_is_queued_as_its_history_entry() {
        let (out, mut rx) = Outbox::new(4, ConnectionControl::new());
        let entry = Arc::new(HistoryEntry {
            seq: 7,
            ts: 1,
            from: None,
            channel: Some("xr".into()),
            echo: false,
            replay_to_sender: false,
            topic: Some("t".into()),
            reply_to: None,
            scope: plaza_core::Scope::All,
            frame: Bytes::from_static(b"{\"seq\":7}"),
            wire: Default::default(),
        });
        let at = Instant::now();
        assert!(out.send_event(&entry, Some(at)));
        assert!(out.send(Bytes::from_static(b"ack")));
        match rx.try_recv().unwrap() {
            Outgoing::Event {
                entry: queued,
                ordered_at,
            } => {
                assert!(Arc::ptr_eq(&queued, &entry), "the entry itself, not a copy");
                assert_eq!((queued.seq, queued.channel.as_deref()), (7, Some("xr")));
                assert_eq!(ordered_at, Some(at));
            }
            other => panic!("expected an event, got {other:?}"),
        }
        let ack = rx.try_recv().unwrap();
        assert_eq!(
            (ack.frame().as_ref(), ack.ordered_at()),
            (&b"ack"[..], None)
        );
    }

    #[test]
    fn a_batch_takes_at_most_max_frames_in_order_and_gives_back_the_replay_allowance() {
        let control = ConnectionControl::new();
        let (out, mut rx) = Outbox::new(2, control.clone());
        assert!(out.send(Bytes::from_static(b"joined")));
        let missed: Vec<_> = (1..=5).map(entry).collect();
        assert!(out.replay(&missed));
        let first = rx.take_batch(4);
        let frames: Vec<_> = first.iter().map(|i| i.frame().clone()).collect();
        assert_eq!(frames[0], "joined");
        assert_eq!(
            frames[1..],
            [1, 2, 3].map(|s| Bytes::from(format!("{{\"seq\":{s}}}")))
        );
        // Two replayed events are still queued: they alone are within the
        // allowance, and one live frame more fits the bound of two.
        assert!(out.send(Bytes::from_static(b"live")));
        let rest = rx.take_batch(100);
        assert_eq!(rest.len(), 3);
        assert_eq!(rest[2].frame(), "live");
        assert_eq!(rx.try_recv().unwrap_err(), Empty);
        // With the replay read, the bound is the queue's own again.
        assert!(out.send(Bytes::from_static(b"a")));
        assert!(out.send(Bytes::from_static(b"b")));
        assert!(!out.send(Bytes::from_static(b"c")));
        assert_eq!(control.close_code(), Some(CloseCode::SlowConsumer.code()));
    }

    #[tokio::test]
    async fn ready_waits_for_a_frame_without_taking_it() {
        let (out, mut rx) = Outbox::new(4, ConnectionControl::new());
        out.send(Bytes::from_static(b"a"));
        rx.ready().await;
        assert_eq!(rx.take_batch(8).len(), 1);
        let waiter = tokio::spawn(async move {
            rx.ready().await;
            rx
        });
        tokio::task::yield_now().await;
        assert!(!waiter.is_finished(), "ready returned on an empty queue");
        out.send(Bytes::from_static(b"b"));
        let mut rx = waiter.await.unwrap();
        assert_eq!(rx.try_recv().unwrap().frame(), "b", "ready took nothing");
    }

    #[tokio::test]
    async fn closing_wakes_the_connection_task_once_with_the_first_code() {
        let control = ConnectionControl::new();
        let waiting = control.clone();
        let task = tokio::spawn(async move {
            std::future::poll_fn(|cx| waiting.poll_closed(cx)).await;
            waiting.close_code()
        });
        tokio::task::yield_now().await;
        control.close(CloseCode::SlowConsumer);
        control.close(CloseCode::Restarting);
        assert_eq!(task.await.unwrap(), Some(CloseCode::SlowConsumer.code()));
        // Closed already: ready at once.
        let mut cx = Context::from_waker(Waker::noop());
        assert_eq!(control.poll_closed(&mut cx), Poll::Ready(()));
    }

    /// A batch as the seqs of its events and the text of its other frames.
    fn frames(batch: VecDeque<Outgoing>) -> Vec<String> {
        batch
            .iter()
            .map(|o| match o.entry() {
                Some(e) => e.seq.to_string(),
                None => String::from_utf8(o.frame().to_vec()).unwrap(),
            })
            .collect()
    }

    /// The room relies on both refusals (room/machine.rs): a connection
    /// gone before its join or resume lands gets neither a follow nor a
    /// replay, and is told so.
    #[test]
    fn a_gone_connection_gets_no_follow_and_no_replay() {
        let (out, rx) = Outbox::new(16, ConnectionControl::new());
        let feed = RoomFeed::new(16);
        let room = out.with_feed(&feed);
        drop(rx);
        assert!(room.follow("me", vec!["main".into()]).is_none());
        assert!(!room.replay(&[message(1, "other", "main", false)]));
        assert!(!room.replay(&[]), "closed, even with nothing to replay");
        assert!(
            room.queue.items.lock().unwrap().queued.is_empty(),
            "nothing was queued for nobody"
        );
    }

    #[test]
    fn a_follower_reads_the_feed_in_order_with_what_the_room_queues() {
        let (out, mut rx) = Outbox::new(16, ConnectionControl::new());
        let feed = RoomFeed::new(16);
        let room = out.with_feed(&feed);
        let follower = room.follow("me", vec!["main".into()]).unwrap();
        feed.append(message(1, "other", "main", false), None);
        assert!(room.send(Bytes::from_static(b"after 1")));
        feed.append(message(2, "other", "main", false), None);
        // Queued by the connection itself, not the room: after what the feed
        // holds when it is taken.
        assert!(out.send(Bytes::from_static(b"own")));
        feed.append(message(3, "other", "main", false), None);
        assert_eq!(
            frames(rx.take_batch(100)),
            ["1", "after 1", "2", "3", "own"]
        );
        assert_eq!(follower.pos(), 3);
        assert!(rx.take_batch(100).is_empty());
    }

    #[test]
    fn a_follower_gets_what_the_room_would_hand_it_and_no_more() {
        let (out, mut rx) = Outbox::new(16, ConnectionControl::new());
        let feed = RoomFeed::new(16);
        let room = out.with_feed(&feed);
        // Events before the follow are not its to read.
        feed.append(message(1, "other", "main", false), None);
        room.follow("me", vec!["main".into()]).unwrap();
        feed.append(message(2, "me", "main", false), None);
        feed.append(message(3, "me", "main", true), None);
        feed.append(message(4, "other", "xr", false), None);
        room.rechannel(vec!["main".into(), "xr".into()]);
        feed.append(message(5, "other", "xr", false), None);
        room.unfollow();
        feed.append(message(6, "other", "main", false), None);
        // Its own message only when echoed; another channel's only once
        // subscribed; nothing after the unfollow.
        assert_eq!(frames(rx.take_batch(100)), ["3", "5"]);
        // A batch smaller than what is unread leaves the rest for the next.
        room.follow("me", vec!["main".into()]).unwrap();
        for seq in 7..10 {
            feed.append(message(seq, "other", "main", false), None);
        }
        assert_eq!(frames(rx.take_batch(2)), ["7", "8"]);
        assert_eq!(frames(rx.take_batch(2)), ["9"]);
    }

    #[test]
    fn a_follower_further_behind_than_the_feed_keeps_is_a_slow_consumer() {
        let control = ConnectionControl::new();
        let (out, mut rx) = Outbox::new(16, control.clone());
        let feed = RoomFeed::new(2);
        out.with_feed(&feed)
            .follow("me", vec!["main".into()])
            .unwrap();
        for seq in 1..=3 {
            feed.append(message(seq, "other", "main", false), None);
        }
        assert!(rx.take_batch(100).is_empty(), "a gap is never delivered");
        assert_eq!(control.close_code(), Some(CloseCode::SlowConsumer.code()));
    }

    #[test]
    fn a_follower_lagging_in_one_feed_is_closed_and_its_other_feeds_still_read() {
        let control = ConnectionControl::new();
        let (out, mut rx) = Outbox::new(16, control.clone());
        let (small, other) = (RoomFeed::new(2), RoomFeed::new(16));
        out.with_feed(&small)
            .follow("me", vec!["main".into()])
            .unwrap();
        out.with_feed(&other)
            .follow("me", vec!["main".into()])
            .unwrap();
        for seq in 1..=3 {
            small.append(message(seq, "x", "main", false), None);
        }
        other.append(message(10, "x", "main", false), None);
        assert_eq!(frames(rx.take_batch(100)), ["10"]);
        assert_eq!(control.close_code(), Some(CloseCode::SlowConsumer.code()));
    }

    #[tokio::test]
    async fn an_event_fed_wakes_a_waiting_follower() {
        let (out, mut rx) = Outbox::new(16, ConnectionControl::new());
        let feed = RoomFeed::new(16);
        out.with_feed(&feed)
            .follow("me", vec!["main".into()])
            .unwrap();
        // The follow itself is queued: taking it makes the receiver a reader.
        assert!(rx.take_batch(100).is_empty());
        let waiter = tokio::spawn(async move {
            rx.ready().await;
            rx
        });
        tokio::task::yield_now().await;
        assert!(!waiter.is_finished());
        feed.append(message(1, "other", "main", false), None);
        let mut rx = waiter.await.unwrap();
        assert_eq!(frames(rx.take_batch(100)), ["1"]);
    }

    #[test]
    fn a_writer_is_handed_the_frames_by_reference_in_the_same_order() {
        let (out, mut rx) = Outbox::new(16, ConnectionControl::new());
        let feed = RoomFeed::new(16);
        let room = out.with_feed(&feed);
        room.follow("me", vec!["main".into()]).unwrap();
        feed.append(message(1, "other", "main", false), None);
        feed.append(message(2, "other", "main", false), None);
        assert!(room.send(Bytes::from_static(b"after 2")));
        feed.append(message(3, "me", "main", false), None);
        feed.append(message(4, "other", "main", false), None);
        // One frame taken alone leaves the events before the queued frame
        // staged: they go first.
        assert_eq!(
            rx.try_recv().unwrap().as_ref().entry().map(|e| e.seq),
            Some(1)
        );
        let mut handed = Vec::new();
        let n = rx.drain_into(2, |f| {
            handed.push(match f.entry() {
                Some(e) => e.seq.to_string(),
                None => String::from_utf8(f.frame().to_vec()).unwrap(),
            })
        });
        assert_eq!(
            (n, &handed[..]),
            (2, &["2".to_owned(), "after 2".to_owned()][..])
        );
        let mut handed = Vec::new();
        assert_eq!(
            rx.drain_into(100, |f| handed.push(f.entry().unwrap().seq)),
            1
        );
        assert_eq!(handed, [4]);
        assert_eq!(rx.drain_into(100, |_| panic!("nothing is left")), 0);
    }

    #[test]
    fn the_connections_own_frame_comes_after_the_events_fed_before_it() {
        let (out, mut rx) = Outbox::new(16, ConnectionControl::new());
        let feed = RoomFeed::new(16);
        out.with_feed(&feed)
            .follow("me", vec!["main".into()])
            .unwrap();
        feed.append(message(1, "other", "main", false), None);
        feed.append(message(2, "other", "main", false), None);
        // A pong: queued by the connection itself, through a handle without the feed.
        assert!(out.send(Bytes::from_static(b"pong")));
        assert_eq!(frames(rx.take_batch(100)), ["1", "2", "pong"]);
    }

    /// A waker that counts its wake-ups (the feed's tests use it too).
    #[derive(Default)]
    pub(super) struct CountingWake(AtomicUsize);

    impl std::task::Wake for CountingWake {
        fn wake(self: Arc<Self>) {
            self.wake_by_ref();
        }

        fn wake_by_ref(self: &Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    pub(super) fn counting_waker() -> (Arc<CountingWake>, Waker) {
        let count = Arc::new(CountingWake::default());
        (count.clone(), Waker::from(count))
    }

    pub(super) fn woken(count: &CountingWake) -> usize {
        count.0.load(Ordering::SeqCst)
    }

    /// A consumer that found its queue empty looks again without the lock
    /// until something is queued: whatever is queued (a frame or a replay)
    /// wakes it, is seen by its next poll, and is taken by a batch taken
    /// without a poll in between.
    #[test]
    fn what_is_queued_while_the_consumer_waits_wakes_it_and_is_taken() {
        let (out, mut rx) = Outbox::new(16, ConnectionControl::new());
        let (count, waker) = counting_waker();
        let mut cx = Context::from_waker(&waker);
        assert_eq!(rx.poll_source(&mut cx), Poll::Pending);
        assert_eq!(rx.poll_source(&mut cx), Poll::Pending);
        assert!(out.send(Bytes::from_static(b"a")));
        assert_eq!(woken(&count), 1);
        assert_eq!(rx.poll_source(&mut cx), Poll::Ready(Source::Queued));
        assert_eq!(frames(rx.take_batch(8)), ["a"]);

        // Taken by a batch at once, with no poll between.
        assert_eq!(rx.poll_source(&mut cx), Poll::Pending);
        assert!(out.send(Bytes::from_static(b"b")));
        assert_eq!(frames(rx.take_batch(8)), ["b"]);

        // A replay too.
        assert_eq!(rx.poll_source(&mut cx), Poll::Pending);
        let before = woken(&count);
        assert!(out.replay(&[entry(7)]));
        assert_eq!(woken(&count), before + 1);
        assert_eq!(rx.poll_source(&mut cx), Poll::Ready(Source::Queued));
        assert_eq!(frames(rx.take_batch(8)), ["7"]);
    }

    /// Polled with another waker (another task, for a transport whose
    /// requests take turns), the consumer leaves that one: a frame wakes
    /// the task that polled last.
    #[test]
    fn a_consumer_polled_with_another_waker_is_woken_through_it() {
        let (out, rx) = Outbox::new(16, ConnectionControl::new());
        let (first, first_waker) = counting_waker();
        let (second, second_waker) = counting_waker();
        assert_eq!(
            rx.poll_source(&mut Context::from_waker(&first_waker)),
            Poll::Pending
        );
        assert_eq!(
            rx.poll_source(&mut Context::from_waker(&second_waker)),
            Poll::Pending
        );
        assert!(out.send(Bytes::from_static(b"a")));
        assert_eq!((woken(&first), woken(&second)), (0, 1));
    }

    /// The connection's own frame goes after the events fed before it was
    /// queued, and no further: a room's frame queued after it, and the
    /// event fed after that, keep their order (the own frame once read the
    /// feeds to their end, past the room frame's barrier).
    #[test]
    fn an_own_frame_does_not_pull_an_event_ahead_of_a_room_frame_queued_before_it() {
        let (out, mut rx) = Outbox::new(16, ConnectionControl::new());
        let feed = RoomFeed::new(16);
        let room = out.with_feed(&feed);
        room.follow("me", vec!["main".into()]).unwrap();
        assert!(rx.take_batch(100).is_empty());
        feed.append(message(1, "other", "main", false), None);
        assert!(out.send(Bytes::from_static(b"pong")));
        assert!(room.send(Bytes::from_static(b"ack")));
        feed.append(message(2, "other", "main", false), None);
        assert_eq!(frames(rx.take_batch(100)), ["1", "pong", "ack", "2"]);
    }

    /// A connection's task may end while rooms and feeds still hold its
    /// queue for a while: the receiver's drop lets every waker of the task
    /// go (a tokio waker keeps the task's memory).
    #[test]
    fn a_dropped_receiver_lets_its_tasks_wakers_go() {
        let (out, rx) = Outbox::new(16, ConnectionControl::new());
        let feed = RoomFeed::new(16);
        let room = out.with_feed(&feed);
        let follower = room.follow("me", vec!["main".into()]).unwrap();
        let mut rx = rx;
        assert!(rx.take_batch(100).is_empty());
        let (count, task) = counting_waker();
        drop(rx.transport_waker(&task));
        assert_eq!(
            rx.poll_source(&mut Context::from_waker(&task)),
            Poll::Pending
        );
        assert!(Arc::strong_count(&count) > 2, "the queue holds the task");
        drop(task);
        drop(rx);
        assert_eq!(Arc::strong_count(&count), 1, "nothing holds the task");
        // The room's handle and the follower still hold the queue.
        drop((room, follower, out));
    }

    /// The race a receiver must not lose: while it reads one feed's events
    /// (event 1 of the first room), another room queues it a frame and then
    /// feeds an event (2). That event was fed after the receiver looked at
    /// its queue, so it waits for the next look, and goes after the frame,
    /// as the room made them. With `own`, the connection's own frame was
    /// queued before the look: it goes after event 1, and reads no further.
    /// Returns the order the receiver hands them in.
    fn race_with_another_room(own: Option<&'static [u8]>) -> Vec<String> {
        let (out, mut rx) = Outbox::new(16, ConnectionControl::new());
        let (first, second) = (RoomFeed::new(16), RoomFeed::new(16));
        out.with_feed(&first)
            .follow("me", vec!["main".into()])
            .unwrap();
        let second_room = out.with_feed(&second);
        second_room.follow("me", vec!["main".into()]).unwrap();
        assert!(rx.take_batch(100).is_empty());
        first.append(message(1, "other", "main", false), None);
        if let Some(frame) = own {
            assert!(out.send(Bytes::from_static(frame)));
        }
        let mut order = Vec::new();
        let mut meanwhile = Some(|| {
            assert!(second_room.send(Bytes::from_static(b"queued")));
            second.append(message(2, "other", "main", false), None);
        });
        let mut put = |f: FrameRef<'_>| {
            order.push(match f.entry() {
                Some(e) => e.seq.to_string(),
                None => String::from_utf8(f.frame().to_vec()).unwrap(),
            });
            if let Some(room_turn) = meanwhile.take() {
                room_turn();
            }
        };
        while rx.drain_into(100, &mut put) > 0 {}
        order
    }

    #[test]
    fn an_event_fed_after_the_queue_was_looked_at_goes_after_what_was_queued_before_it() {
        assert_eq!(race_with_another_room(None), ["1", "queued", "2"]);
    }

    #[test]
    fn an_own_frame_reads_no_event_fed_after_the_queue_was_looked_at() {
        assert_eq!(
            race_with_another_room(Some(b"pong")),
            ["1", "pong", "queued", "2"]
        );
    }
}
