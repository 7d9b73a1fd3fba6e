//! Events held for members whose policy lets them wait: a FIFO per member,
//! and the two orders that say whose held events must go out next.
//!
//! One structure serves a whole room (or node): there is no timer per held
//! event or per member. The caller asks [`HeldMessages::next_deadline`] when
//! to wake and then takes what is [`due`](HeldMessages::due).

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::sync::Arc;

use crate::{HistoryEntry, Millis};
use plaza_protocol::policy::DeliveryPolicy;

/// What is held: a reference to an event with a seq (a history entry; the
/// tests use bare seqs).
pub trait HeldEvent {
    /// The event's seq.
    fn seq(&self) -> u64;
}

impl HeldEvent for Arc<HistoryEntry> {
    fn seq(&self) -> u64 {
        self.seq
    }
}

impl HeldEvent for u64 {
    fn seq(&self) -> u64 {
        *self
    }
}

/// One member's held events, oldest first.
#[derive(Debug)]
struct Queue<E> {
    events: VecDeque<E>,
    /// The first seq its client has not been sent: its resume needs the
    /// history from here on, whatever of it was meant for the member.
    resume_from: u64,
    /// When the oldest was held.
    since: Millis,
    /// When they must go out by time (`since + max_delay_ms`).
    deadline: Option<Millis>,
}

/// A member's held events, taken to be sent, in seq order.
#[derive(Debug, PartialEq, Eq)]
pub struct Flushed<E> {
    /// The member.
    pub session: String,
    /// Its events, oldest first.
    pub events: Vec<E>,
}

impl<E> Flushed<E> {
    /// `session`'s `events`.
    pub fn of(session: &str, events: Vec<E>) -> Self {
        Flushed {
            session: session.to_owned(),
            events,
        }
    }
}

/// The held events of every member of a room.
#[derive(Debug)]
pub struct HeldMessages<E> {
    queues: HashMap<String, Queue<E>>,
    /// `(deadline, session)` of every queue with a time bound.
    deadlines: BTreeSet<(Millis, String)>,
    /// `(resume_from, session)` of every queue: whose resume the history
    /// would fail first.
    resume_from: BTreeSet<(u64, String)>,
    /// The last seq sent to each member with a policy: a queue started now
    /// must keep the history from the one after it (the events between
    /// were not for the member, but its resume needs them).
    sent: HashMap<String, u64>,
}

impl<E> Default for HeldMessages<E> {
    fn default() -> Self {
        HeldMessages {
            queues: HashMap::new(),
            deadlines: BTreeSet::new(),
            resume_from: BTreeSet::new(),
            sent: HashMap::new(),
        }
    }
}

impl<E: HeldEvent> HeldMessages<E> {
    /// Holds `event` for `session` under `policy` at `now`. Returns what must
    /// go out now: everything held, `event` last, when the volume bound is
    /// reached.
    ///
    /// Events must be held in increasing seq order per member.
    pub fn hold(
        &mut self,
        session: &str,
        event: E,
        policy: &DeliveryPolicy,
        now: Millis,
    ) -> Option<Vec<E>> {
        let seq = event.seq();
        let queue = match self.queues.get_mut(session) {
            Some(q) => q,
            None => {
                let deadline = policy.max_delay_ms.map(|d| now.saturating_add(d));
                if let Some(at) = deadline {
                    self.deadlines.insert((at, session.to_owned()));
                }
                let resume_from = self.sent.get(session).map_or(seq, |s| s + 1);
                self.resume_from.insert((resume_from, session.to_owned()));
                self.queues
                    .entry(session.to_owned())
                    .or_insert_with(|| Queue {
                        events: VecDeque::new(),
                        resume_from,
                        since: now,
                        deadline,
                    })
            }
        };
        debug_assert!(queue.events.back().is_none_or(|e| e.seq() < seq));
        queue.events.push_back(event);
        let full = policy
            .max_held
            .is_some_and(|n| queue.events.len() >= n as usize);
        full.then(|| self.take(session))
    }

    /// Takes everything held for `session` (empty if nothing is).
    pub fn take(&mut self, session: &str) -> Vec<E> {
        let Some((session, q)) = self.queues.remove_entry(session) else {
            return Vec::new();
        };
        // One key, its number swapped: no second copy of the session id.
        let mut key = (q.deadline.unwrap_or(0), session);
        if q.deadline.is_some() {
            self.deadlines.remove(&key);
        }
        key.0 = q.resume_from;
        self.resume_from.remove(&key);
        q.events.into()
    }

    /// Takes the held events of every member whose oldest one has waited
    /// its policy's longest at `now`, in deadline order.
    pub fn due(&mut self, now: Millis) -> Vec<Flushed<E>> {
        let mut out = Vec::new();
        while let Some((at, session)) = self.deadlines.first().cloned() {
            if at > now {
                break;
            }
            let events = self.take(&session);
            out.push(Flushed { session, events });
        }
        out
    }

    /// Takes the held events of every member whose resume would need the
    /// history from before `first_kept` (the oldest seq it still holds).
    pub fn older_than(&mut self, first_kept: u64) -> Vec<Flushed<E>> {
        let mut out = Vec::new();
        while let Some((seq, session)) = self.resume_from.first().cloned() {
            if seq >= first_kept {
                break;
            }
            let events = self.take(&session);
            out.push(Flushed { session, events });
        }
        out
    }

    /// Takes everything held, member by member (in no particular order).
    pub fn take_all(&mut self) -> Vec<Flushed<E>> {
        self.deadlines.clear();
        self.resume_from.clear();
        self.queues
            .drain()
            .map(|(session, q)| Flushed {
                session,
                events: q.events.into(),
            })
            .collect()
    }

    /// Applies a changed `policy` of `session` at `now` to what it holds:
    /// returns it all when the new bounds are already reached, or else
    /// moves its deadline (counted from when the oldest was held).
    pub fn replan(&mut self, session: &str, policy: &DeliveryPolicy, now: Millis) -> Vec<E> {
        let Some(q) = self.queues.get_mut(session) else {
            return Vec::new();
        };
        let deadline = policy.max_delay_ms.map(|d| q.since.saturating_add(d));
        let full = policy
            .max_held
            .is_some_and(|n| q.events.len() >= n as usize);
        if full || deadline.is_some_and(|at| at <= now) {
            return self.take(session);
        }
        if let Some(old) = std::mem::replace(&mut q.deadline, deadline) {
            self.deadlines.remove(&(old, session.to_owned()));
        }
        if let Some(at) = deadline {
            self.deadlines.insert((at, session.to_owned()));
        }
        Vec::new()
    }

    /// Notes that `session` was sent everything meant for it up to `seq`
    /// (only members with a policy are noted).
    pub fn sent(&mut self, session: &str, seq: u64) {
        match self.sent.get_mut(session) {
            Some(s) => *s = seq,
            None => {
                self.sent.insert(session.to_owned(), seq);
            }
        }
    }

    /// Whether `session`'s last seq sent is known.
    pub fn knows(&self, session: &str) -> bool {
        self.sent.contains_key(session)
    }

    /// Forgets `session`: what it holds (its connection is gone: a resume
    /// replays it) and its last seq sent.
    pub fn forget(&mut self, session: &str) {
        drop(self.take(session));
        self.sent.remove(session);
    }

    /// The events held for `session`, oldest first.
    pub fn held(&self, session: &str) -> impl Iterator<Item = &E> {
        self.queues
            .get(session)
            .into_iter()
            .flat_map(|q| q.events.iter())
    }

    /// When the next member's held events are due, if any has a deadline.
    pub fn next_deadline(&self) -> Option<Millis> {
        self.deadlines.first().map(|(at, _)| *at)
    }

    /// Members holding something.
    pub fn len(&self) -> usize {
        self.queues.len()
    }

    /// True when nobody holds anything.
    pub fn is_empty(&self) -> bool {
        self.queues.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(max_delay_ms: Option<u64>, max_held: Option<u32>) -> DeliveryPolicy {
        DeliveryPolicy {
            filters: Vec::new(),
            max_delay_ms,
            max_held,
            aggregate: true,
        }
    }

    #[test]
    fn volume_flushes_everything_held_with_the_last() {
        let mut h = HeldMessages::default();
        let p = policy(None, Some(3));
        assert_eq!(h.hold("a", 1u64, &p, 0), None);
        assert_eq!(h.hold("b", 2u64, &p, 0), None);
        assert_eq!(h.hold("a", 3u64, &p, 0), None);
        assert_eq!(h.hold("a", 4u64, &p, 0), Some(vec![1, 3, 4]));
        assert_eq!(h.held("a").count(), 0);
        assert_eq!(h.held("b").copied().collect::<Vec<_>>(), [2]);
        assert_eq!(h.next_deadline(), None);
    }

    #[test]
    fn time_counts_from_the_oldest_held() {
        let mut h = HeldMessages::default();
        let p = policy(Some(100), None);
        assert_eq!(h.hold("a", 1u64, &p, 10), None);
        assert_eq!(h.hold("a", 2u64, &p, 90), None);
        assert_eq!(h.hold("b", 3u64, &p, 50), None);
        assert_eq!(h.next_deadline(), Some(110));
        assert!(h.due(109).is_empty());
        let due = h.due(110);
        assert_eq!(
            due,
            [Flushed {
                session: "a".into(),
                events: vec![1, 2]
            }]
        );
        assert_eq!(h.next_deadline(), Some(150));
        // A new first event starts a new wait.
        assert_eq!(h.hold("a", 4u64, &p, 120), None);
        assert_eq!(h.next_deadline(), Some(150));
        assert_eq!(h.due(219).len(), 1);
        assert_eq!(h.next_deadline(), Some(220));
        assert_eq!(h.due(220)[0].events, [4]);
        assert!(h.is_empty());
    }

    #[test]
    fn a_queue_keeps_the_history_from_the_last_seq_sent() {
        let mut h = HeldMessages::default();
        let p = policy(Some(1000), None);
        h.sent("a", 2);
        h.hold("a", 5u64, &p, 0);
        // Seqs 3 and 4 were not for "a", but its resume from 2 needs them.
        assert!(h.older_than(3).is_empty());
        assert_eq!(h.older_than(4)[0].events, [5]);
        h.forget("a");
        assert!(!h.knows("a"));
    }

    #[test]
    fn events_about_to_leave_the_history_go_out_first() {
        let mut h = HeldMessages::default();
        let p = policy(Some(1000), None);
        h.hold("a", 5u64, &p, 0);
        h.hold("b", 7u64, &p, 0);
        h.hold("a", 9u64, &p, 0);
        assert!(h.older_than(5).is_empty());
        let out = h.older_than(8);
        assert_eq!(out.len(), 2);
        assert_eq!(out[0].events, [5, 9]);
        assert_eq!(out[1].events, [7]);
        assert_eq!(h.next_deadline(), None);
    }

    #[test]
    fn a_changed_policy_moves_the_deadline_or_flushes() {
        let mut h = HeldMessages::default();
        h.hold("a", 1u64, &policy(Some(1000), None), 0);
        h.hold("a", 2u64, &policy(Some(1000), None), 10);
        assert!(h.replan("a", &policy(Some(500), None), 100).is_empty());
        assert_eq!(h.next_deadline(), Some(500));
        assert_eq!(h.replan("a", &policy(Some(50), None), 100), [1, 2]);
        h.hold("a", 3u64, &policy(None, Some(10)), 200);
        assert_eq!(h.next_deadline(), None);
        assert!(h.replan("a", &policy(None, Some(5)), 200).is_empty());
        assert_eq!(h.replan("a", &policy(Some(10), Some(1)), 200), [3]);
        assert!(h.replan("nobody", &policy(None, Some(1)), 0).is_empty());
    }
}
