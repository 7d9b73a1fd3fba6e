//! The keys tokens are checked against: an HMAC secret, a PEM public key and
//! the keys of a JWKS file, with the algorithms each may verify.

use std::path::Path;

use jsonwebtoken::jwk::{AlgorithmParameters, EllipticCurve, JwkSet};
use jsonwebtoken::{Algorithm, DecodingKey, Header};

/// The shortest HMAC secret accepted: RFC 7518 §3.2 asks for at least the
/// hash's size (256 bits for HS256); a shorter one can be guessed offline
/// from any token.
pub const MIN_SECRET_LEN: usize = 32;

/// One key and the algorithms a token signed with it may name.
pub(crate) struct VerifyingKey {
    /// The JWKS `kid`, if any.
    kid: Option<String>,
    key: DecodingKey,
    algorithms: Vec<Algorithm>,
}

/// Every configured key.
#[derive(Default)]
pub(crate) struct KeySet {
    keys: Vec<VerifyingKey>,
}

impl KeySet {
    /// Adds the HMAC secret (HS256, HS384, HS512).
    pub(crate) fn add_secret(&mut self, secret: &str) -> Result<(), String> {
        if secret.len() < MIN_SECRET_LEN {
            return Err(format!(
                "jwt_secret has {} bytes; at least {MIN_SECRET_LEN} are needed",
                secret.len()
            ));
        }
        self.keys.push(VerifyingKey {
            kid: None,
            key: DecodingKey::from_secret(secret.as_bytes()),
            algorithms: vec![Algorithm::HS256, Algorithm::HS384, Algorithm::HS512],
        });
        Ok(())
    }

    /// Adds the public key in a PEM file: RSA (RS256/384/512, PS256/384/512),
    /// EC P-256 or P-384 (ES256, ES384) or Ed25519 (EdDSA).
    pub(crate) fn add_pem_file(&mut self, path: &Path) -> Result<(), String> {
        let pem = std::fs::read(path)
            .map_err(|e| format!("jwt_public_key_file {}: {e}", path.display()))?;
        let (key, algorithms) = if let Ok(k) = DecodingKey::from_rsa_pem(&pem) {
            (k, rsa_algorithms())
        } else if let Ok(k) = DecodingKey::from_ec_pem(&pem) {
            (k, vec![Algorithm::ES256, Algorithm::ES384])
        } else if let Ok(k) = DecodingKey::from_ed_pem(&pem) {
            (k, vec![Algorithm::EdDSA])
        } else {
            return Err(format!(
                "jwt_public_key_file {}: not a PEM public key (RSA, EC or Ed25519)",
                path.display()
            ));
        };
        self.keys.push(VerifyingKey {
            kid: None,
            key,
            algorithms,
        });
        Ok(())
    }

    /// Adds the signing keys of a JWKS document (RFC 7517). Keys of other
    /// kinds or uses (encryption, Ed448, P-521) are skipped; a document
    /// without one usable key is an error.
    pub(crate) fn add_jwks(&mut self, json: &[u8], what: &str) -> Result<(), String> {
        let set: JwkSet = serde_json::from_slice(json).map_err(|e| format!("{what}: {e}"))?;
        let before = self.keys.len();
        for jwk in &set.keys {
            let algorithms = match &jwk.algorithm {
                AlgorithmParameters::RSA(_) => rsa_algorithms(),
                AlgorithmParameters::EllipticCurve(p) => match p.curve {
                    EllipticCurve::P256 => vec![Algorithm::ES256],
                    EllipticCurve::P384 => vec![Algorithm::ES384],
                    _ => continue,
                },
                AlgorithmParameters::OctetKeyPair(p) if p.curve == EllipticCurve::Ed25519 => {
                    vec![Algorithm::EdDSA]
                }
                AlgorithmParameters::OctetKey(_) => {
                    vec![Algorithm::HS256, Algorithm::HS384, Algorithm::HS512]
                }
                _ => continue,
            };
            // A key that names its algorithm verifies that one only.
            let algorithms = match jwk.common.key_algorithm.map(Algorithm::try_from) {
                Some(Ok(a)) if algorithms.contains(&a) => vec![a],
                Some(_) => continue,
                None => algorithms,
            };
            if jwk
                .common
                .public_key_use
                .as_ref()
                .is_some_and(|u| *u != jsonwebtoken::jwk::PublicKeyUse::Signature)
            {
                continue;
            }
            let Ok(key) = DecodingKey::from_jwk(jwk) else {
                continue;
            };
            self.keys.push(VerifyingKey {
                kid: jwk.common.key_id.clone(),
                key,
                algorithms,
            });
        }
        if self.keys.len() == before {
            return Err(format!("{what}: no signing key this server can use"));
        }
        Ok(())
    }

    /// The keys that may verify a token with this header, among those for
    /// its algorithm: a key with a `kid` verifies only tokens without one or
    /// naming it; keys without a `kid` (the secret, the PEM key) verify any.
    pub(crate) fn candidates<'a>(
        &'a self,
        header: &'a Header,
    ) -> impl Iterator<Item = &'a DecodingKey> + 'a {
        self.keys
            .iter()
            .filter(move |k| match (&header.kid, &k.kid) {
                (Some(wanted), Some(kid)) => wanted == kid,
                _ => true,
            })
            .filter(move |k| k.algorithms.contains(&header.alg))
            .map(|k| &k.key)
    }
}

fn rsa_algorithms() -> Vec<Algorithm> {
    vec![
        Algorithm::RS256,
        Algorithm::RS384,
        Algorithm::RS512,
        Algorithm::PS256,
        Algorithm::PS384,
        Algorithm::PS512,
    ]
}
