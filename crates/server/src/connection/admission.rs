//! Who a joining client is and which room it may enter, decided before any
//! room sees the join: the seam where identities (signed tokens) plug in.

use plaza_core::RoomError;
use plaza_protocol::client;
use plaza_protocol::ErrorCode;

use crate::clock::now_ms;
use crate::Node;

/// A join that passed admission: the room and the identity the member gets.
#[derive(Debug)]
pub(crate) struct Admitted {
    pub(crate) room: String,
    pub(crate) name: String,
    pub(crate) platform: String,
    /// Whether a ticket vouched for it (ticket-only rooms admit no other).
    pub(crate) ticket: bool,
}

/// Admits a join: with a single-use ticket, redeemed here (spent even if
/// the room then refuses), or openly, with the room and name it names.
/// Checks that need no ticket belong before this call, so that a refused
/// join does not spend the ticket.
pub(crate) async fn admit(node: &Node, j: &client::Join) -> Result<Admitted, RoomError> {
    let invalid = |m: &str| RoomError::new(ErrorCode::InvalidFrame, m);
    let admitted = match &j.ticket {
        Some(t) => {
            let g = node.tickets().redeem_ticket(t, now_ms()).await?;
            if j.room.as_ref().is_some_and(|room| *room != g.room) {
                return Err(invalid("the ticket is for another room"));
            }
            Admitted {
                room: g.room,
                name: g.name,
                platform: g.platform,
                ticket: true,
            }
        }
        None => {
            let (Some(room), Some(name)) = (j.room.clone(), j.name.clone()) else {
                return Err(invalid("join needs a ticket, or a room and a name"));
            };
            Admitted {
                room,
                name,
                platform: j.platform.clone().unwrap_or_else(|| "browser".into()),
                ticket: false,
            }
        }
    };
    let (name, platform) = (&admitted.name, &admitted.platform);
    if name.is_empty() || name.len() > 64 || platform.is_empty() || platform.len() > 32 {
        return Err(invalid("name must have 1 to 64 bytes and platform 1 to 32"));
    }
    Ok(admitted)
}
