//! The trajectory filters: `POST /v1/trajectory/mean` and `/v1/trajectory/median`.

use crate::support::TestServer;
use serde_json::{json, Value};

const CSV: Option<&str> = Some("text/csv");
const JSON: Option<&str> = Some("application/json");

/// Asserts an API error: status, code, and that the message contains `needle`.
fn assert_error(got: (u16, String, Value), status: u16, code: &str, needle: &str) {
    let (s, ct, body) = got;
    assert_eq!(s, status, "{body}");
    assert!(ct.starts_with("application/json"), "content type {ct}");
    assert_eq!(body["error"]["code"], code, "{body}");
    let message = body["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains(needle), "{message:?} lacks {needle:?}");
}

/// The coordinates and timestamps of a successful answer.
fn line(body: &Value) -> (Vec<[f64; 2]>, Vec<Value>) {
    let f = &body["features"][0];
    let coords = f["geometry"]["coordinates"]
        .as_array()
        .unwrap_or_else(|| panic!("no coordinates: {body}"))
        .iter()
        .map(|p| [p[0].as_f64().unwrap(), p[1].as_f64().unwrap()])
        .collect();
    let ts = f["properties"]["timestamps"].as_array().unwrap().clone();
    (coords, ts)
}

#[tokio::test]
async fn median_of_csv_removes_the_outlier() {
    let s = TestServer::start().await;
    let body = "timestamp,lat,lon\r\n1,10,20\r\n2,11,22\r\n3,80,-170\r\n4,12,24\r\n5,13,26\r\n\r\n";
    let (status, ct, v) = s
        .post_body("/v1/trajectory/median?interval=3", CSV, body)
        .await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(ct, "application/geo+json");
    assert_eq!(v["type"], "FeatureCollection");
    assert_eq!(v["features"].as_array().unwrap().len(), 1);
    assert_eq!(v["features"][0]["type"], "Feature");
    assert_eq!(v["features"][0]["geometry"]["type"], "LineString");
    // windows (w=3): {1,2} {1,2,3} {2,3,4} {3,4,5} {4,5}; positions are [lon, lat]
    let (coords, ts) = line(&v);
    assert_eq!(
        coords,
        vec![
            [21.0, 10.5],
            [20.0, 11.0],
            [22.0, 12.0],
            [24.0, 13.0],
            [25.0, 12.5]
        ]
    );
    assert_eq!(ts, vec![json!(1), json!(2), json!(3), json!(4), json!(5)]);
    assert_eq!(
        v["features"][0]["properties"],
        json!({"timestamps": [1, 2, 3, 4, 5], "filter": "median", "interval": 3, "points": 5})
    );
}

#[tokio::test]
async fn mean_of_json_with_an_even_window() {
    let s = TestServer::start().await;
    let points: Vec<Value> = [1.0, 2.0, 6.0, 3.0, 8.0]
        .iter()
        .enumerate()
        .map(|(i, lat)| json!({"t": 1000.5 * i as f64, "lat": lat, "lon": -2.0 * lat}))
        .collect();
    let body = json!({"points": points, "interval": 4}).to_string();
    let (status, ct, v) = s.post_body("/v1/trajectory/mean", JSON, body).await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(ct, "application/geo+json");
    // windows (w=4: i-1 ..= i+2): {1,2,6} {1,2,6,3} {2,6,3,8} {6,3,8} {3,8}
    let lats = [3.0, 3.0, 4.75, 17.0 / 3.0, 5.5];
    let (coords, ts) = line(&v);
    assert_eq!(
        coords,
        lats.iter().map(|&l| [-2.0 * l, l]).collect::<Vec<_>>()
    );
    assert_eq!(
        ts,
        vec![
            json!(0),
            json!(1000.5),
            json!(2001),
            json!(3001.5),
            json!(4002)
        ]
    );
    assert_eq!(v["features"][0]["properties"]["filter"], "mean");
    assert_eq!(v["features"][0]["properties"]["interval"], 4);
}

#[tokio::test]
async fn text_plain_charset_and_interval_sources_are_accepted() {
    let s = TestServer::start().await;
    let (status, _, v) = s
        .post_body(
            "/v1/trajectory/mean?interval=1&other=x",
            Some("Text/Plain; charset=utf-8"),
            "1,1,2\n2,3,4",
        )
        .await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(line(&v).0, vec![[2.0, 1.0], [4.0, 3.0]]);

    let pts = json!([{"t": 1, "lat": 1, "lon": 1}, {"t": 2, "lat": 3, "lon": 5}]);
    // interval only in the query
    let body = json!({"points": pts}).to_string();
    let (status, _, v) = s
        .post_body("/v1/trajectory/mean?interval=2", JSON, body)
        .await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(line(&v).0, vec![[3.0, 2.0], [5.0, 3.0]]);
    // in both, equal
    let body = json!({"points": pts, "interval": 2}).to_string();
    let (status, _, v) = s
        .post_body("/v1/trajectory/median?interval=2", JSON, body)
        .await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(line(&v).0, vec![[3.0, 2.0], [5.0, 3.0]]);
}

#[tokio::test]
async fn one_point_is_a_point_geometry() {
    let s = TestServer::start().await;
    let (status, _, v) = s
        .post_body("/v1/trajectory/median?interval=5", CSV, "7,1.5,2.5\n")
        .await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(
        v["features"][0]["geometry"],
        json!({"type": "Point", "coordinates": [2.5, 1.5]})
    );
}

#[tokio::test]
async fn large_input_is_filtered() {
    let s = TestServer::start().await;
    // 200,000 points on a straight line with one outlier at every 1,000th point
    let n = 200_000;
    let mut body = String::from("timestamp,lat,lon\n");
    for i in 0..n {
        let lat = if i % 1000 == 500 { 89.0 } else { 10.0 };
        body.push_str(&format!("{},{lat},{}\n", 1_700_000_000_000u64 + i, 20.0));
    }
    let (status, _, v) = s
        .post_body("/v1/trajectory/median?interval=101", CSV, body)
        .await;
    assert_eq!(status, 200);
    let (coords, ts) = line(&v);
    assert_eq!(coords.len(), n as usize);
    assert!(coords.iter().all(|c| *c == [20.0, 10.0]), "outliers remain");
    assert_eq!(ts[123], json!(1_700_000_000_123u64));
    assert_eq!(v["features"][0]["properties"]["points"], n);
}

#[tokio::test]
async fn bad_csv_rows_name_the_line_and_field() {
    let s = TestServer::start().await;
    let url = "/v1/trajectory/mean?interval=3";
    let cases = [
        (
            "timestamp,lat,lon\n1,2,3\n2,abc,3\n",
            "line 3, field lat: \"abc\" is not a number",
        ),
        (
            "1,2,3\r\n2,3,x4\r\n",
            "line 2, field lon: \"x4\" is not a number",
        ),
        ("1,2,3\n\n2,3\n", "line 3, field lon: missing"),
        ("1,2,3\n2,3,4,5\n", "line 2: 4 fields, expected 3"),
        ("1,,3\n", "line 1, field lat: empty value"),
        (
            "1,2,3\n2,95,3\n",
            "line 2, field lat: 95 is out of range [-90, 90]",
        ),
        (
            "1,2,-181\n",
            "line 1, field lon: -181 is out of range [-180, 180]",
        ),
        (
            "NaN,2,3\n",
            "line 1, field timestamp: NaN is not a finite number",
        ),
        (
            "when,north,east\n1,2,3\n",
            "line 1: expected a header with latitude (lat, latitude) and longitude",
        ),
        (
            "1,2,3\n5,2,3\n4,2,3\n",
            "line 3, field timestamp: 4 is before the timestamp 5 of line 2",
        ),
    ];
    for (body, message) in cases {
        assert_error(
            s.post_body(url, CSV, body).await,
            400,
            "invalid_csv",
            message,
        );
    }
    // not UTF-8 on line 2
    assert_error(
        s.post_body(url, CSV, b"1,2,3\n2,\xff,3\n".to_vec()).await,
        400,
        "invalid_csv",
        "line 2: not valid UTF-8",
    );
}

#[tokio::test]
async fn bad_json_bodies() {
    let s = TestServer::start().await;
    let url = "/v1/trajectory/median?interval=3";
    let cases = [
        ("", "must be a JSON object"),
        ("  \n", "must be a JSON object"),
        ("{\"points\": [", "invalid JSON body"),
        ("[1, 2]", "must be a JSON object"),
        ("{\"interval\": 3}", "the body needs points"),
        ("{\"points\": [], \"extra\": 1}", "unknown field `extra`"),
        (
            "{\"points\": [{\"t\": 1, \"lat\": 0, \"lon\": 0, \"alt\": 5}]}",
            "unknown field `alt`",
        ),
        ("{\"points\": [{\"t\": 1, \"lat\": \"0\", \"lon\": 0}]}", "invalid type"),
        (
            "{\"points\": [{\"t\": 1, \"lat\": 0, \"lon\": 0}, {\"t\": 2, \"lat\": 0, \"lon\": 200}]}",
            "points[1].lon: 200 is out of range [-180, 180]",
        ),
        (
            "{\"points\": [{\"t\": 2, \"lat\": 0, \"lon\": 0}, {\"t\": 1, \"lat\": 0, \"lon\": 0}]}",
            "points[1].t: 1 is before the timestamp 2 of points[0]",
        ),
    ];
    for (body, message) in cases {
        assert_error(
            s.post_body(url, JSON, body).await,
            400,
            "invalid_json",
            message,
        );
    }
}

#[tokio::test]
async fn bad_intervals() {
    let s = TestServer::start().await;
    let csv = "1,2,3\n2,3,4\n";
    let cases = [
        ("/v1/trajectory/mean", "interval is missing"),
        ("/v1/trajectory/mean?interval=0", "got 0"),
        ("/v1/trajectory/mean?interval=10001", "got 10001"),
        ("/v1/trajectory/median?interval=abc", "got \"abc\""),
        ("/v1/trajectory/median?interval=-1", "got \"-1\""),
        ("/v1/trajectory/median?interval=2.5", "got \"2.5\""),
        ("/v1/trajectory/median?interval=", "got \"\""),
        ("/v1/trajectory/median?interval=2&interval=3", "given twice"),
    ];
    for (url, message) in cases {
        assert_error(
            s.post_body(url, CSV, csv).await,
            400,
            "invalid_interval",
            message,
        );
    }
    // the largest interval is fine
    let (status, _, v) = s
        .post_body("/v1/trajectory/mean?interval=10000", CSV, csv)
        .await;
    assert_eq!(status, 200, "{v}");

    let pts = json!([{"t": 1, "lat": 1, "lon": 1}]);
    let json_cases = [
        (
            "/v1/trajectory/mean",
            json!({"points": pts}),
            "interval is missing",
        ),
        (
            "/v1/trajectory/mean",
            json!({"points": pts, "interval": null}),
            "interval is missing",
        ),
        (
            "/v1/trajectory/mean",
            json!({"points": pts, "interval": 0}),
            "got 0",
        ),
        (
            "/v1/trajectory/mean",
            json!({"points": pts, "interval": 10001}),
            "got 10001",
        ),
        (
            "/v1/trajectory/mean",
            json!({"points": pts, "interval": -3}),
            "got -3",
        ),
        (
            "/v1/trajectory/mean",
            json!({"points": pts, "interval": 1.5}),
            "got 1.5",
        ),
        (
            "/v1/trajectory/mean",
            json!({"points": pts, "interval": "3"}),
            "got \"3\"",
        ),
        (
            "/v1/trajectory/mean?interval=3",
            json!({"points": pts, "interval": 5}),
            "the query says interval=3 but the body says 5",
        ),
    ];
    for (url, body, message) in json_cases {
        assert_error(
            s.post_body(url, JSON, body.to_string()).await,
            400,
            "invalid_interval",
            message,
        );
    }
}

#[tokio::test]
async fn empty_trajectories() {
    let s = TestServer::start().await;
    let url = "/v1/trajectory/mean?interval=3";
    for body in ["", "\r\n\n  \n", "timestamp,lat,lon\r\n"] {
        assert_error(
            s.post_body(url, CSV, body).await,
            400,
            "empty_trajectory",
            "no points",
        );
    }
    assert_error(
        s.post_body(url, JSON, r#"{"points": []}"#).await,
        400,
        "empty_trajectory",
        "no points",
    );
}

#[tokio::test]
async fn wrong_or_missing_content_type_is_415() {
    let s = TestServer::start().await;
    let url = "/v1/trajectory/median?interval=3";
    for ct in [
        None,
        Some("application/pdf"),
        Some("text/html"),
        Some("application/x-www-form-urlencoded"),
    ] {
        assert_error(
            s.post_body(url, ct, "1,2,3\n").await,
            415,
            "invalid_request",
            "Content-Type must be",
        );
    }
}

#[tokio::test]
async fn too_many_points_and_too_large_bodies() {
    let s = TestServer::start().await;
    let url = "/v1/trajectory/mean?interval=3";
    // 1,000,001 rows of "0,0,0" (6 MB, under the body limit); equal timestamps are allowed
    let body = "0,0,0\n".repeat(1_000_001);
    assert_error(
        s.post_body(url, CSV, body).await,
        413,
        "too_many_points",
        "more than 1000000 points",
    );
    let body = vec![b'\n'; 16 * 1024 * 1024 + 1];
    assert_error(
        s.post_body(url, CSV, body).await,
        413,
        "invalid_request",
        "larger than 16777216 bytes",
    );
}

#[tokio::test]
async fn other_methods_are_405() {
    let s = TestServer::start().await;
    let (status, _) = s.get("/v1/trajectory/mean?interval=3").await;
    assert_eq!(status, 405);
}

/// The example in docs/protocol.md: both request forms get exactly the answer shown.
#[tokio::test]
async fn protocol_doc_example_is_what_the_server_answers() {
    let doc = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/protocol.md"),
    )
    .unwrap();
    let start = doc
        .find("### POST /v1/trajectory/mean and POST /v1/trajectory/median")
        .expect("the trajectory section");
    let section = &doc[start..];
    let section = &section[..section.find("\n## ").unwrap_or(section.len())];
    let block = |lang: &str| -> String {
        let open = format!("```{lang}\n");
        let at = section
            .find(&open)
            .unwrap_or_else(|| panic!("no ```{lang} block"))
            + open.len();
        let len = section[at..].find("```").unwrap();
        section[at..at + len].to_owned()
    };
    let request_line = block("text");
    assert!(
        request_line.starts_with("POST /v1/trajectory/median?interval=3\nContent-Type: text/csv")
    );
    let expected: Value = serde_json::from_str(&block("geojson")).unwrap();

    let s = TestServer::start().await;
    let (status, _, v) = s
        .post_body("/v1/trajectory/median?interval=3", CSV, block("csv"))
        .await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v, expected, "the CSV example's answer differs from the doc");
    let (status, _, v) = s
        .post_body("/v1/trajectory/median", JSON, block("json"))
        .await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(
        v, expected,
        "the JSON example's answer differs from the doc"
    );
    // The GPX example: the same positions, times in Unix milliseconds.
    let (status, _, v) = s
        .post_body(
            "/v1/trajectory/median?interval=3",
            Some("application/gpx+xml"),
            block("xml gpx"),
        )
        .await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(
        v["features"][0]["geometry"], expected["features"][0]["geometry"],
        "the GPX example's positions differ from the CSV example's"
    );
    let seconds = expected["features"][0]["properties"]["timestamps"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| json!(t.as_u64().unwrap() * 1000))
        .collect::<Vec<_>>();
    assert_eq!(v["features"][0]["properties"]["timestamps"], json!(seconds));
    // Source document 001's request shape, at the root path.
    let untimed: Value = serde_json::from_str(&block("geojson untimed")).unwrap();
    let (status, _, v) = s
        .post_body("/trajectory/mean", JSON, block("json csv_data"))
        .await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(
        v, untimed,
        "the csv_data example's answer differs from the doc: {v}"
    );
}

/// Source document 001's load-test client, as it sends: JSON with the CSV of a
/// recorded track (`lat,long`, no time column) and the interval, to the
/// filters at the server's root.
#[tokio::test]
async fn the_documents_client_request_is_answered_at_the_root() {
    let s = TestServer::start().await;
    let csv = "lat,long\n56.2568605075,10.0688809242\n56.2569,10.0690\n56.2570,10.0692\n";
    let body = json!({"csv_data": csv, "interval": 10}).to_string();
    for path in [
        "/trajectory/mean",
        "/trajectory/median",
        "/v1/trajectory/mean",
    ] {
        let (status, ct, v) = s.post_body(path, JSON, body.clone()).await;
        assert_eq!(status, 200, "{path}: {v}");
        assert_eq!(ct, "application/geo+json");
        let props = &v["features"][0]["properties"];
        assert_eq!(props["points"], 3);
        assert_eq!(props["interval"], 10);
        assert!(
            props.get("timestamps").is_none(),
            "an untimed track has none: {v}"
        );
        assert_eq!(v["features"][0]["geometry"]["type"], "LineString");
    }
    // The same rows as text/csv, and semicolon-separated with the delimiter given.
    let (status, _, csv_answer) = s.post_body("/trajectory/mean?interval=10", CSV, csv).await;
    assert_eq!(status, 200, "{csv_answer}");
    let (_, _, json_answer) = s.post_body("/trajectory/mean", JSON, body).await;
    assert_eq!(csv_answer, json_answer);
    let semi = csv.replace(',', ";");
    let (status, _, semi_answer) = s
        .post_body("/trajectory/mean?interval=10&delimiter=;", CSV, semi)
        .await;
    assert_eq!(status, 200, "{semi_answer}");
    assert_eq!(semi_answer, csv_answer);
    assert_error(
        s.post_body("/trajectory/mean?interval=10&delimiter=x", CSV, csv)
            .await,
        400,
        "invalid_request",
        "delimiter must be",
    );
    // An error in csv_data names its line and field.
    assert_error(
        s.post_body(
            "/trajectory/median",
            JSON,
            json!({"csv_data": "lat,long\n1,2\n3,east\n", "interval": 10}).to_string(),
        )
        .await,
        400,
        "invalid_csv",
        "line 3, field lon: \"east\" is not a number",
    );
}

#[tokio::test]
async fn gpx_and_geojson_bodies_give_the_csv_answer() {
    let s = TestServer::start().await;
    let csv = "time,lat,lon\n2023-11-14T22:13:20Z,56.25,10.5\n2023-11-14T22:13:21Z,56.5,10.75\n2023-11-14T22:13:22Z,56.75,11\n";
    let (status, _, expected) = s
        .post_body("/v1/trajectory/median?interval=2", CSV, csv)
        .await;
    assert_eq!(status, 200, "{expected}");
    assert_eq!(
        expected["features"][0]["properties"]["timestamps"],
        json!([
            1_700_000_000_000u64,
            1_700_000_001_000u64,
            1_700_000_002_000u64
        ])
    );
    let gpx = r#"<?xml version="1.0" encoding="UTF-8"?>
<gpx version="1.1" creator="watch" xmlns="http://www.topografix.com/GPX/1/1">
  <trk><trkseg>
    <trkpt lat="56.25" lon="10.5"><time>2023-11-14T22:13:20Z</time></trkpt>
    <trkpt lat="56.5" lon="10.75"><time>2023-11-14T22:13:21Z</time></trkpt>
  </trkseg><trkseg>
    <trkpt lat="56.75" lon="11"><time>2023-11-14T22:13:22Z</time></trkpt>
  </trkseg></trk>
</gpx>"#;
    let (status, _, v) = s
        .post_body(
            "/v1/trajectory/median?interval=2",
            Some("application/gpx+xml"),
            gpx,
        )
        .await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v, expected);
    // The answer itself reads back as GeoJSON input.
    let (status, _, v) = s
        .post_body(
            "/v1/trajectory/median?interval=1",
            Some("application/geo+json"),
            expected.to_string(),
        )
        .await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(
        v["features"][0]["geometry"],
        expected["features"][0]["geometry"]
    );
    // Errors of each format keep their own code.
    assert_error(
        s.post_body(
            "/v1/trajectory/mean?interval=2",
            Some("application/gpx+xml"),
            "<gpx version=\"1.1\" creator=\"x\"><wpt lat=\"1\" lon=\"2\"/></gpx>",
        )
        .await,
        400,
        "empty_trajectory",
        "no points",
    );
    assert_error(
        s.post_body(
            "/v1/trajectory/mean?interval=2",
            Some("application/gpx+xml"),
            "<gpx",
        )
        .await,
        400,
        "invalid_gpx",
        "invalid GPX",
    );
    assert_error(
        s.post_body(
            "/v1/trajectory/mean?interval=2",
            Some("application/geo+json"),
            r#"{"type": "Point", "coordinates": [1, 2]}"#,
        )
        .await,
        400,
        "invalid_geojson",
        "must be a LineString",
    );
}
