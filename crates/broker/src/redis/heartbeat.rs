//! The node's heartbeat key, renewed every [`NODE_HEARTBEAT_MS`].

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::connect::{Commands, Conn};
use super::errors::on_conn;
use super::RedisConfig;
use crate::{ClusterError, NODE_HEARTBEAT_MS, NODE_TTL_MS};

/// Renews the key once. Its value (the node's clock) is only for people
/// reading Redis; liveness is the key's existence.
pub(super) async fn beat(conn: &Conn, key: &str, timeout: Duration) -> Result<(), ClusterError> {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    let mut set = ::redis::cmd("SET");
    set.arg(key).arg(now).arg("PX").arg(NODE_TTL_MS);
    let set = &set;
    on_conn(timeout, conn, |mut conn| async move {
        set.exec_async(&mut conn).await
    })
    .await
}

/// Renews the key until `stop`. A missed beat is only logged: the next one
/// may succeed well before the key expires.
pub(super) fn start(
    conn: Arc<Commands>,
    key: String,
    config: &RedisConfig,
    stop: CancellationToken,
) -> JoinHandle<()> {
    let timeout = config.timeout;
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_millis(NODE_HEARTBEAT_MS));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        tick.tick().await;
        loop {
            tokio::select! {
                biased;
                _ = stop.cancelled() => return,
                _ = tick.tick() => {}
            }
            // Not raced against `stop`: `leave` waits for this task, so no
            // beat can land after its DEL.
            if let Err(e) = beat(&conn.get(), &key, timeout).await {
                tracing::warn!("heartbeat of {key} failed: {e}");
            }
        }
    })
}
