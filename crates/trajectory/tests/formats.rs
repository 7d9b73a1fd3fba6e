//! The same track in every input format gives the same answer.

use plaza_trajectory::{
    apply, parse_csv, parse_geojson, parse_gpx, parse_json, to_geojson, Filter, Point, Track,
};
use proptest::prelude::*;
use serde_json::{json, Value};
use time::format_description::well_known::Rfc3339;
use time::OffsetDateTime;

/// A track of `n` points with times in whole milliseconds (as GPX writes them).
fn tracks() -> impl Strategy<Value = Vec<Point>> {
    prop::collection::vec((0u64..5_000, -89.0f64..89.0, -179.0f64..179.0), 1..60).prop_map(
        |steps| {
            let mut t = 1_700_000_000_000u64;
            steps
                .into_iter()
                .map(|(dt, lat, lon)| {
                    t += dt;
                    Point {
                        t: t as f64,
                        lat,
                        lon,
                    }
                })
                .collect()
        },
    )
}

fn as_csv(points: &[Point]) -> String {
    let mut s = String::from("time,latitude,longitude\n");
    for p in points {
        s.push_str(&format!("{},{},{}\n", p.t, p.lat, p.lon));
    }
    s
}

fn as_json(points: &[Point]) -> String {
    json!({"points": points}).to_string()
}

fn as_gpx(points: &[Point]) -> String {
    let mut s = String::from(
        r#"<?xml version="1.0" encoding="UTF-8"?><gpx version="1.1" creator="t" xmlns="http://www.topografix.com/GPX/1/1"><trk><trkseg>"#,
    );
    for p in points {
        let time = OffsetDateTime::from_unix_timestamp_nanos(p.t as i128 * 1_000_000)
            .unwrap()
            .format(&Rfc3339)
            .unwrap();
        s.push_str(&format!(
            r#"<trkpt lat="{}" lon="{}"><time>{time}</time></trkpt>"#,
            p.lat, p.lon
        ));
    }
    s.push_str("</trkseg></trk></gpx>");
    s
}

fn as_geojson(points: &[Point]) -> String {
    let coordinates: Vec<Value> = points.iter().map(|p| json!([p.lon, p.lat])).collect();
    let times: Vec<f64> = points.iter().map(|p| p.t).collect();
    json!({
        "type": "Feature",
        "geometry": {"type": "LineString", "coordinates": coordinates},
        "properties": {"timestamps": times},
    })
    .to_string()
}

fn answer(track: &Track, filter: Filter, w: usize) -> Value {
    let filtered = apply(filter, &track.points, w).unwrap();
    to_geojson(&filtered, track.timed, filter, w)
}

proptest! {
    #[test]
    fn every_format_of_one_track_gives_one_answer(points in tracks(), w in 1usize..12, median in any::<bool>()) {
        let filter = if median { Filter::Median } else { Filter::Mean };
        let csv = parse_csv(&as_csv(&points)).unwrap();
        let from_json = parse_json(as_json(&points).as_bytes()).unwrap().track;
        let gpx = parse_gpx(as_gpx(&points).as_bytes()).unwrap();
        let geojson = parse_geojson(as_geojson(&points).as_bytes()).unwrap();
        prop_assert_eq!(&csv.points, &points);
        let expected = answer(&csv, filter, w);
        prop_assert_eq!(&answer(&from_json, filter, w), &expected);
        prop_assert_eq!(&answer(&gpx, filter, w), &expected);
        prop_assert_eq!(&answer(&geojson, filter, w), &expected);
    }

    #[test]
    fn without_times_every_format_keeps_the_order_and_answers_without_timestamps(points in tracks(), w in 1usize..12) {
        let csv_text: String = std::iter::once("lat,long\n".to_owned())
            .chain(points.iter().map(|p| format!("{},{}\n", p.lat, p.lon)))
            .collect();
        let untimed: Vec<Value> = points.iter().map(|p| json!({"lat": p.lat, "lon": p.lon})).collect();
        let csv = parse_csv(&csv_text).unwrap();
        let from_json = parse_json(json!({"points": untimed}).to_string().as_bytes()).unwrap().track;
        let csv_data = parse_json(json!({"csv_data": csv_text, "interval": w}).to_string().as_bytes()).unwrap().track;
        let coordinates: Vec<Value> = points.iter().map(|p| json!([p.lon, p.lat])).collect();
        let geojson = parse_geojson(json!({"type": "LineString", "coordinates": coordinates}).to_string().as_bytes()).unwrap();
        let expected = answer(&csv, Filter::Mean, w);
        prop_assert!(expected["features"][0]["properties"].get("timestamps").is_none());
        for track in [&from_json, &csv_data, &geojson] {
            prop_assert!(!track.timed);
            prop_assert_eq!(&answer(track, Filter::Mean, w), &expected);
        }
    }
}
