use std::sync::Mutex;

use async_trait::async_trait;
use plaza_core::{Millis, RoomError, TicketBook, TicketGrant};

use crate::{new_ticket_token, IssuedTicket, TicketStore};

/// Embedded mode's ticket store: tickets in this process's memory.
#[derive(Debug, Default)]
pub struct MemoryTicketStore {
    tickets: Mutex<TicketBook>,
}

impl MemoryTicketStore {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }
}

#[async_trait]
impl TicketStore for MemoryTicketStore {
    fn kind(&self) -> &'static str {
        "memory"
    }

    async fn issue_ticket(
        &self,
        grant: TicketGrant,
        ttl_ms: Millis,
        now: Millis,
    ) -> Result<IssuedTicket, RoomError> {
        let ticket = new_ticket_token();
        let expires_at = now + ttl_ms;
        let mut book = self.tickets.lock().unwrap_or_else(|p| p.into_inner());
        // Purging on issue keeps the book bounded by the issue rate × ticket life.
        book.purge_now_and_then(now);
        book.issue(ticket.clone(), grant, expires_at);
        Ok(IssuedTicket { ticket, expires_at })
    }

    async fn redeem_ticket(&self, ticket: &str, now: Millis) -> Result<TicketGrant, RoomError> {
        self.tickets
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .redeem(ticket, now)
    }

    async fn ready(&self) -> bool {
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use plaza_protocol::ErrorCode;

    #[tokio::test]
    async fn tickets_redeem_once_and_expire() {
        let b = MemoryTicketStore::new();
        let grant = TicketGrant {
            room: "r".into(),
            name: "ann".into(),
            platform: "xr".into(),
        };
        let t = b.issue_ticket(grant.clone(), 30_000, 1_000).await.unwrap();
        assert_eq!(t.expires_at, 31_000);
        assert_eq!(b.redeem_ticket(&t.ticket, 2_000).await.unwrap(), grant);
        assert_eq!(
            b.redeem_ticket(&t.ticket, 2_000).await.unwrap_err().code,
            ErrorCode::TicketUsed
        );
        let t2 = b.issue_ticket(grant, 30_000, 1_000).await.unwrap();
        assert_eq!(
            b.redeem_ticket(&t2.ticket, 31_000).await.unwrap_err().code,
            ErrorCode::TicketExpired
        );
        assert_eq!(
            b.redeem_ticket("forged", 0).await.unwrap_err().code,
            ErrorCode::TicketInvalid
        );
    }
}
