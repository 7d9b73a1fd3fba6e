//! The fan-out hot path: one published message ordered by a room of 1,000
//! members, encoded once, and either queued to every other member's outbox
//! (`publish_to_outboxes`: how members with a delivery policy get it) or
//! appended once to the room's feed and read by every other member's
//! receiver (`publish_to_feed`: how the others get it).
//!
//! `cargo bench -p plaza-server --bench fanout`

use std::time::Instant;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use plaza_core::{JoinParams, PublishParams, Room, RoomConfig};
use plaza_server::outbox::{ConnectionControl, Outbox, OutboxReceiver, RoomFeed};
use serde_json::value::RawValue;

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
            session: format!("s{i}"),
            resume_token: format!("t{i}"),
            name: format!("user{i}"),
            platform: "browser".into(),
            user: None,
            channels: Vec::new(),
            ticket: false,
            policy: None,
            history: None,
            sink: outbox,
        };
        room.join(params, None, 0).expect("join");
        receivers.push(rx);
    }
    // Drop the presence events queued by the joins.
    for rx in &mut receivers {
        while rx.try_recv().is_ok() {}
    }
    (room, receivers)
}

fn payload() -> Box<RawValue> {
    // ~100 bytes, like the load tests' messages.
    RawValue::from_string(format!("{{\"text\":\"{}\"}}", "x".repeat(88))).unwrap()
}

fn fanout(c: &mut Criterion) {
    let mut group = c.benchmark_group("fanout");
    for members in [100usize, 1000] {
        let (mut room, mut receivers) = room_with(members);
        group.throughput(Throughput::Elements(members as u64 - 1));
        group.bench_with_input(
            BenchmarkId::new("publish_to_outboxes", members),
            &members,
            |b, _| {
                let mut now = 1;
                b.iter(|| {
                    now += 1;
                    let params = PublishParams {
                        channel: "main".into(),
                        event: "chat".into(),
                        data: Some(payload()),
                        id: None,
                        topic: None,
                        reply_to: None,
                        echo: false,
                    };
                    let published = room.publish("s0", params, now).expect("publish");
                    let entry = published.entry.expect("new message");
                    let at = Some(Instant::now());
                    room.for_each_recipient(&entry, |_, sink| {
                        sink.send_event(&entry, at);
                    });
                    // The writers' side: take every queued frame off again.
                    for rx in &mut receivers {
                        while rx.try_recv().is_ok() {}
                    }
                });
            },
        );
    }
    for members in [100usize, 1000] {
        let (mut room, mut receivers) = room_with(members);
        let feed = RoomFeed::new(4096);
        for (i, rx) in receivers.iter_mut().enumerate() {
            let outbox = &room.member(&format!("s{i}")).expect("member").sink;
            let outbox = outbox.as_ref().expect("connected");
            outbox
                .with_feed(&feed)
                .follow(&format!("s{i}"), vec!["main".into()]);
            // Taking the follow makes the receiver a reader of the feed.
            while rx.try_recv().is_ok() {}
        }
        group.throughput(Throughput::Elements(members as u64 - 1));
        group.bench_with_input(
            BenchmarkId::new("publish_to_feed", members),
            &members,
            |b, _| {
                let mut now = 1;
                b.iter(|| {
                    now += 1;
                    let params = PublishParams {
                        channel: "main".into(),
                        event: "chat".into(),
                        data: Some(payload()),
                        id: None,
                        topic: None,
                        reply_to: None,
                        echo: false,
                    };
                    let published = room.publish("s0", params, now).expect("publish");
                    let entry = published.entry.expect("new message");
                    feed.append(entry, Some(Instant::now()));
                    // The writers' side: each reader takes what is new for it.
                    for rx in &mut receivers {
                        while rx.try_recv().is_ok() {}
                    }
                    if now % 1024 == 0 {
                        feed.trim(feed.end());
                    }
                });
            },
        );
    }
    group.finish();
}

criterion_group!(benches, fanout);
criterion_main!(benches);
