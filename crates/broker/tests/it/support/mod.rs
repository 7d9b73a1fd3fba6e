//! Helpers shared by the broker's integration tests.

#![allow(dead_code)]

pub mod redis;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use plaza_broker::{ClusterError, LogEntry, LogListener, LogNotice, RedisBroker, RedisConfig};
use tokio::sync::mpsc;

use self::redis::RedisServer;

/// A bound on anything awaited: a guard against hangs, never a wait.
pub const GUARD: Duration = Duration::from_secs(15);

/// Node `id` of the cluster in `server`.
pub async fn redis_node(server: &RedisServer, id: &str, log_capacity: usize) -> Arc<RedisBroker> {
    let config = RedisConfig::new(server.url(), id).with_log_capacity(log_capacity);
    guard(RedisBroker::connect_with(config))
        .await
        .expect("connect to the test redis")
}

pub fn data(s: &str) -> Bytes {
    Bytes::copy_from_slice(s.as_bytes())
}

pub async fn guard<T>(call: impl Future<Output = T>) -> T {
    tokio::time::timeout(GUARD, call)
        .await
        .expect("call did not finish in time")
}

/// A listener forwarding `(tag, notice)` to `tx`.
pub fn tagged(tag: &str, tx: &mpsc::UnboundedSender<(String, LogNotice)>) -> LogListener {
    let (tag, tx) = (tag.to_owned(), tx.clone());
    Arc::new(move |notice| {
        let _ = tx.send((tag.clone(), notice));
    })
}

/// A listener and the notices it gets.
pub fn listener() -> (LogListener, mpsc::UnboundedReceiver<LogNotice>) {
    let (tx, rx) = mpsc::unbounded_channel();
    let listener: LogListener = Arc::new(move |notice| {
        let _ = tx.send(notice);
    });
    (listener, rx)
}

pub fn unavailable<T: std::fmt::Debug>(result: Result<T, ClusterError>) -> bool {
    matches!(result, Err(ClusterError::Unavailable(_)))
}

/// Awaits a call that must answer within a few seconds even when the broker
/// is gone (far less than [`GUARD`]).
pub async fn fast<T>(call: impl Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(5), call)
        .await
        .expect("call did not fail fast")
}

pub async fn next<T>(rx: &mut mpsc::UnboundedReceiver<T>) -> T {
    guard(rx.recv()).await.expect("listener gone")
}

pub fn entry(notice: LogNotice) -> LogEntry {
    match notice {
        LogNotice::Entry(e) => e,
        other => panic!("expected an entry, got {other:?}"),
    }
}
