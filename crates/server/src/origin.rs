//! Which web pages may open connections: the `Origin` allow-list.
//!
//! A browser names the page that opens a WebSocket or sends a request in its
//! `Origin` header, and a page cannot forge it; without a check, any site a
//! user visits could open a connection to Plaza in the user's name. Other
//! clients (servers, load generators, native apps) send no `Origin` and are
//! not concerned.

use axum::http::{HeaderMap, StatusCode};
use plaza_protocol::HttpErrorCode;

use crate::api_error::ApiError;

/// The error code of a connection refused for its origin.
pub const ORIGIN_NOT_ALLOWED: &str = HttpErrorCode::OriginNotAllowed.as_str();

/// Whether `entry` is a valid `allowed_origins` entry: `*`, or an origin
/// (`scheme://host[:port]`, no path), as browsers send it.
pub fn valid_entry(entry: &str) -> bool {
    if entry == "*" {
        return true;
    }
    let Some((scheme, rest)) = entry.split_once("://") else {
        return false;
    };
    !scheme.is_empty()
        && scheme
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"+-.".contains(&b))
        && !rest.is_empty()
        && !rest.contains(['/', '?', '#', ' '])
}

/// Checks the request's `Origin` against `allowed` (empty: any origin).
/// A request without `Origin` passes: it does not come from a web page.
pub(crate) fn check(headers: &HeaderMap, allowed: &[String]) -> Result<(), ApiError> {
    if allowed.is_empty() || allowed.iter().any(|a| a == "*") {
        return Ok(());
    }
    let Some(origin) = headers.get(axum::http::header::ORIGIN) else {
        return Ok(());
    };
    let origin = origin.to_str().unwrap_or_default();
    if allowed.iter().any(|a| a.eq_ignore_ascii_case(origin)) {
        return Ok(());
    }
    Err(ApiError::http(
        StatusCode::FORBIDDEN,
        HttpErrorCode::OriginNotAllowed,
        format!("origin {origin:?} is not in this server's allowed_origins"),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(origin: Option<&str>) -> HeaderMap {
        let mut h = HeaderMap::new();
        if let Some(o) = origin {
            h.insert(axum::http::header::ORIGIN, o.parse().unwrap());
        }
        h
    }

    #[test]
    fn only_listed_origins_pass_and_requests_without_one_are_not_concerned() {
        let allowed = vec![
            "https://app.example.org".to_owned(),
            "http://localhost:5173".to_owned(),
        ];
        assert!(check(&headers(Some("https://app.example.org")), &allowed).is_ok());
        assert!(check(&headers(Some("HTTPS://APP.EXAMPLE.ORG")), &allowed).is_ok());
        assert!(check(&headers(Some("http://localhost:5173")), &allowed).is_ok());
        assert!(check(&headers(None), &allowed).is_ok());
        for bad in [
            "https://evil.example",
            "https://app.example.org:444",
            "null",
            "http://app.example.org",
        ] {
            let e = check(&headers(Some(bad)), &allowed).unwrap_err();
            assert_eq!(e.status, StatusCode::FORBIDDEN, "{bad}");
        }
        assert!(check(&headers(Some("https://any.where")), &[]).is_ok());
        assert!(check(&headers(Some("https://any.where")), &["*".to_owned()]).is_ok());
    }

    #[test]
    fn entries_are_origins_or_a_star() {
        for good in [
            "*",
            "https://app.example.org",
            "http://localhost:5173",
            "app+x://h",
        ] {
            assert!(valid_entry(good), "{good}");
        }
        for bad in [
            "",
            "app.example.org",
            "https://app.example.org/",
            "https://",
            "https://a b",
            "://x",
        ] {
            assert!(!valid_entry(bad), "{bad}");
        }
    }
}
