//! The HTTP error every endpoint answers with: a status and
//! `{"error":{"code","message"}}`.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use plaza_core::RoomError;
use plaza_protocol::{ErrorCode, HttpErrorCode};
use serde_json::json;

/// An HTTP error: status plus `{"error":{"code","message"}}`.
pub(crate) struct ApiError {
    pub(crate) status: StatusCode,
    /// An [`ErrorCode`]'s wire string, or a code of an HTTP-only service (e.g.
    /// the trajectory filters' `invalid_csv`).
    code: &'static str,
    message: String,
}

impl ApiError {
    pub(crate) fn new(status: StatusCode, code: ErrorCode, message: impl Into<String>) -> Self {
        ApiError::with_code(status, code.as_str(), message)
    }

    /// 503 `shutting_down`: the node drains and takes nothing new.
    pub(crate) fn shutting_down() -> Self {
        ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            ErrorCode::ShuttingDown,
            "shutting down",
        )
    }

    /// An error with one of the codes only the HTTP layer sends.
    pub(crate) fn http(
        status: StatusCode,
        code: HttpErrorCode,
        message: impl Into<String>,
    ) -> Self {
        ApiError::with_code(status, code.as_str(), message)
    }

    /// An error with a code of an HTTP-only service (the trajectory
    /// filters'), documented in that service's section. Codes of the
    /// protocol's error table go by [`ApiError::new`] or [`ApiError::http`],
    /// so that the table (checked by `crates/protocol/tests/vectors.rs`)
    /// lists every one.
    pub(crate) fn with_code(
        status: StatusCode,
        code: &'static str,
        message: impl Into<String>,
    ) -> Self {
        ApiError {
            status,
            code,
            message: message.into(),
        }
    }
}

impl From<RoomError> for ApiError {
    fn from(e: RoomError) -> Self {
        let status = match e.code {
            ErrorCode::RoomNotFound
            | ErrorCode::NotFound
            | ErrorCode::SessionNotFound
            | ErrorCode::EntityNotFound => StatusCode::NOT_FOUND,
            ErrorCode::Forbidden => StatusCode::FORBIDDEN,
            ErrorCode::TokenRequired | ErrorCode::TokenInvalid | ErrorCode::TokenExpired => {
                StatusCode::UNAUTHORIZED
            }
            ErrorCode::RoomExists | ErrorCode::IdempotencyConflict | ErrorCode::LockHeld => {
                StatusCode::CONFLICT
            }
            // The server API's `If-Match` named another version.
            ErrorCode::VersionConflict => StatusCode::PRECONDITION_FAILED,
            ErrorCode::PayloadTooLarge => StatusCode::PAYLOAD_TOO_LARGE,
            ErrorCode::Internal => StatusCode::INTERNAL_SERVER_ERROR,
            ErrorCode::ShuttingDown | ErrorCode::BrokerUnavailable => {
                StatusCode::SERVICE_UNAVAILABLE
            }
            _ => StatusCode::BAD_REQUEST,
        };
        ApiError::new(status, e.code, e.message)
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = json!({"error": {"code": self.code, "message": self.message}});
        (self.status, Json(body)).into_response()
    }
}
