//! Reading trajectories from CSV and JSON.

use serde::Deserialize;
use serde_json::Value;

use crate::{Point, TrajectoryError, MAX_INTERVAL, MAX_POINTS};

/// The CSV columns, in order.
const FIELDS: [&str; 3] = ["timestamp", "lat", "lon"];

/// At most this many characters of a bad value are quoted in an error message.
const QUOTE_CHARS: usize = 32;

/// Parses CSV rows `timestamp,lat,lon` with at most [`MAX_POINTS`] points.
///
/// See [`parse_csv_with_max`].
pub fn parse_csv(text: &str) -> Result<Vec<Point>, TrajectoryError> {
    parse_csv_with_max(text, MAX_POINTS)
}

/// Parses CSV bytes as [`parse_csv`] does; bytes that are not UTF-8 are an
/// [`TrajectoryError::InvalidCsv`] naming the line they are on.
pub fn parse_csv_bytes(body: &[u8]) -> Result<Vec<Point>, TrajectoryError> {
    let text = std::str::from_utf8(body).map_err(|e| {
        let valid = &body[..e.valid_up_to()];
        TrajectoryError::InvalidCsv {
            line: valid.iter().filter(|&&b| b == b'\n').count() + 1,
            field: None,
            message: "not valid UTF-8".into(),
        }
    })?;
    parse_csv(text)
}

/// Parses CSV rows `timestamp,lat,lon` with at most `max_points` points.
///
/// - The first non-blank line may be a header: exactly the three names
///   `timestamp`, `lat`, `lon` in this order, in any case. A first line with no
///   numeric field that is not that header is refused.
/// - Lines end with `\n` or `\r\n`; whitespace around fields is ignored; blank
///   lines (anywhere, e.g. trailing) are skipped but still counted in line
///   numbers. A leading UTF-8 byte order mark is ignored.
/// - Every value must be a finite number (Rust `f64` syntax, e.g. `12`, `-1.5`,
///   `1e3`); `lat` in [-90, 90], `lon` in [-180, 180]; timestamps must not
///   decrease (equal timestamps are allowed).
///
/// Errors are [`TrajectoryError::InvalidCsv`] naming the 1-based line and the
/// field, e.g. `line 3, field lat: "abc" is not a number`, or
/// [`TrajectoryError::TooManyPoints`]. An input without data rows gives an empty
/// vector (the filters refuse it).
pub fn parse_csv_with_max(text: &str, max_points: usize) -> Result<Vec<Point>, TrajectoryError> {
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    let mut points: Vec<Point> = Vec::new();
    let mut first = true;
    let mut prev_line = 0;
    for (i, line) in text.lines().enumerate() {
        let line_no = i + 1;
        if line.trim().is_empty() {
            continue;
        }
        if std::mem::take(&mut first) {
            if is_header(line) {
                continue;
            }
            if line.split(',').all(|f| f.trim().parse::<f64>().is_err()) {
                return Err(TrajectoryError::csv(
                    line_no,
                    None,
                    format!(
                        "expected the header timestamp,lat,lon or a data row, got {}",
                        quote(line.trim())
                    ),
                ));
            }
        }
        let p = parse_row(line, line_no)?;
        if let Some(prev) = points.last() {
            if p.t < prev.t {
                return Err(TrajectoryError::csv(
                    line_no,
                    Some("timestamp"),
                    format!(
                        "{} is before the timestamp {} of line {prev_line}; timestamps must not decrease",
                        p.t, prev.t
                    ),
                ));
            }
        }
        if points.len() >= max_points {
            return Err(TrajectoryError::TooManyPoints { max: max_points });
        }
        points.push(p);
        prev_line = line_no;
    }
    Ok(points)
}

fn is_header(line: &str) -> bool {
    let mut names = line.split(',').map(str::trim);
    FIELDS
        .iter()
        .all(|f| names.next().is_some_and(|n| n.eq_ignore_ascii_case(f)))
        && names.next().is_none()
}

fn parse_row(line: &str, line_no: usize) -> Result<Point, TrajectoryError> {
    let mut values = [0.0; 3];
    let mut count = 0;
    for raw in line.split(',') {
        count += 1;
        if count > FIELDS.len() {
            continue; // counted for the error below
        }
        let field = FIELDS[count - 1];
        let raw = raw.trim();
        let v = if raw.is_empty() {
            return Err(TrajectoryError::csv(line_no, Some(field), "empty value"));
        } else {
            raw.parse::<f64>().map_err(|_| {
                TrajectoryError::csv(
                    line_no,
                    Some(field),
                    format!("{} is not a number", quote(raw)),
                )
            })?
        };
        check_value(field, v).map_err(|m| TrajectoryError::csv(line_no, Some(field), m))?;
        values[count - 1] = v;
    }
    if count < FIELDS.len() {
        return Err(TrajectoryError::csv(
            line_no,
            Some(FIELDS[count]),
            format!("missing (a row is timestamp,lat,lon; this one has {count} field(s))"),
        ));
    }
    if count > FIELDS.len() {
        return Err(TrajectoryError::csv(
            line_no,
            None,
            format!("{count} fields, expected 3 (timestamp,lat,lon)"),
        ));
    }
    Ok(Point {
        t: values[0],
        lat: values[1],
        lon: values[2],
    })
}

/// Checks one value of `field`; the error is the message without location.
fn check_value(field: &str, v: f64) -> Result<(), String> {
    if !v.is_finite() {
        return Err(format!("{v} is not a finite number"));
    }
    let bound = match field {
        "lat" => 90.0,
        "lon" => 180.0,
        _ => return Ok(()),
    };
    if !(-bound..=bound).contains(&v) {
        return Err(format!("{v} is out of range [-{bound}, {bound}]"));
    }
    Ok(())
}

/// `s` in double quotes, shortened to [`QUOTE_CHARS`] characters.
fn quote(s: &str) -> String {
    match s.char_indices().nth(QUOTE_CHARS) {
        Some((at, _)) => format!("{:?}…", &s[..at]),
        None => format!("{s:?}"),
    }
}

/// A JSON trajectory request: `{"points": [{"t", "lat", "lon"}, ...], "interval"?: N}`.
#[derive(Debug, Clone, PartialEq)]
pub struct JsonRequest {
    /// The points, validated like CSV rows.
    pub points: Vec<Point>,
    /// The `interval` member, if present and not `null` (not yet range-checked:
    /// see [`check_interval`](crate::check_interval)).
    pub interval: Option<u64>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRequest {
    points: Vec<Point>,
    #[serde(default)]
    interval: Value,
}

/// Parses a JSON request with at most [`MAX_POINTS`] points; see [`parse_json_with_max`].
pub fn parse_json(body: &[u8]) -> Result<JsonRequest, TrajectoryError> {
    parse_json_with_max(body, MAX_POINTS)
}

/// Parses a JSON request `{"points": [{"t": .., "lat": .., "lon": ..}, ...], "interval": N}`
/// with at most `max_points` points.
///
/// The body must be a JSON object with `points` (required) and `interval`
/// (optional; `null` counts as absent); unknown members are refused, in the
/// object and in each point. Points are validated like CSV rows (ranges,
/// non-decreasing timestamps), errors naming the point, e.g.
/// `points[2].lat: 91 is out of range [-90, 90]`. A non-integer `interval` is
/// [`TrajectoryError::InvalidInterval`]; everything else is
/// [`TrajectoryError::InvalidJson`] or [`TrajectoryError::TooManyPoints`].
pub fn parse_json_with_max(body: &[u8], max_points: usize) -> Result<JsonRequest, TrajectoryError> {
    // serde would also read a struct from an array (fields by position).
    if body.trim_ascii_start().first() != Some(&b'{') {
        return Err(TrajectoryError::InvalidJson(
            "the body must be a JSON object {\"points\": [...], \"interval\": N}".into(),
        ));
    }
    let raw: RawRequest = serde_json::from_slice(body)
        .map_err(|e| TrajectoryError::InvalidJson(format!("invalid JSON body: {e}")))?;
    if raw.points.len() > max_points {
        return Err(TrajectoryError::TooManyPoints { max: max_points });
    }
    for (i, p) in raw.points.iter().enumerate() {
        for (field, v) in FIELDS.iter().zip([p.t, p.lat, p.lon]) {
            check_value(field, v).map_err(|m| {
                let key = if *field == "timestamp" { "t" } else { field };
                TrajectoryError::InvalidJson(format!("points[{i}].{key}: {m}"))
            })?;
        }
        if i > 0 && p.t < raw.points[i - 1].t {
            return Err(TrajectoryError::InvalidJson(format!(
                "points[{i}].t: {} is before the timestamp {} of points[{}]; timestamps must not decrease",
                p.t,
                raw.points[i - 1].t,
                i - 1
            )));
        }
    }
    let interval = match &raw.interval {
        Value::Null => None,
        v => Some(v.as_u64().ok_or_else(|| {
            TrajectoryError::InvalidInterval(format!(
                "interval must be an integer from 1 to {MAX_INTERVAL}, got {v}"
            ))
        })?),
    };
    Ok(JsonRequest {
        points: raw.points,
        interval,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(t: f64, lat: f64, lon: f64) -> Point {
        Point { t, lat, lon }
    }

    fn csv_err(text: &str) -> (usize, Option<&'static str>, String) {
        match parse_csv(text) {
            Err(e @ TrajectoryError::InvalidCsv { .. }) => {
                assert_eq!(e.code(), "invalid_csv");
                let TrajectoryError::InvalidCsv { line, field, .. } = e.clone() else {
                    unreachable!()
                };
                (line, field, e.to_string())
            }
            other => panic!("expected invalid_csv for {text:?}, got {other:?}"),
        }
    }

    #[test]
    fn csv_without_header() {
        assert_eq!(
            parse_csv("1,10,20\n2,11.5,-21\n").unwrap(),
            vec![p(1.0, 10.0, 20.0), p(2.0, 11.5, -21.0)]
        );
    }

    #[test]
    fn csv_with_header_in_any_case_and_spaces() {
        let pts = parse_csv(" TimeStamp , LAT,lon \n1700000000000, 57.05 , 9.92\n").unwrap();
        assert_eq!(pts, vec![p(1_700_000_000_000.0, 57.05, 9.92)]);
        // a header after the first line is a bad data row
        let (line, field, msg) = csv_err("1,2,3\ntimestamp,lat,lon\n");
        assert_eq!((line, field), (2, Some("timestamp")));
        assert_eq!(
            msg,
            "line 2, field timestamp: \"timestamp\" is not a number"
        );
    }

    #[test]
    fn csv_crlf_blank_lines_and_bom() {
        let text = "\u{feff}timestamp,lat,lon\r\n\r\n1,1,1\r\n  \r\n2,2,2\r\n\r\n\n";
        assert_eq!(
            parse_csv(text).unwrap(),
            vec![p(1.0, 1.0, 1.0), p(2.0, 2.0, 2.0)]
        );
        // blank lines count in line numbers
        let (line, field, _) = csv_err("1,1,1\n\n\n2,x,2\n");
        assert_eq!((line, field), (4, Some("lat")));
    }

    #[test]
    fn csv_empty_inputs_parse_to_no_points() {
        assert_eq!(parse_csv("").unwrap(), vec![]);
        assert_eq!(parse_csv("\n\r\n  \n").unwrap(), vec![]);
        assert_eq!(parse_csv("timestamp,lat,lon\n").unwrap(), vec![]);
    }

    #[test]
    fn csv_bad_number_names_line_and_field() {
        let (line, field, msg) = csv_err("timestamp,lat,lon\n1,2,3\n2,abc,3\n");
        assert_eq!((line, field), (3, Some("lat")));
        assert_eq!(msg, "line 3, field lat: \"abc\" is not a number");
        let (line, field, msg) = csv_err("1,2,3\n2,3,4e\n");
        assert_eq!((line, field), (2, Some("lon")));
        assert_eq!(msg, "line 2, field lon: \"4e\" is not a number");
        let (_, field, msg) = csv_err("1,,3\n");
        assert_eq!(field, Some("lat"));
        assert_eq!(msg, "line 1, field lat: empty value");
        let (_, _, msg) = csv_err(&format!("1,2,{}\n", "9".repeat(40) + "x"));
        assert_eq!(
            msg,
            format!("line 1, field lon: \"{}\"… is not a number", "9".repeat(32)),
            "long values are shortened"
        );
    }

    #[test]
    fn csv_non_finite_values_are_refused() {
        for (row, field) in [
            ("inf,1,1", "timestamp"),
            ("1,NaN,1", "lat"),
            ("1,1,-infinity", "lon"),
        ] {
            let (line, f, msg) = csv_err(row);
            assert_eq!((line, f), (1, Some(field)), "{row}");
            assert!(msg.contains("not a finite number"), "{msg}");
        }
    }

    #[test]
    fn csv_missing_and_extra_fields() {
        let (line, field, msg) = csv_err("1,2,3\n2,3\n");
        assert_eq!((line, field), (2, Some("lon")));
        assert!(msg.starts_with("line 2, field lon: missing"), "{msg}");
        let (_, field, _) = csv_err("7\n");
        assert_eq!(field, Some("lat"));
        let (line, field, msg) = csv_err("1,2,3\n2,3,4,5\n");
        assert_eq!((line, field), (2, None));
        assert_eq!(msg, "line 2: 4 fields, expected 3 (timestamp,lat,lon)");
    }

    #[test]
    fn csv_unknown_header_is_refused() {
        let (line, field, msg) = csv_err("time,latitude,longitude\n1,2,3\n");
        assert_eq!((line, field), (1, None));
        assert!(
            msg.contains("expected the header timestamp,lat,lon"),
            "{msg}"
        );
        // wrong order is not the header either
        let (line, _, _) = csv_err("lat,lon,timestamp\n1,2,3\n");
        assert_eq!(line, 1);
    }

    #[test]
    fn csv_decreasing_timestamps_are_refused_equal_ones_allowed() {
        assert_eq!(parse_csv("5,0,0\n5,1,1\n").unwrap().len(), 2);
        let (line, field, msg) = csv_err("1,0,0\n3,0,0\n\n2,0,0\n");
        assert_eq!((line, field), (4, Some("timestamp")));
        assert_eq!(
            msg,
            "line 4, field timestamp: 2 is before the timestamp 3 of line 2; timestamps must not decrease"
        );
    }

    #[test]
    fn csv_out_of_range_coordinates() {
        assert!(parse_csv("1,90,180\n2,-90,-180\n").is_ok());
        let (_, field, msg) = csv_err("1,90.0001,0\n");
        assert_eq!(field, Some("lat"));
        assert_eq!(msg, "line 1, field lat: 90.0001 is out of range [-90, 90]");
        let (_, field, msg) = csv_err("1,0,-180.5\n");
        assert_eq!(field, Some("lon"));
        assert_eq!(msg, "line 1, field lon: -180.5 is out of range [-180, 180]");
    }

    #[test]
    fn csv_point_limit() {
        assert_eq!(parse_csv_with_max("1,0,0\n2,0,0\n", 2).unwrap().len(), 2);
        assert_eq!(
            parse_csv_with_max("1,0,0\n2,0,0\n3,0,0\n", 2),
            Err(TrajectoryError::TooManyPoints { max: 2 })
        );
    }

    #[test]
    fn json_request() {
        let r = parse_json(br#" {"points": [{"t": 1, "lat": 2, "lon": 3}, {"t": 1.5, "lat": -2, "lon": 3.5}], "interval": 3}"#).unwrap();
        assert_eq!(r.points, vec![p(1.0, 2.0, 3.0), p(1.5, -2.0, 3.5)]);
        assert_eq!(r.interval, Some(3));
        let r = parse_json(br#"{"points": [], "interval": null}"#).unwrap();
        assert_eq!((r.points.len(), r.interval), (0, None));
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
    fn bytes_that_are_not_utf8_name_their_line() {
        let mut body = b"1,2,3\n4,5,6\n7,".to_vec();
        body.push(0xff);
        let err = parse_csv_bytes(&body).unwrap_err();
        assert_eq!(err.code(), "invalid_csv");
        assert!(err.to_string().contains("line 3"), "{err}");
        assert_eq!(parse_csv_bytes(b"1,2,3\n").unwrap().len(), 1);
    }
}
