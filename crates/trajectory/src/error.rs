//! The error type.

use std::fmt;

/// Why a trajectory request was refused. Each variant has a stable
/// [`code`](TrajectoryError::code); the message is for humans and may change.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TrajectoryError {
    /// The CSV is malformed or a value is invalid (code `invalid_csv`).
    InvalidCsv {
        /// The 1-based line number.
        line: usize,
        /// The field (`timestamp`, `lat` or `lon`, whatever the header called
        /// it), when one field is at fault.
        field: Option<&'static str>,
        /// What is wrong.
        message: String,
    },
    /// The JSON body is malformed or a point is invalid (code `invalid_json`).
    InvalidJson(String),
    /// The GPX document is malformed or a track point is invalid (code `invalid_gpx`).
    InvalidGpx(String),
    /// The GeoJSON document is malformed, not a single LineString, or a
    /// position is invalid (code `invalid_geojson`).
    InvalidGeojson(String),
    /// The interval is missing, not an integer, 0 or too large (code `invalid_interval`).
    InvalidInterval(String),
    /// The trajectory has no points (code `empty_trajectory`).
    EmptyTrajectory,
    /// The trajectory has more points than allowed (code `too_many_points`).
    TooManyPoints {
        /// The limit.
        max: usize,
    },
}

impl TrajectoryError {
    /// The stable, machine-readable code.
    pub fn code(&self) -> &'static str {
        match self {
            TrajectoryError::InvalidCsv { .. } => "invalid_csv",
            TrajectoryError::InvalidJson(_) => "invalid_json",
            TrajectoryError::InvalidGpx(_) => "invalid_gpx",
            TrajectoryError::InvalidGeojson(_) => "invalid_geojson",
            TrajectoryError::InvalidInterval(_) => "invalid_interval",
            TrajectoryError::EmptyTrajectory => "empty_trajectory",
            TrajectoryError::TooManyPoints { .. } => "too_many_points",
        }
    }

    /// The human-readable message (same as `Display`).
    pub fn message(&self) -> String {
        self.to_string()
    }

    pub(crate) fn csv(
        line: usize,
        field: Option<&'static str>,
        message: impl Into<String>,
    ) -> Self {
        TrajectoryError::InvalidCsv {
            line,
            field,
            message: message.into(),
        }
    }
}

impl fmt::Display for TrajectoryError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TrajectoryError::InvalidCsv {
                line,
                field: Some(field),
                message,
            } => write!(f, "line {line}, field {field}: {message}"),
            TrajectoryError::InvalidCsv {
                line,
                field: None,
                message,
            } => write!(f, "line {line}: {message}"),
            TrajectoryError::InvalidJson(m)
            | TrajectoryError::InvalidGpx(m)
            | TrajectoryError::InvalidGeojson(m)
            | TrajectoryError::InvalidInterval(m) => f.write_str(m),
            TrajectoryError::EmptyTrajectory => f.write_str("the trajectory has no points"),
            TrajectoryError::TooManyPoints { max } => {
                write!(f, "the trajectory has more than {max} points")
            }
        }
    }
}

impl std::error::Error for TrajectoryError {}
