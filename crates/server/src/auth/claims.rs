//! The claims Plaza reads from a token, and the identity they make.

use std::collections::BTreeMap;

use plaza_core::{Millis, Rights, RoomError, RoomGrants};
use plaza_protocol::ErrorCode;
use serde::Deserialize;

use super::Identity;

/// A token's claims. Others (`iat`, `jti`, the application's own) are
/// allowed and ignored; `aud` and `iss` are checked by the verifier.
#[derive(Debug, Deserialize)]
pub(crate) struct Claims {
    /// The user id.
    sub: String,
    /// Expiry, seconds since the Unix epoch (a JSON number, RFC 7519 §2).
    exp: f64,
    /// Not before, the same unit.
    #[serde(default)]
    nbf: Option<f64>,
    /// Display name.
    #[serde(default)]
    name: Option<String>,
    /// Rights per room: room id, `prefix*` or `*` to a list of rights.
    #[serde(default)]
    rooms: BTreeMap<String, Vec<String>>,
}

impl Claims {
    /// The identity these claims make at time `now`, or why they make none.
    pub(crate) fn into_identity(
        self,
        now: Millis,
        nbf_leeway: Millis,
    ) -> Result<Identity, RoomError> {
        let invalid = |m: String| RoomError::new(ErrorCode::TokenInvalid, m);
        if self.sub.is_empty() || self.sub.len() > 128 {
            return Err(invalid("sub must have 1 to 128 bytes".into()));
        }
        if let Some(n) = &self.name {
            if n.is_empty() || n.len() > 64 {
                return Err(invalid("name must have 1 to 64 bytes".into()));
            }
        }
        let expires_at = to_millis(self.exp).ok_or_else(|| invalid("exp is not a time".into()))?;
        if expires_at <= now {
            return Err(RoomError::new(
                ErrorCode::TokenExpired,
                format!("the token expired at {expires_at} (now {now})"),
            ));
        }
        if let Some(nbf) = self.nbf {
            let nbf = to_millis(nbf).ok_or_else(|| invalid("nbf is not a time".into()))?;
            if nbf > now.saturating_add(nbf_leeway) {
                return Err(invalid(format!("the token is not valid before {nbf}")));
            }
        }
        let mut entries = Vec::with_capacity(self.rooms.len());
        for (room, rights) in self.rooms {
            if room.is_empty() {
                return Err(invalid("rooms has an empty room name".into()));
            }
            let rights =
                Rights::parse(&rights).map_err(|e| invalid(format!("rooms.{room}: {e}")))?;
            entries.push((room, rights));
        }
        Ok(Identity {
            user: self.sub,
            name: self.name,
            expires_at,
            grants: RoomGrants::new(entries),
        })
    }
}

/// Seconds (possibly fractional) to milliseconds, if a plausible time.
fn to_millis(seconds: f64) -> Option<Millis> {
    // Up to the year 2554: beyond, a "time" is a mistake, not a grant.
    (seconds.is_finite() && (0.0..=18_446_744_073.0).contains(&seconds))
        .then_some((seconds * 1000.0) as Millis)
}

#[cfg(test)]
mod tests {
    use super::*;
    use plaza_core::Right;

    fn claims(v: serde_json::Value) -> Result<Claims, serde_json::Error> {
        serde_json::from_value(v)
    }

    const NOW: Millis = 1_764_000_000_000;

    #[test]
    fn a_full_token_makes_an_identity() {
        let c = claims(serde_json::json!({
            "sub": "u-42", "name": "Ann", "exp": 1_764_000_060, "iat": 1, "custom": {"x": 1},
            "rooms": {"lobby": ["join", "publish:main"], "team-*": ["*"]}
        }))
        .unwrap();
        let id = c.into_identity(NOW, 0).unwrap();
        assert_eq!(id.user, "u-42");
        assert_eq!(id.name.as_deref(), Some("Ann"));
        assert_eq!(id.expires_at, 1_764_000_060_000);
        let lobby = id.grants.for_room("lobby").unwrap();
        assert!(lobby.may(Right::Join) && lobby.may_publish("main") && !lobby.may_publish("xr"));
        assert!(id.grants.for_room("team-x").unwrap().may(Right::Admin));
        assert!(id.grants.for_room("other").is_none());
    }

    #[test]
    fn expiry_is_exact_and_fractional_seconds_count() {
        let at = |exp: f64| {
            claims(serde_json::json!({"sub": "u", "exp": exp}))
                .unwrap()
                .into_identity(NOW, 0)
        };
        assert_eq!(
            at(1_764_000_000.0).unwrap_err().code,
            ErrorCode::TokenExpired
        );
        assert_eq!(at(1_764_000_000.5).unwrap().expires_at, NOW + 500);
        assert_eq!(at(-1.0).unwrap_err().code, ErrorCode::TokenInvalid);
        assert_eq!(at(1e300).unwrap_err().code, ErrorCode::TokenInvalid);
    }

    #[test]
    fn nbf_in_the_future_beyond_the_leeway_is_refused() {
        let with_nbf = |nbf: u64| {
            claims(serde_json::json!({"sub": "u", "exp": 1_764_000_600, "nbf": nbf}))
                .unwrap()
                .into_identity(NOW, 30_000)
        };
        assert!(with_nbf(1_764_000_030).is_ok());
        let e = with_nbf(1_764_000_031).unwrap_err();
        assert_eq!(e.code, ErrorCode::TokenInvalid);
        assert!(e.message.contains("not valid before"));
    }

    #[test]
    fn claims_of_the_wrong_type_do_not_parse() {
        for bad in [
            serde_json::json!({"sub": 42, "exp": 1_764_000_600}),
            serde_json::json!({"sub": "u", "exp": "tomorrow"}),
            serde_json::json!({"sub": "u", "exp": 1_764_000_600, "rooms": ["lobby"]}),
            serde_json::json!({"sub": "u", "exp": 1_764_000_600, "rooms": {"lobby": "join"}}),
            serde_json::json!({"sub": "u", "exp": 1_764_000_600, "name": 7}),
        ] {
            assert!(claims(bad.clone()).is_err(), "{bad}");
        }
    }

    #[test]
    fn bad_values_are_refused_with_what_is_wrong() {
        let refuse = |v: serde_json::Value| claims(v).unwrap().into_identity(NOW, 0).unwrap_err();
        let e = refuse(serde_json::json!({"sub": "", "exp": 1_764_000_600}));
        assert!(e.message.contains("sub"));
        let e = refuse(serde_json::json!({"sub": "u", "exp": 1_764_000_600, "name": ""}));
        assert!(e.message.contains("name"));
        let e = refuse(
            serde_json::json!({"sub": "u", "exp": 1_764_000_600, "rooms": {"lobby": ["jion"]}}),
        );
        assert!(e.message.contains("rooms.lobby") && e.message.contains("jion"));
        let e =
            refuse(serde_json::json!({"sub": "u", "exp": 1_764_000_600, "rooms": {"": ["join"]}}));
        assert!(e.message.contains("empty room"));
    }
}
