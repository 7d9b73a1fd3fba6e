//! Reading trajectories from CSV as people export them.
//!
//! The `csv` crate reads the records (chosen over a hand-written splitter for
//! what spreadsheets and exporters really write: quoted fields with commas or
//! line breaks inside, CRLF, any delimiter); this module finds the columns by
//! their header names and checks every value.

use csv::{ReaderBuilder, StringRecord, Trim};

use crate::values::{check_value, parse_time, quote};
use crate::{Point, Track, TrajectoryError, MAX_POINTS};

/// Header names of the latitude column (any case).
const LAT_NAMES: [&str; 2] = ["lat", "latitude"];
/// Header names of the longitude column (any case).
const LON_NAMES: [&str; 4] = ["lon", "lng", "long", "longitude"];
/// Header names of the optional time column (any case).
const TIME_NAMES: [&str; 3] = ["t", "time", "timestamp"];

/// How to read a CSV body.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CsvOptions {
    /// The field delimiter; `None` detects it from the first line (`,`, `;`
    /// or a tab, whichever occurs most outside quotes; `,` when none does).
    pub delimiter: Option<u8>,
}

/// Parses CSV with at most [`MAX_POINTS`] points; see [`parse_csv_with`].
pub fn parse_csv(text: &str) -> Result<Track, TrajectoryError> {
    parse_csv_with(text, CsvOptions::default(), MAX_POINTS)
}

/// Parses CSV bytes as [`parse_csv_with`] does; bytes that are not UTF-8 are an
/// [`TrajectoryError::InvalidCsv`] naming the line they are on.
pub fn parse_csv_bytes(body: &[u8], options: CsvOptions) -> Result<Track, TrajectoryError> {
    let text = std::str::from_utf8(body).map_err(|e| {
        let valid = &body[..e.valid_up_to()];
        TrajectoryError::InvalidCsv {
            line: valid.iter().filter(|&&b| b == b'\n').count() + 1,
            field: None,
            message: "not valid UTF-8".into(),
        }
    })?;
    parse_csv_with(text, options, MAX_POINTS)
}

/// Where the columns are.
#[derive(Debug, Clone, Copy)]
struct Columns {
    lat: usize,
    lon: usize,
    time: Option<usize>,
    /// Header-less `timestamp,lat,lon`: exactly three fields a row.
    positional: bool,
}

/// Parses CSV with at most `max_points` points.
///
/// - **With a header** (a first record without numbers or empty fields): the
///   columns are found by name, in any order and any case, other columns
///   ignored: latitude from `lat`/`latitude`, longitude from
///   `lon`/`lng`/`long`/`longitude`, and, optionally, time from
///   `t`/`time`/`timestamp`. Without a time column the points keep their order
///   and the track is untimed ([`Track::timed`] false).
/// - **Without a header**: every row is `timestamp,lat,lon`.
/// - Times are numbers, kept as given, or ISO 8601 / RFC 3339 date-times, read
///   as Unix milliseconds; they must not decrease.
/// - Fields may be quoted; lines end with `\n` or `\r\n`; whitespace around
///   fields is ignored; blank lines are skipped but counted; a leading UTF-8
///   byte order mark is ignored. The delimiter is given or detected (see
///   [`CsvOptions`]).
/// - `lat` must be in [-90, 90], `lon` in [-180, 180], every value finite.
///
/// Errors are [`TrajectoryError::InvalidCsv`] naming the 1-based line and the
/// field, e.g. `line 3, field lat: "abc" is not a number`, or
/// [`TrajectoryError::TooManyPoints`]. An input without data rows gives an
/// empty track (the filters refuse it).
pub fn parse_csv_with(
    text: &str,
    options: CsvOptions,
    max_points: usize,
) -> Result<Track, TrajectoryError> {
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    let delimiter = options.delimiter.unwrap_or_else(|| detect_delimiter(text));
    let mut reader = ReaderBuilder::new()
        .has_headers(false)
        .flexible(true)
        .trim(Trim::All)
        .delimiter(delimiter)
        .from_reader(text.as_bytes());
    let mut columns: Option<Columns> = None;
    let mut points: Vec<Point> = Vec::new();
    let mut prev_line = 0;
    let mut record = StringRecord::new();
    // The reader's own line numbers skip blank lines: count them from byte
    // offsets instead, so that errors name the line an editor shows.
    let mut lines = LineCounter::new(text);
    loop {
        match reader.read_record(&mut record) {
            Ok(false) => break,
            Ok(true) => {}
            Err(e) => {
                let line = e.position().map_or(0, |p| lines.line_at(p.byte() as usize));
                return Err(TrajectoryError::csv(line, None, e.to_string()));
            }
        }
        let line = record
            .position()
            .map_or(0, |p| lines.line_at(p.byte() as usize));
        if record.iter().all(str::is_empty) {
            continue;
        }
        let cols = match columns {
            Some(c) => c,
            None => {
                let c = header_or_positional(&record, line)?;
                columns = Some(c);
                if !c.positional {
                    continue;
                }
                c
            }
        };
        let p = parse_row(&record, cols, line, points.len())?;
        if let (Some(prev), true) = (points.last(), cols.time.is_some()) {
            if p.t < prev.t {
                return Err(TrajectoryError::csv(
                    line,
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
        prev_line = line;
    }
    let timed = columns.is_none_or(|c| c.time.is_some());
    Ok(Track { points, timed })
}

/// Line numbers of byte offsets, counted forward as records are read.
struct LineCounter<'a> {
    text: &'a [u8],
    at: usize,
    line: usize,
}

impl<'a> LineCounter<'a> {
    fn new(text: &'a str) -> Self {
        LineCounter {
            text: text.as_bytes(),
            at: 0,
            line: 1,
        }
    }

    /// The 1-based line of byte `offset` (offsets never go back). The
    /// reader places a record after the previous one's line end, before the
    /// blank lines it skipped: those are passed over here.
    fn line_at(&mut self, offset: usize) -> usize {
        let mut offset = offset.min(self.text.len());
        while self
            .text
            .get(offset)
            .is_some_and(|b| matches!(b, b'\r' | b'\n'))
        {
            offset += 1;
        }
        if offset > self.at {
            self.line += self.text[self.at..offset]
                .iter()
                .filter(|&&b| b == b'\n')
                .count();
            self.at = offset;
        }
        self.line
    }
}

/// The delimiter occurring most in the first non-blank line, outside quotes.
fn detect_delimiter(text: &str) -> u8 {
    let first = text.lines().find(|l| !l.trim().is_empty()).unwrap_or("");
    let mut counts = [(b',', 0usize), (b';', 0), (b'\t', 0)];
    let mut quoted = false;
    for b in first.bytes() {
        if b == b'"' {
            quoted = !quoted;
        } else if !quoted {
            if let Some(c) = counts.iter_mut().find(|(d, _)| *d == b) {
                c.1 += 1;
            }
        }
    }
    counts
        .iter()
        .filter(|(_, n)| *n > 0)
        .max_by_key(|(_, n)| *n)
        .map_or(b',', |(d, _)| *d)
}

/// The columns of the first record: a header naming them, or, when every
/// field is a number, the header-less `timestamp,lat,lon`.
fn header_or_positional(record: &StringRecord, line: usize) -> Result<Columns, TrajectoryError> {
    // A header names its columns: a first record with any number in it is a
    // data row (with a bad value, maybe), not a header.
    if record
        .iter()
        .any(|f| f.is_empty() || f.parse::<f64>().is_ok())
    {
        return Ok(Columns {
            lat: 1,
            lon: 2,
            time: Some(0),
            positional: true,
        });
    }
    let find = |names: &[&str], what: &str| -> Result<Option<usize>, TrajectoryError> {
        let mut found = record
            .iter()
            .enumerate()
            .filter(|(_, f)| names.iter().any(|n| f.eq_ignore_ascii_case(n)));
        let first = found.next().map(|(i, _)| i);
        if let Some((_, again)) = found.next() {
            return Err(TrajectoryError::csv(
                line,
                None,
                format!(
                    "two {what} columns in the header (the second is {})",
                    quote(again)
                ),
            ));
        }
        Ok(first)
    };
    let lat = find(&LAT_NAMES, "latitude")?;
    let lon = find(&LON_NAMES, "longitude")?;
    let time = find(&TIME_NAMES, "time")?;
    match (lat, lon) {
        (Some(lat), Some(lon)) => Ok(Columns {
            lat,
            lon,
            time,
            positional: false,
        }),
        _ => {
            let found: Vec<String> = record.iter().map(quote).collect();
            Err(TrajectoryError::csv(
                line,
                None,
                format!(
                    "expected a header with latitude (lat, latitude) and longitude (lon, lng, long, longitude) columns, or data rows timestamp,lat,lon; found the header {}",
                    found.join(", ")
                ),
            ))
        }
    }
}

fn parse_row(
    record: &StringRecord,
    cols: Columns,
    line: usize,
    index: usize,
) -> Result<Point, TrajectoryError> {
    if cols.positional && record.len() > 3 {
        return Err(TrajectoryError::csv(
            line,
            None,
            format!("{} fields, expected 3 (timestamp,lat,lon)", record.len()),
        ));
    }
    let field = |i: usize, name: &'static str| -> Result<&str, TrajectoryError> {
        match record.get(i) {
            Some("") => Err(TrajectoryError::csv(line, Some(name), "empty value")),
            Some(v) => Ok(v),
            None if cols.positional => Err(TrajectoryError::csv(
                line,
                Some(name),
                format!(
                    "missing (a row is timestamp,lat,lon; this one has {} field(s))",
                    record.len()
                ),
            )),
            None => Err(TrajectoryError::csv(
                line,
                Some(name),
                format!("missing (this row has {} field(s))", record.len()),
            )),
        }
    };
    let number = |i: usize, name: &'static str| -> Result<f64, TrajectoryError> {
        let raw = field(i, name)?;
        let v = raw.parse::<f64>().map_err(|_| {
            TrajectoryError::csv(line, Some(name), format!("{} is not a number", quote(raw)))
        })?;
        check_value(name, v).map_err(|m| TrajectoryError::csv(line, Some(name), m))?;
        Ok(v)
    };
    // Fields in column order, so the first bad one is the one named.
    let t = match cols.time {
        Some(i) if cols.positional => number(i, "timestamp")?,
        Some(i) => parse_time(field(i, "timestamp")?)
            .map_err(|m| TrajectoryError::csv(line, Some("timestamp"), m))?,
        None => index as f64,
    };
    let (lat, lon) = if cols.lat < cols.lon {
        let lat = number(cols.lat, "lat")?;
        (lat, number(cols.lon, "lon")?)
    } else {
        let lon = number(cols.lon, "lon")?;
        (number(cols.lat, "lat")?, lon)
    };
    Ok(Point { t, lat, lon })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Point;

    fn p(t: f64, lat: f64, lon: f64) -> Point {
        Point { t, lat, lon }
    }

    fn parse_points(text: &str) -> Result<Vec<Point>, TrajectoryError> {
        parse_csv(text).map(|t| t.points)
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
            parse_points("1,10,20\n2,11.5,-21\n").unwrap(),
            vec![p(1.0, 10.0, 20.0), p(2.0, 11.5, -21.0)]
        );
    }

    #[test]
    fn csv_with_header_in_any_case_and_spaces() {
        let pts = parse_points(" TimeStamp , LAT,lon \n1700000000000, 57.05 , 9.92\n").unwrap();
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
            parse_points(text).unwrap(),
            vec![p(1.0, 1.0, 1.0), p(2.0, 2.0, 2.0)]
        );
        // blank lines count in line numbers
        let (line, field, _) = csv_err("1,1,1\n\n\n2,x,2\n");
        assert_eq!((line, field), (4, Some("lat")));
    }

    #[test]
    fn csv_empty_inputs_parse_to_no_points() {
        assert_eq!(parse_points("").unwrap(), vec![]);
        assert_eq!(parse_points("\n\r\n  \n").unwrap(), vec![]);
        assert_eq!(parse_points("timestamp,lat,lon\n").unwrap(), vec![]);
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
    fn csv_header_without_latitude_and_longitude_says_what_it_found() {
        let (line, field, msg) = csv_err("when,north,east\n1,2,3\n");
        assert_eq!((line, field), (1, None));
        assert!(msg.contains("latitude (lat, latitude)"), "{msg}");
        assert!(
            msg.contains("found the header \"when\", \"north\", \"east\""),
            "{msg}"
        );
        let (_, _, msg) = csv_err("lat,lat,lon\n1,2,3\n");
        assert!(msg.contains("two latitude columns"), "{msg}");
    }

    #[test]
    fn csv_decreasing_timestamps_are_refused_equal_ones_allowed() {
        assert_eq!(parse_points("5,0,0\n5,1,1\n").unwrap().len(), 2);
        let (line, field, msg) = csv_err("1,0,0\n3,0,0\n\n2,0,0\n");
        assert_eq!((line, field), (4, Some("timestamp")));
        assert_eq!(
            msg,
            "line 4, field timestamp: 2 is before the timestamp 3 of line 2; timestamps must not decrease"
        );
    }

    #[test]
    fn csv_out_of_range_coordinates() {
        assert!(parse_points("1,90,180\n2,-90,-180\n").is_ok());
        let (_, field, msg) = csv_err("1,90.0001,0\n");
        assert_eq!(field, Some("lat"));
        assert_eq!(msg, "line 1, field lat: 90.0001 is out of range [-90, 90]");
        let (_, field, msg) = csv_err("1,0,-180.5\n");
        assert_eq!(field, Some("lon"));
        assert_eq!(msg, "line 1, field lon: -180.5 is out of range [-180, 180]");
    }

    #[test]
    fn csv_point_limit() {
        let opts = CsvOptions::default();
        assert_eq!(
            parse_csv_with("1,0,0\n2,0,0\n", opts, 2)
                .unwrap()
                .points
                .len(),
            2
        );
        assert_eq!(
            parse_csv_with("1,0,0\n2,0,0\n3,0,0\n", opts, 2),
            Err(TrajectoryError::TooManyPoints { max: 2 })
        );
    }

    #[test]
    fn bytes_that_are_not_utf8_name_their_line() {
        let mut body = b"1,2,3\n4,5,6\n7,".to_vec();
        body.push(0xff);
        let err = parse_csv_bytes(&body, CsvOptions::default()).unwrap_err();
        assert_eq!(err.code(), "invalid_csv");
        assert!(err.to_string().contains("line 3"), "{err}");
        assert_eq!(
            parse_csv_bytes(b"1,2,3\n", CsvOptions::default())
                .unwrap()
                .points
                .len(),
            1
        );
    }

    #[test]
    fn csv_by_header_names_in_any_order_with_extra_columns() {
        let track = parse_csv("ele,Longitude,speed,LATITUDE,Time\n3,10.5,1,56.25,2023-11-14T22:13:20Z\n4,10.75,1,56.5,2023-11-14T22:13:21Z\n").unwrap();
        assert!(track.timed);
        assert_eq!(
            track.points,
            vec![
                p(1_700_000_000_000.0, 56.25, 10.5),
                p(1_700_000_001_000.0, 56.5, 10.75)
            ]
        );
        for (header, lat, lon) in [
            ("lat,lng", 1.0, 2.0),
            ("latitude,long", 1.0, 2.0),
            ("lon,lat", 2.0, 1.0),
        ] {
            let track = parse_csv(&format!("{header}\n1,2\n")).unwrap();
            assert_eq!(
                (track.points[0].lat, track.points[0].lon),
                (lat, lon),
                "{header}"
            );
        }
    }

    #[test]
    fn csv_without_a_time_column_keeps_the_order_untimed() {
        // Source document 001's tracks: `lat,long` and no time.
        let track = parse_csv("lat,long\n56.2568605075,10.0688809242\n56.2568,10.0689\n").unwrap();
        assert!(!track.timed);
        assert_eq!(
            track.points,
            vec![
                p(0.0, 56.2568605075, 10.0688809242),
                p(1.0, 56.2568, 10.0689)
            ]
        );
        let (line, field, msg) = csv_err("lat,lon\n1,2\n3,abc\n");
        assert_eq!((line, field), (3, Some("lon")));
        assert_eq!(msg, "line 3, field lon: \"abc\" is not a number");
        let (_, field, msg) = csv_err("lat,lon,t\n1,2,noon\n");
        assert_eq!(field, Some("timestamp"));
        assert!(
            msg.contains("\"noon\" is not a number or an ISO 8601 date-time"),
            "{msg}"
        );
        let (line, field, _) = csv_err("lon,lat\n1,2\n3\n");
        assert_eq!((line, field), (3, Some("lat")));
    }

    #[test]
    fn csv_semicolons_tabs_and_quotes() {
        let semi = parse_csv("lat;lon;time\n\"56,25\";10;1\n").unwrap_err();
        // A decimal comma is not a number here: named, not silently misread.
        assert!(
            semi.to_string()
                .contains("field lat: \"56,25\" is not a number"),
            "{semi}"
        );
        let track = parse_csv("lat;lon;time\n56.25;10.5;1\n56.5;10.75;2\n").unwrap();
        assert_eq!(track.points[1], p(2.0, 56.5, 10.75));
        let track = parse_csv("timestamp\tlat\tlon\n1\t2\t3\n").unwrap();
        assert_eq!(track.points, vec![p(1.0, 2.0, 3.0)]);
        let track = parse_csv("name,lat,lon\n\"Aarhus, harbour\",56.15,10.22\n").unwrap();
        assert_eq!(track.points, vec![p(0.0, 56.15, 10.22)]);
        // A delimiter given wins over detection.
        let given = CsvOptions {
            delimiter: Some(b';'),
        };
        let track = parse_csv_with("lat;lon\n1;2\n", given, 10).unwrap();
        assert_eq!(track.points, vec![p(0.0, 1.0, 2.0)]);
        assert!(parse_csv_with("lat,lon\n1,2\n", given, 10).is_err());
    }

    #[test]
    fn csv_quoted_line_breaks_count_in_line_numbers() {
        let (line, field, _) = csv_err("name,lat,lon\n\"two\nlines\",1,2\nx,91,0\n");
        assert_eq!((line, field), (4, Some("lat")));
    }
}
