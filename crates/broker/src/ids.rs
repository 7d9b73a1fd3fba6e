use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use rand::RngCore;

fn random_token(bytes: usize) -> String {
    let mut buf = vec![0u8; bytes];
    rand::rng().fill_bytes(&mut buf);
    URL_SAFE_NO_PAD.encode(buf)
}

/// A ticket token: 192 bits from the OS-seeded CSPRNG.
pub fn new_ticket_token() -> String {
    random_token(24)
}

/// A resume token: 192 bits, a secret that lets its holder continue a session.
pub fn new_resume_token() -> String {
    random_token(24)
}

/// Whether `s` has the form of a resume token [`new_resume_token`] makes:
/// 32 characters of the URL-safe base64 alphabet. Anything else names no
/// session, and can be refused without looking.
pub fn is_resume_token(s: &str) -> bool {
    s.len() == 32
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

/// A session id: public (others address `direct` messages to it), so 64 bits
/// suffice to be unique without being a secret.
pub fn new_session_id() -> String {
    random_token(8)
}

/// A random room epoch below 2^53, so JavaScript clients read it exactly.
pub fn new_epoch() -> u64 {
    rand::rng().next_u64() >> 11
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    #[test]
    fn tokens_are_long_distinct_and_url_safe() {
        let t: HashSet<String> = (0..1000).map(|_| new_ticket_token()).collect();
        assert_eq!(t.len(), 1000);
        for s in &t {
            assert_eq!(s.len(), 32);
            assert!(s
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_'));
        }
        assert_eq!(new_session_id().len(), 11);
        assert!((0..1000).all(|_| is_resume_token(&new_resume_token())));
        for bad in [
            "",
            "short",
            &"A".repeat(31),
            &"A".repeat(33),
            &format!("{}=", "A".repeat(31)),
            &format!("{}+", "A".repeat(31)),
        ] {
            assert!(!is_resume_token(bad), "{bad:?}");
        }
        assert!((0..1000).all(|_| new_epoch() < 1 << 53));
    }
}
