//! An in-process [`Cluster`]: several nodes of one process share one hub, so
//! the server's multi-node behaviour can be tested without Redis.
//!
//! Besides the [`Cluster`] behaviour it can simulate the failures a real
//! broker has: a node crashing ([`MemoryCluster::kill_node`]), the broker
//! itself going away for a while ([`MemoryCluster::set_available`]), and a
//! node missing notices ([`MemoryCluster::set_deaf`]), and a failover to a
//! replica that lacks a room's last entries ([`MemoryCluster::rewind_log`]).

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{SystemTime, UNIX_EPOCH};

use async_trait::async_trait;
use bytes::Bytes;
use plaza_core::Millis;

use crate::{AppendFuture, Cluster, ClusterError, LogEntry, LogListener, LogNotice, LogPosition};

/// How many entries a room's log keeps unless configured otherwise.
pub const DEFAULT_LOG_CAPACITY: usize = 10_000;

/// The shared hub. Every node gets its view with [`MemoryCluster::node`].
pub struct MemoryCluster {
    log_capacity: usize,
    hub: Mutex<Hub>,
}

/// The control listener's key among a node's subscriptions: no room id is
/// empty, so none can take it.
const CONTROL: &str = "";

#[derive(Default)]
struct Hub {
    available: bool,
    rooms: HashMap<String, RoomState>,
    nodes: HashMap<String, NodeState>,
}

struct RoomState {
    meta: Bytes,
    /// The recorded member count and the log position it was counted at.
    members: Option<(u64, u64)>,
    /// Position of the last entry ever appended (entries may be trimmed).
    n: u64,
    log: VecDeque<LogEntry>,
    snapshot: (u64, Bytes),
}

#[derive(Default)]
struct NodeState {
    /// Bumped when a node id is started again, so views of its earlier life
    /// stay dead.
    incarnation: u64,
    alive: bool,
    /// While set, the node's subscriptions miss every entry.
    deaf: bool,
    subscriptions: HashMap<String, LogListener>,
}

impl MemoryCluster {
    /// A hub whose rooms keep [`DEFAULT_LOG_CAPACITY`] log entries.
    pub fn new() -> Arc<Self> {
        Self::with_log_capacity(DEFAULT_LOG_CAPACITY)
    }

    /// A hub whose rooms keep the last `capacity` log entries (at least one).
    pub fn with_log_capacity(capacity: usize) -> Arc<Self> {
        Arc::new(Self {
            log_capacity: capacity.max(1),
            hub: Mutex::new(Hub {
                available: true,
                ..Hub::default()
            }),
        })
    }

    /// Starts node `id` (again, if it ran before) and returns its view. Views
    /// handed out for an earlier start of the same id stop working, as a
    /// restarted process would not know its predecessor's state.
    pub fn node(self: &Arc<Self>, id: &str) -> Arc<dyn Cluster> {
        let mut hub = self.lock();
        let node = hub.nodes.entry(id.to_owned()).or_default();
        node.incarnation += 1;
        node.alive = true;
        node.subscriptions.clear();
        Arc::new(MemoryNode {
            hub: Arc::clone(self),
            id: id.to_owned(),
            incarnation: node.incarnation,
        })
    }

    /// Simulates node `id` crashing: it is reported dead, its subscriptions
    /// are gone and its views fail every call with
    /// [`ClusterError::Unavailable`] (a crashed node appends nothing more).
    pub fn kill_node(&self, id: &str) {
        if let Some(node) = self.lock().nodes.get_mut(id) {
            node.alive = false;
            node.subscriptions.clear();
        }
    }

    /// Simulates a broker outage: while `false`, every call fails with
    /// [`ClusterError::Unavailable`]. Setting it back to `true` tells every
    /// subscribed listener [`LogNotice::Resubscribed`], as a reconnecting
    /// broker client would.
    pub fn set_available(&self, available: bool) {
        let mut hub = self.lock();
        let was = std::mem::replace(&mut hub.available, available);
        if available && !was {
            for node in hub.nodes.values().filter(|n| n.alive) {
                for listener in node.subscriptions.values() {
                    listener(LogNotice::Resubscribed);
                }
            }
        }
    }

    /// Simulates lost notices: while `deaf`, node `id`'s subscriptions get
    /// no [`LogNotice::Entry`] (its calls still work, its appends land), as
    /// when a real broker's pub/sub messages are dropped. It learns of the gap
    /// from the first entry it hears afterwards.
    pub fn set_deaf(&self, id: &str, deaf: bool) {
        if let Some(node) = self.lock().nodes.get_mut(id) {
            node.deaf = deaf;
        }
    }

    /// The position of the last entry appended to room `room`'s log (0 for
    /// none), `None` if there is no such room. Test support.
    pub fn log_end(&self, room: &str) -> Option<u64> {
        self.lock().rooms.get(room).map(|r| r.n)
    }

    /// Simulates a broker failover that lost the last entries of room
    /// `room`'s log: a Redis replica promoted before it received them
    /// (replication is asynchronous). Entries after `to_n` are dropped and
    /// the next append gets position `to_n + 1` again, with whatever
    /// contents it has. Nothing is told to the nodes (a real failover makes
    /// them subscribe again: [`MemoryCluster::set_available`] does that);
    /// those that applied the lost entries learn of it from the entries
    /// that take their place, or from the log's end when they catch up. A member count recorded after `to_n` is lost
    /// too. Does nothing if there is no such room or `to_n` is not before
    /// the log's end. Test support.
    ///
    /// # Panics
    ///
    /// If the room's snapshot is after `to_n`: this hub keeps only the
    /// latest snapshot, so it cannot go back to the one a real replica
    /// would hold (snapshots and log share a room's hash slot, so a real
    /// failover loses a later snapshot with the entries).
    pub fn rewind_log(&self, room: &str, to_n: u64) {
        let mut hub = self.lock();
        let Some(state) = hub.rooms.get_mut(room) else {
            return;
        };
        if to_n >= state.n {
            return;
        }
        assert!(
            state.snapshot.0 <= to_n,
            "room {room:?}: its snapshot at {} is after {to_n}",
            state.snapshot.0
        );
        state.log.retain(|e| e.n <= to_n);
        state.n = to_n;
        if state.members.is_some_and(|(_, at)| at > to_n) {
            state.members = None;
        }
    }

    fn lock(&self) -> MutexGuard<'_, Hub> {
        // A panicking listener must not take every other test node down.
        self.hub.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl std::fmt::Debug for MemoryCluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryCluster")
            .field("log_capacity", &self.log_capacity)
            .finish_non_exhaustive()
    }
}

/// One node's view of the hub.
struct MemoryNode {
    hub: Arc<MemoryCluster>,
    id: String,
    incarnation: u64,
}

impl MemoryNode {
    /// The hub, if this view may use it now.
    fn hub(&self) -> Result<MutexGuard<'_, Hub>, ClusterError> {
        let hub = self.hub.lock();
        if !hub.available {
            return Err(ClusterError::Unavailable(
                "memory cluster set unavailable".into(),
            ));
        }
        if !self.is_current(&hub) {
            return Err(ClusterError::Unavailable(format!(
                "node {:?} is not running (killed, left or started again)",
                self.id
            )));
        }
        Ok(hub)
    }

    fn append_now(&self, room: &str, payload: Bytes) -> Result<LogPosition, ClusterError> {
        let capacity = self.hub.log_capacity;
        let mut hub = self.hub()?;
        let state = hub.rooms.get_mut(room).ok_or_else(|| not_found(room))?;
        // Replicas apply entries at their timestamps, so time must not run
        // backwards within a room even if the wall clock does.
        let ts = now_ms().max(state.log.back().map_or(0, |e| e.ts));
        state.n += 1;
        let entry = LogEntry {
            n: state.n,
            ts,
            payload,
        };
        state.log.push_back(entry.clone());
        while state.log.len() > capacity {
            state.log.pop_front();
        }
        let position = LogPosition { n: entry.n, ts };
        // Called under the lock so every listener sees one order per room.
        for node in hub.nodes.values().filter(|n| n.alive && !n.deaf) {
            if let Some(listener) = node.subscriptions.get(room) {
                listener(LogNotice::Entry(entry.clone()));
            }
        }
        Ok(position)
    }

    fn is_current(&self, hub: &Hub) -> bool {
        hub.nodes
            .get(&self.id)
            .is_some_and(|n| n.alive && n.incarnation == self.incarnation)
    }
}

fn now_ms() -> Millis {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as Millis)
}

fn not_found(room: &str) -> ClusterError {
    ClusterError::RoomNotFound(room.to_owned())
}

#[async_trait]
impl Cluster for MemoryNode {
    fn node_id(&self) -> &str {
        &self.id
    }

    async fn create_room(
        &self,
        id: &str,
        meta: Bytes,
        snapshot: Bytes,
    ) -> Result<bool, ClusterError> {
        let mut hub = self.hub()?;
        if hub.rooms.contains_key(id) {
            return Ok(false);
        }
        hub.rooms.insert(
            id.to_owned(),
            RoomState {
                meta,
                members: None,
                n: 0,
                log: VecDeque::new(),
                snapshot: (0, snapshot),
            },
        );
        Ok(true)
    }

    async fn room_meta(&self, id: &str) -> Result<Option<Bytes>, ClusterError> {
        Ok(self.hub()?.rooms.get(id).map(|r| r.meta.clone()))
    }

    async fn list_rooms(&self) -> Result<Vec<(String, Bytes)>, ClusterError> {
        let hub = self.hub()?;
        Ok(hub
            .rooms
            .iter()
            .map(|(id, r)| (id.clone(), r.meta.clone()))
            .collect())
    }

    async fn delete_room(&self, id: &str) -> Result<bool, ClusterError> {
        Ok(self.hub()?.rooms.remove(id).is_some())
    }

    async fn set_room_members(&self, id: &str, members: u64, at: u64) -> Result<(), ClusterError> {
        if let Some(room) = self.hub()?.rooms.get_mut(id) {
            if room.members.is_none_or(|(_, recorded)| at > recorded) {
                room.members = Some((members, at));
            }
        }
        Ok(())
    }

    async fn room_members(&self, ids: &[String]) -> Result<Vec<u64>, ClusterError> {
        let hub = self.hub()?;
        Ok(ids
            .iter()
            .map(|id| {
                hub.rooms
                    .get(id)
                    .and_then(|r| r.members)
                    .map_or(0, |(n, _)| n)
            })
            .collect())
    }

    fn append(&self, room: &str, payload: Bytes) -> AppendFuture {
        // Done at once, so the call order is the log order.
        Box::pin(std::future::ready(self.append_now(room, payload)))
    }

    async fn read(
        &self,
        room: &str,
        after: u64,
        limit: usize,
    ) -> Result<Vec<LogEntry>, ClusterError> {
        let hub = self.hub()?;
        let state = hub.rooms.get(room).ok_or_else(|| not_found(room))?;
        let mut following = state.log.iter().filter(|e| e.n > after).peekable();
        match following.peek() {
            Some(first) if first.n != after + 1 => Err(ClusterError::Trimmed(room.to_owned())),
            _ => Ok(following.take(limit).cloned().collect()),
        }
    }

    async fn store_snapshot(
        &self,
        room: &str,
        n: u64,
        snapshot: Bytes,
    ) -> Result<(), ClusterError> {
        let mut hub = self.hub()?;
        let state = hub.rooms.get_mut(room).ok_or_else(|| not_found(room))?;
        if n > state.snapshot.0 {
            state.snapshot = (n, snapshot);
        }
        Ok(())
    }

    async fn load_snapshot(&self, room: &str) -> Result<Option<(u64, Bytes)>, ClusterError> {
        Ok(self.hub()?.rooms.get(room).map(|r| r.snapshot.clone()))
    }

    async fn subscribe(&self, room: &str, listener: LogListener) -> Result<(), ClusterError> {
        let mut hub = self.hub()?;
        if let Some(node) = hub.nodes.get_mut(&self.id) {
            node.subscriptions.insert(room.to_owned(), listener);
        }
        Ok(())
    }

    async fn unsubscribe(&self, room: &str) {
        let mut hub = self.hub.lock();
        if !self.is_current(&hub) {
            return;
        }
        if let Some(node) = hub.nodes.get_mut(&self.id) {
            node.subscriptions.remove(room);
        }
    }

    async fn publish_control(&self, payload: Bytes) -> Result<(), ClusterError> {
        let hub = self.hub()?;
        let entry = LogEntry {
            n: 0,
            ts: 0,
            payload,
        };
        for node in hub.nodes.values().filter(|n| n.alive && !n.deaf) {
            if let Some(listener) = node.subscriptions.get(CONTROL) {
                listener(LogNotice::Entry(entry.clone()));
            }
        }
        Ok(())
    }

    async fn subscribe_control(&self, listener: LogListener) -> Result<(), ClusterError> {
        self.subscribe(CONTROL, listener).await
    }

    async fn nodes_alive(&self, nodes: &[String]) -> Result<Vec<bool>, ClusterError> {
        let hub = self.hub()?;
        Ok(nodes
            .iter()
            .map(|id| hub.nodes.get(id).is_some_and(|n| n.alive))
            .collect())
    }

    async fn leave(&self) {
        let mut hub = self.hub.lock();
        if !self.is_current(&hub) {
            return;
        }
        if let Some(node) = hub.nodes.get_mut(&self.id) {
            node.alive = false;
            node.subscriptions.clear();
        }
    }

    async fn ready(&self) -> bool {
        self.hub().is_ok()
    }
}
