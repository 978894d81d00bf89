//! The server's health as `/health` reports it (DECISIONS §6, §7): every part that can fail
//! while the process keeps serving (a data directory whose disk is full or failing, a Redis
//! server that is unreachable) reports here when it starts and stops failing; `/health`
//! answers 503 with the reasons while any part fails, 204 otherwise.
//!
//! Reading it costs one atomic load while everything is healthy; the lock is taken only
//! when something changes or fails.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

/// A part asked at each `/health` request: `Err(why)` while it fails.
pub type Check = Box<dyn Fn() -> Result<(), String> + Send + Sync>;

/// Shared by every worker and helper thread.
#[derive(Default)]
pub struct Health {
    /// How many parts fail now.
    failing: AtomicUsize,
    /// Each failing part and why.
    problems: Mutex<Vec<(String, String)>>,
    /// Parts asked rather than reporting (set at start).
    checks: Vec<Check>,
}

impl std::fmt::Debug for Health {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Health")
            .field("failing", &self.failing)
            .field("checks", &self.checks.len())
            .finish_non_exhaustive()
    }
}

impl Health {
    /// Part `part` fails (`Some(why)`) or works again (`None`).
    pub fn report(&self, part: &str, problem: Option<String>) {
        let Ok(mut p) = self.problems.lock() else {
            return;
        };
        let known = p.iter().position(|(name, _)| name == part);
        match (known, problem) {
            (Some(i), Some(why)) => p[i].1 = why,
            (None, Some(why)) => p.push((part.to_string(), why)),
            (Some(i), None) => {
                p.remove(i);
            }
            (None, None) => {}
        }
        self.failing.store(p.len(), Ordering::Release);
    }

    /// Adds a part that is asked at each request (before the `Health` is shared).
    pub fn add_check(&mut self, check: Check) {
        self.checks.push(check);
    }

    /// Why the server is unhealthy, `None` when it is healthy.
    pub fn problem(&self) -> Option<String> {
        let mut text: Vec<String> = self.checks.iter().filter_map(|c| c().err()).collect();
        if self.failing.load(Ordering::Acquire) > 0 {
            if let Ok(p) = self.problems.lock() {
                text.extend(p.iter().map(|(part, why)| format!("{part}: {why}")));
            }
        }
        (!text.is_empty()).then(|| text.join("; "))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn problems_come_and_go_by_part() {
        let h = Health::default();
        assert_eq!(h.problem(), None);
        h.report("storage w0", Some("disk full".into()));
        h.report("redis 1", Some("connection refused".into()));
        h.report("storage w0", Some("I/O error".into()));
        assert_eq!(
            h.problem().as_deref(),
            Some("storage w0: I/O error; redis 1: connection refused")
        );
        h.report("storage w0", None);
        h.report("redis 1", None);
        h.report("never failed", None);
        assert_eq!(h.problem(), None);
        let mut asked = Health::default();
        asked.add_check(Box::new(|| Err("redis 0: down".into())));
        assert_eq!(asked.problem().as_deref(), Some("redis 0: down"));
    }
}
