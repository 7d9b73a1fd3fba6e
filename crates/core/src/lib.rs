//! Plaza's room logic, free of I/O.
//!
//! Everything here is a plain state machine: callers pass the current time
//! ([`Millis`]) and any randomness (session ids, tokens) in, and get events and
//! answers out. That keeps the rules — ordering, history bounds, resume windows,
//! lock leases, validation — testable exhaustively and deterministically.
//!
//! The central type is [`Room`]: one room's members, state, locks and ordered
//! history. A runtime (the `plaza-server` crate) owns each `Room` in one task and
//! delivers the encoded events it returns. In cluster mode several nodes run
//! replicas of one room from the same ordered inputs, which is why a room is
//! deterministic (see [`Room`]) and can be exported as a [`RoomState`].

mod entities;
mod error;
mod history;
mod locks;
pub mod policy;
mod rate;
mod rights;
mod room;
mod room_config;
mod room_state;
pub mod spatial;
mod tickets;

pub use entities::{Entity, EntityStore};
pub use error::RoomError;
pub use history::{HistoryEntry, RoomLog, Scope};
pub use locks::{LockLease, LockTable};
pub use rate::{RatePerKey, TokenBucket};
pub use rights::{Right, Rights, RoomGrants};
pub use room::{
    Delivery, Held, JoinParams, Joined, LiveFilter, Member, PublishParams, Published, Removed,
    RequestOutcome, Resume, Room, ServerPublish, MAX_SERVER_KEY_BYTES, SERVER_KEYS_KEPT,
    SERVER_SENDER,
};
pub use room_config::{Access, RoomConfig};
pub use room_state::{InvalidRoomState, MemberState, RoomState};
pub use tickets::{TicketBook, TicketGrant};

/// Wall-clock time in Unix milliseconds, passed in by the caller.
pub type Millis = u64;
