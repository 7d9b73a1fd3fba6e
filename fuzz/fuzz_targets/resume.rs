//! The resume path: a room driven through joins, messages, drops, leaves
//! and time, then resumes with known, stale and made-up tokens and any
//! `last_seq`. A resume must never panic, and what it hands back must be
//! what the protocol promises: the missed events in order, after `last_seq`
//! and none beyond the room's seq. The room also goes through the snapshot
//! a resume on another node loads (export, then import): the same state.
#![no_main]

use arbitrary::{Arbitrary, Unstructured};
use libfuzzer_sys::fuzz_target;
use plaza_core::{JoinParams, PublishParams, Resume, Room, RoomConfig};

#[derive(Arbitrary, Debug)]
enum Step {
    Join(u8),
    Publish {
        who: u8,
        side_channel: bool,
        id: Option<u8>,
    },
    Disconnect(u8),
    Leave(u8),
    /// Time passes (ms), then the room's timers run.
    Advance(u16),
    Resume {
        who: u8,
        token: Token,
        last_seq: LastSeq,
    },
}

#[derive(Arbitrary, Debug)]
enum Token {
    /// The member's own.
    Own,
    /// Another member's.
    Other(u8),
    Made(String),
}

#[derive(Arbitrary, Debug)]
enum LastSeq {
    /// Relative to the seq the member last saw.
    Near(i8),
    Any(u64),
}

const MEMBERS: u8 = 6;

/// One client's view: its session, token and the last seq it saw.
#[derive(Clone, Default)]
struct Client {
    session: String,
    token: String,
    seen: u64,
}

fn params(n: u32, sink: u32) -> JoinParams<u32> {
    JoinParams {
        session: format!("s{n}"),
        resume_token: format!("t{n}"),
        name: format!("m{n}"),
        platform: "fuzz".into(),
        user: None,
        channels: vec!["side".into()],
        ticket: false,
        policy: None,
        history: None,
        resume_only: None,
        sink,
    }
}

/// The state a resume on another node loads: carried there and back
/// unchanged, and valid.
fn check_snapshot(room: &Room<u32>) {
    let state = room.export(|sink| sink.to_string());
    let encoded = serde_json::to_vec(&state).expect("a state encodes");
    let decoded: plaza_core::RoomState = serde_json::from_slice(&encoded).expect("a state decodes");
    assert_eq!(decoded, state);
    decoded.validate().expect("an exported state is valid");
    let imported: Room<u32> = Room::import(decoded, |owner| owner.parse().unwrap_or(0));
    assert_eq!(imported.export(|sink| sink.to_string()), state);
}

fuzz_target!(|data: &[u8]| {
    // Steps are read one by one, as many as the input holds (64 at most).
    let mut u = Unstructured::new(data);
    let (Ok(history), Ok(resume_window)) = (u8::arbitrary(&mut u), u16::arbitrary(&mut u)) else {
        return;
    };
    let config = RoomConfig {
        history_size: usize::from(history % 16) + 1,
        resume_window_ms: u64::from(resume_window),
        // Few members: a full room is a case to reach, and each join stays cheap.
        max_members: 8,
        ..RoomConfig::default()
    };
    let mut room: Room<u32> = Room::new("r".into(), "R".into(), config, 1, 0);
    let mut clients: Vec<Option<Client>> = vec![None; usize::from(MEMBERS)];
    let (mut now, mut fresh) = (1u64, 0u32);
    for _ in 0..64 {
        let Ok(step) = Step::arbitrary(&mut u) else {
            break;
        };
        match step {
            Step::Join(w) => {
                let w = usize::from(w % MEMBERS);
                fresh += 1;
                if let Ok(j) = room.join(params(fresh, fresh), None, now) {
                    clients[w] = Some(Client {
                        session: j.frame.session.clone(),
                        token: j.frame.resume_token.clone(),
                        seen: j.client_seq,
                    });
                }
            }
            Step::Publish {
                who,
                side_channel,
                id,
            } => {
                let Some(c) = &clients[usize::from(who % MEMBERS)] else {
                    continue;
                };
                let p = PublishParams {
                    channel: if side_channel { "side" } else { "main" }.into(),
                    event: "e".into(),
                    data: None,
                    id: id.map(|i| format!("m{i}")),
                    topic: None,
                    reply_to: None,
                    echo: false,
                };
                let _ = room.publish(&c.session.clone(), p, now);
            }
            Step::Disconnect(w) => {
                if let Some(c) = &clients[usize::from(w % MEMBERS)] {
                    let _ = room.disconnect(&c.session.clone(), now);
                }
            }
            Step::Leave(w) => {
                if let Some(c) = clients[usize::from(w % MEMBERS)].take() {
                    let _ = room.leave(&c.session, now);
                }
            }
            Step::Advance(ms) => {
                now += u64::from(ms);
                let _ = room.tick(now);
            }
            Step::Resume {
                who,
                token,
                last_seq,
            } => {
                let w = usize::from(who % MEMBERS);
                let mine = clients[w].clone().unwrap_or_default();
                let token = match token {
                    Token::Own => mine.token.clone(),
                    Token::Other(o) => clients[usize::from(o % MEMBERS)]
                        .as_ref()
                        .map(|c| c.token.clone())
                        .unwrap_or_default(),
                    Token::Made(s) => s,
                };
                let last_seq = match last_seq {
                    LastSeq::Near(d) => mine.seen.saturating_add_signed(i64::from(d)),
                    LastSeq::Any(s) => s,
                };
                fresh += 1;
                let resume = Some(Resume { token, last_seq });
                let Ok(j) = room.join(params(fresh, fresh), resume, now) else {
                    continue;
                };
                let room_seq = j.frame.seq;
                if j.frame.resumed && j.frame.reason.is_none() {
                    let mut prev = last_seq;
                    for e in &j.missed {
                        assert!(
                            e.seq > prev,
                            "missed events out of order or not after last_seq"
                        );
                        prev = e.seq;
                    }
                    assert!(
                        prev <= room_seq.max(last_seq),
                        "a missed event beyond the room's seq"
                    );
                } else {
                    assert!(j.missed.is_empty(), "missed events without a resume");
                }
                clients[w] = Some(Client {
                    session: j.frame.session.clone(),
                    token: j.frame.resume_token.clone(),
                    seen: j.client_seq,
                });
            }
        }
    }
    check_snapshot(&room);
});
