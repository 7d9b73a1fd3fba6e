//! Trajectory filtering, free of I/O.
//!
//! A trajectory is a [`Track`]: a list of [`Point`]s (time, latitude,
//! longitude) read from the formats people's GPS data comes in — CSV with named
//! columns ([`parse_csv`]), JSON points or CSV text in JSON ([`parse_json`]),
//! GPX ([`parse_gpx`]) and GeoJSON ([`parse_geojson`]) — timed or not.
//! [`mean`] and [`median`] smooth latitude and longitude independently over a
//! centered sliding window of `w` points (see [`window`] for the exact
//! definition) and keep the times; [`to_geojson`] renders the result as a
//! GeoJSON `FeatureCollection` with one `LineString`.
//!
//! Every failure is a [`TrajectoryError`] with a stable [`code`](TrajectoryError::code)
//! and a message naming where the input went wrong (line and field for CSV,
//! point index and field for JSON, GPX and GeoJSON).

mod csv_input;
mod error;
mod filter;
mod geojson;
mod geojson_input;
mod gpx_input;
mod json_input;
mod values;

pub use csv_input::{parse_csv, parse_csv_bytes, parse_csv_with, CsvOptions};
pub use error::TrajectoryError;
pub use filter::{apply, mean, median, window};
pub use geojson::to_geojson;
pub use geojson_input::{parse_geojson, parse_geojson_with_max};
pub use gpx_input::{parse_gpx, parse_gpx_with_max};
pub use json_input::{parse_json, parse_json_with_max, JsonRequest};

/// The largest accepted window size (`interval`).
pub const MAX_INTERVAL: usize = 10_000;

/// The largest number of points the parsers accept.
pub const MAX_POINTS: usize = 1_000_000;

/// A trajectory as read: its points, in order, and whether the input gave
/// their times.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Track {
    /// The points. In an untimed track, `t` is the point's index.
    pub points: Vec<Point>,
    /// Whether the points carry the input's times (the answer then lists
    /// them); an input without times keeps the points' order.
    pub timed: bool,
}

/// One trajectory point.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Point {
    /// Time: a number as the input gave it (seconds or milliseconds), or Unix
    /// milliseconds for date-times; the index in an untimed [`Track`].
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
