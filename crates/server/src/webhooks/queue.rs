//! The in-memory queue of one target: events in order per room, bounded.
//!
//! The queue only keeps events and the per-room ordering; the dispatcher
//! sends them. A room's head event is *taken* for delivery and stays in the
//! queue (and its count) until it is *done* (delivered or given up); until
//! then the room's next event is not handed out, while other rooms' heads
//! are, in the order their rooms became ready. A durable backend (a Redis
//! stream per target read by a consumer group, say) offers the same three
//! operations: push, take the next ready room's head, done.

use std::collections::{HashMap, VecDeque};

/// The events of one room.
struct Line<E> {
    events: VecDeque<E>,
    /// Its head is being delivered.
    busy: bool,
}

/// Events queued per room, at most `max` in all (delivering ones included).
pub(crate) struct RoomQueues<E> {
    rooms: HashMap<String, Line<E>>,
    /// Rooms whose head may be taken: not busy, not empty; each once.
    ready: VecDeque<String>,
    len: usize,
    max: usize,
}

impl<E: Clone> RoomQueues<E> {
    /// An empty queue holding at most `max` events.
    pub(crate) fn new(max: usize) -> Self {
        RoomQueues {
            rooms: HashMap::new(),
            ready: VecDeque::new(),
            len: 0,
            max,
        }
    }

    /// Queues `event` after `room`'s others; false (and nothing queued)
    /// when the queue holds its maximum.
    pub(crate) fn push(&mut self, room: &str, event: E) -> bool {
        if self.len >= self.max {
            return false;
        }
        self.len += 1;
        let line = match self.rooms.get_mut(room) {
            Some(line) => line,
            None => self.rooms.entry(room.to_owned()).or_insert(Line {
                events: VecDeque::new(),
                busy: false,
            }),
        };
        line.events.push_back(event);
        if !line.busy && line.events.len() == 1 {
            self.ready.push_back(room.to_owned());
        }
        true
    }

    /// The head event of the next ready room, which is busy until
    /// [`RoomQueues::done`]; `None` when no room is ready.
    pub(crate) fn take(&mut self) -> Option<(String, E)> {
        let room = self.ready.pop_front()?;
        let line = self.rooms.get_mut(&room).expect("a ready room is queued");
        line.busy = true;
        let head = line
            .events
            .front()
            .expect("a ready room has events")
            .clone();
        Some((room, head))
    }

    /// `room`'s head event is delivered or given up: it leaves the queue,
    /// and the room's next event may be taken.
    pub(crate) fn done(&mut self, room: &str) {
        let Some(line) = self.rooms.get_mut(room) else {
            return;
        };
        if !line.busy {
            return;
        }
        line.busy = false;
        line.events.pop_front();
        self.len -= 1;
        if line.events.is_empty() {
            self.rooms.remove(room);
        } else {
            self.ready.push_back(room.to_owned());
        }
    }

    /// Events queued or being delivered.
    pub(crate) fn len(&self) -> usize {
        self.len
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_rooms_next_event_waits_for_its_previous_one() {
        let mut q = RoomQueues::new(10);
        assert!(q.push("a", 1));
        assert!(q.push("a", 2));
        assert!(q.push("b", 10));
        assert_eq!(q.take(), Some(("a".into(), 1)));
        // a is busy: b's head comes, then nothing.
        assert_eq!(q.take(), Some(("b".into(), 10)));
        assert_eq!(q.take(), None);
        assert_eq!(q.len(), 3);
        q.done("a");
        assert_eq!(q.take(), Some(("a".into(), 2)));
        assert_eq!(q.take(), None);
        q.done("b");
        q.done("a");
        assert_eq!((q.take(), q.len()), (None, 0));
        assert!(q.rooms.is_empty() && q.ready.is_empty());
    }

    #[test]
    fn a_busy_room_does_not_hold_back_others() {
        let mut q = RoomQueues::new(100);
        q.push("slow", 0);
        assert_eq!(q.take(), Some(("slow".into(), 0)));
        q.push("slow", 1);
        for i in 0..5 {
            q.push(&format!("r{i}"), i);
        }
        let taken: Vec<String> = std::iter::from_fn(|| q.take()).map(|(r, _)| r).collect();
        assert_eq!(taken, ["r0", "r1", "r2", "r3", "r4"]);
        // Pushing to a busy room does not make it ready.
        q.push("slow", 2);
        assert_eq!(q.take(), None);
        q.done("slow");
        assert_eq!(q.take(), Some(("slow".into(), 1)));
    }

    #[test]
    fn the_bound_counts_delivering_events_and_refuses_past_it() {
        let mut q = RoomQueues::new(2);
        assert!(q.push("a", 1));
        let _ = q.take();
        assert!(q.push("b", 2));
        assert!(!q.push("c", 3));
        assert_eq!(q.len(), 2);
        q.done("a");
        assert!(q.push("c", 3));
        // done on a room that is not busy, or unknown, changes nothing.
        q.done("c");
        q.done("zzz");
        assert_eq!(q.len(), 2);
    }

    /// Events of a room come out in push order, whatever the interleaving.
    #[test]
    fn order_per_room_holds_under_interleaving() {
        let mut q = RoomQueues::new(1000);
        let mut rng = fastrand::Rng::with_seed(7);
        let mut next = [0u32; 4];
        let mut seen: [Vec<u32>; 4] = Default::default();
        let mut busy: Vec<(String, u32)> = Vec::new();
        for _ in 0..2000 {
            match rng.u8(0..3) {
                0 => {
                    let r = rng.usize(0..4);
                    q.push(&r.to_string(), next[r]);
                    next[r] += 1;
                }
                1 => {
                    if let Some(t) = q.take() {
                        busy.push(t);
                    }
                }
                _ if !busy.is_empty() => {
                    let (room, e) = busy.swap_remove(rng.usize(0..busy.len()));
                    seen[room.parse::<usize>().unwrap()].push(e);
                    q.done(&room);
                }
                _ => {}
            }
        }
        for s in seen {
            assert!(s.windows(2).all(|w| w[1] == w[0] + 1), "{s:?}");
        }
    }
}
