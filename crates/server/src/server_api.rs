//! The server API: what the application's backend does over HTTP besides
//! managing rooms — publish into rooms (one or many), message one session or
//! every session of a user, read a room's state and history, change its
//! entities, and disconnect a user everywhere.
//!
//! Changes go through the room's one path ([`Intent`]s, logged in cluster
//! mode), so members see them as any other event. Reads are answered from
//! the room as this node holds it. Calls about a user act on every node: in
//! cluster mode they travel on the broker's control channel.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use plaza_core::{RoomError, ServerPublish, SERVER_SENDER};
use plaza_protocol::client::{HistoryRequest, Op, MAX_JOIN_HISTORY};
use plaza_protocol::server::ServerFrame;
use plaza_protocol::ErrorCode;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use serde_json::{json, Value};

use crate::admin::RoomAdmin;
use crate::api_error::ApiError;
use crate::clock::now_ms;
use crate::http::{JsonBody, Management};
use crate::room::Intent;
use crate::Node;

type ApiResult<T> = Result<T, ApiError>;

/// Rooms one broadcast may name at most.
pub const MAX_BROADCAST_ROOMS: usize = 1000;

/// The longest `reason` of a user's disconnect, in bytes.
const MAX_REASON: usize = 200;

/// A request body: at most `max_frame_bytes` (413 `payload_too_large`), a
/// JSON object (400 `invalid_request` otherwise, naming the field at fault).
fn body<T: DeserializeOwned>(node: &Node, bytes: &Bytes) -> ApiResult<T> {
    let max = node.config().max_frame_bytes;
    if bytes.len() > max {
        return Err(ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            ErrorCode::PayloadTooLarge,
            format!(
                "the body has {} bytes; at most {max} (max_frame_bytes)",
                bytes.len()
            ),
        ));
    }
    let invalid = |m: String| ApiError::new(StatusCode::BAD_REQUEST, ErrorCode::InvalidRequest, m);
    let text = std::str::from_utf8(bytes).map_err(|_| invalid("the body is not UTF-8".into()))?;
    if !text.trim_start().starts_with('{') {
        return Err(invalid("the request body must be a JSON object".into()));
    }
    let de = &mut serde_json::Deserializer::from_str(text);
    serde_path_to_error::deserialize(de).map_err(|e| invalid(format!("invalid request body: {e}")))
}

fn invalid(message: impl Into<String>) -> ApiError {
    ApiError::new(StatusCode::BAD_REQUEST, ErrorCode::InvalidRequest, message)
}

fn main_channel() -> String {
    plaza_protocol::DEFAULT_CHANNEL.to_owned()
}

/// `POST /v1/rooms/{id}/publish` and each room of a broadcast.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PublishBody {
    #[serde(default = "main_channel")]
    channel: String,
    event: String,
    #[serde(default)]
    data: Option<Box<RawValue>>,
    #[serde(default)]
    topic: Option<String>,
    #[serde(default)]
    reply_to: Option<u64>,
    #[serde(default)]
    idempotency_key: Option<String>,
}

impl PublishBody {
    fn check(&self) -> ApiResult<()> {
        if self.event.is_empty() || self.event.len() > 64 {
            return Err(invalid(format!(
                "event names have 1 to 64 bytes: {:?}",
                self.event
            )));
        }
        if self.topic.as_ref().is_some_and(|t| t.len() > 64) {
            return Err(invalid("topic has more than 64 bytes"));
        }
        Ok(())
    }

    fn into_params(self) -> ServerPublish {
        ServerPublish {
            channel: self.channel,
            event: self.event,
            data: self.data,
            topic: self.topic,
            reply_to: self.reply_to,
            key: self.idempotency_key,
        }
    }
}

/// `POST /v1/rooms/{id}/publish`: `{"room", "seq", "duplicate"}`.
pub(crate) async fn publish(
    _: RoomAdmin,
    State(node): State<Arc<Node>>,
    Path(id): Path<String>,
    JsonBody(bytes): JsonBody,
) -> ApiResult<Response> {
    let req: PublishBody = body(&node, &bytes)?;
    req.check()?;
    let answer = node.server_publish(&id, req.into_params()).await?;
    Ok(Json(with_room(&id, answer)).into_response())
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct BroadcastBody {
    rooms: Vec<String>,
    #[serde(default = "main_channel")]
    channel: String,
    event: String,
    #[serde(default)]
    data: Option<Box<RawValue>>,
    #[serde(default)]
    topic: Option<String>,
    #[serde(default)]
    idempotency_key: Option<String>,
}

/// One room's outcome in a broadcast.
#[derive(Serialize)]
struct RoomOutcome {
    room: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    seq: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    duplicate: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<Value>,
}

/// `POST /v1/broadcast`: one message into many rooms, answered per room in
/// the order given; one room's failure does not hide the others' results.
pub(crate) async fn broadcast(
    _: Management,
    State(node): State<Arc<Node>>,
    JsonBody(bytes): JsonBody,
) -> ApiResult<Response> {
    let req: BroadcastBody = body(&node, &bytes)?;
    if req.rooms.is_empty() || req.rooms.len() > MAX_BROADCAST_ROOMS {
        return Err(invalid(format!(
            "rooms names 1 to {MAX_BROADCAST_ROOMS} rooms, not {}",
            req.rooms.len()
        )));
    }
    let mut seen = std::collections::HashSet::new();
    if let Some(dup) = req.rooms.iter().find(|r| !seen.insert(r.as_str())) {
        return Err(invalid(format!("room {dup:?} is named twice")));
    }
    PublishBody {
        channel: req.channel.clone(),
        event: req.event.clone(),
        data: None,
        topic: req.topic.clone(),
        reply_to: None,
        idempotency_key: None,
    }
    .check()?;
    let calls = req.rooms.iter().map(|room| {
        let params = ServerPublish {
            channel: req.channel.clone(),
            event: req.event.clone(),
            data: req.data.clone(),
            topic: req.topic.clone(),
            reply_to: None,
            key: req.idempotency_key.clone(),
        };
        let node = &node;
        async move {
            match node.server_publish(room, params).await {
                Ok(v) => RoomOutcome {
                    room: room.clone(),
                    seq: v["seq"].as_u64(),
                    duplicate: v["duplicate"].as_bool(),
                    error: None,
                },
                Err(e) => RoomOutcome {
                    room: room.clone(),
                    seq: None,
                    duplicate: None,
                    error: Some(json!({"code": e.code.as_str(), "message": e.message})),
                },
            }
        }
    });
    let results = futures_util::future::join_all(calls).await;
    Ok(Json(json!({ "results": results })).into_response())
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct DirectBody {
    event: String,
    #[serde(default)]
    data: Option<Box<RawValue>>,
}

impl DirectBody {
    fn check(&self) -> ApiResult<()> {
        if self.event.is_empty() || self.event.len() > 64 {
            return Err(invalid(format!(
                "event names have 1 to 64 bytes: {:?}",
                self.event
            )));
        }
        Ok(())
    }
}

/// `POST /v1/rooms/{id}/members/{session}/direct`: a `direct` frame from
/// `@server` to one connected session.
pub(crate) async fn direct(
    _: RoomAdmin,
    State(node): State<Arc<Node>>,
    Path((id, session)): Path<(String, String)>,
    JsonBody(bytes): JsonBody,
) -> ApiResult<Response> {
    let req: DirectBody = body(&node, &bytes)?;
    req.check()?;
    let intent = Intent::ServerDirect {
        to: session,
        event: req.event,
        data: req.data,
    };
    let answer = node.room_call(&id, intent).await?;
    Ok(Json(with_room(&id, answer)).into_response())
}

/// What a call about a user asks of every node.
// Externally tagged: an internally tagged enum buffers its fields, which
// `RawValue` payloads do not survive.
#[derive(Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum UserCall {
    /// A `direct` frame to each of its sessions, in every room.
    Direct {
        user: String,
        event: String,
        #[serde(default)]
        data: Option<Box<RawValue>>,
    },
    /// Each of its sessions is kicked from its room, with `reason`.
    Disconnect {
        user: String,
        #[serde(default)]
        reason: Option<String>,
    },
}

fn check_user(user: &str) -> ApiResult<()> {
    if user.is_empty() || user.len() > 256 {
        return Err(invalid("a user id has 1 to 256 bytes"));
    }
    Ok(())
}

/// `POST /v1/users/{user}/direct`: a `direct` frame to every session of the
/// user, in every room, on every node. 202: nodes act on their own.
pub(crate) async fn user_direct(
    _: Management,
    State(node): State<Arc<Node>>,
    Path(user): Path<String>,
    JsonBody(bytes): JsonBody,
) -> ApiResult<Response> {
    check_user(&user)?;
    let req: DirectBody = body(&node, &bytes)?;
    req.check()?;
    let call = UserCall::Direct {
        user: user.clone(),
        event: req.event,
        data: req.data,
    };
    node.call_for_user(call).await?;
    Ok((StatusCode::ACCEPTED, Json(json!({"user": user}))).into_response())
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct DisconnectBody {
    #[serde(default)]
    reason: Option<String>,
}

/// `POST /v1/users/{user}/disconnect`: every session of the user, on every
/// node, is removed for good (`closed`, reason `kicked`, with `reason`).
pub(crate) async fn user_disconnect(
    _: Management,
    State(node): State<Arc<Node>>,
    Path(user): Path<String>,
    JsonBody(bytes): JsonBody,
) -> ApiResult<Response> {
    check_user(&user)?;
    let req: DisconnectBody = if bytes.iter().all(u8::is_ascii_whitespace) {
        DisconnectBody { reason: None }
    } else {
        body(&node, &bytes)?
    };
    if req.reason.as_ref().is_some_and(|r| r.len() > MAX_REASON) {
        return Err(invalid(format!("reason has more than {MAX_REASON} bytes")));
    }
    let call = UserCall::Disconnect {
        user: user.clone(),
        reason: req.reason,
    };
    node.call_for_user(call).await?;
    Ok((StatusCode::ACCEPTED, Json(json!({"user": user}))).into_response())
}

/// `GET /v1/rooms/{id}/state`: the room's entities, locks and members, and
/// the seq they reflect.
pub(crate) async fn state(
    _: RoomAdmin,
    State(node): State<Arc<Node>>,
    Path(id): Path<String>,
) -> ApiResult<Response> {
    let state = node
        .read_room(&id, |room| {
            let snapshot = room.snapshot(now_ms());
            json!({
                "room": room.id(),
                "epoch": room.epoch(),
                "seq": room.seq(),
                "entities": snapshot.entities,
                "locks": snapshot.locks,
                "members": room.members_info(),
            })
        })
        .await?;
    Ok(Json(state).into_response())
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct HistoryQuery {
    #[serde(default = "main_channel")]
    channel: String,
    #[serde(default)]
    last: Option<u32>,
    #[serde(default)]
    since: Option<u64>,
}

/// `GET /v1/rooms/{id}/history?channel=&last=&since=`: a channel's messages,
/// as a join's `history` gets them.
pub(crate) async fn history(
    _: RoomAdmin,
    State(node): State<Arc<Node>>,
    Path(id): Path<String>,
    query: Result<Query<HistoryQuery>, axum::extract::rejection::QueryRejection>,
) -> ApiResult<Response> {
    let Query(q) = query.map_err(|e| invalid(e.body_text()))?;
    if q.last.is_some_and(|l| l == 0 || l > MAX_JOIN_HISTORY) {
        return Err(invalid(format!("last is 1 to {MAX_JOIN_HISTORY}")));
    }
    let request = HistoryRequest {
        channel: q.channel,
        last: q.last,
        since: q.since,
    };
    let answer = node
        .read_room(&id, move |room| {
            let h = room.history(&request);
            json!({
                "room": room.id(),
                "seq": room.seq(),
                "events": h.events,
                "complete": h.complete,
            })
        })
        .await?;
    Ok(Json(answer).into_response())
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct EntityBody {
    #[serde(default)]
    kind: Option<String>,
    data: Value,
}

/// `POST /v1/rooms/{id}/entities` `{"kind"?, "data"}`: 201 with the entity.
pub(crate) async fn create_entity(
    _: RoomAdmin,
    State(node): State<Arc<Node>>,
    Path(id): Path<String>,
    JsonBody(bytes): JsonBody,
) -> ApiResult<Response> {
    let req: EntityBody = body(&node, &bytes)?;
    let op = Op::EntityCreate {
        kind: req.kind,
        data: req.data,
    };
    let answer = node.server_request(&id, op).await?;
    Ok((StatusCode::CREATED, Json(with_room(&id, answer))).into_response())
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SetBody {
    data: Value,
}

/// The version `If-Match` names, if any: a number, quoted or not (an ETag
/// is quoted). `*` is any version, as no header.
fn if_match(headers: &HeaderMap) -> ApiResult<Option<u64>> {
    let Some(v) = headers.get(header::IF_MATCH) else {
        return Ok(None);
    };
    let text = v.to_str().unwrap_or_default().trim();
    if text == "*" {
        return Ok(None);
    }
    let bare = text.strip_prefix("W/").unwrap_or(text).trim_matches('"');
    bare.parse::<u64>()
        .map(Some)
        .map_err(|_| invalid(format!("If-Match must be an entity version, not {text:?}")))
}

/// `PUT /v1/rooms/{id}/entities/{entity}` `{"data"}`, with `If-Match:
/// <version>` to change only that version (412 `version_conflict` otherwise).
pub(crate) async fn set_entity(
    _: RoomAdmin,
    State(node): State<Arc<Node>>,
    Path((id, entity)): Path<(String, String)>,
    headers: HeaderMap,
    JsonBody(bytes): JsonBody,
) -> ApiResult<Response> {
    let version = if_match(&headers)?;
    let req: SetBody = body(&node, &bytes)?;
    let op = Op::EntitySet {
        id: entity,
        data: req.data,
        version,
    };
    let answer = node.server_request(&id, op).await?;
    Ok(Json(with_room(&id, answer)).into_response())
}

/// `DELETE /v1/rooms/{id}/entities/{entity}`, with an optional `If-Match`.
pub(crate) async fn delete_entity(
    _: RoomAdmin,
    State(node): State<Arc<Node>>,
    Path((id, entity)): Path<(String, String)>,
    headers: HeaderMap,
) -> ApiResult<Response> {
    let version = if_match(&headers)?;
    let op = Op::EntityDelete {
        id: entity,
        version,
    };
    let answer = node.server_request(&id, op).await?;
    Ok(Json(with_room(&id, answer)).into_response())
}

/// The room's id put first in an answer object.
fn with_room(room: &str, answer: Value) -> Value {
    let mut out = serde_json::Map::new();
    out.insert("room".into(), Value::String(room.to_owned()));
    if let Value::Object(fields) = answer {
        out.extend(fields);
    }
    Value::Object(out)
}

impl Node {
    /// Publishes a message of the application's backend into `room`:
    /// `{"seq", "duplicate"}`.
    pub(crate) async fn server_publish(
        &self,
        room: &str,
        params: ServerPublish,
    ) -> Result<Value, RoomError> {
        self.room_call(room, Intent::ServerPublish { params }).await
    }

    /// Applies an entity change of the application's backend to `room`.
    pub(crate) async fn server_request(&self, room: &str, op: Op) -> Result<Value, RoomError> {
        self.room_call(room, Intent::ServerRequest { op }).await
    }

    /// Has every node act on `call`: in cluster mode through the broker's
    /// control channel (this node hears it there too), else here.
    pub(crate) async fn call_for_user(&self, call: UserCall) -> Result<(), RoomError> {
        match self.cluster() {
            Some(cluster) => {
                let payload = serde_json::to_vec(&call).expect("user calls serialize");
                cluster.publish_control(payload.into()).await?;
            }
            None => self.act_for_user(call).await,
        }
        Ok(())
    }

    /// Carries out `call` for the user's sessions connected to this node.
    pub(crate) async fn act_for_user(&self, call: UserCall) {
        let user = match &call {
            UserCall::Direct { user, .. } | UserCall::Disconnect { user, .. } => user.clone(),
        };
        for handle in self.held_rooms() {
            let who = user.clone();
            match &call {
                UserCall::Direct { event, data, .. } => {
                    let (event, data) = (event.clone(), data.clone());
                    // Sent from the room's task: after the events it sent so far.
                    let _ = handle
                        .read(move |room| {
                            for m in room.sessions_of_user(&who) {
                                let Some(outbox) = m.sink.as_ref().and_then(|s| s.outbox.as_ref())
                                else {
                                    continue;
                                };
                                let frame = ServerFrame::Direct {
                                    room: room.id().to_owned(),
                                    from: SERVER_SENDER.to_owned(),
                                    event: event.clone(),
                                    data: data.clone(),
                                };
                                outbox.send(frame.encode());
                            }
                        })
                        .await;
                }
                UserCall::Disconnect { reason, .. } => {
                    let sessions = handle
                        .read(move |room| {
                            room.sessions_of_user(&who)
                                .into_iter()
                                .filter(|m| m.sink.as_ref().is_some_and(|s| s.outbox.is_some()))
                                .map(|m| m.info.session.clone())
                                .collect::<Vec<_>>()
                        })
                        .await
                        .unwrap_or_default();
                    for session in sessions {
                        if let Err(e) = handle.kick(session, reason.clone()).await {
                            tracing::debug!(room = handle.id(), error = %e, "disconnect of a user");
                        }
                    }
                }
            }
        }
    }

    /// Starts hearing calls about users from other nodes (cluster mode);
    /// tried again until the broker takes it.
    pub(crate) fn listen_for_user_calls(self: &Arc<Self>) {
        let Some(cluster) = self.cluster().cloned() else {
            return;
        };
        let node = Arc::downgrade(self);
        let listener: plaza_broker::LogListener = Arc::new(move |notice| {
            let plaza_broker::LogNotice::Entry(entry) = notice else {
                return;
            };
            let Some(node) = node.upgrade() else { return };
            match serde_json::from_slice::<UserCall>(&entry.payload) {
                Ok(call) => {
                    tokio::spawn(async move { node.act_for_user(call).await });
                }
                Err(e) => tracing::warn!(error = %e, "malformed control message"),
            }
        });
        let token = self.shutdown_token();
        tokio::spawn(async move {
            loop {
                match cluster.subscribe_control(listener.clone()).await {
                    Ok(()) => return,
                    Err(e) => tracing::warn!(error = %e, "cannot hear user calls yet"),
                }
                tokio::select! {
                    _ = tokio::time::sleep(std::time::Duration::from_secs(1)) => {}
                    _ = token.cancelled() => return,
                }
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::UserCall;

    /// What one node publishes, every node reads back: payloads included.
    #[test]
    fn user_calls_round_trip_with_raw_payloads() {
        let call = UserCall::Direct {
            user: "u1".into(),
            event: "e".into(),
            data: Some(
                serde_json::value::RawValue::from_string(r#"{"n": [1, 2.5]}"#.into()).unwrap(),
            ),
        };
        let bytes = serde_json::to_vec(&call).unwrap();
        match serde_json::from_slice::<UserCall>(&bytes).unwrap() {
            UserCall::Direct { user, data, .. } => {
                assert_eq!(user, "u1");
                assert_eq!(data.unwrap().get(), r#"{"n": [1, 2.5]}"#);
            }
            UserCall::Disconnect { .. } => panic!("read back as another call"),
        }
    }
}
