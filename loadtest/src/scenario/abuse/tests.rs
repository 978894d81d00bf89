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
