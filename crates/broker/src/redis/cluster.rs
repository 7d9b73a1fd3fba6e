//! [`Cluster`] on Redis: registry, logs, snapshots, subscriptions, liveness.

use std::sync::atomic::Ordering;

use ::redis::Value;
use async_trait::async_trait;
use bytes::Bytes;

use super::appender::AppendRequest;
use super::errors::unavailable;
use super::scripts::{CREATE_ROOM, DELETE_ROOM, SET_ROOM_MEMBERS, STORE_SNAPSHOT};
use super::wire::parse_entries;
use super::RedisBroker;
use crate::{AppendFuture, Cluster, ClusterError, LogEntry, LogListener};

impl RedisBroker {
    /// Every listed room id: from the one registry set, or on a Redis
    /// Cluster from each part of it.
    pub(super) async fn room_ids(&self) -> Result<Vec<String>, ClusterError> {
        self.room_id_parts()
            .await
            .into_iter()
            .try_fold(Vec::new(), |mut ids, part| {
                ids.extend(part?);
                Ok(ids)
            })
    }

    /// The room ids of each part of the registry, each read on its own: on
    /// a Redis Cluster a part on a shard without a primary fails alone.
    pub(super) async fn room_id_parts(&self) -> Vec<Result<Vec<String>, ClusterError>> {
        let sets = match self.on_cluster() {
            true => self.keys.rooms_parts(),
            false => vec![self.keys.rooms()],
        };
        let reads = sets.into_iter().map(|set| {
            let mut members = ::redis::cmd("SMEMBERS");
            members.arg(set);
            members
        });
        self.query_each_settled(reads.collect()).await
    }
}

fn not_found(room: &str) -> ClusterError {
    ClusterError::RoomNotFound(room.to_owned())
}

#[async_trait]
impl Cluster for RedisBroker {
    fn node_id(&self) -> &str {
        &self.config.node_id
    }

    async fn create_room(
        &self,
        id: &str,
        meta: Bytes,
        snapshot: Bytes,
    ) -> Result<bool, ClusterError> {
        self.check_member()?;
        let k = &self.keys;
        let mut call = CREATE_ROOM.prepare_invoke();
        call.key(k.room(id)).key(k.log(id)).key(k.snapshot(id));
        if self.on_cluster() {
            // Listed first: a listed room without keys is skipped by
            // readers, a room with keys but not listed would be lost.
            let mut add = ::redis::cmd("SADD");
            add.arg(k.rooms_part(id)).arg(id);
            let _: i64 = self.query(&add).await?;
        } else {
            call.key(k.rooms());
        }
        call.arg(id)
            .arg(&meta[..])
            .arg(&snapshot[..])
            .arg(crate::new_ticket_token());
        self.invoke(&call).await
    }

    async fn room_meta(&self, id: &str) -> Result<Option<Bytes>, ClusterError> {
        self.check_member()?;
        let mut get = ::redis::cmd("HGET");
        get.arg(self.keys.room(id)).arg("meta");
        let meta: Option<Vec<u8>> = self.query(&get).await?;
        Ok(meta.map(Bytes::from))
    }

    async fn list_rooms(&self) -> Result<Vec<(String, Bytes)>, ClusterError> {
        self.check_member()?;
        let ids = self.room_ids().await?;
        let gets = ids.iter().map(|id| {
            let mut get = ::redis::cmd("HGET");
            get.arg(self.keys.room(id)).arg("meta");
            get
        });
        let metas: Vec<Option<Vec<u8>>> = self.query_each(gets.collect()).await?;
        // A room deleted between the two round trips has no meta: skip it.
        Ok(ids
            .into_iter()
            .zip(metas)
            .filter_map(|(id, meta)| Some((id, Bytes::from(meta?))))
            .collect())
    }

    async fn list_reachable_rooms(&self) -> Result<crate::RoomListing, ClusterError> {
        self.check_member()?;
        if !self.on_cluster() {
            let rooms = self.list_rooms().await?;
            return Ok(crate::RoomListing {
                rooms,
                complete: true,
            });
        }
        let parts = self.room_id_parts().await;
        let mut complete = true;
        let mut ids = Vec::new();
        let mut first_error = None;
        for part in parts {
            match part {
                Ok(part) => ids.extend(part),
                Err(e) => {
                    complete = false;
                    first_error.get_or_insert(e);
                }
            }
        }
        if ids.is_empty() {
            if let Some(e) = first_error {
                // Nothing could be read: that is an outage, not a listing.
                return Err(e);
            }
        }
        let gets = ids.iter().map(|id| {
            let mut get = ::redis::cmd("HGET");
            get.arg(self.keys.room(id)).arg("meta");
            get
        });
        let metas: Vec<Result<Option<Vec<u8>>, ClusterError>> =
            self.query_each_settled(gets.collect()).await;
        let mut rooms = Vec::with_capacity(ids.len());
        for (id, meta) in ids.into_iter().zip(metas) {
            match meta {
                Ok(Some(meta)) => rooms.push((id, Bytes::from(meta))),
                // Deleted between the two reads.
                Ok(None) => {}
                Err(_) => complete = false,
            }
        }
        Ok(crate::RoomListing { rooms, complete })
    }

    async fn set_room_members(&self, id: &str, members: u64, at: u64) -> Result<(), ClusterError> {
        self.check_member()?;
        let mut call = SET_ROOM_MEMBERS.prepare_invoke();
        call.key(self.keys.room(id)).arg(members).arg(at);
        // -1 (no such room): nothing to count, and nothing to report.
        let _: i64 = self.invoke(&call).await?;
        Ok(())
    }

    async fn room_members(&self, ids: &[String]) -> Result<Vec<u64>, ClusterError> {
        self.check_member()?;
        let gets = ids.iter().map(|id| {
            let mut get = ::redis::cmd("HGET");
            get.arg(self.keys.room(id)).arg("members");
            get
        });
        let counts: Vec<Option<u64>> = self.query_each(gets.collect()).await?;
        Ok(counts.into_iter().map(|c| c.unwrap_or(0)).collect())
    }

    async fn delete_room(&self, id: &str) -> Result<bool, ClusterError> {
        self.check_member()?;
        let k = &self.keys;
        let mut call = DELETE_ROOM.prepare_invoke();
        call.key(k.room(id)).key(k.log(id)).key(k.snapshot(id));
        if !self.on_cluster() {
            call.key(k.rooms());
        }
        call.arg(id);
        let existed = self.invoke(&call).await?;
        if self.on_cluster() {
            // Unlisted after the keys are gone (see create_room).
            let mut remove = ::redis::cmd("SREM");
            remove.arg(k.rooms_part(id)).arg(id);
            let _: i64 = self.query(&remove).await?;
        }
        Ok(existed)
    }

    fn append(&self, room: &str, payload: Bytes) -> AppendFuture {
        if let Err(e) = self.check_member() {
            return Box::pin(std::future::ready(Err(e)));
        }
        let request = AppendRequest {
            room: room.to_owned(),
            meta_key: self.keys.room(room),
            log_key: self.keys.log(room),
            channel: self.keys.channel(room),
            payload,
        };
        self.appender.append(request)
    }

    async fn read(
        &self,
        room: &str,
        after: u64,
        limit: usize,
    ) -> Result<Vec<LogEntry>, ClusterError> {
        self.check_member()?;
        let Some(first) = after.checked_add(1) else {
            return Ok(Vec::new());
        };
        let mut pipe = ::redis::pipe();
        pipe.cmd("EXISTS").arg(self.keys.room(room));
        // The last entry confirmed by WAIT (broker_ack replicas:N), before
        // the range: every entry up to it is replicated.
        pipe.cmd("HGET").arg(self.keys.room(room)).arg("r");
        // COUNT at least 1, so a trimmed start is seen even for limit 0.
        pipe.cmd("XRANGE")
            .arg(self.keys.log(room))
            .arg(format!("{first}-0"))
            .arg("+")
            .arg("COUNT")
            .arg(limit.max(1));
        let (exists, confirmed, range): (bool, Option<u64>, Value) = self.query_pipe(&pipe).await?;
        if !exists {
            return Err(not_found(room));
        }
        let mut entries = parse_entries(range).map_err(unavailable)?;
        if entries.first().is_some_and(|e| e.n != first) {
            return Err(ClusterError::Trimmed(room.to_owned()));
        }
        if let Some(confirmed) = confirmed {
            // Not yet known to be on enough replicas: nobody sees it yet.
            entries.retain(|e| e.n <= confirmed);
        }
        entries.truncate(limit);
        Ok(entries)
    }

    async fn store_snapshot(
        &self,
        room: &str,
        n: u64,
        snapshot: Bytes,
    ) -> Result<(), ClusterError> {
        self.check_member()?;
        let mut call = STORE_SNAPSHOT.prepare_invoke();
        call.key(self.keys.room(room))
            .key(self.keys.snapshot(room))
            .arg(n)
            .arg(&snapshot[..]);
        let stored: i64 = self.invoke(&call).await?;
        if stored < 0 {
            return Err(not_found(room));
        }
        Ok(())
    }

    async fn load_snapshot(&self, room: &str) -> Result<Option<(u64, Bytes)>, ClusterError> {
        self.check_member()?;
        let mut get = ::redis::cmd("HMGET");
        get.arg(self.keys.snapshot(room)).arg("n").arg("data");
        let snapshot: (Option<u64>, Option<Vec<u8>>) = self.query(&get).await?;
        match snapshot {
            (Some(n), Some(data)) => Ok(Some((n, Bytes::from(data)))),
            _ => Ok(None),
        }
    }

    async fn subscribe(&self, room: &str, listener: LogListener) -> Result<(), ClusterError> {
        self.check_member()?;
        self.subscriber
            .subscribe(self.keys.channel(room), true, listener)
            .await
    }

    async fn unsubscribe(&self, room: &str) {
        self.subscriber.unsubscribe(self.keys.channel(room)).await;
    }

    async fn publish_control(&self, payload: Bytes) -> Result<(), ClusterError> {
        self.check_member()?;
        // The framing of room channels, at position 0 and time 0: one decoder.
        let mut message = Vec::with_capacity(16 + payload.len());
        message.extend_from_slice(&[0; 16]);
        message.extend_from_slice(&payload);
        let mut publish = ::redis::cmd("PUBLISH");
        publish.arg(self.keys.control()).arg(message);
        let _: i64 = self.query(&publish).await?;
        Ok(())
    }

    async fn subscribe_control(&self, listener: LogListener) -> Result<(), ClusterError> {
        self.check_member()?;
        self.subscriber
            .subscribe(self.keys.control(), false, listener)
            .await
    }

    fn webhook_streams(&self) -> Option<&dyn crate::WebhookStreams> {
        Some(self)
    }

    async fn nodes_alive(&self, nodes: &[String]) -> Result<Vec<bool>, ClusterError> {
        self.check_member()?;
        let checks = nodes.iter().map(|node| {
            let mut exists = ::redis::cmd("EXISTS");
            exists.arg(self.keys.node(node));
            exists
        });
        self.query_each(checks.collect()).await
    }

    async fn leave(&self) {
        if self.left.swap(true, Ordering::AcqRel) {
            return;
        }
        self.stop.cancel();
        let heartbeat = self
            .heartbeat
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        if let Some(heartbeat) = heartbeat {
            let _ = heartbeat.await;
        }
        let mut del = ::redis::cmd("DEL");
        del.arg(self.keys.node(&self.config.node_id));
        if let Err(e) = self.query::<()>(&del).await {
            // The key still expires after NODE_TTL_MS.
            tracing::warn!("could not remove the heartbeat on leaving: {e}");
        }
    }

    async fn ready(&self) -> bool {
        !self.left.load(Ordering::Acquire) && self.ping().await
    }
}
