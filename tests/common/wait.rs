//! Waiting for something that should happen soon: the one wait-until helper. [`poll`] asks
//! again every [`POLL`] (or as often as [`poll_every`] is told) until it gets an answer or
//! the time is up; [`wait_until`] and [`wait_for`] are its yes/no forms (the second fails
//! the test, naming what never came).
//! Deadlines here only bound a wait: how long it took is never what a test checks.

use std::time::{Duration, Instant};

/// How long a test waits for a condition that should come soon before it fails.
pub const WAIT: Duration = Duration::from_secs(30);

/// How often a condition is asked again.
pub const POLL: Duration = Duration::from_millis(10);

/// Asks `f` every [`POLL`] until it returns `Some` (returned) or `within` passes (`None`).
/// It is asked at least once, and once more at the deadline.
pub fn poll<T>(within: Duration, f: impl FnMut() -> Option<T>) -> Option<T> {
    poll_every(POLL, within, f)
}

/// [`poll`], asking every `every` (less often, where asking costs the server something: a
/// `/metrics` scrape is a connection).
pub fn poll_every<T>(
    every: Duration,
    within: Duration,
    mut f: impl FnMut() -> Option<T>,
) -> Option<T> {
    let end = Instant::now() + within;
    loop {
        if let Some(t) = f() {
            return Some(t);
        }
        if Instant::now() >= end {
            return None;
        }
        std::thread::sleep(every);
    }
}

/// Asks `cond` until it holds or `within` passes; returns whether it held.
pub fn wait_until(within: Duration, mut cond: impl FnMut() -> bool) -> bool {
    poll(within, || cond().then_some(())).is_some()
}

/// Asks `cond` until it holds; fails the test with `what` after [`WAIT`].
pub fn wait_for(what: &str, cond: impl FnMut() -> bool) {
    assert!(wait_until(WAIT, cond), "timed out waiting for {what}");
}

/// A bound on a whole test that drives many waits (each bounded on its own): if the test is
/// still running after `limit`, the process says which test overran and exits (status 101,
/// a failed test's), so a wait that never ends fails the suite instead of holding it until
/// CI's own limit. Dropping the guard (the test's end) disarms it.
pub struct Watchdog {
    done: Option<std::sync::mpsc::Sender<()>>,
}

pub fn watchdog(limit: Duration, what: &str) -> Watchdog {
    let (done, rx) = std::sync::mpsc::channel::<()>();
    let what = what.to_string();
    std::thread::spawn(move || {
        if let Err(std::sync::mpsc::RecvTimeoutError::Timeout) = rx.recv_timeout(limit) {
            eprintln!("test {what} still running after {limit:?}: stopping the test process");
            std::process::exit(101);
        }
    });
    Watchdog { done: Some(done) }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        if let Some(d) = self.done.take() {
            let _ = d.send(());
        }
    }
}
