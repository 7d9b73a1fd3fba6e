//! Node configuration: every option has a default, a TOML key and an
//! environment variable (`PLAZA_<KEY>` upper-cased).

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// All settings of a Plaza node. Durations are milliseconds.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ServerConfig {
    /// Address to listen on.
    pub listen: String,
    /// Largest client frame accepted, in bytes; larger ones get `frame_too_large`.
    pub max_frame_bytes: usize,
    /// Rooms one connection may be joined to at once.
    pub max_rooms_per_connection: usize,
    /// Sustained client frames per second per connection.
    pub rate_limit_per_sec: u32,
    /// Burst of client frames allowed above the sustained rate.
    pub rate_limit_burst: u32,
    /// Frames queued for one connection before it is closed as a slow consumer.
    pub send_queue_frames: usize,
    /// A busy connection writes at most once per this window (0: write at
    /// once): queued frames go out together, in one write.
    pub write_coalesce_ms: u64,
    /// Offer permessage-deflate (RFC 7692) to WebSocket clients that ask
    /// for it (browsers do): server messages of `compression_min_bytes` or
    /// more go out compressed, each on its own.
    pub websocket_compression: bool,
    /// The smallest server message worth compressing, in bytes.
    pub compression_min_bytes: usize,
    /// Interval of server WebSocket pings.
    pub heartbeat_interval_ms: u64,
    /// A connection silent this long is dropped (close code 4001).
    pub idle_timeout_ms: u64,
    /// Life of a ticket.
    pub ticket_ttl_ms: u64,
    /// How long a dropped session can be resumed.
    pub resume_window_ms: u64,
    /// Default history size of new rooms.
    pub history_size: usize,
    /// Default member limit of new rooms.
    pub max_members: usize,
    /// Largest history size a room may ask for.
    pub max_history_size: usize,
    /// Rooms this node holds at most.
    pub max_rooms: usize,
    /// TCP connections this node holds at once (WebSockets, HTTP transport
    /// requests and API calls alike); beyond it a new connection is answered
    /// `503 server_full` and closed. 0: what the process's open-files limit
    /// allows, less [`crate::listener::RESERVED_FILES`].
    pub max_connections: usize,
    /// TCP connections one client address may hold at once; beyond it a new
    /// one is answered `429 too_many_connections`. 0 (the default): no
    /// limit. Behind a balancer every client has the balancer's address:
    /// limit there instead.
    pub max_connections_per_ip: usize,
    /// Joins one client address may make per second (a burst of as many at
    /// once); beyond it a join is refused with `rate_limited`. 0 (the
    /// default): no limit. Behind a balancer every client has the
    /// balancer's address: limit there instead.
    pub max_joins_per_ip_per_sec: u32,
    /// Default lock lease.
    pub lock_ttl_ms: u64,
    /// Longest lock lease.
    pub max_lock_ttl_ms: u64,
    /// On SIGTERM, how long to wait for connections to close.
    pub shutdown_grace_ms: u64,
    /// Create a room on the first `join` to an unknown id (open rooms only).
    pub auto_create_rooms: bool,
    /// This node's id, unique in a cluster; a random one when empty. Every
    /// HTTP response carries it in `x-plaza-node`.
    pub node_id: String,
    /// Cluster mode: how long a node keeps hosting a room after its last
    /// member here left (members often come back soon).
    pub room_linger_ms: u64,
    /// Cluster mode: the Redis URL (e.g. `redis://127.0.0.1:6379/`) that the
    /// nodes share, the Sentinels that watch it
    /// (`redis+sentinel://host1:26379,host2:26379/mymaster`), or seed servers
    /// of a Redis Cluster (`redis+cluster://host1:7000,host2:7000`); empty
    /// for embedded mode.
    pub redis: String,
    /// Cluster mode: when an append to Redis counts as done, `primary`
    /// (the primary has it) or `replicas:N` (`WAIT` confirmed N replicas
    /// have it, N from 1 to [`plaza_broker::MAX_ACK_REPLICAS`]; members only
    /// see confirmed entries). The same on every node.
    pub broker_ack: plaza_broker::BrokerAck,
    /// Web pages (origins, `https://app.example.org`) that may open a
    /// WebSocket or a transport session; empty (the default) or `*`: any.
    /// Requests without `Origin` (not from a browser) are not concerned.
    pub allowed_origins: Vec<String>,
    /// A web app directory (e.g. a Vite build's `dist/`) to serve at `/`:
    /// `GET /` answers its `index.html`, and any path no API route matches
    /// is looked up as a file under it. `None` serves the built-in demo page
    /// at `/`. See [`check_web_dir`] for what it must contain.
    pub web_dir: Option<PathBuf>,
    /// Embedded mode: a directory where rooms, their logs and snapshots are
    /// kept, so that a restarted node has them back (docs/protocol.md,
    /// "Data directory"). `None`: rooms live in memory only.
    pub data_dir: Option<PathBuf>,
    /// With `data_dir`: when a write is on disk before its acknowledgement.
    pub fsync: plaza_broker::Fsync,
    /// The secret that management calls (creating and deleting rooms,
    /// minting tickets) must present as `Authorization: Bearer <key>`, at
    /// least [`MIN_API_KEY_LEN`] bytes. Empty: those calls are open, for
    /// development on a trusted machine.
    pub api_key: String,
    /// Identities: the HMAC secret (HS256/384/512) the application's
    /// backend signs tokens with, at least [`crate::auth::MIN_SECRET_LEN`]
    /// bytes. With any `jwt_*` key set, a join needs a token (or a ticket).
    pub jwt_secret: String,
    /// Identities: a PEM public key (RSA, EC P-256/P-384 or Ed25519) that
    /// verifies tokens (RS256/PS256..., ES256/ES384, EdDSA).
    pub jwt_public_key_file: Option<PathBuf>,
    /// Identities: a JWKS file (RFC 7517) of public keys, picked by a
    /// token's `kid`; reloaded when the file changes.
    pub jwt_jwks_file: Option<PathBuf>,
    /// When set, tokens must carry this `aud`.
    pub jwt_audience: String,
    /// When set, tokens must carry this `iss`.
    pub jwt_issuer: String,
    /// Serve `POST /v1/demo/token`, which signs a token with `jwt_secret`
    /// for anyone who asks (every member right, not `admin`, in every room):
    /// the demo page's stand-in for an application's backend. Never on a
    /// public server.
    pub demo_tokens: bool,
    /// Webhook targets (`[[webhooks]]` tables; not settable from the
    /// environment): see [`crate::webhooks`] and docs/protocol.md, "Webhooks".
    pub webhooks: Vec<crate::webhooks::WebhookTarget>,
}

impl ServerConfig {
    /// How a room's feed serves the members that follow it: as far behind
    /// as a connection's queue holds, and held wake-ups as long as a busy
    /// connection holds its writes.
    pub(crate) fn feed(&self) -> crate::outbox::FeedConfig {
        crate::outbox::FeedConfig {
            capacity: self.send_queue_frames,
            hold: std::time::Duration::from_millis(self.write_coalesce_ms),
        }
    }
}

/// The shortest `api_key` accepted: a guessable key is no protection.
pub const MIN_API_KEY_LEN: usize = 16;

/// The largest member limit a room may have (`max_members`, `options.max_members`).
pub const MAX_MEMBERS_LIMIT: usize = 1_000_000;

/// A day, the longest duration a setting may name.
const DAY_MS: u64 = 86_400_000;

/// The number settings' fixed bounds, both ends included: docs/protocol.md's
/// `bounds` column. `history_size` and `lock_ttl_ms` are bounded above by
/// `max_history_size` and `max_lock_ttl_ms` instead.
const NUMBER_BOUNDS: [(&str, u64, u64); 20] = [
    ("max_frame_bytes", 64, 16 << 20),
    ("max_rooms_per_connection", 1, 1024),
    ("rate_limit_per_sec", 1, 1_000_000),
    ("rate_limit_burst", 1, 1_000_000),
    ("send_queue_frames", 1, 1 << 20),
    ("write_coalesce_ms", 0, 1000),
    ("compression_min_bytes", 0, 16 << 20),
    ("heartbeat_interval_ms", 10, 3_600_000),
    ("idle_timeout_ms", 100, DAY_MS),
    ("ticket_ttl_ms", 1, DAY_MS),
    ("resume_window_ms", 0, DAY_MS),
    ("max_history_size", 1, 10_000_000),
    ("max_members", 1, MAX_MEMBERS_LIMIT as u64),
    ("max_rooms", 1, 10_000_000),
    ("max_connections", 0, 10_000_000),
    ("max_connections_per_ip", 0, 10_000_000),
    ("max_joins_per_ip_per_sec", 0, 1_000_000),
    ("max_lock_ttl_ms", 1, DAY_MS),
    ("shutdown_grace_ms", 0, 3_600_000),
    ("room_linger_ms", 0, DAY_MS),
];

/// The fixed bounds of number setting `name`, if it has some.
pub fn number_bounds(name: &str) -> Option<(u64, u64)> {
    NUMBER_BOUNDS
        .iter()
        .find(|(n, _, _)| *n == name)
        .map(|&(_, lo, hi)| (lo, hi))
}

/// What number setting `name` may be, in words (`from 1 to 1000000`), for a
/// value that is no number of its type.
pub fn number_range_text(name: &str) -> Option<String> {
    match name {
        "history_size" => Some("from 1 to max_history_size".into()),
        "lock_ttl_ms" => Some("from 1 to max_lock_ttl_ms".into()),
        _ => number_bounds(name).map(|(lo, hi)| format!("from {lo} to {hi}")),
    }
}

/// `name` is `value`, which must be from `lo` to `hi` (both included).
pub(crate) fn within(name: &str, value: u64, lo: u64, hi: u64) -> Result<(), String> {
    if (lo..=hi).contains(&value) {
        Ok(())
    } else {
        Err(format!("{name} must be from {lo} to {hi}, not {value}"))
    }
}

impl ServerConfig {
    /// Checks every number against its bounds (docs/protocol.md, "Limits and
    /// configuration") and against the settings it depends on. The message
    /// names the setting, its limits and its value.
    pub fn check_bounds(&self) -> Result<(), String> {
        let n = |v: usize| v as u64;
        let fixed = [
            ("max_frame_bytes", n(self.max_frame_bytes)),
            ("max_rooms_per_connection", n(self.max_rooms_per_connection)),
            ("rate_limit_per_sec", self.rate_limit_per_sec.into()),
            ("rate_limit_burst", self.rate_limit_burst.into()),
            ("send_queue_frames", n(self.send_queue_frames)),
            ("write_coalesce_ms", self.write_coalesce_ms),
            ("compression_min_bytes", n(self.compression_min_bytes)),
            ("heartbeat_interval_ms", self.heartbeat_interval_ms),
            ("idle_timeout_ms", self.idle_timeout_ms),
            ("ticket_ttl_ms", self.ticket_ttl_ms),
            ("resume_window_ms", self.resume_window_ms),
            ("max_history_size", n(self.max_history_size)),
            ("max_members", n(self.max_members)),
            ("max_rooms", n(self.max_rooms)),
            ("max_connections", n(self.max_connections)),
            ("max_connections_per_ip", n(self.max_connections_per_ip)),
            (
                "max_joins_per_ip_per_sec",
                self.max_joins_per_ip_per_sec.into(),
            ),
            ("max_lock_ttl_ms", self.max_lock_ttl_ms),
            ("shutdown_grace_ms", self.shutdown_grace_ms),
            ("room_linger_ms", self.room_linger_ms),
        ];
        for (name, value) in fixed {
            let (lo, hi) = number_bounds(name).expect("every fixed bound is in NUMBER_BOUNDS");
            within(name, value, lo, hi)?;
        }
        if self.heartbeat_interval_ms >= self.idle_timeout_ms {
            return Err(format!(
                "heartbeat_interval_ms ({}) must be less than idle_timeout_ms ({}): \
                 a client answering every ping would be closed as idle",
                self.heartbeat_interval_ms, self.idle_timeout_ms
            ));
        }
        within(
            "history_size",
            n(self.history_size),
            1,
            n(self.max_history_size),
        )
        .map_err(|e| format!("{e} (max_history_size)"))?;
        within("lock_ttl_ms", self.lock_ttl_ms, 1, self.max_lock_ttl_ms)
            .map_err(|e| format!("{e} (max_lock_ttl_ms)"))?;
        crate::webhooks::check_targets(&self.webhooks)?;
        Ok(())
    }
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            listen: "127.0.0.1:7700".into(),
            max_frame_bytes: 64 * 1024,
            max_rooms_per_connection: 16,
            rate_limit_per_sec: 200,
            rate_limit_burst: 400,
            send_queue_frames: 4096,
            // Counted from the event. The reference relay's 2 ms counts from
            // when its writer task runs, and from its last write while frames
            // keep coming: its frames wait longer than Plaza's at 2 ms (3.0
            // against 2.5 ms mean at 500 members, docs/benchmarks-history.md). At 3 ms
            // Plaza writes less often than the relay, and its mean latency is
            // at or below the relay's from 500 to 1,500 members.
            write_coalesce_ms: 3,
            websocket_compression: true,
            compression_min_bytes: 256,
            heartbeat_interval_ms: 25_000,
            idle_timeout_ms: 30_000,
            ticket_ttl_ms: 30_000,
            resume_window_ms: 120_000,
            history_size: 1000,
            max_members: 10_000,
            max_history_size: 100_000,
            max_rooms: 100_000,
            max_connections: 0,
            max_connections_per_ip: 0,
            max_joins_per_ip_per_sec: 0,
            lock_ttl_ms: 30_000,
            max_lock_ttl_ms: 600_000,
            shutdown_grace_ms: 5_000,
            auto_create_rooms: false,
            node_id: String::new(),
            room_linger_ms: 30_000,
            redis: String::new(),
            broker_ack: plaza_broker::BrokerAck::Primary,
            web_dir: None,
            data_dir: None,
            fsync: plaza_broker::Fsync::Always,
            allowed_origins: Vec::new(),
            api_key: String::new(),
            jwt_secret: String::new(),
            jwt_public_key_file: None,
            jwt_jwks_file: None,
            jwt_audience: String::new(),
            jwt_issuer: String::new(),
            demo_tokens: false,
            webhooks: Vec::new(),
        }
    }
}

/// Checks that `dir` can be served as `web_dir`: a directory holding an
/// `index.html` file. Returns its canonical (absolute) path, or a one-line
/// message naming `dir` when it cannot be served.
pub fn check_web_dir(dir: &Path) -> Result<PathBuf, String> {
    let canonical =
        std::fs::canonicalize(dir).map_err(|e| format!("web_dir {}: {e}", dir.display()))?;
    if !canonical.is_dir() {
        return Err(format!("web_dir {}: not a directory", dir.display()));
    }
    if !canonical.join("index.html").is_file() {
        return Err(format!("web_dir {}: no index.html in it", dir.display()));
    }
    Ok(canonical)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `edit` applied to the defaults: its check's message, or `None`.
    fn refusal(edit: impl FnOnce(&mut ServerConfig)) -> Option<String> {
        let mut c = ServerConfig::default();
        edit(&mut c);
        c.check_bounds().err()
    }

    #[test]
    fn the_defaults_are_within_bounds() {
        assert_eq!(ServerConfig::default().check_bounds(), Ok(()));
    }

    #[test]
    fn each_bound_refuses_one_past_its_edge_and_takes_the_edge() {
        type Edit = fn(&mut ServerConfig, u64);
        // (setting, low edge, high edge, how to set it)
        let cases: [(&str, u64, u64, Edit); 17] = [
            ("max_frame_bytes", 64, 16 << 20, |c, v| {
                c.max_frame_bytes = v as usize
            }),
            ("max_rooms_per_connection", 1, 1024, |c, v| {
                c.max_rooms_per_connection = v as usize
            }),
            ("rate_limit_per_sec", 1, 1_000_000, |c, v| {
                c.rate_limit_per_sec = v as u32
            }),
            ("rate_limit_burst", 1, 1_000_000, |c, v| {
                c.rate_limit_burst = v as u32
            }),
            ("send_queue_frames", 1, 1 << 20, |c, v| {
                c.send_queue_frames = v as usize
            }),
            ("write_coalesce_ms", 0, 1000, |c, v| c.write_coalesce_ms = v),
            ("compression_min_bytes", 0, 16 << 20, |c, v| {
                c.compression_min_bytes = v as usize
            }),
            ("ticket_ttl_ms", 1, DAY_MS, |c, v| c.ticket_ttl_ms = v),
            ("resume_window_ms", 0, DAY_MS, |c, v| c.resume_window_ms = v),
            ("max_history_size", 1, 10_000_000, |c, v| {
                c.max_history_size = v as usize;
                c.history_size = 1;
            }),
            ("max_members", 1, 1_000_000, |c, v| {
                c.max_members = v as usize
            }),
            ("max_rooms", 1, 10_000_000, |c, v| c.max_rooms = v as usize),
            ("max_connections", 0, 10_000_000, |c, v| {
                c.max_connections = v as usize
            }),
            ("max_connections_per_ip", 0, 10_000_000, |c, v| {
                c.max_connections_per_ip = v as usize
            }),
            ("max_joins_per_ip_per_sec", 0, 1_000_000, |c, v| {
                c.max_joins_per_ip_per_sec = v as u32
            }),
            ("shutdown_grace_ms", 0, 3_600_000, |c, v| {
                c.shutdown_grace_ms = v
            }),
            ("room_linger_ms", 0, DAY_MS, |c, v| c.room_linger_ms = v),
        ];
        for (name, lo, hi, set) in cases {
            assert_eq!(refusal(|c| set(c, lo)), None, "{name} = {lo}");
            assert_eq!(refusal(|c| set(c, hi)), None, "{name} = {hi}");
            let above = refusal(|c| set(c, hi + 1)).expect(name);
            assert!(above.starts_with(name), "{above}");
            assert!(above.contains(&format!("{hi}, not {}", hi + 1)), "{above}");
            if lo > 0 {
                let below = refusal(|c| set(c, lo - 1)).expect(name);
                assert!(below.contains(&format!("from {lo} to")), "{below}");
            }
        }
    }

    #[test]
    fn related_settings_are_consistent() {
        // The default history size (1000) must fit the largest one.
        let e = refusal(|c| c.max_history_size = 999).unwrap();
        assert_eq!(
            e,
            "history_size must be from 1 to 999, not 1000 (max_history_size)"
        );
        assert_eq!(refusal(|c| c.history_size = 100_000), None);
        assert!(refusal(|c| c.history_size = 0).is_some());
        // The default lease must fit the longest.
        assert_eq!(refusal(|c| c.lock_ttl_ms = 600_000), None);
        let e = refusal(|c| c.lock_ttl_ms = 600_001).unwrap();
        assert!(e.starts_with("lock_ttl_ms must be from 1 to 600000"), "{e}");
        assert!(refusal(|c| c.lock_ttl_ms = 0).is_some());
        assert!(refusal(|c| c.max_lock_ttl_ms = DAY_MS + 1).is_some());
        assert_eq!(
            refusal(|c| {
                c.max_lock_ttl_ms = DAY_MS;
                c.lock_ttl_ms = DAY_MS;
            }),
            None
        );
        // Pings more often than the idle timeout.
        assert_eq!(refusal(|c| c.heartbeat_interval_ms = 29_999), None);
        let e = refusal(|c| c.heartbeat_interval_ms = 30_000).unwrap();
        assert!(e.starts_with(
            "heartbeat_interval_ms (30000) must be less than idle_timeout_ms (30000)"
        ));
        assert!(refusal(|c| c.heartbeat_interval_ms = 9).is_some());
        assert!(refusal(|c| c.idle_timeout_ms = 99).is_some());
        assert_eq!(
            refusal(|c| {
                c.heartbeat_interval_ms = 10;
                c.idle_timeout_ms = 100;
            }),
            None
        );
        assert_eq!(
            refusal(|c| {
                c.heartbeat_interval_ms = 3_600_000;
                c.idle_timeout_ms = DAY_MS;
            }),
            None
        );
        assert!(refusal(|c| c.idle_timeout_ms = DAY_MS + 1).is_some());
    }

    /// The webhook targets are checked with the rest (their own checks are
    /// tested in `webhooks::target`), named by their index.
    #[test]
    fn webhook_targets_are_checked() {
        let target = |events: &[&str]| crate::webhooks::WebhookTarget {
            url: "http://127.0.0.1:9000/plaza".into(),
            secret: "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw".into(),
            events: events.iter().map(|&e| e.to_owned()).collect(),
            ..Default::default()
        };
        assert_eq!(refusal(|c| c.webhooks = vec![target(&["*"])]), None);
        let e = refusal(|c| c.webhooks = vec![target(&["*"]), target(&["room.renamed"])]).unwrap();
        assert!(
            e.starts_with("webhooks[1].events (webhook-1): unknown event type \"room.renamed\""),
            "{e}"
        );
        let e = refusal(|c| {
            let mut t = target(&["*"]);
            t.timeout_ms = 60_001;
            c.webhooks = vec![t];
        })
        .unwrap();
        assert_eq!(
            e,
            "webhooks[0].timeout_ms must be from 100 to 60000, not 60001"
        );
    }

    /// `[[webhooks]]` tables read from TOML, as `plaza serve` reads them.
    #[test]
    fn webhook_tables_read_from_toml() {
        use figment::providers::{Format, Serialized, Toml};
        let toml = r#"
            [[webhooks]]
            name = "backend"
            url = "http://127.0.0.1:9000/plaza"
            secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
            events = ["member.joined", "message.published"]
            channels = ["chat"]
            timeout_ms = 2000

            [[webhooks]]
            url = "http://127.0.0.1:9001/"
            secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
            events = ["*"]
        "#;
        let c: ServerConfig = figment::Figment::from(Serialized::defaults(ServerConfig::default()))
            .merge(Toml::string(toml))
            .extract()
            .unwrap();
        assert_eq!(c.webhooks.len(), 2);
        assert_eq!(c.webhooks[0].name, "backend");
        assert_eq!(c.webhooks[0].timeout_ms, 2000);
        assert_eq!(c.webhooks[1].name, "");
        assert_eq!(c.webhooks[1].queue_max, 100_000);
        assert_eq!(c.check_bounds(), Ok(()));
    }
}
