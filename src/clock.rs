//! The server's monotonic clock in milliseconds since start: the one time base for cache
//! expiry, deadlines and the heartbeat, so that all of them compare plain integers.

use std::sync::OnceLock;
use std::time::Instant;

fn start() -> Instant {
    static START: OnceLock<Instant> = OnceLock::new();
    *START.get_or_init(Instant::now)
}

/// Milliseconds since the process first asked (never 0, so 0 can mean "unset").
pub fn now_ms() -> u64 {
    start().elapsed().as_millis() as u64 + 1
}

/// Milliseconds since the Unix epoch (wall clock; for ids and dates, never for deadlines).
pub fn unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}
