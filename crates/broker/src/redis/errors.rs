use std::future::Future;
use std::time::Duration;

use ::redis::{ErrorKind, RedisError, RedisResult, ServerErrorKind};
use tokio::time::{timeout_at, Instant};

use super::connect::Conn;
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

/// Like [`guarded`], on a clone of `conn`.
///
/// On one server: a call that found the connection refused never reached
/// Redis, and the refusal made the manager start a new connection: it is
/// tried once more within the same time budget, so the first call after an
/// outage does not fail when Redis is back already.
///
/// On a Redis Cluster, the call is made again, within the same budget, for
/// every answer that says it did not run: a redirection (`MOVED`: the slot
/// has another primary, which the cluster connection now learns; `ASK`: its
/// keys are moving, sent to the importing server after `ASKING`), a slot
/// being migrated or a failover in progress (`TRYAGAIN`, `CLUSTERDOWN`,
/// `MASTERDOWN`, `READONLY`, `LOADING`), a refused connection, and a broken
/// one (a primary that died): that may have run the command, so only calls
/// that answer the same when made twice go through here (the append task
/// has its own routing, [`super::shards`]).
pub(super) async fn on_conn<T, Fut>(
    timeout: Duration,
    conn: &Conn,
    call: impl Fn(Conn) -> Fut,
) -> Result<T, ClusterError>
where
    Fut: Future<Output = RedisResult<T>>,
{
    let deadline = Instant::now() + timeout;
    let outcome = match conn {
        Conn::Single(_) => match timeout_at(deadline, call(conn.clone())).await {
            Ok(Err(e)) if e.is_connection_refusal() => {
                timeout_at(deadline, call(conn.clone())).await
            }
            result => result,
        },
        Conn::Cluster(_) | Conn::Asking { .. } => {
            timeout_at(deadline, redirected(conn, &call)).await
        }
    };
    match outcome {
        Ok(result) => result.map_err(unavailable),
        Err(_) => Err(too_slow(timeout)),
    }
}

/// The first pause before a call on a Redis Cluster is made again, doubled
/// each time up to [`MOST_BACKOFF`].
const LEAST_BACKOFF: Duration = Duration::from_millis(5);
const MOST_BACKOFF: Duration = Duration::from_millis(200);

/// What to do after a cluster call failed with `e`.
enum Next {
    /// Again at the importing server `ASK` named.
    Ask(Conn),
    /// Again after a pause, routed by slot.
    Pause,
    /// Give up: Redis refused it.
    Fail,
}

fn after_failure(conn: &Conn, e: &RedisError) -> Next {
    match e.kind() {
        ErrorKind::Server(ServerErrorKind::Ask) => ask_target(e)
            .and_then(|addr| conn.asking(&addr))
            .map_or(Next::Pause, Next::Ask),
        ErrorKind::Server(
            ServerErrorKind::Moved
            | ServerErrorKind::TryAgain
            | ServerErrorKind::ClusterDown
            | ServerErrorKind::MasterDown
            | ServerErrorKind::ReadOnly
            | ServerErrorKind::BusyLoading,
        )
        | ErrorKind::ClusterConnectionNotFound => Next::Pause,
        _ if e.is_io_error() => Next::Pause,
        _ => Next::Fail,
    }
}

/// The server an `ASK` answer names: from the error itself, or for a
/// pipeline (whose error lists its commands' failures, `Ask: 5439
/// 127.0.0.1:7001` each) from the first of them. A pipeline's commands are
/// all on one slot, so they are all sent on together.
fn ask_target(e: &RedisError) -> Option<String> {
    if let Some((addr, _slot)) = e.redirect_node() {
        return Some(addr.to_owned());
    }
    let text = e.to_string();
    let (_, rest) = text.split_once("Ask: ")?;
    let mut words = rest.split(|c: char| c.is_whitespace() || c == ')' || c == ',');
    let _slot = words.next()?;
    let addr = words.next()?;
    addr.contains(':').then(|| addr.to_owned())
}

/// Makes the call until it did not fail with an answer that says it did not
/// run (the caller bounds the time).
async fn redirected<T, Fut>(conn: &Conn, call: &impl Fn(Conn) -> Fut) -> RedisResult<T>
where
    Fut: Future<Output = RedisResult<T>>,
{
    // An ASK redirection holds for one call only; the next goes by slot.
    let routed = conn.routed();
    let mut target = conn.clone();
    let mut backoff = LEAST_BACKOFF;
    loop {
        let e = match call(target.clone()).await {
            Ok(value) => return Ok(value),
            Err(e) => e,
        };
        match after_failure(&routed, &e) {
            Next::Ask(asking) => target = asking,
            Next::Pause => {
                tracing::debug!("redis cluster call made again: {e}");
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(MOST_BACKOFF);
                target = routed.clone();
            }
            Next::Fail => return Err(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_ask_names_its_server_alone_or_inside_a_pipeline_failure() {
        let one = RedisError::from((
            ErrorKind::Server(ServerErrorKind::Ask),
            "An error was signalled by the server",
            "5439 127.0.0.1:38211".to_owned(),
        ));
        let text = format!("{one}");
        assert!(ask_target(&one).is_some(), "{text}");
        // The text of a pipeline's failure, as redis 1.8 writes it.
        let piped = RedisError::from((
            ErrorKind::Server(ServerErrorKind::Ask),
            "Pipeline failures",
            "[(Index 0, error: Ask: 5439 127.0.0.1:38211), (Index 1, error: Ask: 5439 \
             127.0.0.1:38211)]"
                .to_owned(),
        ));
        assert_eq!(ask_target(&piped).as_deref(), Some("127.0.0.1:38211"));
    }
}
