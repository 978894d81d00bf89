//! The drain (`--drain SECONDS`): from the first SIGTERM or `POST /drain` on, the node
//! answers `/ready` with 503 and keeps serving and accepting for the drain time, so that a
//! load balancer stops sending it new clients before it closes the ones it has.
//!
//! Owns when the drain began and how long it lasts; nothing else. The signal thread
//! (`Server::run_until_signal`) waits for its end, the admin thread begins it on `POST
//! /drain`, and `/ready` (both ports) and `walletrelay_draining` read it: one atomic load.
//! A leaf: times are `clock::now_ms` readings, passed in.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// The drain of one process, shared by `Arc`.
#[derive(Debug)]
pub struct Drain {
    /// `--drain`, in milliseconds.
    length_ms: u64,
    /// `--drain` as given, in seconds (what `POST /drain` answers).
    seconds: f64,
    /// When it began (`clock::now_ms`, never 0); 0 while not draining.
    began_ms: AtomicU64,
}

/// What `POST /drain` and the signal thread learn of a drain in progress.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Draining {
    /// This call began it (not an earlier SIGTERM or `POST /drain`).
    pub began_now: bool,
    /// `--drain`, in seconds.
    pub seconds: f64,
    /// What is left of it, in milliseconds (0: over).
    pub remaining_ms: u64,
}

impl Draining {
    /// What is left of the drain.
    pub fn remaining(&self) -> Duration {
        Duration::from_millis(self.remaining_ms)
    }
}

impl Drain {
    /// A drain of `length` (not begun).
    pub fn new(length: Duration) -> Drain {
        Drain {
            length_ms: length.as_millis().min(u128::from(u64::MAX / 2)) as u64,
            seconds: length.as_secs_f64(),
            began_ms: AtomicU64::new(0),
        }
    }

    /// Begins the drain at `now_ms` unless it began before (idempotent); says what is left.
    pub fn begin(&self, now_ms: u64) -> Draining {
        let now_ms = now_ms.max(1);
        let began_now = self
            .began_ms
            .compare_exchange(0, now_ms, Ordering::AcqRel, Ordering::Acquire)
            .is_ok();
        let began = self.began_ms.load(Ordering::Acquire);
        Draining {
            began_now,
            seconds: self.seconds,
            remaining_ms: (began + self.length_ms).saturating_sub(now_ms),
        }
    }

    /// Whether the drain began (it stays begun: the process stops after it).
    pub fn is_draining(&self) -> bool {
        self.began_ms.load(Ordering::Relaxed) != 0
    }

    /// `--drain`, in seconds.
    pub fn seconds(&self) -> f64 {
        self.seconds
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_drain_begins_once_and_runs_down() {
        let d = Drain::new(Duration::from_millis(3000));
        assert!(!d.is_draining());
        let first = d.begin(1000);
        assert!(first.began_now && d.is_draining());
        assert_eq!(first.remaining_ms, 3000);
        let again = d.begin(2500);
        assert!(!again.began_now);
        assert_eq!(again.remaining_ms, 1500);
        assert_eq!(d.begin(9000).remaining_ms, 0);
        assert_eq!(again.seconds, 3.0);
        let none = Drain::new(Duration::ZERO);
        assert_eq!(none.begin(5).remaining_ms, 0);
        assert!(none.is_draining());
    }
}
