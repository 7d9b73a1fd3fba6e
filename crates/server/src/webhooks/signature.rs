//! Standard Webhooks signatures (<https://www.standardwebhooks.com>): the
//! secret `whsec_<base64>`, and `v1,<base64 HMAC-SHA256 of "{id}.{timestamp}.{body}">`.

use base64::alphabet;
use base64::engine::general_purpose::{GeneralPurpose, GeneralPurposeConfig, STANDARD};
use base64::engine::DecodePaddingMode;
use base64::Engine as _;
use hmac::{Hmac, Mac};
use sha2::Sha256;

/// The prefix of a secret.
pub(crate) const SECRET_PREFIX: &str = "whsec_";
/// The fewest key bytes a secret may hold.
pub(crate) const MIN_KEY_BYTES: usize = 24;
/// The most key bytes a secret may hold.
pub(crate) const MAX_KEY_BYTES: usize = 64;

/// Standard base64, padded or not.
const LENIENT: GeneralPurpose = GeneralPurpose::new(
    &alphabet::STANDARD,
    GeneralPurposeConfig::new().with_decode_padding_mode(DecodePaddingMode::Indifferent),
);

/// A target's signing key (the decoded part of `whsec_...`).
#[derive(Clone)]
pub(crate) struct Secret(Box<[u8]>);

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(..)")
    }
}

impl Secret {
    /// Reads `whsec_<base64 of 24 to 64 bytes>`; the error says what is wrong
    /// and never repeats the secret.
    pub(crate) fn parse(text: &str) -> Result<Secret, String> {
        if text.is_empty() {
            return Err(
                "is required (whsec_ and the base64 of 24 to 64 random bytes, \
                        e.g. `echo whsec_$(openssl rand -base64 32)`)"
                    .into(),
            );
        }
        let Some(b64) = text.strip_prefix(SECRET_PREFIX) else {
            return Err(format!("must start with {SECRET_PREFIX}"));
        };
        let key = LENIENT
            .decode(b64)
            .map_err(|_| format!("is not {SECRET_PREFIX} followed by base64"))?;
        if !(MIN_KEY_BYTES..=MAX_KEY_BYTES).contains(&key.len()) {
            return Err(format!(
                "must hold from {MIN_KEY_BYTES} to {MAX_KEY_BYTES} bytes, not {}",
                key.len()
            ));
        }
        Ok(Secret(key.into_boxed_slice()))
    }

    /// The `webhook-signature` header of message `id` sent at `timestamp`
    /// (Unix seconds) with `body`.
    pub(crate) fn sign(&self, id: &str, timestamp: u64, body: &[u8]) -> String {
        let mut mac = Hmac::<Sha256>::new_from_slice(&self.0).expect("HMAC takes any key length");
        mac.update(id.as_bytes());
        mac.update(b".");
        mac.update(timestamp.to_string().as_bytes());
        mac.update(b".");
        mac.update(body);
        format!("v1,{}", STANDARD.encode(mac.finalize().into_bytes()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The example of the Standard Webhooks specification's reference
    /// libraries (`webhooks/standard-webhooks`, the `test_sign_function` test).
    #[test]
    fn signs_as_the_reference_libraries() {
        let s = Secret::parse("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw").unwrap();
        let sig = s.sign(
            "msg_p5jXN8AQM9LWM0D4loKWxJek",
            1614265330,
            br#"{"test": 2432232314}"#,
        );
        assert_eq!(sig, "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=");
    }

    #[test]
    fn malformed_secrets_are_refused_without_echoing_them() {
        let bad = |s: &str| Secret::parse(s).unwrap_err();
        assert!(bad("").starts_with("is required"));
        assert_eq!(
            bad("MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"),
            "must start with whsec_"
        );
        assert_eq!(bad("whsec_not base64!"), "is not whsec_ followed by base64");
        // 23 and 65 bytes.
        let b = |n: usize| format!("whsec_{}", STANDARD.encode(vec![7u8; n]));
        assert_eq!(bad(&b(23)), "must hold from 24 to 64 bytes, not 23");
        assert_eq!(bad(&b(65)), "must hold from 24 to 64 bytes, not 65");
        assert!(Secret::parse(&b(24)).is_ok());
        assert!(Secret::parse(&b(64)).is_ok());
        // Padding is optional.
        let padded = b(25);
        assert!(padded.ends_with('='));
        assert!(Secret::parse(padded.trim_end_matches('=')).is_ok());
        assert!(Secret::parse(&padded).is_ok());
        assert_eq!(
            format!("{:?}", Secret::parse(&b(24)).unwrap()),
            "Secret(..)"
        );
    }
}
