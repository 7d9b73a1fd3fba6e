//! The HTTP API (`/v1/...`), health and metrics endpoints, the WebSocket
//! upgrade, and the web app at `/` (the built-in page, or `web_dir`'s files).

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{Path, Request, State};
use axum::handler::HandlerWithoutStateExt;
use axum::http::{header, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{Html, IntoResponse, Response};
use axum::routing::{delete, get, get_service, post, put};
use axum::{Json, Router};
use plaza_core::TicketGrant;
use plaza_protocol::ErrorCode;
use plaza_trajectory::Filter;
use serde::de::DeserializeOwned;
use serde::Deserialize;
use serde_json::{json, Value};

use crate::api_error::ApiError;
use crate::clock::now_ms;
use crate::directory::CreateRoom;
use crate::Node;

type ApiResult<T> = Result<T, ApiError>;

/// The body of a call that takes JSON. Every such route reads its body
/// through this one extractor, so the content type is checked in one place:
/// a body of another type, or of none, is 415 `invalid_request`. An empty
/// body is no body and passes (a route that needs one answers 400). Listed
/// after the credentials' extractors, so an unauthorised call gets 401
/// whatever its body.
pub(crate) struct JsonBody(pub(crate) Bytes);

impl<S: Send + Sync> axum::extract::FromRequest<S> for JsonBody {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, ApiError> {
        use axum::body::HttpBody;
        let body = req.body();
        let has_body = !body.is_end_stream() && body.size_hint().exact() != Some(0);
        if has_body && !is_json_content_type(req.headers()) {
            return Err(ApiError::new(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                ErrorCode::InvalidRequest,
                "this call takes a JSON body: send Content-Type: application/json",
            ));
        }
        // Beyond the framework's body limit (2 MiB) the answer is JSON too,
        // as a route's own limit (`max_frame_bytes`) answers it.
        let bytes = Bytes::from_request(req, state).await.map_err(|e| {
            if e.status() == StatusCode::PAYLOAD_TOO_LARGE {
                ApiError::new(
                    StatusCode::PAYLOAD_TOO_LARGE,
                    ErrorCode::PayloadTooLarge,
                    "the body has more than 2 MiB",
                )
            } else {
                ApiError::new(
                    StatusCode::BAD_REQUEST,
                    ErrorCode::InvalidRequest,
                    e.body_text(),
                )
            }
        })?;
        Ok(JsonBody(bytes))
    }
}

/// `application/json` or an `application/...+json` type, parameters (a
/// `charset`) allowed, in any case: what RFC 6839 and axum's own `Json` take.
pub(crate) fn is_json_content_type(headers: &axum::http::HeaderMap) -> bool {
    let Some(value) = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
    else {
        return false;
    };
    let essence = value
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase();
    essence == "application/json"
        || essence
            .strip_prefix("application/")
            .is_some_and(|sub| sub.len() > "+json".len() && sub.ends_with("+json"))
}

/// Reads a JSON object body into `T`. serde would also read a struct from a
/// JSON array (fields by position), so a top-level array must be refused here.
pub(crate) fn json_object<T: DeserializeOwned>(JsonBody(bytes): JsonBody) -> ApiResult<T> {
    let invalid = |m: String| ApiError::new(StatusCode::BAD_REQUEST, ErrorCode::InvalidRequest, m);
    // Through serde_path_to_error even as a `Value`: a number out of range
    // (`1e400`) is named by its path (`options.max_members`).
    let v: Value =
        serde_path_to_error::deserialize(&mut serde_json::Deserializer::from_slice(&bytes))
            .map_err(|e| invalid(format!("invalid request body: {e}")))?;
    if !v.is_object() {
        return Err(invalid("the request body must be a JSON object".into()));
    }
    // The path names the field at fault (`options.max_members: invalid
    // value: integer `-1`, expected usize`).
    serde_path_to_error::deserialize(v).map_err(|e| invalid(format!("invalid request body: {e}")))
}

pub(crate) fn router(node: Arc<Node>) -> Router {
    let api = Router::new()
        .route("/healthz", get(|| async { Json(json!({"status": "ok"})) }))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .route("/status", get(status_page))
        .route(
            "/v1/status",
            get(|State(node): State<Arc<Node>>| async move { Json(node.status()) }),
        )
        .route("/v1/rooms", get(list_rooms).post(create_room))
        .route("/v1/rooms/{id}", get(get_room).delete(delete_room))
        .route("/v1/rooms/{id}/members", get(crate::admin::members))
        .route(
            "/v1/rooms/{id}/members/{session}/kick",
            post(crate::admin::kick),
        )
        .route("/v1/rooms/{id}/tickets", post(create_ticket))
        .route("/v1/rooms/{id}/publish", post(crate::server_api::publish))
        .route("/v1/rooms/{id}/state", get(crate::server_api::state))
        .route("/v1/rooms/{id}/history", get(crate::server_api::history))
        .route(
            "/v1/rooms/{id}/entities",
            post(crate::server_api::create_entity),
        )
        .route(
            "/v1/rooms/{id}/entities/{entity}",
            put(crate::server_api::set_entity).delete(crate::server_api::delete_entity),
        )
        .route(
            "/v1/rooms/{id}/members/{session}/direct",
            post(crate::server_api::direct),
        )
        .route("/v1/broadcast", post(crate::server_api::broadcast))
        .route(
            "/v1/users/{user}/direct",
            post(crate::server_api::user_direct),
        )
        .route(
            "/v1/users/{user}/disconnect",
            post(crate::server_api::user_disconnect),
        )
        .route("/v1/ws", get(crate::transport::websocket::upgrade))
        .route("/v1/sessions", post(crate::transport::http::open))
        .route("/v1/sessions/{id}", delete(crate::transport::http::close))
        .route("/v1/sessions/{id}/send", post(crate::transport::http::send))
        .route("/v1/sessions/{id}/poll", get(crate::transport::http::poll))
        .route(
            "/v1/sessions/{id}/events",
            get(crate::transport::http::events),
        )
        .route(
            "/v1/trajectory/mean",
            crate::trajectory::route(Filter::Mean),
        )
        .route(
            "/v1/trajectory/median",
            crate::trajectory::route(Filter::Median),
        )
        // Source document 001's load-test client calls the filters at the
        // root; it runs against Plaza (or its balancer) unchanged.
        .route("/trajectory/mean", crate::trajectory::route(Filter::Mean))
        .route(
            "/trajectory/median",
            crate::trajectory::route(Filter::Median),
        );
    let api = if node.serves_demo_tokens() {
        api.route("/v1/demo/token", post(crate::auth::demo::token))
    } else {
        api
    };
    // API routes are matched first: a file never shadows one.
    let app = match &node.config().web_dir {
        None => api.route("/", get(index)).fallback(no_such_route),
        Some(dir) => api.fallback_service(web_app(dir)),
    }
    .method_not_allowed_fallback(method_not_allowed);
    // After the fallback, so that files and 404s carry the header too.
    app.layer(axum::middleware::map_response_with_state(
        node.clone(),
        add_node_header,
    ))
    .with_state(node)
}

/// Proof that a management call (creating or deleting a room, minting a
/// ticket) presented the node's `api_key`, or that none is set. Checked before
/// the body is read, so an unauthorised call learns nothing about it.
pub(crate) struct Management;

impl axum::extract::FromRequestParts<Arc<Node>> for Management {
    type Rejection = Response;

    async fn from_request_parts(
        parts: &mut axum::http::request::Parts,
        node: &Arc<Node>,
    ) -> Result<Self, Self::Rejection> {
        let key = node.config().api_key.as_bytes();
        if key.is_empty() {
            return Ok(Management);
        }
        let given = bearer(&parts.headers);
        let valid = given.is_some_and(|g| same_secret(g.as_bytes(), key));
        if valid {
            return Ok(Management);
        }
        let message = if given.is_some() {
            "wrong API key"
        } else {
            "this call needs the API key: Authorization: Bearer <api_key>"
        };
        Err(unauthorized(ApiError::new(
            StatusCode::UNAUTHORIZED,
            ErrorCode::Unauthorized,
            message,
        )))
    }
}

/// The credentials of `Authorization: Bearer <credentials>`, if given.
pub(crate) fn bearer(headers: &axum::http::HeaderMap) -> Option<&str> {
    headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        // The scheme is case-insensitive (RFC 9110).
        .and_then(|v| v.split_once(' '))
        .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
        .map(|(_, token)| token.trim())
}

/// A 401 answer, with the `WWW-Authenticate` header it must carry.
pub(crate) fn unauthorized(e: ApiError) -> Response {
    let mut res = e.into_response();
    res.headers_mut().insert(
        header::WWW_AUTHENTICATE,
        HeaderValue::from_static("Bearer realm=\"plaza\""),
    );
    res
}

/// Whether `given` is `key`, in a time that depends on neither how much of a
/// guess matched nor its length: a guess of another length is compared as
/// the key with itself, and then refused.
pub(crate) fn same_secret(given: &[u8], key: &[u8]) -> bool {
    use subtle::ConstantTimeEq;
    let same_len = given.len() == key.len();
    let compared = if same_len { given } else { key };
    bool::from(compared.ct_eq(key) & subtle::Choice::from(u8::from(same_len)))
}

/// What an unknown path gets: 404 `not_found`.
async fn no_such_route() -> ApiError {
    ApiError::new(StatusCode::NOT_FOUND, ErrorCode::NotFound, "no such route")
}

/// What a known path with another method gets: 405 `method_not_allowed` (axum
/// adds the `Allow` header).
async fn method_not_allowed(method: axum::http::Method) -> ApiError {
    ApiError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        ErrorCode::MethodNotAllowed,
        format!("{method} is not allowed here"),
    )
}

/// `web_dir` served: `GET /` is `dir/index.html`, any other path a file under
/// `dir` (no directory listings, no `index.html` of subdirectories). A path
/// that leaves `dir` (`..`, also percent-encoded) or names no file gets the
/// JSON 404 of unknown routes, as does a method other than GET or HEAD.
fn web_app(dir: &std::path::Path) -> Router {
    let index = tower_http::services::ServeDir::new(dir).fallback(no_such_route.into_service());
    let files = tower_http::services::ServeDir::new(dir)
        .append_index_html_on_directories(false)
        .call_fallback_on_method_not_allowed(true)
        .fallback(no_such_route.into_service());
    Router::new()
        .route("/", get_service(index))
        .method_not_allowed_fallback(method_not_allowed)
        .fallback_service(files)
        .layer(axum::middleware::from_fn(web_cache_control))
        .layer(axum::middleware::from_fn_with_state(
            // Canonical, as the real paths it is compared with.
            Arc::new(std::fs::canonicalize(dir).unwrap_or_else(|_| dir.to_owned())),
            stay_inside,
        ))
        .layer(axum::middleware::from_fn(hide_dotfiles))
}

/// A symbolic link in the directory may point anywhere: a file is served only
/// if its real path is inside the (canonical) directory.
async fn stay_inside(
    State(dir): State<Arc<std::path::PathBuf>>,
    req: Request,
    next: Next,
) -> Response {
    let path = percent_encoding::percent_decode_str(req.uri().path()).decode_utf8_lossy();
    let wanted = dir.join(path.trim_start_matches('/'));
    // A path that does not resolve is left to ServeDir (its JSON 404).
    if let Ok(real) = tokio::fs::canonicalize(&wanted).await {
        if !real.starts_with(dir.as_path()) {
            return no_such_route().await.into_response();
        }
    }
    next.run(req).await
}

/// Files and directories whose names start with a dot (`.env`, `.git/`) are
/// not served: they are not part of a built web app, and often secret.
async fn hide_dotfiles(req: Request, next: Next) -> Response {
    // Decoded as ServeDir will decode it, so `%2eenv` is caught too.
    let path = percent_encoding::percent_decode_str(req.uri().path()).decode_utf8_lossy();
    if path.split('/').any(|segment| segment.starts_with('.')) {
        return no_such_route().await.into_response();
    }
    next.run(req).await
}

/// Cache lifetimes of served files: Vite names what it puts under `assets/`
/// after a hash of the content, so those never change; anything else
/// (`index.html` above all) must be revalidated on every use.
async fn web_cache_control(req: Request, next: Next) -> Response {
    let immutable = req.uri().path().starts_with("/assets/");
    let mut res = next.run(req).await;
    if res.status().is_success() || res.status() == StatusCode::NOT_MODIFIED {
        let value = if immutable {
            "public, max-age=31536000, immutable"
        } else {
            "no-cache"
        };
        res.headers_mut()
            .insert(header::CACHE_CONTROL, HeaderValue::from_static(value));
    }
    res
}

/// Names the node on every response, so that behind a load balancer one can
/// tell where a request (or a WebSocket) landed.
async fn add_node_header(State(node): State<Arc<Node>>, mut res: Response) -> Response {
    if let Ok(v) = HeaderValue::from_str(node.id()) {
        res.headers_mut().insert("x-plaza-node", v);
    }
    res
}

async fn index() -> Html<&'static str> {
    Html(include_str!("../assets/index.html"))
}

async fn status_page() -> Html<&'static str> {
    Html(include_str!("../assets/status.html"))
}

async fn readyz(State(node): State<Arc<Node>>) -> Response {
    let ready = !node.is_shutting_down() && node.tickets().ready().await;
    let status = if ready {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    let body = json!({
        "ready": ready,
        "broker": node.broker_kind(),
        "node": node.id(),
        "shutting_down": node.is_shutting_down(),
    });
    (status, Json(body)).into_response()
}

async fn metrics(State(node): State<Arc<Node>>) -> Response {
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        node.render_metrics(),
    )
        .into_response()
}

async fn list_rooms(State(node): State<Arc<Node>>) -> ApiResult<Response> {
    let list = node.list_rooms().await?;
    let mut body = json!({"rooms": list.rooms});
    if !list.complete {
        body["incomplete"] = json!(true);
    }
    Ok(Json(body).into_response())
}

async fn create_room(
    _: Management,
    State(node): State<Arc<Node>>,
    body: JsonBody,
) -> ApiResult<Response> {
    if node.is_shutting_down() {
        return Err(ApiError::shutting_down());
    }
    let spec: CreateRoom = json_object(body)?;
    let room = node.create_room(spec).await?;
    Ok((StatusCode::CREATED, Json(room)).into_response())
}

async fn get_room(State(node): State<Arc<Node>>, Path(id): Path<String>) -> ApiResult<Response> {
    node.room_summary(&id)
        .await?
        .map(|r| Json(r).into_response())
        .ok_or_else(|| {
            ApiError::new(
                StatusCode::NOT_FOUND,
                ErrorCode::RoomNotFound,
                format!("no room {id:?}"),
            )
        })
}

async fn delete_room(
    _: crate::admin::RoomAdmin,
    State(node): State<Arc<Node>>,
    Path(id): Path<String>,
) -> ApiResult<StatusCode> {
    if node.delete_room(&id).await? {
        Ok(StatusCode::NO_CONTENT)
    } else {
        Err(ApiError::new(
            StatusCode::NOT_FOUND,
            ErrorCode::RoomNotFound,
            format!("no room {id:?}"),
        ))
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TicketRequest {
    name: String,
    #[serde(default)]
    platform: Option<String>,
}

async fn create_ticket(
    _: Management,
    State(node): State<Arc<Node>>,
    Path(id): Path<String>,
    body: JsonBody,
) -> ApiResult<Response> {
    let req: TicketRequest = json_object(body)?;
    if node.room_summary(&id).await?.is_none() {
        return Err(ApiError::new(
            StatusCode::NOT_FOUND,
            ErrorCode::RoomNotFound,
            format!("no room {id:?}"),
        ));
    }
    let platform = req.platform.unwrap_or_else(|| "browser".into());
    if req.name.is_empty() || req.name.len() > 64 || platform.is_empty() || platform.len() > 32 {
        return Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            ErrorCode::InvalidRequest,
            "name must have 1 to 64 bytes and platform 1 to 32",
        ));
    }
    let grant = TicketGrant {
        room: id,
        name: req.name,
        platform,
    };
    let t = node
        .tickets()
        .issue_ticket(grant, node.config().ticket_ttl_ms, now_ms())
        .await?;
    Ok((
        StatusCode::CREATED,
        Json(json!({"ticket": t.ticket, "expires_at": t.expires_at})),
    )
        .into_response())
}

#[cfg(test)]
mod tests {
    use super::same_secret;

    #[test]
    fn only_the_key_itself_is_the_same_secret() {
        let key = b"0123456789abcdef";
        assert!(same_secret(key, key));
        assert!(!same_secret(b"0123456789abcdeX", key));
        assert!(!same_secret(b"0123456789abcde", key));
        assert!(!same_secret(b"0123456789abcdef0", key));
        assert!(!same_secret(b"", key));
    }
}
