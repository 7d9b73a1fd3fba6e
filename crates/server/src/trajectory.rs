//! `POST /v1/trajectory/mean` and `POST /v1/trajectory/median` (also at
//! `/trajectory/...`, the paths of source document 001's client): smooth a
//! trajectory (CSV, JSON, GPX or GeoJSON) with a sliding-window filter and
//! answer with GeoJSON. Parsing and filtering are in `plaza-trajectory`; this module reads
//! the request, runs the CPU-bound work on the blocking pool and maps errors to
//! the API's JSON error body.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::{BytesRejection, QueryRejection};
use axum::extract::{DefaultBodyLimit, Query};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{post, MethodRouter};
use plaza_protocol::ErrorCode;
use plaza_trajectory::{
    apply, check_interval, parse_csv_bytes, parse_geojson, parse_gpx, parse_json, to_geojson,
    CsvOptions, Filter, Track, TrajectoryError,
};

use crate::api_error::ApiError;
use crate::Node;

/// The largest accepted request body: 16 MiB (the rest of the API keeps axum's 2 MB).
pub(crate) const MAX_BODY_BYTES: usize = 16 * 1024 * 1024;

/// The media type of the answer (RFC 7946).
const GEOJSON: &str = "application/geo+json";

/// The `POST` route of one filter, with its body limit.
pub(crate) fn route(filter: Filter) -> MethodRouter<Arc<Node>> {
    post(move |query, headers, body| handle(filter, query, headers, body))
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
}

/// How the body is encoded, from its `Content-Type`.
#[derive(Clone, Copy)]
enum Format {
    Csv(CsvOptions),
    Json,
    Gpx,
    GeoJson,
}

impl From<TrajectoryError> for ApiError {
    fn from(e: TrajectoryError) -> Self {
        let status = match e {
            TrajectoryError::TooManyPoints { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            _ => StatusCode::BAD_REQUEST,
        };
        ApiError::with_code(status, e.code(), e.to_string())
    }
}

/// Checks, in order: content type (415), the query's `interval`, the body
/// (size, then parsing), the interval (present, agreeing, in range), and that
/// there are points. Parsing, filtering and encoding run in `spawn_blocking`.
async fn handle(
    filter: Filter,
    query: Result<Query<Vec<(String, String)>>, QueryRejection>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let Query(params) = query.map_err(|r| {
        ApiError::new(
            StatusCode::BAD_REQUEST,
            ErrorCode::InvalidRequest,
            r.body_text(),
        )
    })?;
    let format = format(&headers, &params)?;
    let query_interval = query_interval(&params)?;
    let body = body.map_err(|r| {
        let status = r.status();
        let message = if status == StatusCode::PAYLOAD_TOO_LARGE {
            format!("the request body is larger than {MAX_BODY_BYTES} bytes")
        } else {
            r.body_text()
        };
        ApiError::new(status, ErrorCode::InvalidRequest, message)
    })?;
    let geojson = tokio::task::spawn_blocking(move || run(filter, format, query_interval, &body))
        .await
        .map_err(|e| {
            tracing::error!(error = %e, "trajectory filter task failed");
            ApiError::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                ErrorCode::Internal,
                "the trajectory filter failed",
            )
        })??;
    Ok(([(header::CONTENT_TYPE, GEOJSON)], geojson).into_response())
}

fn format(headers: &HeaderMap, params: &[(String, String)]) -> Result<Format, ApiError> {
    let essence = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .map(|v| v.trim().to_ascii_lowercase());
    let format = match essence.as_deref() {
        Some("text/csv" | "text/plain") => Format::Csv(CsvOptions {
            delimiter: query_delimiter(params)?,
        }),
        Some("application/json") => Format::Json,
        Some("application/gpx+xml" | "application/xml" | "text/xml") => Format::Gpx,
        Some("application/geo+json") => Format::GeoJson,
        _ => {
            return Err(ApiError::new(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                ErrorCode::InvalidRequest,
                "Content-Type must be text/csv, text/plain, application/json, application/gpx+xml or application/geo+json",
            ))
        }
    };
    Ok(format)
}

/// The query's `delimiter` for CSV: `,`, `;`, `tab` (or a tab), `|`; absent: detected.
fn query_delimiter(params: &[(String, String)]) -> Result<Option<u8>, ApiError> {
    let Some((_, raw)) = params.iter().find(|(k, _)| k == "delimiter") else {
        return Ok(None);
    };
    match raw.as_str() {
        "," => Ok(Some(b',')),
        ";" => Ok(Some(b';')),
        "tab" | "\t" => Ok(Some(b'\t')),
        "|" => Ok(Some(b'|')),
        other => Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            ErrorCode::InvalidRequest,
            format!("delimiter must be \",\", \";\", \"tab\" or \"|\", not {other:?}"),
        )),
    }
}

/// The query's `interval`, range-checked; other parameters are ignored.
fn query_interval(params: &[(String, String)]) -> Result<Option<u64>, ApiError> {
    let mut values = params.iter().filter(|(k, _)| k == "interval");
    let Some((_, raw)) = values.next() else {
        return Ok(None);
    };
    if values.next().is_some() {
        return Err(TrajectoryError::InvalidInterval("interval is given twice".into()).into());
    }
    let interval = raw.trim().parse::<u64>().map_err(|_| {
        TrajectoryError::InvalidInterval(format!(
            "interval must be an integer from 1 to {}, got {raw:?}",
            plaza_trajectory::MAX_INTERVAL
        ))
    })?;
    check_interval(interval)?;
    Ok(Some(interval))
}

/// Parses, filters and encodes; CPU-bound, so it runs on the blocking pool.
fn run(
    filter: Filter,
    format: Format,
    query_interval: Option<u64>,
    body: &[u8],
) -> Result<Vec<u8>, ApiError> {
    let (track, body_interval): (Track, Option<u64>) = match format {
        Format::Csv(options) => (parse_csv_bytes(body, options)?, None),
        Format::Json => {
            let r = parse_json(body)?;
            (r.track, r.interval)
        }
        Format::Gpx => (parse_gpx(body)?, None),
        Format::GeoJson => (parse_geojson(body)?, None),
    };
    let interval = match (query_interval, body_interval) {
        (Some(q), Some(b)) if q != b => {
            return Err(TrajectoryError::InvalidInterval(format!(
                "the query says interval={q} but the body says {b}"
            ))
            .into())
        }
        (Some(i), _) | (None, Some(i)) => i,
        (None, None) => {
            let where_ = match format {
                Format::Json => "in the query (?interval=N) or the body (\"interval\": N)",
                _ => "in the query (?interval=N)",
            };
            return Err(TrajectoryError::InvalidInterval(format!(
                "interval is missing: give it {where_}"
            ))
            .into());
        }
    };
    let w = check_interval(interval)?;
    let filtered = apply(filter, &track.points, w)?;
    serde_json::to_vec(&to_geojson(&filtered, track.timed, filter, w)).map_err(|e| {
        ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            ErrorCode::Internal,
            format!("encoding the answer failed: {e}"),
        )
    })
}
