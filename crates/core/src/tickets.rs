use std::collections::HashMap;

use plaza_protocol::ErrorCode;

use crate::Millis;
use crate::RoomError;

/// What a ticket admits: one member, with this name and platform, to this room.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TicketGrant {
    /// Room id.
    pub room: String,
    /// Member name.
    pub name: String,
    /// Member platform.
    pub platform: String,
}

#[derive(Debug)]
struct TicketState {
    grant: TicketGrant,
    expires_at: Millis,
    used: bool,
}

/// Single-use, short-lived tickets. The caller makes the unguessable token;
/// this book keeps each one until it expires, so a second redemption is told
/// `ticket_used` rather than `ticket_invalid`.
#[derive(Debug, Default)]
pub struct TicketBook {
    tickets: HashMap<String, TicketState>,
    /// When [`TicketBook::purge_now_and_then`] last purged.
    last_purge: Millis,
}

/// How often [`TicketBook::purge_now_and_then`] purges at most.
const PURGE_EVERY_MS: Millis = 1_000;

impl TicketBook {
    /// Records a new ticket valid until `expires_at`.
    pub fn issue(&mut self, token: String, grant: TicketGrant, expires_at: Millis) {
        self.tickets.insert(
            token,
            TicketState {
                grant,
                expires_at,
                used: false,
            },
        );
    }

    /// Puts back a ticket as a store kept it: live, or already `used`.
    pub fn restore(&mut self, token: String, grant: TicketGrant, expires_at: Millis, used: bool) {
        self.tickets.insert(
            token,
            TicketState {
                grant,
                expires_at,
                used,
            },
        );
    }

    /// Redeems a ticket once.
    pub fn redeem(&mut self, token: &str, now: Millis) -> Result<TicketGrant, RoomError> {
        let t = self
            .tickets
            .get_mut(token)
            .ok_or_else(|| RoomError::new(ErrorCode::TicketInvalid, "unknown ticket"))?;
        if t.expires_at <= now {
            return Err(RoomError::new(ErrorCode::TicketExpired, "ticket expired"));
        }
        if t.used {
            return Err(RoomError::new(ErrorCode::TicketUsed, "ticket already used"));
        }
        t.used = true;
        Ok(t.grant.clone())
    }

    /// When a held ticket expires.
    pub fn expires_at(&self, token: &str) -> Option<Millis> {
        self.tickets.get(token).map(|t| t.expires_at)
    }

    /// Forgets every ticket that expired before `now`; returns how many.
    pub fn purge(&mut self, now: Millis) -> usize {
        let before = self.tickets.len();
        // Keep expired tickets a little longer than their life so a late
        // redemption still says "expired" — but never unbounded.
        self.tickets
            .retain(|_, t| t.expires_at.saturating_add(60_000) > now);
        before - self.tickets.len()
    }

    /// Purges as [`TicketBook::purge`] does, at most once a second: a store
    /// that purges on every issue then scans its book once a second, not
    /// once per ticket, and holds at most a second's tickets more.
    pub fn purge_now_and_then(&mut self, now: Millis) -> usize {
        if now.saturating_sub(self.last_purge) < PURGE_EVERY_MS {
            return 0;
        }
        self.last_purge = now;
        self.purge(now)
    }

    /// Tickets held (live, used or recently expired).
    pub fn len(&self) -> usize {
        self.tickets.len()
    }

    /// True when none are held.
    pub fn is_empty(&self) -> bool {
        self.tickets.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn grant() -> TicketGrant {
        TicketGrant {
            room: "r".into(),
            name: "ann".into(),
            platform: "browser".into(),
        }
    }

    #[test]
    fn single_use_and_short_lived() {
        let mut b = TicketBook::default();
        b.issue("t1".into(), grant(), 30_000);
        b.issue("t2".into(), grant(), 30_000);
        assert_eq!(
            b.redeem("nope", 0).unwrap_err().code,
            ErrorCode::TicketInvalid
        );
        assert_eq!(b.redeem("t1", 10).unwrap(), grant());
        assert_eq!(b.redeem("t1", 11).unwrap_err().code, ErrorCode::TicketUsed);
        assert_eq!(
            b.redeem("t2", 30_000).unwrap_err().code,
            ErrorCode::TicketExpired
        );
        assert_eq!(b.purge(89_999), 0);
        assert_eq!(b.purge(90_000), 2);
        assert!(b.is_empty());
    }
}
