//! Reading a trajectory request's JSON body: points, or the CSV text of
//! source document 001's load-test client (`{"csv_data": "lat,long\n…", "interval": 10}`).

use serde::Deserialize;
use serde_json::Value;

use crate::csv_input::{parse_csv_with, CsvOptions};
use crate::values::check_point;
use crate::{Point, Track, TrajectoryError, MAX_INTERVAL, MAX_POINTS};

/// A JSON trajectory request.
#[derive(Debug, Clone, PartialEq)]
pub struct JsonRequest {
    /// The track, validated like CSV rows.
    pub track: Track,
    /// The `interval` member, if present and not `null` (not yet range-checked:
    /// see [`check_interval`](crate::check_interval)).
    pub interval: Option<u64>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRequest {
    #[serde(default)]
    points: Option<Vec<RawPoint>>,
    #[serde(default)]
    csv_data: Option<String>,
    #[serde(default)]
    interval: Value,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawPoint {
    #[serde(default)]
    t: Option<f64>,
    lat: f64,
    lon: f64,
}

/// Parses a JSON request with at most [`MAX_POINTS`] points; see [`parse_json_with_max`].
pub fn parse_json(body: &[u8]) -> Result<JsonRequest, TrajectoryError> {
    parse_json_with_max(body, MAX_POINTS)
}

/// Parses a JSON request with at most `max_points` points. The body is an
/// object with exactly one of
///
/// - `points`: `[{"t": .., "lat": .., "lon": ..}, ...]`, `t` optional (all
///   points have it or none; without it the track is untimed);
/// - `csv_data`: CSV text, read as [`parse_csv_with`] reads a CSV body
///   (source document 001's client sends `lat,long` rows this way);
///
/// and an optional `interval` (`null` counts as absent). Unknown members are
/// refused, in the object and in each point. Points are validated like CSV
/// rows, errors naming the point, e.g. `points[2].lat: 91 is out of range
/// [-90, 90]`; errors in `csv_data` are [`TrajectoryError::InvalidCsv`] with
/// its line. A non-integer `interval` is [`TrajectoryError::InvalidInterval`];
/// everything else is [`TrajectoryError::InvalidJson`] or
/// [`TrajectoryError::TooManyPoints`].
pub fn parse_json_with_max(body: &[u8], max_points: usize) -> Result<JsonRequest, TrajectoryError> {
    // serde would also read a struct from an array (fields by position).
    if body.trim_ascii_start().first() != Some(&b'{') {
        return Err(TrajectoryError::InvalidJson(
            "the body must be a JSON object {\"points\": [...], \"interval\": N} or {\"csv_data\": \"...\", \"interval\": N}".into(),
        ));
    }
    let raw: RawRequest = serde_json::from_slice(body)
        .map_err(|e| TrajectoryError::InvalidJson(format!("invalid JSON body: {e}")))?;
    let interval = match &raw.interval {
        Value::Null => None,
        v => Some(v.as_u64().ok_or_else(|| {
            TrajectoryError::InvalidInterval(format!(
                "interval must be an integer from 1 to {MAX_INTERVAL}, got {v}"
            ))
        })?),
    };
    let track =
        match (raw.points, raw.csv_data) {
            (Some(points), None) => points_track(points, max_points)?,
            (None, Some(csv)) => parse_csv_with(&csv, CsvOptions::default(), max_points)?,
            (Some(_), Some(_)) => {
                return Err(TrajectoryError::InvalidJson(
                    "give either points or csv_data, not both".into(),
                ))
            }
            (None, None) => return Err(TrajectoryError::InvalidJson(
                "the body needs points ([{\"t\", \"lat\", \"lon\"}, ...]) or csv_data (CSV text)"
                    .into(),
            )),
        };
    Ok(JsonRequest { track, interval })
}

fn points_track(raw: Vec<RawPoint>, max_points: usize) -> Result<Track, TrajectoryError> {
    if raw.len() > max_points {
        return Err(TrajectoryError::TooManyPoints { max: max_points });
    }
    let timed = raw.first().is_some_and(|p| p.t.is_some());
    let mut points: Vec<Point> = Vec::with_capacity(raw.len());
    for (i, p) in raw.into_iter().enumerate() {
        let t = match (p.t, timed) {
            (Some(t), true) => t,
            (None, false) => i as f64,
            (None, true) => {
                return Err(TrajectoryError::InvalidJson(format!(
                "points[{i}].t: missing, but points[0] has one (give t to every point or to none)"
            )))
            }
            (Some(_), false) => {
                return Err(TrajectoryError::InvalidJson(format!(
                    "points[{i}].t: points[0] has none (give t to every point or to none)"
                )))
            }
        };
        let point = Point {
            t,
            lat: p.lat,
            lon: p.lon,
        };
        check_point(&point, timed).map_err(|(field, m)| {
            let key = if field == "timestamp" { "t" } else { field };
            TrajectoryError::InvalidJson(format!("points[{i}].{key}: {m}"))
        })?;
        if let (Some(prev), true) = (points.last(), timed) {
            if point.t < prev.t {
                return Err(TrajectoryError::InvalidJson(format!(
                    "points[{i}].t: {} is before the timestamp {} of points[{}]; timestamps must not decrease",
                    point.t,
                    prev.t,
                    i - 1
                )));
            }
        }
        points.push(point);
    }
    Ok(Track { points, timed })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(t: f64, lat: f64, lon: f64) -> Point {
        Point { t, lat, lon }
    }

    #[test]
    fn json_request() {
        let r = parse_json(br#" {"points": [{"t": 1, "lat": 2, "lon": 3}, {"t": 1.5, "lat": -2, "lon": 3.5}], "interval": 3}"#).unwrap();
        assert_eq!(r.track.points, vec![p(1.0, 2.0, 3.0), p(1.5, -2.0, 3.5)]);
        assert!(r.track.timed);
        assert_eq!(r.interval, Some(3));
        let r = parse_json(br#"{"points": [], "interval": null}"#).unwrap();
        assert_eq!((r.track.points.len(), r.interval), (0, None));
    }

    #[test]
    fn json_errors() {
        let code = |b: &str| parse_json(b.as_bytes()).unwrap_err().code();
        assert_eq!(code(""), "invalid_json");
        assert_eq!(code("[]"), "invalid_json");
        assert_eq!(code(r#"[[{"t":1,"lat":0,"lon":0}], 3]"#), "invalid_json");
        assert_eq!(code(r#"{"interval": 3}"#), "invalid_json");
        assert_eq!(code(r#"{"points": [{"t":1,"lat":0}]}"#), "invalid_json");
        assert_eq!(
            code(r#"{"points": [{"t":1,"lat":0,"lon":0,"x":1}]}"#),
            "invalid_json"
        );
        assert_eq!(code(r#"{"points": [], "extra": 1}"#), "invalid_json");
        assert_eq!(
            code(r#"{"points": [{"t":1,"lat":"0","lon":0}]}"#),
            "invalid_json"
        );
        assert_eq!(
            code(r#"{"points": [], "interval": -1}"#),
            "invalid_interval"
        );
        assert_eq!(
            code(r#"{"points": [], "interval": 2.5}"#),
            "invalid_interval"
        );
        assert_eq!(
            code(r#"{"points": [], "interval": "3"}"#),
            "invalid_interval"
        );
        let e = parse_json(br#"{"points": [{"t":1,"lat":0,"lon":0},{"t":2,"lat":91,"lon":0}]}"#)
            .unwrap_err();
        assert_eq!(e.to_string(), "points[1].lat: 91 is out of range [-90, 90]");
        let e = parse_json(br#"{"points": [{"t":2,"lat":0,"lon":0},{"t":1,"lat":0,"lon":0}]}"#)
            .unwrap_err();
        assert_eq!(
            e.to_string(),
            "points[1].t: 1 is before the timestamp 2 of points[0]; timestamps must not decrease"
        );
        assert_eq!(
            parse_json_with_max(
                br#"{"points": [{"t":1,"lat":0,"lon":0},{"t":2,"lat":0,"lon":0}]}"#,
                1
            ),
            Err(TrajectoryError::TooManyPoints { max: 1 })
        );
    }

    #[test]
    fn the_documents_request_shape_csv_data_with_interval() {
        let body = br#"{"csv_data": "lat,long\n56.2568605075,10.0688809242\n56.25,10.07\n", "interval": 10}"#;
        let r = parse_json(body).unwrap();
        assert_eq!(r.interval, Some(10));
        assert!(!r.track.timed);
        assert_eq!(r.track.points[0], p(0.0, 56.2568605075, 10.0688809242));
        let e = parse_json(br#"{"csv_data": "lat,long\n1,x\n", "interval": 10}"#).unwrap_err();
        assert_eq!(e.code(), "invalid_csv");
        assert_eq!(e.to_string(), "line 2, field lon: \"x\" is not a number");
        let code = |b: &str| parse_json(b.as_bytes()).unwrap_err().code();
        assert_eq!(
            code(r#"{"csv_data": "lat,lon\n1,2\n", "points": []}"#),
            "invalid_json"
        );
        assert_eq!(code(r#"{"csv_data": 5}"#), "invalid_json");
    }

    #[test]
    fn points_without_times_are_untimed_and_all_or_none_have_one() {
        let r = parse_json(br#"{"points": [{"lat": 1, "lon": 2}, {"lat": 3, "lon": 4}]}"#).unwrap();
        assert!(!r.track.timed);
        assert_eq!(r.track.points, vec![p(0.0, 1.0, 2.0), p(1.0, 3.0, 4.0)]);
        let e = parse_json(br#"{"points": [{"t": 1, "lat": 1, "lon": 2}, {"lat": 3, "lon": 4}]}"#)
            .unwrap_err();
        assert!(e.to_string().starts_with("points[1].t: missing"), "{e}");
        let e = parse_json(br#"{"points": [{"lat": 1, "lon": 2}, {"t": 1, "lat": 3, "lon": 4}]}"#)
            .unwrap_err();
        assert!(
            e.to_string().starts_with("points[1].t: points[0] has none"),
            "{e}"
        );
    }
}
