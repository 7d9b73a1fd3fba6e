//! The frames a room sends to one client about its own commands.

use plaza_core::RoomError;
use plaza_protocol::server::{ErrorBody, ErrorRef, Outcome, ServerFrame};
use plaza_protocol::ErrorCode;
use serde_json::value::RawValue;

/// The `error` frame refusing a client's `frame` (with its message `id`) in `room`.
pub(crate) fn error_frame(
    room: &str,
    e: RoomError,
    frame: &str,
    id: Option<String>,
) -> ServerFrame {
    ServerFrame::Error {
        code: e.code,
        message: e.message,
        reference: Some(ErrorRef {
            frame: Some(frame.to_owned()),
            room: Some(room.to_owned()),
            id,
        }),
    }
}

/// The refusal of a command whose session is not a member on its connection.
pub(crate) fn not_joined() -> RoomError {
    RoomError::new(
        ErrorCode::NotJoined,
        "this connection has not joined the room",
    )
}

/// The refusal of a command that reached a deleted room.
pub(crate) fn room_deleted(room: &str) -> RoomError {
    RoomError::new(
        ErrorCode::RoomNotFound,
        format!("room {room:?} was deleted"),
    )
}

/// The `response` to a request.
pub(crate) fn response(
    room: &str,
    nonce: Box<RawValue>,
    result: Result<serde_json::Value, RoomError>,
) -> ServerFrame {
    let outcome = match result {
        Ok(v) => Outcome::Ok(v),
        Err(e) => Outcome::Err(ErrorBody {
            code: e.code,
            message: e.message,
        }),
    };
    ServerFrame::Response {
        room: room.to_owned(),
        nonce,
        outcome,
    }
}
