//! A replica's log: appending this node's commands (retrying those that must
//! land), applying entries in order exactly once, catching up over gaps,
//! telling a log that went back, and storing snapshots.

use super::*;

impl Replica {
    /// Appends a record; its outcome comes when the log delivers it back.
    pub(super) fn submit(
        &mut self,
        conn: u64,
        intent: Intent,
        pending: Option<Pending>,
        must_land: bool,
    ) {
        self.next_req += 1;
        let req = self.next_req;
        if let Some(p) = pending {
            self.pending.insert(req, p);
        }
        let record = LogRecord {
            node: self.me.to_string(),
            conn,
            req,
            intent,
        }
        .encode();
        self.append(req, record, must_land);
    }

    pub(super) fn append(&self, req: u64, record: bytes::Bytes, must_land: bool) {
        // Called here, in command order: appends from one node keep their order.
        let append = self.cluster.append(&self.id, record.clone());
        let notices = self.notices_tx.downgrade();
        tokio::spawn(async move {
            if let Err(error) = append.await {
                let failure = AppendFailure {
                    req,
                    error,
                    retry: must_land.then_some(record),
                };
                if let Some(tx) = notices.upgrade() {
                    let _ = tx.send(Notice::AppendFailed(failure)).await;
                }
            }
        });
    }

    pub(super) fn append_retries(&mut self) {
        for record in std::mem::take(&mut self.retry) {
            self.append(0, record, true);
        }
    }

    pub(super) fn on_append_failed(&mut self, f: AppendFailure) {
        if let Some(record) = f.retry {
            self.retry.push(record);
        }
        if self.barrier == Some(f.req) {
            // Nothing will tell the skipped commands from the others.
            self.barrier = None;
            self.restart_skipped(f.req);
        }
        if let Some(p) = self.pending.remove(&f.req) {
            p.refuse(&self.id, f.error.into(), &self.errors);
        }
    }

    /// A log entry from the subscription.
    pub(super) fn on_entry(&mut self, e: LogEntry) {
        if self.rewritten {
            // The rebuild reads the log.
            return;
        }
        if e.n <= self.applied {
            self.check_applied(&e);
            return;
        }
        if e.n > self.applied + 1 {
            // A gap: read the missing entries (this one included) from the log.
            self.behind = true;
            self.catch_up.notify_one();
            return;
        }
        self.apply(e);
    }

    pub(super) async fn catch_up_or_retry(&mut self) {
        if self.machine.is_none() {
            return;
        }
        match self.catch_up().await {
            Ok(()) => self.behind = false,
            Err(ClusterError::RoomNotFound(_)) => {
                let me = self.me.clone();
                let origin = Origin { node: &me, conn: 0 };
                self.apply_intent(origin, Intent::Close, None, now_ms());
            }
            Err(e) => {
                tracing::debug!(room = %self.id, error = %e, "catch-up failed; retrying");
                self.behind = true;
            }
        }
    }

    /// Applies every entry after `applied` that the log holds (rebuilding
    /// the replica first if the log went back).
    ///
    /// Each read starts at the last entry applied, when its fingerprint is
    /// remembered, to check that the log still holds that entry: after a
    /// failover the log can have gone back and on again past `applied`,
    /// and the entries after it would belong to another history; or it can
    /// end before `applied`, which shows it went back as well.
    pub(super) async fn catch_up(&mut self) -> Result<(), ClusterError> {
        // Cleared when the entry at `applied` is trimmed away (the log moved
        // on far): the read then starts after it.
        let mut check = true;
        loop {
            if self.rewritten {
                self.rebuild().await?;
            }
            let overlap = check && self.applied > 0 && self.prints.holds(self.applied);
            let after = self.applied - u64::from(overlap);
            match self.cluster.read(&self.id, after, READ_BATCH).await {
                Ok(entries) if overlap && entries.is_empty() => {
                    // The log ends before the last entry applied here, and was
                    // not trimmed past it (that reads as `Trimmed`): it went
                    // back. Told now, on the catch-up that follows a failover
                    // (the nodes subscribe again), rather than when new entries
                    // reach the lost positions, which may be never.
                    self.log_went_back(self.applied);
                }
                Ok(entries) => {
                    let mut applied_any = false;
                    for e in entries {
                        if e.n <= self.applied {
                            if self.check_applied(&e) {
                                break;
                            }
                            continue;
                        }
                        if e.n == self.applied + 1 {
                            self.apply(e);
                            applied_any = true;
                        }
                        if self.machine.is_none() {
                            return Ok(());
                        }
                    }
                    if !applied_any && !self.rewritten {
                        return Ok(());
                    }
                }
                Err(ClusterError::Trimmed(_)) if overlap => check = false,
                Err(ClusterError::Trimmed(_)) => self.reload().await?,
                Err(e) => return Err(e),
            }
        }
    }

    /// Checks an entry at a position already applied against what was
    /// applied there: a duplicate is ignored; another entry means the
    /// room's log went back ([`Self::log_went_back`]). True in that case.
    pub(super) fn check_applied(&mut self, e: &LogEntry) -> bool {
        match self.prints.check(e) {
            history::Seen::Same | history::Seen::Unknown => false,
            history::Seen::Rewritten => {
                self.log_went_back(e.n);
                true
            }
        }
    }

    /// The room's log holds another entry at position `n` than the one this
    /// replica applied: a broker failover lost entries it had applied and
    /// delivered, and the log went on with others under the same positions
    /// (and so the same seqs). Before anything of the new history is
    /// applied, every local connection in the room is closed with 4005
    /// (join again, do not resume) and its session leaves the room (so a
    /// resume anyway gets a `resync`), and the commands waiting for their
    /// entries are given up: whether their records were lost is unknown.
    /// The next catch-up rebuilds the replica from the broker.
    pub(super) fn log_went_back(&mut self, n: u64) {
        tracing::error!(
            room = %self.id,
            n,
            applied = self.applied,
            "the room's log went back (a broker failover lost entries applied here): \
             closing its connections (4005) and rebuilding the replica"
        );
        self.log_regressions.increment(1);
        self.rewritten = true;
        self.behind = true;
        self.catch_up.notify_one();
        let me = self.me.clone();
        let leaving: Vec<(u64, String)> = match &self.machine {
            Some(m) => {
                for outbox in m.locals().values() {
                    outbox.control().close(CloseCode::HistoryRewritten);
                }
                let room = m.room();
                room.connected_sessions(|s: &Sink| *s.node == *me && s.outbox.is_some())
                    .into_iter()
                    .filter_map(|s| Some((room.member(&s)?.sink.as_ref()?.conn, s)))
                    .collect()
            }
            None => Vec::new(),
        };
        // Appended now, before the clients hear of the close and come back:
        // the sessions are gone from the new history before a resume of
        // them could land (it gets `resync`, `session_expired`).
        for (conn, session) in leaving {
            self.submit(conn, Intent::Leave { session }, None, true);
        }
        self.barrier = None;
        let e = RoomError::new(
            ErrorCode::BrokerUnavailable,
            "the room's history was rewritten (a broker failover lost its last entries): \
             join again",
        );
        for (_, p) in self.pending.drain() {
            p.outbox.control().close(CloseCode::HistoryRewritten);
            // Joins and HTTP calls are told; a publish, request or direct
            // gets no answer: the connection closes, its outcome unknown.
            if matches!(
                p.waiter,
                Waiter::Join(_) | Waiter::Admin(_) | Waiter::Server(_)
            ) {
                p.refuse(&self.id, e.clone(), &self.errors);
            }
        }
    }

    /// Applies the entry at `applied + 1`.
    pub(super) fn apply(&mut self, e: LogEntry) {
        self.applied = e.n;
        self.prints.push(&e);
        let record = match LogRecord::decode(&e.payload) {
            Ok(r) => r,
            Err(err) => {
                tracing::error!(room = %self.id, n = e.n, error = %err, "unreadable log record skipped");
                return;
            }
        };
        if record.intent.may_change_members() {
            self.ticker = None;
        }
        let origin = *record.node == *self.me;
        if origin && self.barrier == Some(record.req) {
            self.barrier = None;
            self.restart_skipped(record.req);
        }
        let pending = if origin {
            self.pending.remove(&record.req)
        } else {
            None
        };
        let LogRecord {
            node, conn, intent, ..
        } = record;
        self.apply_intent(Origin { node: &node, conn }, intent, pending, e.ts);
        self.send_webhook_events(e.n);
        if self.machine.is_some() {
            self.maybe_snapshot(e.n, origin);
        }
    }

    /// Applies one command through the room's machine and carries out what follows.
    pub(super) fn apply_intent(
        &mut self,
        origin: Origin<'_>,
        intent: Intent,
        pending: Option<Pending>,
        now: Millis,
    ) {
        let Some(machine) = &mut self.machine else {
            return;
        };
        match machine.apply(origin, intent, pending, now) {
            FollowUp::None => {}
            FollowUp::Orphaned { conn, session } => {
                // The join landed although its append reported a failure
                // (the client was told it failed): nobody is on that connection.
                self.submit(conn, Intent::Disconnect { session }, None, true);
            }
            FollowUp::Closed => {
                let e = RoomError::new(ErrorCode::RoomNotFound, "the room was deleted");
                for (_, p) in self.pending.drain() {
                    if let Waiter::Join(reply) = p.waiter {
                        let _ = reply.send(Err(e.clone()));
                    }
                }
                self.members.store(0, Ordering::Relaxed);
                self.machine = None;
            }
        }
    }

    pub(super) fn maybe_snapshot(&mut self, n: u64, origin: bool) {
        if n.is_multiple_of(SNAPSHOT_EVERY) && !origin {
            // Its origin stores this one: the lag counts from here, so that
            // other replicas do not store snapshots of their own as well.
            self.snapshot_at = n;
            return;
        }
        let due = (origin && n.is_multiple_of(SNAPSHOT_EVERY))
            || n >= self.snapshot_at + SNAPSHOT_MAX_LAG;
        if !due {
            return;
        }
        self.snapshot_at = n;
        let bytes = encode_state(self.machine().room(), self.cluster.snapshot_format());
        self.write_snapshot(n, bytes);
    }
}
