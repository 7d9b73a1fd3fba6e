//! Plaza wire protocol, version 1.
//!
//! Every WebSocket frame is one JSON object with a `type` field. This crate
//! defines the frames a client sends ([`client`]), the frames the server sends
//! ([`server`]), the stable error codes ([`ErrorCode`]) and the WebSocket close
//! codes ([`CloseCode`]). It does no I/O: it decodes bytes into typed frames and
//! encodes typed frames into bytes, once, so that one encoded event can be
//! shared by every recipient.
//!
//! `docs/protocol.md` is the human-readable contract; the examples there are
//! kept in `protocol/vectors/` and checked against this crate by tests.
//!
//! ```
//! use plaza_protocol::client::{decode, ClientFrame};
//! let frame = decode(br#"{"type":"ping"}"#).unwrap();
//! assert!(matches!(frame, ClientFrame::Ping(_)));
//! ```

pub mod client;
mod codes;
pub mod compact;
pub mod policy;
pub mod server;

pub use codes::{CloseCode, ErrorCode, HttpErrorCode};

/// The protocol version spoken by this crate.
pub const PROTOCOL_VERSION: u32 = 1;

/// The channel every member is subscribed to unless it unsubscribes.
pub const DEFAULT_CHANNEL: &str = "main";
