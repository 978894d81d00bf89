//! The standard `process_*` families of Prometheus (what every client library exports):
//! CPU time, resident memory, open and allowed file descriptors and the start time, read
//! from `/proc/self` when `/metrics` is rendered on the admin thread (never on a worker:
//! counting `/proc/self/fd` walks one entry per open connection).
//!
//! Owns the reading and the parsing (pure functions, tested beside them); a figure that
//! cannot be read is left out rather than guessed.

use std::fmt::Write as _;

use crate::metrics::{family, Kind};

/// The fields of `/proc/self/stat` used here, in clock ticks and pages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stat {
    /// User CPU time (ticks).
    pub utime: u64,
    /// System CPU time (ticks).
    pub stime: u64,
    /// Start time after boot (ticks).
    pub starttime: u64,
    /// Resident set size (pages).
    pub rss: u64,
}

/// Parses `/proc/<pid>/stat`. The command name (field 2) is in parentheses and may hold
/// spaces and parentheses itself, so fields are counted from the last `)`.
pub fn parse_stat(text: &str) -> Option<Stat> {
    let rest = &text[text.rfind(')')? + 1..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    // `rest` starts with field 3 (the state): field N is f[N - 3].
    let field = |n: usize| f.get(n - 3)?.parse::<u64>().ok();
    Some(Stat {
        utime: field(14)?,
        stime: field(15)?,
        starttime: field(22)?,
        rss: field(24)?,
    })
}

/// The boot time (`btime`, Unix seconds) of `/proc/stat`.
pub fn parse_btime(text: &str) -> Option<u64> {
    text.lines()
        .find_map(|l| l.strip_prefix("btime "))
        .and_then(|v| v.trim().parse().ok())
}

/// The soft limit of `Max open files` in `/proc/<pid>/limits` (`None` when unlimited).
pub fn parse_max_fds(text: &str) -> Option<u64> {
    text.lines()
        .find_map(|l| l.strip_prefix("Max open files"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
}

/// `sysconf(name)`, when the system answers it.
fn sysconf(name: libc::c_int) -> Option<u64> {
    // SAFETY: sysconf(3) only reads the constant asked for; it touches no memory of ours.
    let v = unsafe { libc::sysconf(name) };
    u64::try_from(v).ok().filter(|&v| v > 0)
}

/// Appends the `process_*` families this process can read now.
pub fn render(out: &mut String) {
    let stat = std::fs::read_to_string("/proc/self/stat")
        .ok()
        .and_then(|t| parse_stat(&t));
    let ticks = sysconf(libc::_SC_CLK_TCK);
    if let (Some(st), Some(tck)) = (stat, ticks) {
        let cpu = (st.utime + st.stime) as f64 / tck as f64;
        write_sample(
            out,
            "process_cpu_seconds_total",
            Kind::Counter,
            "Total user and system CPU time spent in seconds.",
            cpu,
        );
        let boot = std::fs::read_to_string("/proc/stat")
            .ok()
            .and_then(|t| parse_btime(&t));
        if let Some(boot) = boot {
            let start = boot as f64 + st.starttime as f64 / tck as f64;
            write_sample(
                out,
                "process_start_time_seconds",
                Kind::Gauge,
                "Start time of the process since unix epoch in seconds.",
                start,
            );
        }
    }
    if let (Some(st), Some(page)) = (stat, sysconf(libc::_SC_PAGESIZE)) {
        write_sample(
            out,
            "process_resident_memory_bytes",
            Kind::Gauge,
            "Resident memory size in bytes.",
            (st.rss * page) as f64,
        );
    }
    if let Ok(dir) = std::fs::read_dir("/proc/self/fd") {
        // The walk's own descriptor is among them, as in every exporter.
        let open = dir.count();
        write_sample(
            out,
            "process_open_fds",
            Kind::Gauge,
            "Number of open file descriptors.",
            open as f64,
        );
    }
    let max = std::fs::read_to_string("/proc/self/limits")
        .ok()
        .and_then(|t| parse_max_fds(&t));
    if let Some(max) = max {
        write_sample(
            out,
            "process_max_fds",
            Kind::Gauge,
            "Maximum number of open file descriptors.",
            max as f64,
        );
    }
}

fn write_sample(out: &mut String, name: &str, kind: Kind, help: &str, v: f64) {
    family(out, name, kind, help);
    let _ = writeln!(out, "{name} {v}");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_proc_files() {
        let stat = "4242 (wallet relay) (x) S 1 4242 4242 0 -1 4194560 500 0 0 0 \
                    250 75 0 0 20 0 9 0 123456 987654321 2048 18446744073709551615";
        assert_eq!(
            parse_stat(stat),
            Some(Stat {
                utime: 250,
                stime: 75,
                starttime: 123456,
                rss: 2048
            })
        );
        assert_eq!(parse_stat("garbage"), None);
        assert_eq!(
            parse_btime("cpu 1 2 3\nbtime 1700000000\n"),
            Some(1_700_000_000)
        );
        let limits = "Limit                     Soft Limit           Hard Limit           Units\n\
                      Max open files            20000                20000                files\n";
        assert_eq!(parse_max_fds(limits), Some(20000));
        assert_eq!(
            parse_max_fds("Max open files            unlimited            unlimited    files"),
            None
        );
    }

    #[test]
    fn renders_every_family_here() {
        let mut s = String::new();
        render(&mut s);
        for name in [
            "process_cpu_seconds_total",
            "process_resident_memory_bytes",
            "process_open_fds",
            "process_max_fds",
            "process_start_time_seconds",
        ] {
            assert!(
                s.contains(&format!("# TYPE {name} ")),
                "{name} missing:\n{s}"
            );
            let v: f64 = s
                .lines()
                .find_map(|l| l.strip_prefix(&format!("{name} ")))
                .and_then(|v| v.parse().ok())
                .unwrap_or_else(|| panic!("{name} has no value:\n{s}"));
            // A young test process may have used no whole tick of CPU yet.
            let floor = if name == "process_cpu_seconds_total" {
                0.0
            } else {
                1.0
            };
            assert!(v >= floor, "{name} {v}");
        }
    }
}
