//! Unit tests of the side-by-side table.

use super::*;

fn row(kind: &'static str, round: usize, with: bool, p99: u64) -> PhaseFig {
    PhaseFig {
        kind,
        round,
        with,
        deliveries: 10_000,
        p50: 100,
        p99,
        load1: 1.5,
        server_cpu: 0.25,
        abuser: AbuserFig {
            sent: 5000,
            accepted: 1000,
            refused: 4000,
            closes_1013: 3,
            conns_started: 7,
            conns_429: 2,
            ..Default::default()
        },
        ..Default::default()
    }
}

#[test]
fn table_sets_with_beside_without() {
    let t = side_by_side(&[
        row("publish", 0, false, 400),
        row("publish", 0, true, 500),
        // Round 2 runs "with" first; the ratio still finds its own round's baseline.
        row("publish", 1, true, 300),
        row("publish", 1, false, 600),
        row("connect", 0, true, 100),
    ]);
    let lines: Vec<&str> = t.lines().collect();
    assert_eq!(lines.len(), 6, "{t}");
    assert!(lines[0].starts_with("abuser"));
    let cols = |l: &str| l.split_whitespace().map(String::from).collect::<Vec<_>>();
    let without = cols(lines[1]);
    assert_eq!(
        &without[..9],
        ["publish", "1", "without", "10000", "0", "0", "100", "400", "-"]
    );
    assert_eq!(without[10], "-"); // no abuser figures without the abuser
    let with = cols(lines[2]);
    assert_eq!(
        &with[7..19],
        ["500", "1.25", "0", "5000", "1000", "4000", "3", "7", "2", "0", "1.50", "0.25"]
    );
    assert_eq!(cols(lines[3])[8], "0.50");
    assert_eq!(cols(lines[5])[8], "?"); // no baseline
}

#[test]
fn pooled_merges_rounds_and_takes_the_median_ratio() {
    let with_lat = |us: &[u64]| {
        let mut l = Lat::new();
        for &u in us {
            l.record_ns(u * 1000);
        }
        l
    };
    let mk = |round, with, p99, lat: Lat| PhaseFig {
        delivery: lat,
        ..row("subscribe", round, with, p99)
    };
    // Round 1 is hit by a burst of host noise in its "without" phase: its own ratio is low,
    // the pooled figures and the median still come out of all three rounds.
    let rows = [
        mk(0, false, 100, with_lat(&[100; 99])),
        mk(0, true, 120, with_lat(&[120; 99])),
        mk(1, true, 130, with_lat(&[130; 99])),
        mk(1, false, 1000, with_lat(&[1000; 99])),
        mk(2, false, 100, with_lat(&[100; 99])),
        mk(2, true, 110, with_lat(&[110; 99])),
    ];
    let t = pooled(&rows);
    let lines: Vec<&str> = t.lines().collect();
    assert_eq!(lines.len(), 2, "{t}");
    let cols: Vec<&str> = lines[1].split_whitespace().collect();
    // 297 samples a side; the pooled p99 of "without" is the noisy round's 1000.
    assert_eq!(cols[..3], ["subscribe", "3", "1000"], "{t}");
    assert_eq!(cols[3], "130", "{t}");
    // Ratios 1.20, 0.13, 1.10: the median is 1.10.
    assert_eq!(cols[5], "1.10", "{t}");
    assert_eq!(cols[6], "0", "{t}");
}
