/// How many sets the room registry is split into on a Redis Cluster, each
/// its own hash tag: no one shard holds (or is asked for) every room id.
pub(super) const REGISTRY_PARTS: u32 = 16;

/// Names of the keys and channels of one key prefix (layout in the module
/// docs of [`super`]).
#[derive(Debug, Clone)]
pub(super) struct Keys {
    prefix: String,
    /// The layout for a Redis Cluster: a split registry, and webhook keys
    /// that share their target's hash tag.
    cluster: bool,
}

impl Keys {
    pub(super) fn new(prefix: &str, cluster: bool) -> Self {
        Self {
            prefix: prefix.to_owned(),
            cluster,
        }
    }

    /// On a Redis Cluster: the registry set room `id` is listed in.
    pub(super) fn rooms_part(&self, id: &str) -> String {
        // FNV-1a: stable across versions and platforms, unlike std's hasher.
        let hash = id.bytes().fold(0x811c_9dc5_u32, |h, b| {
            (h ^ u32::from(b)).wrapping_mul(0x0100_0193)
        });
        self.rooms_part_at(hash % REGISTRY_PARTS)
    }

    /// On a Redis Cluster: every registry set.
    pub(super) fn rooms_parts(&self) -> Vec<String> {
        (0..REGISTRY_PARTS).map(|i| self.rooms_part_at(i)).collect()
    }

    fn rooms_part_at(&self, i: u32) -> String {
        format!("{}rooms:{{{i}}}", self.prefix)
    }

    /// A webhook target's name as it appears in its keys: between braces
    /// on a Redis Cluster, so that its queue, lease and cursors share a slot.
    fn target(&self, target: &str) -> String {
        match self.cluster {
            true => format!("{{{target}}}"),
            false => target.to_owned(),
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
        format!("{}webhooks:{}", self.prefix, self.target(target))
    }

    /// Which node reads a webhook target's queue.
    pub(super) fn webhook_lease(&self, target: &str) -> String {
        format!("{}webhooks:{}:lease", self.prefix, self.target(target))
    }

    /// On a Redis Cluster: the last log position of each room whose records
    /// are in a webhook target's queue.
    pub(super) fn webhook_cursors(&self, target: &str) -> String {
        format!("{}webhooks:{}:cursors", self.prefix, self.target(target))
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
        let k = Keys::new("plaza:", false);
        assert_eq!(k.room("lobby"), "plaza:room:{lobby}");
        assert_eq!(k.log("lobby"), "plaza:room:{lobby}:log");
        assert_eq!(k.snapshot("lobby"), "plaza:room:{lobby}:snap");
        assert_eq!(k.channel("lobby"), "plaza:room:{lobby}:ch");
        assert_eq!(k.rooms(), "plaza:rooms");
        assert_eq!(k.node("n1"), "plaza:node:n1");
        assert_eq!(k.ticket("t"), "plaza:ticket:t");
    }

    #[test]
    fn on_a_cluster_the_registry_is_split_and_webhook_keys_share_a_tag() {
        let k = Keys::new("plaza:", true);
        assert_eq!(k.rooms_parts().len(), REGISTRY_PARTS as usize);
        assert!(k.rooms_parts().contains(&k.rooms_part("lobby")));
        // Stable: a room stays in its set across versions.
        assert_eq!(k.rooms_part("lobby"), k.rooms_part("lobby"));
        let used: std::collections::HashSet<String> = (0..200)
            .map(|i| k.rooms_part(&format!("room-{i}")))
            .collect();
        assert_eq!(
            used.len(),
            REGISTRY_PARTS as usize,
            "ids spread over every set"
        );
        assert_eq!(
            k.webhook_stream("https://h/x"),
            "plaza:webhooks:{https://h/x}"
        );
        assert_eq!(k.webhook_lease("t"), "plaza:webhooks:{t}:lease");
        assert_eq!(k.webhook_cursors("t"), "plaza:webhooks:{t}:cursors");
        let single = Keys::new("plaza:", false);
        assert_eq!(single.webhook_stream("t"), "plaza:webhooks:t");
    }

    #[test]
    fn meta_log_and_snapshot_keys_never_collide_across_rooms() {
        // Meta keys end in '}', logs in 'g', snapshots in 'p': an id with
        // braces or suffixes in it cannot name another room's key.
        let k = Keys::new("p:", false);
        let ids = ["a", "a}:log", "a}:snap", "a}", "{a", ""];
        let mut all = std::collections::HashSet::new();
        for id in ids {
            assert!(all.insert(k.room(id)));
            assert!(all.insert(k.log(id)));
            assert!(all.insert(k.snapshot(id)));
        }
    }
}
