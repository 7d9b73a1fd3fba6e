//! Transports: how a client's frames reach its session, and the session's
//! queued frames reach the client.
//!
//! What every transport shares lives here: a [`session::ClientSession`] (the
//! protocol state, the send queue, counting, and the ending that disconnects
//! its rooms), the heartbeat rule ([`liveness`]) and write coalescing
//! ([`coalesce`]). A transport adds only its framing and its socket:
//! [`websocket`], and [`http`]: server-sent events and long polling.

pub(crate) mod coalesce;
pub(crate) mod http;
pub(crate) mod liveness;
pub(crate) mod session;
pub(crate) mod websocket;

/// When the server closes a session, at most this many frames still queued
/// for it are sent before the close: enough for the error that explains
/// the close, and bounded whatever the queue holds.
pub(crate) const LAST_FRAMES: usize = 64;
