//! A webhook target's configuration (`[[webhooks]]`), its checks, and the
//! settings a node runs it with.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::event::WebhookKind;
use super::retry::RetryPolicy;
use super::signature::Secret;
use crate::config::within;

/// One `[[webhooks]]` table of the configuration. Every field has a default
/// so that a missing one is named by [`ServerConfig::check_bounds`](crate::ServerConfig::check_bounds), as a bad one is.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct WebhookTarget {
    /// Its label in metrics and logs, `[a-z0-9_-]{1,32}`; empty:
    /// `webhook-<index>` (from 0, in the order of the configuration).
    pub name: String,
    /// Where events are POSTed: an `http://` URL (no TLS is built in: reach
    /// an `https://` endpoint through a local proxy).
    pub url: String,
    /// `whsec_` and the base64 of 24 to 64 bytes: the signing key.
    pub secret: String,
    /// The event types sent (at least one); `*`: all.
    pub events: Vec<String>,
    /// The channels whose `message.published` events are sent: empty, none;
    /// `*`, all.
    pub channels: Vec<String>,
    /// The timeout of one attempt.
    pub timeout_ms: u64,
    /// How long after its first attempt a failing event is tried again;
    /// then it is counted failed and dropped.
    pub retry_for_ms: u64,
    /// Events queued (or being delivered) for this target at most; more
    /// are dropped.
    pub queue_max: usize,
    /// Rooms whose events are delivered at once.
    pub max_in_flight: usize,
}

impl Default for WebhookTarget {
    fn default() -> Self {
        WebhookTarget {
            name: String::new(),
            url: String::new(),
            secret: String::new(),
            events: Vec::new(),
            channels: Vec::new(),
            timeout_ms: 5_000,
            retry_for_ms: 3_600_000,
            queue_max: 100_000,
            max_in_flight: 64,
        }
    }
}

/// The longest `name`.
pub(crate) const MAX_NAME_LEN: usize = 32;

/// Which channels' messages a target wants.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Channels {
    All,
    Only(Vec<String>),
}

/// A checked target: what a node runs it with.
#[derive(Debug, Clone)]
pub(crate) struct Settings {
    pub(crate) name: String,
    pub(crate) url: reqwest::Url,
    pub(crate) secret: Secret,
    /// The wanted types, one bit each ([`WebhookKind::bit`]).
    pub(crate) events: u16,
    pub(crate) channels: Channels,
    pub(crate) timeout: Duration,
    pub(crate) retry: RetryPolicy,
    pub(crate) queue_max: usize,
    pub(crate) max_in_flight: usize,
}

impl Settings {
    /// Whether this target wants an event of type `kind` (in `channel`,
    /// for a `message.published`).
    pub(crate) fn wants(&self, kind: WebhookKind, channel: Option<&str>) -> bool {
        if self.events & kind.bit() == 0 {
            return false;
        }
        if kind != WebhookKind::MessagePublished {
            return true;
        }
        match (&self.channels, channel) {
            (Channels::All, _) => true,
            (Channels::Only(list), Some(c)) => list.iter().any(|x| x == c),
            (Channels::Only(_), None) => false,
        }
    }
}

/// Checks every target (bounds, URL, secret, event types, names unique):
/// their settings, or a message naming `webhooks[i].field`, what it must
/// be and (unless a secret) the value.
pub(crate) fn check_targets(targets: &[WebhookTarget]) -> Result<Vec<Settings>, String> {
    let mut out: Vec<Settings> = Vec::with_capacity(targets.len());
    for (i, t) in targets.iter().enumerate() {
        let s = check_target(i, t)?;
        if let Some(j) = out.iter().position(|o| o.name == s.name) {
            return Err(format!(
                "webhooks[{i}].name {:?} is also the name of webhooks[{j}]: names must differ",
                s.name
            ));
        }
        out.push(s);
    }
    Ok(out)
}

fn check_target(i: usize, t: &WebhookTarget) -> Result<Settings, String> {
    let field = |f: &str| format!("webhooks[{i}].{f}");
    let name = if t.name.is_empty() {
        format!("webhook-{i}")
    } else {
        t.name.clone()
    };
    let name_ok = name.len() <= MAX_NAME_LEN
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_');
    if !name_ok {
        return Err(format!(
            "{} must be 1 to {MAX_NAME_LEN} of a-z, 0-9, '-' and '_', not {name:?}",
            field("name")
        ));
    }
    let url = check_url(&t.url).map_err(|e| format!("{} ({name}) {e}", field("url")))?;
    let secret =
        Secret::parse(&t.secret).map_err(|e| format!("{} ({name}) {e}", field("secret")))?;
    if t.events.is_empty() {
        return Err(format!(
            "{} ({name}) must name at least one event type (or \"*\")",
            field("events")
        ));
    }
    let mut events = 0u16;
    for e in &t.events {
        if e == "*" {
            events = WebhookKind::ALL.iter().map(|k| k.bit()).sum();
            continue;
        }
        let kind = WebhookKind::parse(e).ok_or_else(|| {
            let known: Vec<&str> = WebhookKind::ALL.iter().map(|k| k.as_str()).collect();
            format!(
                "{} ({name}): unknown event type {e:?}; known: {}, or \"*\"",
                field("events"),
                known.join(", ")
            )
        })?;
        events |= kind.bit();
    }
    let channels = if t.channels.iter().any(|c| c == "*") {
        Channels::All
    } else {
        if let Some(c) = t.channels.iter().find(|c| c.is_empty() || c.len() > 64) {
            return Err(format!(
                "{} ({name}): a channel must have 1 to 64 bytes, not {c:?}",
                field("channels")
            ));
        }
        Channels::Only(t.channels.clone())
    };
    let n = |v: usize| v as u64;
    within(&field("timeout_ms"), t.timeout_ms, 100, 60_000)?;
    within(&field("retry_for_ms"), t.retry_for_ms, 1_000, 604_800_000)?;
    within(&field("queue_max"), n(t.queue_max), 1, 10_000_000)?;
    within(&field("max_in_flight"), n(t.max_in_flight), 1, 1024)?;
    Ok(Settings {
        name,
        url,
        secret,
        events,
        channels,
        timeout: Duration::from_millis(t.timeout_ms),
        retry: RetryPolicy {
            retry_for: Duration::from_millis(t.retry_for_ms),
        },
        queue_max: t.queue_max,
        max_in_flight: t.max_in_flight,
    })
}

/// An `http://` URL with a host, or why not.
fn check_url(text: &str) -> Result<reqwest::Url, String> {
    if text.is_empty() {
        return Err("is required: the http:// URL events are POSTed to".into());
    }
    let url = reqwest::Url::parse(text).map_err(|e| format!("{text:?} is not a URL: {e}"))?;
    match url.scheme() {
        "http" => {}
        "https" => {
            return Err(format!(
                "{text:?}: https is not built in (this build has no TLS): \
                 point the target at a local TLS proxy's http:// address"
            ))
        }
        other => return Err(format!("{text:?}: the scheme must be http, not {other}")),
    }
    if url.host_str().is_none_or(str::is_empty) {
        return Err(format!("{text:?} has no host"));
    }
    Ok(url)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn good() -> WebhookTarget {
        WebhookTarget {
            name: "backend".into(),
            url: "http://127.0.0.1:9000/plaza".into(),
            secret: "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw".into(),
            events: vec!["member.joined".into(), "message.published".into()],
            channels: vec!["chat".into()],
            ..WebhookTarget::default()
        }
    }

    fn refusal(edit: impl FnOnce(&mut WebhookTarget)) -> String {
        let mut t = good();
        edit(&mut t);
        check_targets(&[good_named("other"), t]).unwrap_err()
    }

    fn good_named(name: &str) -> WebhookTarget {
        WebhookTarget {
            name: name.into(),
            ..good()
        }
    }

    #[test]
    fn a_good_target_gets_its_settings() {
        let s = check_targets(&[good()]).unwrap();
        let s = &s[0];
        assert_eq!(s.name, "backend");
        assert_eq!(s.url.as_str(), "http://127.0.0.1:9000/plaza");
        assert!(s.wants(WebhookKind::MemberJoined, None));
        assert!(!s.wants(WebhookKind::MemberLeft, None));
        assert!(s.wants(WebhookKind::MessagePublished, Some("chat")));
        assert!(!s.wants(WebhookKind::MessagePublished, Some("other")));
        assert!(!s.wants(WebhookKind::MessagePublished, None));
        assert_eq!(s.timeout, Duration::from_secs(5));
        assert_eq!(s.retry.retry_for, Duration::from_secs(3600));
        assert_eq!((s.queue_max, s.max_in_flight), (100_000, 64));
    }

    #[test]
    fn stars_mean_all_and_no_channels_means_none() {
        let all = check_targets(&[WebhookTarget {
            events: vec!["*".into()],
            channels: vec!["*".into()],
            ..good()
        }])
        .unwrap();
        for k in WebhookKind::ALL {
            assert!(all[0].wants(k, Some("any")), "{k}");
        }
        let none = check_targets(&[WebhookTarget {
            events: vec!["*".into()],
            channels: vec![],
            ..good()
        }])
        .unwrap();
        assert!(!none[0].wants(WebhookKind::MessagePublished, Some("chat")));
        assert!(none[0].wants(WebhookKind::LockReleased, None));
    }

    #[test]
    fn names_default_by_index_and_must_differ() {
        let s = check_targets(&[good_named(""), good_named("")]);
        assert_eq!(
            s.unwrap()
                .iter()
                .map(|s| s.name.as_str())
                .collect::<Vec<_>>(),
            ["webhook-0", "webhook-1"]
        );
        assert_eq!(
            refusal(|t| t.name = "other".into()),
            "webhooks[1].name \"other\" is also the name of webhooks[0]: names must differ"
        );
        // A default name may clash with a given one.
        let e = check_targets(&[good_named("webhook-1"), good_named("")]).unwrap_err();
        assert!(
            e.starts_with("webhooks[1].name \"webhook-1\" is also"),
            "{e}"
        );
        for bad in ["Backend", "a.b", "a b", "ü", &"x".repeat(33)] {
            let e = refusal(|t| t.name = bad.into());
            assert!(
                e.starts_with("webhooks[1].name must be 1 to 32 of a-z"),
                "{e}"
            );
            assert!(e.ends_with(&format!("not {bad:?}")), "{e}");
        }
        assert!(check_targets(&[good_named(&"x".repeat(32))]).is_ok());
        assert!(check_targets(&[good_named("a-b_9")]).is_ok());
    }

    #[test]
    fn urls_must_be_http_with_a_host() {
        let e = refusal(|t| t.url = "https://example.org/hook".into());
        assert!(
            e.starts_with(
                "webhooks[1].url (backend) \"https://example.org/hook\": https is not built in"
            ),
            "{e}"
        );
        assert!(e.contains("local TLS proxy"), "{e}");
        let e = refusal(|t| t.url = "ftp://example.org/hook".into());
        assert_eq!(
            e,
            "webhooks[1].url (backend) \"ftp://example.org/hook\": the scheme must be http, not ftp"
        );
        let e = refusal(|t| t.url = "not a url".into());
        assert!(
            e.starts_with("webhooks[1].url (backend) \"not a url\" is not a URL"),
            "{e}"
        );
        let e = refusal(|t| t.url = "http://".into());
        assert!(
            e.starts_with("webhooks[1].url (backend) \"http://\""),
            "{e}"
        );
        let e = refusal(|t| t.url = String::new());
        assert!(
            e.starts_with("webhooks[1].url (backend) is required"),
            "{e}"
        );
        assert!(check_targets(&[WebhookTarget {
            url: "http://hooks.internal:8080/a?b=c".into(),
            ..good()
        }])
        .is_ok());
    }

    #[test]
    fn secrets_must_be_whsec_base64_of_24_to_64_bytes() {
        let e = refusal(|t| t.secret = String::new());
        assert!(
            e.starts_with("webhooks[1].secret (backend) is required"),
            "{e}"
        );
        let e = refusal(|t| t.secret = "hunter2hunter2hunter2hunter2".into());
        assert_eq!(e, "webhooks[1].secret (backend) must start with whsec_");
        let e = refusal(|t| t.secret = "whsec_%%%garbage%%%".into());
        assert_eq!(
            e,
            "webhooks[1].secret (backend) is not whsec_ followed by base64"
        );
        assert!(!e.contains("garbage"));
        let e = refusal(|t| t.secret = "whsec_c2hvcnQ=".into());
        assert_eq!(
            e,
            "webhooks[1].secret (backend) must hold from 24 to 64 bytes, not 5"
        );
    }

    #[test]
    fn event_types_must_be_known_and_at_least_one() {
        let e = refusal(|t| t.events = vec![]);
        assert_eq!(
            e,
            "webhooks[1].events (backend) must name at least one event type (or \"*\")"
        );
        let e = refusal(|t| t.events = vec!["member.joined".into(), "member.kicked".into()]);
        assert!(
            e.starts_with("webhooks[1].events (backend): unknown event type \"member.kicked\"; known: room.created, room.deleted,"),
            "{e}"
        );
        let e = refusal(|t| t.channels = vec!["".into()]);
        assert!(
            e.starts_with("webhooks[1].channels (backend): a channel must"),
            "{e}"
        );
    }

    #[test]
    fn each_bound_refuses_one_past_its_edge_and_takes_the_edge() {
        type Edit = fn(&mut WebhookTarget, u64);
        let cases: [(&str, u64, u64, Edit); 4] = [
            ("timeout_ms", 100, 60_000, |t, v| t.timeout_ms = v),
            ("retry_for_ms", 1_000, 604_800_000, |t, v| {
                t.retry_for_ms = v
            }),
            ("queue_max", 1, 10_000_000, |t, v| t.queue_max = v as usize),
            ("max_in_flight", 1, 1024, |t, v| {
                t.max_in_flight = v as usize
            }),
        ];
        for (name, lo, hi, set) in cases {
            for ok in [lo, hi] {
                let mut t = good();
                set(&mut t, ok);
                assert!(check_targets(&[t]).is_ok(), "{name} = {ok}");
            }
            for (bad, edge) in [(lo - 1, lo), (hi + 1, hi)] {
                assert_eq!(
                    refusal(|t| set(t, bad)),
                    format!("webhooks[1].{name} must be from {lo} to {hi}, not {bad}"),
                    "{name} edge {edge}"
                );
            }
        }
    }

    #[test]
    fn the_toml_table_reads_with_defaults() {
        let t: WebhookTarget = serde_json::from_value(serde_json::json!({
            "url": "http://127.0.0.1:1/", "secret": "whsec_x", "events": ["*"]
        }))
        .unwrap();
        assert_eq!(t.timeout_ms, 5_000);
        assert_eq!(t.retry_for_ms, 3_600_000);
        assert!(serde_json::from_value::<WebhookTarget>(serde_json::json!({"nope": 1})).is_err());
    }
}
