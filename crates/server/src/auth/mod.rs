//! Identities from the application's backend: signed tokens (JWT) that say
//! who a client is and what it may do in which rooms.
//!
//! The backend signs a token with a key this server knows (an HMAC secret,
//! or the private half of a PEM or JWKS public key); the client presents it
//! on connect (`?token=`) or in an `auth` frame, and again, refreshed,
//! before it expires. Without any key configured the server trusts joins as
//! they come (development mode); with keys, a join needs a token granting
//! `join` in that room, or a ticket.

mod claims;
pub(crate) mod demo;
pub(crate) mod expiry;
mod keys;
mod watch;

use std::path::PathBuf;
use std::sync::{Arc, RwLock};

use jsonwebtoken::errors::ErrorKind;
use jsonwebtoken::{decode, decode_header, Validation};
use plaza_core::{Millis, RoomError, RoomGrants};
use plaza_protocol::ErrorCode;

use crate::config::ServerConfig;
pub(crate) use claims::Claims;
use keys::KeySet;
pub use keys::MIN_SECRET_LEN;

/// The largest token accepted, in bytes: a token is read on every connect,
/// and a big one is more likely an attack than a grant.
pub const MAX_TOKEN_BYTES: usize = 8 * 1024;

/// How far in the future a token's `nbf` may be and still be accepted
/// (clock skew between the backend and this server).
const NBF_LEEWAY_MS: Millis = 30_000;

/// Who a verified token says the client is.
#[derive(Debug, Clone)]
pub(crate) struct Identity {
    /// `sub`: the user, the same on every device and session.
    pub(crate) user: String,
    /// `name`: the display name, if the token sets it.
    pub(crate) name: Option<String>,
    /// `exp`, in milliseconds.
    pub(crate) expires_at: Millis,
    /// `rooms`: the rights per room.
    pub(crate) grants: RoomGrants,
}

/// Where the keys come from, to load them again when the JWKS file changes.
#[derive(Debug, Clone, Default)]
struct KeySources {
    secret: String,
    public_key_file: Option<PathBuf>,
    jwks_file: Option<PathBuf>,
}

impl KeySources {
    fn load(&self) -> Result<KeySet, String> {
        let mut keys = KeySet::default();
        if !self.secret.is_empty() {
            keys.add_secret(&self.secret)?;
        }
        if let Some(p) = &self.public_key_file {
            keys.add_pem_file(p)?;
        }
        if let Some(p) = &self.jwks_file {
            let json =
                std::fs::read(p).map_err(|e| format!("jwt_jwks_file {}: {e}", p.display()))?;
            keys.add_jwks(&json, &format!("jwt_jwks_file {}", p.display()))?;
        }
        Ok(keys)
    }
}

/// Checks tokens against the configured keys.
pub(crate) struct TokenVerifier {
    sources: KeySources,
    keys: RwLock<Arc<KeySet>>,
    /// Audience and issuer checks; the algorithm is set per token.
    validation: Validation,
}

impl TokenVerifier {
    /// The verifier `config` asks for: `Ok(None)` without any `jwt_*` key
    /// (development mode), an error naming the setting that cannot be used.
    pub(crate) fn from_config(config: &ServerConfig) -> Result<Option<TokenVerifier>, String> {
        let sources = KeySources {
            secret: config.jwt_secret.clone(),
            public_key_file: config.jwt_public_key_file.clone(),
            jwks_file: config.jwt_jwks_file.clone(),
        };
        if sources.secret.is_empty()
            && sources.public_key_file.is_none()
            && sources.jwks_file.is_none()
        {
            return Ok(None);
        }
        // One backend is compiled in; naming it keeps jsonwebtoken from
        // having to guess. Err: installed already.
        let _ = jsonwebtoken::crypto::rust_crypto::DEFAULT_PROVIDER.install_default();
        let keys = sources.load()?;
        // Expiry and `nbf` are checked against the caller's clock (see `verify`).
        let mut validation = Validation {
            validate_exp: false,
            validate_nbf: false,
            ..Validation::default()
        };
        let mut required = vec!["exp", "sub"];
        validation.validate_aud = !config.jwt_audience.is_empty();
        if validation.validate_aud {
            validation.set_audience(&[&config.jwt_audience]);
            required.push("aud");
        }
        if !config.jwt_issuer.is_empty() {
            validation.set_issuer(&[&config.jwt_issuer]);
            required.push("iss");
        }
        validation.set_required_spec_claims(&required);
        Ok(Some(TokenVerifier {
            sources,
            keys: RwLock::new(Arc::new(keys)),
            validation,
        }))
    }

    /// A verifier that refuses every token: what a node whose configured
    /// keys cannot be loaded runs with (it fails closed, never open).
    pub(crate) fn refusing_all() -> TokenVerifier {
        TokenVerifier {
            sources: KeySources::default(),
            keys: RwLock::new(Arc::new(KeySet::default())),
            validation: Validation::default(),
        }
    }

    /// The JWKS file to watch, if any.
    pub(crate) fn jwks_file(&self) -> Option<&PathBuf> {
        self.sources.jwks_file.as_ref()
    }

    /// Loads every key again (the JWKS file changed); on failure the keys in
    /// use stay.
    pub(crate) fn reload(&self) -> Result<(), String> {
        let keys = self.sources.load()?;
        *self.keys.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(keys);
        Ok(())
    }

    /// Verifies `token` at time `now`: its signature against a configured
    /// key, its algorithm, audience, issuer, expiry and claims.
    pub(crate) fn verify(&self, token: &str, now: Millis) -> Result<Identity, RoomError> {
        let invalid = |m: String| RoomError::new(ErrorCode::TokenInvalid, m);
        if token.len() > MAX_TOKEN_BYTES {
            return Err(invalid(format!(
                "the token has {} bytes, at most {MAX_TOKEN_BYTES} are accepted",
                token.len()
            )));
        }
        let header = decode_header(token)
            .map_err(|e| invalid(format!("not a signed token (JWS compact form): {e}")))?;
        let keys = self.keys.read().unwrap_or_else(|p| p.into_inner()).clone();
        let mut validation = self.validation.clone();
        validation.algorithms = vec![header.alg];
        let mut tried = false;
        let mut claims = None;
        for key in keys.candidates(&header) {
            tried = true;
            match decode::<Claims>(token, key, &validation) {
                Ok(data) => {
                    claims = Some(data.claims);
                    break;
                }
                Err(e) if matches!(e.kind(), ErrorKind::InvalidSignature) => continue,
                Err(e) => return Err(invalid(describe(e.kind()))),
            }
        }
        let Some(claims) = claims else {
            return Err(invalid(if tried {
                "the signature does not verify with any configured key".into()
            } else {
                match &header.kid {
                    Some(kid) => format!("no configured key for alg {:?}, kid {kid:?}", header.alg),
                    None => format!("no configured key for alg {:?}", header.alg),
                }
            }));
        };
        claims.into_identity(now, NBF_LEEWAY_MS)
    }
}

fn describe(kind: &ErrorKind) -> String {
    match kind {
        ErrorKind::MissingRequiredClaim(c) => format!("the token has no {c:?} claim"),
        ErrorKind::InvalidAudience => "the token is for another audience (aud)".into(),
        ErrorKind::InvalidIssuer => "the token is from another issuer (iss)".into(),
        ErrorKind::InvalidAlgorithm => "the key does not verify this algorithm".into(),
        ErrorKind::Json(e) => format!("invalid claims: {e}"),
        ErrorKind::InvalidClaimFormat(c) => format!("claim {c:?} has the wrong type"),
        ErrorKind::Base64(_) | ErrorKind::Utf8(_) | ErrorKind::InvalidToken => {
            "the token is not well formed".into()
        }
        other => format!("the token does not verify: {other:?}"),
    }
}

/// The `token` parameter of a query string (`/v1/ws?token=...`), decoded.
pub(crate) fn query_token(query: Option<&str>) -> Option<String> {
    query?
        .split('&')
        .filter_map(|pair| pair.split_once('='))
        .find(|(k, _)| *k == "token")
        .map(|(_, v)| {
            percent_encoding::percent_decode_str(&v.replace('+', " "))
                .decode_utf8_lossy()
                .into_owned()
        })
}

/// Watches the JWKS file of `verifier`, if any, while it lives.
/// `reloads` and `failures` count the changes that did and did not load.
pub(crate) fn spawn_jwks_watch(
    verifier: &Arc<TokenVerifier>,
    reloads: metrics::Counter,
    failures: metrics::Counter,
) {
    if verifier.jwks_file().is_some() {
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            let counts = watch::ReloadCounts { reloads, failures };
            rt.spawn(watch::watch_jwks(Arc::downgrade(verifier), counts));
        }
    }
}
