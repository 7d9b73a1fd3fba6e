//! Embedded mode's rooms: every room is a task of this process.

use std::collections::HashMap;
use std::sync::{Arc, RwLock};

use metrics::{Gauge, Histogram};
use plaza_core::RoomError;
use plaza_protocol::ErrorCode;

use super::spec::{no_room, room_exists, CreateRoom, NewRoom, RoomSummary};
use crate::clock::now_ms;
use crate::metrics::{ErrorCounter, NodeMetrics};
use crate::room::{embedded, RoomHandle};
use crate::ServerConfig;

/// The rooms of an embedded-mode node.
pub(crate) struct LocalRooms {
    config: ServerConfig,
    me: Arc<str>,
    rooms: RwLock<HashMap<String, RoomHandle>>,
    gauge: Gauge,
    errors: ErrorCounter,
    room_wait: Histogram,
    webhooks: Option<Arc<crate::webhooks::Webhooks>>,
}

impl LocalRooms {
    pub(crate) fn new(
        config: &ServerConfig,
        metrics: &NodeMetrics,
        webhooks: Option<Arc<crate::webhooks::Webhooks>>,
    ) -> LocalRooms {
        LocalRooms {
            webhooks,
            me: config.node_id.as_str().into(),
            config: config.clone(),
            rooms: RwLock::new(HashMap::new()),
            gauge: metrics.rooms.clone(),
            errors: metrics.error_counter_set(),
            room_wait: metrics.room_wait.clone(),
        }
    }

    /// Creates a room and starts its task.
    pub(crate) fn create(&self, spec: CreateRoom) -> Result<RoomSummary, RoomError> {
        let new = NewRoom::check(spec, &self.config)?;
        let mut rooms = self.rooms.write().unwrap_or_else(|p| p.into_inner());
        if rooms.contains_key(&new.id) {
            return Err(room_exists(&new.id));
        }
        if rooms.len() >= self.config.max_rooms {
            return Err(RoomError::new(
                ErrorCode::InvalidRequest,
                "this node holds its maximum of rooms",
            ));
        }
        let id = new.id.clone();
        let room = new.build(plaza_broker::new_epoch(), now_ms());
        let handle = embedded::spawn(
            room,
            self.me.clone(),
            self.errors.clone(),
            self.room_wait.clone(),
            self.config.feed(),
            self.webhooks.clone(),
        );
        let summary = handle.summary();
        rooms.insert(id, handle);
        self.gauge.set(rooms.len() as f64);
        Ok(summary)
    }

    pub(crate) fn room_for_join(&self, id: &str) -> Result<RoomHandle, RoomError> {
        self.room(id, self.config.auto_create_rooms)
    }

    /// The room with this id, created (open) first if `create` and there is none.
    pub(crate) fn room(&self, id: &str, create: bool) -> Result<RoomHandle, RoomError> {
        if let Some(h) = self.get(id).filter(|h| !h.is_closed()) {
            return Ok(h);
        }
        if !create {
            return Err(no_room(id));
        }
        match self.create(CreateRoom::open(id)) {
            Ok(_)
            | Err(RoomError {
                code: ErrorCode::RoomExists,
                ..
            }) => self.get(id).ok_or_else(|| no_room(id)),
            Err(e) => Err(e),
        }
    }

    pub(crate) fn list(&self) -> Vec<RoomSummary> {
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

    pub(crate) fn summary(&self, id: &str) -> Option<RoomSummary> {
        self.get(id).map(|h| h.summary())
    }

    pub(crate) async fn delete(&self, id: &str) -> bool {
        let handle = {
            let mut rooms = self.rooms.write().unwrap_or_else(|p| p.into_inner());
            let h = rooms.remove(id);
            self.gauge.set(rooms.len() as f64);
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

    /// Every room's handle.
    pub(crate) fn handles(&self) -> Vec<RoomHandle> {
        let rooms = self.rooms.read().unwrap_or_else(|p| p.into_inner());
        rooms.values().cloned().collect()
    }

    pub(crate) fn len(&self) -> usize {
        self.rooms.read().unwrap_or_else(|p| p.into_inner()).len()
    }

    fn get(&self, id: &str) -> Option<RoomHandle> {
        self.rooms
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(id)
            .cloned()
    }
}
