//! `web_dir`: a web app directory served at `/`, next to the API.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};

use plaza_server::ServerConfig;
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::support::TestServer;

const INDEX: &str = "<!doctype html><title>web_dir test</title><p>the app</p>\n";
const APP_JS: &str = "console.log('app-1234');\n";
/// In files next to the served directory: no response may ever contain it.
const OUTSIDE: &str = "OUTSIDE-THE-WEB-DIR";

/// A temporary tree: `root/web/` (the served directory: `index.html`,
/// `assets/app-1234.js`) and, outside it, `root/Cargo.toml` and `root/x`.
/// Removed when dropped.
struct WebTree {
    root: PathBuf,
}

impl WebTree {
    fn new() -> WebTree {
        static N: AtomicU32 = AtomicU32::new(0);
        let root = std::env::temp_dir().join(format!(
            "plaza-web-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let web = root.join("web");
        std::fs::create_dir_all(web.join("assets")).unwrap();
        std::fs::write(web.join("index.html"), INDEX).unwrap();
        std::fs::write(web.join("assets/app-1234.js"), APP_JS).unwrap();
        std::fs::write(root.join("Cargo.toml"), OUTSIDE).unwrap();
        std::fs::write(root.join("x"), OUTSIDE).unwrap();
        WebTree { root }
    }

    fn web(&self) -> PathBuf {
        self.root.join("web")
    }
}

impl Drop for WebTree {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.root);
    }
}

async fn serving(dir: &Path) -> TestServer {
    TestServer::with_config(ServerConfig {
        web_dir: Some(dir.to_owned()),
        ..ServerConfig::default()
    })
    .await
}

fn header(r: &reqwest::Response, name: &str) -> String {
    r.headers()
        .get(name)
        .map(|v| v.to_str().unwrap().to_owned())
        .unwrap_or_default()
}

/// Sends `GET {target}` exactly as written (an HTTP client library would
/// normalize `..` and `%2e%2e` away before sending) and returns the status
/// line and the whole response.
async fn raw_get(s: &TestServer, target: &str) -> (String, String) {
    let mut tcp = tokio::net::TcpStream::connect(s.addr).await.unwrap();
    let req = format!(
        "GET {target} HTTP/1.1\r\nHost: {}\r\nConnection: close\r\n\r\n",
        s.addr
    );
    tcp.write_all(req.as_bytes()).await.unwrap();
    let mut buf = Vec::new();
    tokio::time::timeout(crate::support::WAIT, tcp.read_to_end(&mut buf))
        .await
        .expect("timed out reading the response")
        .unwrap();
    let text = String::from_utf8_lossy(&buf).into_owned();
    let status_line = text.lines().next().unwrap_or("").to_owned();
    (status_line, text)
}

#[tokio::test]
async fn web_dir_index_is_served_at_root_without_caching() {
    let tree = WebTree::new();
    let s = serving(&tree.web()).await;
    let r = s.http.get(s.url("/")).send().await.unwrap();
    assert_eq!(r.status(), 200);
    assert!(
        header(&r, "content-type").starts_with("text/html"),
        "{:?}",
        r.headers()
    );
    assert_eq!(header(&r, "cache-control"), "no-cache");
    assert!(!header(&r, "x-plaza-node").is_empty(), "{:?}", r.headers());
    assert_eq!(r.text().await.unwrap(), INDEX);

    // HEAD too, without a body.
    let r = s.http.head(s.url("/")).send().await.unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(header(&r, "cache-control"), "no-cache");
    assert_eq!(r.text().await.unwrap(), "");
}

#[tokio::test]
async fn web_dir_assets_are_served_immutable() {
    let tree = WebTree::new();
    let s = serving(&tree.web()).await;
    let r = s
        .http
        .get(s.url("/assets/app-1234.js"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert!(
        header(&r, "content-type").contains("javascript"),
        "{:?}",
        r.headers()
    );
    assert_eq!(
        header(&r, "cache-control"),
        "public, max-age=31536000, immutable"
    );
    assert_eq!(header(&r, "x-plaza-node"), s.node.id(), "{:?}", r.headers());
    assert_eq!(r.text().await.unwrap(), APP_JS);
}

#[tokio::test]
async fn web_dir_missing_file_is_the_json_404() {
    let tree = WebTree::new();
    let s = serving(&tree.web()).await;
    for path in ["/assets/missing.js", "/nope", "/assets", "/assets/"] {
        let r = s.http.get(s.url(path)).send().await.unwrap();
        assert_eq!(r.status(), 404, "{path}");
        assert!(!header(&r, "x-plaza-node").is_empty(), "{path}");
        assert_eq!(header(&r, "cache-control"), "", "{path}");
        let body: Value = r.json().await.unwrap();
        assert_eq!(body["error"]["code"], "not_found", "{path}: {body}");
        assert!(
            !body["error"]["message"].as_str().unwrap_or("").is_empty(),
            "{path}: {body}"
        );
    }
    // The same body as without web_dir.
    let plain = TestServer::start().await;
    assert_eq!(
        s.get("/assets/missing.js").await,
        plain.get("/assets/missing.js").await
    );
    // Files are for GET and HEAD only; other methods find no route.
    let r = s
        .http
        .post(s.url("/assets/app-1234.js"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 404);
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["error"]["code"], "not_found", "{body}");
    // `/` is a route: another method there is 405, as on the API.
    let r = s.http.post(s.url("/")).send().await.unwrap();
    assert_eq!(r.status(), 405);
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["error"]["code"], "method_not_allowed", "{body}");
}

#[tokio::test]
async fn web_dir_paths_never_escape_the_directory() {
    let tree = WebTree::new();
    let s = serving(&tree.web()).await;
    for target in [
        "/%2e%2e/Cargo.toml",
        "/%2E%2E/Cargo.toml",
        "/../x",
        "/../Cargo.toml",
        "/assets/../../x",
        "/assets/%2e%2e/%2e%2e/Cargo.toml",
        "/..%2fCargo.toml",
        "/%2e%2e%2fx",
        "/assets/..%5c..%5cx",
    ] {
        let (status, response) = raw_get(&s, target).await;
        assert!(!status.contains(" 200 "), "{target}: {status}");
        assert!(!response.contains(OUTSIDE), "{target}: {response}");
    }
    // The traversals that reach the router are unknown paths: the JSON 404.
    let (status, response) = raw_get(&s, "/%2e%2e/Cargo.toml").await;
    assert!(status.contains(" 404 "), "{status}");
    assert!(response.contains(r#""code":"not_found""#), "{response}");
}

#[tokio::test]
async fn web_dir_hides_dotfiles() {
    let tree = WebTree::new();
    let web = tree.web();
    std::fs::write(web.join(".env"), OUTSIDE).unwrap();
    std::fs::create_dir_all(web.join(".git")).unwrap();
    std::fs::write(web.join(".git/config"), OUTSIDE).unwrap();
    std::fs::write(web.join("assets/.secret"), OUTSIDE).unwrap();
    let s = serving(&web).await;
    for target in [
        "/.env",
        "/%2eenv",
        "/.git/config",
        "/assets/.secret",
        "/assets/%2Esecret",
    ] {
        let (status, response) = raw_get(&s, target).await;
        assert!(status.contains(" 404 "), "{target}: {status}");
        assert!(!response.contains(OUTSIDE), "{target}: {response}");
        assert!(
            response.contains(r#""code":"not_found""#),
            "{target}: {response}"
        );
    }
    // Ordinary files next to them are served.
    let (status, _) = raw_get(&s, "/assets/app-1234.js").await;
    assert!(status.contains(" 200 "), "{status}");
}

#[tokio::test]
async fn web_dir_serves_no_file_through_a_link_that_leads_out() {
    let tree = WebTree::new();
    let web = tree.web();
    std::os::unix::fs::symlink(tree.root.join("x"), web.join("out.txt")).unwrap();
    std::os::unix::fs::symlink(tree.root.clone(), web.join("up")).unwrap();
    std::os::unix::fs::symlink(web.join("assets/app-1234.js"), web.join("app.js")).unwrap();
    let s = serving(&web).await;
    for target in ["/out.txt", "/up/x", "/up/Cargo.toml"] {
        let (status, response) = raw_get(&s, target).await;
        assert!(status.contains(" 404 "), "{target}: {status}");
        assert!(!response.contains(OUTSIDE), "{target}: {response}");
    }
    // A link that stays inside is followed.
    let (status, response) = raw_get(&s, "/app.js").await;
    assert!(status.contains(" 200 "), "{status}");
    assert!(response.contains(APP_JS), "{response}");
}

#[tokio::test]
async fn web_dir_api_routes_win_over_files() {
    let tree = WebTree::new();
    // Files named like API routes are never served.
    let web = tree.web();
    std::fs::create_dir_all(web.join("v1")).unwrap();
    std::fs::write(web.join("v1/status"), OUTSIDE).unwrap();
    std::fs::write(web.join("healthz"), OUTSIDE).unwrap();
    let s = serving(&web).await;
    let r = s.http.get(s.url("/v1/status")).send().await.unwrap();
    assert_eq!(r.status(), 200);
    assert!(header(&r, "content-type").starts_with("application/json"));
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["node"], s.node.id(), "{v}");
    let (status, v) = s.get("/healthz").await;
    assert_eq!((status, v["status"].as_str()), (200, Some("ok")));
    let (status, v) = s.get("/v1/rooms").await;
    assert_eq!(status, 200, "{v}");
    assert!(v["rooms"].is_array(), "{v}");
    let (status, text) = s.get_text("/metrics").await;
    assert_eq!(status, 200);
    assert!(!text.contains(OUTSIDE));
    let (status, text) = s.get_text("/status").await;
    assert_eq!(status, 200);
    assert!(!text.contains(OUTSIDE));
    // The WebSocket still works next to the files.
    let (_c, joined) = s
        .join_with(serde_json::json!({"type": "join", "room": "r", "name": "a"}))
        .await;
    assert_eq!(joined["code"], "room_not_found", "{joined}");
}

#[tokio::test]
async fn without_web_dir_root_is_the_built_in_page() {
    let s = TestServer::start().await;
    let r = s.http.get(s.url("/")).send().await.unwrap();
    assert_eq!(r.status(), 200);
    assert!(header(&r, "content-type").starts_with("text/html"));
    assert_eq!(header(&r, "cache-control"), "");
    assert!(!header(&r, "x-plaza-node").is_empty());
    let text = r.text().await.unwrap();
    assert!(text.contains("<title>Plaza demo</title>"), "{text}");
    // Nothing else is looked up on disk.
    let (status, v) = s.get("/assets/app-1234.js").await;
    assert_eq!(status, 404);
    assert_eq!(v["error"]["code"], "not_found", "{v}");
}
