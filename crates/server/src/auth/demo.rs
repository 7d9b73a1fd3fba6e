//! `POST /v1/demo/token` (with `demo_tokens`): the demo page's stand-in for
//! an application's backend. It signs a token for anyone who asks, so it
//! must never run on a public server; a real backend signs only for users it
//! has authenticated, with the rights its own rules give them.

use std::sync::Arc;

use axum::extract::State;
use axum::http::StatusCode;
use axum::Json;
use jsonwebtoken::{encode, Algorithm, EncodingKey, Header};
use plaza_protocol::ErrorCode;
use serde::Deserialize;
use serde_json::{json, Value};

use crate::api_error::ApiError;
use crate::clock::now_ms;
use crate::Node;

/// How long a demo token lasts: short, so the page's refresh is exercised.
const DEMO_TOKEN_TTL_MS: u64 = 10 * 60 * 1000;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct DemoTokenRequest {
    name: String,
    /// The user id to sign for again (a refresh); a new one when absent.
    #[serde(default)]
    user: Option<String>,
}

/// Signs a token for `{"name", "user"?}`: every member right (not `admin`)
/// in every room, for ten minutes. Answers `{"token", "user", "expires_at"}`.
pub(crate) async fn token(
    State(node): State<Arc<Node>>,
    body: crate::http::JsonBody,
) -> Result<Json<Value>, ApiError> {
    let invalid = |m: String| ApiError::new(StatusCode::BAD_REQUEST, ErrorCode::InvalidRequest, m);
    let req: DemoTokenRequest = crate::http::json_object(body)?;
    if req.name.is_empty() || req.name.len() > 64 {
        return Err(invalid("name must have 1 to 64 bytes".into()));
    }
    let user = match req.user {
        Some(u) if u.starts_with("demo-") && u.len() <= 64 => u,
        Some(_) => return Err(invalid("user must be a demo user id (demo-...)".into())),
        None => format!("demo-{}", plaza_broker::new_session_id()),
    };
    let expires_at = now_ms() + DEMO_TOKEN_TTL_MS;
    let claims = json!({
        "sub": user,
        "name": req.name,
        "exp": expires_at / 1000,
        "rooms": {"*": ["join", "publish", "entities", "locks", "direct", "move"]},
    });
    let key = EncodingKey::from_secret(node.config().jwt_secret.as_bytes());
    let token = encode(&Header::new(Algorithm::HS256), &claims, &key).map_err(|e| {
        ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            ErrorCode::Internal,
            format!("signing failed: {e}"),
        )
    })?;
    Ok(Json(
        json!({"token": token, "user": user, "expires_at": (expires_at / 1000) * 1000}),
    ))
}
