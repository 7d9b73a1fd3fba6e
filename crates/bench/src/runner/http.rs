//! HTTP calls of a flow, and the bytes they put on the wire.

use super::user::{expand, expand_json, UserState};
use super::*;
use std::fmt::Write as _;

/// One HTTP call: timed while recording; a transport error or an
/// unexpected status counts as a failed call and an error, and the user goes
/// on (a load test of an API wants every call made). Its bytes and its
/// place in the run's HTTP span are counted whatever the recording flag.
pub(super) async fn http_call(
    shared: &Arc<Shared>,
    st: &mut UserState,
    method: &str,
    path: &str,
    body: Option<&serde_json::Value>,
    status: Option<u16>,
) -> bool {
    use reqwest::header::{ACCEPT, CONTENT_LENGTH, CONTENT_TYPE, HOST};
    let Ok(method) = reqwest::Method::from_bytes(method.as_bytes()) else {
        shared.error(format!("http: bad method {method:?}"));
        return false;
    };
    let path = expand(path, st.vu, st.room_index, &st.flow);
    let url = format!("http://{}{}", shared.opts.addr, path);
    // Every header is set here so that what the client writes is known:
    // reqwest adds `accept`, and hyper `host` and `content-length`, only
    // where they are missing.
    let mut req = shared
        .http
        .request(method, &url)
        .timeout(shared.opts.timeout)
        .header(HOST, shared.opts.addr.to_string())
        .header(ACCEPT, "*/*");
    if let Some(b) = body {
        let json = expand_json(b.clone(), st.vu, st.room_index, &st.flow, &mut st.rng);
        let bytes = match serde_json::to_vec(&json) {
            Ok(b) => b,
            Err(e) => {
                shared.error(format!("http: request body: {e}"));
                return false;
            }
        };
        req = req
            .header(CONTENT_TYPE, "application/json")
            .header(CONTENT_LENGTH, bytes.len())
            .body(bytes);
    }
    timed(shared, req, status).await;
    true
}

/// Sends `req` (every header set by the caller), timed while recording
/// and counted like every HTTP call; whether it succeeded (`status`, or any
/// 2xx without one).
async fn timed(shared: &Arc<Shared>, req: reqwest::RequestBuilder, status: Option<u16>) -> bool {
    let sent = Instant::now();
    shared
        .http_first_sent
        .fetch_min(shared.unix_us(sent), Ordering::Relaxed);
    let outcome = match req.build() {
        Ok(req) => {
            let out = request_len(&req);
            match shared.http.execute(req).await {
                Ok(resp) => {
                    // A response means the whole request went out.
                    shared
                        .counts
                        .http_bytes_out
                        .fetch_add(out, Ordering::Relaxed);
                    let head = response_head_len(&resp);
                    let code = resp.status();
                    // Read the body: the call is over when the response is.
                    let read = resp.bytes().await;
                    let body = read.as_ref().map_or(0, |b| b.len() as u64);
                    shared
                        .counts
                        .http_bytes_in
                        .fetch_add(head + body, Ordering::Relaxed);
                    match (status, read) {
                        (_, Err(e)) => Err(format!("http: body: {}", short(&e))),
                        (Some(want), Ok(_)) if code.as_u16() != want => {
                            Err(format!("http: status {code}"))
                        }
                        (None, Ok(_)) if !code.is_success() => Err(format!("http: status {code}")),
                        _ => Ok(()),
                    }
                }
                Err(e) => Err(format!("http: {}", short(&e))),
            }
        }
        Err(e) => Err(format!("http: {}", short(&e))),
    };
    let done = Instant::now();
    shared
        .http_last_done
        .fetch_max(shared.unix_us(done), Ordering::Relaxed);
    let took = (done - sent).as_micros() as u64;
    let recording = shared.recording();
    if recording {
        shared.counts.http_calls_rec.fetch_add(1, Ordering::Relaxed);
    }
    let ok = outcome.is_ok();
    match outcome {
        Ok(()) => {
            shared.counts.http_ok.fetch_add(1, Ordering::Relaxed);
            if recording {
                let _ = shared
                    .http_rt
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .record(took.max(1));
            }
        }
        Err(kind) => {
            shared.counts.http_failed.fetch_add(1, Ordering::Relaxed);
            shared.error(kind);
        }
    }
    ok
}

/// A server-API publish (`POST /v1/rooms/{room}/publish`): `data` is
/// `{"bt":<unix µs>,"vu":…,"p":"xx…"}`, timed from just before the call.
/// Answered 2xx, it is counted as a publish that the members of the user's
/// room on `channel` receive, and (on a channel of the run's webhook
/// receiver) as a webhook event to come.
pub(super) async fn api_publish(
    shared: &Arc<Shared>,
    st: &mut UserState,
    room: &str,
    channel: Option<&str>,
    event: &str,
    bytes: usize,
) -> bool {
    use reqwest::header::{ACCEPT, CONTENT_LENGTH, CONTENT_TYPE, HOST};
    let room_id = expand(room, st.vu, st.room_index, &st.flow);
    let url = format!(
        "http://{}/v1/rooms/{}/publish",
        shared.opts.addr,
        path_escape(&room_id)
    );
    let recording = shared.recording();
    let sent = unix_micros();
    st.out.clear();
    st.out.push_str(r#"{"event":"#);
    st.out
        .push_str(&serde_json::to_string(event).unwrap_or_default());
    if let Some(c) = channel {
        st.out.push_str(r#","channel":"#);
        st.out
            .push_str(&serde_json::to_string(c).unwrap_or_default());
    }
    st.out.push_str(r#","data":"#);
    let data_start = st.out.len();
    let _ = write!(st.out, r#"{{"bt":{sent},"vu":{},"p":""#, st.vu);
    let pad = bytes.saturating_sub(st.out.len() - data_start + 2);
    st.out.extend(std::iter::repeat_n('x', pad));
    st.out.push_str("\"}}");
    let body = st.out.clone().into_bytes();
    let req = shared
        .http
        .post(url)
        .timeout(shared.opts.timeout)
        .header(HOST, shared.opts.addr.to_string())
        .header(ACCEPT, "*/*")
        .header(CONTENT_TYPE, "application/json")
        .header(CONTENT_LENGTH, body.len())
        .body(body);
    if !timed(shared, req, None).await {
        return true;
    }
    let room = st.room_index as usize;
    let recipients = match channel {
        None | Some("main") => shared.room_members[room],
        Some(ch) => shared.channel_sizes[room].get(ch).copied().unwrap_or(0),
    };
    let c = &shared.counts;
    c.api_publishes_total.fetch_add(1, Ordering::Relaxed);
    c.expected_total.fetch_add(recipients, Ordering::Relaxed);
    if recording {
        c.api_publishes.fetch_add(1, Ordering::Relaxed);
        c.expected.fetch_add(recipients, Ordering::Relaxed);
    }
    shared.webhook_expect(channel);
    true
}

/// Percent-encodes all but RFC 3986's unreserved characters, for a path
/// segment.
fn path_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(char::from(b));
        } else {
            let _ = write!(out, "%{b:02X}");
        }
    }
    out
}

/// The bytes of `req` as HTTP/1.1 writes them: request line, headers, the
/// blank line, body (the client speaks HTTP/1.1 only: no HTTP/2 feature).
pub(super) fn request_len(req: &reqwest::Request) -> u64 {
    let url = req.url();
    // The origin form: path and query, never the fragment.
    let target = url.path().len() + url.query().map_or(0, |q| q.len() + 1);
    let line = req.method().as_str().len() + 1 + target + " HTTP/1.1\r\n".len();
    let body = req.body().and_then(|b| b.as_bytes()).map_or(0, <[u8]>::len);
    (line + headers_len(req.headers()) + body) as u64
}

/// The bytes of a response's head as HTTP/1.1 writes it, from what the
/// client kept of it: the standard reason phrase and `name: value` lines are
/// assumed.
pub(super) fn response_head_len(resp: &reqwest::Response) -> u64 {
    let reason = resp.status().canonical_reason().map_or(0, str::len);
    // `HTTP/1.1 200 OK\r\n`: version, space, code, space, reason, CRLF.
    let line = "HTTP/1.1 ".len() + 3 + 1 + reason + 2;
    (line + headers_len(resp.headers())) as u64
}

/// `name: value\r\n` per header, and the blank line that ends them.
pub(super) fn headers_len(h: &reqwest::header::HeaderMap) -> usize {
    h.iter()
        .map(|(k, v)| k.as_str().len() + 2 + v.len() + 2)
        .sum::<usize>()
        + 2
}

/// An error kind without the URL (so that errors group by kind).
pub(super) fn short(e: &reqwest::Error) -> &'static str {
    if e.is_timeout() {
        "timeout"
    } else if e.is_connect() {
        "connect"
    } else if e.is_body() || e.is_decode() {
        "body"
    } else {
        "request"
    }
}
