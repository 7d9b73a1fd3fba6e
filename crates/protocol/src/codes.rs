use serde::{Deserialize, Serialize};

/// A stable, machine-readable error code. Clients match on these strings;
/// never rename one. Each code is documented in `docs/protocol.md`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorCode {
    /// The frame is not a JSON object.
    BadJson,
    /// The frame has no `type`, or one the server does not know.
    UnknownType,
    /// A field is missing or has the wrong type or value.
    InvalidFrame,
    /// The frame is larger than the server's `max_frame_bytes`.
    FrameTooLarge,
    /// The connection sends faster than its rate limit allows; the frame was dropped.
    RateLimited,
    /// The ticket does not exist.
    TicketInvalid,
    /// The ticket existed but its lifetime is over.
    TicketExpired,
    /// The ticket was already redeemed.
    TicketUsed,
    /// The room does not exist.
    RoomNotFound,
    /// The room is at its member limit.
    RoomFull,
    /// The room only admits members holding a ticket.
    TicketRequired,
    /// The server verifies identities (it has keys) and the join carried
    /// neither a ticket nor a token (`auth`, or `?token=` on connect).
    TokenRequired,
    /// The token is malformed, too large, wrongly signed, signed with an
    /// algorithm or key the server does not accept (`alg: none` among
    /// them), not yet valid, for another audience or issuer, or its claims
    /// have the wrong type; or the server verifies no tokens at all.
    TokenInvalid,
    /// The token's `exp` has passed: get a fresh one from the application's
    /// backend and send it in `auth`.
    TokenExpired,
    /// The identity lacks the right this frame needs in this room (join,
    /// publish on this channel, entities, locks, direct, move, admin), or a
    /// refreshed token names another user.
    Forbidden,
    /// The connection has joined as many rooms as it may.
    TooManyRooms,
    /// The connection is already a member of this room.
    AlreadyJoined,
    /// The connection acts in a room it has not joined.
    NotJoined,
    /// The `request` names an operation the server does not know.
    UnknownOp,
    /// The `request` arguments are missing or invalid.
    InvalidArgs,
    /// The entity does not exist.
    EntityNotFound,
    /// The request carried a `version` that is not the entity's current version.
    VersionConflict,
    /// Another session holds the lock on this object.
    LockHeld,
    /// The session does not hold the lock it tries to release or renew.
    LockNotHeld,
    /// The target session of a `direct` is not a connected member of the room.
    SessionNotFound,
    /// A `direct` to a member not in proximity, in a spatial room that
    /// allows direct messages only between pairs in proximity.
    NotInProximity,
    /// The server is shutting down and takes no new work.
    ShuttingDown,
    /// HTTP: the request body or a parameter is invalid.
    InvalidRequest,
    /// HTTP: a room with this id exists already.
    RoomExists,
    /// HTTP: no such route.
    NotFound,
    /// HTTP: the path exists, but not with this method.
    MethodNotAllowed,
    /// HTTP: a management call without the right `api_key`.
    Unauthorized,
    /// HTTP: a server API call reused an idempotency key with another body.
    IdempotencyConflict,
    /// HTTP: the request body is larger than the server API takes.
    PayloadTooLarge,
    /// Cluster mode: the shared broker (Redis) cannot be reached; nothing was
    /// done. Retry (with the same message `id`) once it is back.
    BrokerUnavailable,
    /// A bug or an unexpected failure inside the server.
    Internal,
}

impl ErrorCode {
    /// Every error code, in documentation order.
    pub const ALL: &'static [ErrorCode] = &[
        ErrorCode::BadJson,
        ErrorCode::UnknownType,
        ErrorCode::InvalidFrame,
        ErrorCode::FrameTooLarge,
        ErrorCode::RateLimited,
        ErrorCode::TicketInvalid,
        ErrorCode::TicketExpired,
        ErrorCode::TicketUsed,
        ErrorCode::RoomNotFound,
        ErrorCode::RoomFull,
        ErrorCode::TicketRequired,
        ErrorCode::TokenRequired,
        ErrorCode::TokenInvalid,
        ErrorCode::TokenExpired,
        ErrorCode::Forbidden,
        ErrorCode::TooManyRooms,
        ErrorCode::AlreadyJoined,
        ErrorCode::NotJoined,
        ErrorCode::UnknownOp,
        ErrorCode::InvalidArgs,
        ErrorCode::EntityNotFound,
        ErrorCode::VersionConflict,
        ErrorCode::LockHeld,
        ErrorCode::LockNotHeld,
        ErrorCode::SessionNotFound,
        ErrorCode::NotInProximity,
        ErrorCode::ShuttingDown,
        ErrorCode::InvalidRequest,
        ErrorCode::RoomExists,
        ErrorCode::NotFound,
        ErrorCode::MethodNotAllowed,
        ErrorCode::Unauthorized,
        ErrorCode::IdempotencyConflict,
        ErrorCode::PayloadTooLarge,
        ErrorCode::BrokerUnavailable,
        ErrorCode::Internal,
    ];

    /// The code as it appears on the wire.
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorCode::BadJson => "bad_json",
            ErrorCode::UnknownType => "unknown_type",
            ErrorCode::InvalidFrame => "invalid_frame",
            ErrorCode::FrameTooLarge => "frame_too_large",
            ErrorCode::RateLimited => "rate_limited",
            ErrorCode::TicketInvalid => "ticket_invalid",
            ErrorCode::TicketExpired => "ticket_expired",
            ErrorCode::TicketUsed => "ticket_used",
            ErrorCode::RoomNotFound => "room_not_found",
            ErrorCode::RoomFull => "room_full",
            ErrorCode::TicketRequired => "ticket_required",
            ErrorCode::TokenRequired => "token_required",
            ErrorCode::TokenInvalid => "token_invalid",
            ErrorCode::TokenExpired => "token_expired",
            ErrorCode::Forbidden => "forbidden",
            ErrorCode::TooManyRooms => "too_many_rooms",
            ErrorCode::AlreadyJoined => "already_joined",
            ErrorCode::NotJoined => "not_joined",
            ErrorCode::UnknownOp => "unknown_op",
            ErrorCode::InvalidArgs => "invalid_args",
            ErrorCode::EntityNotFound => "entity_not_found",
            ErrorCode::VersionConflict => "version_conflict",
            ErrorCode::LockHeld => "lock_held",
            ErrorCode::LockNotHeld => "lock_not_held",
            ErrorCode::SessionNotFound => "session_not_found",
            ErrorCode::NotInProximity => "not_in_proximity",
            ErrorCode::ShuttingDown => "shutting_down",
            ErrorCode::InvalidRequest => "invalid_request",
            ErrorCode::RoomExists => "room_exists",
            ErrorCode::NotFound => "not_found",
            ErrorCode::MethodNotAllowed => "method_not_allowed",
            ErrorCode::Unauthorized => "unauthorized",
            ErrorCode::IdempotencyConflict => "idempotency_conflict",
            ErrorCode::PayloadTooLarge => "payload_too_large",
            ErrorCode::BrokerUnavailable => "broker_unavailable",
            ErrorCode::Internal => "internal",
        }
    }
}

impl std::fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Error codes only the HTTP layer sends, in the HTTP error body
/// (`{"error": {"code", "message"}}`), never in a frame: the HTTP transports'
/// own and the refusals of a connection before any route runs. Documented
/// in `docs/protocol.md` after the [`ErrorCode`]s, in this order. (The
/// trajectory filters have codes of their own, listed in their section.)
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum HttpErrorCode {
    /// HTTP transports: no such transport session (it ended, or never
    /// existed on this node).
    TransportNotFound,
    /// HTTP transports: another poll or event stream reads the session.
    AlreadyReading,
    /// HTTP transports: frames after the position asked for were let go.
    FramesGone,
    /// The request's `Origin` is not in `allowed_origins`.
    OriginNotAllowed,
    /// The client's address holds `max_connections_per_ip` connections.
    TooManyConnections,
    /// The node holds `max_connections` connections.
    ServerFull,
}

impl HttpErrorCode {
    /// Every HTTP-only code, in documentation order.
    pub const ALL: &'static [HttpErrorCode] = &[
        HttpErrorCode::TransportNotFound,
        HttpErrorCode::AlreadyReading,
        HttpErrorCode::FramesGone,
        HttpErrorCode::OriginNotAllowed,
        HttpErrorCode::TooManyConnections,
        HttpErrorCode::ServerFull,
    ];

    /// The code as it appears in the HTTP error body.
    pub const fn as_str(self) -> &'static str {
        match self {
            HttpErrorCode::TransportNotFound => "transport_not_found",
            HttpErrorCode::AlreadyReading => "already_reading",
            HttpErrorCode::FramesGone => "frames_gone",
            HttpErrorCode::OriginNotAllowed => "origin_not_allowed",
            HttpErrorCode::TooManyConnections => "too_many_connections",
            HttpErrorCode::ServerFull => "server_full",
        }
    }
}

impl std::fmt::Display for HttpErrorCode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// WebSocket close codes the server uses. 4000–4999 are Plaza's own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u16)]
pub enum CloseCode {
    /// Normal closure, e.g. after the client closed.
    Normal = 1000,
    /// The client broke the WebSocket protocol (e.g. invalid UTF-8 in a text frame).
    ProtocolError = 1002,
    /// The server restarts or shuts down: reconnect (to any node) and resume.
    Restarting = 1012,
    /// A text message or close reason was not valid UTF-8.
    InvalidPayload = 1007,
    /// A frame exceeded the hard WebSocket message limit (4 × `max_frame_bytes`).
    MessageTooBig = 1009,
    /// Nothing was heard from the client within `idle_timeout`.
    HeartbeatTimeout = 4001,
    /// The client did not read fast enough: its send queue stayed full. Resume to catch up.
    SlowConsumer = 4002,
    /// The client kept breaking its rate limit by a large margin.
    PolicyViolation = 4003,
    /// The connection's token expired and no fresh one came in `auth`:
    /// reconnect with a fresh token and resume.
    TokenExpired = 4004,
    /// Cluster mode: the room's history was rewritten. A broker failover lost
    /// the last entries of the room's log, which this node had already
    /// applied and delivered, and the log went on with other entries under
    /// the same seqs. The client must join its rooms again *without*
    /// resuming (a fresh join, a fresh snapshot): what it holds of the room
    /// may include events the room no longer has.
    HistoryRewritten = 4005,
}

impl CloseCode {
    /// The numeric close code.
    pub fn code(self) -> u16 {
        self as u16
    }
}
