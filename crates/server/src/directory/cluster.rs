//! Cluster mode's rooms: the shared registry, and the replicas of the rooms
//! this node has members in.

use std::collections::HashMap;
use std::sync::{Arc, RwLock, Weak};
use std::time::Duration;

use metrics::Gauge;
use plaza_broker::{Cluster, ClusterError};
use plaza_core::{Room, RoomError};
use plaza_protocol::ErrorCode;

use super::spec::{no_room, room_exists, CreateRoom, NewRoom, RoomSummary};
use super::RoomList;
use crate::clock::now_ms;
use crate::cluster::{self, Hosting, ReplicaSetup};
use crate::metrics::{ErrorCounter, NodeMetrics};
use crate::room::{RoomCommand, RoomHandle, RoomInfo, Sink};
use crate::ServerConfig;

/// The rooms of a cluster-mode node.
pub(crate) struct ClusterRooms {
    config: ServerConfig,
    me: Arc<str>,
    cluster: Arc<dyn Cluster>,
    /// The rooms hosted here.
    hosted: RwLock<HashMap<String, RoomHandle>>,
    gauge: Gauge,
    errors: ErrorCounter,
    room_wait: metrics::Histogram,
    /// `plaza_log_regressions_total`.
    log_regressions: metrics::Counter,
    webhooks: Option<Arc<crate::webhooks::Webhooks>>,
    /// Itself, for the replicas it starts.
    this: Weak<ClusterRooms>,
}

impl ClusterRooms {
    pub(crate) fn new(
        config: &ServerConfig,
        metrics: &NodeMetrics,
        cluster: Arc<dyn Cluster>,
        webhooks: Option<Arc<crate::webhooks::Webhooks>>,
    ) -> Arc<ClusterRooms> {
        Arc::new_cyclic(|this| ClusterRooms {
            webhooks,
            config: config.clone(),
            me: config.node_id.as_str().into(),
            cluster,
            hosted: RwLock::new(HashMap::new()),
            gauge: metrics.rooms.clone(),
            errors: metrics.error_counter_set(),
            room_wait: metrics.room_wait.clone(),
            log_regressions: metrics.log_regressions.clone(),
            this: this.clone(),
        })
    }

    pub(crate) fn cluster(&self) -> &Arc<dyn Cluster> {
        &self.cluster
    }

    /// Enters a room in the shared registry with its first snapshot; nodes
    /// host it when members join.
    pub(crate) async fn create(&self, spec: CreateRoom) -> Result<RoomSummary, RoomError> {
        let new = NewRoom::check(spec, &self.config)?;
        let id = new.id.clone();
        let now = now_ms();
        let room: Room<Sink> = new.build(plaza_broker::new_epoch(), now);
        let info = RoomInfo::new(room.name(), room.config(), now);
        let snapshot = cluster::encode_state(&room, self.cluster.snapshot_format());
        match self.cluster.create_room(&id, info.encode(), snapshot).await {
            Ok(true) => Ok(info.summary(&id, 0)),
            Ok(false) => Err(room_exists(&id)),
            Err(e) => Err(e.into()),
        }
    }

    /// Starts a replica of a room in the registry (creating an open room
    /// first when `auto_create_rooms` is on).
    pub(crate) async fn room_for_join(&self, id: &str) -> Result<RoomHandle, RoomError> {
        self.hosted_room(id, self.config.auto_create_rooms).await
    }

    /// Starts a replica of a room in the registry, creating an open room
    /// first if `create` and there is none.
    pub(crate) async fn hosted_room(
        &self,
        id: &str,
        create: bool,
    ) -> Result<RoomHandle, RoomError> {
        if let Some(h) = self.get(id).filter(|h| !h.is_closed()) {
            return Ok(h);
        }
        let mut meta = self.cluster.room_meta(id).await?;
        if meta.is_none() && create {
            match self.create(CreateRoom::open(id)).await {
                Ok(_)
                | Err(RoomError {
                    code: ErrorCode::RoomExists,
                    ..
                }) => meta = self.cluster.room_meta(id).await?,
                Err(e) => return Err(e),
            }
        }
        let Some(info) = meta.as_deref().and_then(RoomInfo::decode) else {
            return Err(no_room(id));
        };
        let mut hosted = self.hosted.write().unwrap_or_else(|p| p.into_inner());
        // Another connection may have started hosting it meanwhile.
        if let Some(h) = hosted.get(id).filter(|h| !h.is_closed()) {
            return Ok(h.clone());
        }
        let host: Weak<dyn Hosting> = self.this.clone();
        let setup = ReplicaSetup {
            host,
            cluster: self.cluster.clone(),
            me: self.me.clone(),
            linger: Duration::from_millis(self.config.room_linger_ms),
            errors: self.errors.clone(),
            room_wait: self.room_wait.clone(),
            feed_config: self.config.feed(),
            webhooks: self.webhooks.clone(),
            log_regressions: self.log_regressions.clone(),
        };
        let handle = cluster::spawn_replica(setup, info, id);
        hosted.insert(id.to_owned(), handle.clone());
        self.gauge.set(hosted.len() as f64);
        Ok(handle)
    }

    /// Every room, ordered by id. `members` is exact for rooms this node
    /// hosts; for the others it is the count their hosts recorded last (a
    /// moment old).
    ///
    /// On a Redis Cluster with a shard that has no primary, the rooms it
    /// holds are left out and `complete` is false (see
    /// [`plaza_broker::Cluster::list_reachable_rooms`]).
    pub(crate) async fn list(&self) -> Result<RoomList, RoomError> {
        let listing = self.cluster.list_reachable_rooms().await?;
        let complete = listing.complete;
        let rooms = listing.rooms;
        let ids: Vec<String> = rooms.iter().map(|(id, _)| id.clone()).collect();
        let recorded = self.cluster.room_members(&ids).await?;
        let mut v: Vec<RoomSummary> = rooms
            .into_iter()
            .zip(recorded)
            .filter_map(|((id, meta), recorded)| {
                let info = RoomInfo::decode(&meta)?;
                let members = self.members_of(&id, recorded);
                Some(info.summary(&id, members))
            })
            .collect();
        v.sort_by(|a, b| a.id.cmp(&b.id));
        Ok(RoomList { rooms: v, complete })
    }

    pub(crate) async fn summary(&self, id: &str) -> Result<Option<RoomSummary>, RoomError> {
        let Some(meta) = self.cluster.room_meta(id).await? else {
            return Ok(None);
        };
        let recorded = match self.get(id) {
            Some(_) => 0,
            None => self.cluster.room_members(&[id.to_owned()]).await?[0],
        };
        Ok(RoomInfo::decode(&meta).map(|m| m.summary(id, self.members_of(id, recorded))))
    }

    /// Deletes a room: every replica applies `Close` before the log goes
    /// away; one that reads the log too late finds the room gone and closes too.
    pub(crate) async fn delete(&self, id: &str) -> Result<bool, RoomError> {
        if self.cluster.room_meta(id).await?.is_none() {
            return Ok(false);
        }
        match self
            .cluster
            .append(id, cluster::close_record(&self.me))
            .await
        {
            Ok(_) => {}
            Err(ClusterError::RoomNotFound(_)) => return Ok(false),
            Err(e) => return Err(e.into()),
        }
        Ok(self.cluster.delete_room(id).await?)
    }

    /// The handles of the rooms hosted here.
    pub(crate) fn handles(&self) -> Vec<RoomHandle> {
        let hosted = self.hosted.read().unwrap_or_else(|p| p.into_inner());
        hosted.values().cloned().collect()
    }

    pub(crate) fn hosted(&self) -> usize {
        self.hosted.read().unwrap_or_else(|p| p.into_inner()).len()
    }

    /// The exact count if this node hosts the room, else the recorded one.
    fn members_of(&self, id: &str, recorded: u64) -> usize {
        self.get(id)
            .map_or(recorded as usize, |h| h.summary().members)
    }

    fn get(&self, id: &str) -> Option<RoomHandle> {
        self.hosted
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(id)
            .cloned()
    }
}

impl Hosting for ClusterRooms {
    fn forget(&self, id: &str, handle: &RoomHandle) {
        let mut hosted = self.hosted.write().unwrap_or_else(|p| p.into_inner());
        if hosted.get(id).is_some_and(|h| h.same(handle)) {
            hosted.remove(id);
        }
        self.gauge.set(hosted.len() as f64);
    }

    fn rejoin(self: Arc<Self>, id: String, join: RoomCommand) {
        tokio::spawn(async move {
            let refused = match self.room_for_join(&id).await {
                Ok(h) => h.send(join).await.err().map(|cmd| (cmd, no_room(&id))),
                Err(e) => Some((join, e)),
            };
            if let Some((cmd, e)) = refused {
                cmd.refuse(&id, e, &self.errors);
            }
        });
    }
}
