//! Delivery under members' delivery policies: what goes out at once, what
//! waits in [`Held`], and when it goes out.

use super::*;
use crate::policy::{filter, EventView, Flushed, HeldMessages};

/// What goes out to one member.
#[derive(Debug)]
pub enum Delivery<'a> {
    /// The event, alone.
    Event(&'a Arc<HistoryEntry>),
    /// What its policy held, in seq order (the event that set the flush off
    /// last): one `batch` frame if `aggregate` and several, else a frame each.
    Flush {
        /// The events, oldest first.
        events: Vec<Arc<HistoryEntry>>,
        /// As one frame.
        aggregate: bool,
    },
}

/// Events held under members' delivery policies (node-local: what a
/// connection has not been sent yet).
pub type Held = HeldMessages<Arc<HistoryEntry>>;

impl<S> Room<S> {
    /// Whether `session`, whose policy is `policy`, gets `event` at once
    /// rather than held: spatial events (about its surroundings, now), its
    /// own message echoed, a reply to a message of its own (while that is
    /// in the history), or a match of one of its filters.
    pub fn delivers_now(
        &self,
        event: &EventView<'_>,
        session: &str,
        policy: &DeliveryPolicy,
    ) -> bool {
        let e = event.entry();
        let own = |seq: u64| {
            self.log
                .get(seq)
                .is_some_and(|a| a.from.as_deref() == Some(session))
        };
        !e.scope.is_all()
            || e.from.as_deref() == Some(session)
            || e.reply_to.is_some_and(own)
            || policy.filters.iter().any(|f| filter::matches(f, event))
    }

    /// Routes `entry` to its recipients whose sink is `local` under their
    /// delivery policies at `now`: without a policy a member gets it at
    /// once; with one, at once only if the policy wants it now, and then
    /// after everything it held (its seqs stay increasing, so its last seq
    /// still means "everything before"); else it joins `held` until the
    /// policy's time or volume is reached. Call [`Room::route_evicted`]
    /// after the events of a command.
    pub fn route<'e>(
        &self,
        entry: &'e Arc<HistoryEntry>,
        held: &mut Held,
        now: Millis,
        local: impl Fn(&S) -> bool,
        mut send: impl FnMut(&str, &S, Delivery<'e>),
    ) {
        let view = EventView::new(entry);
        self.for_each_recipient_member(entry, |session, m| {
            let Some(sink) = m.sink.as_ref().filter(|s| local(s)) else {
                return;
            };
            let Some(policy) = m.policy.as_deref() else {
                send(session, sink, Delivery::Event(entry));
                return;
            };
            let events = if self.delivers_now(&view, session, policy) {
                let mut events = held.take(session);
                if events.is_empty() {
                    held.sent(session, entry.seq);
                    send(session, sink, Delivery::Event(entry));
                    return;
                }
                events.push(entry.clone());
                events
            } else {
                match held.hold(session, entry.clone(), policy, now) {
                    Some(events) => events,
                    None => return,
                }
            };
            held.sent(session, entry.seq);
            let aggregate = policy.aggregate;
            send(session, sink, Delivery::Flush { events, aggregate });
        });
    }

    /// Flushes what members hold when the next event would push the
    /// history past the last event they were sent (or has already): a
    /// resume must find in the history everything after its last seq.
    pub fn route_evicted(&self, held: &mut Held, send: impl FnMut(&str, &S, Delivery<'_>)) {
        if held.is_empty() {
            return;
        }
        if let Some(first) = self.log.first_seq() {
            let full = self.log.len() >= self.log.capacity();
            let flushed = held.older_than(first + u64::from(full));
            self.send_flushed(flushed, held, send);
        }
    }

    /// Flushes what members hold whose time is up at `now`.
    pub fn route_due(
        &self,
        held: &mut Held,
        now: Millis,
        send: impl FnMut(&str, &S, Delivery<'_>),
    ) {
        if held.is_empty() {
            return;
        }
        let flushed = held.due(now);
        self.send_flushed(flushed, held, send);
    }

    /// Flushes what `session` holds: before its ack or response, which carry
    /// a seq that its client takes as "everything before has arrived".
    pub fn route_flush(
        &self,
        session: &str,
        held: &mut Held,
        send: impl FnMut(&str, &S, Delivery<'_>),
    ) {
        // On every publish and request: nothing to look up or allocate in
        // a room where nobody holds anything.
        if held.is_empty() {
            return;
        }
        let events = held.take(session);
        if !events.is_empty() {
            self.send_flushed([Flushed::of(session, events)], held, send);
        }
    }

    /// Flushes everything `held` holds (e.g. before the room is replaced).
    pub fn route_all(&self, held: &mut Held, send: impl FnMut(&str, &S, Delivery<'_>)) {
        let flushed = held.take_all();
        self.send_flushed(flushed, held, send);
    }

    /// `session` joined or resumed, its client at `seq` once it has its
    /// `joined` and missed events ([`Joined::client_seq`]): with a policy,
    /// holding keeps the history from there.
    pub fn route_joined(&self, session: &str, seq: u64, held: &mut Held) {
        held.forget(session);
        if self
            .members
            .get(session)
            .is_some_and(|m| m.policy.is_some())
        {
            held.sent(session, seq);
        }
    }

    /// `session` changed its policy: what it holds goes out if the new
    /// policy wants any of it now (all of it, in order) or its bounds are
    /// already reached; otherwise its wait is counted anew.
    pub fn route_replanned(
        &self,
        session: &str,
        held: &mut Held,
        now: Millis,
        send: impl FnMut(&str, &S, Delivery<'_>),
    ) {
        let Some(m) = self.members.get(session) else {
            return;
        };
        let events = match m.policy.as_deref() {
            None => {
                let events = held.take(session);
                held.forget(session);
                events
            }
            Some(p) => {
                // A member without a policy until now was sent everything
                // meant for it up to this seq.
                if !held.knows(session) {
                    held.sent(session, self.seq);
                }
                let wanted = held
                    .held(session)
                    .any(|e| self.delivers_now(&EventView::new(e), session, p));
                if wanted {
                    held.take(session)
                } else {
                    held.replan(session, p, now)
                }
            }
        };
        if !events.is_empty() {
            self.send_flushed([Flushed::of(session, events)], held, send);
        }
    }

    /// Hands flushed events to their members' sinks (dropped for members
    /// gone meanwhile: a resume replays them from the history).
    fn send_flushed(
        &self,
        flushed: impl IntoIterator<Item = Flushed<Arc<HistoryEntry>>>,
        held: &mut Held,
        mut send: impl FnMut(&str, &S, Delivery<'_>),
    ) {
        for f in flushed {
            let Some(last) = f.events.last().map(|e| e.seq) else {
                continue;
            };
            let Some((session, m)) = self.members.get_key_value(&f.session) else {
                continue;
            };
            if let Some(sink) = &m.sink {
                held.sent(session, last);
                let aggregate = m.policy.as_deref().is_none_or(|p| p.aggregate);
                let events = f.events;
                send(session, sink, Delivery::Flush { events, aggregate });
            }
        }
    }
}
