//! `broker_ack`: when an append to Redis counts as done.

use std::fmt;
use std::str::FromStr;

/// The most replicas [`BrokerAck::Replicas`] may wait for: more than any
/// sensible Sentinel deployment has, and a typo such as `replicas:100`
/// is refused rather than failing every append.
pub const MAX_ACK_REPLICAS: u8 = 16;

/// When a cluster node takes an append as done (the `broker_ack` setting).
/// Every node of a cluster should use the same one.
///
/// Written `primary` or `replicas:N` (N from 1 to [`MAX_ACK_REPLICAS`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(try_from = "String", into = "String")]
pub enum BrokerAck {
    /// Once the primary has the entry (one atomic script: append and
    /// publish). Redis replicates asynchronously: a failover can lose the
    /// entries its replicas had not received yet.
    #[default]
    Primary,
    /// Once `WAIT N` confirms that N replicas have the entry. Members are
    /// told of an entry (pub/sub, and log reads) only after that; an
    /// append that is not confirmed within the wait fails as unavailable.
    Replicas(u8),
}

impl BrokerAck {
    /// The replicas an append waits for (0 for [`BrokerAck::Primary`]).
    pub fn replicas(self) -> u8 {
        match self {
            BrokerAck::Primary => 0,
            BrokerAck::Replicas(n) => n,
        }
    }
}

impl fmt::Display for BrokerAck {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BrokerAck::Primary => f.write_str("primary"),
            BrokerAck::Replicas(n) => write!(f, "replicas:{n}"),
        }
    }
}

impl FromStr for BrokerAck {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let refuse = || {
            format!(
                "broker_ack must be primary or replicas:N with N from 1 to {MAX_ACK_REPLICAS}, \
                 not {s:?}"
            )
        };
        let s = s.trim();
        if s == "primary" {
            return Ok(BrokerAck::Primary);
        }
        let n = s.strip_prefix("replicas:").ok_or_else(refuse)?;
        match n.parse::<u8>() {
            Ok(n) if (1..=MAX_ACK_REPLICAS).contains(&n) => Ok(BrokerAck::Replicas(n)),
            _ => Err(refuse()),
        }
    }
}

impl TryFrom<String> for BrokerAck {
    type Error = String;

    fn try_from(s: String) -> Result<Self, String> {
        s.parse()
    }
}

impl From<BrokerAck> for String {
    fn from(ack: BrokerAck) -> String {
        ack.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_and_writes_both_forms() {
        for (text, ack) in [
            ("primary", BrokerAck::Primary),
            ("replicas:1", BrokerAck::Replicas(1)),
            ("replicas:16", BrokerAck::Replicas(16)),
        ] {
            assert_eq!(text.parse::<BrokerAck>(), Ok(ack));
            assert_eq!(ack.to_string(), text);
        }
        assert_eq!(BrokerAck::default(), BrokerAck::Primary);
    }

    #[test]
    fn refuses_what_is_out_of_bounds_or_misspelt() {
        for bad in [
            "",
            "replicas",
            "replicas:",
            "replicas:0",
            "replicas:17",
            "replicas:-1",
            "replicas:x",
            "Primary",
            "all",
        ] {
            let e = bad.parse::<BrokerAck>().unwrap_err();
            assert_eq!(
                e,
                format!(
                    "broker_ack must be primary or replicas:N with N from 1 to 16, not {bad:?}"
                )
            );
        }
    }
}
