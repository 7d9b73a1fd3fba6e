//! [`TicketStore`] on Redis: single-use tickets any node can redeem.

use async_trait::async_trait;
use plaza_core::{Millis, RoomError, TicketGrant};
use plaza_protocol::ErrorCode;

use super::scripts::REDEEM_TICKET;
use super::RedisBroker;
use crate::{new_ticket_token, ClusterError, IssuedTicket, TicketStore};

/// How long a ticket's key outlives the ticket, so a late redemption is told
/// `ticket_expired` rather than `ticket_invalid`.
const KEEP_EXPIRED_MS: Millis = 3_600_000;

fn broker_error(e: ClusterError) -> RoomError {
    RoomError::new(ErrorCode::BrokerUnavailable, e.to_string())
}

pub(super) fn encode(grant: &TicketGrant) -> String {
    serde_json::json!({
        "room": grant.room,
        "name": grant.name,
        "platform": grant.platform,
    })
    .to_string()
}

pub(super) fn decode(json: &[u8]) -> Option<TicketGrant> {
    let v: serde_json::Value = serde_json::from_slice(json).ok()?;
    let field = |name: &str| v.get(name)?.as_str().map(str::to_owned);
    Some(TicketGrant {
        room: field("room")?,
        name: field("name")?,
        platform: field("platform")?,
    })
}

#[async_trait]
impl TicketStore for RedisBroker {
    fn kind(&self) -> &'static str {
        "redis"
    }

    async fn issue_ticket(
        &self,
        grant: TicketGrant,
        ttl_ms: Millis,
        now: Millis,
    ) -> Result<IssuedTicket, RoomError> {
        self.check_member().map_err(broker_error)?;
        let ticket = new_ticket_token();
        let expires_at = now + ttl_ms;
        let key = self.keys.ticket(&ticket);
        let mut pipe = ::redis::pipe();
        pipe.atomic()
            .cmd("HSET")
            .arg(&key)
            .arg("grant")
            .arg(encode(&grant))
            .arg("exp")
            .arg(expires_at)
            .arg("used")
            .arg(0)
            .ignore()
            .cmd("PEXPIRE")
            .arg(&key)
            .arg(ttl_ms + KEEP_EXPIRED_MS)
            .ignore();
        self.query_pipe::<()>(&pipe).await.map_err(broker_error)?;
        Ok(IssuedTicket { ticket, expires_at })
    }

    async fn redeem_ticket(&self, ticket: &str, now: Millis) -> Result<TicketGrant, RoomError> {
        self.check_member().map_err(broker_error)?;
        let mut call = REDEEM_TICKET.key(self.keys.ticket(ticket));
        call.arg(now).arg(new_ticket_token());
        let (status, grant): (String, Vec<u8>) = self.invoke(&call).await.map_err(broker_error)?;
        match status.as_str() {
            "ok" => decode(&grant).ok_or_else(|| {
                RoomError::new(ErrorCode::Internal, "malformed ticket grant in redis")
            }),
            "expired" => Err(RoomError::new(ErrorCode::TicketExpired, "ticket expired")),
            "used" => Err(RoomError::new(ErrorCode::TicketUsed, "ticket already used")),
            _ => Err(RoomError::new(ErrorCode::TicketInvalid, "unknown ticket")),
        }
    }

    async fn ready(&self) -> bool {
        !self.left.load(std::sync::atomic::Ordering::Acquire) && self.ping().await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grants_round_trip_through_json() {
        let g = TicketGrant {
            room: "r\"1".into(),
            name: "änn".into(),
            platform: "xr".into(),
        };
        assert_eq!(decode(encode(&g).as_bytes()), Some(g));
        assert_eq!(decode(b"{}"), None);
    }
}
