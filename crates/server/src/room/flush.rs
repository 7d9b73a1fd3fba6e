//! Sending what a room routed to one of this node's members: an event, or
//! what its delivery policy held as one `batch` frame or separate frames.

use std::time::Instant;

use plaza_core::Delivery;
use plaza_protocol::server::encode_batch;

use super::sink::Sink;
use crate::outbox::Outbox;

/// Queues `delivery` on `outbox`. An event is stamped `ordered_at`, and so
/// is the last of a flush (it may be the event that set the flush off); the
/// held ones are not live deliveries.
pub(super) fn send(
    outbox: &Outbox,
    room: &str,
    delivery: Delivery<'_>,
    ordered_at: Option<Instant>,
) {
    match delivery {
        Delivery::Event(e) => {
            outbox.send_event(e, ordered_at);
        }
        Delivery::Flush { events, aggregate } => match &events[..] {
            [] => {}
            [one] => {
                outbox.send_event(one, ordered_at);
            }
            _ if aggregate => {
                outbox.send(encode_batch(room, events.iter().map(|e| &e.frame[..])));
            }
            [held @ .., last] => {
                for e in held {
                    outbox.send_event(e, None);
                }
                outbox.send_event(last, ordered_at);
            }
        },
    }
}

/// What a room's routing calls for each member: queues the delivery on the
/// member's outbox when it is connected to this node.
pub(super) fn to_local(
    room: &str,
    ordered_at: Option<Instant>,
) -> impl Fn(&str, &Sink, Delivery<'_>) + '_ {
    move |_, sink, d| {
        if let Some(o) = &sink.outbox {
            send(o, room, d, ordered_at);
        }
    }
}
