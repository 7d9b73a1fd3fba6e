//! One room: members, state, locks and its ordered, bounded history.
//!
//! The room is split by concept: [`membership`] (join, resume, leave,
//! disconnect, expiry), [`publish`] (messages and their idempotency),
//! [`requests`] (entities, locks, channels), [`delivery`] (who receives what),
//! [`routing`] (delivery under members' policies),
//! [`export`] (snapshots). This file holds the room itself and the one place a
//! seq is assigned ([`Room::push_full`]).

mod delivery;
mod export;
mod member;
mod membership;
mod publish;
mod requests;
mod routing;
mod server_calls;
mod spatial;

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::sync::Arc;

use plaza_protocol::client::Op;
use plaza_protocol::server::{
    Event, EventBody, Joined as JoinedFrame, LeaveReason, LockInfo, MemberInfo, ResyncReason,
    ServerFrame, Snapshot, UnlockReason,
};
use plaza_protocol::{ErrorCode, DEFAULT_CHANNEL};
use serde_json::{json, Value};

use crate::policy::DeliveryPolicy;
use crate::{
    Access, EntityStore, HistoryEntry, LockTable, MemberState, Millis, RoomConfig, RoomError,
    RoomLog, RoomState, Scope,
};

pub use delivery::LiveFilter;
pub use member::Member;
pub use membership::{JoinParams, Joined, Removed, Resume};
pub use publish::{PublishParams, Published};
pub use requests::RequestOutcome;
pub use routing::{Delivery, Held};
pub use server_calls::{ServerPublish, MAX_SERVER_KEY_BYTES, SERVER_KEYS_KEPT, SERVER_SENDER};

use delivery::replayed;
use member::RecentIds;
use server_calls::ServerKeys;

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
/// nothing it decides or emits may depend on an order that differs between
/// instances: `members` is ordered by session id, and where other collections
/// are iterated to choose, emit or return something, the result is sorted or
/// tie-broken by session id.
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
    /// Ordered by session id, in a B-tree rather than a hash table: its memory
    /// follows the members held. A hash table with members joining and leaving
    /// all the time (each kept for its resume window) fills with tombstones
    /// and, once they use up its free slots, doubles although the count stays
    /// the same: RSS stepped up ~20 minutes into a soak (docs/benchmarks-history.md).
    members: BTreeMap<String, Member<S>>,
    /// Resume token to session, a B-tree for the same reason.
    tokens: BTreeMap<Box<str>, Box<str>>,
    connected: usize,
    /// The disconnected sessions by when they dropped (then by id): the
    /// first is the next resume window to end and the first to evict,
    /// without a pass over the members.
    disconnected: BTreeSet<(Millis, String)>,
    /// Spatial rooms (`config.space`): the members in the plane.
    space: Option<spatial::RoomSpace>,
    /// The application backend's idempotency keys seen lately.
    server_keys: ServerKeys,
}

impl<S> Room<S> {
    /// A new, empty room. `epoch` must differ between incarnations of the same id.
    pub fn new(id: String, name: String, config: RoomConfig, epoch: u64, now: Millis) -> Self {
        Room {
            space: config_space(&config),
            log: RoomLog::new(config.history_size),
            id,
            name,
            created_at: now,
            epoch,
            config,
            seq: 0,
            entities: EntityStore::default(),
            locks: LockTable::default(),
            members: BTreeMap::new(),
            tokens: BTreeMap::new(),
            connected: 0,
            disconnected: BTreeSet::new(),
            server_keys: ServerKeys::default(),
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

    fn push(
        &mut self,
        from: Option<&str>,
        channel: Option<String>,
        body: EventBody,
        now: Millis,
    ) -> Arc<HistoryEntry> {
        self.push_full(
            from,
            channel,
            SenderCopy::None,
            None,
            None,
            Scope::All,
            body,
            now,
        )
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
            Scope::All,
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
        scope: Scope,
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
            scope,
            frame,
            wire: Default::default(),
        });
        self.log.push(entry.clone());
        entry
    }
}

impl<S> Room<S> {
    /// Records an event for some members only (see [`Scope`]); never
    /// replayed on resume, since a `joined` carries the space anew.
    fn push_scoped(
        &mut self,
        from: Option<&str>,
        scope: Scope,
        body: EventBody,
        now: Millis,
    ) -> Arc<HistoryEntry> {
        self.push_full(from, None, SenderCopy::None, None, None, scope, body, now)
    }
}

/// The space of a new room with `config`.
fn config_space(config: &RoomConfig) -> Option<spatial::RoomSpace> {
    config.space.as_ref().map(|c| spatial::RoomSpace {
        space: crate::spatial::Space::new(c.clone()),
        evaluated_at: 0,
        parked: BTreeMap::new(),
    })
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

fn unlocked(l: LockInfo, reason: UnlockReason) -> EventBody {
    EventBody::LockReleased {
        object: l.object,
        owner: l.owner,
        token: l.token,
        reason,
    }
}
