//! What describes a room: fixed at its creation ([`RoomInfo`]), and as
//! listed with its member count ([`RoomSummary`]).

use plaza_core::spatial::SpaceConfig;
use plaza_core::{Access, Millis, RoomConfig};
use serde::{Deserialize, Serialize};

/// A room as listed by the HTTP API.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct RoomSummary {
    /// Room id.
    pub id: String,
    /// Display name.
    pub name: String,
    /// Connected members.
    pub members: usize,
    /// Creation time, Unix milliseconds.
    pub created_at: Millis,
    /// Who may join: `open` or `ticket`.
    pub access: Access,
    /// Events kept for resume.
    pub history_size: usize,
    /// Member limit.
    pub max_members: usize,
    /// Whether members see each other (presence events, member lists).
    pub presence: bool,
    /// A spatial room's settings.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub space: Option<SpaceConfig>,
}

/// A room's fixed description: kept by every handle of a room task, and in
/// cluster mode stored in the shared registry (so that nodes not hosting the
/// room can list it).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct RoomInfo {
    pub(crate) name: String,
    pub(crate) created_at: Millis,
    pub(crate) access: Access,
    pub(crate) history_size: usize,
    pub(crate) max_members: usize,
    pub(crate) presence: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) space: Option<SpaceConfig>,
}

impl RoomInfo {
    /// The description of a room named `name` with `config`, created at `created_at`.
    pub(crate) fn new(name: &str, config: &RoomConfig, created_at: Millis) -> RoomInfo {
        RoomInfo {
            name: name.to_owned(),
            created_at,
            access: config.access,
            history_size: config.history_size,
            max_members: config.max_members,
            presence: config.presence,
            space: config.space.clone(),
        }
    }

    /// The summary of room `id` with `members` connected members.
    pub(crate) fn summary(&self, id: &str, members: usize) -> RoomSummary {
        RoomSummary {
            id: id.to_owned(),
            name: self.name.clone(),
            members,
            created_at: self.created_at,
            access: self.access,
            history_size: self.history_size,
            max_members: self.max_members,
            presence: self.presence,
            space: self.space.clone(),
        }
    }

    /// The registry's form.
    pub(crate) fn encode(&self) -> bytes::Bytes {
        bytes::Bytes::from(serde_json::to_vec(self).expect("room info serializes"))
    }

    /// Reads the registry's form; `None` if unreadable.
    pub(crate) fn decode(bytes: &[u8]) -> Option<RoomInfo> {
        serde_json::from_slice(bytes).ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_registry_form_names_access_as_the_api_does() {
        let config = RoomConfig {
            access: Access::TicketOnly,
            ..RoomConfig::default()
        };
        let info = RoomInfo::new("Lobby", &config, 5);
        let json: serde_json::Value = serde_json::from_slice(&info.encode()).unwrap();
        assert_eq!(json["access"], "ticket");
        assert_eq!(RoomInfo::decode(&info.encode()), Some(info));
        assert_eq!(RoomInfo::decode(b"{"), None);
    }
}
