//! `plaza`: the Plaza real-time room server.

/// jemalloc rather than glibc malloc: after a burst (say, a thousand members
/// joining one room, each join a presence event to every other member) glibc
/// kept the freed memory, and an idle connection cost 8.5 KiB of RSS for
/// 1 KiB of live heap; jemalloc returns idle pages to the OS.
#[global_allocator]
static GLOBAL: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// jemalloc's live and resident bytes, for `/metrics` (RSS alone cannot tell live data from
/// pages the allocator keeps).
fn jemalloc_figures() -> Option<plaza_server::allocator::AllocatorFigures> {
    use tikv_jemalloc_ctl::{epoch, stats};
    // The statistics are a snapshot taken at the last epoch: take a new one.
    epoch::advance().ok()?;
    Some(plaza_server::allocator::AllocatorFigures {
        allocated: stats::allocated::read().ok()? as u64,
        resident: stats::resident::read().ok()? as u64,
    })
}

mod cluster;

use std::path::PathBuf;
use std::sync::Arc;

use clap::{Args, Parser, Subcommand};
use figment::providers::{Env, Format, Serialized, Toml};
use figment::{Figment, Provider};
use plaza_broker::{Cluster, MemoryTicketStore, RedisBroker};
use plaza_server::{Node, ServerConfig};
use serde::Serialize;

/// Plaza: a real-time room server for multi-user apps.
#[derive(Parser)]
#[command(version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run a Plaza node: embedded mode (everything in this process), or with
    /// --redis a node of a cluster sharing that Redis.
    ///
    /// Settings come, in rising priority, from built-in defaults, the TOML file
    /// given by --config (keys as below, in snake_case), PLAZA_* environment
    /// variables (e.g. PLAZA_MAX_FRAME_BYTES) and these flags.
    ///
    /// Webhook targets are [[webhooks]] tables of the --config file only (no variable, no
    /// flag): see docs/protocol.md, "Webhooks".
    ///
    /// An invalid setting (out of bounds, malformed, or at odds with another) stops it before
    /// it listens with exit status 2, naming the setting as given, its value and what it may
    /// be; a node that then fails to start exits with status 1.
    Serve(Box<ServeArgs>),
    /// Load tests: run a scenario file against Plaza or a peer.
    #[cfg(feature = "bench")]
    Bench(plaza_bench::cli::BenchArgs),
    /// A local cluster for development: `plaza cluster up --nodes N` runs Redis, N nodes
    /// and nginx or HAProxy on loopback until Ctrl-C.
    Cluster(cluster::ClusterArgs),
}

/// Every flag maps to a key of the TOML file and a `PLAZA_` variable.
#[derive(Args, Serialize)]
struct ServeArgs {
    /// TOML configuration file.
    #[arg(long, env = "PLAZA_CONFIG")]
    #[serde(skip)]
    config: Option<PathBuf>,
    /// Address to listen on [default: 127.0.0.1:7700].
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    listen: Option<String>,
    /// Largest client frame in bytes [default: 65536].
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    max_frame_bytes: Option<usize>,
    /// Rooms one connection may join at once [default: 16].
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    max_rooms_per_connection: Option<usize>,
    /// Sustained client frames per second per connection [default: 200].
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    rate_limit_per_sec: Option<u32>,
    /// Burst of client frames above the sustained rate [default: 400].
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    rate_limit_burst: Option<u32>,
    /// Frames queued per connection before it is closed as a slow consumer [default: 4096].
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    send_queue_frames: Option<usize>,
    /// A busy connection writes at most once per this many ms; 0 writes at once [default: 3].
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    write_coalesce_ms: Option<u64>,
    /// Accept permessage-deflate when a WebSocket client offers it [default: true].
    #[arg(long, num_args = 0..=1, default_missing_value = "true")]
    #[serde(skip_serializing_if = "Option::is_none")]
    websocket_compression: Option<bool>,
    /// The smallest server message sent compressed, in bytes [default: 256].
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    compression_min_bytes: Option<usize>,
    /// Interval of server pings in ms [default: 25000].
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    heartbeat_interval_ms: Option<u64>,
    /// Drop a client silent this long, in ms [default: 30000].
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    idle_timeout_ms: Option<u64>,
    /// Ticket lifetime in ms [default: 30000].
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    ticket_ttl_ms: Option<u64>,
    /// How long a dropped session can be resumed, in ms [default: 120000].
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    resume_window_ms: Option<u64>,
    /// Default history size of new rooms [default: 1000].
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    history_size: Option<usize>,
    /// Default member limit of new rooms [default: 10000].
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    max_members: Option<usize>,
    /// Largest history size a room may ask for [default: 100000].
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    max_history_size: Option<usize>,
    /// Rooms this node holds at most [default: 100000].
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    max_rooms: Option<usize>,
    /// TCP connections held at once; beyond it new ones get 503 server_full
    /// [default: 0, the open-files limit less 320].
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    max_connections: Option<usize>,
    /// TCP connections one client address may hold; beyond it new ones get
    /// 429 too_many_connections (behind a balancer, limit there instead)
    /// [default: 0, no limit].
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    max_connections_per_ip: Option<usize>,
    /// Joins one client address may make per second; beyond it a join gets
    /// rate_limited (behind a balancer, limit there instead) [default: 0, no limit].
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    max_joins_per_ip_per_sec: Option<u32>,
    /// Default lock lease in ms [default: 30000].
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    lock_ttl_ms: Option<u64>,
    /// Longest lock lease in ms [default: 600000].
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    max_lock_ttl_ms: Option<u64>,
    /// On SIGTERM, how long to wait for connections to close, in ms [default: 5000].
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    shutdown_grace_ms: Option<u64>,
    /// Create an open room on the first join to an unknown id [default: false].
    #[arg(long, num_args = 0..=1, default_missing_value = "true")]
    #[serde(skip_serializing_if = "Option::is_none")]
    auto_create_rooms: Option<bool>,
    /// This node's id in a cluster [default: random].
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    node_id: Option<String>,
    /// Cluster mode: how long a node keeps hosting a room after its last member
    /// there left, in ms [default: 30000].
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    room_linger_ms: Option<u64>,
    /// Cluster mode: the Redis URL the nodes share, e.g. redis://127.0.0.1:6379/; the
    /// Sentinels that watch its primary, e.g.
    /// redis+sentinel://10.0.0.1:26379,10.0.0.2:26379/mymaster; or some servers of a Redis
    /// Cluster, e.g. redis+cluster://10.0.0.1:7000,10.0.0.2:7000 [default: none, embedded
    /// mode].
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    redis: Option<String>,
    /// Cluster mode: when an append to Redis counts as done: primary (the primary has it;
    /// a failover may lose the last ones) or replicas:N (WAIT confirmed N replicas have it,
    /// N from 1 to 16; members see only confirmed entries, and an append not confirmed
    /// within 1 s fails with broker_unavailable) [default: primary].
    #[arg(long, value_name = "MODE")]
    #[serde(skip_serializing_if = "Option::is_none")]
    broker_ack: Option<String>,
    /// A web app directory (e.g. a Vite build's dist/) to serve: GET / answers its
    /// index.html, any path that is no API route a file in it; it must hold an
    /// index.html [default: none, the built-in demo page at /].
    #[arg(long, value_name = "DIR")]
    #[serde(skip_serializing_if = "Option::is_none")]
    web_dir: Option<PathBuf>,
    /// Embedded mode: keep rooms, their logs and snapshots in this directory, so that a
    /// restarted node has them back [default: none, in memory only].
    #[arg(long, value_name = "DIR")]
    #[serde(skip_serializing_if = "Option::is_none")]
    data_dir: Option<PathBuf>,
    /// With --data-dir: always (an acknowledged command is synced to disk), interval
    /// (written before the acknowledgement, synced every second) or off [default: always].
    #[arg(long, value_name = "MODE")]
    #[serde(skip_serializing_if = "Option::is_none")]
    fsync: Option<String>,
    /// Web pages that may connect, comma-separated origins (e.g.
    /// https://app.example.org); others get 403 origin_not_allowed. Clients
    /// that send no Origin are not concerned [default: any].
    // The text is the CLI's help, where a bare URL reads best.
    #[allow(rustdoc::bare_urls)]
    #[arg(long, value_name = "ORIGINS", value_delimiter = ',')]
    #[serde(skip_serializing_if = "Option::is_none")]
    allowed_origins: Option<Vec<String>>,
    /// The secret (at least 16 bytes) the server API needs as `Authorization: Bearer
    /// <key>`: creating rooms, minting tickets, /v1/broadcast and /v1/users/... take only the
    /// key; DELETE /v1/rooms/{id} and every call under /v1/rooms/{id}/ (publish, direct,
    /// entities, state, history, members, kick) the key or a room's admin token. Open either
    /// way: GET /v1/rooms and /v1/rooms/{id}, /v1/status, /healthz, /readyz, /metrics, the web
    /// pages, the trajectory filters, and /v1/ws and /v1/sessions (clients use tokens or
    /// tickets). Better given as PLAZA_API_KEY than on the command line [default: none, all
    /// those calls are open].
    #[arg(long, value_name = "KEY")]
    #[serde(skip_serializing_if = "Option::is_none")]
    api_key: Option<String>,
    /// Identities: the HMAC secret (at least 32 bytes) tokens are signed with; better
    /// given as PLAZA_JWT_SECRET. With any jwt_* key, a join needs a token or a ticket
    /// [default: none, development mode: joins are trusted as they come].
    #[arg(long, value_name = "SECRET")]
    #[serde(skip_serializing_if = "Option::is_none")]
    jwt_secret: Option<String>,
    /// Identities: a PEM public key (RSA, EC P-256/P-384, Ed25519) that verifies tokens.
    #[arg(long, value_name = "FILE")]
    #[serde(skip_serializing_if = "Option::is_none")]
    jwt_public_key_file: Option<PathBuf>,
    /// Identities: a JWKS file of public keys (picked by kid), reloaded when it changes.
    #[arg(long, value_name = "FILE")]
    #[serde(skip_serializing_if = "Option::is_none")]
    jwt_jwks_file: Option<PathBuf>,
    /// Tokens must carry this aud [default: not checked].
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    jwt_audience: Option<String>,
    /// Tokens must carry this iss [default: not checked].
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    jwt_issuer: Option<String>,
    /// Serve POST /v1/demo/token: anyone gets a token (member rights in every room),
    /// signed with jwt_secret (the demo's stand-in for an app backend; never on a
    /// public server) [default: false].
    #[arg(long, num_args = 0..=1, default_missing_value = "true")]
    #[serde(skip_serializing_if = "Option::is_none")]
    demo_tokens: Option<bool>,
}

/// `PLAZA_*` environment variables that are not settings: PLAZA_CONFIG names the file and
/// PLAZA_LOG the log filter.
const ENV_NOT_SETTINGS: [&str; 2] = ["config", "log"];

/// The settings' sources, in rising priority: defaults, the `--config`
/// file, `PLAZA_*` variables, flags.
fn figment_of(args: &ServeArgs) -> Figment {
    let mut fig = Figment::from(Serialized::defaults(ServerConfig::default()));
    if let Some(path) = &args.config {
        fig = fig.merge(Toml::file_exact(path));
    }
    // Only the settings' names: a deployment's own PLAZA_* variables (PLAZA_BIN in a script,
    // say) are not Plaza's to refuse; `unknown_plaza_env` names them for a warning.
    let settings = setting_names();
    fig.merge(Env::prefixed("PLAZA_").filter(move |key| {
        settings
            .iter()
            .any(|s| key.as_str().eq_ignore_ascii_case(s))
    }))
    .merge(Serialized::defaults(args))
}

fn load_config(args: &ServeArgs) -> Result<ServerConfig, Box<figment::Error>> {
    figment_of(args).extract().map_err(Box::new)
}

/// Settings given only as tables of the TOML file, never by the environment.
const TABLE_SETTINGS: [&str; 1] = ["webhooks"];

/// The settings' names (`max_members`, ...), as environment keys are read: lowercase.
fn setting_names() -> Vec<String> {
    let defaults = serde_json::to_value(ServerConfig::default()).expect("the config serializes");
    defaults
        .as_object()
        .map(|o| {
            o.keys()
                .filter(|k| !TABLE_SETTINGS.contains(&k.as_str()))
                .map(|k| k.to_ascii_lowercase())
                .collect()
        })
        .unwrap_or_default()
}

/// The `PLAZA_*` variables of `vars` that are neither settings nor PLAZA_CONFIG / PLAZA_LOG.
fn unknown_plaza_env(vars: impl Iterator<Item = (String, String)>) -> Vec<String> {
    let settings = setting_names();
    let mut unknown: Vec<String> = vars
        .filter_map(|(k, _)| {
            let key = k.strip_prefix("PLAZA_")?.to_ascii_lowercase();
            let known = settings.contains(&key) || ENV_NOT_SETTINGS.contains(&key.as_str());
            (!known).then_some(k)
        })
        .collect();
    unknown.sort();
    unknown
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    plaza_server::allocator::set_allocator_probe(jemalloc_figures);
    // Colours only for a person at a terminal: a log file or a collector
    // would keep the escape codes as text.
    let colours = std::io::IsTerminal::is_terminal(&std::io::stdout());
    tracing_subscriber::fmt()
        .with_ansi(colours)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("PLAZA_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .init();
    match cli.command {
        #[cfg(feature = "bench")]
        Command::Bench(args) => plaza_bench::cli::main(args),
        Command::Cluster(args) => cluster::main(args),
        Command::Serve(args) => {
            let names = SettingNames::new(&args);
            let refuse = |message: String| {
                eprintln!("plaza: invalid configuration: {message}");
                std::process::ExitCode::from(CONFIG_ERROR_EXIT)
            };
            let mut config = match load_config(&args) {
                Ok(c) => c,
                Err(e) => {
                    let fig = figment_of(&args);
                    let lines: Vec<String> =
                        e.into_iter().map(|e| names.describe(&e, &fig)).collect();
                    return refuse(lines.join("\nplaza: invalid configuration: "));
                }
            };
            let tokens = match check_settings(&mut config) {
                Ok(tokens) => tokens,
                Err(message) => return refuse(names.reword(&message)),
            };
            let rt = tokio::runtime::Runtime::new().expect("tokio runtime");
            match rt.block_on(serve(config, tokens)) {
                Ok(()) => std::process::ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("plaza: {e}");
                    std::process::ExitCode::FAILURE
                }
            }
        }
    }
}

/// The exit status of `plaza serve` for any invalid setting: clap's, for a
/// malformed flag, so that every refusal of a configuration is the same.
const CONFIG_ERROR_EXIT: u8 = 2;

/// Every check of the settings, alone and together, made before anything
/// starts, so that each refusal exits with [`CONFIG_ERROR_EXIT`]. Trims the
/// secrets, canonicalises `web_dir`; `Ok(true)` when tokens are verified.
fn check_settings(config: &mut ServerConfig) -> Result<bool, String> {
    config.check_bounds()?;
    if config.node_id.is_empty() {
        config.node_id = format!("n-{}", plaza_broker::new_session_id());
    }
    if !valid_node_id(&config.node_id) {
        return Err(format!(
            "node_id {:?}: use 1 to 64 letters, digits, '-', '_' or '.'",
            config.node_id
        ));
    }
    // A key read from a file often ends with a newline that no client sends.
    config.api_key = config.api_key.trim().to_owned();
    if !config.api_key.is_empty() && config.api_key.len() < plaza_server::config::MIN_API_KEY_LEN {
        return Err(format!(
            "api_key is {} bytes: use at least {} (e.g. `openssl rand -hex 24`)",
            config.api_key.len(),
            plaza_server::config::MIN_API_KEY_LEN
        ));
    }
    if let Some(bad) = config
        .allowed_origins
        .iter()
        .find(|o| !plaza_server::origin::valid_entry(o))
    {
        return Err(format!(
            "allowed_origins: {bad:?} is not an origin (scheme://host[:port], no path) nor *"
        ));
    }
    config.jwt_secret = config.jwt_secret.trim().to_owned();
    let tokens = plaza_server::check_token_keys(config)?;
    if config.demo_tokens && config.jwt_secret.is_empty() {
        return Err("demo_tokens signs with jwt_secret: set jwt_secret too".into());
    }
    if let Some(dir) = &config.web_dir {
        config.web_dir = Some(plaza_server::config::check_web_dir(dir)?);
    }
    if config.redis.is_empty() && config.broker_ack != plaza_broker::BrokerAck::Primary {
        return Err(format!(
            "broker_ack {} is for cluster mode (with redis): embedded mode has no replicas",
            config.broker_ack
        ));
    }
    if config.data_dir.is_some() && !config.redis.is_empty() {
        return Err("data_dir is for embedded mode: a cluster keeps its rooms in Redis".into());
    }
    Ok(tokens)
}

/// How the user gave each setting — the flag, the `PLAZA_` variable or the
/// key of the `--config` file, whichever won — so that a refusal names it so.
struct SettingNames {
    /// The settings given as flags.
    flags: Vec<String>,
    /// (setting, the variable's name as set) for the `PLAZA_` variables.
    env: Vec<(String, String)>,
    /// The `--config` file and the settings it holds.
    file: Option<(PathBuf, Vec<String>)>,
    /// Every setting's name but the tables' (whose messages say
    /// `webhooks[1].url`, the file's own words).
    settings: Vec<String>,
}

impl SettingNames {
    fn new(args: &ServeArgs) -> SettingNames {
        let flags = serde_json::to_value(args)
            .ok()
            .and_then(|v| v.as_object().map(|o| o.keys().cloned().collect()))
            .unwrap_or_default();
        let settings = setting_names();
        let env = std::env::vars()
            .filter_map(|(var, _)| {
                let key = var.strip_prefix("PLAZA_")?.to_ascii_lowercase();
                settings.contains(&key).then_some((key, var))
            })
            .collect();
        let file = args.config.as_ref().map(|path| {
            let keys = Figment::from(Toml::file_exact(path))
                .data()
                .ok()
                .and_then(|mut profiles| profiles.remove(&figment::Profile::Default))
                .map(|dict| dict.into_keys().collect())
                .unwrap_or_default();
            (path.clone(), keys)
        });
        SettingNames {
            flags,
            env,
            file,
            settings,
        }
    }

    /// Setting `key` as the user wrote it; a setting left at its default
    /// keeps its key.
    fn name(&self, key: &str) -> String {
        if self.flags.iter().any(|f| f == key) {
            return format!("--{}", key.replace('_', "-"));
        }
        if let Some((_, var)) = self.env.iter().find(|(k, _)| k == key) {
            return var.clone();
        }
        match &self.file {
            Some((path, keys)) if keys.iter().any(|k| k == key) => {
                format!("{key} in {}", path.display())
            }
            _ => key.to_owned(),
        }
    }

    /// `message` with each setting it names (as a whole word) named as the
    /// user wrote it.
    fn reword(&self, message: &str) -> String {
        let mut out = String::with_capacity(message.len());
        let mut word = String::new();
        for c in message.chars().map(Some).chain([None]) {
            if let Some(c) = c.filter(|c| c.is_ascii_alphanumeric() || *c == '_') {
                word.push(c);
                continue;
            }
            if self.settings.contains(&word) {
                out.push_str(&self.name(&word));
            } else {
                out.push_str(&word);
            }
            word.clear();
            out.extend(c);
        }
        out
    }

    /// One error of the configuration reader in the user's words: the
    /// setting, its value and what it may be; never the reader's own terms
    /// (its profiles, types or source locations).
    fn describe(&self, e: &figment::Error, fig: &Figment) -> String {
        use figment::error::Kind;
        let key = e.path.join(".").to_ascii_lowercase();
        let name = self.name(&key);
        let value = fig
            .find_value(&key)
            .ok()
            .and_then(|v| serde_json::to_string(&v).ok())
            .unwrap_or_else(|| "this value".into());
        match &e.kind {
            // A setting's own parser (broker_ack, say) says all of it.
            Kind::Message(m) => self.reword(m),
            Kind::UnknownField(field, _) => {
                let place = match &self.file {
                    Some((path, _)) => format!(" in {}", path.display()),
                    None => String::new(),
                };
                format!("{field}{place} is no setting (see `plaza serve --help`)")
            }
            Kind::UnknownVariant(found, allowed) => {
                format!(
                    "{name} must be one of {}, not {found:?}",
                    allowed.join(", ")
                )
            }
            Kind::InvalidType(_, expected) | Kind::InvalidValue(_, expected) => {
                let allowed = match plaza_server::config::number_range_text(&key) {
                    Some(range) => format!("a whole number {range}"),
                    None if expected == "a boolean" => "true or false".into(),
                    None => expected.clone(),
                };
                format!("{name} must be {allowed}, not {value}")
            }
            other => format!("{name} is {value}: {other}"),
        }
    }
}

async fn serve(config: ServerConfig, tokens: bool) -> std::io::Result<()> {
    // Every connection is a file: take the whole hard limit on open files
    // (many systems start processes with a soft limit of 1,024), as the
    // default `max_connections` is what it allows.
    match rlimit::increase_nofile_limit(u64::MAX) {
        Ok(files) => tracing::debug!(files, "open-files limit"),
        Err(e) => tracing::warn!(error = %e, "could not raise the open-files limit"),
    }
    let listener = tokio::net::TcpListener::bind(&config.listen).await?;
    let addr = listener.local_addr()?;
    let mut data_dir = None;
    let (node, cluster) = if let Some(dir) = config.data_dir.clone() {
        // Each run is a node of its own: the members of an earlier run are
        // on a dead node (disconnected, resumable), not on this one.
        let incarnation = format!("{}.{}", config.node_id, plaza_broker::new_session_id());
        let disk = plaza_broker::DiskBroker::open(&dir, config.fsync, &incarnation)
            .map_err(std::io::Error::other)?;
        tracing::info!(data_dir = %dir.display(), fsync = %fsync_name(config.fsync), "rooms kept in the data directory");
        data_dir = Some(disk.clone());
        let tickets: Arc<dyn plaza_broker::TicketStore> = disk.clone();
        let cluster: Arc<dyn Cluster> = disk;
        let node = Node::clustered(config, tickets, cluster);
        (node, None)
    } else if config.redis.is_empty() {
        (Node::new(config, Arc::new(MemoryTicketStore::new())), None)
    } else {
        let redis_config = plaza_broker::RedisConfig::new(&config.redis, &config.node_id)
            .with_ack(config.broker_ack);
        let redis = RedisBroker::connect_with(redis_config)
            .await
            .map_err(|e| std::io::Error::other(format!("cluster mode: {e}")))?;
        let cluster: Arc<dyn Cluster> = redis.clone();
        let node = Node::clustered(config, redis, cluster.clone());
        (node, Some(cluster))
    };
    match &cluster {
        Some(_) => println!(
            "Plaza node {} is running in cluster mode on http://{addr}/ (WebSocket at ws://{addr}/v1/ws)",
            node.id()
        ),
        None => println!("Plaza is running: open http://{addr}/ (WebSocket at ws://{addr}/v1/ws)"),
    }
    // After the first line, which scripts read for the address.
    log_settings(node.config(), tokens);
    if !node.config().api_key.is_empty() && node.config().auto_create_rooms {
        tracing::warn!(
            "auto_create_rooms lets any client create rooms over /v1/ws, api_key or not"
        );
    }
    if !tokens && !addr.ip().is_loopback() {
        tracing::warn!(
            %addr,
            "development mode: no jwt_* key is set, so any client may join any open room \
             under any name; set jwt_secret, jwt_public_key_file or jwt_jwks_file"
        );
    }
    if node.config().demo_tokens {
        tracing::warn!(
            "demo_tokens: anyone who reaches this server gets a member token for any room"
        );
    }
    if node.config().api_key.is_empty() && !addr.ip().is_loopback() {
        tracing::warn!(
            %addr,
            "anyone who reaches this address can use the server API (create, delete and \
             publish into rooms, read their state, mint tickets): set api_key (PLAZA_API_KEY)"
        );
    }
    for name in unknown_plaza_env(std::env::vars()) {
        tracing::warn!("ignoring {name}: not a Plaza setting (see `plaza serve --help`)");
    }
    let signals = {
        let node = node.clone();
        async move {
            wait_for_signal().await;
            tracing::info!("shutdown requested: telling clients to reconnect");
            node.shutdown();
        }
    };
    tokio::spawn(signals);
    let served = plaza_server::serve(node, listener).await;
    if let Some(cluster) = cluster {
        // The others may take this node's remaining members for gone at once.
        cluster.leave().await;
    }
    if let Some(disk) = data_dir {
        // What the rooms wrote last (their final snapshots) is committed
        // before the process ends.
        disk.close().await;
    }
    served
}

/// One log line of what guards this node and what keeps its rooms, so that
/// an operator sees at startup what is on; never a secret's value.
fn log_settings(config: &ServerConfig, tokens: bool) {
    let api_key = if config.api_key.is_empty() {
        "not set (the server API is open)"
    } else {
        "set"
    };
    let mut keys = Vec::new();
    if !config.jwt_secret.is_empty() {
        keys.push("jwt_secret (HMAC)".to_owned());
    }
    if let Some(file) = &config.jwt_public_key_file {
        keys.push(format!("public key file {}", file.display()));
    }
    if let Some(file) = &config.jwt_jwks_file {
        keys.push(format!("JWKS file {}", file.display()));
    }
    let identities = if tokens {
        keys.join(", ")
    } else {
        "development mode (no jwt_* key: joins are trusted as they come)".to_owned()
    };
    let webhooks = match config.webhooks.len() {
        0 => "none".to_owned(),
        n => {
            let urls: Vec<String> = config
                .webhooks
                .iter()
                .map(|w| without_secrets(&w.url))
                .collect();
            format!("{n}: {}", urls.join(", "))
        }
    };
    let storage = match (&config.data_dir, config.redis.is_empty()) {
        (Some(dir), _) => format!(
            "data_dir {}, fsync {}",
            dir.display(),
            fsync_name(config.fsync)
        ),
        (None, true) => "in memory (rooms are lost when the process ends)".to_owned(),
        (None, false) => format!(
            "redis {}, broker_ack {}",
            without_secrets(&config.redis),
            config.broker_ack
        ),
    };
    tracing::info!(
        %api_key,
        %identities,
        %webhooks,
        %storage,
        "security and durability settings"
    );
}

/// `url` without what may be secret: its user and password (`***@` shows
/// there were some), query and fragment.
fn without_secrets(url: &str) -> String {
    let url = url.split(['?', '#']).next().unwrap_or_default();
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    let (authority, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
    match authority.rfind('@') {
        Some(at) => format!("{scheme}://***@{}{path}", &authority[at + 1..]),
        None => format!("{scheme}://{authority}{path}"),
    }
}

/// `fsync`'s setting value (`always`, `interval`, `off`).
fn fsync_name(fsync: plaza_broker::Fsync) -> String {
    serde_json::to_value(fsync)
        .ok()
        .and_then(|v| v.as_str().map(str::to_owned))
        .unwrap_or_default()
}

/// Node ids go into log records as `node/connection`: no `/`, nothing odd.
fn valid_node_id(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= 64
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'.')
}

async fn wait_for_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate()).expect("SIGTERM handler");
    tokio::select! {
        _ = term.recv() => {}
        _ = tokio::signal::ctrl_c() => {}
    }
}
