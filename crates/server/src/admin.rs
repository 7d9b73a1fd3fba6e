//! A room's admin calls over HTTP: list its members, kick one, delete the
//! room. Allowed with the node's `api_key`, or with a token granting `admin`
//! in that room; open only on a node with neither (development).

use std::collections::HashMap;
use std::sync::Arc;

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use plaza_core::Right;
use plaza_protocol::ErrorCode;
use serde::Deserialize;
use serde_json::json;

use crate::api_error::ApiError;
use crate::clock::now_ms;
use crate::http::{bearer, same_secret, unauthorized};
use crate::Node;

/// Proof that an admin call on room `{id}` is allowed.
pub(crate) struct RoomAdmin;

impl axum::extract::FromRequestParts<Arc<Node>> for RoomAdmin {
    type Rejection = Response;

    async fn from_request_parts(
        parts: &mut axum::http::request::Parts,
        node: &Arc<Node>,
    ) -> Result<Self, Self::Rejection> {
        let key = node.config().api_key.as_bytes();
        let tokens = node.tokens();
        let given = bearer(&parts.headers);
        if key.is_empty() && tokens.is_none() {
            return Ok(RoomAdmin);
        }
        let Some(given) = given else {
            let needs = match (key.is_empty(), tokens.is_some()) {
                (false, true) => "the API key or a token with the admin right",
                (false, false) => "the API key",
                _ => "a token with the admin right",
            };
            return Err(unauthorized(ApiError::new(
                StatusCode::UNAUTHORIZED,
                ErrorCode::Unauthorized,
                format!("this call needs {needs}: Authorization: Bearer <credentials>"),
            )));
        };
        if !key.is_empty() && same_secret(given.as_bytes(), key) {
            return Ok(RoomAdmin);
        }
        let Some(tokens) = tokens else {
            return Err(unauthorized(ApiError::new(
                StatusCode::UNAUTHORIZED,
                ErrorCode::Unauthorized,
                "wrong API key",
            )));
        };
        let identity = tokens
            .verify(given, now_ms())
            .map_err(|e| unauthorized(e.into()))?;
        let params: HashMap<String, String> =
            Path::<HashMap<String, String>>::from_request_parts(parts, node)
                .await
                .map(|Path(p)| p)
                .map_err(IntoResponse::into_response)?;
        let room = params.get("id").map(String::as_str).unwrap_or_default();
        if identity
            .grants
            .for_room(room)
            .is_some_and(|r| r.may(Right::Admin))
        {
            return Ok(RoomAdmin);
        }
        Err(ApiError::new(
            StatusCode::FORBIDDEN,
            ErrorCode::Forbidden,
            format!("the token grants no admin in room {room:?}"),
        )
        .into_response())
    }
}

/// `GET /v1/rooms/{id}/members`: the connected members, ordered by session.
pub(crate) async fn members(
    _: RoomAdmin,
    State(node): State<Arc<Node>>,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    let members = node.room_members(&id).await?;
    Ok(Json(json!({"room": id, "members": members})).into_response())
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct KickRequest {
    #[serde(default)]
    message: Option<String>,
}

/// The longest kick message, in bytes.
const MAX_KICK_MESSAGE: usize = 200;

/// `POST /v1/rooms/{id}/members/{session}/kick` with an optional
/// `{"message"}`: the member is out for good (no resume).
pub(crate) async fn kick(
    _: RoomAdmin,
    State(node): State<Arc<Node>>,
    Path((id, session)): Path<(String, String)>,
    crate::http::JsonBody(body): crate::http::JsonBody,
) -> Result<StatusCode, ApiError> {
    let invalid = |m: String| ApiError::new(StatusCode::BAD_REQUEST, ErrorCode::InvalidRequest, m);
    let req: KickRequest = if body.iter().all(u8::is_ascii_whitespace) {
        KickRequest { message: None }
    } else {
        let v: serde_json::Value = serde_json::from_slice(&body)
            .map_err(|e| invalid(format!("invalid request body: {e}")))?;
        if !v.is_object() {
            return Err(invalid("the request body must be a JSON object".into()));
        }
        serde_json::from_value(v).map_err(|e| invalid(format!("invalid request body: {e}")))?
    };
    if req
        .message
        .as_ref()
        .is_some_and(|m| m.len() > MAX_KICK_MESSAGE)
    {
        return Err(invalid(format!(
            "message has more than {MAX_KICK_MESSAGE} bytes"
        )));
    }
    node.kick(&id, &session, req.message).await?;
    Ok(StatusCode::NO_CONTENT)
}
