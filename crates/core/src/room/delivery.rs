//! Who receives an event: live, on resume, and one peer's direct message.

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

/// Events held under members' delivery policies.
pub type Held = HeldMessages<Arc<HistoryEntry>>;

/// Whether a session that resumes gets `entry` among its missed events: what
/// it would have received live (not messages of a channel from before it
/// subscribed), and the state changes it asked for itself.
pub(super) fn replayed<S>(entry: &HistoryEntry, session: &str, m: &Member<S>) -> bool {
    // Spatial events are not replayed: the resumed `joined` carries the
    // space as it is now.
    if !entry.scope.is_all() {
        return false;
    }
    if entry.replay_to_sender && entry.from.as_deref() == Some(session) {
        return true;
    }
    let before_subscribing = entry
        .channel
        .as_ref()
        .and_then(|c| m.subscribed_at.get(c))
        .is_some_and(|at| entry.seq <= *at);
    !before_subscribing && visible(entry, session, &m.channels)
}

/// Whether `session`, subscribed to `channels`, receives `entry`: not its own
/// event (unless echoed), and messages only on subscribed channels.
pub(super) fn visible(entry: &HistoryEntry, session: &str, channels: &[String]) -> bool {
    if !entry.echo && entry.from.as_deref() == Some(session) {
        return false;
    }
    subscribed(entry, channels)
}

/// Whether a member subscribed to `channels` receives `entry`.
pub(super) fn subscribed(entry: &HistoryEntry, channels: &[String]) -> bool {
    match &entry.channel {
        Some(c) => channels.iter().any(|x| x == c),
        None => true,
    }
}

impl<S> Room<S> {
    /// Checks that `to` is a connected member and returns its sink.
    pub fn direct_target(&self, from: &str, to: &str) -> Result<&S, RoomError> {
        if self.members.get(from).is_none_or(|m| m.sink.is_none()) {
            return Err(RoomError::new(
                ErrorCode::NotJoined,
                "not a connected member of this room",
            ));
        }
        let target = self
            .members
            .get(to)
            .and_then(|m| m.sink.as_ref())
            .ok_or_else(|| {
                RoomError::new(
                    ErrorCode::SessionNotFound,
                    format!("no connected session {to:?}"),
                )
            })?;
        if !self.direct_allowed(from, to) {
            return Err(RoomError::new(
                ErrorCode::NotInProximity,
                format!("{to:?} is not in proximity: this room passes direct messages only within a pair"),
            ));
        }
        Ok(target)
    }

    /// Calls `deliver` with the sink of every connected member that should get `entry`.
    pub fn for_each_recipient(&self, entry: &HistoryEntry, mut deliver: impl FnMut(&str, &S)) {
        self.for_each_recipient_member(entry, |session, m| {
            if let Some(sink) = &m.sink {
                deliver(session, sink);
            }
        });
    }

    /// Whether `session`, whose policy is `policy`, gets `event` at once
    /// rather than held: spatial events (about its surroundings, now), its
    /// own message echoed, a reply to a message of its own, or a match of
    /// one of its filters.
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
            let aggregate = policy.aggregate;
            send(session, sink, Delivery::Flush { events, aggregate });
        });
    }

    /// Flushes what `held` holds that the next event would push out of the
    /// history (or that is out already): a resume must find in the history
    /// whatever was held.
    pub fn route_evicted(&self, held: &mut Held, send: impl FnMut(&str, &S, Delivery<'_>)) {
        if held.is_empty() {
            return;
        }
        if let Some(first) = self.log.first_seq() {
            let full = self.log.len() >= self.log.capacity();
            let flushed = held.older_than(first + u64::from(full));
            self.send_flushed(flushed, send);
        }
    }

    /// Flushes what `held` holds whose time is up at `now`.
    pub fn route_due(
        &self,
        held: &mut Held,
        now: Millis,
        send: impl FnMut(&str, &S, Delivery<'_>),
    ) {
        let flushed = held.due(now);
        self.send_flushed(flushed, send);
    }

    /// Flushes what `session` holds: before its ack or response, which carry
    /// a seq that its client takes as "everything before has arrived".
    pub fn route_flush(
        &self,
        session: &str,
        held: &mut Held,
        send: impl FnMut(&str, &S, Delivery<'_>),
    ) {
        let events = held.take(session);
        let flushed = Flushed {
            session: session.to_owned(),
            events,
        };
        self.send_flushed(vec![flushed], send);
    }

    /// Flushes everything `held` holds (e.g. before the room is replaced).
    pub fn route_all(&self, held: &mut Held, send: impl FnMut(&str, &S, Delivery<'_>)) {
        let flushed = held.take_all();
        self.send_flushed(flushed, send);
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
            None => held.take(session),
            Some(p) => {
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
        let flushed = Flushed {
            session: session.to_owned(),
            events,
        };
        self.send_flushed(vec![flushed], send);
    }

    /// Hands flushed events to their members' sinks (dropped for members
    /// gone meanwhile: a resume replays them from the history).
    fn send_flushed(
        &self,
        flushed: Vec<Flushed<Arc<HistoryEntry>>>,
        mut send: impl FnMut(&str, &S, Delivery<'_>),
    ) {
        for f in flushed {
            if f.events.is_empty() {
                continue;
            }
            let Some((session, m)) = self.members.get_key_value(&f.session) else {
                continue;
            };
            if let Some(sink) = &m.sink {
                let aggregate = m.policy.as_deref().is_none_or(|p| p.aggregate);
                send(
                    session,
                    sink,
                    Delivery::Flush {
                        events: f.events,
                        aggregate,
                    },
                );
            }
        }
    }

    /// Calls `deliver` with every connected member that should get `entry`
    /// (see [`Room::for_each_recipient`]).
    pub fn for_each_recipient_member(
        &self,
        entry: &HistoryEntry,
        mut deliver: impl FnMut(&str, &Member<S>),
    ) {
        let mut to = |s: &str| {
            if let Some((session, m)) = self.members.get_key_value(s) {
                if m.sink.is_some() {
                    deliver(session, m);
                }
            }
        };
        match &entry.scope {
            Scope::All => {}
            Scope::Only(sessions) => {
                for s in sessions {
                    if entry.echo || entry.from.as_deref() != Some(s.as_str()) {
                        to(s);
                    }
                }
                return;
            }
            Scope::Near => {
                // The members whose area of interest holds the sender: its
                // neighbours, not a pass over the room.
                if let Some(from) = &entry.from {
                    self.space_viewers(from).for_each(|viewer| to(viewer));
                }
                return;
            }
        }
        // The sender is found once and skipped by address: comparing every
        // member's session id with it cost a memcmp per delivery.
        let sender = match (&entry.from, entry.echo) {
            (Some(from), false) => self.members.get_key_value(from.as_str()).map(|(k, _)| k),
            _ => None,
        };
        for (session, m) in &self.members {
            if sender.is_some_and(|s| std::ptr::eq(s, session)) {
                continue;
            }
            if m.sink.is_some() && subscribed(entry, &m.channels) {
                deliver(session, m);
            }
        }
    }
}
