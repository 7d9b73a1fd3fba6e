//! A member of a room: a session, connected or waiting to resume.

use super::*;

/// One member (session) of a room, connected or waiting to resume.
#[derive(Debug)]
pub struct Member<S> {
    /// Public identity.
    pub info: MemberInfo,
    /// Subscribed channels.
    pub channels: Vec<String>,
    /// The room's seq when it subscribed to a channel after joining: a
    /// resume replays that channel's messages only from there on.
    pub(super) subscribed_at: HashMap<String, u64>,
    /// Where its frames go while connected; `None` while disconnected.
    pub sink: Option<S>,
    pub(super) resume_token: String,
    pub(super) disconnected_at: Option<Millis>,
    /// Client message ids seen lately; boxed and created on the first id, so
    /// members that never send ids (most) pay one pointer.
    pub(super) recent: Option<Box<RecentIds>>,
    /// What it wants at once and what may wait; `None` (most members):
    /// everything at once, at no cost.
    pub policy: Option<Box<DeliveryPolicy>>,
}

/// The last `dedup_window` client message ids of a member and their seqs.
#[derive(Debug, Default)]
pub(super) struct RecentIds {
    pub(super) seqs: HashMap<String, u64>,
    pub(super) order: VecDeque<String>,
}
