//! Appends on a Redis Cluster go in lanes, one per primary, each with one
//! batch in flight; the lanes do not wait for each other. So a primary that
//! hangs, dies or fails over delays the appends of its own slots only, while
//! the other primaries go on taking theirs.
//!
//! Invariant (the order of a room's appends): all appends of one slot,
//! queued or in flight, are in one lane. A slot keeps its lane while it has
//! any append there, even if the slot map moved the slot meanwhile (the
//! batch itself is sent where the slot now belongs, see [`Shards::send`]);
//! only once it has none does its next append take the lane of its primary
//! in the current map. As a lane sends its batches one after another, in
//! queue order, a room's appends reach Redis in the order they were called.

use std::collections::hash_map::Entry;
use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Arc;

use futures_util::stream::{FuturesUnordered, StreamExt};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::{Queued, Sender, MAX_BATCH};
use crate::redis::shards::{Addr, Shards};

/// A lane: a primary's address, or `None` for slots the map does not place.
type Lane = Option<Addr>;

/// The appends waiting in each lane and which lanes have a batch in flight.
#[derive(Default)]
struct Lanes {
    waiting: HashMap<Lane, VecDeque<Queued>>,
    busy: HashSet<Lane>,
    /// Slots with appends waiting or in flight: their lane, and how many.
    slots: HashMap<u16, (Lane, usize)>,
}

impl Lanes {
    /// Queues `q` in its slot's lane.
    fn queue(&mut self, q: Queued, shards: &Shards) {
        let lane = match self.slots.entry(q.slot) {
            Entry::Occupied(mut e) => {
                e.get_mut().1 += 1;
                e.get().0.clone()
            }
            Entry::Vacant(e) => e.insert((shards.primary_of(q.slot), 1)).0.clone(),
        };
        self.waiting.entry(lane).or_default().push_back(q);
    }

    /// The next batch of every lane that has appends waiting and none in
    /// flight; those lanes are busy from now on.
    fn ready(&mut self) -> Vec<(Lane, Vec<Queued>)> {
        let mut batches = Vec::new();
        for (lane, queue) in &mut self.waiting {
            if queue.is_empty() || self.busy.contains(lane) {
                continue;
            }
            let n = queue.len().min(MAX_BATCH);
            batches.push((lane.clone(), queue.drain(..n).collect::<Vec<_>>()));
        }
        for (lane, _) in &batches {
            self.busy.insert(lane.clone());
        }
        self.waiting.retain(|_, queue| !queue.is_empty());
        batches
    }

    /// `lane`'s batch, of appends to `slots`, was answered.
    fn done(&mut self, lane: &Lane, slots: Vec<u16>) {
        self.busy.remove(lane);
        for slot in slots {
            if let Entry::Occupied(mut e) = self.slots.entry(slot) {
                e.get_mut().1 -= 1;
                if e.get().1 == 0 {
                    e.remove();
                }
            }
        }
    }
}

/// The append task on a Redis Cluster: takes appends in call order, puts
/// each in its lane and sends every lane's batches as the lane frees up.
pub(super) async fn run(
    sender: Arc<Sender>,
    shards: Arc<Shards>,
    mut rx: mpsc::UnboundedReceiver<Queued>,
    stop: CancellationToken,
) {
    let mut lanes = Lanes::default();
    let mut in_flight = FuturesUnordered::new();
    loop {
        tokio::select! {
            biased;
            _ = stop.cancelled() => return,
            Some((lane, slots)) = in_flight.next(), if !in_flight.is_empty() => {
                lanes.done(&lane, slots);
            }
            next = rx.recv() => match next {
                Some(q) => {
                    lanes.queue(q, &shards);
                    while let Ok(q) = rx.try_recv() {
                        lanes.queue(q, &shards);
                    }
                }
                None => return,
            },
        }
        for (lane, batch) in lanes.ready() {
            let slots: Vec<u16> = batch.iter().map(|q| q.slot).collect();
            let sender = Arc::clone(&sender);
            in_flight.push(async move {
                sender.send(batch).await;
                (lane, slots)
            });
        }
    }
}
