//! The HTTP transports over real HTTP: long polling and server-sent events,
//! with the same sessions, answers and resume as WebSocket, and their errors.

use std::time::Duration;

use plaza_server::ServerConfig;
use serde_json::{json, Value};

use crate::support::{wait_until, TestServer};

const ROOM: &str = "http";

/// A client of the long-polling transport.
pub(crate) struct Poller<'a> {
    s: &'a TestServer,
    id: String,
    /// The last position received.
    ack: u64,
    /// Frames received and not looked at yet.
    pending: std::collections::VecDeque<Value>,
}

impl<'a> Poller<'a> {
    pub(crate) async fn open(s: &'a TestServer) -> Poller<'a> {
        Self::open_at(s, "/v1/sessions").await
    }

    /// Opens a session with `POST path` (`/v1/sessions?token=...`, say).
    pub(crate) async fn open_at(s: &'a TestServer, path: &str) -> Poller<'a> {
        let (status, body) = s.post(path, &json!({})).await;
        assert_eq!(status, 201, "{body}");
        let id = body["session"].as_str().unwrap().to_owned();
        assert!(id.len() >= 32, "an unguessable id: {id}");
        assert_eq!(body["poll_timeout_ms"], 25_000);
        Poller {
            s,
            id,
            ack: 0,
            pending: Default::default(),
        }
    }

    pub(crate) async fn send(&self, frame: Value) {
        let (status, body) = self
            .s
            .post(&format!("/v1/sessions/{}/send", self.id), &frame)
            .await;
        assert_eq!(status, 202, "{body}");
    }

    /// One poll acknowledging `ack`: (status, body).
    async fn poll_at(&self, ack: u64) -> (u16, Value) {
        self.s
            .get(&format!("/v1/sessions/{}/poll?ack={ack}", self.id))
            .await
    }

    /// Polls until frames come; acknowledges them next time.
    async fn frames(&mut self) -> Vec<Value> {
        let (status, body) = self.poll_at(self.ack).await;
        assert_eq!(status, 200, "{body}");
        self.ack = body["last"].as_u64().unwrap();
        body["frames"].as_array().unwrap().clone()
    }

    /// Frames until one satisfies `f`; returns it (those after it stay
    /// for the next call).
    pub(crate) async fn until(&mut self, f: impl Fn(&Value) -> bool) -> Value {
        loop {
            while let Some(v) = self.pending.pop_front() {
                if f(&v) {
                    return v;
                }
            }
            let more = self.frames().await;
            self.pending.extend(more);
        }
    }
}

/// Ann's long-polling session once joined: its id, the position read, her `joined`.
struct PollingAnn {
    id: String,
    ack: u64,
    joined: Value,
}

impl<'a> Poller<'a> {
    /// Goes on reading `ann`'s session on `s`.
    fn continuing(s: &'a TestServer, ann: &PollingAnn) -> Poller<'a> {
        Poller {
            s,
            id: ann.id.clone(),
            ack: ann.ack,
            pending: Default::default(),
        }
    }
}

/// A server with `config`, room [`ROOM`], bob there over WebSocket and ann
/// joined over long polling (bob has seen her join).
async fn bob_and_polling_ann(
    config: ServerConfig,
) -> (TestServer, crate::support::Client, PollingAnn) {
    let s = TestServer::with_config(config).await;
    s.create_room(json!({"id": ROOM})).await;
    let (mut bob, _) = s.join(ROOM, "bob").await;
    let mut ann = Poller::open(&s).await;
    ann.send(json!({"type": "join", "room": ROOM, "name": "ann"}))
        .await;
    let joined = ann.until(|v| v["type"] == "joined").await;
    bob.recv_event("presence.join").await;
    let ann = PollingAnn {
        id: ann.id.clone(),
        ack: ann.ack,
        joined,
    };
    (s, bob, ann)
}

#[tokio::test]
async fn long_polling_joins_publishes_and_gets_a_lost_response_again() {
    let s = TestServer::start().await;
    s.create_room(json!({"id": ROOM})).await;
    let (mut bob, _) = s.join(ROOM, "bob").await;
    let mut ann = Poller::open(&s).await;
    ann.send(json!({"type": "join", "room": ROOM, "name": "ann"}))
        .await;
    let first = ann.frames().await;
    assert_eq!(first[0]["type"], "joined", "{first:?}");
    assert_eq!(ann.ack, first.len() as u64, "positions count from 1");
    bob.recv_event("presence.join").await;

    // A batch of frames, handled in order: two publishes, two acks in order.
    let (status, body) = s
        .post(
            &format!("/v1/sessions/{}/send", ann.id),
            &json!([
                {"type": "publish", "room": ROOM, "event": "chat", "data": 1, "id": "a1"},
                {"type": "publish", "room": ROOM, "event": "chat", "data": 2, "id": "a2"}
            ]),
        )
        .await;
    assert_eq!((status, body), (202, json!({"accepted": 2})));
    let before = ann.ack;
    let mut acks = Vec::new();
    while acks.len() < 2 {
        for f in ann.frames().await {
            if f["type"] == "ack" {
                acks.push(f["id"].clone());
            }
        }
    }
    assert_eq!(acks, [json!("a1"), json!("a2")]);
    for d in [1, 2] {
        let (ev, _) = bob.recv_until(|v| v["kind"] == "message").await;
        assert_eq!(ev["data"], d);
    }

    // The response to that poll "got lost": polling again from the old ack
    // gives the same frames again.
    let (status, again) = ann.poll_at(before).await;
    assert_eq!(status, 200);
    let again = again["frames"].as_array().unwrap().clone();
    let acked: Vec<&Value> = again.iter().filter(|f| f["type"] == "ack").collect();
    assert_eq!(acked.len(), 2, "{again:?}");

    // Bob's message reaches ann by poll.
    bob.send(json!({"type": "publish", "room": ROOM, "event": "chat", "data": "hi"}))
        .await;
    let ev = ann.until(|v| v["kind"] == "message").await;
    assert_eq!(ev["data"], "hi");
}

#[tokio::test]
async fn a_poll_is_held_until_a_frame_comes() {
    let s = TestServer::start().await;
    s.create_room(json!({"id": ROOM})).await;
    let mut ann = Poller::open(&s).await;
    ann.send(json!({"type": "join", "room": ROOM, "name": "ann"}))
        .await;
    ann.frames().await;
    let ack = ann.ack;
    let url = s.url(&format!("/v1/sessions/{}/poll?ack={ack}", ann.id));
    let probe = format!("/v1/sessions/{}/poll?ack={ack}&wait_ms=0", ann.id);
    // Nothing to send yet: the poll waits, and a second poll is refused
    // meanwhile (probes that do not wait; when one comes first, the held
    // poll is the one refused and is sent again).
    let mut held = None;
    let server = &s;
    let waiting = wait_until(|| {
        // A held poll refused (a probe came first) is sent again; a new one
        // gets a round to arrive before the next probe.
        let pending = held
            .take()
            .filter(|h: &tokio::task::JoinHandle<_>| !h.is_finished());
        let fresh = pending.is_none();
        let http = s.http.clone();
        let url = url.clone();
        held = Some(pending.unwrap_or_else(|| {
            tokio::spawn(async move { http.get(url).send().await.unwrap().json::<Value>().await })
        }));
        let probe = probe.clone();
        async move {
            if fresh {
                return false;
            }
            let (status, body) = server.get(&probe).await;
            assert!(status == 409 || body["frames"] == json!([]), "{body}");
            status == 409 && body["error"]["code"] == "already_reading"
        }
    })
    .await;
    assert!(waiting);
    let held = held.unwrap();
    assert!(!held.is_finished());
    let (_bob, _) = s.join(ROOM, "bob").await;
    let body = held.await.unwrap().unwrap();
    assert_eq!(body["frames"][0]["kind"], "presence.join", "{body}");
}

/// The events of an SSE body so far: (id, data).
fn sse_events(text: &str) -> Vec<(Option<u64>, String)> {
    text.split("\n\n")
        .filter(|e| e.contains("data: "))
        .map(|e| {
            let id = e
                .lines()
                .find_map(|l| l.strip_prefix("id: "))
                .map(|v| v.parse().unwrap());
            let data = e.lines().find_map(|l| l.strip_prefix("data: ")).unwrap();
            (id, data.to_owned())
        })
        .collect()
}

/// Reads an event stream until `n` events with ids came.
async fn read_events(r: &mut reqwest::Response, n: usize) -> Vec<(u64, Value)> {
    let mut text = String::new();
    loop {
        let got: Vec<(u64, Value)> = sse_events(&text)
            .into_iter()
            .filter_map(|(id, d)| Some((id?, serde_json::from_str(&d).unwrap())))
            .collect();
        if got.len() >= n && text.ends_with("\n\n") {
            return got;
        }
        let chunk = tokio::time::timeout(Duration::from_secs(5), r.chunk())
            .await
            .unwrap_or_else(|_| panic!("events in time; so far: {text}"))
            .unwrap()
            .expect("the stream goes on");
        text.push_str(std::str::from_utf8(&chunk).unwrap());
    }
}

#[tokio::test]
async fn server_sent_events_carry_the_frames_and_resume_from_last_event_id() {
    let s = TestServer::start().await;
    s.create_room(json!({"id": ROOM})).await;
    let ann = Poller::open(&s).await;
    let url = s.url(&format!("/v1/sessions/{}/events", ann.id));
    let mut stream = s.http.get(&url).send().await.unwrap();
    assert_eq!(stream.status(), 200);
    assert_eq!(
        stream.headers()["content-type"].to_str().unwrap(),
        "text/event-stream"
    );
    ann.send(json!({"type": "join", "room": ROOM, "name": "ann"}))
        .await;
    let got = read_events(&mut stream, 1).await;
    assert_eq!(got[0].0, 1);
    assert_eq!(got[0].1["type"], "joined");

    // The stream drops; meanwhile bob joins and says two things.
    drop(stream);
    let (mut bob, _) = s.join(ROOM, "bob").await;
    for i in 0..2 {
        bob.send(json!({"type": "publish", "room": ROOM, "event": "chat", "data": i}))
            .await;
        bob.recv_until(|v| v["type"] == "ack").await;
    }
    // EventSource reconnects with the last id it saw: everything after it, once.
    let mut stream = s
        .http
        .get(&url)
        .header("last-event-id", "1")
        .send()
        .await
        .unwrap();
    assert_eq!(stream.status(), 200);
    let got = read_events(&mut stream, 3).await;
    let ids: Vec<u64> = got.iter().map(|(id, _)| *id).collect();
    assert_eq!(ids, [2, 3, 4]);
    assert_eq!(got[0].1["kind"], "presence.join");
    assert_eq!(got[1].1["data"], 0);
    assert_eq!(got[2].1["data"], 1);
}

#[tokio::test]
async fn a_closed_transport_session_is_resumed_by_a_new_one_without_loss() {
    let (s, mut bob, polling) = bob_and_polling_ann(ServerConfig::default()).await;
    let (ann, joined) = (Poller::continuing(&s, &polling), polling.joined);
    let (status, _) = s.delete(&format!("/v1/sessions/{}", ann.id)).await;
    assert_eq!(status, 204);
    bob.recv_event("presence.leave").await;
    bob.send(json!({"type": "publish", "room": ROOM, "event": "chat", "data": "missed"}))
        .await;
    let (ack, _) = bob.recv_until(|v| v["type"] == "ack").await;
    // The old session is gone for every request.
    let (status, body) = ann.poll_at(ann.ack).await;
    assert_eq!(
        (status, body["error"]["code"].clone()),
        (404, json!("transport_not_found"))
    );
    let (mut again, resumed) = resume_ann(&s, &joined).await;
    assert_eq!(resumed["session"], joined["session"]);
    let missed = again.until(|v| v["kind"] == "message").await;
    assert_eq!(
        (missed["data"].clone(), missed["seq"].clone()),
        (json!("missed"), ack["seq"].clone())
    );
}

/// A new transport session resuming ann's membership (`joined`: her first
/// `joined` frame): the session and its resumed `joined`.
async fn resume_ann<'a>(s: &'a TestServer, joined: &Value) -> (Poller<'a>, Value) {
    let mut again = Poller::open(s).await;
    again
        .send(json!({"type": "join", "room": ROOM, "name": "ann",
            "resume": {"token": joined["resume_token"], "last_seq": joined["seq"]}}))
        .await;
    let resumed = again.until(|v| v["type"] == "joined").await;
    assert_eq!(resumed["resumed"], true);
    (again, resumed)
}

#[tokio::test]
async fn a_replay_longer_than_the_send_queue_reaches_a_polling_client_whole() {
    // 100 missed events, 8 frames of queue: the replay is held over and
    // above the bound, and the client that reads it is no slow consumer.
    let config = ServerConfig {
        send_queue_frames: 8,
        ..ServerConfig::default()
    };
    let (s, mut bob, polling) = bob_and_polling_ann(config).await;
    let (ann, joined) = (Poller::continuing(&s, &polling), polling.joined);
    let (status, _) = s.delete(&format!("/v1/sessions/{}", ann.id)).await;
    assert_eq!(status, 204);
    bob.recv_event("presence.leave").await;
    let mut acks = Vec::new();
    for i in 0..100 {
        let (ack, _) = bob.publish(ROOM, "chat", json!(i)).await;
        acks.push(ack["seq"].clone());
    }
    let (mut again, _) = resume_ann(&s, &joined).await;
    let mut seqs = Vec::new();
    while seqs.len() < acks.len() {
        seqs.push(again.until(|v| v["kind"] == "message").await["seq"].clone());
    }
    assert_eq!(seqs, acks);
    let (ack, _) = bob.publish(ROOM, "chat", json!("live")).await;
    let live = again.until(|v| v["kind"] == "message").await;
    assert_eq!(live["seq"], ack["seq"]);
}

#[tokio::test]
async fn bad_requests_get_clear_errors_and_harm_nothing() {
    let s = TestServer::start().await;
    s.create_room(json!({"id": ROOM})).await;
    let mut ann = Poller::open(&s).await;
    let code = |b: &Value| b["error"]["code"].clone();
    // Unknown sessions, for every request.
    for (status, body) in [
        s.get("/v1/sessions/nope/poll").await,
        s.get("/v1/sessions/nope/events").await,
        s.post("/v1/sessions/nope/send", &json!({"type": "ping"}))
            .await,
        s.delete("/v1/sessions/nope").await,
    ] {
        assert_eq!((status, code(&body)), (404, json!("transport_not_found")));
    }
    // No session at all: reading the collection, or an empty id.
    let (status, body) = s.get("/v1/sessions").await;
    assert_eq!((status, code(&body)), (405, json!("method_not_allowed")));
    for path in ["/v1/sessions//poll", "/v1/sessions//events"] {
        let (status, body) = s.get(path).await;
        assert_eq!(status, 404, "{path}: {body}");
        assert!(code(&body).is_string(), "{path}: a JSON error: {body}");
    }
    // A malformed batch; a bad ack; a bad Last-Event-ID; positions never sent.
    let (status, body) = s
        .post_raw(&format!("/v1/sessions/{}/send", ann.id), "[{\"type\": ")
        .await;
    assert_eq!((status, code(&body)), (400, json!("bad_json")));
    let (status, body) = s.get(&format!("/v1/sessions/{}/poll?ack=x", ann.id)).await;
    assert_eq!((status, code(&body)), (400, json!("invalid_request")));
    let (status, body) = ann.poll_at(99).await;
    assert_eq!((status, code(&body)), (400, json!("invalid_request")));
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("beyond the last position"),
        "{body}"
    );
    // The same position as an event stream's Last-Event-ID (header or query):
    // the same client error, not 410 frames_gone (nothing was let go there).
    for header in [true, false] {
        let url = s.url(&format!("/v1/sessions/{}/events", ann.id));
        let r = if header {
            s.http.get(url).header("last-event-id", "99")
        } else {
            s.http.get(format!("{url}?last_event_id=99"))
        }
        .send()
        .await
        .unwrap();
        let status = r.status().as_u16();
        let body: Value = r.json().await.unwrap();
        assert_eq!(
            (status, code(&body)),
            (400, json!("invalid_request")),
            "{body}"
        );
        assert!(
            body["error"]["message"]
                .as_str()
                .unwrap()
                .contains("Last-Event-ID 99 is beyond the last position"),
            "{body}"
        );
    }
    let r = s
        .http
        .get(s.url(&format!("/v1/sessions/{}/events", ann.id)))
        .header("last-event-id", "abc")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    // A body over the limit (16 × the largest message): 413, nothing handled.
    let huge = format!("[{}]", vec!["{\"type\":\"ping\"}"; 300_000].join(","));
    let (status, body) = s
        .post_raw(&format!("/v1/sessions/{}/send", ann.id), &huge)
        .await;
    assert_eq!((status, code(&body)), (413, json!("frame_too_large")));
    // A frame that is not JSON is answered like on WebSocket, by an error frame.
    let (status, _) = s
        .post_raw(&format!("/v1/sessions/{}/send", ann.id), "not json")
        .await;
    assert_eq!(status, 202);
    let err = ann.until(|v| v["type"] == "error").await;
    assert_eq!(err["code"], "bad_json");
    // The session still works.
    ann.send(json!({"type": "join", "room": ROOM, "name": "ann"}))
        .await;
    ann.until(|v| v["type"] == "joined").await;
}

#[tokio::test]
async fn a_silent_session_expires_and_its_member_can_resume() {
    let (
        s,
        mut bob,
        PollingAnn {
            id: ann,
            ack,
            joined,
        },
    ) = bob_and_polling_ann(ServerConfig {
        idle_timeout_ms: 300,
        // WebSocket pings keep bob there.
        heartbeat_interval_ms: 100,
        ..ServerConfig::default()
    })
    .await;
    // Nobody asks for ann's frames: after the idle timeout her room session
    // is disconnected (resumable), and the transport session is gone.
    let (leave, _) = bob.recv_event("presence.leave").await;
    assert_eq!(leave["reason"], "disconnected", "{leave}");
    let (status, _) = s.get(&format!("/v1/sessions/{ann}/poll?ack={ack}")).await;
    assert_eq!(status, 404);
    // Her member resumes on a new transport session: the same session id,
    // and bob is told she is back.
    let (_again, resumed) = resume_ann(&s, &joined).await;
    assert_eq!(resumed["session"], joined["session"], "{resumed}");
    let (back, _) = bob.recv_event("presence.join").await;
    assert_eq!(back["member"]["session"], joined["session"], "{back}");
}

#[tokio::test]
async fn a_session_nobody_reads_is_closed_as_a_slow_consumer() {
    let (s, mut bob, PollingAnn { id: ann, ack, .. }) = bob_and_polling_ann(ServerConfig {
        send_queue_frames: 8,
        ..ServerConfig::default()
    })
    .await;
    // Ann stops reading; bob says more than her session may keep.
    let mut seen = Vec::new();
    for i in 0..12 {
        bob.send(json!({"type": "publish", "room": ROOM, "event": "chat", "data": i}))
            .await;
        let (_, before) = bob.recv_until(|v| v["type"] == "ack").await;
        seen.extend(before);
    }
    let leave = match seen.into_iter().find(|v| v["kind"] == "presence.leave") {
        Some(v) => v,
        None => bob.recv_event("presence.leave").await.0,
    };
    assert_eq!(leave["reason"], "disconnected", "{leave}");
    assert!(
        wait_until(|| async { s.metric("plaza_slow_consumers_total").await >= Some(1.0) }).await
    );
    let (status, _) = s.get(&format!("/v1/sessions/{ann}/poll?ack={ack}")).await;
    assert_eq!(status, 404, "the session ended");
    // Only bob is connected now; ann's room session is disconnected (and
    // resumable, as after any end: see the closed-session test).
    let (status, body) = s.get(&format!("/v1/rooms/{ROOM}")).await;
    assert_eq!((status, body["members"].clone()), (200, json!(1)), "{body}");
}

/// Room [`ROOM`] on `s` with bob there over WebSocket, and ann joined over
/// an open event stream that has carried her `joined`.
async fn bob_and_streaming_ann(
    s: &TestServer,
) -> (crate::support::Client, Poller<'_>, reqwest::Response) {
    s.create_room(json!({"id": ROOM})).await;
    let (bob, _) = s.join(ROOM, "bob").await;
    let ann = Poller::open(s).await;
    let url = s.url(&format!("/v1/sessions/{}/events", ann.id));
    let mut stream = s.http.get(&url).send().await.unwrap();
    ann.send(json!({"type": "join", "room": ROOM, "name": "ann"}))
        .await;
    let got = read_events(&mut stream, 1).await;
    assert_eq!(got[0].1["type"], "joined");
    (bob, ann, stream)
}

#[tokio::test]
async fn a_stream_cannot_go_back_before_what_the_bound_let_go() {
    let s = TestServer::with_config(ServerConfig {
        send_queue_frames: 8,
        ..ServerConfig::default()
    })
    .await;
    let (mut bob, ann, mut stream) = bob_and_streaming_ann(&s).await;
    // Ann reads as they come: what was streamed may be let go, 12 > 8.
    for i in 0..12 {
        bob.send(json!({"type": "publish", "room": ROOM, "event": "chat", "data": i}))
            .await;
        bob.recv_until(|v| v["type"] == "ack").await;
    }
    let got = read_events(&mut stream, 12).await;
    assert_eq!(got.last().unwrap().1["data"], 11, "{got:?}");
    drop(stream);
    let url = s.url(&format!("/v1/sessions/{}/events", ann.id));
    // Going back to position 1: gone (once the dropped stream's end is noticed:
    // until then the session answers 409, its old reader still reading).
    let gone = std::sync::Mutex::new(None);
    assert!(
        wait_until(|| async {
            let r = s
                .http
                .get(&url)
                .header("last-event-id", "1")
                .send()
                .await
                .unwrap();
            match r.status().as_u16() {
                409 => false,
                status => {
                    *gone.lock().unwrap() = Some((status, r.json::<Value>().await.unwrap()));
                    true
                }
            }
        })
        .await
    );
    let (status, body) = gone.into_inner().unwrap().unwrap();
    assert_eq!(
        (status, body["error"]["code"].clone()),
        (410, json!("frames_gone"))
    );
    let last = got.last().unwrap().0;
    let r = s
        .http
        .get(&url)
        .header("last-event-id", last.to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
}

#[tokio::test]
async fn only_the_transport_id_opens_a_session_and_it_is_never_shown_to_others() {
    let (
        s,
        mut bob,
        PollingAnn {
            id: ann_id,
            ack: ann_ack,
            ..
        },
    ) = bob_and_polling_ann(ServerConfig::default()).await;
    // What bob knows of ann: her public room session id (the address of
    // direct messages), from her presence.
    let (status, rooms) = s.get(&format!("/v1/rooms/{ROOM}")).await;
    assert_eq!(status, 200, "{rooms}");
    let shown = rooms.to_string();
    assert!(!shown.contains(&ann_id), "the room lists no transport id");
    let (ev, _) = {
        let mut mallory = Poller::open(&s).await;
        mallory
            .send(json!({"type": "join", "room": ROOM, "name": "mallory"}))
            .await;
        let joined = mallory.until(|v| v["type"] == "joined").await;
        assert!(!joined.to_string().contains(&ann_id), "{joined}");
        let ann_public = joined["members"]
            .as_array()
            .unwrap()
            .iter()
            .find(|m| m["name"] == "ann")
            .expect("ann is listed")["session"]
            .as_str()
            .unwrap()
            .to_owned();
        // Ann's public id, a near miss of her transport id, and mallory's
        // own id with another suffix open nothing, from any connection.
        let mut near = ann_id.clone();
        let last = near.pop().unwrap();
        near.push(if last == 'A' { 'B' } else { 'A' });
        for forged in [
            ann_public.as_str(),
            near.as_str(),
            &format!("{}x", mallory.id),
        ] {
            for path in [
                format!("/v1/sessions/{forged}/poll?ack=0&wait_ms=0"),
                format!("/v1/sessions/{forged}/events"),
            ] {
                let (status, body) = s.get(&path).await;
                assert_eq!(status, 404, "{path}: {body}");
                assert_eq!(body["error"]["code"], "transport_not_found", "{path}");
            }
            let (status, body) = s
                .post(
                    &format!("/v1/sessions/{forged}/send"),
                    &json!({"type": "publish", "room": ROOM, "event": "x", "data": 1}),
                )
                .await;
            assert_eq!(status, 404, "{body}");
            let (status, _) = s.delete(&format!("/v1/sessions/{forged}")).await;
            assert_eq!(status, 404);
        }
        bob.recv_event("presence.join").await
    };
    assert_eq!(ev["member"]["name"], "mallory");
    // Nothing was published in ann's name, and ann's session is intact:
    // whoever holds the id (the secret, like a bearer token) reads on, here
    // from a new connection of a new HTTP client.
    let fresh = reqwest::Client::new();
    let r = fresh
        .get(s.url(&format!(
            "/v1/sessions/{ann_id}/poll?ack={ann_ack}&wait_ms=0"
        )))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let body: Value = r.json().await.unwrap();
    let frames = body["frames"].as_array().unwrap();
    assert!(
        frames
            .iter()
            .all(|f| !(f["type"] == "event" && f["event"] == "x")),
        "{body}"
    );
    assert!(
        frames
            .iter()
            .any(|f| f["kind"] == "presence.join" && f["member"]["name"] == "mallory"),
        "ann saw mallory arrive: {body}"
    );
}

/// Checks `actual` against a documented `expected` value in which a string
/// `"<name>"` stands for any value the server chose: bound to it the first
/// time, the same value every other time.
fn check_documented(
    expected: &Value,
    actual: &Value,
    bound: &mut std::collections::HashMap<String, Value>,
    at: &str,
) {
    if let Some(name) = expected
        .as_str()
        .filter(|s| s.len() > 2 && s.starts_with('<') && s.ends_with('>'))
    {
        assert!(
            !actual.is_object() && !actual.is_array(),
            "{at}: {name} stands for a value, got {actual}"
        );
        let was = bound
            .entry(name.to_owned())
            .or_insert_with(|| actual.clone());
        assert_eq!(was, actual, "{at}: {name} is not the same value as before");
        return;
    }
    match (expected, actual) {
        (Value::Object(e), Value::Object(a)) => {
            let (ek, ak): (Vec<_>, Vec<_>) = (e.keys().collect(), a.keys().collect());
            assert_eq!(ek, ak, "{at}: fields");
            for (k, ev) in e {
                check_documented(ev, &a[k], bound, &format!("{at}.{k}"));
            }
        }
        (Value::Array(e), Value::Array(a)) => {
            assert_eq!(e.len(), a.len(), "{at}: length of {actual}");
            for (i, (ev, av)) in e.iter().zip(a).enumerate() {
                check_documented(ev, av, bound, &format!("{at}[{i}]"));
            }
        }
        _ => assert_eq!(expected, actual, "{at}"),
    }
}

/// `text` with every bound `<name>` replaced by its value.
fn with_bound(text: &str, bound: &std::collections::HashMap<String, Value>) -> String {
    let mut out = text.to_owned();
    for (name, v) in bound {
        let v = v.as_str().map_or_else(|| v.to_string(), str::to_owned);
        out = out.replace(name.as_str(), &v);
    }
    out
}

#[tokio::test]
async fn the_documented_http_exchanges_happen_as_documented() {
    let s = TestServer::start().await;
    s.create_room(json!({"id": "lobby"})).await;
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../protocol/vectors/http");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    // In the order of their numbers: one session from opening to end.
    files.sort_by_key(|p| {
        let name = p.file_name().unwrap().to_string_lossy().into_owned();
        name.split('-').next().unwrap().parse::<u32>().unwrap()
    });
    assert!(files.len() >= 5, "{files:?}");
    let http = reqwest::Client::new();
    let mut bound = std::collections::HashMap::new();
    for file in files {
        let at = file.file_name().unwrap().to_string_lossy().into_owned();
        let v: Value = serde_json::from_str(&std::fs::read_to_string(&file).unwrap()).unwrap();
        let (req, want) = (&v["request"], &v["response"]);
        let method =
            reqwest::Method::from_bytes(req["method"].as_str().unwrap().as_bytes()).unwrap();
        let path = with_bound(req["path"].as_str().unwrap(), &bound);
        assert!(!path.contains('<'), "{at}: {path} uses an unbound value");
        let mut call = http.request(method, s.url(&path));
        for (k, h) in req["headers"].as_object().into_iter().flatten() {
            call = call.header(k.as_str(), h.as_str().unwrap());
        }
        if let Some(body) = req.get("body") {
            call = call.json(body);
        }
        let mut resp = call.send().await.unwrap();
        assert_eq!(resp.status().as_u16(), want["status"], "{at}");
        for (k, h) in want["headers"].as_object().into_iter().flatten() {
            assert_eq!(resp.headers()[k.as_str()], h.as_str().unwrap(), "{at}: {k}");
        }
        if let Some(text) = want["text"].as_str() {
            // A stream: what it has sent once the documented part is there.
            let text = with_bound(text, &bound);
            let mut got = Vec::new();
            while got.len() < text.len() {
                let chunk = tokio::time::timeout(crate::support::WAIT, resp.chunk())
                    .await
                    .unwrap_or_else(|_| panic!("{at}: the stream stopped at {got:?}"))
                    .unwrap()
                    .unwrap_or_else(|| panic!("{at}: the stream ended"));
                got.extend_from_slice(&chunk);
            }
            assert_eq!(String::from_utf8_lossy(&got), text, "{at}");
        } else if let Some(body) = want.get("body") {
            let got: Value = resp.json().await.unwrap();
            check_documented(body, &got, &mut bound, &at);
        } else {
            assert_eq!(resp.text().await.unwrap(), "", "{at}: no body");
        }
    }
    for name in ["<session>", "<member>", "<resume_token>", "<epoch>"] {
        assert!(bound.contains_key(name), "{name} was bound");
    }
}

/// What a client sends in one request over an HTTP transport session and
/// what answers it: requests by nonce (answered, refused), a lock held
/// against another member, and the error frames of bad frames.
const REQUESTS: &str = r#"[
  {"type": "request", "room": "http", "nonce": 1, "op": "entity.create", "args": {"kind": "note", "data": {"t": "hi"}}},
  {"type": "request", "room": "http", "nonce": 2, "op": "entity.fly", "args": {}},
  {"type": "request", "room": "http", "nonce": 3, "op": "lock.acquire", "args": {"object": "board"}},
  {"type": "warp"},
  {"type": "publish", "room": "elsewhere", "event": "x", "data": 1}
]"#;

/// Whether `frames` hold every answer to [`REQUESTS`]: three responses (in any
/// order: the connection answers an unknown op at once, the room the others)
/// and two errors.
fn has_request_answers(frames: &[Value]) -> bool {
    let count = |t: &str| frames.iter().filter(|f| f["type"] == t).count();
    count("response") >= 3 && count("error") >= 2
}

/// Checks the answers to [`REQUESTS`] in `frames` (the member's frames after
/// they were sent, in order).
fn check_request_answers(frames: &[Value]) {
    let mut responses: Vec<&Value> = frames.iter().filter(|f| f["type"] == "response").collect();
    responses.sort_by_key(|r| r["nonce"].as_u64());
    let nonces: Vec<&Value> = responses.iter().map(|r| &r["nonce"]).collect();
    assert_eq!(nonces, [&json!(1), &json!(2), &json!(3)], "{frames:?}");
    assert_eq!(responses[0]["ok"], true, "{}", responses[0]);
    assert_eq!(responses[0]["result"]["entity"]["data"]["t"], "hi");
    assert_eq!(responses[1]["ok"], false);
    assert_eq!(responses[1]["error"]["code"], "unknown_op");
    assert_eq!(responses[2]["ok"], true, "{}", responses[2]);
    let errors: Vec<&Value> = frames.iter().filter(|f| f["type"] == "error").collect();
    let codes: Vec<&Value> = errors.iter().map(|e| &e["code"]).collect();
    assert_eq!(
        codes,
        [&json!("unknown_type"), &json!("not_joined")],
        "{frames:?}"
    );
}

#[tokio::test]
async fn requests_are_answered_by_nonce_and_bad_frames_get_error_frames_over_long_polling() {
    let (s, mut bob, polling) = bob_and_polling_ann(ServerConfig::default()).await;
    let mut ann = Poller::continuing(&s, &polling);
    let (status, body) = s
        .post_raw(&format!("/v1/sessions/{}/send", ann.id), REQUESTS)
        .await;
    assert_eq!((status, body), (202, json!({"accepted": 5})));
    let mut frames = Vec::new();
    while !has_request_answers(&frames) {
        frames.push(ann.until(|_| true).await);
    }
    check_request_answers(&frames);
    // The lock ann took holds against bob; the entity she made reached him.
    let (r, before) = bob
        .request(ROOM, json!(9), "lock.acquire", json!({"object": "board"}))
        .await;
    assert_eq!(r["error"]["code"], "lock_held", "{r}");
    assert!(
        before.iter().any(|e| e["kind"] == "entity.created"),
        "{before:?}"
    );
}

#[tokio::test]
async fn requests_are_answered_by_nonce_and_bad_frames_get_error_frames_over_sse() {
    let s = TestServer::start().await;
    s.create_room(json!({"id": ROOM})).await;
    let ann = Poller::open(&s).await;
    let url = s.url(&format!("/v1/sessions/{}/events", ann.id));
    let mut stream = s.http.get(&url).send().await.unwrap();
    ann.send(json!({"type": "join", "room": ROOM, "name": "ann"}))
        .await;
    let joined = read_events(&mut stream, 1).await;
    assert_eq!(joined[0].1["type"], "joined");
    let (status, _) = s
        .post_raw(&format!("/v1/sessions/{}/send", ann.id), REQUESTS)
        .await;
    assert_eq!(status, 202);
    // 3 responses and 2 errors (the requester is not sent the events of its own changes).
    let frames: Vec<Value> = read_events(&mut stream, 5)
        .await
        .into_iter()
        .map(|(_, f)| f)
        .collect();
    assert!(has_request_answers(&frames), "{frames:?}");
    check_request_answers(&frames);
}

#[tokio::test]
async fn shutdown_ends_an_event_stream_with_1012() {
    // Served without graceful shutdown, so the stream can be read to its
    // end once the node has closed its sessions.
    let s = TestServer::without_graceful_shutdown(ServerConfig::default()).await;
    let (mut bob, _ann, mut stream) = bob_and_streaming_ann(&s).await;
    bob.recv_event("presence.join").await;

    s.node.shutdown();
    let mut text = String::new();
    while let Some(chunk) = tokio::time::timeout(Duration::from_secs(5), stream.chunk())
        .await
        .expect("the stream ends in time")
        .unwrap()
    {
        text.push_str(std::str::from_utf8(&chunk).unwrap());
    }
    let last = text.trim_end().rsplit("\n\n").next().unwrap();
    // Reconnect (to another node, behind a balancer) and resume.
    assert_eq!(last, "event: closed\ndata: {\"code\":1012}", "{text}");
    assert_eq!(bob.closed().await, crate::support::Closed::Code(1012));
}

/// What the node counts of its writes: (frames, bytes, latency samples).
async fn writes_counted(s: &TestServer) -> (f64, f64, f64) {
    let m = |name| async move { s.metric(name).await.unwrap_or(0.0) };
    (
        m("plaza_frames_out_total").await,
        m("plaza_bytes_out_total").await,
        m("plaza_delivery_latency_seconds_count").await,
    )
}

/// Frames sent by a poll or an event stream count as a WebSocket write's
/// do: frames, bytes, and the delivery latency of their live events.
#[tokio::test]
async fn polls_and_event_streams_count_their_frames_bytes_and_latency() {
    const N: usize = 5;
    let s = TestServer::start().await;
    let (mut bob, _ann, mut stream) = bob_and_streaming_ann(&s).await;
    let mut carl = Poller::open(&s).await;
    carl.send(json!({"type": "join", "room": ROOM, "name": "carl"}))
        .await;
    carl.until(|v| v["type"] == "joined").await;
    // Ann's stream carries carl's join: read it, so what follows is bob's.
    let got = read_events(&mut stream, 1).await;
    assert_eq!(got[0].1["kind"], "presence.join", "{got:?}");
    // Bob has seen ann and carl join: nothing is in flight.
    for _ in 0..2 {
        bob.recv_event("presence.join").await;
    }

    let (frames, bytes, samples) = writes_counted(&s).await;
    for i in 0..N {
        bob.send(json!({"type": "publish", "room": ROOM, "event": "chat", "data": i}))
            .await;
        bob.recv_until(|v| v["type"] == "ack").await;
    }
    let streamed = read_events(&mut stream, N).await;
    assert_eq!(streamed[N - 1].1["data"], N - 1, "{streamed:?}");
    for i in 0..N {
        let ev = carl.until(|v| v["event"] == "chat").await;
        assert_eq!(ev["data"], i, "{ev}");
    }
    // Bob's N acks over WebSocket, and N events each to ann and carl.
    let (frames_now, bytes_now, _) = writes_counted(&s).await;
    assert!(
        frames_now - frames >= (3 * N) as f64,
        "{frames} -> {frames_now}"
    );
    assert!(
        bytes_now - bytes >= (3 * N * 20) as f64,
        "{bytes} -> {bytes_now}"
    );
    // Bob's acks carry no event: the samples are ann's and carl's.
    let latest = std::cell::Cell::new(samples);
    assert!(
        wait_until(|| async {
            latest.set(writes_counted(&s).await.2);
            latest.get() >= samples + 2.0
        })
        .await,
        "latency samples {samples} -> {}",
        latest.get()
    );
}
