//! Every route of the HTTP API table in docs/protocol.md, walked as the
//! table states it: the credentials its column names (401 with a JSON body
//! without them, no 401 with them) and, on each route that takes a JSON
//! body, 415 without a JSON content type. The table is read from the file,
//! so a route added to it is checked and the docs cannot drift from the
//! server.

use plaza_server::ServerConfig;
use reqwest::{Method, StatusCode};
use serde_json::{json, Value};

use crate::support::TestServer;

const KEY: &str = "routes-test-api-key-0123";
const SECRET: &str = "routes-test-jwt-secret-of-32-bytes-or-more";

/// What a route needs when the node has an `api_key`, as the table's
/// credentials column says.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Credentials {
    Open,
    ApiKey,
    ApiKeyOrAdminToken,
}

#[derive(Debug)]
struct Route {
    method: Method,
    /// The documented path, `{id}` and the like left in.
    template: String,
    credentials: Credentials,
}

impl Route {
    /// The path with a room that exists, and ids for the rest.
    fn path(&self) -> String {
        self.template
            .replace("{id}", "r")
            .replace("{session}", "no-such-session")
            .replace("{entity}", "no-such-entity")
            .replace("{user}", "u1")
    }

    /// Whether the table's text says the route reads a JSON body: POST and
    /// PUT, but the two kinds docs/protocol.md names as exempt.
    fn takes_json_body(&self) -> bool {
        (self.method == Method::POST || self.method == Method::PUT)
            && !self.template.starts_with("/v1/trajectory/")
            && !self.template.starts_with("/v1/sessions")
    }
}

/// The rows of the table under "## HTTP API" whose first column is
/// `` `METHOD /path` ``, without those that need a setting this node lacks
/// (`web_dir`).
fn documented_routes() -> Vec<Route> {
    let doc = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../docs/protocol.md"
    ))
    .expect("docs/protocol.md");
    let section = &doc[doc.find("\n## HTTP API\n").expect("an HTTP API section")..];
    let mut rows = section
        .lines()
        .skip_while(|l| !l.starts_with("| method and path | credentials |"))
        .skip(2)
        .take_while(|l| l.starts_with('|'));
    let routes: Vec<Route> = rows
        .by_ref()
        .filter(|row| !row.contains("{path}"))
        .map(|row| {
            let cells: Vec<&str> = row.split(" | ").collect();
            let route = cells[0].split('`').nth(1).expect("a `METHOD /path` cell");
            let (method, path) = route.split_once(' ').expect("METHOD /path");
            let credentials = match cells[1].trim() {
                "—" => Credentials::Open,
                "`api_key`" => Credentials::ApiKey,
                "`api_key` or admin token" => Credentials::ApiKeyOrAdminToken,
                other => panic!("unknown credentials {other:?} in {row}"),
            };
            Route {
                method: method.parse().expect("an HTTP method"),
                template: path.split('?').next().unwrap().to_owned(),
                credentials,
            }
        })
        .collect();
    // A table that changed shape would otherwise walk nothing.
    assert!(routes.len() >= 30, "only {} routes read", routes.len());
    routes
}

/// A node with an API key and token keys, serving the demo tokens too (so
/// that every documented route exists), and the room `r`.
async fn guarded_node() -> TestServer {
    let s = TestServer::with_config(ServerConfig {
        api_key: KEY.into(),
        jwt_secret: SECRET.into(),
        demo_tokens: true,
        ..ServerConfig::default()
    })
    .await;
    let created = s
        .http
        .post(s.url("/v1/rooms"))
        .bearer_auth(KEY)
        .json(&json!({"id": "r"}))
        .send()
        .await
        .unwrap();
    assert_eq!(created.status(), StatusCode::CREATED);
    s
}

/// A body and its content type (`None`: no header).
struct Body<'a> {
    content_type: Option<&'a str>,
    text: &'a str,
}

fn json_body(text: &str) -> Body<'_> {
    Body {
        content_type: Some("application/json"),
        text,
    }
}

/// The status, the JSON answer (`Null` when not JSON) and whether the answer
/// carries `WWW-Authenticate`.
async fn send(
    s: &TestServer,
    method: Method,
    path: &str,
    key: Option<&str>,
    body: Body<'_>,
) -> Option<(u16, Value, bool)> {
    let mut r = s.http.request(method, s.url(path));
    if let Some(k) = key {
        r = r.bearer_auth(k);
    }
    if let Some(ct) = body.content_type {
        r = r.header("content-type", ct);
    }
    let res = r.body(body.text.to_owned()).send().await.ok()?;
    let status = res.status().as_u16();
    let challenged = res.headers().contains_key("www-authenticate");
    let text = res.text().await.unwrap_or_default();
    Some((
        status,
        serde_json::from_str(&text).unwrap_or(Value::Null),
        challenged,
    ))
}

/// `route` called with the key (so that only the body is at stake): the
/// status and the JSON answer.
async fn keyed(
    s: &TestServer,
    route: &Route,
    content_type: Option<&str>,
    text: &str,
) -> (u16, Value) {
    let body = Body { content_type, text };
    let (status, v, _) = send(s, route.method.clone(), &route.path(), Some(KEY), body)
        .await
        .unwrap();
    (status, v)
}

#[tokio::test]
async fn every_documented_route_needs_exactly_the_credentials_the_table_names() {
    let s = guarded_node().await;
    let mut guarded = 0;
    for route in documented_routes() {
        let path = route.path();
        let body = || {
            if route.takes_json_body() {
                json_body("{}")
            } else {
                Body {
                    content_type: None,
                    text: "",
                }
            }
        };
        let what = format!("{} {path}", route.method);
        let (bare, v, challenged) = send(&s, route.method.clone(), &path, None, body())
            .await
            .unwrap_or_else(|| panic!("{what}: no answer"));
        let (wrong, _, _) = send(
            &s,
            route.method.clone(),
            &path,
            Some("not-the-key-but-as-long"),
            body(),
        )
        .await
        .unwrap();
        if route.credentials == Credentials::Open {
            assert_ne!(bare, 401, "{what} is documented as open: {v}");
            assert_ne!(wrong, 401, "{what} is documented as open");
        } else {
            guarded += 1;
            assert_eq!(bare, 401, "{what} without the key: {v}");
            assert_eq!(v["error"]["code"], "unauthorized", "{what}: {v}");
            assert!(challenged, "{what}: a 401 without WWW-Authenticate");
            assert_eq!(wrong, 401, "{what} with a wrong key");
        }
        let (keyed, v, _) = send(&s, route.method.clone(), &path, Some(KEY), body())
            .await
            .unwrap();
        assert!(
            keyed != 401 && keyed != 403,
            "{what} with the key: {keyed} {v}"
        );
    }
    assert!(guarded >= 15, "only {guarded} guarded routes read");
}

#[tokio::test]
async fn every_documented_json_route_refuses_a_body_without_a_json_content_type() {
    let s = guarded_node().await;
    let routes: Vec<Route> = documented_routes()
        .into_iter()
        .filter(Route::takes_json_body)
        .collect();
    assert!(routes.len() >= 11, "only {} JSON routes read", routes.len());
    for route in &routes {
        let what = format!("{} {}", route.method, route.path());
        for content_type in [
            None,
            Some("text/plain"),
            Some("application/x-www-form-urlencoded"),
        ] {
            let (status, v) = keyed(&s, route, content_type, "{}").await;
            assert_eq!(status, 415, "{what} with {content_type:?}: {v}");
            assert_eq!(v["error"]["code"], "invalid_request", "{what}: {v}");
        }
        for content_type in [
            "application/json; charset=utf-8",
            "Application/JSON",
            "application/vnd.example+json",
        ] {
            let (status, v) = keyed(&s, route, Some(content_type), "{}").await;
            assert_ne!(status, 415, "{what} with {content_type}: {v}");
        }
        // Over the framework's limit: a JSON error too.
        let big = format!("{{\"pad\": \"{}\"}}", "x".repeat(2 << 20));
        let (status, v) = keyed(&s, route, Some("application/json"), &big).await;
        assert_eq!(status, 413, "{what} with 2 MiB: {v}");
        assert_eq!(v["error"]["code"], "payload_too_large", "{what}: {v}");
        // An empty body is no body: the route itself decides (a kick and a
        // disconnect take it, the others answer 400).
        let (status, v) = keyed(&s, route, None, "").await;
        assert_ne!(status, 415, "{what} with no body: {v}");
    }
    // Credentials are checked first: an unauthorised call learns nothing
    // about its body.
    let plain = Body {
        content_type: Some("text/plain"),
        text: "{}",
    };
    let (status, _, _) = send(&s, Method::POST, "/v1/rooms/r/publish", None, plain)
        .await
        .unwrap();
    assert_eq!(status, 401);
}

/// The exempt routes: a transport session's frames are read whatever their
/// content type, as a WebSocket's would be.
#[tokio::test]
async fn a_transport_session_takes_frames_of_any_content_type() {
    let s = guarded_node().await;
    let (status, opened, _) = send(
        &s,
        Method::POST,
        "/v1/sessions",
        None,
        Body {
            content_type: None,
            text: "",
        },
    )
    .await
    .unwrap();
    assert_eq!(status, 201, "{opened}");
    let path = format!("/v1/sessions/{}/send", opened["session"].as_str().unwrap());
    let frame = Body {
        content_type: Some("text/plain"),
        text: r#"{"type": "ping"}"#,
    };
    let (status, v, _) = send(&s, Method::POST, &path, None, frame).await.unwrap();
    assert_eq!((status, &v["accepted"]), (202, &json!(1)), "{v}");
}
