//! Who is in a room: joins, resumes, leaves, disconnects, and the expiry of
//! resume windows.

use plaza_protocol::client::{HistoryRequest, MAX_JOIN_HISTORY};
use plaza_protocol::server::JoinHistory;
use serde_json::value::RawValue;

use super::*;

/// What a caller supplies to join: identity, fresh ids and the delivery sink.
#[derive(Debug)]
pub struct JoinParams<S> {
    /// A new, unique session id (used unless an earlier session resumes).
    pub session: String,
    /// A new, unguessable resume token (same rule).
    pub resume_token: String,
    /// Display name.
    pub name: String,
    /// Platform.
    pub platform: String,
    /// The user id a verified token gave, if any: shown in presence, and a
    /// resume of its session must come from the same user.
    pub user: Option<String>,
    /// Channels besides `main`.
    pub channels: Vec<String>,
    /// Whether the member came with a valid ticket.
    pub ticket: bool,
    /// `Some(refusal)`: the connection vouched for no new member here (a
    /// node with token keys, and no ticket and no token granting `join`),
    /// so the join may only resume a session without a user (one joined
    /// with a ticket and no token): its resume token is its credential.
    /// Anything else (a session of a user, an unknown token) gets `refusal`.
    pub resume_only: Option<RoomError>,
    /// Delivery handle for this member's frames.
    pub sink: S,
    /// Its delivery policy; on a resume, replaces the session's (`None`
    /// keeps it).
    pub policy: Option<DeliveryPolicy>,
    /// Past messages to put in `joined` (not on a successful resume).
    pub history: Option<HistoryRequest>,
}

/// A member removed for good: where its frames went, if it was connected,
/// and the events its departure made.
#[derive(Debug)]
pub struct Removed<S> {
    /// Its sink, to tell it; `None` when it was disconnected.
    pub sink: Option<S>,
    /// What the others are told (its leave, its locks released, ...).
    pub events: Vec<Arc<HistoryEntry>>,
}

/// A resume request: the token from an earlier `joined` and the last seq seen.
#[derive(Debug, Clone)]
pub struct Resume {
    /// The earlier session's resume token.
    pub token: String,
    /// The highest seq the client holds.
    pub last_seq: u64,
}

/// The outcome of a join or resume.
#[derive(Debug)]
pub struct Joined<S> {
    /// The `joined` (or, with a `reason`, `resync`) frame for the member.
    pub frame: JoinedFrame,
    /// Events the resumed member missed, in order: send them right after `frame`.
    pub missed: Vec<Arc<HistoryEntry>>,
    /// New events for the other members (presence).
    pub events: Vec<Arc<HistoryEntry>>,
    /// The sink of a still-connected older connection of the same session,
    /// which the new connection replaces.
    pub replaced: Option<S>,
    /// The seq the client is at once it has `frame` and `missed`: its
    /// `last_seq` if nothing was missed (a resume), else `frame.seq`'s or
    /// the last missed event's.
    pub client_seq: u64,
}

impl<S> Joined<S> {
    /// The frame to send: `joined`, or `resync` when the stream could not continue.
    pub fn server_frame(&self) -> ServerFrame {
        if self.frame.reason.is_some() {
            ServerFrame::Resync(self.frame.clone())
        } else {
            ServerFrame::Joined(self.frame.clone())
        }
    }
}

impl<S> Room<S> {
    /// Joins a new member, or resumes an earlier session when `resume` is given.
    pub fn join(
        &mut self,
        mut params: JoinParams<S>,
        resume: Option<Resume>,
        now: Millis,
    ) -> Result<Joined<S>, RoomError> {
        if self.config.access == Access::TicketOnly && !params.ticket {
            return Err(ticket_required());
        }
        self.check_channels(&params.channels)?;
        if let Some(p) = &params.policy {
            // The lenient check, as every version of the room makes it: this
            // runs on every replica of a cluster, which must all decide a
            // join alike. The connection checked the pointers strictly
            // before the join's record was written.
            p.validate_stored().map_err(|e| {
                RoomError::new(ErrorCode::InvalidFrame, format!("invalid join policy: {e}"))
            })?;
        }
        let history = params.history.take();
        if let Some(h) = &history {
            h.validate()
                .map_err(|e| RoomError::new(ErrorCode::InvalidArgs, e))?;
            if h.channel != DEFAULT_CHANNEL && !params.channels.contains(&h.channel) {
                return Err(RoomError::new(
                    ErrorCode::InvalidArgs,
                    format!(
                        "history.channel {:?} is not among the join's channels",
                        h.channel
                    ),
                ));
            }
        }
        // Before the join's own presence event, which could push the oldest
        // message out of a full history.
        let history = history.map(|h| self.join_history(&h));
        let mut joined = self.join_or_resume(params, resume, now)?;
        if !joined.frame.resumed {
            joined.frame.history = history;
        }
        Ok(joined)
    }

    /// Whether a join that may only resume (see
    /// [`JoinParams::resume_only`]) with resume token `token` would get past
    /// its `refusal` at `now`: the room admits joins without a ticket, and
    /// `token` names a session of it without a user whose resume window is
    /// open. Otherwise the error the join would get: `ticket_required`, or
    /// `refusal`.
    ///
    /// A cluster node asks its replica this before it writes such a join's
    /// record, so that no record is written that an older node (which does
    /// not know `resume_only`) would apply as a new member. The replica may
    /// lag the log a little: the room's own decision, when the record is
    /// applied, is the one that counts.
    pub fn check_resume_only(
        &self,
        token: &str,
        refusal: RoomError,
        now: Millis,
    ) -> Result<(), RoomError> {
        if self.config.access == Access::TicketOnly {
            return Err(ticket_required());
        }
        let resumable = self.tokens.get(token).is_some_and(|session| {
            !self.resume_window_ended(session, now)
                && self
                    .members
                    .get(&**session)
                    .is_some_and(|m| m.info.user.is_none())
        });
        if resumable {
            Ok(())
        } else {
            Err(refusal)
        }
    }

    fn join_or_resume(
        &mut self,
        params: JoinParams<S>,
        resume: Option<Resume>,
        now: Millis,
    ) -> Result<Joined<S>, RoomError> {
        if let Some(r) = resume {
            if let Some(session) = self.tokens.get(r.token.as_str()).map(|s| s.to_string()) {
                if self.resume_window_ended(&session, now) {
                    // `tick` has not run yet: the session is over all the same.
                    self.remove_session(&session);
                } else {
                    // A session without a user carried no identity: its
                    // resume token alone resumes it, on any connection. A
                    // user's session needs that user's token.
                    if self.members[&session].info.user.is_some() {
                        if let Some(refusal) = params.resume_only {
                            return Err(refusal);
                        }
                        if self.members[&session].info.user != params.user {
                            return Err(RoomError::new(
                                ErrorCode::Forbidden,
                                "this session belongs to another user",
                            ));
                        }
                    }
                    let joined = self.resume(session, r.last_seq, params.sink, now)?;
                    if let Some(p) = params.policy {
                        if let Some(m) = self.members.get_mut(&joined.frame.session) {
                            m.policy = Some(Box::new(p));
                        }
                    }
                    return Ok(joined);
                }
            }
            if let Some(refusal) = params.resume_only {
                return Err(refusal);
            }
            let mut joined = self.join_new(params, now)?;
            joined.frame.reason = Some(ResyncReason::SessionExpired);
            return Ok(joined);
        }
        if let Some(refusal) = params.resume_only {
            return Err(refusal);
        }
        self.join_new(params, now)
    }

    pub(super) fn join_new(
        &mut self,
        p: JoinParams<S>,
        now: Millis,
    ) -> Result<Joined<S>, RoomError> {
        if self.connected >= self.config.max_members {
            return Err(RoomError::new(
                ErrorCode::RoomFull,
                format!("room has {} members, its limit", self.config.max_members),
            ));
        }
        if self.members.contains_key(&p.session)
            || self.tokens.contains_key(p.resume_token.as_str())
        {
            return Err(RoomError::new(
                ErrorCode::Internal,
                "session id or token collision",
            ));
        }
        let mut channels = vec![DEFAULT_CHANNEL.to_owned()];
        for c in p.channels {
            if !channels.contains(&c) {
                channels.push(c);
            }
        }
        if channels.len() > self.config.max_channels {
            return Err(RoomError::new(
                ErrorCode::InvalidArgs,
                format!(
                    "at most {} channels per member, main included",
                    self.config.max_channels
                ),
            ));
        }
        if self.members.len() >= self.config.max_members.saturating_mul(2) {
            self.evict_oldest_disconnected();
        }
        let info = MemberInfo {
            session: p.session.clone(),
            name: p.name,
            platform: p.platform,
            user: p.user,
        };
        self.tokens
            .insert(p.resume_token.as_str().into(), p.session.as_str().into());
        self.members.insert(
            p.session.clone(),
            Member {
                info: info.clone(),
                channels,
                subscribed_at: HashMap::new(),
                sink: Some(p.sink),
                resume_token: p.resume_token,
                disconnected_at: None,
                recent: None,
                policy: p.policy.map(Box::new),
            },
        );
        self.connected += 1;
        let mut events: Vec<Arc<HistoryEntry>> = self
            .announce(&p.session, EventBody::PresenceJoin { member: info }, now)
            .into_iter()
            .collect();
        events.extend(self.space_enter(&p.session, now));
        Ok(Joined {
            frame: self.joined_frame(&p.session, true, false, now),
            missed: Vec::new(),
            events,
            replaced: None,
            client_seq: self.seq,
        })
    }

    pub(super) fn resume(
        &mut self,
        session: String,
        last_seq: u64,
        sink: S,
        now: Millis,
    ) -> Result<Joined<S>, RoomError> {
        let was_connected = self.members[&session].sink.is_some();
        if !was_connected && self.connected >= self.config.max_members {
            return Err(RoomError::new(ErrorCode::RoomFull, "room is full"));
        }
        let m = self
            .members
            .get_mut(&session)
            .expect("tokens point at members");
        let replaced = m.sink.replace(sink);
        if let Some(t) = m.disconnected_at.take() {
            self.disconnected.remove(&(t, session.clone()));
        }
        let info = m.info.clone();
        if !was_connected {
            self.connected += 1;
        }
        let reason = if last_seq > self.seq {
            Some(ResyncReason::EpochChanged)
        } else if self.log.since(last_seq).is_none() {
            Some(ResyncReason::HistoryTruncated)
        } else {
            None
        };
        let missed = match reason {
            None => {
                let m = &self.members[&session];
                self.log
                    .since(last_seq)
                    .expect("checked above")
                    .filter(|e| replayed(e, &session, m))
                    .cloned()
                    .collect()
            }
            Some(_) => Vec::new(),
        };
        let events = if was_connected {
            Vec::new()
        } else {
            let join = EventBody::PresenceJoin { member: info };
            let mut events: Vec<Arc<HistoryEntry>> =
                self.announce(&session, join, now).into_iter().collect();
            events.extend(self.space_enter(&session, now));
            events
        };
        let mut frame = self.joined_frame(&session, reason.is_some(), reason.is_none(), now);
        let client_seq = match reason {
            None => missed.last().map_or(last_seq, |e| e.seq),
            Some(_) => frame.seq,
        };
        frame.reason = reason;
        Ok(Joined {
            frame,
            missed,
            events,
            replaced,
            client_seq,
        })
    }

    /// Records a presence event caused by `session`, unless the room has
    /// presence turned off (then nobody hears of joins and leaves).
    pub(super) fn announce(
        &mut self,
        session: &str,
        body: EventBody,
        now: Millis,
    ) -> Option<Arc<HistoryEntry>> {
        self.config
            .presence
            .then(|| self.push(Some(session), None, body, now))
    }

    pub(super) fn joined_frame(
        &self,
        session: &str,
        with_snapshot: bool,
        resumed: bool,
        now: Millis,
    ) -> JoinedFrame {
        let m = &self.members[session];
        JoinedFrame {
            room: self.id.clone(),
            session: session.to_owned(),
            resume_token: m.resume_token.clone(),
            epoch: self.epoch,
            seq: self.seq,
            // Without presence a member sees only itself.
            members: if self.config.presence {
                self.members_info()
            } else {
                vec![m.info.clone()]
            },
            snapshot: with_snapshot.then(|| self.snapshot(now)),
            channels: m.channels.clone(),
            resumed,
            reason: None,
            space: self.space_snapshot(session),
            history: None,
            compact: None,
        }
    }

    /// The messages a join's `history` names, as whole event frames.
    pub(super) fn join_history(&self, h: &HistoryRequest) -> JoinHistory {
        let last = usize::try_from(h.last.unwrap_or(MAX_JOIN_HISTORY)).unwrap_or(usize::MAX);
        let (found, complete) = self.log.messages(&h.channel, h.since.unwrap_or(0), last);
        let events = found
            .into_iter()
            .filter_map(|e| {
                // Frames are JSON text; anything else could not be embedded.
                let text = std::str::from_utf8(&e.frame).ok()?;
                RawValue::from_string(text.to_owned()).ok()
            })
            .collect();
        JoinHistory { events, complete }
    }

    /// The member's connection dropped: it stays resumable for the resume
    /// window; its locks are released and the others see it leave.
    pub fn disconnect(&mut self, session: &str, now: Millis) -> Vec<Arc<HistoryEntry>> {
        let Some(m) = self.members.get_mut(session) else {
            return Vec::new();
        };
        if m.sink.take().is_none() {
            return Vec::new();
        }
        m.disconnected_at = Some(now);
        self.disconnected.insert((now, session.to_owned()));
        self.connected -= 1;
        self.depart(session, LeaveReason::Disconnected, now)
    }

    /// The member leaves for good.
    pub fn leave(&mut self, session: &str, now: Millis) -> Vec<Arc<HistoryEntry>> {
        self.remove(session, LeaveReason::Left, now)
            .map(|k| k.events)
            .unwrap_or_default()
    }

    /// An admin removes the member for good (connected or not): the others
    /// see it leave with reason `kicked`. Returns its sink, if it was
    /// connected (to tell it), and the events; `None` without such a session.
    pub fn kick(&mut self, session: &str, now: Millis) -> Option<Removed<S>> {
        self.remove(session, LeaveReason::Kicked, now)
    }

    fn remove(&mut self, session: &str, reason: LeaveReason, now: Millis) -> Option<Removed<S>> {
        let m = self.members.remove(session)?;
        self.tokens.remove(m.resume_token.as_str());
        if let Some(t) = m.disconnected_at {
            self.disconnected.remove(&(t, session.to_owned()));
        }
        let Some(sink) = m.sink else {
            // Departed already, when it dropped: only where it stood is left.
            self.space_forget(session);
            return Some(Removed {
                sink: None,
                events: Vec::new(),
            });
        };
        self.connected -= 1;
        let events = self.depart(session, reason, now);
        Some(Removed {
            sink: Some(sink),
            events,
        })
    }

    pub(super) fn depart(
        &mut self,
        session: &str,
        reason: LeaveReason,
        now: Millis,
    ) -> Vec<Arc<HistoryEntry>> {
        // Leases that ran out before the departure end as `expired`, as the
        // next tick would have said: only live ones end with the session.
        let mut out: Vec<_> = self
            .locks
            .expire(now)
            .into_iter()
            .map(|l| self.push(None, None, unlocked(l, UnlockReason::Expired), now))
            .collect();
        let released = self.locks.release_all(session);
        out.extend(released.into_iter().map(|l| {
            // A session that resumes must learn its locks ended (it gets no
            // snapshot, only the missed events).
            self.push_requested(session, unlocked(l, UnlockReason::Disconnected), now)
        }));
        out.extend(self.space_exit(session, reason == LeaveReason::Disconnected, now));
        let body = EventBody::PresenceLeave {
            session: session.to_owned(),
            reason,
        };
        out.extend(self.announce(session, body, now));
        out
    }

    /// Removes every connected member (the room is being deleted) and returns
    /// their sinks, ordered by session id.
    pub fn close(&mut self) -> Vec<S> {
        self.tokens.clear();
        self.connected = 0;
        self.disconnected.clear();
        // In session order, the same on every replica.
        std::mem::take(&mut self.members)
            .into_values()
            .filter_map(|m| m.sink)
            .collect()
    }

    /// Expires leases and resume windows that ended by `now`.
    pub fn tick(&mut self, now: Millis) -> Vec<Arc<HistoryEntry>> {
        let window = self.config.resume_window_ms;
        // In the order they dropped, the same on every replica.
        while let Some((t, s)) = self.disconnected.first().cloned() {
            if t.saturating_add(window) > now {
                break;
            }
            self.remove_session(&s);
        }
        let mut out: Vec<Arc<HistoryEntry>> = self
            .locks
            .expire(now)
            .into_iter()
            .map(|l| self.push(None, None, unlocked(l, UnlockReason::Expired), now))
            .collect();
        out.extend(self.space_tick(now));
        out
    }

    /// The next time [`Room::tick`] has work.
    pub fn next_deadline(&self) -> Option<Millis> {
        debug_assert!(
            self.disconnected.len()
                == self
                    .members
                    .values()
                    .filter(|m| m.disconnected_at.is_some())
                    .count()
                && self.disconnected.iter().all(|(t, s)| {
                    self.members.get(s).and_then(|m| m.disconnected_at) == Some(*t)
                }),
            "the disconnected index lost track of the members"
        );
        let window = self.config.resume_window_ms;
        let sessions = self
            .disconnected
            .first()
            .map(|(t, _)| t.saturating_add(window));
        [sessions, self.locks.next_expiry(), self.space_deadline()]
            .into_iter()
            .flatten()
            .min()
    }

    pub(super) fn evict_oldest_disconnected(&mut self) {
        // Ties (sessions that dropped in the same millisecond) go to the
        // smallest session id: which one is evicted must not depend on the
        // HashMap's order, or replicas would keep different sessions.
        if let Some((_, s)) = self.disconnected.first().cloned() {
            self.remove_session(&s);
        }
    }

    /// Forgets a session and its resume token, without events.
    pub(super) fn remove_session(&mut self, session: &str) {
        self.space_forget(session);
        if let Some(m) = self.members.remove(session) {
            self.tokens.remove(m.resume_token.as_str());
            if let Some(t) = m.disconnected_at {
                self.disconnected.remove(&(t, session.to_owned()));
            }
        }
    }

    /// Whether `session` is disconnected and its resume window is over by `now`.
    pub(super) fn resume_window_ended(&self, session: &str, now: Millis) -> bool {
        let window = self.config.resume_window_ms;
        self.members
            .get(session)
            .and_then(|m| m.disconnected_at)
            .is_some_and(|t| t.saturating_add(window) <= now)
    }

    pub(super) fn connected_member(&mut self, session: &str) -> Result<&mut Member<S>, RoomError> {
        match self.members.get_mut(session) {
            Some(m) if m.sink.is_some() => Ok(m),
            _ => Err(RoomError::new(
                ErrorCode::NotJoined,
                "not a connected member of this room",
            )),
        }
    }

    pub(super) fn check_channels(&self, channels: &[String]) -> Result<(), RoomError> {
        if channels.len() > self.config.max_channels {
            return Err(RoomError::new(ErrorCode::InvalidArgs, "too many channels"));
        }
        match channels.iter().find(|c| c.is_empty() || c.len() > 64) {
            Some(c) => Err(RoomError::new(
                ErrorCode::InvalidArgs,
                format!("channel names have 1 to 64 bytes: {c:?}"),
            )),
            None => Ok(()),
        }
    }
}

fn ticket_required() -> RoomError {
    RoomError::new(
        ErrorCode::TicketRequired,
        "this room admits ticket holders only",
    )
}
