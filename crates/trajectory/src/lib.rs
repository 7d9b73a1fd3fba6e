//! Trajectory filtering, free of I/O.
//!
//! A trajectory is a list of [`Point`]s (timestamp, latitude, longitude) read
//! from CSV ([`parse_csv`]) or JSON ([`parse_json`]). [`mean`] and [`median`]
//! smooth latitude and longitude independently over a centered sliding window of
//! `w` points (see [`window`] for the exact definition) and keep the
//! timestamps; [`to_geojson`] renders the result as a GeoJSON
//! `FeatureCollection` with one `LineString`.
//!
//! Every failure is a [`TrajectoryError`] with a stable [`code`](TrajectoryError::code)
//! and a message naming where the input went wrong (line and field for CSV,
//! point index and field for JSON).

mod error;
mod filter;
mod geojson;
mod parse;

pub use error::TrajectoryError;
pub use filter::{apply, mean, median, window};
pub use geojson::to_geojson;
pub use parse::{
    parse_csv, parse_csv_bytes, parse_csv_with_max, parse_json, parse_json_with_max, JsonRequest,
};

/// The largest accepted window size (`interval`).
pub const MAX_INTERVAL: usize = 10_000;

/// The largest number of points [`parse_csv`] and [`parse_json`] accept.
pub const MAX_POINTS: usize = 1_000_000;

/// One trajectory point.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Point {
    /// Timestamp, in whatever unit the input used (seconds or milliseconds); kept as given.
    pub t: f64,
    /// Latitude in degrees, in [-90, 90].
    pub lat: f64,
    /// Longitude in degrees, in [-180, 180].
    pub lon: f64,
}

/// Which filter to apply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Filter {
    /// The arithmetic mean of each window.
    Mean,
    /// The median of each window (mean of the two middle values for an even count).
    Median,
}

impl Filter {
    /// The filter's name as it appears in URLs and in the GeoJSON properties.
    pub fn as_str(self) -> &'static str {
        match self {
            Filter::Mean => "mean",
            Filter::Median => "median",
        }
    }
}

/// Checks that `interval` is a usable window size: 1 ≤ `interval` ≤ [`MAX_INTERVAL`].
pub fn check_interval(interval: u64) -> Result<usize, TrajectoryError> {
    match usize::try_from(interval) {
        Ok(w) if (1..=MAX_INTERVAL).contains(&w) => Ok(w),
        _ => Err(TrajectoryError::InvalidInterval(format!(
            "interval must be an integer from 1 to {MAX_INTERVAL}, got {interval}"
        ))),
    }
}
