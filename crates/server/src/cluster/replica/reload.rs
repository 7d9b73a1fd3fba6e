//! Starting again from a snapshot, and what it means for commands whose
//! records the snapshot skipped; rebuilding the replica after the room's
//! log went back.

use super::*;

impl Replica {
    /// Replaces the replica's state with the latest snapshot (only if it is
    /// ahead of what was applied).
    pub(super) async fn reload(&mut self) -> Result<(), ClusterError> {
        self.load(false).await
    }

    /// After the room's log went back ([`Self::log_went_back`]): replaces
    /// the replica's state with the latest snapshot whatever was applied
    /// (the snapshot is at or before the log's new end: a failover that
    /// lost entries lost the later snapshots with them, as a room's keys
    /// share one hash slot); the catch-up that follows applies the new
    /// history from there. The local connections were closed already; none
    /// is kept.
    pub(super) async fn rebuild(&mut self) -> Result<(), ClusterError> {
        self.load(true).await?;
        self.rewritten = false;
        // Positions from here on are the new history's: the events of its
        // entries are queued in turn.
        self.webhooks_sent = self.applied;
        tracing::info!(room = %self.id, n = self.applied, "replica rebuilt from the broker after its log went back");
        Ok(())
    }

    /// Loads the latest snapshot: only if it is ahead of what was applied,
    /// unless `rebuild`.
    async fn load(&mut self, rebuild: bool) -> Result<(), ClusterError> {
        let Some((n, bytes)) = self.cluster.load_snapshot(&self.id).await? else {
            return Err(ClusterError::RoomNotFound(self.id.clone()));
        };
        if self.machine.is_some() && n <= self.applied && !rebuild {
            // The log was trimmed past us and no newer snapshot exists: a bug
            // or a very long stall. Members must resync from scratch.
            tracing::error!(room = %self.id, n, applied = self.applied, "replica cannot continue");
            for outbox in self.machine().locals().values() {
                outbox.control().close(CloseCode::Restarting);
            }
            return Err(ClusterError::Trimmed(self.id.clone()));
        }
        let state = super::super::snapshot::decode_state(&bytes)
            .map_err(|e| ClusterError::Unavailable(format!("unreadable snapshot: {e}")))?;
        state
            .validate()
            .map_err(|e| ClusterError::Unavailable(format!("invalid snapshot: {e}")))?;
        let me = self.me.clone();
        let skipping = self.machine.is_some();
        let room = {
            // After a rewrite no connection is kept: the room's events of
            // the new history reach none of them.
            let locals = self
                .machine
                .as_ref()
                .filter(|_| !rebuild)
                .map(|m| m.locals());
            Room::import(state, |owner: &str| {
                let mut sink = Sink::from_owner(owner);
                if *sink.node == *me {
                    sink.node = me.clone();
                    sink.outbox = locals.and_then(|l| l.get(&sink.conn)).cloned();
                }
                sink
            })
        };
        // Local connections the snapshot no longer counts as members must
        // resume to learn what they missed.
        let kept: BTreeSet<u64> = room
            .connected_sessions(|s: &Sink| s.outbox.is_some())
            .iter()
            .filter_map(|s| room.member(s).and_then(|m| m.sink.as_ref()).map(|s| s.conn))
            .collect();
        // Sessions connected on this node by the snapshot's account, but on
        // no connection here: joins answered in skipped entries, or members
        // of an earlier run of this node id. Nothing else would ever
        // disconnect them (this node is alive, so no `node_down` comes).
        let ghosts: Vec<(u64, String)> = room
            .connected_sessions(|s: &Sink| *s.node == *me && s.outbox.is_none())
            .into_iter()
            .filter_map(|s| {
                let conn = room.member(&s)?.sink.as_ref()?.conn;
                Some((conn, s))
            })
            .collect();
        let keep = |conn: u64, outbox: &crate::outbox::Outbox| {
            if rebuild {
                outbox.control().close(CloseCode::HistoryRewritten);
                return false;
            }
            let keep = kept.contains(&conn);
            if !keep {
                outbox.control().close(CloseCode::Restarting);
            }
            keep
        };
        match &mut self.machine {
            Some(m) => m.replace_room(room, keep),
            None => {
                self.machine = Some(RoomMachine::new(
                    room,
                    me,
                    self.errors.clone(),
                    self.feed_config,
                    self.webhooks.clone(),
                ))
            }
        }
        let skipped_waiting = skipping && !self.pending.is_empty();
        self.ticker = None;
        if rebuild {
            self.tick_asked = None;
        }
        self.applied = n;
        self.prints.clear();
        self.snapshot_at = if rebuild { n } else { self.snapshot_at.max(n) };
        for (conn, session) in ghosts {
            self.submit(conn, Intent::Disconnect { session }, None, true);
        }
        if skipped_waiting {
            // A record appended now lands after everything this node appended
            // before (appends keep call order): once it is applied, a command
            // still waiting had its record among the skipped entries. A tick
            // serves, as it changes nothing that is not due.
            self.submit(0, Intent::Tick, None, false);
            self.barrier = Some(self.next_req);
        }
        Ok(())
    }

    /// After skipping entries to a snapshot, the commands appended before
    /// request `barrier` and still unanswered when its record arrives had
    /// their records among the skipped entries: their answers would never
    /// come. Their connections are told to reconnect (1012): a resume then
    /// replays what became of each (its own state changes included), and
    /// unacknowledged publishes are retried by id. (All of them when the
    /// barrier itself could not be appended.)
    pub(super) fn restart_skipped(&mut self, barrier: u64) {
        let skipped: Vec<u64> = self
            .pending
            .keys()
            .copied()
            .filter(|r| *r < barrier)
            .collect();
        for req in skipped {
            let Some(p) = self.pending.remove(&req) else {
                continue;
            };
            p.outbox.control().close(CloseCode::Restarting);
            if let Waiter::Join(reply) = p.waiter {
                let _ = reply.send(Err(RoomError::new(
                    ErrorCode::BrokerUnavailable,
                    "the room's log moved on while joining: reconnect and join again",
                )));
            }
        }
    }
}
