//! Spatial rooms: target-based movement, areas of interest and proximity,
//! pure logic with the clock passed in.
//!
//! - [`geometry`]: points and [`Movement`]s (from, to, start, speed): the
//!   server stores a movement once, clients interpolate.
//! - [`config`]: a room's [`SpaceConfig`] (plane, radii, hysteresis, dwell).
//! - [`grid`]: a uniform grid, so that who is near whom costs the local
//!   density, not the room's size.
//! - [`space`]: the [`Space`] of a room: who sees whom and which pairs are in
//!   proximity, with one initiator per pair and no flapping.

pub mod config;
pub mod geometry;
pub mod grid;
pub mod space;

pub use config::SpaceConfig;
pub use geometry::{Movement, Vec2};
pub use grid::SpatialGrid;
pub use space::{Moved, PairState, Space, SpaceError, SpaceEvent, SpaceState};

use std::collections::BTreeMap;

use crate::Millis;

/// A spatial room's state in a snapshot.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct RoomSpaceState {
    /// The space.
    pub space: SpaceState,
    /// When it was last evaluated.
    pub evaluated_at: Millis,
    /// Where disconnected members stood.
    pub parked: BTreeMap<String, Vec2>,
}
