//! Embedded mode's room task: a log that applies at once. Each command is
//! applied in mailbox order by the room's [`RoomMachine`], with this node's
//! clock.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use metrics::Histogram;
use plaza_core::Room;
use tokio::sync::mpsc;

use super::machine::{FollowUp, Origin, RoomMachine};
use super::{
    answer, mailbox, sleep_until, ClientCommand, Intent, RoomCommand, RoomHandle, RoomInfo, Sink,
};
use crate::clock::now_ms;
use crate::metrics::ErrorCounter;
use crate::outbox::FeedConfig;

/// Starts the task of a new room.
pub(crate) fn spawn(
    room: Room<Sink>,
    node: Arc<str>,
    errors: ErrorCounter,
    room_wait: Histogram,
    feed: FeedConfig,
    webhooks: Option<Arc<crate::webhooks::Webhooks>>,
) -> RoomHandle {
    let members = Arc::new(AtomicUsize::new(0));
    let info = RoomInfo::new(room.name(), room.config(), room.created_at());
    let (handle, rx) = mailbox(room.id(), info, members.clone());
    let machine = RoomMachine::new(room, node, errors, feed, webhooks);
    tokio::spawn(run(machine, members, rx, room_wait));
    handle
}

async fn run(
    mut machine: RoomMachine,
    members: Arc<AtomicUsize>,
    mut rx: mpsc::Receiver<RoomCommand>,
    room_wait: Histogram,
) {
    let me = machine.me().clone();
    // The room's clock never goes back, though the wall clock may be set
    // back: a space decides what changed since its last tick by the time
    // (cluster mode gets the same from the log's append).
    let mut last = 0;
    let mut clock = move || {
        last = now_ms().max(last);
        last
    };
    loop {
        let tick_at = machine.room().next_deadline();
        // Held events are due by this node's clock too: one timer for both.
        let wake_at = match (tick_at, machine.next_flush()) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        let deadline = wake_at.map(|at| {
            let wait = at.saturating_sub(now_ms());
            tokio::time::Instant::now() + Duration::from_millis(wait)
        });
        // Busy followers' wake-ups: held to the microsecond, not the millisecond.
        let release_at = machine
            .next_feed_release()
            .map(tokio::time::Instant::from_std);
        let deadline = match (deadline, release_at) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        let (origin, intent, pending) = tokio::select! {
            cmd = rx.recv() => match cmd {
                None => break,
                Some(RoomCommand::Client(c)) => {
                    let ClientCommand { intent, pending, handed_at } = *c;
                    room_wait.record(handed_at.elapsed().as_secs_f64());
                    (Origin { node: &me, conn: pending.conn() }, intent, Some(pending))
                }
                Some(RoomCommand::Members { reply }) => {
                    let _ = reply.send(machine.room().members_info());
                    continue;
                }
                Some(RoomCommand::Read(look)) => {
                    look(machine.room());
                    continue;
                }
                Some(RoomCommand::Close { done }) => {
                    // Refuse new commands before telling members: whoever saw
                    // `closed` and acts on the room must hear it is gone.
                    rx.close();
                    let _ = machine.apply(Origin { node: &me, conn: 0 }, Intent::Close, None, clock());
                    let _ = done.send(());
                    break;
                }
            },
            _ = sleep_until(deadline) => {
                machine.release_feed(std::time::Instant::now());
                let now = clock();
                machine.flush_due(now);
                if tick_at.is_none_or(|at| at > now) {
                    continue;
                }
                (Origin { node: &me, conn: 0 }, Intent::Tick, None)
            }
        };
        let follow_up = machine.apply(origin, intent, pending, clock());
        // Only a join without its waiter is orphaned, and every embedded join
        // has its waiter; only `Close` closes, handled above.
        debug_assert_eq!(follow_up, FollowUp::None);
        members.store(machine.room().connected(), Ordering::Relaxed);
    }
    members.store(0, Ordering::Relaxed);
    // Commands that reached the mailbox before it closed.
    let id = machine.id().to_owned();
    while let Ok(cmd) = rx.try_recv() {
        cmd.refuse(&id, answer::room_deleted(&id), machine.errors());
    }
}
