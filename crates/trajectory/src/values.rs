//! What every input format checks of a point, and how times are read.

use time::format_description::well_known::{Iso8601, Rfc3339};
use time::{OffsetDateTime, PrimitiveDateTime};

use crate::Point;

/// At most this many characters of a bad value are quoted in an error message.
const QUOTE_CHARS: usize = 32;

/// Checks one value of `field` (`timestamp`, `lat` or `lon`); the error is the
/// message without location.
pub(crate) fn check_value(field: &str, v: f64) -> Result<(), String> {
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

/// Checks a point's coordinates (and its time, when `timed`); the error names
/// the field and what is wrong.
pub(crate) fn check_point(p: &Point, timed: bool) -> Result<(), (&'static str, String)> {
    if timed {
        check_value("timestamp", p.t).map_err(|m| ("timestamp", m))?;
    }
    check_value("lat", p.lat).map_err(|m| ("lat", m))?;
    check_value("lon", p.lon).map_err(|m| ("lon", m))
}

/// A time value: a number as given (whatever unit the data uses), or an
/// ISO 8601 / RFC 3339 date-time as Unix milliseconds (without an offset it is
/// taken as UTC, as GPX does).
pub(crate) fn parse_time(raw: &str) -> Result<f64, String> {
    if let Ok(v) = raw.parse::<f64>() {
        return check_value("timestamp", v).map(|()| v);
    }
    let parsed = OffsetDateTime::parse(raw, &Rfc3339)
        .or_else(|_| OffsetDateTime::parse(raw, &Iso8601::PARSING))
        .or_else(|_| PrimitiveDateTime::parse(raw, &Iso8601::PARSING).map(|t| t.assume_utc()));
    match parsed {
        Ok(t) => Ok(unix_ms(t)),
        Err(_) => Err(format!(
            "{} is not a number or an ISO 8601 date-time",
            quote(raw)
        )),
    }
}

/// A date-time as Unix milliseconds (fractions kept).
pub(crate) fn unix_ms(t: OffsetDateTime) -> f64 {
    // Whole milliseconds exactly, then the fraction: one division of the
    // nanoseconds would round 250 ms to 249.9998.
    let nanos = t.unix_timestamp_nanos();
    nanos.div_euclid(1_000_000) as f64 + nanos.rem_euclid(1_000_000) as f64 / 1e6
}

/// `s` in double quotes, shortened to [`QUOTE_CHARS`] characters.
pub(crate) fn quote(s: &str) -> String {
    match s.char_indices().nth(QUOTE_CHARS) {
        Some((at, _)) => format!("{:?}…", &s[..at]),
        None => format!("{s:?}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_are_numbers_as_given_or_date_times_in_unix_ms() {
        assert_eq!(parse_time("1700000000"), Ok(1_700_000_000.0));
        assert_eq!(parse_time("2.5"), Ok(2.5));
        assert_eq!(parse_time("2023-11-14T22:13:20Z"), Ok(1_700_000_000_000.0));
        assert_eq!(
            parse_time("2023-11-14T23:13:20.250+01:00"),
            Ok(1_700_000_000_250.0)
        );
        assert_eq!(parse_time("2023-11-14T22:13:20"), Ok(1_700_000_000_000.0));
        assert!(parse_time("yesterday")
            .unwrap_err()
            .contains("\"yesterday\""));
        assert!(parse_time("inf")
            .unwrap_err()
            .contains("not a finite number"));
    }
}
