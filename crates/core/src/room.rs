use std::collections::{BTreeSet, HashMap, VecDeque};
use std::sync::Arc;

use plaza_protocol::client::Op;
use plaza_protocol::server::{
    Event, EventBody, Joined as JoinedFrame, LeaveReason, LockInfo, MemberInfo, ResyncReason,
    ServerFrame, Snapshot, UnlockReason,
};
use plaza_protocol::{ErrorCode, DEFAULT_CHANNEL};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use crate::{EntityStore, HistoryEntry, LockTable, MemberState, Millis, RoomLog, RoomState};

/// Who may join a room.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Access {
    /// Anyone who knows the room id, with any name.
    #[default]
    Open,
    /// Only holders of a ticket issued for the room. Named `ticket`, as in
    /// the HTTP API (`ticket_only`, its first name in snapshots, still reads).
    #[serde(rename = "ticket", alias = "ticket_only")]
    TicketOnly,
}

/// Per-room limits and timings.
///
/// Serializable as part of a [`RoomState`]: every field is required, since a
/// replica whose limits silently defaulted would diverge from the others.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RoomConfig {
    /// Events kept for resume.
    pub history_size: usize,
    /// Connected members at most.
    pub max_members: usize,
    /// Who may join.
    pub access: Access,
    /// How long a dropped session can be resumed.
    pub resume_window_ms: Millis,
    /// Lease length when a `lock.acquire` names none.
    pub default_lock_ttl_ms: Millis,
    /// Longest lease granted.
    pub max_lock_ttl_ms: Millis,
    /// Client message ids remembered per session for idempotent publish (0: none).
    pub dedup_window: usize,
    /// Channels a member may subscribe to at once.
    pub max_channels: usize,
    /// Whether members see each other: `presence.join`/`presence.leave`
    /// events and the member list in `joined`. Off for large broadcast
    /// rooms, where every join would otherwise reach every member (O(n²)
    /// events) and every `joined` would list every member.
    pub presence: bool,
}

impl Default for RoomConfig {
    fn default() -> Self {
        RoomConfig {
            history_size: 1000,
            max_members: 10_000,
            access: Access::Open,
            resume_window_ms: 120_000,
            default_lock_ttl_ms: 30_000,
            max_lock_ttl_ms: 600_000,
            dedup_window: 256,
            max_channels: 32,
            presence: true,
        }
    }
}

/// A refusal: a stable code and a message for humans.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RoomError {
    /// Stable code.
    pub code: ErrorCode,
    /// Explanation.
    pub message: String,
}

impl RoomError {
    /// Builds an error.
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        RoomError {
            code,
            message: message.into(),
        }
    }
}

impl std::fmt::Display for RoomError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.code, self.message)
    }
}

impl std::error::Error for RoomError {}

/// One member (session) of a room, connected or waiting to resume.
#[derive(Debug)]
pub struct Member<S> {
    /// Public identity.
    pub info: MemberInfo,
    /// Subscribed channels.
    pub channels: Vec<String>,
    /// The room's seq when it subscribed to a channel after joining: a
    /// resume replays that channel's messages only from there on.
    subscribed_at: HashMap<String, u64>,
    /// Where its frames go while connected; `None` while disconnected.
    pub sink: Option<S>,
    resume_token: String,
    disconnected_at: Option<Millis>,
    /// Client message ids seen lately; boxed and created on the first id, so
    /// members that never send ids (most) pay one pointer.
    recent: Option<Box<RecentIds>>,
}

/// The last `dedup_window` client message ids of a member and their seqs.
#[derive(Debug, Default)]
struct RecentIds {
    seqs: HashMap<String, u64>,
    order: VecDeque<String>,
}

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
    /// Channels besides `main`.
    pub channels: Vec<String>,
    /// Whether the member came with a valid ticket.
    pub ticket: bool,
    /// Delivery handle for this member's frames.
    pub sink: S,
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

/// A message to publish. Serializable: cluster mode puts it into a room's
/// shared log as it is.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
pub struct PublishParams {
    /// Channel.
    pub channel: String,
    /// Application event name.
    pub event: String,
    /// Raw JSON payload.
    pub data: Option<Box<serde_json::value::RawValue>>,
    /// Client message id for idempotency.
    pub id: Option<String>,
    /// Topic.
    pub topic: Option<String>,
    /// The seq this message answers.
    pub reply_to: Option<u64>,
    /// Deliver to the sender too.
    pub echo: bool,
}

/// The outcome of a publish.
#[derive(Debug)]
pub struct Published {
    /// The message's seq (the original one for a duplicate).
    pub seq: u64,
    /// The new event to deliver; `None` for a duplicate.
    pub entry: Option<Arc<HistoryEntry>>,
}

/// The outcome of a successful request.
#[derive(Debug)]
pub struct RequestOutcome {
    /// The `result` of the response.
    pub result: Value,
    /// Events to deliver.
    pub events: Vec<Arc<HistoryEntry>>,
}

/// One room: members, state, locks and its ordered, bounded history.
///
/// Every change goes through a method that takes `now` and returns the
/// resulting events, already sequenced, encoded and stored in the history.
/// `S` is the runtime's delivery handle for a member; the room only stores it.
///
/// # Determinism
///
/// In cluster mode every node with members in a room runs its own replica:
/// it applies the same ordered inputs with the same timestamps, or loads a
/// [`RoomState`] and continues from there. Replicas must keep identical state
/// and emit byte-identical frames, or seqs, snapshots and resumes stop
/// agreeing between nodes. So the room reads no clock and no randomness, and
/// nothing it decides or emits may depend on the iteration order of
/// `members`, a `HashMap` whose order differs between instances (random
/// seeds): where members are iterated to choose, emit or return something,
/// the result is sorted or tie-broken by session id. The one exception is
/// [`Room::for_each_recipient`]: it only fans one frame out to distinct
/// connections, whose relative order nobody can observe, and it is the hot path.
#[derive(Debug)]
pub struct Room<S> {
    id: String,
    name: String,
    created_at: Millis,
    epoch: u64,
    config: RoomConfig,
    seq: u64,
    log: RoomLog,
    entities: EntityStore,
    locks: LockTable,
    members: HashMap<String, Member<S>>,
    tokens: HashMap<String, String>,
    connected: usize,
    /// The disconnected sessions by when they dropped (then by id): the
    /// first is the next resume window to end and the first to evict,
    /// without a pass over the members.
    disconnected: BTreeSet<(Millis, String)>,
}

impl<S> Room<S> {
    /// A new, empty room. `epoch` must differ between incarnations of the same id.
    pub fn new(id: String, name: String, config: RoomConfig, epoch: u64, now: Millis) -> Self {
        Room {
            log: RoomLog::new(config.history_size),
            id,
            name,
            created_at: now,
            epoch,
            config,
            seq: 0,
            entities: EntityStore::default(),
            locks: LockTable::default(),
            members: HashMap::new(),
            tokens: HashMap::new(),
            connected: 0,
            disconnected: BTreeSet::new(),
        }
    }

    /// Room id.
    pub fn id(&self) -> &str {
        &self.id
    }
    /// Display name.
    pub fn name(&self) -> &str {
        &self.name
    }
    /// Creation time.
    pub fn created_at(&self) -> Millis {
        self.created_at
    }
    /// This incarnation's epoch.
    pub fn epoch(&self) -> u64 {
        self.epoch
    }
    /// The last seq ordered.
    pub fn seq(&self) -> u64 {
        self.seq
    }
    /// The room's limits.
    pub fn config(&self) -> &RoomConfig {
        &self.config
    }
    /// Connected members.
    pub fn connected(&self) -> usize {
        self.connected
    }
    /// Sessions held, connected or resumable.
    pub fn sessions(&self) -> usize {
        self.members.len()
    }
    /// The history.
    pub fn log(&self) -> &RoomLog {
        &self.log
    }
    /// The entities.
    pub fn entities(&self) -> &EntityStore {
        &self.entities
    }
    /// A member by session id.
    pub fn member(&self, session: &str) -> Option<&Member<S>> {
        self.members.get(session)
    }

    /// Adds an entity without an event: for the initial state of a new room.
    pub fn seed_entity(&mut self, kind: Option<String>, data: Value) -> String {
        self.entities.create(kind, data).id
    }

    /// Joins a new member, or resumes an earlier session when `resume` is given.
    pub fn join(
        &mut self,
        params: JoinParams<S>,
        resume: Option<Resume>,
        now: Millis,
    ) -> Result<Joined<S>, RoomError> {
        if self.config.access == Access::TicketOnly && !params.ticket {
            return Err(RoomError::new(
                ErrorCode::TicketRequired,
                "this room admits ticket holders only",
            ));
        }
        self.check_channels(&params.channels)?;
        if let Some(r) = resume {
            if let Some(session) = self.tokens.get(&r.token).cloned() {
                if self.resume_window_ended(&session, now) {
                    // `tick` has not run yet: the session is over all the same.
                    self.remove_session(&session);
                } else {
                    return self.resume(session, r.last_seq, params.sink, now);
                }
            }
            let mut joined = self.join_new(params, now)?;
            joined.frame.reason = Some(ResyncReason::SessionExpired);
            return Ok(joined);
        }
        self.join_new(params, now)
    }

    fn join_new(&mut self, p: JoinParams<S>, now: Millis) -> Result<Joined<S>, RoomError> {
        if self.connected >= self.config.max_members {
            return Err(RoomError::new(
                ErrorCode::RoomFull,
                format!("room has {} members, its limit", self.config.max_members),
            ));
        }
        if self.members.contains_key(&p.session) || self.tokens.contains_key(&p.resume_token) {
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
        };
        self.tokens
            .insert(p.resume_token.clone(), p.session.clone());
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
            },
        );
        self.connected += 1;
        let events = self
            .announce(&p.session, EventBody::PresenceJoin { member: info }, now)
            .into_iter()
            .collect();
        Ok(Joined {
            frame: self.joined_frame(&p.session, true, false, now),
            missed: Vec::new(),
            events,
            replaced: None,
        })
    }

    fn resume(
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
            self.announce(&session, join, now).into_iter().collect()
        };
        let mut frame = self.joined_frame(&session, reason.is_some(), reason.is_none(), now);
        frame.reason = reason;
        Ok(Joined {
            frame,
            missed,
            events,
            replaced,
        })
    }

    /// Records a presence event caused by `session`, unless the room has
    /// presence turned off (then nobody hears of joins and leaves).
    fn announce(
        &mut self,
        session: &str,
        body: EventBody,
        now: Millis,
    ) -> Option<Arc<HistoryEntry>> {
        self.config
            .presence
            .then(|| self.push(Some(session), None, body, now))
    }

    fn joined_frame(
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
        }
    }

    /// The room state now.
    pub fn snapshot(&self, now: Millis) -> Snapshot {
        Snapshot {
            entities: self.entities.snapshot(),
            locks: self.locks.snapshot(now),
        }
    }

    /// Connected members, ordered by session id.
    pub fn members_info(&self) -> Vec<MemberInfo> {
        let mut v: Vec<MemberInfo> = self
            .members
            .values()
            .filter(|m| m.sink.is_some())
            .map(|m| m.info.clone())
            .collect();
        v.sort_by(|a, b| a.session.cmp(&b.session));
        v
    }

    /// The connected members whose sink matches `pred`, ordered by session id
    /// (e.g. those delivered through a node that went away), so that every
    /// replica that disconnects them one by one does so in the same order.
    pub fn connected_sessions(&self, pred: impl Fn(&S) -> bool) -> Vec<String> {
        let mut v: Vec<String> = self
            .members
            .iter()
            .filter(|(_, m)| m.sink.as_ref().is_some_and(&pred))
            .map(|(s, _)| s.clone())
            .collect();
        v.sort_unstable();
        v
    }

    /// The sinks of the connected members, in no particular order.
    pub fn connected_sinks(&self) -> impl Iterator<Item = &S> {
        self.members.values().filter_map(|m| m.sink.as_ref())
    }

    /// Everything the room holds except the sinks, for another node to
    /// [`import`](Room::import). `owner` names where a connected member's sink
    /// delivers (e.g. a node id); the importing node turns it back into a sink.
    pub fn export(&self, owner: impl Fn(&S) -> String) -> RoomState {
        let mut members: Vec<MemberState> = self
            .members
            .iter()
            .map(|(session, m)| MemberState {
                session: session.clone(),
                name: m.info.name.clone(),
                platform: m.info.platform.clone(),
                channels: m.channels.clone(),
                subscribed_at: {
                    let mut at: Vec<(String, u64)> = m
                        .subscribed_at
                        .iter()
                        .map(|(c, s)| (c.clone(), *s))
                        .collect();
                    at.sort_unstable();
                    at
                },
                resume_token: m.resume_token.clone(),
                owner: m.sink.as_ref().map(&owner),
                disconnected_at: m.disconnected_at,
                recent: m.recent.as_deref().map_or_else(Vec::new, |r| {
                    r.order.iter().map(|id| (id.clone(), r.seqs[id])).collect()
                }),
            })
            .collect();
        // Sorted: the same room exports the same state on every replica.
        members.sort_unstable_by(|a, b| a.session.cmp(&b.session));
        RoomState {
            format: RoomState::FORMAT,
            id: self.id.clone(),
            name: self.name.clone(),
            created_at: self.created_at,
            epoch: self.epoch,
            config: self.config.clone(),
            seq: self.seq,
            history: self.log.last(self.log.len()).cloned().collect(),
            entities: self.entities.clone(),
            locks: self.locks.clone(),
            members,
        }
    }

    /// A room continuing from an exported `state`. Each connected member gets
    /// `sink(owner)` for the owner [`export`](Room::export) recorded;
    /// disconnected members stay resumable, without a sink.
    ///
    /// # Panics
    /// If the history has a gap. A state from another process should pass
    /// [`RoomState::validate`] first.
    pub fn import(state: RoomState, mut sink: impl FnMut(&str) -> S) -> Room<S> {
        let mut log = RoomLog::new(state.config.history_size);
        for e in state.history {
            log.push(e);
        }
        let mut members = HashMap::with_capacity(state.members.len());
        let mut tokens = HashMap::with_capacity(state.members.len());
        let mut connected = 0;
        let mut disconnected = BTreeSet::new();
        for m in state.members {
            if let Some(t) = m.disconnected_at {
                disconnected.insert((t, m.session.clone()));
            }
            let sink = m.owner.as_deref().map(&mut sink);
            connected += usize::from(sink.is_some());
            let recent = (!m.recent.is_empty()).then(|| {
                Box::new(RecentIds {
                    seqs: m.recent.iter().cloned().collect(),
                    order: m.recent.into_iter().map(|(id, _)| id).collect(),
                })
            });
            tokens.insert(m.resume_token.clone(), m.session.clone());
            members.insert(
                m.session.clone(),
                Member {
                    info: MemberInfo {
                        session: m.session,
                        name: m.name,
                        platform: m.platform,
                    },
                    channels: m.channels,
                    subscribed_at: m.subscribed_at.into_iter().collect(),
                    sink,
                    resume_token: m.resume_token,
                    disconnected_at: m.disconnected_at,
                    recent,
                },
            );
        }
        Room {
            id: state.id,
            name: state.name,
            created_at: state.created_at,
            epoch: state.epoch,
            config: state.config,
            seq: state.seq,
            log,
            entities: state.entities,
            locks: state.locks,
            members,
            tokens,
            connected,
            disconnected,
        }
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
        let Some(m) = self.members.remove(session) else {
            return Vec::new();
        };
        self.tokens.remove(&m.resume_token);
        if let Some(t) = m.disconnected_at {
            self.disconnected.remove(&(t, session.to_owned()));
        }
        if m.sink.is_none() {
            return Vec::new();
        }
        self.connected -= 1;
        self.depart(session, LeaveReason::Left, now)
    }

    fn depart(
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
        // Sorted so that every replica closes its members in the same order.
        let mut closed: Vec<(String, S)> = self
            .members
            .drain()
            .filter_map(|(s, m)| Some((s, m.sink?)))
            .collect();
        closed.sort_unstable_by(|a, b| a.0.cmp(&b.0));
        closed.into_iter().map(|(_, sink)| sink).collect()
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
        self.locks
            .expire(now)
            .into_iter()
            .map(|l| self.push(None, None, unlocked(l, UnlockReason::Expired), now))
            .collect()
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
        match (sessions, self.locks.next_expiry()) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    fn evict_oldest_disconnected(&mut self) {
        // Ties (sessions that dropped in the same millisecond) go to the
        // smallest session id: which one is evicted must not depend on the
        // HashMap's order, or replicas would keep different sessions.
        if let Some((_, s)) = self.disconnected.first().cloned() {
            self.remove_session(&s);
        }
    }

    /// Forgets a session and its resume token, without events.
    fn remove_session(&mut self, session: &str) {
        if let Some(m) = self.members.remove(session) {
            self.tokens.remove(&m.resume_token);
            if let Some(t) = m.disconnected_at {
                self.disconnected.remove(&(t, session.to_owned()));
            }
        }
    }

    /// Whether `session` is disconnected and its resume window is over by `now`.
    fn resume_window_ended(&self, session: &str, now: Millis) -> bool {
        let window = self.config.resume_window_ms;
        self.members
            .get(session)
            .and_then(|m| m.disconnected_at)
            .is_some_and(|t| t.saturating_add(window) <= now)
    }

    fn connected_member(&mut self, session: &str) -> Result<&mut Member<S>, RoomError> {
        match self.members.get_mut(session) {
            Some(m) if m.sink.is_some() => Ok(m),
            _ => Err(RoomError::new(
                ErrorCode::NotJoined,
                "not a connected member of this room",
            )),
        }
    }

    /// Orders a message, or acknowledges a duplicate client message id again.
    pub fn publish(
        &mut self,
        session: &str,
        p: PublishParams,
        now: Millis,
    ) -> Result<Published, RoomError> {
        self.connected_member(session)?;
        if p.channel.is_empty() || p.channel.len() > 64 {
            return Err(RoomError::new(
                ErrorCode::InvalidFrame,
                format!("channel names have 1 to 64 bytes: {:?}", p.channel),
            ));
        }
        let seq = self.seq;
        let window = self.config.dedup_window;
        let m = self.connected_member(session)?;
        if let Some(id) = &p.id {
            if let Some(&seq) = m.recent.as_ref().and_then(|r| r.seqs.get(id)) {
                return Ok(Published { seq, entry: None });
            }
        }
        if p.reply_to.is_some_and(|r| r == 0 || r > seq) {
            return Err(RoomError::new(
                ErrorCode::InvalidFrame,
                format!("reply_to must name an earlier seq (1..={seq})"),
            ));
        }
        if let Some(id) = p.id.as_ref().filter(|_| window > 0) {
            let recent = m.recent.get_or_insert_with(Default::default);
            if recent.order.len() >= window {
                if let Some(old) = recent.order.pop_front() {
                    recent.seqs.remove(&old);
                }
            }
            recent.seqs.insert(id.clone(), seq + 1);
            recent.order.push_back(id.clone());
        }
        let body = EventBody::Message {
            channel: p.channel.clone(),
            event: p.event,
            data: p.data,
            topic: p.topic.clone(),
            reply_to: p.reply_to,
            id: p.id,
        };
        let sender = if p.echo {
            SenderCopy::Live
        } else {
            SenderCopy::None
        };
        let entry = self.push_full(
            Some(session),
            Some(p.channel),
            sender,
            p.topic,
            p.reply_to,
            body,
            now,
        );
        Ok(Published {
            seq: entry.seq,
            entry: Some(entry),
        })
    }

    /// Validates and applies a request.
    pub fn request(
        &mut self,
        session: &str,
        op: Op,
        now: Millis,
    ) -> Result<RequestOutcome, RoomError> {
        self.connected_member(session)?;
        match op {
            Op::EntityCreate { kind, data } => {
                let entity = self.entities.create(kind, data);
                let e = self.push_requested(
                    session,
                    EventBody::EntityCreated {
                        entity: entity.clone(),
                    },
                    now,
                );
                Ok(outcome(json!({"entity": entity, "seq": e.seq}), vec![e]))
            }
            Op::EntitySet { id, data, version } => {
                self.check_lock(&id, session, now)?;
                let entity = self.entities.set(&id, data, version)?;
                let e = self.push_requested(
                    session,
                    EventBody::EntityUpdated {
                        entity: entity.clone(),
                    },
                    now,
                );
                Ok(outcome(json!({"entity": entity, "seq": e.seq}), vec![e]))
            }
            Op::EntityPatch { id, data, version } => {
                self.check_lock(&id, session, now)?;
                let entity = self.entities.patch(&id, data, version)?;
                let e = self.push_requested(
                    session,
                    EventBody::EntityUpdated {
                        entity: entity.clone(),
                    },
                    now,
                );
                Ok(outcome(json!({"entity": entity, "seq": e.seq}), vec![e]))
            }
            Op::EntityDelete { id, version } => {
                self.check_lock(&id, session, now)?;
                let version = self.entities.delete(&id, version)?;
                let body = EventBody::EntityDeleted {
                    id: id.clone(),
                    version,
                };
                let e = self.push_requested(session, body, now);
                Ok(outcome(
                    json!({"id": id, "version": version, "seq": e.seq}),
                    vec![e],
                ))
            }
            Op::LockAcquire { object, ttl_ms } => {
                let ttl = self.lock_ttl(ttl_ms)?;
                let (lock, replaced) = self.locks.acquire(&object, session, ttl, now)?;
                let mut events = Vec::new();
                if let Some(old) = replaced {
                    events.push(self.push(None, None, unlocked(old, UnlockReason::Expired), now));
                }
                let e = self.push_requested(
                    session,
                    EventBody::LockAcquired { lock: lock.clone() },
                    now,
                );
                let result = json!({"lock": lock, "seq": e.seq});
                events.push(e);
                Ok(outcome(result, events))
            }
            Op::LockRenew { object, ttl_ms } => {
                let ttl = self.lock_ttl(ttl_ms)?;
                let lock = self.locks.renew(&object, session, ttl, now)?;
                let e = self.push_requested(
                    session,
                    EventBody::LockAcquired { lock: lock.clone() },
                    now,
                );
                Ok(outcome(json!({"lock": lock, "seq": e.seq}), vec![e]))
            }
            Op::LockRelease { object } => {
                let lock = self.locks.release(&object, session, now)?;
                let token = lock.token;
                let e = self.push_requested(session, unlocked(lock, UnlockReason::Released), now);
                Ok(outcome(
                    json!({"object": object, "token": token, "seq": e.seq}),
                    vec![e],
                ))
            }
            Op::ChannelSubscribe { channel } => {
                self.check_channels(std::slice::from_ref(&channel))?;
                let max = self.config.max_channels;
                let seq = self.seq;
                let m = self.connected_member(session)?;
                if !m.channels.contains(&channel) {
                    if m.channels.len() >= max {
                        return Err(RoomError::new(
                            ErrorCode::InvalidArgs,
                            format!("at most {max} channels per member"),
                        ));
                    }
                    m.subscribed_at.insert(channel.clone(), seq);
                    m.channels.push(channel);
                }
                Ok(outcome(json!({"channels": m.channels}), Vec::new()))
            }
            Op::ChannelUnsubscribe { channel } => {
                let m = self.connected_member(session)?;
                m.channels.retain(|c| *c != channel);
                m.subscribed_at.remove(&channel);
                Ok(outcome(json!({"channels": m.channels}), Vec::new()))
            }
        }
    }

    /// Checks that `to` is a connected member and returns its sink.
    pub fn direct_target(&self, from: &str, to: &str) -> Result<&S, RoomError> {
        if self.members.get(from).is_none_or(|m| m.sink.is_none()) {
            return Err(RoomError::new(
                ErrorCode::NotJoined,
                "not a connected member of this room",
            ));
        }
        self.members
            .get(to)
            .and_then(|m| m.sink.as_ref())
            .ok_or_else(|| {
                RoomError::new(
                    ErrorCode::SessionNotFound,
                    format!("no connected session {to:?}"),
                )
            })
    }

    /// Calls `deliver` with the sink of every connected member that should get `entry`.
    pub fn for_each_recipient(&self, entry: &HistoryEntry, mut deliver: impl FnMut(&str, &S)) {
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
            if let Some(sink) = &m.sink {
                if subscribed(entry, &m.channels) {
                    deliver(session, sink);
                }
            }
        }
    }

    fn check_lock(&self, object: &str, session: &str, now: Millis) -> Result<(), RoomError> {
        match self.locks.holder(object, now) {
            Some(l) if l.owner != session => Err(RoomError::new(
                ErrorCode::LockHeld,
                format!("{object:?} is locked by session {}", l.owner),
            )),
            _ => Ok(()),
        }
    }

    fn lock_ttl(&self, ttl_ms: Option<u64>) -> Result<Millis, RoomError> {
        match ttl_ms.unwrap_or(self.config.default_lock_ttl_ms) {
            0 => Err(RoomError::new(
                ErrorCode::InvalidArgs,
                "ttl_ms must be positive",
            )),
            t => Ok(t.min(self.config.max_lock_ttl_ms)),
        }
    }

    fn check_channels(&self, channels: &[String]) -> Result<(), RoomError> {
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

    fn push(
        &mut self,
        from: Option<&str>,
        channel: Option<String>,
        body: EventBody,
        now: Millis,
    ) -> Arc<HistoryEntry> {
        self.push_full(from, channel, SenderCopy::None, None, None, body, now)
    }

    /// Records a state change `session` asked for (entities, locks). Its
    /// requester learns the outcome from the response, and from the missed
    /// events if it resumes without one.
    fn push_requested(&mut self, session: &str, body: EventBody, now: Millis) -> Arc<HistoryEntry> {
        self.push_full(
            Some(session),
            None,
            SenderCopy::OnResume,
            None,
            None,
            body,
            now,
        )
    }

    #[allow(clippy::too_many_arguments)]
    fn push_full(
        &mut self,
        from: Option<&str>,
        channel: Option<String>,
        sender: SenderCopy,
        topic: Option<String>,
        reply_to: Option<u64>,
        body: EventBody,
        now: Millis,
    ) -> Arc<HistoryEntry> {
        self.seq += 1;
        let frame = ServerFrame::Event(Event {
            room: self.id.clone(),
            seq: self.seq,
            ts: now,
            from: from.map(str::to_owned),
            body,
        })
        .encode();
        let entry = Arc::new(HistoryEntry {
            seq: self.seq,
            ts: now,
            from: from.map(str::to_owned),
            channel,
            echo: sender == SenderCopy::Live,
            replay_to_sender: sender == SenderCopy::OnResume,
            topic,
            reply_to,
            frame,
        });
        self.log.push(entry.clone());
        entry
    }
}

/// Who besides the members gets an event from the session that caused it.
#[derive(Clone, Copy, PartialEq, Eq)]
enum SenderCopy {
    /// Nobody: the sender has its ack or response.
    None,
    /// The sender, live (`publish` with `echo`).
    Live,
    /// The sender, among the missed events when it resumes.
    OnResume,
}

/// Whether a session that resumes gets `entry` among its missed events: what
/// it would have received live (not messages of a channel from before it
/// subscribed), and the state changes it asked for itself.
fn replayed<S>(entry: &HistoryEntry, session: &str, m: &Member<S>) -> bool {
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
fn visible(entry: &HistoryEntry, session: &str, channels: &[String]) -> bool {
    if !entry.echo && entry.from.as_deref() == Some(session) {
        return false;
    }
    subscribed(entry, channels)
}

/// Whether a member subscribed to `channels` receives `entry`.
fn subscribed(entry: &HistoryEntry, channels: &[String]) -> bool {
    match &entry.channel {
        Some(c) => channels.iter().any(|x| x == c),
        None => true,
    }
}

fn unlocked(l: LockInfo, reason: UnlockReason) -> EventBody {
    EventBody::LockReleased {
        object: l.object,
        owner: l.owner,
        token: l.token,
        reason,
    }
}

fn outcome(result: Value, events: Vec<Arc<HistoryEntry>>) -> RequestOutcome {
    RequestOutcome { result, events }
}
