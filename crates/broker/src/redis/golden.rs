//! Golden vectors of what the Redis broker itself encodes (the `redis-*`
//! files of `formats/golden/`, see its README.md): each must decode with
//! this build and encode again to the same bytes, since nodes of two
//! versions share one Redis during a rolling upgrade.

use std::path::PathBuf;

use plaza_core::TicketGrant;

use super::{tickets, wire};

const TICKET_GRANT: &str = "redis-ticket-grant.json";
const LOG_MESSAGE: &str = "redis-log-message.bin";
/// 2^53 + 1, past what a double holds exactly.
const PAST_DOUBLES: u64 = 9_007_199_254_740_993;
const T0: u64 = 1_700_000_000_123;

fn path(file: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../formats/golden")
        .join(file)
}

fn read(file: &str) -> Vec<u8> {
    std::fs::read(path(file)).unwrap_or_else(|e| panic!("golden vector {file}: {e}"))
}

fn grant() -> TicketGrant {
    TicketGrant {
        room: "lobby.42".into(),
        name: "Zoë \"the\" ✓".into(),
        platform: "web".into(),
    }
}

/// A pub/sub message as a room's channel carries it: the log position and
/// time (8 bytes each, big-endian), then the entry's payload, here a log
/// record (`record-publish.json`).
fn log_message() -> Vec<u8> {
    wire::encode_message(PAST_DOUBLES, T0, &read("record-publish.json"))
}

#[test]
fn golden_ticket_grant_decodes_and_encodes_to_the_same_bytes() {
    let bytes = read(TICKET_GRANT);
    let decoded = tickets::decode(&bytes).expect("the grant decodes");
    assert_eq!(decoded, grant());
    assert_eq!(tickets::encode(&decoded).as_bytes(), bytes);
}

#[test]
fn golden_log_message_decodes_and_encodes_to_the_same_bytes() {
    let bytes = read(LOG_MESSAGE);
    let entry = wire::decode_message(&bytes).expect("the message decodes");
    assert_eq!((entry.n, entry.ts), (PAST_DOUBLES, T0));
    assert_eq!(entry.payload[..], read("record-publish.json")[..]);
    assert_eq!(
        wire::encode_message(entry.n, entry.ts, &entry.payload),
        bytes
    );
    assert_eq!(log_message(), bytes);
}

/// Writes the vectors whose files do not exist yet; never overwrites one.
/// Run with `cargo test -p plaza-broker --lib write_missing_golden_vectors -- --ignored`.
#[test]
#[ignore = "writes formats/golden/; run by hand when adding a case"]
fn write_missing_golden_vectors() {
    for (file, bytes) in [
        (TICKET_GRANT, tickets::encode(&grant()).into_bytes()),
        (LOG_MESSAGE, log_message()),
    ] {
        if !path(file).exists() {
            std::fs::write(path(file), bytes).expect("writes");
        }
    }
}
