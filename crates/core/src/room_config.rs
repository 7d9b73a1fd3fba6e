//! A room's settings: who may join and its limits and timings, fixed at
//! creation and carried in its snapshots.

use serde::{Deserialize, Serialize};

use crate::Millis;

/// Who may join a room.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Access {
    /// Anyone who knows the room id, with any name.
    #[default]
    Open,
    /// Only holders of a ticket issued for the room. Named `ticket`, as in
    /// the HTTP API (`ticket_only`, its first name in snapshots, still reads).
    #[serde(rename = "ticket", alias = "ticket_only")]
    TicketOnly,
}

/// Per-room limits and timings.
///
/// Serializable as part of a [`RoomState`](crate::RoomState): every field is required, since a
/// replica whose limits silently defaulted would diverge from the others.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RoomConfig {
    /// Events kept for resume.
    pub history_size: usize,
    /// Connected members at most.
    pub max_members: usize,
    /// Who may join.
    pub access: Access,
    /// How long a dropped session can be resumed.
    pub resume_window_ms: Millis,
    /// Lease length when a `lock.acquire` names none.
    pub default_lock_ttl_ms: Millis,
    /// Longest lease granted.
    pub max_lock_ttl_ms: Millis,
    /// Client message ids remembered per session for idempotent publish (0: none).
    pub dedup_window: usize,
    /// Channels a member may subscribe to at once.
    pub max_channels: usize,
    /// Whether members see each other: `presence.join`/`presence.leave`
    /// events and the member list in `joined`. Off for large broadcast
    /// rooms, where every join would otherwise reach every member (O(n²)
    /// events) and every `joined` would list every member.
    pub presence: bool,
    /// A spatial room: its plane and distances (absent: no space).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub space: Option<crate::spatial::SpaceConfig>,
}

impl Default for RoomConfig {
    fn default() -> Self {
        RoomConfig {
            history_size: 1000,
            max_members: 10_000,
            access: Access::Open,
            resume_window_ms: 120_000,
            default_lock_ttl_ms: 30_000,
            max_lock_ttl_ms: 600_000,
            dedup_window: 256,
            max_channels: 32,
            presence: true,
            space: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn access_is_named_as_in_the_api_and_reads_its_first_name() {
        assert_eq!(
            serde_json::to_value(Access::TicketOnly).unwrap(),
            serde_json::json!("ticket")
        );
        assert_eq!(
            serde_json::to_value(Access::Open).unwrap(),
            serde_json::json!("open")
        );
        // Snapshots written before the rename.
        let old: Access = serde_json::from_value(serde_json::json!("ticket_only")).unwrap();
        assert_eq!(old, Access::TicketOnly);
        assert!(serde_json::from_value::<Access>(serde_json::json!("closed")).is_err());
    }
}
