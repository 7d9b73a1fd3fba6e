//! A room as a [`RoomState`] (snapshots) and back.

use super::*;

impl<S> Room<S> {
    /// Everything the room holds except the sinks, for another node to
    /// [`import`](Room::import). `owner` names where a connected member's sink
    /// delivers (e.g. a node id); the importing node turns it back into a sink.
    pub fn export(&self, owner: impl Fn(&S) -> String) -> RoomState {
        let mut members: Vec<MemberState> = self
            .members
            .iter()
            .map(|(session, m)| MemberState {
                session: session.clone(),
                name: m.info.name.clone(),
                platform: m.info.platform.clone(),
                user: m.info.user.clone(),
                channels: m.channels.clone(),
                subscribed_at: {
                    let mut at: Vec<(String, u64)> = m
                        .subscribed_at
                        .iter()
                        .map(|(c, s)| (c.clone(), *s))
                        .collect();
                    at.sort_unstable();
                    at
                },
                resume_token: m.resume_token.clone(),
                owner: m.sink.as_ref().map(&owner),
                disconnected_at: m.disconnected_at,
                recent: m.recent.as_deref().map_or_else(Vec::new, |r| {
                    r.order.iter().map(|id| (id.clone(), r.seqs[id])).collect()
                }),
                policy: m.policy.as_deref().cloned(),
            })
            .collect();
        // Sorted: the same room exports the same state on every replica.
        members.sort_unstable_by(|a, b| a.session.cmp(&b.session));
        RoomState {
            format: RoomState::FORMAT,
            id: self.id.clone(),
            name: self.name.clone(),
            created_at: self.created_at,
            epoch: self.epoch,
            config: self.config.clone(),
            seq: self.seq,
            history: self.log.last(self.log.len()).cloned().collect(),
            entities: self.entities.clone(),
            locks: self.locks.clone(),
            members,
            space: self.space.as_ref().map(|s| s.export()),
            server_keys: self.server_keys.export(),
        }
    }

    /// A room continuing from an exported `state`. Each connected member gets
    /// `sink(owner)` for the owner [`export`](Room::export) recorded;
    /// disconnected members stay resumable, without a sink.
    ///
    /// # Panics
    /// If the history has a gap. A state from another process should pass
    /// [`RoomState::validate`] first.
    pub fn import(state: RoomState, mut sink: impl FnMut(&str) -> S) -> Room<S> {
        let mut log = RoomLog::new(state.config.history_size);
        for e in state.history {
            log.push(e);
        }
        let mut members = BTreeMap::new();
        let mut tokens = BTreeMap::new();
        let mut connected = 0;
        let mut disconnected = BTreeSet::new();
        for m in state.members {
            if let Some(t) = m.disconnected_at {
                disconnected.insert((t, m.session.clone()));
            }
            let sink = m.owner.as_deref().map(&mut sink);
            connected += usize::from(sink.is_some());
            let recent = (!m.recent.is_empty()).then(|| {
                Box::new(RecentIds {
                    seqs: m.recent.iter().cloned().collect(),
                    order: m.recent.into_iter().map(|(id, _)| id).collect(),
                })
            });
            tokens.insert(m.resume_token.as_str().into(), m.session.as_str().into());
            members.insert(
                m.session.clone(),
                Member {
                    info: MemberInfo {
                        session: m.session,
                        name: m.name,
                        platform: m.platform,
                        user: m.user,
                    },
                    channels: m.channels,
                    subscribed_at: m.subscribed_at.into_iter().collect(),
                    sink,
                    resume_token: m.resume_token,
                    disconnected_at: m.disconnected_at,
                    recent,
                    policy: m.policy.map(Box::new),
                },
            );
        }
        let space = match (&state.config.space, state.space) {
            (Some(c), Some(s)) => Some(spatial::RoomSpace::import(c.clone(), s)),
            (Some(_), None) => config_space(&state.config),
            (None, _) => None,
        };
        Room {
            id: state.id,
            name: state.name,
            created_at: state.created_at,
            epoch: state.epoch,
            config: state.config,
            seq: state.seq,
            log,
            entities: state.entities,
            locks: state.locks,
            members,
            tokens,
            connected,
            disconnected,
            space,
            server_keys: ServerKeys::import(state.server_keys),
        }
    }
}
