//! The node: its rooms, its broker, its metrics and its shutdown signal.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use plaza_broker::Broker;
use plaza_core::{Access, Millis, RoomConfig, RoomError};
use plaza_protocol::ErrorCode;
use serde::{Deserialize, Serialize};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::clock::now_ms;
use crate::metrics::NodeMetrics;
use crate::room_task::{self, RoomHandle};
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
    rooms: RwLock<HashMap<String, RoomHandle>>,
    pub(crate) metrics: NodeMetrics,
    shutdown: CancellationToken,
    connections: AtomicUsize,
    connections_changed: Notify,
}

impl Node {
    /// A node with no rooms.
    pub fn new(mut config: ServerConfig, broker: Arc<dyn Broker>) -> Arc<Node> {
        if config.node_id.is_empty() {
            config.node_id = format!("n-{}", plaza_broker::new_session_id());
        }
        Arc::new(Node {
            config,
            broker,
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

    /// Creates a room and starts its task.
    pub fn create_room(&self, spec: CreateRoom) -> Result<RoomSummary, RoomError> {
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

    /// A room's handle, creating an open room on first use when `auto_create_rooms` is on.
    pub(crate) fn room_for_join(&self, id: &str) -> Result<RoomHandle, RoomError> {
        if let Some(h) = self.room(id) {
            return Ok(h);
        }
        if !self.config.auto_create_rooms {
            return Err(RoomError::new(
                ErrorCode::RoomNotFound,
                format!("no room {id:?}"),
            ));
        }
        match self.create_room(CreateRoom {
            id: Some(id.to_owned()),
            ..Default::default()
        }) {
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

    pub(crate) fn room(&self, id: &str) -> Option<RoomHandle> {
        self.rooms
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(id)
            .cloned()
    }

    /// Every room, ordered by id.
    pub fn list_rooms(&self) -> Vec<RoomSummary> {
        let mut v: Vec<RoomSummary> = self
            .rooms
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .map(RoomHandle::summary)
            .collect();
        v.sort_by(|a, b| a.id.cmp(&b.id));
        v
    }

    /// One room.
    pub fn room_summary(&self, id: &str) -> Option<RoomSummary> {
        self.room(id).map(|h| h.summary())
    }

    /// Deletes a room: its members get a `closed` frame. False if it did not exist.
    pub async fn delete_room(&self, id: &str) -> bool {
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
