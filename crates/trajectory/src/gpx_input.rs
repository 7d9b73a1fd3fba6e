//! Reading trajectories from GPX 1.1 (and 1.0), as every watch, phone and
//! cycling app exports them. The `gpx` crate (georust) parses the XML: it
//! knows the schema's elements and time formats, which a hand-written reader
//! would have to relearn.

use crate::values::{check_point, unix_ms};
use crate::{Point, Track, TrajectoryError, MAX_POINTS};

/// Parses GPX with at most [`MAX_POINTS`] points; see [`parse_gpx_with_max`].
pub fn parse_gpx(body: &[u8]) -> Result<Track, TrajectoryError> {
    parse_gpx_with_max(body, MAX_POINTS)
}

/// Parses the track points (`trkpt`) of a GPX document with at most
/// `max_points` points. Every segment of every track is joined, in document
/// order, into one trajectory (a pause that splits a recording into segments
/// does not split what is smoothed). The track is timed when every point has a
/// `time` (read as Unix milliseconds), untimed otherwise; routes and waypoints
/// are ignored.
///
/// Errors: [`TrajectoryError::InvalidGpx`] for XML or GPX the parser refuses
/// and for points out of range or with decreasing times (naming the point,
/// counted from 0 over the joined track), [`TrajectoryError::EmptyTrajectory`]
/// when there is no track point, [`TrajectoryError::TooManyPoints`].
pub fn parse_gpx_with_max(body: &[u8], max_points: usize) -> Result<Track, TrajectoryError> {
    let gpx =
        gpx::read(body).map_err(|e| TrajectoryError::InvalidGpx(format!("invalid GPX: {e}")))?;
    let waypoints: Vec<&gpx::Waypoint> = gpx
        .tracks
        .iter()
        .flat_map(|t| &t.segments)
        .flat_map(|s| &s.points)
        .collect();
    if waypoints.is_empty() {
        return Err(TrajectoryError::EmptyTrajectory);
    }
    if waypoints.len() > max_points {
        return Err(TrajectoryError::TooManyPoints { max: max_points });
    }
    let timed = waypoints.iter().all(|w| w.time.is_some());
    let mut points: Vec<Point> = Vec::with_capacity(waypoints.len());
    for (i, w) in waypoints.into_iter().enumerate() {
        let position = w.point();
        let t = match (timed, w.time) {
            (true, Some(time)) => unix_ms(time.into()),
            _ => i as f64,
        };
        let p = Point {
            t,
            lat: position.y(),
            lon: position.x(),
        };
        check_point(&p, timed).map_err(|(field, m)| {
            TrajectoryError::InvalidGpx(format!("track point {i}, {field}: {m}"))
        })?;
        if let (Some(prev), true) = (points.last(), timed) {
            if p.t < prev.t {
                return Err(TrajectoryError::InvalidGpx(format!(
                    "track point {i}: its time is before the time of track point {}; times must not decrease",
                    i - 1
                )));
            }
        }
        points.push(p);
    }
    Ok(Track { points, timed })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gpx(body: &str) -> String {
        format!(
            r#"<?xml version="1.0" encoding="UTF-8"?>
<gpx version="1.1" creator="test" xmlns="http://www.topografix.com/GPX/1/1">{body}</gpx>"#
        )
    }

    #[test]
    fn track_points_of_every_segment_joined_with_their_times() {
        let doc = gpx(r#"<trk><name>run</name>
          <trkseg><trkpt lat="56.25" lon="10.5"><ele>12</ele><time>2023-11-14T22:13:20Z</time></trkpt></trkseg>
          <trkseg><trkpt lat="56.5" lon="10.75"><time>2023-11-14T22:13:21.5Z</time></trkpt></trkseg>
        </trk>"#);
        let track = parse_gpx(doc.as_bytes()).unwrap();
        assert!(track.timed);
        assert_eq!(
            track.points,
            vec![
                Point {
                    t: 1_700_000_000_000.0,
                    lat: 56.25,
                    lon: 10.5
                },
                Point {
                    t: 1_700_000_001_500.0,
                    lat: 56.5,
                    lon: 10.75
                },
            ]
        );
    }

    #[test]
    fn points_without_time_make_an_untimed_track() {
        let doc = gpx(
            r#"<trk><trkseg><trkpt lat="1" lon="2"/><trkpt lat="3" lon="4"><time>2023-11-14T22:13:20Z</time></trkpt></trkseg></trk>"#,
        );
        let track = parse_gpx(doc.as_bytes()).unwrap();
        assert!(!track.timed);
        assert_eq!(
            track.points[1],
            Point {
                t: 1.0,
                lat: 3.0,
                lon: 4.0
            }
        );
    }

    #[test]
    fn errors() {
        assert_eq!(
            parse_gpx(gpx("<wpt lat=\"1\" lon=\"2\"/>").as_bytes()),
            Err(TrajectoryError::EmptyTrajectory)
        );
        let e = parse_gpx(b"<gpx><trk>").unwrap_err();
        assert_eq!(e.code(), "invalid_gpx");
        let e = parse_gpx(b"not xml at all").unwrap_err();
        assert_eq!(e.code(), "invalid_gpx");
        let doc = gpx(
            r#"<trk><trkseg><trkpt lat="1" lon="2"><time>2023-11-14T22:13:21Z</time></trkpt><trkpt lat="1" lon="2"><time>2023-11-14T22:13:20Z</time></trkpt></trkseg></trk>"#,
        );
        let e = parse_gpx(doc.as_bytes()).unwrap_err();
        assert_eq!(e.code(), "invalid_gpx");
        assert!(e.to_string().contains("track point 1"), "{e}");
        let doc =
            gpx(r#"<trk><trkseg><trkpt lat="1" lon="2"/><trkpt lat="1" lon="3"/></trkseg></trk>"#);
        assert_eq!(
            parse_gpx_with_max(doc.as_bytes(), 1),
            Err(TrajectoryError::TooManyPoints { max: 1 })
        );
    }
}
