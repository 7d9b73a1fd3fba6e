//! The counters of a run, defined once: [`Counts`] (plain, serializable,
//! added up across load processes) and [`AtomicCounts`] (bumped by every task
//! of a process while it runs). A new counter is one line in `counters!`.

use std::sync::atomic::{AtomicU64, Ordering};

use serde::{Deserialize, Serialize};

/// Declares the counters: each becomes a field of [`Counts`] and of
/// [`AtomicCounts`], is added up by [`Counts::add`] and read by
/// [`AtomicCounts::load`].
macro_rules! counters {
    ($( $(#[$doc:meta])* $name:ident, )*) => {
        /// What one load process counted (every field adds up across processes).
        #[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
        pub struct Counts {
            $( $(#[$doc])* #[serde(default)] pub $name: u64, )*
        }

        impl Counts {
            /// Adds `other`'s counts to these.
            pub fn add(&mut self, other: &Counts) {
                $( self.$name += other.$name; )*
            }
        }

        /// The same counters while a run goes on, bumped concurrently.
        #[derive(Debug, Default)]
        pub struct AtomicCounts {
            $( $(#[$doc])* pub $name: AtomicU64, )*
        }

        impl AtomicCounts {
            /// The counts now.
            pub fn load(&self) -> Counts {
                Counts { $( $name: self.$name.load(Ordering::Relaxed), )* }
            }
        }
    };
}

counters! {
    /// Users that joined.
    joined,
    /// Deliveries over the whole run.
    deliveries_total,
    /// Deliveries expected from this process's publishes.
    expected_total,
    /// Deliveries received while recording.
    deliveries,
    /// Deliveries expected from publishes sent while recording.
    expected,
    /// Publishes over the whole run.
    publishes_total,
    /// Publishes sent while recording.
    publishes,
    /// Acknowledgements received.
    acks,
    /// Successful requests.
    requests_ok,
    /// Failed or unanswered requests.
    requests_failed,
    /// Bytes received while recording.
    bytes_in,
    /// Bytes sent while recording.
    bytes_out,
    /// Successful HTTP calls.
    http_ok,
    /// Failed HTTP calls.
    http_failed,
    /// HTTP calls (ok or failed) that ended while recording.
    http_calls_rec,
    /// HTTP bytes sent over the whole run: request line, headers and body of
    /// every call that got a response (see `Report::http_bytes_out`).
    http_bytes_out,
    /// HTTP bytes received over the whole run: status line, headers and body
    /// of every response (see `Report::http_bytes_in`).
    http_bytes_in,
    /// Proximity events (spatial rooms) received while recording.
    proximity_events,
    /// WebSocket messages (frames) received while recording: a batch of
    /// held messages is one.
    frames_in,
    /// Chat messages sent as replies (`reply_to`) while recording.
    chat_replies,
    /// Bytes read at the users' sockets while recording (TCP payload: HTTP
    /// headers and WebSocket framing included).
    socket_bytes_in,
    /// Bytes written at the users' sockets while recording.
    socket_bytes_out,
    /// HTTP requests the users' HTTP transports made while recording.
    transport_requests,
    /// Server-API publishes answered 2xx over the whole run.
    api_publishes_total,
    /// Server-API publishes sent while recording and answered 2xx.
    api_publishes,
    /// Webhook events expected at the run's receiver: publishes (answered
    /// or sent) on the channels it names.
    webhooks_expected_total,
    /// Webhook requests the run's receiver got over the whole run.
    webhooks_received_total,
    /// Webhook requests it got while recording.
    webhooks_received,
    /// Distinct webhook ids it got (a repeat of an id is a redelivery).
    webhooks_distinct_total,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn atomic_counts_load_into_counts_that_add_up() {
        let live = AtomicCounts::default();
        live.deliveries.fetch_add(3, Ordering::Relaxed);
        live.http_bytes_in.fetch_add(7, Ordering::Relaxed);
        let mut a = live.load();
        assert_eq!((a.deliveries, a.http_bytes_in, a.acks), (3, 7, 0));
        a.add(&a.clone());
        assert_eq!((a.deliveries, a.http_bytes_in), (6, 14));
        let json = serde_json::to_value(&a).unwrap();
        assert_eq!(json["deliveries"], 6);
        let back: Counts = serde_json::from_value(json).unwrap();
        assert_eq!(back, a);
    }
}
