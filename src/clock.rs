//! The server's monotonic clock in milliseconds since start: the one time base for cache
//! expiry, deadlines and the heartbeat, so that all of them compare plain integers; the
//! wall clock for dates; a per-thread coarse reading of both ([`coarse`]) for the publish
//! path; and the microsecond stamps of the latency histograms ([`stamp`]).

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

/// Calls of [`coarse`] answered from one reading before the clocks are read again.
const COARSE_USES: u32 = 32;

/// A thread's last reading of both clocks, and how many more calls of [`coarse`] it serves
/// (only on a thread that calls [`refresh`] as its rounds begin).
#[derive(Clone, Copy)]
struct Reading {
    mono: u64,
    unix: u64,
    left: u32,
    rounds: bool,
}

thread_local! {
    static LAST: std::cell::Cell<Reading> = const {
        std::cell::Cell::new(Reading { mono: 0, unix: 0, left: 0, rounds: false })
    };
}

/// Reads both clocks (`now_ms`, `unix_ms`) and keeps the reading for this thread's next
/// [`coarse`] calls: a worker calls it as each loop round begins.
pub fn refresh() -> (u64, u64) {
    refresh_at(Instant::now())
}

/// [`refresh`] with the monotonic clock as read at `at` (a reading the caller also uses:
/// a worker times its loop iterations with it).
pub fn refresh_at(at: Instant) -> (u64, u64) {
    let (mono, unix, _) = refresh_stamped(at);
    (mono, unix)
}

/// [`refresh_at`], with `at` as a latency stamp too ([`stamp`]): the clock's difference is
/// taken once for both.
pub fn refresh_stamped(at: Instant) -> (u64, u64, u32) {
    let since = at.saturating_duration_since(start());
    let r = Reading {
        mono: since.as_millis() as u64 + 1,
        unix: unix_ms(),
        left: COARSE_USES,
        rounds: true,
    };
    LAST.with(|c| c.set(r));
    (r.mono, r.unix, stamp_of(since))
}

/// Both clocks (`now_ms`, `unix_ms`) as this thread last read them, on a thread that calls
/// [`refresh`] as each of its rounds begins: that reading serves [`COARSE_USES`] calls (a
/// publish makes two), then the clocks are read again. So a reading is never older than the
/// worker's round, nor than the last 16 publishes of a long one, and a saturated worker does
/// not read the clocks twice per publish (docs/PERFORMANCE.md, "The publish path at
/// saturation"). Any other thread reads the clocks at every call.
pub fn coarse() -> (u64, u64) {
    LAST.with(|c| {
        let mut r = c.get();
        if r.left == 0 {
            return if r.rounds {
                refresh()
            } else {
                (now_ms(), unix_ms())
            };
        }
        r.left -= 1;
        c.set(r);
        (r.mono, r.unix)
    })
}

/// `at` as a latency stamp (`metrics::Stamp`): microseconds since start, modulo 2^32, never
/// 0 (which means "not stamped").
#[inline]
pub fn stamp(at: Instant) -> u32 {
    stamp_of(at.saturating_duration_since(start()))
}

/// A stamp `since` the start.
fn stamp_of(since: std::time::Duration) -> u32 {
    (since.as_micros() as u32).max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_coarse_reading_serves_a_bounded_number_of_calls_then_is_read_again() {
        let (mono, unix) = refresh();
        for _ in 0..COARSE_USES {
            assert_eq!(coarse(), (mono, unix));
        }
        std::thread::sleep(std::time::Duration::from_millis(3));
        let (m2, u2) = coarse();
        assert!(m2 > mono, "read again after {COARSE_USES} uses");
        assert!(u2 >= unix);
    }

    #[test]
    fn a_thread_that_never_refreshes_reads_the_clocks() {
        std::thread::spawn(|| {
            let a = coarse().0;
            std::thread::sleep(std::time::Duration::from_millis(3));
            let b = coarse().0;
            assert!(b > a);
            std::thread::sleep(std::time::Duration::from_millis(3));
            assert!(coarse().0 > b);
        })
        .join()
        .unwrap();
    }
}
