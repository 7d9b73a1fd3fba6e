//! Replaying generated chat streams (source document 002's workload): every
//! user of a room computes the same seeded schedule and sends the messages
//! whose speaker it is, with their topics and replies.

use std::collections::VecDeque;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::user::UserState;
use super::*;
use crate::driver::ChatMessage;
use crate::scenario::{ChatReplay, Step};

/// Whether `steps` replay a chat (then acks are read for their seqs).
pub(super) fn replays(steps: &[Step]) -> bool {
    steps.iter().any(|s| match s {
        Step::ChatReplay(_) => true,
        Step::Loop { steps, .. } | Step::Leader(steps) => replays(steps),
        Step::Parallel(branches) => branches.iter().any(|b| replays(b)),
        _ => false,
    })
}

/// One message of a stream's schedule.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Planned {
    /// When, after the replay started.
    pub at: Duration,
    pub stream: u32,
    /// Its index in the stream.
    pub index: u64,
    /// The room member (index within the room) who sends it; `None` when
    /// nobody had joined yet.
    pub speaker: Option<u64>,
    /// The index (in the same stream) of the message it answers.
    pub answers: Option<u64>,
}

/// How many of a room's members (the first ones) can speak at a time.
pub(crate) type Present<'a> = &'a (dyn Fn(Duration) -> u64 + Sync);

/// One stream's schedule, drawn message by message.
struct Stream {
    rng: StdRng,
    next: Planned,
    rate: f64,
    reply_ratio: f64,
}

impl Stream {
    fn new(c: &ChatReplay, stream: u32, present: Present<'_>) -> Stream {
        let rng = StdRng::seed_from_u64(
            c.seed ^ (u64::from(stream) + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15),
        );
        let mut s = Stream {
            rng,
            next: Planned {
                at: Duration::ZERO,
                stream,
                index: 0,
                speaker: None,
                answers: None,
            },
            rate: c.per_stream_per_s,
            reply_ratio: c.reply_ratio,
        };
        s.next = s.draw(Duration::ZERO, 0, present);
        s
    }

    /// Message `index`, the first after `after`: exponential gaps (a
    /// Poisson stream, as conversation is bursty), a speaker drawn
    /// uniformly from the members present.
    fn draw(&mut self, after: Duration, index: u64, present: Present<'_>) -> Planned {
        let u: f64 = self.rng.random();
        let gap = -(1.0 - u).ln() / self.rate;
        let at = after + Duration::from_secs_f64(gap.min(3600.0));
        let pick: f64 = self.rng.random();
        let n = present(at);
        let speaker = (n > 0).then(|| ((pick * n as f64) as u64).min(n - 1));
        let reply = self.rng.random::<f64>() < self.reply_ratio;
        let back = self.rng.random_range(1..=3u64);
        Planned {
            at,
            stream: self.next.stream,
            index,
            speaker,
            answers: (reply && index >= back).then(|| index - back),
        }
    }

    fn advance(&mut self, present: Present<'_>) -> Planned {
        let (at, index) = (self.next.at, self.next.index + 1);
        let next = self.draw(at, index, present);
        std::mem::replace(&mut self.next, next)
    }
}

/// Every stream's messages in time order (all speakers).
pub(crate) struct Schedule<'a> {
    streams: Vec<Stream>,
    present: Present<'a>,
}

impl<'a> Schedule<'a> {
    pub(crate) fn new(c: &ChatReplay, present: Present<'a>) -> Schedule<'a> {
        Schedule {
            streams: (0..c.streams).map(|s| Stream::new(c, s, present)).collect(),
            present,
        }
    }
}

impl Iterator for Schedule<'_> {
    type Item = Planned;

    fn next(&mut self) -> Option<Planned> {
        let s = self.streams.iter_mut().min_by_key(|s| s.next.at)?;
        Some(s.advance(self.present))
    }
}

/// How long after its arrival a member counts as present (its join done).
const JOIN_MARGIN: Duration = Duration::from_secs(1);

/// Resolves when phase `index` has started (never for `None`).
async fn phase_started(shared: &Shared, index: Option<usize>) {
    let Some(i) = index else {
        return std::future::pending().await;
    };
    let mut started = shared.phases_started.subscribe();
    let _ = started.wait_for(|&n| n > i).await;
}

/// The id of a chat message: unique in the run, and what a reply looks up.
fn message_id(room: u64, stream: u32, index: u64) -> String {
    format!("c{room}-{stream}-{index}")
}

/// Sends this user's share of the schedule, on time, until the run ends.
pub(super) async fn replay(shared: &Arc<Shared>, st: &mut UserState, c: &ChatReplay) -> bool {
    let Some(j) = &st.joined else {
        shared.error("chat_replay: not joined");
        return false;
    };
    let room = st.room_index;
    let members = shared.room_sizes[room as usize];
    let me = st.vu / shared.rooms;
    let rooms = shared.rooms;
    // Members of this room, in arrival order, with their arrival times.
    let arrival = |k: u64| shared.arrivals[(k * rooms + room) as usize];
    let present = |t: Duration| {
        // The first member not present yet (arrivals ascend).
        let (mut lo, mut hi) = (0u64, members);
        while lo < hi {
            let mid = (lo + hi) / 2;
            if arrival(mid) + JOIN_MARGIN <= t {
                lo = mid + 1;
            } else {
                hi = mid;
            }
        }
        lo
    };
    // The schedule runs from the run's start: a member that arrives late
    // (the document's users joined over minutes) finds the chat under way.
    let start = shared.start;
    let stop_at = c
        .until_phase
        .as_ref()
        .and_then(|p| shared.phase_index.get(p).copied());
    if stop_at.is_some_and(|i| *shared.phases_started.borrow() > i) {
        return true;
    }
    // Each stream's last speakers (replies answer one of the last three).
    let mut recent: Vec<VecDeque<Option<u64>>> =
        vec![VecDeque::with_capacity(4); c.streams as usize];
    for m in Schedule::new(c, &present) {
        let last = &mut recent[m.stream as usize];
        // The author of message `i`, while it is one of the last three.
        let author_of = |i: u64| {
            let back = usize::try_from(m.index - i).ok()?;
            last.len()
                .checked_sub(back)
                .and_then(|k| last.get(k))
                .copied()?
        };
        let author = m.answers.and_then(author_of);
        if last.len() == 3 {
            last.pop_front();
        }
        last.push_back(m.speaker);
        if m.speaker != Some(me) {
            continue;
        }
        tokio::select! {
            on_time = shared.pause_until(start + m.at) => if !on_time {
                return false;
            },
            _ = phase_started(shared, stop_at) => return true,
        }
        // Nobody answers themselves here: a member is not sent its own message.
        let author = author.filter(|&a| a != me);
        let answered = m.answers.zip(author).and_then(|(i, author)| {
            let id = message_id(room, m.stream, i);
            let seq = shared
                .chat_seqs
                .as_ref()?
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .get(&id)
                .copied()?;
            // As a user index (what the author's receiver looks for).
            Some((seq, author * shared.rooms + room))
        });
        let sent = unix_micros();
        let mut payload = match answered {
            Some((_, author)) => format!(r#"{{"bt":{sent},"vu":{},"re":{author},"p":""#, st.vu),
            None => format!(r#"{{"bt":{sent},"vu":{},"p":""#, st.vu),
        };
        let pad = c.bytes.saturating_sub(payload.len() + 2);
        payload.extend(std::iter::repeat_n('x', pad));
        payload.push_str("\"}");
        let topic = format!("t{}", m.stream);
        let id = message_id(room, m.stream, m.index);
        let msg = ChatMessage {
            topic: &topic,
            reply_to: answered.map(|(seq, _)| seq),
            id: &id,
        };
        st.out.clear();
        if !shared
            .opts
            .driver
            .publish_chat(&j.room, msg, &payload, &mut st.out)
        {
            shared.error(format!(
                "chat_replay: {} has no chat messages",
                shared.opts.driver.name()
            ));
            return false;
        }
        shared.ws_sending();
        if let Err(e) = j.writer.lock().await.send_text(st.out.as_bytes()).await {
            shared.error(format!("chat_replay: {}", e.kind()));
            return false;
        }
        // Those in the room now (a chat goes on while members arrive); in a
        // run over several load processes only this one's are known.
        let recipients = match &shared.opts.shard {
            None => shared.room_joined[room as usize].load(Ordering::Relaxed),
            Some(_) => members,
        }
        .saturating_sub(1);
        let counts = &shared.counts;
        counts.publishes_total.fetch_add(1, Ordering::Relaxed);
        counts
            .expected_total
            .fetch_add(recipients, Ordering::Relaxed);
        if shared.recording() {
            counts.publishes.fetch_add(1, Ordering::Relaxed);
            counts.expected.fetch_add(recipients, Ordering::Relaxed);
            counts
                .bytes_out
                .fetch_add(st.out.len() as u64, Ordering::Relaxed);
            if answered.is_some() {
                counts.chat_replies.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    fn replay(seed: u64) -> ChatReplay {
        ChatReplay {
            streams: 6,
            per_stream_per_s: 1.0,
            seed,
            reply_ratio: 0.2,
            bytes: 100,
            until_phase: None,
        }
    }

    #[test]
    fn the_schedule_is_seeded_ordered_and_has_the_asked_rates() {
        let c = replay(7);
        let take = |c: &ChatReplay| -> Vec<Planned> {
            Schedule::new(c, &|_| 800)
                .take_while(|m| m.at < Duration::from_secs(900))
                .collect()
        };
        let a = take(&c);
        assert_eq!(a, take(&c), "same seed, same schedule");
        assert_ne!(a, take(&replay(8)));
        assert!(a.windows(2).all(|w| w[0].at <= w[1].at));
        // 6 streams × 1/s × 900 s ≈ 5,400 (Poisson: within a few percent).
        assert!((5_100..5_700).contains(&a.len()), "{}", a.len());
        for s in 0..6 {
            let n = a.iter().filter(|m| m.stream == s).count();
            assert!((780..1_020).contains(&n), "stream {s}: {n}");
        }
        let replies = a.iter().filter(|m| m.answers.is_some()).count();
        assert!((900..1_260).contains(&replies), "{replies}");
        assert!(a.iter().all(|m| m.speaker.is_some_and(|s| s < 800)
            && m.answers.is_none_or(|i| i < m.index && i + 3 >= m.index)));
        // Everyone gets to speak now and then.
        let speakers: std::collections::HashSet<u64> = a.iter().filter_map(|m| m.speaker).collect();
        assert!(speakers.len() > 780, "{}", speakers.len());
    }

    #[test]
    fn only_members_present_speak() {
        // One member more every second, from 10 s on.
        let present = |t: Duration| t.as_secs().saturating_sub(10);
        let a: Vec<Planned> = Schedule::new(&replay(3), &present)
            .take_while(|m| m.at < Duration::from_secs(60))
            .collect();
        for m in &a {
            match m.speaker {
                None => assert!(m.at < Duration::from_secs(11), "{m:?}"),
                Some(s) => assert!(s < present(m.at), "{m:?}"),
            }
        }
        assert!(a.iter().any(|m| m.speaker.is_none()));
        assert!(a.iter().any(|m| m.speaker == Some(40)));
    }
}
