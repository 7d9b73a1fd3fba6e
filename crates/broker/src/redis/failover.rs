//! Following the primary across Sentinel failovers.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::connect::{self, Commands, Conn, Servers};
use super::endpoint::Primary;
use super::subscriber::Subscriber;
use super::RedisConfig;

/// How often the Sentinels are asked where the primary is. A failover takes
/// Sentinel's `down-after-milliseconds` and an election, seconds in all;
/// this adds at most half a second to it. Each question costs one command
/// on a kept connection to a Sentinel and one short connection to the
/// primary named (the redis crate checks its role).
pub(super) const FOLLOW_INTERVAL: Duration = Duration::from_millis(500);

/// Asks the Sentinels until `stop`; when they name a new primary, moves the
/// command and pub/sub connections to it, then tells the append task
/// through `primary`.
pub(super) async fn follow(
    mut sentinels: Primary,
    primary: watch::Sender<Servers>,
    commands: Arc<Commands>,
    subscriber: Arc<Subscriber>,
    config: RedisConfig,
    stop: CancellationToken,
) {
    let mut tick = tokio::time::interval(FOLLOW_INTERVAL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            biased;
            _ = stop.cancelled() => return,
            _ = tick.tick() => {}
        }
        let found = tokio::select! {
            biased;
            _ = stop.cancelled() => return,
            found = sentinels.find(config.timeout) => found,
        };
        let found = match found {
            Ok(found) => found,
            Err(e) => {
                tracing::debug!("asking the Sentinels failed: {e}");
                continue;
            }
        };
        let current = match &*primary.borrow() {
            Servers::Primary(info) => info.addr().clone(),
            // Never sent: a Redis Cluster has no Sentinels.
            Servers::Cluster(_) => return,
        };
        if *found.addr() == current {
            continue;
        }
        tracing::warn!(from = %current, to = %found.addr(), "the Sentinels name a new redis primary; reconnecting");
        // Anything failing here is tried again on the next tick: the
        // Sentinels will still name this server.
        let conn = match connect::command_manager(&found, &config).await {
            Ok(conn) => Conn::Single(conn),
            Err(e) => {
                tracing::warn!("connecting to the new primary {}: {e}", found.addr());
                continue;
            }
        };
        if let Err(e) = subscriber.reconnect(&found, &config).await {
            tracing::warn!("subscribing on the new primary {}: {e}", found.addr());
            continue;
        }
        commands.replace(conn);
        primary.send_replace(Servers::Primary(found));
    }
}
