//! Durable webhook queues in Redis: a stream per target, a consumer group
//! `plaza` read by the node holding the target's lease, and a cursor per
//! room (`wh` in its meta hash) so that the replicas of a room enqueue each
//! of its events once.
//!
//! On a Redis Cluster a room and a target are in different slots, so one
//! script cannot do both: each target keeps its own cursor per room, next to
//! its queue, and the room's cursor moves after every target took its
//! records (see `webhook_enqueue_target.lua`).

use ::redis::Value;
use async_trait::async_trait;
use bytes::Bytes;

use super::errors::unavailable;
use super::scripts::{WEBHOOK_ENQUEUE, WEBHOOK_ENQUEUE_TARGET, WEBHOOK_LEASE, WEBHOOK_MARK};
use super::RedisBroker;
use crate::{ClusterError, QueuedWebhook, WebhookRecord, WebhookStreams};

/// The consumer group every node reads a target's stream in.
const GROUP: &str = "plaza";

#[async_trait]
impl WebhookStreams for RedisBroker {
    async fn enqueue(
        &self,
        room: &str,
        upto: u64,
        records: &[WebhookRecord],
    ) -> Result<Vec<String>, ClusterError> {
        self.check_member()?;
        if self.on_cluster() {
            return self.enqueue_by_target(room, upto, records).await;
        }
        let mut targets: Vec<&str> = Vec::new();
        let mut call = WEBHOOK_ENQUEUE.prepare_invoke();
        call.key(self.keys.room(room));
        for r in records {
            if !targets.contains(&r.target.as_str()) {
                targets.push(&r.target);
                call.key(self.keys.webhook_stream(&r.target));
            }
        }
        call.arg(upto).arg(room).arg(records.len());
        for r in records {
            let k = targets.iter().position(|t| *t == r.target).expect("listed") + 2;
            call.arg(r.position)
                .arg(k)
                .arg(r.max)
                .arg(&r.id)
                .arg(&r.body[..])
                .arg(r.ts);
        }
        let dropped: Vec<usize> = self.invoke(&call).await?;
        Ok(dropped
            .into_iter()
            .filter_map(|k| targets.get(k.wrapping_sub(2)).map(|t| (*t).to_owned()))
            .collect())
    }

    async fn lease(&self, target: &str, ttl_ms: u64) -> Result<bool, ClusterError> {
        self.check_member()?;
        let mut call = WEBHOOK_LEASE.prepare_invoke();
        call.key(self.keys.webhook_lease(target))
            .arg(&self.config.node_id)
            .arg(ttl_ms);
        let held: i64 = self.invoke(&call).await?;
        Ok(held == 1)
    }

    async fn claim(
        &self,
        target: &str,
        cursor: &str,
        count: usize,
    ) -> Result<(Vec<QueuedWebhook>, String), ClusterError> {
        self.check_member()?;
        self.ensure_group(target).await?;
        let mut cmd = ::redis::cmd("XAUTOCLAIM");
        cmd.arg(self.keys.webhook_stream(target))
            .arg(GROUP)
            .arg(&self.config.node_id)
            .arg(0)
            .arg(cursor)
            .arg("COUNT")
            .arg(count.max(1));
        let reply: Value = self.query(&cmd).await?;
        let Value::Array(mut parts) = reply else {
            return Err(unavailable(format!("XAUTOCLAIM answered {reply:?}")));
        };
        if parts.len() < 2 {
            return Err(unavailable("XAUTOCLAIM answered too little"));
        }
        let entries = parts.swap_remove(1);
        let next = text(parts.swap_remove(0)).unwrap_or_else(|| "0-0".to_owned());
        Ok((records(entries)?, next))
    }

    async fn read(&self, target: &str, count: usize) -> Result<Vec<QueuedWebhook>, ClusterError> {
        self.check_member()?;
        self.ensure_group(target).await?;
        let mut cmd = ::redis::cmd("XREADGROUP");
        cmd.arg("GROUP")
            .arg(GROUP)
            .arg(&self.config.node_id)
            .arg("COUNT")
            .arg(count.max(1))
            .arg("STREAMS")
            .arg(self.keys.webhook_stream(target))
            .arg(">");
        let reply: Value = self.query(&cmd).await?;
        // [[stream, [entries]]], or nil when nothing is new.
        let Value::Array(mut streams) = reply else {
            return Ok(Vec::new());
        };
        let Some(Value::Array(mut stream)) = streams.pop() else {
            return Ok(Vec::new());
        };
        match stream.pop() {
            Some(entries) => records(entries),
            None => Ok(Vec::new()),
        }
    }

    async fn ack(&self, target: &str, stream_ids: &[String]) -> Result<(), ClusterError> {
        if stream_ids.is_empty() {
            return Ok(());
        }
        self.check_member()?;
        let key = self.keys.webhook_stream(target);
        let mut pipe = ::redis::pipe();
        pipe.cmd("XACK")
            .arg(&key)
            .arg(GROUP)
            .arg(stream_ids)
            .ignore();
        pipe.cmd("XDEL").arg(&key).arg(stream_ids).ignore();
        self.query_pipe::<()>(&pipe).await
    }

    async fn depth(&self, target: &str) -> Result<u64, ClusterError> {
        self.check_member()?;
        let mut cmd = ::redis::cmd("XLEN");
        cmd.arg(self.keys.webhook_stream(target));
        self.query(&cmd).await
    }

    async fn lagging_rooms(&self) -> Result<Vec<(String, u64, u64)>, ClusterError> {
        self.check_member()?;
        // The sweep takes what it can reach: rooms on a shard without a
        // primary (or registry parts there) wait for a later sweep, and
        // hold up no other room.
        let parts = self.room_id_parts().await;
        let reachable = parts.iter().filter(|p| p.is_ok()).count();
        let mut ids: Vec<String> = Vec::new();
        for part in parts {
            match part {
                Ok(part) => ids.extend(part),
                Err(e) if reachable == 0 => return Err(e),
                Err(e) => tracing::debug!("a part of the room registry is unreachable: {e}"),
            }
        }
        let reads = ids.iter().map(|id| {
            let mut read = ::redis::cmd("HMGET");
            read.arg(self.keys.room(id)).arg("n").arg("wh");
            read
        });
        let marks: Vec<Result<(Option<u64>, Option<u64>), ClusterError>> =
            self.query_each_settled(reads.collect()).await;
        Ok(ids
            .into_iter()
            .zip(marks)
            .filter_map(|(id, marks)| {
                let (n, wh) = marks.ok()?;
                let (n, wh) = (n?, wh.unwrap_or(0));
                (n > wh).then_some((id, n, wh))
            })
            .collect())
    }
}

impl RedisBroker {
    /// [`WebhookStreams::enqueue`] on a Redis Cluster: one call per target,
    /// then the room's cursor.
    async fn enqueue_by_target(
        &self,
        room: &str,
        upto: u64,
        records: &[WebhookRecord],
    ) -> Result<Vec<String>, ClusterError> {
        let mut exists = ::redis::cmd("EXISTS");
        exists.arg(self.keys.room(room));
        let exists: bool = self.query(&exists).await?;
        let mut targets: Vec<&str> = Vec::new();
        for r in records {
            if !targets.contains(&r.target.as_str()) {
                targets.push(&r.target);
            }
        }
        let mut dropped = Vec::new();
        for target in targets {
            let mine: Vec<&WebhookRecord> = records.iter().filter(|r| r.target == target).collect();
            let mut call = WEBHOOK_ENQUEUE_TARGET.prepare_invoke();
            call.key(self.keys.webhook_stream(target))
                .key(self.keys.webhook_cursors(target))
                .arg(upto)
                .arg(room)
                .arg(if exists { "1" } else { "0" })
                .arg(mine.len());
            for r in mine {
                call.arg(r.position)
                    .arg(r.max)
                    .arg(&r.id)
                    .arg(&r.body[..])
                    .arg(r.ts);
            }
            let full: usize = self.invoke(&call).await?;
            dropped.extend(std::iter::repeat_n(target.to_owned(), full));
        }
        if exists {
            let mut mark = WEBHOOK_MARK.prepare_invoke();
            mark.key(self.keys.room(room)).arg(upto);
            let _: i64 = self.invoke(&mark).await?;
        }
        Ok(dropped)
    }

    /// Creates the target's stream and group unless they exist.
    async fn ensure_group(&self, target: &str) -> Result<(), ClusterError> {
        let mut cmd = ::redis::cmd("XGROUP");
        cmd.arg("CREATE")
            .arg(self.keys.webhook_stream(target))
            .arg(GROUP)
            .arg("0")
            .arg("MKSTREAM");
        match self.query::<()>(&cmd).await {
            Ok(()) => Ok(()),
            Err(ClusterError::Unavailable(e)) if e.contains("BUSYGROUP") => Ok(()),
            Err(e) => Err(e),
        }
    }
}

fn text(v: Value) -> Option<String> {
    match v {
        Value::BulkString(b) => String::from_utf8(b).ok(),
        Value::SimpleString(s) => Some(s),
        _ => None,
    }
}

/// Stream entries `[[id, [field, value, ...]], ...]` as records; entries
/// deleted meanwhile (nil fields) are skipped.
fn records(entries: Value) -> Result<Vec<QueuedWebhook>, ClusterError> {
    let Value::Array(entries) = entries else {
        return Ok(Vec::new());
    };
    let mut out = Vec::with_capacity(entries.len());
    for entry in entries {
        let Value::Array(mut parts) = entry else {
            continue;
        };
        if parts.len() != 2 {
            continue;
        }
        let fields = parts.pop().expect("two parts");
        let Some(stream_id) = parts.pop().and_then(text) else {
            continue;
        };
        let Value::Array(fields) = fields else {
            continue;
        };
        let (mut id, mut room, mut body, mut ts) = (None, None, None, 0u64);
        let mut fields = fields.into_iter();
        while let (Some(name), Some(value)) = (fields.next(), fields.next()) {
            match text(name).as_deref() {
                Some("i") => id = text(value),
                Some("r") => room = text(value),
                Some("b") => {
                    body = match value {
                        Value::BulkString(b) => Some(Bytes::from(b)),
                        other => text(other).map(Bytes::from),
                    }
                }
                Some("t") => ts = text(value).and_then(|t| t.parse().ok()).unwrap_or(0),
                _ => {}
            }
        }
        if let (Some(id), Some(room), Some(body)) = (id, room, body) {
            out.push(QueuedWebhook {
                stream_id,
                id,
                room,
                body,
                ts,
            });
        }
    }
    Ok(out)
}
