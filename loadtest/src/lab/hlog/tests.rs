//! The log format against HdrHistogram's documented text format and the crate's own
//! reader, and merging as the sum of histograms.

use super::*;

/// Samples (value ns, at ns since the epoch) spread over three seconds.
fn samples(seed: u64, n: u64) -> Vec<(u64, u64)> {
    (0..n)
        .map(|i| {
            let v = 1_000 + (i * 7919 + seed * 104_729) % 5_000_000;
            (v, i * 3_000_000_000 / n)
        })
        .collect()
}

/// The Unix seconds the samples fall in.
fn seconds(s: &[(u64, u64)]) -> usize {
    let base = crate::clock::epoch_unix_ns();
    let mut v: Vec<u64> = s.iter().map(|&(_, at)| (base + at) / INTERVAL_NS).collect();
    v.dedup();
    v.len()
}

fn lat_of(s: &[(u64, u64)]) -> Lat {
    let mut l = Lat::new();
    for &(v, at) in s {
        l.record(v, at);
    }
    l
}

fn recorded(h: &Histogram<u64>) -> Vec<(u64, u64)> {
    h.iter_recorded()
        .map(|v| (v.value_iterated_to(), v.count_at_value()))
        .collect()
}

fn log_of(s: &[(u64, u64)], tag: u64) -> Log {
    let mut side = Lat::new();
    side.record(tag * 1000, 10);
    Log {
        series: vec![
            ("publish_delivery".into(), lat_of(s)),
            ("send_lag".into(), side),
        ],
        reports: vec![format!("{{\"scenario\":\"pairs\",\"generator\":{tag}}}")],
    }
}

#[test]
fn the_text_is_hdrhistograms_format() {
    let s = samples(1, 3000);
    let log = log_of(&s, 1);
    let text = String::from_utf8(log.render(Path::new("a.hlog")).unwrap()).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert!(lines
        .iter()
        .any(|l| l.starts_with("#[StartTime: ") && l.ends_with(" (seconds since epoch)]")));
    assert!(lines.iter().any(|l| l.starts_with("#[BaseTime: ")));
    assert!(lines.contains(&LEGEND));
    assert_eq!(
        LEGEND,
        r#""StartTimestamp","Interval_Length","Interval_Max","Interval_Compressed_Histogram""#
    );
    let legend_at = lines.iter().position(|l| *l == LEGEND).unwrap();
    let intervals: Vec<&str> = lines[legend_at + 1..]
        .iter()
        .copied()
        .filter(|l| !l.starts_with('#'))
        .collect();
    // Each second of the headline (untagged), one of the tagged series.
    assert_eq!(intervals.len(), seconds(&s) + 1, "{text}");
    for l in &intervals {
        let fields: Vec<&str> = l.split(',').collect();
        let f = if l.starts_with("Tag=") {
            assert_eq!(fields[0], "Tag=send_lag");
            &fields[1..]
        } else {
            &fields[..]
        };
        assert_eq!(f.len(), 4, "{l}");
        for n in &f[..3] {
            let (a, b) = n.split_once('.').unwrap();
            assert!(a.parse::<u64>().is_ok() && b.len() == 3, "{l}");
        }
        assert_eq!(f[1], "1.000");
        assert!(
            f[3].starts_with("HISTFAA"),
            "V2 deflate cookie in base64: {l}"
        );
    }
    assert!(text.contains("#loadtest-report {\"scenario\":\"pairs\",\"generator\":1}\n"));
    // The crate's own reader sees the same intervals.
    let n = IntervalLogIterator::new(text.as_bytes())
        .filter(|e| matches!(e, Ok(LogEntry::Interval(_))))
        .count();
    assert_eq!(n, seconds(&s) + 1);
}

#[test]
fn a_log_reads_back_exactly() {
    let s = samples(2, 5000);
    let log = log_of(&s, 2);
    let text = log.render(Path::new("b.hlog")).unwrap();
    let back = Log::parse(&text, Path::new("b.hlog")).unwrap();
    assert_eq!(back.series.len(), 2);
    assert_eq!(back.series[0].0, "publish_delivery");
    assert_eq!(
        recorded(back.series[0].1.hist()),
        recorded(log.series[0].1.hist())
    );
    assert_eq!(back.reports, log.reports);
    let mut secs = Vec::new();
    back.series[0]
        .1
        .for_each_interval(|sec, h| -> Result<(), ()> {
            secs.push((sec, h.len()));
            Ok(())
        })
        .unwrap();
    assert_eq!(secs.len(), seconds(&s));
    assert_eq!(secs.iter().map(|s| s.1).sum::<u64>(), 5000);
}

#[test]
fn merging_two_logs_is_the_histogram_of_all_samples() {
    let (a, b) = (samples(3, 4000), samples(4, 2500));
    let dir = std::env::temp_dir().join(format!("loadtest-hlog-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (pa, pb) = (dir.join("a.hlog"), dir.join("b.hlog"));
    log_of(&a, 1).write(&pa).unwrap();
    log_of(&b, 2).write(&pb).unwrap();
    let mut merged = Log::read(&pa).unwrap();
    merged.absorb(Log::read(&pb).unwrap());
    let all: Vec<(u64, u64)> = a.iter().chain(&b).copied().collect();
    let want = lat_of(&all);
    assert_eq!(
        recorded(merged.get("publish_delivery").unwrap().hist()),
        recorded(want.hist())
    );
    assert_eq!(merged.get("send_lag").unwrap().hist().len(), 2);
    assert_eq!(merged.reports.len(), 2);
    // Second by second too, and through a merged log written and read again.
    let pm = dir.join("m.hlog");
    merged.write(&pm).unwrap();
    let again = Log::read(&pm).unwrap();
    let per_sec = |l: &Lat| {
        let mut v = Vec::new();
        l.for_each_interval(|sec, h| -> Result<(), ()> {
            v.push((sec, recorded(h)));
            Ok(())
        })
        .unwrap();
        v
    };
    assert_eq!(
        per_sec(again.get("publish_delivery").unwrap()),
        per_sec(&want)
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn broken_logs_are_refused_with_the_reason() {
    let p = Path::new("x.hlog");
    assert!(matches!(
        Log::parse(b"#only a comment\n", p),
        Err(LogError::Empty(_))
    ));
    assert!(matches!(
        Log::parse(b"0.000,1.000,1.0,@@@@\n", p),
        Err(LogError::Decode { .. })
    ));
    assert!(matches!(
        Log::parse(b"hello\n", p),
        Err(LogError::Parse { .. })
    ));
}
