//! The refusal every room operation answers with.

use plaza_protocol::ErrorCode;

/// A refusal: a stable code and a message for humans.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RoomError {
    /// Stable code.
    pub code: ErrorCode,
    /// Explanation.
    pub message: String,
}

impl RoomError {
    /// Builds an error.
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        RoomError {
            code,
            message: message.into(),
        }
    }
}

impl std::fmt::Display for RoomError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.code, self.message)
    }
}

impl std::error::Error for RoomError {}
