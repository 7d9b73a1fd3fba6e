//! Where a replica's member is connected.

use std::sync::Arc;

use crate::outbox::Outbox;

/// A member's connection as every replica knows it: node and connection
/// number. Only the replica on that node also holds the connection's outbox.
#[derive(Debug, Clone)]
pub(crate) struct Sink {
    pub(crate) node: Arc<str>,
    pub(crate) conn: u64,
    pub(crate) outbox: Option<Outbox>,
}

impl Sink {
    /// Whether this is the connection `conn` of `node`.
    pub(crate) fn is(&self, node: &str, conn: u64) -> bool {
        self.conn == conn && *self.node == *node
    }

    /// The form kept in snapshots: `node/conn`.
    pub(crate) fn owner(&self) -> String {
        format!("{}/{}", self.node, self.conn)
    }

    /// Parses [`Sink::owner`]'s form; the outbox is looked up by the caller.
    pub(crate) fn from_owner(owner: &str) -> Sink {
        let (node, conn) = match owner.rsplit_once('/') {
            Some((node, conn)) => (node, conn.parse().unwrap_or(0)),
            None => (owner, 0),
        };
        Sink {
            node: node.into(),
            conn,
            outbox: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn owner_round_trips() {
        let s = Sink {
            node: "node-a".into(),
            conn: 42,
            outbox: None,
        };
        let back = Sink::from_owner(&s.owner());
        assert!(back.is("node-a", 42));
        assert!(!back.is("node-a", 41));
        assert!(!back.is("node-b", 42));
    }
}
