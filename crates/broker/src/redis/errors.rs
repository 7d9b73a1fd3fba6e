use std::future::Future;
use std::time::Duration;

use ::redis::aio::ConnectionManager;
use ::redis::RedisResult;
use tokio::time::{timeout_at, Instant};

use crate::ClusterError;

pub(super) fn unavailable(e: impl std::fmt::Display) -> ClusterError {
    ClusterError::Unavailable(e.to_string())
}

fn too_slow(timeout: Duration) -> ClusterError {
    ClusterError::Unavailable(format!("no answer from redis within {timeout:?}"))
}

/// Runs one Redis call, failing with [`ClusterError::Unavailable`] on any
/// Redis error and when it takes longer than `timeout` (the connection's own
/// response timeout does not cover waiting for a reconnect).
pub(super) async fn guarded<T>(
    timeout: Duration,
    call: impl Future<Output = RedisResult<T>>,
) -> Result<T, ClusterError> {
    match tokio::time::timeout(timeout, call).await {
        Ok(result) => result.map_err(unavailable),
        Err(_) => Err(too_slow(timeout)),
    }
}

/// Like [`guarded`], on a clone of `conn`. A call that found the connection
/// refused never reached Redis, and the refusal made the manager start a new
/// connection: it is tried once more within the same time budget, so the
/// first call after an outage does not fail when Redis is back already.
pub(super) async fn on_manager<T, Fut>(
    timeout: Duration,
    conn: &ConnectionManager,
    call: impl Fn(ConnectionManager) -> Fut,
) -> Result<T, ClusterError>
where
    Fut: Future<Output = RedisResult<T>>,
{
    let deadline = Instant::now() + timeout;
    let result = match timeout_at(deadline, call(conn.clone())).await {
        Ok(Err(e)) if e.is_connection_refusal() => timeout_at(deadline, call(conn.clone())).await,
        result => result,
    };
    match result {
        Ok(result) => result.map_err(unavailable),
        Err(_) => Err(too_slow(timeout)),
    }
}
