//! Members across nodes: the count other nodes show, and members of nodes
//! that died.

use super::*;

impl Replica {
    /// Publishes the member count: to this node's summaries, and (from the
    /// ticker, when it changed) to the registry, where nodes that do not host
    /// the room read it.
    pub(super) fn count_members(&mut self) {
        let Some(m) = &self.machine else { return };
        let count = m.room().connected();
        self.members.store(count, Ordering::Relaxed);
        if self.members_recorded == Some(count) || !self.is_ticker() {
            return;
        }
        self.members_recorded = Some(count);
        let cluster = self.cluster.clone();
        let id = self.id.clone();
        let at = self.applied;
        tokio::spawn(async move {
            if let Err(e) = cluster.set_room_members(&id, count as u64, at).await {
                // Shown again with the next change; meanwhile other nodes show the old count.
                tracing::debug!(room = %id, error = %e, "member count not recorded");
            }
        });
    }

    /// Asks the broker whether the nodes this room's members are on are
    /// alive, and appends `NodeDown` for each dead one.
    pub(super) fn check_nodes(&self) {
        let Some(m) = &self.machine else { return };
        let nodes: BTreeSet<&str> = m
            .room()
            .connected_sinks()
            .map(|s| &*s.node)
            .filter(|n| *n != &*self.me)
            .collect();
        let nodes: Vec<String> = nodes.into_iter().map(str::to_owned).collect();
        if nodes.is_empty() {
            return;
        }
        let cluster = self.cluster.clone();
        let id = self.id.clone();
        let me = self.me.to_string();
        tokio::spawn(async move {
            let Ok(alive) = cluster.nodes_alive(&nodes).await else {
                return;
            };
            for (node, alive) in nodes.into_iter().zip(alive) {
                if !alive {
                    tracing::info!(room = %id, node = %node, "node is gone: disconnecting its members");
                    let record = LogRecord {
                        node: me.clone(),
                        conn: 0,
                        req: 0,
                        intent: Intent::NodeDown { node },
                    };
                    let _ = cluster.append(&id, record.encode()).await;
                }
            }
        });
    }
}
