/// Names of the keys and channels of one key prefix (layout in the module
/// docs of [`super`]).
#[derive(Debug, Clone)]
pub(super) struct Keys {
    prefix: String,
}

impl Keys {
    pub(super) fn new(prefix: &str) -> Self {
        Self {
            prefix: prefix.to_owned(),
        }
    }

    /// The room's meta hash. Its braces make the room id the hash tag.
    pub(super) fn room(&self, id: &str) -> String {
        format!("{}room:{{{id}}}", self.prefix)
    }

    pub(super) fn log(&self, id: &str) -> String {
        format!("{}room:{{{id}}}:log", self.prefix)
    }

    pub(super) fn snapshot(&self, id: &str) -> String {
        format!("{}room:{{{id}}}:snap", self.prefix)
    }

    pub(super) fn channel(&self, id: &str) -> String {
        format!("{}room:{{{id}}}:ch", self.prefix)
    }

    /// The channel of control messages to every node.
    pub(super) fn control(&self) -> String {
        format!("{}control", self.prefix)
    }

    /// A webhook target's durable queue.
    pub(super) fn webhook_stream(&self, target: &str) -> String {
        format!("{}webhooks:{target}", self.prefix)
    }

    /// Which node reads a webhook target's queue.
    pub(super) fn webhook_lease(&self, target: &str) -> String {
        format!("{}webhooks:{target}:lease", self.prefix)
    }

    pub(super) fn rooms(&self) -> String {
        format!("{}rooms", self.prefix)
    }

    pub(super) fn node(&self, id: &str) -> String {
        format!("{}node:{id}", self.prefix)
    }

    pub(super) fn ticket(&self, token: &str) -> String {
        format!("{}ticket:{token}", self.prefix)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_rooms_keys_share_its_hash_tag() {
        let k = Keys::new("plaza:");
        assert_eq!(k.room("lobby"), "plaza:room:{lobby}");
        assert_eq!(k.log("lobby"), "plaza:room:{lobby}:log");
        assert_eq!(k.snapshot("lobby"), "plaza:room:{lobby}:snap");
        assert_eq!(k.channel("lobby"), "plaza:room:{lobby}:ch");
        assert_eq!(k.rooms(), "plaza:rooms");
        assert_eq!(k.node("n1"), "plaza:node:n1");
        assert_eq!(k.ticket("t"), "plaza:ticket:t");
    }

    #[test]
    fn meta_log_and_snapshot_keys_never_collide_across_rooms() {
        // Meta keys end in '}', logs in 'g', snapshots in 'p': an id with
        // braces or suffixes in it cannot name another room's key.
        let k = Keys::new("p:");
        let ids = ["a", "a}:log", "a}:snap", "a}", "{a", ""];
        let mut all = std::collections::HashSet::new();
        for id in ids {
            assert!(all.insert(k.room(id)));
            assert!(all.insert(k.log(id)));
            assert!(all.insert(k.snapshot(id)));
        }
    }
}
