//! Where a node finds its rooms: the seam between the node and the two modes.
//!
//! [`local::LocalRooms`] (embedded mode) keeps every room's task in this
//! process; [`cluster::ClusterRooms`] keeps rooms in the shared registry and
//! hosts a replica of each room this node has members in. Everything else in
//! the node asks a [`RoomDirectory`] and does not care which it is.

mod cluster;
mod local;
mod spec;

use std::sync::Arc;

use plaza_broker::Cluster;
use plaza_core::RoomError;

pub use spec::{CreateRoom, InitialEntity, RoomOptions, RoomSummary, SpaceOptions};

use crate::metrics::NodeMetrics;
use crate::room::RoomHandle;
use crate::webhooks::Webhooks;
use crate::ServerConfig;

/// The rooms a listing found.
#[derive(Debug, Clone)]
pub struct RoomList {
    /// Ordered by id.
    pub rooms: Vec<RoomSummary>,
    /// False when some rooms could not be read and are missing (a Redis
    /// Cluster shard without a primary); `GET /v1/rooms` then says
    /// `"incomplete": true`.
    pub complete: bool,
}

/// The rooms of this node, in embedded or cluster mode.
pub(crate) enum RoomDirectory {
    /// Embedded mode: every room is a task of this process.
    Local(Arc<local::LocalRooms>),
    /// Cluster mode: rooms live in the shared registry.
    Cluster(Arc<cluster::ClusterRooms>),
}

impl RoomDirectory {
    /// Embedded mode's directory.
    pub(crate) fn local(
        config: &ServerConfig,
        metrics: &NodeMetrics,
        webhooks: Option<Arc<Webhooks>>,
    ) -> RoomDirectory {
        RoomDirectory::Local(Arc::new(local::LocalRooms::new(config, metrics, webhooks)))
    }

    /// Cluster mode's directory.
    pub(crate) fn cluster(
        config: &ServerConfig,
        metrics: &NodeMetrics,
        cluster: Arc<dyn Cluster>,
        webhooks: Option<Arc<Webhooks>>,
    ) -> RoomDirectory {
        RoomDirectory::Cluster(cluster::ClusterRooms::new(
            config, metrics, cluster, webhooks,
        ))
    }

    /// Creates a room.
    pub(crate) async fn create(&self, spec: CreateRoom) -> Result<RoomSummary, RoomError> {
        match self {
            RoomDirectory::Local(d) => d.create(spec),
            RoomDirectory::Cluster(d) => d.create(spec).await,
        }
    }

    /// The handle of the room a connection joins: an existing room, or an
    /// open room created on first use when `auto_create_rooms` is on. In
    /// cluster mode this starts hosting the room.
    pub(crate) async fn room_for_join(&self, id: &str) -> Result<RoomHandle, RoomError> {
        match self {
            RoomDirectory::Local(d) => d.room_for_join(id),
            RoomDirectory::Cluster(d) => d.room_for_join(id).await,
        }
    }

    /// The handle of an existing room, never creating one (in cluster mode
    /// this starts hosting it): for admin calls, and for a join let through
    /// only to resume a session (see `connection::admission`).
    pub(crate) async fn existing(&self, id: &str) -> Result<RoomHandle, RoomError> {
        match self {
            RoomDirectory::Local(d) => d.room(id, false),
            RoomDirectory::Cluster(d) => d.hosted_room(id, false).await,
        }
    }

    /// Every room, ordered by id (every room that can be read now: see
    /// [`RoomList::complete`]).
    pub(crate) async fn list(&self) -> Result<RoomList, RoomError> {
        match self {
            RoomDirectory::Local(d) => Ok(RoomList {
                rooms: d.list(),
                complete: true,
            }),
            RoomDirectory::Cluster(d) => d.list().await,
        }
    }

    /// One room's summary.
    pub(crate) async fn summary(&self, id: &str) -> Result<Option<RoomSummary>, RoomError> {
        match self {
            RoomDirectory::Local(d) => Ok(d.summary(id)),
            RoomDirectory::Cluster(d) => d.summary(id).await,
        }
    }

    /// Deletes a room: its members (on every node) get `closed`. False if it
    /// did not exist.
    pub(crate) async fn delete(&self, id: &str) -> Result<bool, RoomError> {
        match self {
            RoomDirectory::Local(d) => Ok(d.delete(id).await),
            RoomDirectory::Cluster(d) => d.delete(id).await,
        }
    }

    /// The handles of the rooms held here (every room in embedded mode, the
    /// hosted ones in cluster mode).
    pub(crate) fn held_handles(&self) -> Vec<RoomHandle> {
        match self {
            RoomDirectory::Local(d) => d.handles(),
            RoomDirectory::Cluster(d) => d.handles(),
        }
    }

    /// Rooms held here: every room in embedded mode, the hosted ones in cluster mode.
    pub(crate) fn held(&self) -> usize {
        match self {
            RoomDirectory::Local(d) => d.len(),
            RoomDirectory::Cluster(d) => d.hosted(),
        }
    }

    /// The cluster, in cluster mode.
    pub(crate) fn shared(&self) -> Option<&Arc<dyn Cluster>> {
        match self {
            RoomDirectory::Local(_) => None,
            RoomDirectory::Cluster(d) => Some(d.cluster()),
        }
    }
}
