//! Who a joining client is and which room it may enter, decided before any
//! room sees the join: a ticket, the connection's verified token, or (in
//! development mode, without keys) the join's own word.

use std::sync::Arc;

use plaza_core::{Right, Rights, RoomError};
use plaza_protocol::client;
use plaza_protocol::ErrorCode;

use crate::auth::Identity;
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
    /// The token's user, when the connection has one.
    pub(crate) user: Option<String>,
    /// What the token grants in the room; `None`: what any member may.
    pub(crate) rights: Option<Arc<Rights>>,
    /// `Some(refusal)`: nothing vouched for a new member (a node with keys,
    /// no ticket, no token granting `join`); the join goes on only as a
    /// resume, which the room allows of a session without a user (joined
    /// with a ticket and no token) and refuses with `refusal` otherwise.
    pub(crate) resume_only: Option<RoomError>,
}

/// Admits a join: with a single-use ticket, redeemed here (spent even if
/// the room then refuses), with the connection's token (`identity`), or, on
/// a server without keys, openly, with the room and name it names.
/// Checks that need no ticket belong before this call, so that a refused
/// join does not spend the ticket.
pub(crate) async fn admit(
    node: &Node,
    j: &client::Join,
    identity: Option<&Identity>,
) -> Result<Admitted, RoomError> {
    let invalid = |m: &str| RoomError::new(ErrorCode::InvalidFrame, m);
    let user = identity.map(|i| i.user.clone());
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
                user,
                rights: None,
                resume_only: None,
            }
        }
        None if node.tokens().is_some() => {
            let Some(identity) = identity else {
                return resume_only(
                    j,
                    RoomError::new(
                        ErrorCode::TokenRequired,
                        "this server admits members with a token (auth) or a ticket; a resume \
                         token alone resumes only a session joined with a ticket and no token",
                    ),
                );
            };
            let Some(room) = j.room.clone() else {
                return Err(invalid("join needs a ticket, or a room"));
            };
            if identity.expires_at <= now_ms() {
                return Err(RoomError::new(
                    ErrorCode::TokenExpired,
                    "the token expired; send a fresh one in auth",
                ));
            }
            let rights = granted(identity, &room);
            if !rights.may(Right::Join) {
                return resume_only(
                    j,
                    RoomError::new(
                        ErrorCode::Forbidden,
                        format!("the token grants no join in room {room:?}"),
                    ),
                );
            }
            // The token's name is the backend's word; the join's only
            // stands in when the token has none.
            let name = identity
                .name
                .clone()
                .or_else(|| j.name.clone())
                .unwrap_or_else(|| identity.user.clone());
            unticketed(j, room, name, user, Some(rights))
        }
        None => {
            let (Some(room), Some(name)) = (j.room.clone(), j.name.clone()) else {
                return Err(invalid("join needs a ticket, or a room and a name"));
            };
            unticketed(j, room, name, user, None)
        }
    };
    let (name, platform) = (&admitted.name, &admitted.platform);
    if name.is_empty() || name.len() > 64 || platform.is_empty() || platform.len() > 32 {
        return Err(invalid("name must have 1 to 64 bytes and platform 1 to 32"));
    }
    Ok(admitted)
}

/// A join nothing vouches for as a new member: without `resume` it gets
/// `refusal` at once; with one it goes to the room, which resumes a session
/// without a user (its resume token is its credential) and refuses anything
/// else with `refusal`. Name and platform are the session's own then.
fn resume_only(j: &client::Join, refusal: RoomError) -> Result<Admitted, RoomError> {
    let (Some(room), Some(resume)) = (&j.room, &j.resume) else {
        return Err(refusal);
    };
    // A token no node made names no session: refused before any room is
    // looked at (or, in cluster mode, hosted for it).
    if !plaza_broker::is_resume_token(&resume.token) {
        return Err(refusal);
    }
    Ok(Admitted {
        room: room.clone(),
        // Never shown: a resumed session keeps its own.
        name: "-".into(),
        platform: "-".into(),
        ticket: false,
        user: None,
        rights: None,
        resume_only: Some(refusal),
    })
}

/// A join without a ticket: the platform is the join's (a browser unless it says).
fn unticketed(
    j: &client::Join,
    room: String,
    name: String,
    user: Option<String>,
    rights: Option<Arc<Rights>>,
) -> Admitted {
    Admitted {
        room,
        name,
        platform: j.platform.clone().unwrap_or_else(|| "browser".into()),
        ticket: false,
        user,
        rights,
        resume_only: None,
    }
}

/// What `identity` may do in `room`: its grants there, or nothing.
pub(crate) fn granted(identity: &Identity, room: &str) -> Arc<Rights> {
    static NOTHING: std::sync::OnceLock<Arc<Rights>> = std::sync::OnceLock::new();
    identity.grants.for_room(room).cloned().unwrap_or_else(|| {
        NOTHING
            .get_or_init(|| Arc::new(Rights::parse::<&str>(&[]).expect("no names")))
            .clone()
    })
}
