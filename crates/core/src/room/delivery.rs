//! Who receives an event: live, on resume, and one peer's direct message.

use super::*;

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

/// Whether a connected member `session` with no delivery policy, subscribed
/// to `channels`, is sent `entry` live: what [`Room::route`] decides for such
/// a member. A member's connection can so pick its events out of a feed the
/// room shares with all of them, rather than be handed each one.
pub fn receives_live(entry: &HistoryEntry, session: &str, channels: &[String]) -> bool {
    entry.scope.is_all() && visible(entry, session, channels)
}

/// Whether `session`, subscribed to `channels`, receives `entry`: not its own
/// event (unless echoed), and messages only on subscribed channels.
pub(super) fn visible(entry: &HistoryEntry, session: &str, channels: &[String]) -> bool {
    if !entry.echo
        && entry
            .from
            .as_deref()
            .is_some_and(|f| same_session(f, session))
    {
        return false;
    }
    subscribed(entry, channels)
}

/// `a == b` for two session ids. Ids are random and of one length, so a
/// plain comparison called `memcmp` for every delivery (3.8 % of the
/// server's samples in a profile at 1,600 members); nearly every pair
/// differs in its first byte already.
#[inline]
fn same_session(a: &str, b: &str) -> bool {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    a.len() == b.len() && a.first() == b.first() && a == b
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

#[cfg(test)]
mod tests {
    use super::same_session;

    #[test]
    fn same_session_is_plain_equality() {
        let ids = [
            "Hk3vQ9xLm2A",
            "Hk3vQ9xLm2B",
            "Xk3vQ9xLm2A",
            "Hk3vQ9xLm2",
            "",
            "H",
        ];
        for a in ids {
            for b in ids {
                assert_eq!(same_session(a, b), a == b, "{a:?} {b:?}");
            }
        }
    }
}
