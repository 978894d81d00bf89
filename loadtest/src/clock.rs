//! The process's one time zero: an [`Instant`] and the wall-clock time it stands for.
//!
//! Every run context takes its epoch from here, so a stamp `ns since epoch` converts to Unix
//! time by one addition: what puts interval histograms of several generators (processes or
//! machines with synchronised clocks) on the same whole-second grid, and what `--start-at`
//! waits for. Owns no sockets and no figures.

use std::sync::OnceLock;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// The anchor, read once: the monotonic clock and the Unix time, ns, at the same moment.
fn anchor() -> &'static (Instant, u64) {
    static A: OnceLock<(Instant, u64)> = OnceLock::new();
    A.get_or_init(|| (Instant::now(), unix_now_ns()))
}

/// The process's epoch.
pub fn epoch() -> Instant {
    anchor().0
}

/// Unix time of [`epoch`], ns.
pub fn epoch_unix_ns() -> u64 {
    anchor().1
}

/// Unix time now, ns (0 before 1970).
pub fn unix_now_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0)
}

/// How far in the past a `--start-at` may be before it is refused.
pub const START_AT_TOLERANCE: Duration = Duration::from_secs(1);

/// How far in the future a `--start-at` may be (every run is bounded in time).
pub const START_AT_MAX_WAIT: Duration = Duration::from_secs(3600);

/// `--start-at`: Unix seconds, with a fraction if wanted (`date +%s.%N`, or
/// `date -d 07:30 +%s`); ns since the Unix epoch.
pub fn parse_start_at(s: &str) -> Result<u64, String> {
    let bad = || format!("bad --start-at {s:?}: Unix seconds, e.g. 1796284800.5");
    let (whole, frac) = s.trim().split_once('.').unwrap_or((s.trim(), ""));
    let digits = |t: &str| t.bytes().all(|c| c.is_ascii_digit());
    if whole.is_empty() || !digits(whole) || !digits(frac) {
        return Err(bad());
    }
    let secs: u64 = whole.parse().map_err(|_| bad())?;
    let mut nanos = 0u64;
    for (i, c) in frac.bytes().take(9).enumerate() {
        nanos += u64::from(c - b'0') * 10u64.pow(8 - i as u32);
    }
    secs.checked_mul(1_000_000_000)
        .and_then(|n| n.checked_add(nanos))
        .filter(|n| *n > 0)
        .ok_or_else(bad)
}

/// Why a `--start-at` cannot be waited for, checked against `now_ns` (Unix ns).
pub fn check_start_at(at_ns: u64, now_ns: u64) -> Result<(), String> {
    let tol = START_AT_TOLERANCE.as_nanos() as u64;
    let max = START_AT_MAX_WAIT.as_nanos() as u64;
    if at_ns + tol < now_ns {
        return Err(format!(
            "--start-at {:.3} is {:.3} s in the past (more than {} s): give a time to come \
             (now is {:.3})",
            at_ns as f64 / 1e9,
            (now_ns - at_ns) as f64 / 1e9,
            START_AT_TOLERANCE.as_secs(),
            now_ns as f64 / 1e9
        ));
    }
    if at_ns > now_ns + max {
        return Err(format!(
            "--start-at {:.3} is more than {} s away",
            at_ns as f64 / 1e9,
            START_AT_MAX_WAIT.as_secs()
        ));
    }
    Ok(())
}

/// A Unix time (ns) as ns since [`epoch`] (0 if before it).
pub fn since_epoch(unix_ns: u64) -> u64 {
    unix_ns.saturating_sub(epoch_unix_ns())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn start_at_forms_and_limits() {
        assert_eq!(
            parse_start_at("1796284800.5"),
            Ok(1_796_284_800_500_000_000)
        );
        assert_eq!(parse_start_at("1796284800"), Ok(1_796_284_800_000_000_000));
        assert!(parse_start_at("07:30").is_err());
        assert!(parse_start_at("-5").is_err());
        let now = 1_000_000_000_000;
        assert!(check_start_at(now - 500_000_000, now).is_ok());
        assert!(check_start_at(now + 5_000_000_000, now).is_ok());
        let e = check_start_at(now - 3_000_000_000, now).unwrap_err();
        assert!(e.contains("3.000 s in the past"), "{e}");
        assert!(check_start_at(now + 7_200_000_000_000, now).is_err());
    }
}
