//! The fan-out hot path: messages published into a room of N members, each
//! ordered by the room and encoded once, then got to every other member
//! either by queueing it on each member's outbox (`publish_to_outboxes`: how
//! members with a delivery policy get it) or by appending it once to the
//! room's feed, which each member's receiver reads (`publish_to_feed`: how
//! the others get it). Each iteration publishes a burst of 1 or 16 messages,
//! then every member's writer takes what it has, as a connection does when
//! it writes (16 is about what a busy member gets per write at a thousand
//! members).
//!
//! `cargo bench -p plaza-server --bench fanout`

use std::time::Instant;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use plaza_core::{JoinParams, PublishParams, Room, RoomConfig};
use plaza_server::outbox::{ConnectionControl, Outbox, OutboxReceiver, RoomFeed};
use serde_json::value::RawValue;

/// Member `i`'s session id, shaped like the server's (11 characters, random
/// from the first: see `plaza_broker::new_session_id`), so comparing two
/// costs what it does in a real room.
fn session(i: usize) -> String {
    format!(
        "{:011x}",
        (i as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 20
    )
}

fn room_with(members: usize) -> (Room<Outbox>, Vec<OutboxReceiver>) {
    let config = RoomConfig {
        max_members: members + 1,
        ..RoomConfig::default()
    };
    let mut room = Room::new("bench".into(), "bench".into(), config, 1, 0);
    let mut receivers = Vec::with_capacity(members);
    for i in 0..members {
        let (outbox, rx) = Outbox::new(4096, ConnectionControl::new());
        let params = JoinParams {
            session: session(i),
            resume_token: format!("t{i}"),
            name: format!("user{i}"),
            platform: "browser".into(),
            user: None,
            channels: Vec::new(),
            ticket: false,
            resume_only: None,
            policy: None,
            history: None,
            sink: outbox,
        };
        room.join(params, None, 0).expect("join");
        receivers.push(rx);
    }
    // Drop the presence events queued by the joins.
    drain(&mut receivers);
    (room, receivers)
}

/// The writers' side: each takes everything it has, by reference.
fn drain(receivers: &mut [OutboxReceiver]) {
    for rx in receivers {
        while rx.drain_into(512, |f| {
            std::hint::black_box(f.frame().len());
        }) > 0
        {}
    }
}

fn publish(
    room: &mut Room<Outbox>,
    from: &str,
    now: u64,
) -> std::sync::Arc<plaza_core::HistoryEntry> {
    let params = PublishParams {
        channel: "main".into(),
        event: "chat".into(),
        // ~100 bytes, like the load tests' messages.
        data: Some(RawValue::from_string(format!("{{\"text\":\"{}\"}}", "x".repeat(88))).unwrap()),
        id: None,
        topic: None,
        reply_to: None,
        echo: false,
    };
    let published = room.publish(from, params, now).expect("publish");
    published.entry.expect("new message")
}

fn fanout(c: &mut Criterion) {
    let mut group = c.benchmark_group("fanout");
    let from = session(0);
    for (members, burst) in [(100usize, 1u64), (1000, 1), (1000, 16)] {
        let id = format!("{members}x{burst}");
        group.throughput(Throughput::Elements(burst * (members as u64 - 1)));

        let (mut room, mut receivers) = room_with(members);
        let mut now = 1;
        group.bench_with_input(BenchmarkId::new("publish_to_outboxes", &id), &id, |b, _| {
            b.iter(|| {
                for _ in 0..burst {
                    now += 1;
                    let entry = publish(&mut room, &from, now);
                    let at = Some(Instant::now());
                    room.for_each_recipient(&entry, |_, sink| {
                        sink.send_event(&entry, at);
                    });
                }
                drain(&mut receivers);
            });
        });

        let (mut room, mut receivers) = room_with(members);
        let feed = RoomFeed::new(4096);
        for i in 0..members {
            let session = session(i);
            let member = room.member(&session).expect("member");
            let outbox = member.sink.as_ref().expect("connected");
            outbox
                .with_feed(&feed)
                .follow(session.as_str(), vec!["main".to_owned()]);
        }
        // Taking the follow makes each receiver a reader of the feed.
        drain(&mut receivers);
        let mut now = 1;
        group.bench_with_input(BenchmarkId::new("publish_to_feed", &id), &id, |b, _| {
            b.iter(|| {
                for _ in 0..burst {
                    now += 1;
                    let entry = publish(&mut room, &from, now);
                    feed.append(entry, Some(Instant::now()));
                }
                drain(&mut receivers);
                // As the room does: forget what every follower has read.
                feed.trim(feed.end());
            });
        });
    }
    group.finish();
}

criterion_group!(benches, fanout);
criterion_main!(benches);
