//! The node: its rooms, its broker, its metrics and its shutdown signal.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use plaza_broker::{Broker, Cluster};
use plaza_core::{Access, Millis, Room, RoomConfig, RoomError};
use plaza_protocol::ErrorCode;
use serde::{Deserialize, Serialize};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::clock::now_ms;
use crate::cluster::{self, RoomMeta, Sink};
use crate::metrics::NodeMetrics;
use crate::room_task::{self, RoomHandle};
use crate::status::Status;
use crate::ServerConfig;

/// A room as listed by the HTTP API.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct RoomSummary {
    /// Room id.
    pub id: String,
    /// Display name.
    pub name: String,
    /// Connected members.
    pub members: usize,
    /// Creation time, Unix milliseconds.
    pub created_at: Millis,
    /// `open` or `ticket`.
    pub access: String,
    /// Events kept for resume.
    pub history_size: usize,
    /// Member limit.
    pub max_members: usize,
    /// Whether members see each other (presence events, member lists).
    pub presence: bool,
}

/// An initial entity of a new room.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct InitialEntity {
    /// Application-defined kind.
    #[serde(default)]
    pub kind: Option<String>,
    /// Data.
    #[serde(default)]
    pub data: serde_json::Value,
}

/// Options of a new room.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RoomOptions {
    /// Events kept for resume.
    pub history_size: Option<usize>,
    /// Member limit.
    pub max_members: Option<usize>,
    /// `open` (default) or `ticket`.
    pub access: Option<String>,
    /// Presence events and member lists (default true; false for large
    /// broadcast rooms).
    pub presence: Option<bool>,
}

/// Body of `POST /v1/rooms`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CreateRoom {
    /// Wanted id (letters, digits, `-`, `_`, `.`; 1–64 bytes); generated when omitted.
    #[serde(default)]
    pub id: Option<String>,
    /// Display name; defaults to the id.
    #[serde(default)]
    pub name: Option<String>,
    /// Initial state.
    #[serde(default)]
    pub entities: Vec<InitialEntity>,
    /// Limits and access.
    #[serde(default)]
    pub options: RoomOptions,
}

/// One Plaza node.
pub struct Node {
    config: ServerConfig,
    broker: Arc<dyn Broker>,
    /// Cluster mode: the shared room registry and logs.
    cluster: Option<Arc<dyn Cluster>>,
    /// Embedded mode: the rooms. Cluster mode: the rooms hosted here.
    rooms: RwLock<HashMap<String, RoomHandle>>,
    pub(crate) metrics: NodeMetrics,
    shutdown: CancellationToken,
    connections: AtomicUsize,
    connections_changed: Notify,
}

impl Node {
    /// An embedded-mode node with no rooms.
    pub fn new(config: ServerConfig, broker: Arc<dyn Broker>) -> Arc<Node> {
        Node::build(config, broker, None)
    }

    /// A cluster-mode node: rooms live in `cluster`, shared with other nodes.
    pub fn clustered(
        config: ServerConfig,
        broker: Arc<dyn Broker>,
        cluster: Arc<dyn Cluster>,
    ) -> Arc<Node> {
        Node::build(config, broker, Some(cluster))
    }

    fn build(
        mut config: ServerConfig,
        broker: Arc<dyn Broker>,
        cluster: Option<Arc<dyn Cluster>>,
    ) -> Arc<Node> {
        if let Some(c) = &cluster {
            config.node_id = c.node_id().to_owned();
        } else if config.node_id.is_empty() {
            config.node_id = format!("n-{}", plaza_broker::new_session_id());
        }
        Arc::new(Node {
            config,
            broker,
            cluster,
            rooms: RwLock::new(HashMap::new()),
            metrics: NodeMetrics::new(),
            shutdown: CancellationToken::new(),
            connections: AtomicUsize::new(0),
            connections_changed: Notify::new(),
        })
    }

    /// The configuration.
    pub fn config(&self) -> &ServerConfig {
        &self.config
    }

    /// This node's id.
    pub fn id(&self) -> &str {
        &self.config.node_id
    }

    /// The broker.
    pub fn broker(&self) -> &Arc<dyn Broker> {
        &self.broker
    }

    /// The broker's name.
    pub fn broker_kind(&self) -> &'static str {
        self.broker.kind()
    }

    /// Prometheus text of this node's metrics.
    pub fn render_metrics(&self) -> String {
        self.metrics.render()
    }

    /// What this node is doing now (`GET /v1/status`). Rates and latency come
    /// from the samples [`serve`](crate::serve) takes once a second; a node
    /// served otherwise reports them as zero and `null`.
    pub fn status(&self) -> Status {
        Status::new(
            self.id().to_owned(),
            self.broker_kind(),
            self.connection_count(),
            self.hosted_rooms(),
            self.metrics.snapshot(),
        )
    }

    /// Starts shutdown: stop accepting, tell clients to reconnect.
    pub fn shutdown(&self) {
        self.shutdown.cancel();
    }

    /// Whether shutdown has started.
    pub fn is_shutting_down(&self) -> bool {
        self.shutdown.is_cancelled()
    }

    pub(crate) fn shutdown_token(&self) -> CancellationToken {
        self.shutdown.clone()
    }

    /// Open WebSocket connections.
    pub fn connection_count(&self) -> usize {
        self.connections.load(Ordering::Acquire)
    }

    pub(crate) fn connection_opened(&self) {
        self.connections.fetch_add(1, Ordering::AcqRel);
        self.metrics.connections.increment(1.0);
    }

    pub(crate) fn connection_closed(&self) {
        self.connections.fetch_sub(1, Ordering::AcqRel);
        self.metrics.connections.decrement(1.0);
        self.connections_changed.notify_waiters();
    }

    pub(crate) async fn wait_connections_closed(&self, grace: Duration) {
        let wait = async {
            loop {
                let changed = self.connections_changed.notified();
                if self.connection_count() == 0 {
                    return;
                }
                changed.await;
            }
        };
        if tokio::time::timeout(grace, wait).await.is_err() {
            tracing::warn!(
                left = self.connection_count(),
                "shutdown grace over, dropping connections"
            );
        }
    }

    /// The cluster, in cluster mode.
    pub fn cluster(&self) -> Option<&Arc<dyn Cluster>> {
        self.cluster.as_ref()
    }

    /// Creates a room: in embedded mode it starts its task; in cluster mode
    /// it enters the shared registry (nodes host it when members join).
    pub async fn create_room(&self, spec: CreateRoom) -> Result<RoomSummary, RoomError> {
        let id = match spec.id {
            Some(id) => {
                validate_room_id(&id)?;
                id
            }
            None => format!("r-{}", plaza_broker::new_session_id()),
        };
        let name = spec.name.unwrap_or_else(|| id.clone());
        if name.is_empty() || name.len() > 200 {
            return Err(RoomError::new(
                ErrorCode::InvalidRequest,
                "name must have 1 to 200 bytes",
            ));
        }
        let access = match spec.options.access.as_deref() {
            None | Some("open") => Access::Open,
            Some("ticket") => Access::TicketOnly,
            Some(other) => {
                return Err(RoomError::new(
                    ErrorCode::InvalidRequest,
                    format!("options.access must be \"open\" or \"ticket\", not {other:?}"),
                ))
            }
        };
        let history_size = spec
            .options
            .history_size
            .unwrap_or(self.config.history_size);
        if history_size == 0 || history_size > self.config.max_history_size {
            return Err(RoomError::new(
                ErrorCode::InvalidRequest,
                format!(
                    "options.history_size must be 1..={}",
                    self.config.max_history_size
                ),
            ));
        }
        let max_members = spec.options.max_members.unwrap_or(self.config.max_members);
        if max_members == 0 {
            return Err(RoomError::new(
                ErrorCode::InvalidRequest,
                "options.max_members must be positive",
            ));
        }
        let config = RoomConfig {
            history_size,
            max_members,
            access,
            resume_window_ms: self.config.resume_window_ms,
            default_lock_ttl_ms: self.config.lock_ttl_ms,
            max_lock_ttl_ms: self.config.max_lock_ttl_ms,
            presence: spec.options.presence.unwrap_or(true),
            ..RoomConfig::default()
        };
        if let Some(cluster) = &self.cluster {
            let now = now_ms();
            let mut room: Room<Sink> = Room::new(
                id.clone(),
                name.clone(),
                config,
                plaza_broker::new_epoch(),
                now,
            );
            for e in spec.entities {
                room.seed_entity(e.kind, e.data);
            }
            let meta = RoomMeta::new(&name, room.config(), now);
            let snapshot = cluster::encode_state(&room);
            return match cluster.create_room(&id, meta.encode(), snapshot).await {
                Ok(true) => Ok(meta.summary(&id, 0)),
                Ok(false) => Err(RoomError::new(
                    ErrorCode::RoomExists,
                    format!("room {id:?} exists"),
                )),
                Err(e) => Err(e.into()),
            };
        }
        let mut rooms = self.rooms.write().unwrap_or_else(|p| p.into_inner());
        if rooms.contains_key(&id) {
            return Err(RoomError::new(
                ErrorCode::RoomExists,
                format!("room {id:?} exists"),
            ));
        }
        if rooms.len() >= self.config.max_rooms {
            return Err(RoomError::new(
                ErrorCode::InvalidRequest,
                "this node holds its maximum of rooms",
            ));
        }
        let entities = spec
            .entities
            .into_iter()
            .map(|e| (e.kind, e.data))
            .collect();
        let handle = room_task::spawn(id.clone(), name, config, entities, now_ms(), &self.metrics);
        let summary = handle.summary();
        rooms.insert(id, handle);
        self.metrics.rooms.set(rooms.len() as f64);
        Ok(summary)
    }

    /// A room's handle, creating an open room on first use when
    /// `auto_create_rooms` is on. In cluster mode this starts hosting the room.
    pub(crate) async fn room_for_join(self: &Arc<Self>, id: &str) -> Result<RoomHandle, RoomError> {
        if let Some(h) = self.room(id).filter(|h| !h.is_closed()) {
            return Ok(h);
        }
        if let Some(cluster) = &self.cluster {
            return self.host_room(cluster, id).await;
        }
        if !self.config.auto_create_rooms {
            return Err(RoomError::new(
                ErrorCode::RoomNotFound,
                format!("no room {id:?}"),
            ));
        }
        match self
            .create_room(CreateRoom {
                id: Some(id.to_owned()),
                ..Default::default()
            })
            .await
        {
            Ok(_)
            | Err(RoomError {
                code: ErrorCode::RoomExists,
                ..
            }) => self
                .room(id)
                .ok_or_else(|| RoomError::new(ErrorCode::RoomNotFound, format!("no room {id:?}"))),
            Err(e) => Err(e),
        }
    }

    /// Cluster mode: starts a replica of a room in the registry (creating an
    /// open room first when `auto_create_rooms` is on).
    async fn host_room(
        self: &Arc<Self>,
        cluster: &Arc<dyn Cluster>,
        id: &str,
    ) -> Result<RoomHandle, RoomError> {
        let mut meta = cluster.room_meta(id).await?;
        if meta.is_none() && self.config.auto_create_rooms {
            let spec = CreateRoom {
                id: Some(id.to_owned()),
                ..Default::default()
            };
            match self.create_room(spec).await {
                Ok(_)
                | Err(RoomError {
                    code: ErrorCode::RoomExists,
                    ..
                }) => meta = cluster.room_meta(id).await?,
                Err(e) => return Err(e),
            }
        }
        let Some(meta) = meta.as_deref().and_then(RoomMeta::decode) else {
            return Err(RoomError::new(
                ErrorCode::RoomNotFound,
                format!("no room {id:?}"),
            ));
        };
        let mut rooms = self.rooms.write().unwrap_or_else(|p| p.into_inner());
        // Another connection may have started hosting it meanwhile.
        if let Some(h) = rooms.get(id).filter(|h| !h.is_closed()) {
            return Ok(h.clone());
        }
        let handle = cluster::spawn_replica(self, cluster.clone(), &meta, id);
        rooms.insert(id.to_owned(), handle.clone());
        self.metrics.rooms.set(rooms.len() as f64);
        Ok(handle)
    }

    /// Rooms held here: every room in embedded mode, the hosted ones in cluster mode.
    pub fn hosted_rooms(&self) -> usize {
        self.rooms.read().unwrap_or_else(|p| p.into_inner()).len()
    }

    /// A replica ended: it leaves the map unless a newer one took its place.
    pub(crate) fn forget_room(&self, id: &str, handle: &RoomHandle) {
        let mut rooms = self.rooms.write().unwrap_or_else(|p| p.into_inner());
        if rooms.get(id).is_some_and(|h| h.same(handle)) {
            rooms.remove(id);
        }
        self.metrics.rooms.set(rooms.len() as f64);
    }

    pub(crate) fn room(&self, id: &str) -> Option<RoomHandle> {
        self.rooms
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(id)
            .cloned()
    }

    /// Every room, ordered by id. In cluster mode, `members` is exact for
    /// rooms this node hosts; for the others it is the count their hosts
    /// recorded last (a moment old).
    pub async fn list_rooms(&self) -> Result<Vec<RoomSummary>, RoomError> {
        if let Some(cluster) = &self.cluster {
            let rooms = cluster.list_rooms().await?;
            let ids: Vec<String> = rooms.iter().map(|(id, _)| id.clone()).collect();
            let recorded = cluster.room_members(&ids).await?;
            let mut v: Vec<RoomSummary> = rooms
                .into_iter()
                .zip(recorded)
                .filter_map(|((id, meta), recorded)| {
                    let meta = RoomMeta::decode(&meta)?;
                    let members = self.members_of(&id, recorded);
                    Some(meta.summary(&id, members))
                })
                .collect();
            v.sort_by(|a, b| a.id.cmp(&b.id));
            return Ok(v);
        }
        let mut v: Vec<RoomSummary> = self
            .rooms
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .map(RoomHandle::summary)
            .collect();
        v.sort_by(|a, b| a.id.cmp(&b.id));
        Ok(v)
    }

    /// The exact count if this node hosts the room, else the recorded one.
    fn members_of(&self, id: &str, recorded: u64) -> usize {
        self.room(id)
            .map_or(recorded as usize, |h| h.summary().members)
    }

    /// One room.
    pub async fn room_summary(&self, id: &str) -> Result<Option<RoomSummary>, RoomError> {
        if let Some(cluster) = &self.cluster {
            let Some(meta) = cluster.room_meta(id).await? else {
                return Ok(None);
            };
            let recorded = match self.room(id) {
                Some(_) => 0,
                None => cluster.room_members(&[id.to_owned()]).await?[0],
            };
            return Ok(
                RoomMeta::decode(&meta).map(|m| m.summary(id, self.members_of(id, recorded)))
            );
        }
        Ok(self.room(id).map(|h| h.summary()))
    }

    /// Deletes a room: its members (on every node) get a `closed` frame.
    /// False if it did not exist.
    pub async fn delete_room(&self, id: &str) -> Result<bool, RoomError> {
        if let Some(cluster) = &self.cluster {
            if cluster.room_meta(id).await?.is_none() {
                return Ok(false);
            }
            // Every replica applies `Close` before the log goes away; one
            // that reads the log too late finds the room gone and closes too.
            let close = cluster::close_record(self.id());
            match cluster.append(id, close).await {
                Ok(_) => {}
                Err(plaza_broker::ClusterError::RoomNotFound(_)) => return Ok(false),
                Err(e) => return Err(e.into()),
            }
            return Ok(cluster.delete_room(id).await?);
        }
        Ok(self.delete_local_room(id).await)
    }

    async fn delete_local_room(&self, id: &str) -> bool {
        let handle = {
            let mut rooms = self.rooms.write().unwrap_or_else(|p| p.into_inner());
            let h = rooms.remove(id);
            self.metrics.rooms.set(rooms.len() as f64);
            h
        };
        match handle {
            Some(h) => {
                h.close().await;
                true
            }
            None => false,
        }
    }
}

fn validate_room_id(id: &str) -> Result<(), RoomError> {
    let ok = !id.is_empty()
        && id.len() <= 64
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'.');
    if ok {
        Ok(())
    } else {
        Err(RoomError::new(
            ErrorCode::InvalidRequest,
            "room id must have 1 to 64 letters, digits, '-', '_' or '.'",
        ))
    }
}
