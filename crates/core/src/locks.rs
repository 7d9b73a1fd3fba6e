use std::collections::BTreeMap;

use plaza_protocol::server::LockInfo;
use plaza_protocol::ErrorCode;
use serde::{Deserialize, Serialize};

use crate::Millis;
use crate::RoomError;

/// A lease on one object: who holds it, until when, and its fencing token.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LockLease {
    /// Holder's session id.
    pub owner: String,
    /// Grows with every grant in the room; never reused, so a stale holder's
    /// writes can be told apart from the current holder's.
    pub token: u64,
    /// End of the lease unless renewed.
    pub expires_at: Millis,
}

/// The room's locks. At most one live lease per object, ever.
///
/// Serializable with its fencing-token counter, as part of a
/// [`crate::RoomState`]: tokens must keep growing on the node that loads it.
#[derive(Debug, Default, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LockTable {
    leases: BTreeMap<String, LockLease>,
    last_token: u64,
}

impl LockTable {
    /// Grants `object` to `owner` for `ttl` ms, unless another session holds a
    /// live lease. Re-acquiring one's own lock renews it with a new token.
    /// Returns the lease granted and any expired lease it replaced.
    pub fn acquire(
        &mut self,
        object: &str,
        owner: &str,
        ttl: Millis,
        now: Millis,
    ) -> Result<(LockInfo, Option<LockInfo>), RoomError> {
        let mut replaced = None;
        if let Some(l) = self.leases.get(object) {
            if l.expires_at > now && l.owner != owner {
                return Err(RoomError::new(
                    ErrorCode::LockHeld,
                    format!("{object:?} is locked by session {}", l.owner),
                ));
            }
            if l.expires_at <= now {
                replaced = Some(info(object, l));
            }
        }
        self.last_token += 1;
        let lease = LockLease {
            owner: owner.to_owned(),
            token: self.last_token,
            expires_at: now.saturating_add(ttl),
        };
        let granted = info(object, &lease);
        self.leases.insert(object.to_owned(), lease);
        Ok((granted, replaced))
    }

    /// Extends a live lease held by `owner`.
    pub fn renew(
        &mut self,
        object: &str,
        owner: &str,
        ttl: Millis,
        now: Millis,
    ) -> Result<LockInfo, RoomError> {
        match self.leases.get_mut(object) {
            Some(l) if l.owner == owner && l.expires_at > now => {
                l.expires_at = now.saturating_add(ttl);
                Ok(info(object, l))
            }
            _ => Err(not_held(object)),
        }
    }

    /// Ends a live lease held by `owner`.
    pub fn release(
        &mut self,
        object: &str,
        owner: &str,
        now: Millis,
    ) -> Result<LockInfo, RoomError> {
        match self.leases.get(object) {
            Some(l) if l.owner == owner && l.expires_at > now => {
                let l = self.leases.remove(object).expect("present");
                Ok(info(object, &l))
            }
            _ => Err(not_held(object)),
        }
    }

    /// Removes every lease of `owner` (it disconnected or left).
    pub fn release_all(&mut self, owner: &str) -> Vec<LockInfo> {
        let mut out = Vec::new();
        self.leases.retain(|object, l| {
            if l.owner == owner {
                out.push(info(object, l));
                false
            } else {
                true
            }
        });
        out
    }

    /// Removes every lease that ended at or before `now`.
    pub fn expire(&mut self, now: Millis) -> Vec<LockInfo> {
        let mut out = Vec::new();
        self.leases.retain(|object, l| {
            if l.expires_at <= now {
                out.push(info(object, l));
                false
            } else {
                true
            }
        });
        out
    }

    /// The live holder of `object`, if any.
    pub fn holder(&self, object: &str, now: Millis) -> Option<&LockLease> {
        self.leases.get(object).filter(|l| l.expires_at > now)
    }

    /// Whether every lease's token was issued by the counter, so later grants
    /// get larger ones (checked on a state loaded from elsewhere).
    pub(crate) fn tokens_below_counter(&self) -> bool {
        self.leases.values().all(|l| l.token <= self.last_token)
    }

    /// When the next lease ends.
    pub fn next_expiry(&self) -> Option<Millis> {
        self.leases.values().map(|l| l.expires_at).min()
    }

    /// Every live lease, ordered by object.
    pub fn snapshot(&self, now: Millis) -> Vec<LockInfo> {
        self.leases
            .iter()
            .filter(|(_, l)| l.expires_at > now)
            .map(|(o, l)| info(o, l))
            .collect()
    }
}

fn not_held(object: &str) -> RoomError {
    RoomError::new(
        ErrorCode::LockNotHeld,
        format!("this session holds no lock on {object:?}"),
    )
}

fn info(object: &str, l: &LockLease) -> LockInfo {
    LockInfo {
        object: object.to_owned(),
        owner: l.owner.clone(),
        token: l.token,
        expires_at: l.expires_at,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_holder_until_release_or_expiry() {
        let mut t = LockTable::default();
        let (a, _) = t.acquire("o", "s1", 100, 0).unwrap();
        assert_eq!((a.token, a.expires_at), (1, 100));
        assert_eq!(
            t.acquire("o", "s2", 100, 50).unwrap_err().code,
            ErrorCode::LockHeld
        );
        assert_eq!(
            t.release("o", "s2", 50).unwrap_err().code,
            ErrorCode::LockNotHeld
        );
        // the lease ends at expires_at exactly
        let (b, replaced) = t.acquire("o", "s2", 100, 100).unwrap();
        assert_eq!(b.token, 2);
        assert_eq!(replaced.unwrap().owner, "s1");
        assert_eq!(
            t.renew("o", "s1", 100, 120).unwrap_err().code,
            ErrorCode::LockNotHeld
        );
        assert_eq!(t.renew("o", "s2", 500, 120).unwrap().expires_at, 620);
        assert_eq!(t.release("o", "s2", 130).unwrap().token, 2);
        assert!(t.holder("o", 130).is_none());
    }

    #[test]
    fn expiry_and_release_all() {
        let mut t = LockTable::default();
        t.acquire("a", "s1", 10, 0).unwrap();
        t.acquire("b", "s1", 50, 0).unwrap();
        t.acquire("c", "s2", 20, 0).unwrap();
        assert_eq!(t.next_expiry(), Some(10));
        assert_eq!(
            t.expire(10)
                .into_iter()
                .map(|l| l.object)
                .collect::<Vec<_>>(),
            vec!["a"]
        );
        assert_eq!(t.release_all("s1").len(), 1);
        assert_eq!(t.snapshot(15).len(), 1);
        assert_eq!(t.expire(20).len(), 1);
        assert_eq!(t.next_expiry(), None);
    }
}
