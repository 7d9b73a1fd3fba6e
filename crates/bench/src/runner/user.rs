//! A virtual user: its flow's steps, one after another (joins, waits, loops,
//! publishes, requests, HTTP calls).

use std::future::Future;
use std::pin::Pin;

use super::http::{api_publish, http_call};
use super::receive::receive;
use super::ws_ops::{publish, request, Body};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::*;
use crate::driver::JoinSpec;
use crate::scenario::Step;
use crate::session;
use crate::transport::{Endpoint, Reader, Writer};

/// Room ids the flows join (the first `join` step of each flow) or publish
/// into over the server API (the first `api_publish`), for room `r`.
pub(super) fn rooms_joined(scenario: &Scenario, r: u64) -> Vec<String> {
    fn first_api_room(steps: &[Step]) -> Option<&str> {
        steps.iter().find_map(|s| match s {
            Step::ApiPublish { room, .. } => Some(room.as_str()),
            Step::Loop { steps, .. } | Step::Leader(steps) => first_api_room(steps),
            Step::Parallel(branches) => branches.iter().find_map(|b| first_api_room(b)),
            _ => None,
        })
    }
    let mut out: Vec<String> = scenario
        .flows
        .iter()
        .flat_map(|f| {
            let joined = f.steps.iter().find_map(|s| match s {
                Step::Join { room, .. } => Some(expand(room, 0, r, &f.name)),
                _ => None,
            });
            let api = first_api_room(&f.steps).map(|room| expand(room, 0, r, &f.name));
            joined.into_iter().chain(api)
        })
        .collect();
    out.sort();
    out.dedup();
    out
}

/// The channels (besides the main one) a flow's first join subscribes.
pub(super) fn joined_channels(steps: &[Step]) -> &[String] {
    steps
        .iter()
        .find_map(|s| match s {
            Step::Join { channels, .. } => Some(channels.as_slice()),
            _ => None,
        })
        .unwrap_or(&[])
}

/// The room template of the first join in `steps` (depth first).
pub(super) fn first_join(steps: &[Step]) -> Option<&str> {
    steps.iter().find_map(|step| match step {
        Step::Join { room, .. } => Some(room.as_str()),
        Step::Loop { steps, .. } => first_join(steps),
        Step::Parallel(branches) => branches.iter().find_map(|b| first_join(b)),
        _ => None,
    })
}

/// Expands `{vu}`, `{vu%N}` (the user's index modulo N), `{room}` and `{flow}`.
pub(super) fn expand(template: &str, vu: u64, room: u64, flow: &str) -> String {
    let mut out = template
        .replace("{vu}", &vu.to_string())
        .replace("{room}", &room.to_string())
        .replace("{flow}", flow);
    while let Some(at) = out.find("{vu%") {
        let Some(len) = out[at..].find('}') else {
            break;
        };
        let n: u64 = match out[at + 4..at + len].trim().parse() {
            Ok(n) if n > 0 => n,
            _ => break,
        };
        out.replace_range(at..=at + len, &(vu % n).to_string());
    }
    out
}

/// One user's connection once joined.
pub(super) struct Joined {
    pub(super) writer: Arc<tokio::sync::Mutex<Writer>>,
    pub(super) room: String,
    /// The channels joined besides the main one.
    pub(super) channels: Vec<String>,
    /// The receiving task; `None` in a parallel branch's copy.
    pub(super) reader: Option<tokio::task::JoinHandle<()>>,
}

impl Joined {
    /// What a parallel branch acts through: the same writer and room.
    fn share(&self) -> Joined {
        Joined {
            writer: self.writer.clone(),
            room: self.room.clone(),
            channels: self.channels.clone(),
            reader: None,
        }
    }
}

/// What a user has while running its flow.
pub(super) struct UserState {
    pub(super) vu: u64,
    pub(super) room_index: u64,
    pub(super) flow: String,
    /// The room of the flow's first join, expanded: named in the WebSocket
    /// URL for a cluster's load balancer (`Driver::ws_path_for`).
    pub(super) first_room: Option<String>,
    pub(super) conn: Option<(Reader, Writer)>,
    pub(super) joined: Option<Joined>,
    pub(super) out: String,
    /// Draws for `{rand:LO:HI}` templates, seeded by the user's index: runs repeat.
    pub(super) rng: StdRng,
}

pub(super) async fn virtual_user(shared: Arc<Shared>, scenario: Arc<Scenario>, vu: u64) {
    // Flows are mixed within each room: the member index picks the flow.
    let flow = scenario.flow_of(vu / shared.rooms);
    let mut st = UserState {
        vu,
        room_index: vu % shared.rooms,
        flow: flow.name.clone(),
        first_room: first_join(&flow.steps)
            .map(|room| expand(room, vu, vu % shared.rooms, &flow.name)),
        conn: None,
        joined: None,
        out: String::with_capacity(256),
        rng: StdRng::seed_from_u64(vu),
    };
    run_steps(&shared, &mut st, &flow.steps).await;
    shared.flows_done.send_modify(|n| *n += 1);
    // A flow that ends early stays connected until the run ends: leaving
    // early would change what the others receive.
    shared.stop.cancelled().await;
    if let Some(j) = st.joined.take() {
        // The reader ends on the stop signal and hands in its latency
        // samples: wait for it rather than abort it.
        if let Some(reader) = j.reader {
            let _ = tokio::time::timeout(Duration::from_secs(5), reader).await;
        }
        let _ = j.writer.lock().await.close(1000).await;
    }
}

pub(super) type StepFuture<'a> = Pin<Box<dyn Future<Output = bool> + Send + 'a>>;

/// Runs `steps`; false when the user must stop (run over or failure).
pub(super) fn run_steps<'a>(
    shared: &'a Arc<Shared>,
    st: &'a mut UserState,
    steps: &'a [Step],
) -> StepFuture<'a> {
    Box::pin(async move {
        for step in steps {
            if shared.ending.is_cancelled() || !run_step(shared, st, step).await {
                return false;
            }
        }
        true
    })
}

pub(super) async fn run_step(shared: &Arc<Shared>, st: &mut UserState, step: &Step) -> bool {
    match step {
        Step::Connect => {
            let o = &shared.opts;
            let bind = (!o.bind.is_empty()).then(|| o.bind[(st.vu as usize) % o.bind.len()]);
            let room = st.first_room.as_deref();
            let at = Endpoint {
                addr: o.addr,
                host: &o.host,
                bind,
                tally: Some(shared.socket.clone()),
            };
            let fut = session::connect_for(
                &at,
                o.driver.as_ref(),
                room,
                shared.transport,
                shared.compression,
            );
            match tokio::time::timeout(o.timeout, fut).await {
                Ok(Ok(c)) => {
                    st.conn = Some(c);
                    true
                }
                Ok(Err(e)) => {
                    shared.error(format!("connect: {}", e.kind()));
                    false
                }
                Err(_) => {
                    shared.error("connect: timeout");
                    false
                }
            }
        }
        Step::Join {
            room,
            channels,
            platform,
            policy,
            history,
        } => {
            let mut extra = serde_json::Map::new();
            let mut put = |key: &str, v: &Option<serde_json::Value>, st: &mut UserState| {
                if let Some(v) = v {
                    let v = expand_json(v.clone(), st.vu, st.room_index, &st.flow, &mut st.rng);
                    if let Some(v) = switched_on(v) {
                        extra.insert(key.to_owned(), v);
                    }
                }
            };
            put("policy", policy, st);
            put("history", history, st);
            join(shared, st, room, channels, platform.as_deref(), extra).await
        }
        Step::ChatReplay(c) => super::chat::replay(shared, st, c).await,
        Step::Publish {
            channel,
            event,
            bytes,
            text,
        } => {
            let body = match text {
                Some(t) => Body::Text(t),
                None => Body::Padding(*bytes),
            };
            publish(
                shared,
                st,
                channel.as_deref(),
                event.as_deref().unwrap_or("b"),
                body,
            )
            .await
        }
        Step::Request { op, args } => request(shared, st, op, args.as_ref()).await,
        Step::Http {
            method,
            path,
            body,
            status,
        } => http_call(shared, st, method, path, body.as_ref(), *status).await,
        Step::ApiPublish {
            room,
            channel,
            event,
            bytes,
        } => {
            api_publish(
                shared,
                st,
                room,
                channel.as_deref(),
                event.as_deref().unwrap_or("b"),
                *bytes,
            )
            .await
        }
        Step::Think { ms } => {
            shared
                .pause_until(Instant::now() + Duration::from_millis(*ms))
                .await
        }
        Step::Loop {
            count,
            every_ms,
            per_s,
            steps,
        } => {
            let every = every_ms
                .map(Duration::from_millis)
                .or_else(|| per_s.map(|r| Duration::from_secs_f64(1.0 / r)));
            let mut i = 0u64;
            // Users keep the cadence but not in step: each starts at its own
            // offset within the period (golden-ratio spread), as real
            // clients would, instead of all publishing in the same instant.
            let offset = every.map_or(Duration::ZERO, |every| {
                let frac = (st.vu as f64 * 0.618_033_988_749_895).fract();
                every.mul_f64(frac)
            });
            let mut next = Instant::now() + offset;
            while count.is_none_or(|c| i < c) {
                if let Some(every) = every {
                    if !shared.pause_until(next).await {
                        return false;
                    }
                    next += every;
                }
                if !run_steps(shared, st, steps).await {
                    return false;
                }
                i += 1;
            }
            true
        }
        Step::Parallel(branches) => {
            let Some(j) = &st.joined else {
                shared.error("parallel: not joined");
                return false;
            };
            let tasks: Vec<_> = branches
                .iter()
                .enumerate()
                .map(|(i, steps)| {
                    let mut branch = UserState {
                        vu: st.vu,
                        room_index: st.room_index,
                        flow: st.flow.clone(),
                        first_room: st.first_room.clone(),
                        conn: None,
                        joined: Some(j.share()),
                        out: String::with_capacity(256),
                        rng: StdRng::seed_from_u64(st.vu ^ ((i as u64 + 1) << 40)),
                    };
                    let (shared, steps) = (shared.clone(), steps.clone());
                    tokio::spawn(async move { run_steps(&shared, &mut branch, &steps).await })
                })
                .collect();
            let mut all = true;
            for t in tasks {
                all &= t.await.unwrap_or(false);
            }
            all
        }
        Step::WaitPhase(name) => match shared.phase_index.get(name) {
            Some(&i) => {
                let mut started = shared.phases_started.subscribe();
                tokio::select! {
                    _ = shared.ending.cancelled() => false,
                    r = started.wait_for(|&n| n > i) => r.is_ok(),
                }
            }
            None => {
                shared.error(format!("wait_phase: no phase {name:?}"));
                false
            }
        },
        Step::Leader(steps) => {
            if st.vu / shared.rooms == 0 {
                run_steps(shared, st, steps).await
            } else {
                true
            }
        }
        Step::WaitAllJoined => loop {
            let notified = shared.all_joined.notified();
            if shared.everyone_joined.load(Ordering::Acquire) {
                return true;
            }
            tokio::select! {
                _ = shared.ending.cancelled() => return false,
                _ = notified => {}
            }
        },
        Step::Idle => {
            shared.ending.cancelled().await;
            false
        }
        Step::Stall => {
            // Nothing reads the socket any more; the writer stays, unused.
            if let Some(reader) = st.joined.as_mut().and_then(|j| j.reader.take()) {
                reader.abort();
            }
            shared.ending.cancelled().await;
            false
        }
        Step::Disconnect => {
            if let Some(j) = st.joined.take() {
                let _ = j.writer.lock().await.close(1000).await;
                if let Some(reader) = j.reader {
                    reader.abort();
                }
            }
            st.conn = None;
            true
        }
    }
}

/// `v` without its `enabled` key, or `None` when that key is `false`.
fn switched_on(mut v: serde_json::Value) -> Option<serde_json::Value> {
    match v.as_object_mut().and_then(|o| o.remove("enabled")) {
        Some(serde_json::Value::Bool(false)) => None,
        _ => Some(v),
    }
}

pub(super) async fn join(
    shared: &Arc<Shared>,
    st: &mut UserState,
    room: &str,
    channels: &[String],
    platform: Option<&str>,
    extra: serde_json::Map<String, serde_json::Value>,
) -> bool {
    let Some((mut reader, mut writer)) = st.conn.take() else {
        shared.error("join: not connected");
        return false;
    };
    let spec = JoinSpec {
        room: expand(room, st.vu, st.room_index, &st.flow),
        name: format!("u{}", st.vu),
        platform: platform.unwrap_or("browser").to_owned(),
        channels: channels.to_vec(),
        extra,
    };
    let handshake = session::join(&mut reader, &mut writer, shared.opts.driver.as_ref(), &spec);
    let early = match tokio::time::timeout(shared.opts.timeout, handshake).await {
        Ok(Ok(early)) => early,
        Ok(Err(e)) => {
            shared.error(format!("join: {e}"));
            return false;
        }
        Err(_) => {
            shared.error("join: timeout");
            return false;
        }
    };
    let writer = Arc::new(tokio::sync::Mutex::new(writer));
    let room = (st.vu % shared.rooms) as usize;
    let observer = is_observer(
        st.vu / shared.rooms,
        shared.room_sizes[room],
        shared.opts.observers_per_room,
    );
    let reader = tokio::spawn(receive(
        shared.clone(),
        st.vu,
        reader,
        writer.clone(),
        observer,
        early,
    ));
    st.joined = Some(Joined {
        writer,
        room: spec.room,
        channels: spec.channels,
        reader: Some(reader),
    });
    shared.room_joined[st.room_index as usize].fetch_add(1, Ordering::Relaxed);
    let joined = shared.counts.joined.fetch_add(1, Ordering::AcqRel) + 1;
    match &shared.opts.shard {
        Some(s) => {
            s.joined.send_replace(joined);
        }
        None if joined >= shared.members => {
            shared.everyone_joined.store(true, Ordering::Release);
            shared.all_joined.notify_waiters();
        }
        None => {}
    }
    true
}

pub(super) fn expand_json(
    v: serde_json::Value,
    vu: u64,
    room: u64,
    flow: &str,
    rng: &mut StdRng,
) -> serde_json::Value {
    use serde_json::Value;
    match v {
        Value::String(s) => match random_number(&s, rng) {
            Some(n) => Value::from(n),
            None => Value::String(expand(&s, vu, room, flow)),
        },
        Value::Array(a) => Value::Array(
            a.into_iter()
                .map(|x| expand_json(x, vu, room, flow, rng))
                .collect(),
        ),
        Value::Object(o) => Value::Object(
            o.into_iter()
                .map(|(k, x)| (k, expand_json(x, vu, room, flow, rng)))
                .collect(),
        ),
        other => other,
    }
}

/// A string that is exactly `{rand:LO:HI}` becomes a number drawn uniformly
/// from LO to HI (integers, both included), e.g. a random target;
/// `{around:N}` one drawn from N/2 to 3N/2 (a volume "around 30").
fn random_number(s: &str, rng: &mut StdRng) -> Option<i64> {
    if let Some(n) = s.strip_prefix("{around:").and_then(|r| r.strip_suffix('}')) {
        let n: i64 = n.trim().parse().ok()?;
        return (n > 0).then(|| rng.random_range((n / 2).max(1)..=n + n / 2));
    }
    let inner = s.strip_prefix("{rand:")?.strip_suffix('}')?;
    let (lo, hi) = inner.split_once(':')?;
    let (lo, hi): (i64, i64) = (lo.trim().parse().ok()?, hi.trim().parse().ok()?);
    (lo <= hi).then(|| rng.random_range(lo..=hi))
}

/// Whether the member that joined its room `index`-th (from 0), in a room of
/// `size`, is one of the room's `observers` (those that time what they
/// receive): members spread evenly over the order of joining, not the first
/// to join. A server that fans out in join order (a plain relay walks its
/// list of connections) serves its first members first, so timing only them
/// understates its mean latency; an even spread samples every place in
/// that order alike.
fn is_observer(index: u64, size: u64, observers: u64) -> bool {
    if observers == 0 {
        return false;
    }
    let stride = (size / observers).max(1);
    index.is_multiple_of(stride) && index / stride < observers
}

#[cfg(test)]
mod tests {
    use super::is_observer;

    fn observers(size: u64, wanted: u64) -> Vec<u64> {
        (0..size)
            .filter(|&i| is_observer(i, size, wanted))
            .collect()
    }

    #[test]
    fn observers_spread_over_the_order_of_joining() {
        assert_eq!(observers(500, 20).len(), 20);
        assert_eq!(observers(500, 20)[..3], [0, 25, 50]);
        assert_eq!(*observers(500, 20).last().unwrap(), 475);
        // Not a multiple: still exactly as many, from the whole room.
        let v = observers(1030, 20);
        assert_eq!(v.len(), 20);
        assert_eq!(*v.last().unwrap(), 19 * 51);
    }

    #[test]
    fn a_room_smaller_than_its_observers_is_all_observers() {
        assert_eq!(observers(5, 20), vec![0, 1, 2, 3, 4]);
        assert_eq!(observers(20, 20).len(), 20);
        assert_eq!(observers(10_000, 100_000).len(), 10_000);
    }

    #[test]
    fn no_observers_times_nobody() {
        assert!(observers(100, 0).is_empty());
    }
}
