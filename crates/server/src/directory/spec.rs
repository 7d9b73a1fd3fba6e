//! What the HTTP API says about rooms: a new room's description and a room's
//! summary, and the checks a new room passes in both modes.

use plaza_core::spatial::config::bounds as space_bounds;
use plaza_core::spatial::SpaceConfig;
use plaza_core::{Access, Millis, RoomConfig, RoomError};

pub use crate::room::RoomSummary;
use plaza_protocol::ErrorCode;
use serde::Deserialize;

use crate::config::MAX_MEMBERS_LIMIT;
use crate::ServerConfig;

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
    /// A spatial room: its plane and distances, each defaulted.
    pub space: Option<SpaceOptions>,
}

/// The `space` option of a new room; what is absent takes
/// [`SpaceConfig::default`]'s value.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SpaceOptions {
    /// Width of the plane.
    pub width: Option<f64>,
    /// Height of the plane.
    pub height: Option<f64>,
    /// Distance within which a pair is in proximity.
    pub proximity_radius: Option<f64>,
    /// Leave distances are the enter distances times this.
    pub hysteresis: Option<f64>,
    /// No pair changes state faster than this (read as any number, so that
    /// a negative or fractional one is refused naming the field).
    pub min_dwell_ms: Option<f64>,
    /// Distance within which members see each other's moves.
    pub aoi_radius: Option<f64>,
    /// How often positions are checked while someone moves (any number, as
    /// `min_dwell_ms`).
    pub tick_ms: Option<f64>,
    /// `direct` only between members in proximity.
    pub direct_in_proximity_only: Option<bool>,
}

/// A whole number of milliseconds from `lo` to `hi`, or an error naming `name`.
fn whole_ms(
    name: &str,
    v: Option<f64>,
    default: Millis,
    (lo, hi): (u64, u64),
) -> Result<Millis, RoomError> {
    let Some(v) = v else { return Ok(default) };
    if v.fract() == 0.0 && v >= lo as f64 && v <= hi as f64 {
        Ok(v as Millis)
    } else {
        Err(RoomError::new(
            ErrorCode::InvalidRequest,
            format!("options.space.{name} must be an integer from {lo} to {hi}, not {v}"),
        ))
    }
}

impl SpaceOptions {
    fn config(&self) -> Result<SpaceConfig, RoomError> {
        let d = SpaceConfig::default();
        let min_dwell_ms = whole_ms(
            "min_dwell_ms",
            self.min_dwell_ms,
            d.min_dwell_ms,
            (0, space_bounds::MAX_DWELL_MS),
        )?;
        let tick_ms = whole_ms("tick_ms", self.tick_ms, d.tick_ms, space_bounds::TICK_MS)?;
        let c = SpaceConfig {
            width: self.width.unwrap_or(d.width),
            height: self.height.unwrap_or(d.height),
            proximity_radius: self.proximity_radius.unwrap_or(d.proximity_radius),
            hysteresis: self.hysteresis.unwrap_or(d.hysteresis),
            min_dwell_ms,
            aoi_radius: self.aoi_radius.unwrap_or(d.aoi_radius),
            tick_ms,
            direct_in_proximity_only: self
                .direct_in_proximity_only
                .unwrap_or(d.direct_in_proximity_only),
        };
        c.validate()
            .map_err(|m| RoomError::new(ErrorCode::InvalidRequest, format!("options.{m}")))?;
        Ok(c)
    }
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

impl CreateRoom {
    /// An open room `id` with the node's defaults (auto-created on first join).
    pub(crate) fn open(id: &str) -> CreateRoom {
        CreateRoom {
            id: Some(id.to_owned()),
            ..CreateRoom::default()
        }
    }
}

/// A new room that passed every check.
pub(crate) struct NewRoom {
    pub(crate) id: String,
    pub(crate) name: String,
    pub(crate) config: RoomConfig,
    pub(crate) entities: Vec<InitialEntity>,
}

impl NewRoom {
    /// Checks `spec` against the node's limits and fills in its defaults.
    pub(crate) fn check(spec: CreateRoom, node: &ServerConfig) -> Result<NewRoom, RoomError> {
        let invalid = |m: String| RoomError::new(ErrorCode::InvalidRequest, m);
        let id = match spec.id {
            Some(id) => {
                validate_room_id(&id)?;
                id
            }
            None => format!("r-{}", plaza_broker::new_session_id()),
        };
        let name = spec.name.unwrap_or_else(|| id.clone());
        if name.is_empty() || name.len() > 200 {
            return Err(invalid("name must have 1 to 200 bytes".into()));
        }
        let access = match spec.options.access.as_deref() {
            None | Some("open") => Access::Open,
            Some("ticket") => Access::TicketOnly,
            Some(other) => {
                return Err(invalid(format!(
                    "options.access must be \"open\" or \"ticket\", not {other:?}"
                )))
            }
        };
        let history_size = spec.options.history_size.unwrap_or(node.history_size);
        if history_size == 0 || history_size > node.max_history_size {
            return Err(invalid(format!(
                "options.history_size must be from 1 to {} (max_history_size), not {history_size}",
                node.max_history_size
            )));
        }
        let space = spec
            .options
            .space
            .as_ref()
            .map(SpaceOptions::config)
            .transpose()?;
        // Every pair of a spatial room's members can stand together: what a
        // crowd holds and a tick looks at grows with its square.
        let most = match space {
            Some(_) => space_bounds::MAX_MEMBERS,
            None => MAX_MEMBERS_LIMIT,
        };
        let max_members = spec
            .options
            .max_members
            .unwrap_or(node.max_members.min(most));
        if max_members == 0 || max_members > MAX_MEMBERS_LIMIT {
            return Err(invalid(format!(
                "options.max_members must be from 1 to {MAX_MEMBERS_LIMIT}, not {max_members}"
            )));
        }
        if max_members > most {
            return Err(invalid(format!(
                "options.max_members must be from 1 to {most} in a room with options.space (every pair of its members can stand together), not {max_members}"
            )));
        }
        let config = RoomConfig {
            history_size,
            max_members,
            access,
            resume_window_ms: node.resume_window_ms,
            default_lock_ttl_ms: node.lock_ttl_ms,
            max_lock_ttl_ms: node.max_lock_ttl_ms,
            presence: spec.options.presence.unwrap_or(true),
            space,
            ..RoomConfig::default()
        };
        Ok(NewRoom {
            id,
            name,
            config,
            entities: spec.entities,
        })
    }

    /// The room, its entities seeded.
    pub(crate) fn build<S>(self, epoch: u64, now: Millis) -> plaza_core::Room<S> {
        let mut room = plaza_core::Room::new(self.id, self.name, self.config, epoch, now);
        for e in self.entities {
            room.seed_entity(e.kind, e.data);
        }
        room
    }
}

/// The error of a name that is taken.
pub(crate) fn room_exists(id: &str) -> RoomError {
    RoomError::new(ErrorCode::RoomExists, format!("room {id:?} exists"))
}

/// The error of a room that does not exist.
pub(crate) fn no_room(id: &str) -> RoomError {
    RoomError::new(ErrorCode::RoomNotFound, format!("no room {id:?}"))
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
