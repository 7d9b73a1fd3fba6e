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

/// Which events a connected member with no delivery policy is sent live:
/// what [`Room::route`] decides for such a member, made once for the member
/// and asked of every event. A member's connection so picks its events out
/// of a feed the room shares with all of them, rather than be handed each
/// one.
///
/// Asked for every event by every reader, so it answers the common case
/// (someone else's event, on `main`, to a member on `main` only) from what
/// it holds inline: the session's length and first 8 bytes, and whether
/// the channels are just `main`. A member's session and channels live on the
/// heap; reading them per event cost a cache miss each in a busy room.
#[derive(Debug, Clone)]
pub struct LiveFilter {
    session: Arc<str>,
    /// The session's first 8 bytes ([`head`]): ids are random, so another
    /// member's id differs in them (a first byte alone matched one id in
    /// 64, each match a read of the session: 0.6 % of a busy server).
    session_head: u64,
    channels: Arc<[String]>,
    /// `channels` is exactly `[main]`.
    main_only: bool,
}

impl LiveFilter {
    /// The filter of member `session` subscribed to `channels`.
    pub fn new(session: Arc<str>, channels: Arc<[String]>) -> LiveFilter {
        LiveFilter {
            session_head: head(&session),
            main_only: matches!(&channels[..], [c] if c == DEFAULT_CHANNEL),
            session,
            channels,
        }
    }

    /// The same member on other channels.
    pub fn with_channels(&self, channels: Arc<[String]>) -> LiveFilter {
        LiveFilter::new(self.session.clone(), channels)
    }

    /// Whether the member is sent `entry` live.
    #[inline]
    pub fn receives(&self, entry: &HistoryEntry) -> bool {
        if !entry.scope.is_all() {
            return false;
        }
        if own_unechoed(entry, |f| self.is_own(f)) {
            return false;
        }
        if self.main_only {
            // Against the constant: no `memcmp` call, no read of `channels`.
            entry
                .channel
                .as_deref()
                .is_none_or(|c| c == DEFAULT_CHANNEL)
        } else {
            subscribed(entry, &self.channels)
        }
    }

    /// `from == session`, mostly without reading the session.
    #[inline]
    fn is_own(&self, from: &str) -> bool {
        from.len() == self.session.len()
            && head(from) == self.session_head
            && (from.len() <= 8 || from == &*self.session)
    }
}

/// The first 8 bytes of `s` as a number, zeros past its end.
#[inline]
fn head(s: &str) -> u64 {
    let b = s.as_bytes();
    match b.first_chunk::<8>() {
        Some(h) => u64::from_le_bytes(*h),
        None => {
            let mut h = [0u8; 8];
            h[..b.len()].copy_from_slice(b);
            u64::from_le_bytes(h)
        }
    }
}

/// Whether `session`, subscribed to `channels`, receives `entry`: not its own
/// event (unless echoed), and messages only on subscribed channels.
pub(super) fn visible(entry: &HistoryEntry, session: &str, channels: &[String]) -> bool {
    !own_unechoed(entry, |f| same_session(f, session)) && subscribed(entry, channels)
}

/// Whether `entry` is its recipient's own (`is_own` of its sender) and not
/// echoed: then the recipient does not get it.
#[inline]
fn own_unechoed(entry: &HistoryEntry, is_own: impl FnOnce(&str) -> bool) -> bool {
    !entry.echo && entry.from.as_deref().is_some_and(is_own)
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
    use super::*;

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

    fn message() -> HistoryEntry {
        (*crate::history::tests::entry(1)).clone()
    }

    /// The filter answers exactly as the room's own rule (`visible`, for
    /// everyone-scoped events), for every combination of sender, echo,
    /// channel and subscriptions.
    #[test]
    fn live_filter_agrees_with_the_rooms_rule() {
        let sessions = [
            "Hk3vQ9xLm2A",
            "Hk3vQ9xLm2B",
            "Xk3vQ9xLm2A",
            "Hk3vQ9xLm2",
            "",
            "Hk3vQ9x",
            "Hk3vQ9y",
            "Hk3vQ9xL",
        ];
        let channel_sets: [&[&str]; 5] = [&["main"], &["xr"], &["main", "xr"], &[], &["mai"]];
        let channels = [None, Some("main"), Some("xr"), Some("ma")];
        let mut checked = 0;
        for me in sessions {
            for set in channel_sets {
                let subscribed: Arc<[String]> = set.iter().map(|c| c.to_string()).collect();
                let filter = LiveFilter::new(me.into(), subscribed.clone());
                for from in sessions.iter().map(|s| Some(s.to_string())).chain([None]) {
                    for channel in channels {
                        for echo in [false, true] {
                            for all in [true, false] {
                                let mut e = message();
                                e.from = from.clone();
                                e.channel = channel.map(str::to_owned);
                                e.echo = echo;
                                if !all {
                                    e.scope = crate::history::Scope::Only(vec![me.to_owned()]);
                                }
                                let rule = e.scope.is_all() && visible(&e, me, &subscribed);
                                assert_eq!(
                                    filter.receives(&e),
                                    rule,
                                    "{me:?} on {set:?}: from {from:?}, channel {channel:?}, echo {echo}, all {all}"
                                );
                                checked += 1;
                            }
                        }
                    }
                }
            }
        }
        assert_eq!(checked, 8 * 5 * 9 * 4 * 2 * 2);
    }

    /// After `with_channels`, the filter picks by the new channels.
    #[test]
    fn live_filter_with_other_channels() {
        let f = LiveFilter::new("a".into(), vec!["main".to_owned()].into());
        let mut e = message();
        e.from = Some("b".into());
        e.channel = Some("xr".into());
        assert!(!f.receives(&e));
        assert!(f.with_channels(vec!["xr".to_owned()].into()).receives(&e));
    }
}
