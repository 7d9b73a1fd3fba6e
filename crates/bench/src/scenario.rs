//! Scenario files: what a load test does, as YAML.
//!
//! A scenario has `params` (defaults, overridden by `--set name=value`),
//! `phases` (when virtual users arrive and which stretch is measured), weighted
//! `flows` (what each virtual user does) and `expect` (the pass criteria).
//! Any string `"${name}"` is replaced by the parameter's value, keeping its
//! type; `${name}` inside a longer string is interpolated as text.
//!
//! ```
//! let yaml = r#"
//! name: tiny
//! params: { members: 3 }
//! rooms: 1
//! phases:
//!   - { name: join, arrival_rate: 100, users: "${members}" }
//!   - { name: measure, duration_s: 1, record: true }
//! flows:
//!   - name: member
//!     steps:
//!       - connect
//!       - join: { room: "r-{room}" }
//!       - idle
//! "#;
//! let s = plaza_bench::Scenario::parse(yaml, &[("members".into(), "5".into())]).unwrap();
//! assert_eq!(s.phases[0].users, Some(5));
//! ```

use std::collections::BTreeMap;

use serde::Deserialize;
use serde_norway::Value;

/// A parsed scenario with every parameter substituted.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Scenario {
    /// Short name, used in reports.
    pub name: String,
    /// What the workload reproduces.
    #[serde(default)]
    pub description: String,
    /// Parameter values after `--set` overrides (kept for the report).
    #[serde(default, skip_deserializing)]
    pub params: BTreeMap<String, Value>,
    /// Number of rooms; virtual user `i` is in room `i % rooms` (`{room}` in templates).
    #[serde(default = "one")]
    pub rooms: u64,
    /// Options for the rooms the run creates (drivers that create rooms pass
    /// them on; Plaza: e.g. `{presence: false}`).
    #[serde(default)]
    pub room_options: serde_json::Map<String, serde_json::Value>,
    /// Offer permessage-deflate when connecting, as browsers do (WebSocket
    /// drivers; received bytes are then counted compressed, as sent).
    #[serde(default)]
    pub compression: bool,
    /// What users connect over: `websocket` (the default), or Plaza's HTTP
    /// transports `sse`, `long-polling`, `polling` (`polling:<ms>`: asking
    /// every `ms`; plain `polling` asks every second).
    #[serde(default)]
    pub transport: crate::transport::Transport,
    /// Phases, run one after the other.
    pub phases: Vec<Phase>,
    /// What virtual users do; each user gets one flow, chosen by weight.
    pub flows: Vec<Flow>,
    /// Pass criteria, checked on the recorded phases.
    #[serde(default)]
    pub expect: Expectations,
    /// After the last phase: how long deliveries must pause before the run
    /// counts them as complete, and the longest wait for that.
    #[serde(default)]
    pub drain: Drain,
    /// A webhook receiver the run serves itself (the server under test
    /// must be configured to POST to it): it answers 204, counts requests
    /// and times each from the send timestamp its message carries.
    #[serde(default)]
    pub webhook_receiver: Option<WebhookReceiver>,
}

/// The run's own webhook endpoint ([`Scenario::webhook_receiver`]).
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct WebhookReceiver {
    /// Address to listen on, e.g. `127.0.0.1:7790` (the server's
    /// `[[webhooks]]` url names it).
    pub listen: String,
    /// The channels whose `message.published` events the server is
    /// configured to send: each publish on one of them (WebSocket or server
    /// API) is expected to arrive once.
    #[serde(default)]
    pub channels: Vec<String>,
}

fn one() -> u64 {
    1
}

/// One stretch of the run.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Phase {
    /// Name shown in reports.
    pub name: String,
    /// Length in seconds. Without it, a phase with arrivals lasts until its
    /// `users` have arrived.
    pub duration_s: Option<f64>,
    /// New users per second at the start of the phase (0 or absent: none).
    pub arrival_rate: Option<f64>,
    /// New users per second at the end of the phase: the rate ramps linearly.
    pub ramp_to: Option<f64>,
    /// Most users arriving in this phase.
    pub users: Option<u64>,
    /// Most users arriving in this phase, per room (`users` = this × `rooms`).
    #[serde(default)]
    pub users_per_room: Option<u64>,
    /// Whether measurements taken in this phase count.
    #[serde(default)]
    pub record: bool,
    /// End the phase as soon as every user's flow has finished, `duration_s`
    /// being only its upper bound: a run whose users each do a fixed amount
    /// of work then ends with the work, and rates are not diluted by idle
    /// padding. Only the last phase may have it (later phases would start at
    /// unknown times), it needs `duration_s`, and it admits no arrivals (the
    /// users it waits for must all have arrived before it starts). Flows
    /// that never end (`idle`, a loop without `count`) run to the bound. In a
    /// run over several load processes, each process ends it when its own
    /// users are done.
    #[serde(default)]
    pub until_done: bool,
}

/// A weighted sequence of steps.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Flow {
    /// Name shown in reports.
    pub name: String,
    /// Relative share of users running this flow.
    #[serde(default = "one_u32")]
    pub weight: u32,
    /// The steps.
    pub steps: Vec<Step>,
}

fn one_u32() -> u32 {
    1
}

impl Flow {
    /// Whether the flow joins a room somewhere in its steps.
    pub fn joins(&self) -> bool {
        fn any_join(steps: &[Step]) -> bool {
            steps.iter().any(|s| match s {
                Step::Join { .. } => true,
                Step::Loop { steps, .. } | Step::Leader(steps) => any_join(steps),
                Step::Parallel(branches) => branches.iter().any(|b| any_join(b)),
                _ => false,
            })
        }
        any_join(&self.steps)
    }
}

/// One action of a virtual user. Templates in strings: `{vu}` (the user's
/// index), `{room}` (its room index), `{flow}` (its flow's name).
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum Step {
    /// Open the WebSocket.
    Connect,
    /// Join a room.
    Join {
        /// Room id template, e.g. `"bench-{room}"`.
        room: String,
        /// Channels besides the default one.
        #[serde(default)]
        channels: Vec<String>,
        /// Platform (Plaza), default `browser`.
        #[serde(default)]
        platform: Option<String>,
        /// Plaza: a delivery policy to join with (docs/protocol.md); string
        /// values are templates (`{rand:LO:HI}`, `{around:N}`, `{vu%N}`).
        /// `enabled: false` in it leaves the policy out, so that one
        /// parameter switches it off.
        #[serde(default)]
        policy: Option<serde_json::Value>,
        /// Plaza: the join's `history` (e.g. `{last: 100}`).
        #[serde(default)]
        history: Option<serde_json::Value>,
    },
    /// Send a sync message that every other member receives.
    Publish {
        /// Channel (default: the room's main channel).
        #[serde(default)]
        channel: Option<String>,
        /// Event name (default `"b"`).
        #[serde(default)]
        event: Option<String>,
        /// Payload size in bytes, about (timestamp and padding included).
        #[serde(default = "hundred")]
        bytes: usize,
        /// A chat text to carry instead of padding (`bytes` is then
        /// ignored): `{"bt":…,"vu":…,"text":"…"}`.
        #[serde(default)]
        text: Option<String>,
    },
    /// Send a request and wait for its response (matched by nonce).
    Request {
        /// Operation name (Plaza: e.g. `entity.create`).
        op: String,
        /// Its arguments; string values are templates.
        #[serde(default)]
        args: Option<serde_json::Value>,
    },
    /// Make an HTTP call to the target (e.g. a REST API under load); its
    /// round trip is timed. Strings in `path` and `body` are templates.
    Http {
        /// `GET`, `POST`, ...
        #[serde(default = "get")]
        method: String,
        /// Path (and query) on the target, e.g. `/v1/rooms`.
        path: String,
        /// JSON body.
        #[serde(default)]
        body: Option<serde_json::Value>,
        /// The status that counts as success (default: any 2xx).
        #[serde(default)]
        status: Option<u16>,
    },
    /// Plaza's server API: `POST /v1/rooms/{room}/publish` as the
    /// application's backend does it, over the run's pooled, kept-alive HTTP
    /// connections (no WebSocket). Its `data` carries the send time, so that
    /// members time it from the call to their receipt; the call's answer is
    /// timed as an HTTP call. Members of the user's room (`{room}`) on the
    /// channel are expected to receive it.
    ApiPublish {
        /// Room id template, e.g. `"bench-{room}"` (created by the run's
        /// setup like the rooms members join).
        room: String,
        /// Channel (default: the room's main channel).
        #[serde(default)]
        channel: Option<String>,
        /// Event name (default `"b"`).
        #[serde(default)]
        event: Option<String>,
        /// Size of `data` in bytes, about (timestamp and padding included).
        #[serde(default = "hundred")]
        bytes: usize,
    },
    /// Wait.
    Think {
        /// Milliseconds.
        ms: u64,
    },
    /// Repeat steps.
    Loop {
        /// Times to repeat; absent: until the run ends.
        #[serde(default)]
        count: Option<u64>,
        /// Start an iteration at most this often (a fixed cadence, not a
        /// pause after each iteration).
        #[serde(default)]
        every_ms: Option<u64>,
        /// The same cadence given as iterations per second (fractions
        /// allowed, e.g. `312.5`); not with `every_ms`.
        #[serde(default)]
        per_s: Option<f64>,
        /// The steps to repeat.
        steps: Vec<Step>,
    },
    /// Run several step lists at once for the same user (e.g. an XR user's
    /// usage loop and its pose updates); ends when every branch has ended.
    Parallel(Vec<Vec<Step>>),
    /// Wait until the named phase starts (at once if it has started; an
    /// unknown name is refused when the scenario is parsed).
    WaitPhase(String),
    /// Steps only the first user of each room runs (e.g. the one timed
    /// broadcast of idle-capacity); the others go on at once.
    Leader(Vec<Step>),
    /// Wait until every user of the run has joined (after the last arrival).
    WaitAllJoined,
    /// Plaza: replay generated chat streams (source document 002): this
    /// user publishes its share of every stream's messages, on time, until
    /// the run ends.
    ChatReplay(ChatReplay),
    /// Stay connected, doing nothing, until the run ends.
    Idle,
    /// Stop reading (the connection stays open, its receive buffer fills)
    /// until the run ends: a slow consumer, which the server should close
    /// without the others noticing.
    Stall,
    /// Leave the room and close the connection.
    Disconnect,
}

fn hundred() -> usize {
    100
}

/// Chat streams replayed by a room's users together ([`Step::ChatReplay`]).
///
/// Stream `s` (topic `t{s}`) has a message every `1 / per_stream_per_s`
/// seconds on average (exponential gaps); each message's speaker is one of
/// the room's users, and a `reply_ratio` share of them answer (`reply_to`)
/// one of the stream's three previous messages. All of it is drawn from
/// `seed`: every user computes the same schedule and sends the messages
/// whose speaker it is, so a run repeats exactly.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ChatReplay {
    /// Number of streams (topics `t0`, `t1`, ...).
    #[serde(default = "six")]
    pub streams: u32,
    /// Messages per second of each stream.
    #[serde(default = "one_f64")]
    pub per_stream_per_s: f64,
    /// Seed of the schedule.
    #[serde(default)]
    pub seed: u64,
    /// Share of messages that answer an earlier one.
    #[serde(default)]
    pub reply_ratio: f64,
    /// Payload size in bytes, about.
    #[serde(default = "hundred")]
    pub bytes: usize,
    /// Stop when this phase starts (the flow's next steps run then);
    /// absent: at the end of the run.
    #[serde(default)]
    pub until_phase: Option<String>,
}

fn six() -> u32 {
    6
}

fn one_f64() -> f64 {
    1.0
}

fn get() -> String {
    "GET".into()
}

/// Pass criteria for the recorded phases.
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Expectations {
    /// Mean delivery latency at most this (ms).
    pub latency_mean_ms: Option<f64>,
    /// 99th percentile delivery latency at most this (ms).
    pub latency_p99_ms: Option<f64>,
    /// Mean request round trip at most this (ms).
    pub request_mean_ms: Option<f64>,
    /// 99th percentile chat reply latency at most this (ms).
    pub reply_p99_ms: Option<f64>,
    /// Mean HTTP call round trip at most this (ms).
    pub http_mean_ms: Option<f64>,
    /// 95th percentile HTTP call round trip at most this (ms).
    pub http_p95_ms: Option<f64>,
    /// 99th percentile HTTP call round trip at most this (ms).
    pub http_p99_ms: Option<f64>,
    /// Server-API publishes answered 2xx per recorded second at least this.
    pub api_publishes_per_s_min: Option<f64>,
    /// Webhook requests received per recorded second at least this.
    pub webhooks_per_s_min: Option<f64>,
    /// 99th percentile webhook latency (publish call to receipt) at most this (ms).
    pub webhook_p99_ms: Option<f64>,
    /// Distinct webhook events received / events expected at least this.
    pub webhook_ratio: Option<f64>,
    /// Errors / operations at most this.
    pub error_rate: Option<f64>,
    /// Deliveries / expected deliveries at least this.
    pub delivery_ratio: Option<f64>,
    /// Loopback bytes while recording (both ways, headers included) at most
    /// this: a traffic budget, e.g. a source document's figure.
    pub loopback_bytes_max: Option<f64>,
    /// The server's RSS over the recorded phases stays within this fraction
    /// of its first recorded reading (a soak: 0.05 is ±5 %); needs the
    /// server's pid and at least two readings.
    pub rss_drift_max: Option<f64>,
}

/// How the run ends after its last phase.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Drain {
    /// Deliveries must pause this long (ms).
    pub quiet_ms: u64,
    /// Longest wait (ms).
    pub max_ms: u64,
}

impl Default for Drain {
    fn default() -> Self {
        Drain {
            quiet_ms: 500,
            max_ms: 10_000,
        }
    }
}

/// Why a scenario cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum ScenarioError {
    /// Not valid YAML or not the expected shape.
    #[error("scenario: {0}")]
    Yaml(#[from] serde_norway::Error),
    /// A `${name}` with no such parameter.
    #[error("scenario: unknown parameter ${{{0}}}")]
    UnknownParam(String),
    /// `--set` names a parameter the scenario does not declare.
    #[error("--set {0}: the scenario has no such parameter (it has: {1})")]
    UnknownOverride(String, String),
    /// Consistency checks.
    #[error("scenario: {0}")]
    Invalid(String),
}

impl Scenario {
    /// Parses YAML, applies `overrides` (`name`, `value` parsed as YAML) to
    /// `params`, substitutes them and checks the result.
    pub fn parse(yaml: &str, overrides: &[(String, String)]) -> Result<Scenario, ScenarioError> {
        let mut doc: Value = serde_norway::from_str(yaml)?;
        let mut params: BTreeMap<String, Value> = match doc.get("params") {
            Some(p) => serde_norway::from_value(p.clone())?,
            None => BTreeMap::new(),
        };
        for (name, value) in overrides {
            if !params.contains_key(name) {
                let known = params.keys().cloned().collect::<Vec<_>>().join(", ");
                return Err(ScenarioError::UnknownOverride(name.clone(), known));
            }
            params.insert(name.clone(), serde_norway::from_str(value)?);
        }
        if let Value::Mapping(m) = &mut doc {
            m.remove("params");
        }
        substitute(&mut doc, &params)?;
        // Typed through JSON's data model: serde_norway wants enum variants as
        // YAML tags (`!join`), serde_json takes the `- join: {...}` form.
        let json = serde_json::to_value(&doc).map_err(|e| ScenarioError::Invalid(e.to_string()))?;
        let mut s: Scenario =
            serde_json::from_value(json).map_err(|e| ScenarioError::Invalid(e.to_string()))?;
        s.params = params;
        for p in &mut s.phases {
            match (p.users, p.users_per_room) {
                (Some(_), Some(_)) => {
                    return Err(ScenarioError::Invalid(format!(
                        "phase {}: give users or users_per_room, not both",
                        p.name
                    )))
                }
                (None, Some(per_room)) => p.users = Some(per_room.saturating_mul(s.rooms)),
                _ => {}
            }
        }
        s.check()?;
        Ok(s)
    }

    fn check(&self) -> Result<(), ScenarioError> {
        let bad = |m: String| Err(ScenarioError::Invalid(m));
        if self.rooms == 0 {
            return bad("rooms must be at least 1".into());
        }
        if self.phases.is_empty() {
            return bad("at least one phase is needed".into());
        }
        for (i, p) in self.phases.iter().enumerate() {
            let rate = p.arrival_rate.unwrap_or(0.0);
            let end_rate = p.ramp_to.unwrap_or(rate);
            if !(rate >= 0.0 && end_rate >= 0.0 && rate.is_finite() && end_rate.is_finite()) {
                return bad(format!("phase {}: arrival rates must be ≥ 0", p.name));
            }
            if p.until_done {
                if p.duration_s.is_none() {
                    return bad(format!(
                        "phase {}: until_done needs duration_s, its upper bound",
                        p.name
                    ));
                }
                if rate > 0.0 || end_rate > 0.0 || p.users.is_some() {
                    return bad(format!(
                        "phase {}: until_done admits no arrivals (arrival_rate, ramp_to, \
                         users): it waits for the flows of users that arrived before it",
                        p.name
                    ));
                }
                if i + 1 != self.phases.len() {
                    return bad(format!(
                        "phase {}: only the last phase can be until_done (the phases after \
                         it would start at unknown times)",
                        p.name
                    ));
                }
            }
            match p.duration_s {
                Some(d) if !(d.is_finite() && d >= 0.0) => {
                    return bad(format!("phase {}: duration_s must be ≥ 0", p.name))
                }
                None if rate <= 0.0 || p.users.is_none() || p.ramp_to.is_some() => {
                    return bad(format!(
                        "phase {}: give duration_s, or a constant arrival_rate and users",
                        p.name
                    ))
                }
                _ => {}
            }
        }
        if self.flows.is_empty() || self.flows.iter().all(|f| f.weight == 0) {
            return bad("at least one flow with a positive weight is needed".into());
        }
        fn waits<'a>(steps: &'a [Step], out: &mut Vec<&'a str>) {
            for s in steps {
                match s {
                    Step::WaitPhase(p) => out.push(p),
                    Step::ChatReplay(ChatReplay {
                        until_phase: Some(p),
                        ..
                    }) => out.push(p),
                    Step::Loop { steps, .. } | Step::Leader(steps) => waits(steps, out),
                    Step::Parallel(branches) => branches.iter().for_each(|b| waits(b, out)),
                    _ => {}
                }
            }
        }
        fn cadences(steps: &[Step]) -> Result<(), String> {
            for s in steps {
                match s {
                    Step::Loop {
                        every_ms, per_s, ..
                    } if every_ms.is_some() && per_s.is_some() => {
                        return Err("loop: give every_ms or per_s, not both".into())
                    }
                    Step::Loop { per_s: Some(r), .. } if !(r.is_finite() && *r > 0.0) => {
                        return Err(format!("loop: per_s must be > 0, not {r}"))
                    }
                    _ => {}
                }
                match s {
                    Step::Loop { steps, .. } | Step::Leader(steps) => cadences(steps)?,
                    Step::Parallel(branches) => branches.iter().try_for_each(|b| cadences(b))?,
                    _ => {}
                }
            }
            Ok(())
        }
        for f in &self.flows {
            if let Err(e) = cadences(&f.steps) {
                return bad(format!("flow {}: {e}", f.name));
            }
        }
        let mut named = Vec::new();
        self.flows.iter().for_each(|f| waits(&f.steps, &mut named));
        if let Some(p) = named
            .iter()
            .find(|p| !self.phases.iter().any(|ph| ph.name == **p))
        {
            return bad(format!("wait_phase / until_phase: no phase named {p:?}"));
        }
        Ok(())
    }

    /// Whether any flow joins a room (HTTP-only scenarios do not).
    pub fn joins(&self) -> bool {
        self.flows.iter().any(Flow::joins)
    }

    /// How many of the users `0..users` run a flow that joins a room (a
    /// server-API caller, for one, does not): those `wait_all_joined` waits
    /// for.
    pub fn members(&self, users: u64) -> u64 {
        (0..users)
            .filter(|&vu| self.flow_of(vu / self.rooms).joins())
            .count() as u64
    }

    /// The flow of virtual user `vu`: a deterministic weighted round robin,
    /// so that runs are reproducible and any prefix of users is mixed as
    /// evenly as the weights allow.
    pub fn flow_of(&self, vu: u64) -> &Flow {
        let total: u64 = self.flows.iter().map(|f| u64::from(f.weight)).sum();
        // Smooth weighted round robin over one period of `total` users.
        let slot = vu % total;
        let mut current: Vec<i64> = vec![0; self.flows.len()];
        let mut chosen = 0;
        for _ in 0..=slot {
            for (c, f) in current.iter_mut().zip(&self.flows) {
                *c += i64::from(f.weight);
            }
            chosen = (0..current.len())
                .max_by_key(|&i| (current[i], -(i as i64)))
                .unwrap_or(0);
            current[chosen] -= total as i64;
        }
        &self.flows[chosen]
    }
}

/// Replaces `${name}` in every string of the document.
fn substitute(v: &mut Value, params: &BTreeMap<String, Value>) -> Result<(), ScenarioError> {
    match v {
        Value::String(s) => {
            if let Some(name) = s.strip_prefix("${").and_then(|r| r.strip_suffix('}')) {
                if name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
                    *v = params
                        .get(name)
                        .cloned()
                        .ok_or_else(|| ScenarioError::UnknownParam(name.into()))?;
                    return Ok(());
                }
            }
            let mut out = String::new();
            let mut rest = s.as_str();
            while let Some(at) = rest.find("${") {
                out.push_str(&rest[..at]);
                let end = rest[at..]
                    .find('}')
                    .ok_or_else(|| ScenarioError::Invalid(format!("unclosed ${{ in {s:?}")))?;
                let name = &rest[at + 2..at + end];
                let value = params
                    .get(name)
                    .ok_or_else(|| ScenarioError::UnknownParam(name.into()))?;
                out.push_str(&scalar_text(value));
                rest = &rest[at + end + 1..];
            }
            out.push_str(rest);
            *s = out;
        }
        Value::Sequence(items) => {
            for i in items {
                substitute(i, params)?;
            }
        }
        Value::Mapping(m) => {
            for (_, i) in m.iter_mut() {
                substitute(i, params)?;
            }
        }
        Value::Tagged(t) => substitute(&mut t.value, params)?,
        _ => {}
    }
    Ok(())
}

fn scalar_text(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Number(n) => n.to_string(),
        Value::Bool(b) => b.to_string(),
        Value::Null => String::new(),
        other => serde_norway::to_string(other)
            .unwrap_or_default()
            .trim()
            .to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BASE: &str = r#"
name: t
params:
  members: 4
  every: 500
  prefix: room
phases:
  - { name: join, arrival_rate: 50, users: "${members}" }
  - { name: measure, duration_s: 2.5, record: true }
flows:
  - name: member
    weight: 3
    steps:
      - connect
      - join: { room: "${prefix}-{room}", channels: [xr] }
      - wait_all_joined
      - loop:
          every_ms: "${every}"
          count: 10
          steps:
            - publish: { bytes: 120 }
            - think: { ms: 5 }
      - idle
  - name: watcher
    steps: [connect, { join: { room: "x" } }, idle]
expect: { latency_mean_ms: 100, error_rate: 0.01 }
"#;

    #[test]
    fn parses_every_step_kind_with_parameters_substituted() {
        let s = Scenario::parse(BASE, &[]).unwrap();
        assert_eq!(s.rooms, 1);
        assert_eq!(s.phases[0].users, Some(4));
        assert_eq!(s.phases[1].duration_s, Some(2.5));
        assert!(s.phases[1].record);
        let steps = &s.flows[0].steps;
        assert_eq!(steps[0], Step::Connect);
        assert_eq!(
            steps[1],
            Step::Join {
                room: "room-{room}".into(),
                channels: vec!["xr".into()],
                platform: None,
                policy: None,
                history: None,
            }
        );
        assert_eq!(steps[2], Step::WaitAllJoined);
        let Step::Loop {
            count,
            every_ms,
            steps: inner,
            ..
        } = &steps[3]
        else {
            panic!("{:?}", steps[3]);
        };
        assert_eq!((*count, *every_ms), (Some(10), Some(500)));
        assert_eq!(
            inner[0],
            Step::Publish {
                channel: None,
                event: None,
                bytes: 120,
                text: None,
            }
        );
        assert_eq!(inner[1], Step::Think { ms: 5 });
        assert_eq!(s.flows[1].weight, 1);
        assert_eq!(s.expect.latency_mean_ms, Some(100.0));
        assert_eq!(s.drain, Drain::default());
    }

    #[test]
    fn overrides_replace_parameters_and_unknown_ones_are_refused() {
        let over = [("members".to_string(), "300".to_string())];
        let s = Scenario::parse(BASE, &over).unwrap();
        assert_eq!(s.phases[0].users, Some(300));
        assert_eq!(s.params["members"], Value::from(300));
        let e = Scenario::parse(BASE, &[("nope".into(), "1".into())]).unwrap_err();
        assert!(e.to_string().contains("no such parameter"), "{e}");
        assert!(e.to_string().contains("members"), "{e}");
    }

    #[test]
    fn unknown_parameters_fields_and_inconsistent_phases_are_errors() {
        let e = Scenario::parse(&BASE.replace("${every}", "${evry}"), &[]).unwrap_err();
        assert!(
            matches!(e, ScenarioError::UnknownParam(ref n) if n == "evry"),
            "{e}"
        );
        let e = Scenario::parse(&BASE.replace("record: true", "recrd: true"), &[]).unwrap_err();
        assert!(e.to_string().contains("recrd"), "{e}");
        let e = Scenario::parse(&BASE.replace("duration_s: 2.5, ", ""), &[]).unwrap_err();
        assert!(e.to_string().contains("phase measure"), "{e}");
        let e = Scenario::parse(&BASE.replace("- publish", "- shout"), &[]).unwrap_err();
        assert!(e.to_string().contains("shout"), "{e}");
    }

    #[test]
    fn flows_are_mixed_by_weight_deterministically() {
        let s = Scenario::parse(BASE, &[]).unwrap();
        let names: Vec<&str> = (0..8).map(|vu| s.flow_of(vu).name.as_str()).collect();
        assert_eq!(
            names,
            ["member", "member", "watcher", "member", "member", "member", "watcher", "member"]
        );
        let members = (0..400).filter(|&v| s.flow_of(v).name == "member").count();
        assert_eq!(members, 300);
    }

    #[test]
    fn the_shipped_scenarios_parse() {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../../bench/scenarios");
        let mut seen = 0;
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.extension().is_none_or(|e| e != "yaml") {
                continue; // tools/
            }
            let yaml = std::fs::read_to_string(&path).unwrap();
            let s =
                Scenario::parse(&yaml, &[]).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            assert!(!s.flows.is_empty());
            seen += 1;
        }
        assert!(
            seen >= 5,
            "room-broadcast, explorviz ×2, idle-capacity, trajectory-http"
        );
        let yaml = std::fs::read_to_string(format!("{dir}/trajectory-http.yaml")).unwrap();
        let finish = Scenario::parse(&yaml, &[]).unwrap().phases.pop().unwrap();
        assert!(finish.until_done && finish.record, "no idle padding");
        assert!(finish.duration_s >= Some(60.0), "a generous bound");
        let yaml = std::fs::read_to_string(format!("{dir}/explorviz-crossplatform.yaml")).unwrap();
        let s = Scenario::parse(&yaml, &[("rooms".into(), "4".into())]).unwrap();
        assert_eq!(
            s.phases[0].users,
            Some(400),
            "100 users per room in 4 rooms"
        );
        let xr = &s.flows[1];
        let Step::Parallel(branches) = &xr.steps[3] else {
            panic!("xr users run two branches: {:?}", xr.steps[3]);
        };
        // The usage loop is the browser flow's, reused by a YAML alias.
        let Step::Loop { steps, count, .. } = &branches[0][0] else {
            panic!("usage loop");
        };
        assert_eq!(*count, Some(50));
        assert!(matches!(
            &branches[0][0],
            Step::Loop {
                every_ms: Some(3000),
                ..
            }
        ));
        assert_eq!(steps.len(), 11, "6 actions, 5 pauses");
        assert!(matches!(&steps[2], Step::Request { op, .. } if op == "entity.create"));
        assert!(matches!(
            &branches[1][0],
            Step::Loop {
                every_ms: Some(50),
                count: Some(3000),
                ..
            }
        ));
    }

    #[test]
    fn wait_phase_must_name_a_phase() {
        let yaml = "name: x\nphases:\n  - {name: a, duration_s: 1}\nflows:\n  - {name: f, steps: [{wait_phase: b}]}\n";
        assert!(Scenario::parse(yaml, &[])
            .unwrap_err()
            .to_string()
            .contains("\"b\""));
        let ok = yaml.replace("wait_phase: b", "leader: [{wait_phase: a}]");
        assert!(Scenario::parse(&ok, &[]).is_ok());
    }

    #[test]
    fn http_steps_default_to_get() {
        let yaml = "name: x\nphases:\n  - {name: a, duration_s: 1}\nflows:\n  - {name: f, steps: [{http: {path: /v1/rooms}}, {http: {method: POST, path: /x, body: {a: 1}, status: 201}}]}\n";
        let s = Scenario::parse(yaml, &[]).unwrap();
        assert!(
            matches!(&s.flows[0].steps[0], Step::Http { method, status: None, .. } if method == "GET")
        );
        assert!(matches!(
            &s.flows[0].steps[1],
            Step::Http {
                status: Some(201),
                body: Some(_),
                ..
            }
        ));
    }

    #[test]
    fn http_only_scenarios_do_not_join() {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../../bench/scenarios");
        let load = |f: &str| {
            Scenario::parse(&std::fs::read_to_string(format!("{dir}/{f}")).unwrap(), &[]).unwrap()
        };
        assert!(!load("trajectory-http.yaml").joins());
        assert!(load("room-broadcast.yaml").joins());
        // Source document 001's request shape: a 300-point `lat,long` track as csv_data.
        let doc = load("trajectory-http-document.yaml");
        assert!(!doc.joins());
        let mut bodies = 0;
        for flow in &doc.flows {
            let Step::Loop { steps, .. } = &flow.steps[0] else {
                panic!("{}: a loop of calls", flow.name)
            };
            let Step::Http { path, body, .. } = &steps[0] else {
                panic!("{}: an HTTP call", flow.name)
            };
            assert_eq!(path, &format!("/trajectory/{}", flow.name));
            let csv = body.as_ref().unwrap()["csv_data"].as_str().unwrap();
            assert!(csv.starts_with("lat,long\n"), "{csv:.40}");
            assert_eq!(csv.lines().count(), 301);
            bodies += 1;
        }
        assert_eq!(bodies, 2);
        assert!(load("explorviz-crossplatform.yaml").joins());
    }

    #[test]
    fn until_done_is_a_bounded_last_phase_without_arrivals() {
        let yaml = |last: &str| {
            format!(
                "name: x\nrooms: 2\nphases:\n  - {{name: a, arrival_rate: 10, users: 4}}\n  - {last}\nflows:\n  - {{name: f, steps: [{{think: {{ms: 1}}}}]}}\n"
            )
        };
        let s = Scenario::parse(
            &yaml("{name: b, duration_s: 60, until_done: true, record: true}"),
            &[],
        )
        .unwrap();
        assert!(s.phases[1].until_done && s.phases[1].record);
        assert!(!s.phases[0].until_done, "off unless asked for");
        let refused = |last: &str, why: &str| {
            let e = Scenario::parse(&yaml(last), &[]).unwrap_err().to_string();
            assert!(e.contains("phase b") && e.contains(why), "{last}: {e}");
        };
        refused("{name: b, until_done: true}", "needs duration_s");
        refused(
            "{name: b, duration_s: 5, arrival_rate: 2, until_done: true}",
            "no arrivals",
        );
        refused(
            "{name: b, duration_s: 5, ramp_to: 2, until_done: true}",
            "no arrivals",
        );
        refused(
            "{name: b, duration_s: 5, users: 3, until_done: true}",
            "no arrivals",
        );
        refused(
            "{name: b, duration_s: 5, users_per_room: 1, until_done: true}",
            "no arrivals",
        );
        let e = Scenario::parse(
            &yaml("{name: b, duration_s: 5, until_done: true}\n  - {name: c, duration_s: 1}"),
            &[],
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("only the last phase"), "{e}");
    }

    #[test]
    fn users_per_room_and_users_are_exclusive() {
        let yaml = "name: x\nrooms: 2\nphases:\n  - {name: a, arrival_rate: 1, users: 2, users_per_room: 1}\nflows:\n  - {name: f, steps: [connect]}\n";
        assert!(Scenario::parse(yaml, &[]).is_err());
    }
}
