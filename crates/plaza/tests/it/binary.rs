//! The real `plaza` binary: configuration sources, and SIGTERM handling.

use std::process::Command;
use std::time::{Duration, Instant};

use crate::support::{exit_within, http_get, http_post, start};
use futures_util::{SinkExt, StreamExt};
use tokio_tungstenite::tungstenite::Message;

#[test]
fn help_documents_every_option() {
    let out = Command::new(env!("CARGO_BIN_EXE_plaza"))
        .args(["serve", "--help"])
        .output()
        .unwrap();
    let help = String::from_utf8(out.stdout).unwrap();
    let defaults = serde_json::to_value(plaza_server::ServerConfig::default()).unwrap();
    // Tables of the file only, named in the text.
    assert!(help.contains("[[webhooks]]"), "{help}");
    for key in defaults.as_object().unwrap().keys() {
        if key == "webhooks" {
            continue;
        }
        let flag = format!("--{}", key.replace('_', "-"));
        assert!(help.contains(&flag), "plaza serve --help lacks {flag}");
    }
}

#[test]
fn config_file_env_and_flags_layer_in_that_order() {
    // Removed when the test ends, passed or not.
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path();
    let file = dir.join("plaza.toml");
    std::fs::write(
        &file,
        "max_frame_bytes = 111\nhistory_size = 7\nmax_members = 5\n",
    )
    .unwrap();
    // file sets 7, env overrides max_members, flag overrides history_size
    let p = start(
        &["--config", file.to_str().unwrap(), "--history-size", "9"],
        // PLAZA_LOG is the log filter, not a setting: it must not be refused.
        &[("PLAZA_MAX_MEMBERS", "3"), ("PLAZA_LOG", "warn")],
    );
    let rt = tokio::runtime::Runtime::new().unwrap();
    let body: serde_json::Value = rt.block_on(async {
        let (mut ws, _) = tokio_tungstenite::connect_async(format!("ws://{}/v1/ws", p.addr))
            .await
            .unwrap();
        // max_frame_bytes = 111 from the file: a 200-byte frame is refused.
        let big = format!("{{\"type\":\"ping\",\"pad\":\"{}\"}}", "x".repeat(200));
        ws.send(Message::text(big)).await.unwrap();
        loop {
            if let Message::Text(t) = ws.next().await.unwrap().unwrap() {
                break serde_json::from_str(&t).unwrap();
            }
        }
    });
    assert_eq!(body["code"], "frame_too_large");
    let created = http_post(&p.addr, "/v1/rooms", r#"{"id":"c"}"#);
    assert!(created.contains("\"history_size\":9"), "{created}");
    assert!(created.contains("\"max_members\":3"), "{created}");

    let bad = dir.join("bad.toml");
    std::fs::write(&bad, "no_such_option = 1\n").unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_plaza"))
        .args(["serve", "--config", bad.to_str().unwrap()])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("no_such_option"));
}

#[test]
fn a_bad_webhook_target_stops_serve_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
    let target = |fields: &str| {
        format!(
            "[[webhooks]]\nname = \"ok\"\nurl = \"http://127.0.0.1:9/\"\nsecret = \"{secret}\"\n\
             events = [\"*\"]\n\n[[webhooks]]\n{fields}\n"
        )
    };
    let good = format!("name = \"backend\"\nurl = \"http://127.0.0.1:9/\"\nsecret = \"{secret}\"");
    for (fields, says) in [
        (
            format!("{good}\nevents = [\"*\"]\ntimeout_ms = 99"),
            "plaza: invalid configuration: webhooks[1].timeout_ms must be from 100 to 60000, not 99",
        ),
        (
            format!("{good}\nevents = [\"room.renamed\"]"),
            "plaza: invalid configuration: webhooks[1].events (backend): unknown event type \"room.renamed\"",
        ),
        (
            format!("name = \"backend\"\nurl = \"ftp://h/\"\nsecret = \"{secret}\"\nevents = [\"*\"]"),
            "plaza: invalid configuration: webhooks[1].url (backend) \"ftp://h/\": the scheme must be http, not ftp",
        ),
        (
            "name = \"backend\"\nurl = \"http://h/\"\nsecret = \"whsec_c2hvcnQ=\"\nevents = [\"*\"]".to_owned(),
            "plaza: invalid configuration: webhooks[1].secret (backend) must hold from 24 to 64 bytes, not 5",
        ),
        (
            format!("name = \"ok\"\nurl = \"http://h/\"\nsecret = \"{secret}\"\nevents = [\"*\"]"),
            "plaza: invalid configuration: webhooks[1].name \"ok\" is also the name of webhooks[0]",
        ),
    ] {
        let file = dir.path().join("hooks.toml");
        std::fs::write(&file, target(&fields)).unwrap();
        let out = Command::new(env!("CARGO_BIN_EXE_plaza"))
            .args(["serve", "--listen", "127.0.0.1:0", "--config"])
            .arg(&file)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{fields}: {stderr}");
        assert!(stderr.starts_with(says), "{fields}: {stderr}");
        assert!(!stderr.contains("MfKQ9r8"), "the secret is never shown: {stderr}");
    }
}

/// Runs `plaza serve` with `args` and `env` until it exits (a refused
/// configuration): its exit code and what it printed on stderr.
fn serve(args: &[&str], env: &[(&str, &str)]) -> (Option<i32>, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_plaza"))
        .args(["serve", "--listen", "127.0.0.1:0"])
        .args(args)
        .envs(env.iter().copied())
        .output()
        .unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn a_number_out_of_bounds_stops_serve_naming_it_and_its_limits() {
    for (args, env, says) in [
        (
            &["--max-members", "0"][..],
            &[][..],
            "plaza: invalid configuration: --max-members must be from 1 to 1000000, not 0",
        ),
        (
            &[],
            &[("PLAZA_MAX_ROOMS_PER_CONNECTION", "1025")][..],
            "plaza: invalid configuration: PLAZA_MAX_ROOMS_PER_CONNECTION must be from 1 to 1024, not 1025",
        ),
        (
            &["--lock-ttl-ms", "600001"],
            &[],
            "plaza: invalid configuration: --lock-ttl-ms must be from 1 to 600000, not 600001 (max_lock_ttl_ms)",
        ),
        (
            &["--heartbeat-interval-ms", "30000"],
            &[],
            "plaza: invalid configuration: --heartbeat-interval-ms (30000) must be less than idle_timeout_ms (30000)",
        ),
    ] {
        let (code, stderr) = serve(args, env);
        assert_eq!(code, Some(2), "{args:?} {env:?}: {stderr}");
        assert!(stderr.starts_with(says), "{args:?} {env:?}: {stderr}");
    }
    // Not a count: named as the variable is, with the setting's bounds.
    let (code, stderr) = serve(&[], &[("PLAZA_MAX_MEMBERS", "-1")]);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(
        stderr.starts_with(
            "plaza: invalid configuration: PLAZA_MAX_MEMBERS must be a whole number from 1 to 1000000, not -1"
        ),
        "{stderr}"
    );
}

#[test]
fn a_bad_broker_ack_stops_serve_naming_its_forms_and_bounds() {
    let forms = "must be primary or replicas:N with N from 1 to 16";
    for (args, env, bad) in [
        (
            &["--broker-ack", "replicas:17"][..],
            &[][..],
            "--broker-ack",
        ),
        (
            &[],
            &[("PLAZA_BROKER_ACK", "replicas:0")][..],
            "PLAZA_BROKER_ACK",
        ),
        (&["--broker-ack", "all"], &[], "--broker-ack"),
    ] {
        let value = args.get(1).copied().unwrap_or_else(|| env[0].1);
        let (code, stderr) = serve(args, env);
        assert_eq!(code, Some(2), "{args:?} {env:?}: {stderr}");
        assert!(
            stderr.starts_with("plaza: invalid configuration"),
            "{stderr}"
        );
        assert!(
            stderr.contains(&format!("{bad} {forms}, not {value:?}")),
            "{args:?} {env:?}: {stderr}"
        );
    }
    // Well formed, but there is nothing to replicate to without Redis: refused
    // as any invalid setting is, with the same status.
    let (code, stderr) = serve(&["--broker-ack", "replicas:1"], &[]);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(
        stderr.starts_with(
            "plaza: invalid configuration: --broker-ack replicas:1 is for cluster mode (with redis)"
        ),
        "{stderr}"
    );
}

/// Every invalid setting is refused in the user's words — the flag, the
/// variable or the file key as given, its value and what it may be — never
/// the configuration reader's (profiles, Rust types, source locations), and
/// always with exit status 2.
#[test]
fn an_invalid_setting_is_named_as_the_user_gave_it_and_exits_2() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("plaza.toml");
    std::fs::write(&file, "fsync = \"sometimes\"\nidle_timeout_ms = 20000\n").unwrap();
    let in_file = format!("in {}", file.display());
    let config = ["--config", file.to_str().unwrap()];
    // (flags, variables, the refusal's start)
    type Case<'a> = (Vec<&'a str>, Vec<(&'a str, &'a str)>, String);
    let cases: Vec<Case> = vec![
        (
            vec!["--broker-ack", "replicas:0"],
            vec![],
            "--broker-ack must be primary or replicas:N with N from 1 to 16, not \"replicas:0\""
                .into(),
        ),
        (
            vec![],
            vec![("PLAZA_MAX_FRAME_BYTES", "lots")],
            "PLAZA_MAX_FRAME_BYTES must be a whole number from 64 to 16777216, not \"lots\"".into(),
        ),
        (
            vec![],
            vec![("PLAZA_WEBSOCKET_COMPRESSION", "maybe")],
            "PLAZA_WEBSOCKET_COMPRESSION must be true or false, not \"maybe\"".into(),
        ),
        (
            config.to_vec(),
            vec![],
            format!("fsync {in_file} must be one of always, interval, off, not \"sometimes\""),
        ),
        // Two settings that disagree: each named as given (the file's, a default's key).
        (
            [&config[..], &["--fsync", "off"]].concat(),
            vec![],
            format!(
                "heartbeat_interval_ms (25000) must be less than idle_timeout_ms {in_file} (20000)"
            ),
        ),
        (
            vec!["--broker-ack", "replicas:2"],
            vec![],
            "--broker-ack replicas:2 is for cluster mode (with redis)".into(),
        ),
        (
            vec!["--data-dir", dir.path().to_str().unwrap()],
            vec![("PLAZA_REDIS", "redis://127.0.0.1:1/")],
            "--data-dir is for embedded mode".into(),
        ),
    ];
    for (args, env, says) in cases {
        let (code, stderr) = serve(&args, &env);
        assert_eq!(code, Some(2), "{args:?} {env:?}: {stderr}");
        assert!(
            stderr.starts_with(&format!("plaza: invalid configuration: {says}")),
            "{args:?} {env:?}: {stderr}"
        );
        for internal in [".rs:", "default.", "ServeArgs", "usize", "for key"] {
            assert!(!stderr.contains(internal), "{internal:?} in {stderr}");
        }
    }
}

#[test]
fn web_dir_that_cannot_be_served_stops_serve_naming_it() {
    let out = Command::new(env!("CARGO_BIN_EXE_plaza"))
        .args([
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--web-dir",
            "/nonexistent",
        ])
        .output()
        .unwrap();
    assert!(!out.status.success(), "exit status {:?}", out.status);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("/nonexistent"), "{stderr}");
    assert_eq!(stderr.trim().lines().count(), 1, "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");

    // A directory without index.html is refused too, also when named by PLAZA_WEB_DIR.
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_plaza"))
        .args(["serve", "--listen", "127.0.0.1:0"])
        .env("PLAZA_WEB_DIR", dir.path())
        .output()
        .unwrap();
    assert!(!out.status.success(), "exit status {:?}", out.status);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("index.html"), "{stderr}");
    assert!(stderr.contains(dir.path().to_str().unwrap()), "{stderr}");
}

#[test]
fn web_dir_from_the_config_file_is_served_at_root() {
    let dir = tempfile::tempdir().unwrap();
    let web = dir.path().join("dist");
    std::fs::create_dir_all(web.join("assets")).unwrap();
    std::fs::write(web.join("index.html"), "<p>from web_dir</p>").unwrap();
    let file = dir.path().join("plaza.toml");
    std::fs::write(&file, format!("web_dir = {:?}\n", web.to_str().unwrap())).unwrap();
    let p = start(&["--config", file.to_str().unwrap()], &[]);
    let index = http_get(&p.addr, "/");
    assert!(index.starts_with("HTTP/1.1 200"), "{index}");
    assert!(index.ends_with("<p>from web_dir</p>"), "{index}");
    assert!(index.contains("cache-control: no-cache"), "{index}");
}

#[test]
fn metrics_show_the_allocators_live_and_resident_bytes() {
    let p = start(&[], &[]);
    let metrics = http_get(&p.addr, "/metrics");
    let value = |name: &str| -> f64 {
        metrics
            .lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
            .unwrap_or_else(|| panic!("no {name} in /metrics: {metrics}"))
    };
    let allocated = value("plaza_allocator_allocated_bytes");
    let resident = value("plaza_allocator_resident_bytes");
    // A running server has live data, and jemalloc maps at least what is live.
    assert!(allocated > 0.0, "{allocated}");
    assert!(
        resident >= allocated,
        "resident {resident} < allocated {allocated}"
    );
}

#[test]
fn sigterm_tells_clients_to_reconnect_and_exits_within_the_grace() {
    let mut p = start(&["--shutdown-grace-ms", "3000"], &[]);
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let (mut ws, _) = tokio_tungstenite::connect_async(format!("ws://{}/v1/ws", p.addr))
            .await
            .unwrap();
        ws.send(Message::text(r#"{"type":"ping"}"#)).await.unwrap();
        // the pong proves the connection is established server-side
        loop {
            if let Message::Text(_) = ws.next().await.unwrap().unwrap() {
                break;
            }
        }
        let started = Instant::now();
        unsafe { libc::kill(p.child.id() as i32, libc::SIGTERM) };
        let code = loop {
            match tokio::time::timeout(Duration::from_secs(10), ws.next())
                .await
                .unwrap()
            {
                Some(Ok(Message::Close(Some(f)))) => break u16::from(f.code),
                Some(Ok(_)) => continue,
                other => panic!("expected a close frame, got {other:?}"),
            }
        };
        assert_eq!(code, 1012);
        let limit = Duration::from_secs(10).saturating_sub(started.elapsed());
        let status = exit_within(&mut p.child, limit, "after SIGTERM").await;
        assert!(status.success(), "exit status {status:?}");
    });
}

#[test]
fn a_short_api_key_stops_serve_and_a_good_one_guards_management_calls() {
    let out = Command::new(env!("CARGO_BIN_EXE_plaza"))
        .args(["serve", "--listen", "127.0.0.1:0"])
        .env("PLAZA_API_KEY", "short")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "exit status {:?}", out.status);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("PLAZA_API_KEY is 5 bytes"), "{stderr}");
    assert!(!stderr.contains("short"), "never echo the key: {stderr}");

    let p = start(&[], &[("PLAZA_API_KEY", "0123456789abcdef0123")]);
    let refused = http_post(&p.addr, "/v1/rooms", r#"{"id": "guarded"}"#);
    assert!(refused.starts_with("HTTP/1.1 401"), "{refused}");
    assert!(refused.contains("\"unauthorized\""), "{refused}");
}

#[test]
fn token_keys_that_do_not_load_stop_serve() {
    let refused = |args: &[&str], env: &[(&str, &str)]| {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_plaza"));
        cmd.args(["serve", "--listen", "127.0.0.1:0"]).args(args);
        for (k, v) in env {
            cmd.env(k, v);
        }
        let out = cmd.output().unwrap();
        assert_eq!(
            out.status.code(),
            Some(2),
            "{args:?}: exit status {:?}",
            out.status
        );
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let stderr = refused(&[], &[("PLAZA_JWT_SECRET", "too-short-secret")]);
    assert!(stderr.contains("PLAZA_JWT_SECRET has 16 bytes"), "{stderr}");
    assert!(
        !stderr.contains("too-short-secret"),
        "never echo the secret: {stderr}"
    );
    let stderr = refused(&["--jwt-public-key-file", "/nonexistent/key.pem"], &[]);
    assert!(
        stderr.contains("--jwt-public-key-file /nonexistent/key.pem"),
        "{stderr}"
    );
    let stderr = refused(&["--demo-tokens"], &[]);
    assert!(
        stderr.contains("--demo-tokens signs with jwt_secret"),
        "{stderr}"
    );
    // With a good secret it serves (the address line first, its warnings after) and signs.
    let secret = [("PLAZA_JWT_SECRET", "a-secret-of-at-least-32-bytes-0123456")];
    let p = start(&["--demo-tokens"], &secret);
    let signed = http_post(&p.addr, "/v1/demo/token", r#"{"name": "ann"}"#);
    assert!(signed.starts_with("HTTP/1.1 200"), "{signed}");
    assert!(signed.contains("\"token\""), "{signed}");
}

#[test]
fn a_deployments_own_plaza_variables_are_warned_about_not_refused() {
    use std::io::{BufRead, BufReader};
    // PLAZA_BIN and PLAZA_ARGS as a deployment script would set them, beside a real setting.
    let mut child = Command::new(env!("CARGO_BIN_EXE_plaza"))
        .args(["serve", "--listen", "127.0.0.1:0"])
        .env("PLAZA_BIN", "/opt/plaza/bin/plaza")
        .env("PLAZA_ARGS", "--anything")
        .env("PLAZA_MAX_MEMBERS", "3")
        .env("PLAZA_LOG", "warn")
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut first = String::new();
    out.read_line(&mut first).unwrap();
    assert!(first.starts_with("Plaza is running"), "{first}");
    let addr = first
        .split("http://")
        .nth(1)
        .unwrap()
        .split('/')
        .next()
        .unwrap()
        .to_owned();
    // The setting took; the others are named in warnings, after the address line.
    let created = http_post(&addr, "/v1/rooms", r#"{"id":"e"}"#);
    assert!(created.contains("\"max_members\":3"), "{created}");
    let mut warnings = String::new();
    for _ in 0..2 {
        out.read_line(&mut warnings).unwrap();
    }
    assert!(warnings.contains("ignoring PLAZA_ARGS"), "{warnings}");
    assert!(warnings.contains("ignoring PLAZA_BIN"), "{warnings}");
    assert!(!warnings.contains("PLAZA_MAX_MEMBERS") && !warnings.contains("PLAZA_LOG"));
    child.kill().unwrap();
    let _ = child.wait();
}

#[test]
fn a_malformed_allowed_origin_stops_serve_naming_it() {
    let out = Command::new(env!("CARGO_BIN_EXE_plaza"))
        .args([
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--allowed-origins",
            "https://app.example.org,app.example.org/path",
        ])
        .output()
        .unwrap();
    assert!(!out.status.success(), "exit status {:?}", out.status);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("\"app.example.org/path\""), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
}

/// Everything `plaza serve` with `args` and `env` prints on stdout (a pipe,
/// not a terminal) until its "plaza listening" line, and then it is stopped.
fn startup_output(args: &[&str], env: &[(&str, &str)]) -> String {
    use std::io::{BufRead, BufReader};
    let mut child = Command::new(env!("CARGO_BIN_EXE_plaza"))
        .args(["serve", "--listen", "127.0.0.1:0"])
        .args(args)
        .envs(env.iter().copied())
        .env_remove("PLAZA_LOG")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut text = String::new();
    while !text.contains("plaza listening") {
        let read = out.read_line(&mut text).unwrap();
        assert_ne!(read, 0, "plaza serve ended before listening: {text}");
    }
    child.kill().unwrap();
    let _ = child.wait();
    text
}

/// The line of the security and durability settings in `output`.
fn settings_line(output: &str) -> &str {
    output
        .lines()
        .find(|l| l.contains("security and durability settings"))
        .unwrap_or_else(|| panic!("no settings line in {output}"))
}

#[test]
fn startup_logs_are_plain_and_list_the_security_and_durability_settings() {
    // Nothing set: colourless, the address as such, and every setting said off.
    let output = startup_output(&[], &[]);
    assert!(
        !output.contains('\u{1b}'),
        "escape codes in a pipe: {output:?}"
    );
    assert!(output.contains("addr=127.0.0.1:"), "{output}");
    assert!(!output.contains("Some("), "{output}");
    let line = settings_line(&output);
    for says in [
        "api_key=not set",
        "identities=development mode",
        "webhooks=none",
        "storage=in memory",
    ] {
        assert!(line.contains(says), "{says:?} not in {line}");
    }

    // Everything set: each is named, and no secret shows.
    let key = "startup-api-key-0123456789";
    let jwt = "startup-jwt-secret-of-32-bytes-or-more";
    let webhook_secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("plaza.toml");
    std::fs::write(
        &file,
        format!(
            "[[webhooks]]\nname = \"backend\"\nurl = \"http://hook-user:hook-pw@127.0.0.1:9/hook?token=hook-token\"\n\
             secret = \"{webhook_secret}\"\nevents = [\"*\"]\n"
        ),
    )
    .unwrap();
    let data = dir.path().join("data");
    let output = startup_output(
        &[
            "--config",
            file.to_str().unwrap(),
            "--data-dir",
            data.to_str().unwrap(),
            "--fsync",
            "interval",
        ],
        &[("PLAZA_API_KEY", key), ("PLAZA_JWT_SECRET", jwt)],
    );
    let line = settings_line(&output);
    for says in [
        "api_key=set".to_owned(),
        "identities=jwt_secret".to_owned(),
        "webhooks=1: http://***@127.0.0.1:9/hook".to_owned(),
        format!("storage=data_dir {}, fsync interval", data.display()),
    ] {
        assert!(line.contains(&says), "{says:?} not in {line}");
    }
    for secret in [key, jwt, webhook_secret, "hook-pw", "hook-token"] {
        assert!(!output.contains(secret), "{secret:?} shown: {output}");
    }

    // Cluster mode: the Redis URL without its password, and broker_ack.
    let redis = plaza_launch::RedisProcess::start(&dir.path().join("redis")).unwrap();
    // Redis's `default` user has no password: any given is taken.
    let url = format!("redis://default:redis-pw@127.0.0.1:{}/", redis.port());
    let output = startup_output(&["--redis", &url], &[]);
    let line = settings_line(&output);
    let says = format!(
        "storage=redis redis://***@127.0.0.1:{}/, broker_ack primary",
        redis.port()
    );
    assert!(line.contains(&says), "{says:?} not in {line}");
    assert!(!output.contains("redis-pw"), "{output}");
}
