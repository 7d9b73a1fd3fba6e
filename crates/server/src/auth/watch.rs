//! Reloading the JWKS file when it changes, so keys can be rotated without
//! a restart: the backend publishes the new key first, signs with it once
//! every node has it, and drops the old key later.

use std::sync::Weak;
use std::time::{Duration, SystemTime};

use super::TokenVerifier;

/// How often the file's modification time and size are looked at.
pub(crate) const POLL: Duration = Duration::from_millis(500);

/// The metrics a reload counts in.
pub(crate) struct ReloadCounts {
    pub(crate) reloads: metrics::Counter,
    pub(crate) failures: metrics::Counter,
}

/// Polls the JWKS file until the verifier is dropped; a change that does
/// not load (a half-written file, a bad key) keeps the keys in use and is
/// tried again at the next change.
pub(crate) async fn watch_jwks(verifier: Weak<TokenVerifier>, counts: ReloadCounts) {
    let mut seen = None;
    loop {
        let Some(v) = verifier.upgrade() else { return };
        let Some(path) = v.jwks_file() else { return };
        let stamp = std::fs::metadata(path)
            .ok()
            .map(|m| (m.modified().unwrap_or(SystemTime::UNIX_EPOCH), m.len()));
        if seen.is_none() {
            seen = Some(stamp);
        } else if seen != Some(stamp) {
            seen = Some(stamp);
            match v.reload() {
                Ok(()) => {
                    counts.reloads.increment(1);
                    tracing::info!(file = %path.display(), "JWKS reloaded");
                }
                Err(e) => {
                    counts.failures.increment(1);
                    tracing::warn!(error = %e, "JWKS not reloaded; the keys in use stay");
                }
            }
        }
        drop(v);
        tokio::time::sleep(POLL).await;
    }
}
