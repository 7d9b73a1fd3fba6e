use std::time::{SystemTime, UNIX_EPOCH};

use plaza_core::Millis;

/// Wall-clock Unix milliseconds: the only place the runtime reads the clock
/// for room logic.
pub fn now_ms() -> Millis {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as Millis)
        .unwrap_or(0)
}
