//! GeoJSON output.

use serde_json::{json, Value};

use crate::{Filter, Point};

/// Integral timestamps below this magnitude are written as JSON integers.
const MAX_EXACT_INT: f64 = 9_007_199_254_740_992.0; // 2^53

/// Renders a filtered trajectory as a GeoJSON `FeatureCollection` with one
/// `Feature`:
///
/// - `geometry`: a `LineString` of `[lon, lat]` positions (GeoJSON order), one
///   per point; a single point is a `Point` geometry instead, since a GeoJSON
///   `LineString` needs at least two positions.
/// - `properties`: `timestamps` (one per position, integral values as JSON
///   integers; only when the input was `timed`: an untimed track has none),
///   `filter` (`"mean"` or `"median"`), `interval` (`w`) and `points` (the
///   count).
pub fn to_geojson(points: &[Point], timed: bool, filter: Filter, interval: usize) -> Value {
    let positions: Vec<Value> = points.iter().map(|p| json!([p.lon, p.lat])).collect();
    let geometry = match positions.as_slice() {
        [one] => json!({"type": "Point", "coordinates": one}),
        _ => json!({"type": "LineString", "coordinates": positions}),
    };
    let mut properties = serde_json::Map::new();
    if timed {
        let timestamps: Vec<Value> = points.iter().map(|p| timestamp(p.t)).collect();
        properties.insert("timestamps".into(), Value::Array(timestamps));
    }
    properties.insert("filter".into(), json!(filter.as_str()));
    properties.insert("interval".into(), json!(interval));
    properties.insert("points".into(), json!(points.len()));
    json!({
        "type": "FeatureCollection",
        "features": [{
            "type": "Feature",
            "geometry": geometry,
            "properties": properties,
        }],
    })
}

fn timestamp(t: f64) -> Value {
    if t.fract() == 0.0 && t.abs() < MAX_EXACT_INT {
        json!(t as i64)
    } else {
        json!(t)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn line_string_in_lon_lat_order_with_properties() {
        let pts = [
            Point {
                t: 1_700_000_000_000.0,
                lat: 57.5,
                lon: 9.25,
            },
            Point {
                t: 1_700_000_000_500.5,
                lat: -1.0,
                lon: 170.0,
            },
        ];
        assert_eq!(
            to_geojson(&pts, true, Filter::Median, 3),
            json!({
                "type": "FeatureCollection",
                "features": [{
                    "type": "Feature",
                    "geometry": {"type": "LineString", "coordinates": [[9.25, 57.5], [170.0, -1.0]]},
                    "properties": {
                        "timestamps": [1_700_000_000_000i64, 1_700_000_000_500.5],
                        "filter": "median",
                        "interval": 3,
                        "points": 2,
                    },
                }],
            })
        );
    }

    #[test]
    fn one_point_is_a_point_geometry() {
        let v = to_geojson(
            &[Point {
                t: 2.0,
                lat: 1.0,
                lon: 2.0,
            }],
            true,
            Filter::Mean,
            1,
        );
        assert_eq!(
            v["features"][0]["geometry"],
            json!({"type": "Point", "coordinates": [2.0, 1.0]})
        );
        assert_eq!(v["features"][0]["properties"]["timestamps"], json!([2]));
        assert_eq!(v["features"][0]["properties"]["filter"], "mean");
    }
}
