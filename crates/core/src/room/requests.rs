//! Requests by nonce: entities, locks (leases) and channels.

use super::*;

/// The outcome of a successful request.
#[derive(Debug)]
pub struct RequestOutcome {
    /// The `result` of the response.
    pub result: Value,
    /// Events to deliver.
    pub events: Vec<Arc<HistoryEntry>>,
}

pub(super) fn outcome(result: Value, events: Vec<Arc<HistoryEntry>>) -> RequestOutcome {
    RequestOutcome { result, events }
}

impl<S> Room<S> {
    /// Validates and applies a request.
    pub fn request(
        &mut self,
        session: &str,
        op: Op,
        now: Millis,
    ) -> Result<RequestOutcome, RoomError> {
        self.connected_member(session)?;
        match op {
            Op::SpaceMove { to, speed } => self.space_request(session, to, Some(speed), now),
            Op::SpaceJump { to } => self.space_request(session, to, None, now),
            Op::EntityCreate { kind, data } => {
                let entity = self.entities.create(kind, data);
                let e = self.push_requested(
                    session,
                    EventBody::EntityCreated {
                        entity: entity.clone(),
                    },
                    now,
                );
                Ok(outcome(json!({"entity": entity, "seq": e.seq}), vec![e]))
            }
            Op::EntitySet { id, data, version } => {
                self.check_lock(&id, session, now)?;
                let entity = self.entities.set(&id, data, version)?;
                Ok(self.entity_updated(session, entity, now))
            }
            Op::EntityPatch { id, data, version } => {
                self.check_lock(&id, session, now)?;
                let entity = self.entities.patch(&id, data, version)?;
                Ok(self.entity_updated(session, entity, now))
            }
            Op::EntityDelete { id, version } => {
                self.check_lock(&id, session, now)?;
                let version = self.entities.delete(&id, version)?;
                let body = EventBody::EntityDeleted {
                    id: id.clone(),
                    version,
                };
                let e = self.push_requested(session, body, now);
                Ok(outcome(
                    json!({"id": id, "version": version, "seq": e.seq}),
                    vec![e],
                ))
            }
            Op::LockAcquire { object, ttl_ms } => {
                let ttl = self.lock_ttl(ttl_ms)?;
                let (lock, replaced) = self.locks.acquire(&object, session, ttl, now)?;
                let mut events = Vec::new();
                if let Some(old) = replaced {
                    events.push(self.push(None, None, unlocked(old, UnlockReason::Expired), now));
                }
                let e = self.push_requested(
                    session,
                    EventBody::LockAcquired { lock: lock.clone() },
                    now,
                );
                let result = json!({"lock": lock, "seq": e.seq});
                events.push(e);
                Ok(outcome(result, events))
            }
            Op::LockRenew { object, ttl_ms } => {
                let ttl = self.lock_ttl(ttl_ms)?;
                let lock = self.locks.renew(&object, session, ttl, now)?;
                let e = self.push_requested(
                    session,
                    EventBody::LockAcquired { lock: lock.clone() },
                    now,
                );
                Ok(outcome(json!({"lock": lock, "seq": e.seq}), vec![e]))
            }
            Op::LockRelease { object } => {
                let lock = self.locks.release(&object, session, now)?;
                let token = lock.token;
                let e = self.push_requested(session, unlocked(lock, UnlockReason::Released), now);
                Ok(outcome(
                    json!({"object": object, "token": token, "seq": e.seq}),
                    vec![e],
                ))
            }
            Op::ChannelSubscribe { channel } => {
                self.check_channels(std::slice::from_ref(&channel))?;
                let max = self.config.max_channels;
                let seq = self.seq;
                let m = self.connected_member(session)?;
                if !m.channels.contains(&channel) {
                    if m.channels.len() >= max {
                        return Err(RoomError::new(
                            ErrorCode::InvalidArgs,
                            format!("at most {max} channels per member"),
                        ));
                    }
                    m.subscribed_at.insert(channel.clone(), seq);
                    m.channels.push(channel);
                }
                Ok(outcome(json!({"channels": m.channels}), Vec::new()))
            }
            Op::ChannelUnsubscribe { channel } => {
                let m = self.connected_member(session)?;
                m.channels.retain(|c| *c != channel);
                m.subscribed_at.remove(&channel);
                Ok(outcome(json!({"channels": m.channels}), Vec::new()))
            }
            Op::PolicyUpdate(update) => {
                let m = self.connected_member(session)?;
                let policy = DeliveryPolicy::updated(m.policy.as_deref(), &update)
                    .map_err(|e| RoomError::new(ErrorCode::InvalidArgs, e))?;
                let result = json!({ "policy": policy });
                m.policy = Some(Box::new(policy));
                Ok(outcome(result, Vec::new()))
            }
            Op::PolicyClear => {
                self.connected_member(session)?.policy = None;
                Ok(outcome(json!({ "policy": null }), Vec::new()))
            }
        }
    }

    pub(super) fn check_lock(
        &self,
        object: &str,
        session: &str,
        now: Millis,
    ) -> Result<(), RoomError> {
        match self.locks.holder(object, now) {
            Some(l) if l.owner != session => Err(RoomError::new(
                ErrorCode::LockHeld,
                format!("{object:?} is locked by session {}", l.owner),
            )),
            _ => Ok(()),
        }
    }

    /// Orders `entity.updated` and answers with the entity and its seq.
    fn entity_updated(
        &mut self,
        session: &str,
        entity: plaza_protocol::server::EntityInfo,
        now: Millis,
    ) -> RequestOutcome {
        let body = EventBody::EntityUpdated {
            entity: entity.clone(),
        };
        let e = self.push_requested(session, body, now);
        outcome(json!({"entity": entity, "seq": e.seq}), vec![e])
    }

    pub(super) fn lock_ttl(&self, ttl_ms: Option<u64>) -> Result<Millis, RoomError> {
        match ttl_ms.unwrap_or(self.config.default_lock_ttl_ms) {
            // Above the longest lease is no error: the lease is cut to it
            // (the `expires_at` granted says so).
            0 => Err(RoomError::new(
                ErrorCode::InvalidArgs,
                format!(
                    "ttl_ms must be from 1 to {} (max_lock_ttl_ms; longer is cut to it), not 0",
                    self.config.max_lock_ttl_ms
                ),
            )),
            t => Ok(t.min(self.config.max_lock_ttl_ms)),
        }
    }
}
