//! Reading trajectories from GeoJSON (RFC 7946). The `geojson` crate (georust)
//! reads the document and its geometry types; which shapes make a trajectory
//! is decided here.

use geojson::{GeoJson, GeometryValue, JsonObject};
use serde_json::Value;

use crate::values::{check_point, parse_time};
use crate::{Point, Track, TrajectoryError, MAX_POINTS};

/// Property names holding one time per position (`coordTimes` is what GPX and
/// KML converters write; `timestamps` is what this service answers with).
const TIME_PROPERTIES: [&str; 3] = ["timestamps", "coordTimes", "times"];

/// Parses GeoJSON with at most [`MAX_POINTS`] points; see [`parse_geojson_with_max`].
pub fn parse_geojson(body: &[u8]) -> Result<Track, TrajectoryError> {
    parse_geojson_with_max(body, MAX_POINTS)
}

/// Parses a GeoJSON `LineString`, a `Feature` with one, or a
/// `FeatureCollection` of exactly one such feature (this service's own answer
/// reads back), with at most `max_points` positions. Positions are
/// `[lon, lat]` (an altitude is ignored). The track is timed when the
/// feature's properties hold one time per position under `timestamps`,
/// `coordTimes` or `times` (numbers as given, ISO 8601 strings as Unix
/// milliseconds); untimed otherwise.
///
/// Errors: [`TrajectoryError::InvalidGeojson`] naming what is wrong (the
/// position, counted from 0), [`TrajectoryError::TooManyPoints`].
pub fn parse_geojson_with_max(body: &[u8], max_points: usize) -> Result<Track, TrajectoryError> {
    let invalid = |m: String| TrajectoryError::InvalidGeojson(m);
    let text = std::str::from_utf8(body).map_err(|_| invalid("the body is not UTF-8".into()))?;
    let doc: GeoJson = text
        .parse()
        .map_err(|e| invalid(format!("invalid GeoJSON: {e}")))?;
    let (geometry, properties) = match doc {
        GeoJson::Geometry(g) => (Some(g), None),
        GeoJson::Feature(f) => (f.geometry, f.properties),
        GeoJson::FeatureCollection(c) => {
            let count = c.features.len();
            let mut features = c.features.into_iter();
            match (features.next(), count) {
                (Some(f), 1) => (f.geometry, f.properties),
                _ => {
                    return Err(invalid(format!(
                    "a FeatureCollection must hold exactly one feature (a LineString), not {count}"
                )))
                }
            }
        }
    };
    let coordinates = match geometry.map(|g| g.value) {
        Some(GeometryValue::LineString { coordinates }) => coordinates,
        Some(other) => {
            return Err(invalid(format!(
                "the geometry must be a LineString, not a {}",
                other.type_name()
            )))
        }
        None => return Err(invalid("the feature has no geometry".into())),
    };
    if coordinates.len() > max_points {
        return Err(TrajectoryError::TooManyPoints { max: max_points });
    }
    let times = times(properties.as_ref(), coordinates.len())?;
    let timed = times.is_some();
    let mut points: Vec<Point> = Vec::with_capacity(coordinates.len());
    for (i, position) in coordinates.iter().enumerate() {
        let (lon, lat) = match position.as_slice() {
            [lon, lat, ..] => (*lon, *lat),
            _ => return Err(invalid(format!("position {i} has fewer than two numbers"))),
        };
        let t = times.as_ref().map_or(i as f64, |t| t[i]);
        let p = Point { t, lat, lon };
        check_point(&p, timed)
            .map_err(|(field, m)| invalid(format!("position {i}, {field}: {m}")))?;
        if let (Some(prev), true) = (points.last(), timed) {
            if p.t < prev.t {
                return Err(invalid(format!(
                    "position {i}: time {} is before the time {} of position {}; times must not decrease",
                    p.t,
                    prev.t,
                    i - 1
                )));
            }
        }
        points.push(p);
    }
    Ok(Track { points, timed })
}

/// The times of the positions, if the properties hold one per position.
fn times(
    properties: Option<&JsonObject>,
    count: usize,
) -> Result<Option<Vec<f64>>, TrajectoryError> {
    let Some((name, values)) = properties.and_then(|p| {
        TIME_PROPERTIES
            .iter()
            .find_map(|name| p.get(*name).map(|v| (*name, v)))
    }) else {
        return Ok(None);
    };
    let Value::Array(values) = values else {
        return Err(TrajectoryError::InvalidGeojson(format!(
            "properties.{name} must be an array of times"
        )));
    };
    if values.len() != count {
        return Err(TrajectoryError::InvalidGeojson(format!(
            "properties.{name} has {} times for {count} positions",
            values.len()
        )));
    }
    values
        .iter()
        .enumerate()
        .map(|(i, v)| {
            let parsed = match v {
                Value::Number(n) => n.as_f64().ok_or_else(|| format!("{n} is not a number")),
                Value::String(s) => parse_time(s),
                other => Err(format!("{other} is not a number or a date-time")),
            };
            parsed.map_err(|m| {
                TrajectoryError::InvalidGeojson(format!("properties.{name}[{i}]: {m}"))
            })
        })
        .collect::<Result<Vec<f64>, _>>()
        .map(Some)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(t: f64, lat: f64, lon: f64) -> Point {
        Point { t, lat, lon }
    }

    #[test]
    fn a_line_string_a_feature_and_a_collection_of_one() {
        let line = r#"{"type": "LineString", "coordinates": [[10.5, 56.25, 12], [10.75, 56.5]]}"#;
        let track = parse_geojson(line.as_bytes()).unwrap();
        assert!(!track.timed);
        assert_eq!(track.points, vec![p(0.0, 56.25, 10.5), p(1.0, 56.5, 10.75)]);
        let feature = format!(
            r#"{{"type": "Feature", "geometry": {line}, "properties": {{"coordTimes": ["2023-11-14T22:13:20Z", "2023-11-14T22:13:21Z"]}}}}"#
        );
        let track = parse_geojson(feature.as_bytes()).unwrap();
        assert!(track.timed);
        assert_eq!(track.points[1], p(1_700_000_001_000.0, 56.5, 10.75));
        let collection = format!(
            r#"{{"type": "FeatureCollection", "features": [{{"type": "Feature", "geometry": {line}, "properties": {{"timestamps": [5, 6]}}}}]}}"#
        );
        let track = parse_geojson(collection.as_bytes()).unwrap();
        assert_eq!(track.points[0], p(5.0, 56.25, 10.5));
    }

    #[test]
    fn this_services_answer_reads_back() {
        let pts = [p(1.0, 56.25, 10.5), p(2.0, 56.5, 10.75)];
        let answer = crate::to_geojson(&pts, true, crate::Filter::Mean, 1).to_string();
        let track = parse_geojson(answer.as_bytes()).unwrap();
        assert_eq!(track.points, pts);
        assert!(track.timed);
    }

    #[test]
    fn errors() {
        let err = |b: &str| parse_geojson(b.as_bytes()).unwrap_err();
        assert_eq!(err("{").code(), "invalid_geojson");
        assert!(err(r#"{"type": "Point", "coordinates": [1, 2]}"#)
            .to_string()
            .contains("not a Point"));
        assert!(err(r#"{"type": "FeatureCollection", "features": []}"#)
            .to_string()
            .contains("exactly one feature"));
        assert!(
            err(r#"{"type": "Feature", "geometry": null, "properties": {}}"#)
                .to_string()
                .contains("no geometry")
        );
        let e = err(r#"{"type": "LineString", "coordinates": [[0, 0], [0, 91]]}"#);
        assert_eq!(
            e.to_string(),
            "position 1, lat: 91 is out of range [-90, 90]"
        );
        let e = err(
            r#"{"type": "Feature", "geometry": {"type": "LineString", "coordinates": [[0, 0], [0, 1]]}, "properties": {"times": [1]}}"#,
        );
        assert!(e.to_string().contains("1 times for 2 positions"), "{e}");
        let e = err(
            r#"{"type": "Feature", "geometry": {"type": "LineString", "coordinates": [[0, 0], [0, 1]]}, "properties": {"times": [2, 1]}}"#,
        );
        assert!(e.to_string().contains("times must not decrease"), "{e}");
        assert_eq!(
            parse_geojson_with_max(
                br#"{"type": "LineString", "coordinates": [[0, 0], [0, 1]]}"#,
                1
            ),
            Err(TrajectoryError::TooManyPoints { max: 1 })
        );
    }
}
