//! Durable webhooks' last resort: a room whose log holds entries whose
//! events were never queued (its only host died right after appending) is
//! hosted here for a while, so that its replica applies those entries and
//! queues their events. Rooms with a live host queue their own.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use crate::Node;

/// How often the broker is asked which rooms lag.
const SWEEP_EVERY: Duration = Duration::from_secs(5);

impl Node {
    /// Starts the sweep (cluster mode with durable webhooks only).
    pub(crate) fn sweep_webhook_rooms(self: &Arc<Self>) {
        let durable = self.webhooks().is_some_and(|w| w.is_durable());
        let Some(cluster) = self.cluster().cloned().filter(|_| durable) else {
            return;
        };
        let node = Arc::downgrade(self);
        let token = self.shutdown_token();
        tokio::spawn(async move {
            // A room's marks at the previous sweep: a room lags only when
            // they did not move for a whole sweep (a busy room's cursor
            // trails its log by a moment).
            let mut seen: HashMap<String, (u64, u64)> = HashMap::new();
            let mut every = tokio::time::interval(SWEEP_EVERY);
            every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tokio::select! {
                    _ = every.tick() => {}
                    () = token.cancelled() => return,
                }
                let Some(streams) = cluster.webhook_streams() else {
                    return;
                };
                let lagging = match streams.lagging_rooms().await {
                    Ok(l) => l,
                    Err(e) => {
                        tracing::debug!(error = %e, "webhook sweep: rooms not read");
                        continue;
                    }
                };
                let Some(node) = node.upgrade() else { return };
                let mut now_seen = HashMap::new();
                for (room, n, wh) in lagging {
                    if seen.get(&room) == Some(&(n, wh)) && !node.hosts(&room) {
                        tracing::info!(%room, n, wh, "hosting a room to queue its webhooks");
                        if let Err(e) = node.existing_room(&room).await {
                            tracing::debug!(%room, error = %e, "webhook sweep: room not hosted");
                        }
                    }
                    now_seen.insert(room, (n, wh));
                }
                seen = now_seen;
            }
        });
    }
}
