//! Tests of the log, the sync thread and recovery together, on real files in a temporary
//! directory.

use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::sync::mpsc::{channel, Receiver};
use std::time::Duration;

use super::entry::{Entry, Ns};
use super::files::{self, segment_name};
use super::*;

pub(crate) struct TempDir(pub PathBuf);

impl TempDir {
    pub(crate) fn new(name: &str) -> TempDir {
        let p = std::env::temp_dir().join(format!("wr-store-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).unwrap();
        TempDir(p)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn cfg(segment_bytes: u64) -> LogConfig {
    LogConfig {
        segment_bytes,
        ..LogConfig::default()
    }
}

fn open(dir: &Path, owner: &str, c: LogConfig, s: &Syncer) -> (Log, Receiver<SyncEvent>) {
    let (tx, rx) = channel();
    let log = Log::open(
        dir,
        owner,
        c,
        s,
        Box::new(move |ev| {
            let _ = tx.send(ev);
        }),
    )
    .unwrap();
    (log, rx)
}

type Found = Vec<(String, Loc, Vec<u8>)>;

fn read_back(dir: &Path) -> (Found, RecoveryStats) {
    let mut found = Vec::new();
    let stats = recover(dir, |o, loc, p| {
        found.push((o.to_string(), loc, p.to_vec()));
        Ok(())
    })
    .unwrap();
    (found, stats)
}

fn payload(i: usize) -> Vec<u8> {
    format!("record number {i} {}", "x".repeat(i % 37)).into_bytes()
}

fn disk_bytes(dir: &Path) -> u64 {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().metadata().unwrap().len())
        .sum()
}

fn wait_for(rx: &Receiver<SyncEvent>, want: impl Fn(&SyncEvent) -> bool) -> Vec<SyncEvent> {
    let mut seen = Vec::new();
    loop {
        let ev = rx
            .recv_timeout(Duration::from_secs(20))
            .unwrap_or_else(|_| panic!("no awaited event; got {seen:?}"));
        seen.push(ev);
        if want(&ev) {
            return seen;
        }
    }
}

#[test]
fn records_come_back_in_order_with_their_locs_across_segments() {
    let d = TempDir::new("order");
    let s = Syncer::start(FsyncMode::Off).unwrap();
    let (mut log, _rx) = open(&d.0, "w0", cfg(300), &s);
    let mut want = Vec::new();
    for i in 0..40 {
        let a = log.append(&payload(i)).unwrap();
        assert_eq!(a.lsn, i as u64 + 1);
        want.push(("w0".to_string(), a.loc, payload(i)));
        if i % 3 == 0 {
            log.flush().unwrap();
        }
    }
    assert_eq!(log.flush().unwrap(), 40);
    let e = Entry::WebhookAdd {
        topic: "t",
        url: "https://a.example/h",
    };
    let a = log.append_entry(&e).unwrap();
    // The count of records appended is published at each write of a batch.
    assert_eq!(log.metrics().records_appended.get(), 40);
    log.flush().unwrap();
    assert_eq!(log.metrics().records_appended.get(), 41);
    let mut enc = Vec::new();
    e.encode(&mut enc).unwrap();
    want.push(("w0".to_string(), a.loc, enc));
    drop((log, s));
    let (found, stats) = read_back(&d.0);
    assert!(stats.segments > 3, "segments rotate at the configured size");
    assert_eq!(found, want);
    assert_eq!(stats.skipped_regions + stats.torn_tails, 0);
    assert_eq!(stats.owners, vec!["w0".to_string()]);
    for f in std::fs::read_dir(&d.0).unwrap() {
        let len = f.unwrap().metadata().unwrap().len();
        assert!(len <= 300 + 100, "segment of {len} bytes");
    }
}

/// Writes five records in one segment; returns the file and the record boundaries.
fn five_records(dir: &Path) -> (PathBuf, Vec<usize>) {
    let s = Syncer::start(FsyncMode::Off).unwrap();
    let (mut log, _rx) = open(dir, "w0", cfg(1 << 20), &s);
    let mut ends = Vec::new();
    for i in 0..5 {
        let a = log.append(&payload(i + 10)).unwrap();
        ends.push((a.loc.offset + a.loc.len) as usize);
    }
    log.flush().unwrap();
    let path = dir.join(segment_name("w0", 1));
    assert!(path.exists());
    (path, ends)
}

#[test]
fn a_torn_tail_is_cut_at_every_byte_offset_of_the_last_records() {
    let d = TempDir::new("torn");
    let (path, ends) = five_records(&d.0);
    let full = std::fs::read(&path).unwrap();
    for cut in ends[1]..full.len() {
        std::fs::write(&path, &full[..cut]).unwrap();
        let (found, stats) = read_back(&d.0);
        let whole = ends.iter().filter(|&&e| e <= cut).count();
        assert_eq!(found.len(), whole, "cut at {cut}");
        assert_eq!(found.last().unwrap().2, payload(whole - 1 + 10));
        let boundary = ends[whole - 1];
        assert_eq!(stats.torn_tails, u64::from(cut != boundary), "cut at {cut}");
        assert_eq!(stats.truncated_bytes, (cut - boundary) as u64);
        assert_eq!(stats.skipped_regions, 0);
        assert_eq!(std::fs::metadata(&path).unwrap().len(), boundary as u64);
    }
    // A power loss may leave zeros after the last record: cut as a torn tail too.
    let mut zeros = full.clone();
    zeros.extend_from_slice(&[0u8; 4096]);
    std::fs::write(&path, &zeros).unwrap();
    let (found, stats) = read_back(&d.0);
    assert_eq!((found.len(), stats.torn_tails), (5, 1));
    assert_eq!(std::fs::read(&path).unwrap(), full);
}

#[test]
fn a_damaged_record_in_the_middle_is_skipped_and_counted() {
    let d = TempDir::new("flip");
    let (path, ends) = five_records(&d.0);
    let full = std::fs::read(&path).unwrap();
    for at in ends[1]..ends[2] {
        let mut bad = full.clone();
        bad[at] ^= 0x5A;
        std::fs::write(&path, &bad).unwrap();
        let (found, stats) = read_back(&d.0);
        let got: Vec<Vec<u8>> = found.into_iter().map(|f| f.2).collect();
        let want: Vec<Vec<u8>> = [10, 11, 13, 14].iter().map(|&i| payload(i)).collect();
        assert_eq!(got, want, "flip at {at}");
        assert_eq!(stats.skipped_regions, 1);
        assert_eq!(stats.skipped_bytes, (ends[2] - ends[1]) as u64);
        assert_eq!(stats.torn_tails, 0);
        assert_eq!(std::fs::read(&path).unwrap(), bad, "nothing cut");
    }
}

#[test]
fn files_that_are_not_ours_are_ignored_and_never_deleted() {
    let d = TempDir::new("foreign");
    std::fs::write(d.0.join("notes.txt"), b"hello").unwrap();
    let stranger = d.0.join(segment_name("w0", 3));
    std::fs::write(&stranger, b"some other program's file").unwrap();
    let (found, stats) = read_back(&d.0);
    assert!(found.is_empty());
    assert_eq!(stats.foreign_files, 2);
    let s = Syncer::start(FsyncMode::Off).unwrap();
    let (mut log, _rx) = open(&d.0, "w0", cfg(1 << 20), &s);
    assert!(log.candidates().is_empty());
    assert!(log.retire(3).is_err());
    let a = log.append(b"x").unwrap();
    assert_eq!(a.loc.segment, 4, "numbered after every existing segment");
    drop((log, s));
    assert!(stranger.exists());
}

#[test]
fn always_groups_commits_and_reports_every_lsn_synced() {
    let d = TempDir::new("always");
    let s = Syncer::start(FsyncMode::Always).unwrap();
    let (mut log, rx) = open(&d.0, "w0", cfg(4096), &s);
    for i in 0..300 {
        log.append(&payload(i)).unwrap();
        log.flush().unwrap();
    }
    let seen = wait_for(&rx, |e| *e == SyncEvent::Synced(300));
    let mut last = 0;
    for e in &seen {
        let SyncEvent::Synced(n) = *e else {
            panic!("unexpected {e:?}");
        };
        assert!(n > last, "synced LSNs increase: {seen:?}");
        last = n;
    }
    let m = log.metrics();
    assert_eq!(m.writes.get(), 300);
    assert!(m.syncs.get() <= 300 && m.syncs.get() >= 1);
    assert_eq!(m.sync_latency.count(), m.syncs.get());
    assert_eq!(log.health(), Ok(()));
}

#[test]
fn everysec_syncs_without_being_asked_and_shutdown_syncs_the_rest() {
    let d = TempDir::new("everysec");
    let s = Syncer::start(FsyncMode::Everysec).unwrap();
    let (mut log, rx) = open(&d.0, "w0", cfg(4096), &s);
    log.append(b"one").unwrap();
    log.flush().unwrap();
    wait_for(&rx, |e| *e == SyncEvent::Synced(1));
    log.append(b"two").unwrap();
    log.flush().unwrap();
    s.shutdown();
    let all: Vec<SyncEvent> = rx.try_iter().collect();
    assert!(all.contains(&SyncEvent::Synced(2)), "{all:?}");
}

/// A cache model: the newest `keep` records are live; compaction re-appends them.
struct Model {
    live: VecDeque<(Loc, Vec<u8>)>,
    keep: usize,
}

impl Model {
    fn push(&mut self, log: &mut Log, p: Vec<u8>) {
        let a = log.append(&p).unwrap();
        self.live.push_back((a.loc, p));
        if self.live.len() > self.keep {
            let (loc, _) = self.live.pop_front().unwrap();
            log.release(loc);
        }
    }
    fn compact(&mut self, log: &mut Log) -> Vec<SegmentId> {
        let segs = log.candidates();
        for &seg in &segs {
            for (loc, p) in self.live.iter_mut() {
                if loc.segment == seg {
                    *loc = log.append(p).unwrap().loc;
                }
            }
            log.retire(seg).unwrap();
        }
        segs
    }
    fn live_bytes(&self) -> u64 {
        self.live.iter().map(|(l, _)| l.len as u64).sum()
    }
}

#[test]
fn reclamation_keeps_the_disk_within_twice_the_live_bytes_plus_a_segment() {
    let d = TempDir::new("reclaim");
    let seg = 2048;
    let s = Syncer::start(FsyncMode::Off).unwrap();
    let (mut log, rx) = open(&d.0, "w0", cfg(seg), &s);
    let mut m = Model {
        live: VecDeque::new(),
        keep: 40,
    };
    let (mut retired, mut reported) = (0, 0);
    for i in 0..3000 {
        m.push(&mut log, payload(i));
        if i % 25 == 24 {
            retired += m.compact(&mut log).len();
            log.flush().unwrap();
            while reported < retired {
                wait_for(&rx, |e| matches!(e, SyncEvent::Retired(_)));
                reported += 1;
            }
            let (live, on_disk) = log.usage();
            assert_eq!(live, m.live_bytes(), "live accounting at {i}");
            let disk = disk_bytes(&d.0);
            assert_eq!(disk, on_disk, "every retired file is gone once reported");
            assert!(
                disk <= 2 * live + seg + 200,
                "at {i}: {disk} bytes on disk for {live} live"
            );
        }
    }
    assert!(retired > 50, "compaction ran ({retired} segments)");
    assert_eq!(log.metrics().segments_retired.get(), retired as u64);
    drop((log, s));
    let (found, _) = read_back(&d.0);
    for (loc, p) in &m.live {
        assert!(
            found.iter().any(|f| f.1 == *loc && f.2 == *p),
            "{loc:?} lost"
        );
    }
}

/// Twenty records written in 256-byte segments, the last three kept live, and the sealed
/// segments compacted (the copies still in the batch): the model, the retired segments,
/// and those of them that held live records.
fn compacted(log: &mut Log) -> (Model, Vec<SegmentId>, Vec<SegmentId>) {
    let mut m = Model {
        live: VecDeque::new(),
        keep: 3,
    };
    for i in 0..20 {
        m.push(log, payload(i));
    }
    log.flush().unwrap();
    let had_live: Vec<SegmentId> = m.live.iter().map(|(l, _)| l.segment).collect();
    let segs = m.compact(log);
    let with_live = segs
        .iter()
        .copied()
        .filter(|s| had_live.contains(s))
        .collect();
    (m, segs, with_live)
}

#[test]
fn a_retired_segment_stays_until_its_copies_are_written_and_synced() {
    let d = TempDir::new("retire");
    let s = Syncer::start(FsyncMode::Off).unwrap();
    let (mut log, rx) = open(&d.0, "w0", cfg(256), &s);
    let (m, segs, with_live) = compacted(&mut log);
    assert!(!with_live.is_empty());
    // Their copies are still in the batch: a crash now must find the originals on disk.
    std::thread::sleep(Duration::from_millis(300));
    for seg in &with_live {
        assert!(
            d.0.join(segment_name("w0", *seg)).exists(),
            "{seg} deleted early"
        );
    }
    let copies_lsn = log.last_lsn();
    log.flush().unwrap();
    let last = *with_live.last().unwrap();
    let seen = wait_for(&rx, |e| *e == SyncEvent::Retired(last));
    let synced_at = seen
        .iter()
        .position(|e| matches!(e, SyncEvent::Synced(n) if *n >= copies_lsn))
        .expect("the copies were synced");
    for seg in &with_live {
        let retired_at = seen.iter().position(|e| *e == SyncEvent::Retired(*seg));
        assert!(retired_at > Some(synced_at), "{seg}: {seen:?}");
    }
    // "Crash" right after the delete: the re-appended copies are all there.
    drop(log);
    std::mem::forget(s);
    let (found, _) = read_back(&d.0);
    for (loc, p) in &m.live {
        assert!(found.iter().any(|f| f.1 == *loc && f.2 == *p));
    }
    for seg in &segs {
        assert!(!d.0.join(segment_name("w0", *seg)).exists());
    }
}

#[test]
fn a_new_worker_count_rewrites_into_the_current_owners_and_drops_the_rest() {
    let d = TempDir::new("threads");
    let s = Syncer::start(FsyncMode::Off).unwrap();
    for (w, n) in [("w0", 3), ("w1", 4), ("w2", 5)] {
        let (mut log, _rx) = open(&d.0, w, cfg(1 << 20), &s);
        for i in 0..n {
            log.append(&payload(i)).unwrap();
        }
        log.flush().unwrap();
    }
    let (found, stats) = read_back(&d.0);
    assert_eq!(stats.owners, vec!["w0", "w1", "w2"]);
    assert_eq!(found.len(), 12);
    // Restart with two workers: everything goes to w0 and w1, then the old files go.
    let (mut w0, _r0) = open(&d.0, "w0", cfg(1 << 20), &s);
    let (mut w1, _r1) = open(&d.0, "w1", cfg(1 << 20), &s);
    for (k, (_, _, p)) in found.iter().enumerate() {
        let log = if k % 2 == 0 { &mut w0 } else { &mut w1 };
        log.append(p).unwrap();
    }
    for log in [&mut w0, &mut w1] {
        log.flush().unwrap();
        log.sync_now().unwrap();
        assert!(log.discard_previous().unwrap() >= 1);
    }
    assert_eq!(remove_owners_except(&d.0, &["w0", "w1"]).unwrap(), 1);
    drop((w0, w1, s));
    let (again, stats) = read_back(&d.0);
    assert_eq!(stats.owners, vec!["w0", "w1"]);
    let mut a: Vec<_> = again.into_iter().map(|f| f.2).collect();
    let mut b: Vec<_> = found.into_iter().map(|f| f.2).collect();
    a.sort();
    b.sort();
    assert_eq!(a, b);
}

#[test]
fn entries_written_by_the_log_decode_after_recovery() {
    let d = TempDir::new("entries");
    let s = Syncer::start(FsyncMode::Off).unwrap();
    let (mut log, _rx) = open(&d.0, "w3", LogConfig::default(), &s);
    let msg = Entry::Message {
        ns: Ns::V1,
        topic: "topic",
        epoch: 9,
        seq: 77,
        expires_unix_ms: 1_900_000_000_000,
        prompt: false,
        body: false,
        data: &[7u8; 600],
    };
    let a = log.append_entry(&msg).unwrap();
    assert_eq!(a.loc.len as usize, record::HEADER_LEN + msg.encoded_len());
    log.flush().unwrap();
    drop((log, s));
    let (found, _) = read_back(&d.0);
    assert_eq!(Entry::decode(&found[0].2), Ok(msg));
}

#[test]
fn a_retirement_whose_copies_a_failed_write_lost_is_taken_back() {
    let d = TempDir::new("retire-lost");
    let s = Syncer::start(FsyncMode::Off).unwrap();
    let (mut log, rx) = open(&d.0, "w0", cfg(256), &s);
    let (m, retired, segs) = compacted(&mut log);
    assert!(retired.iter().all(|seg| log.segment_usage(*seg).is_none()));
    // Those with live records were retired after their copies.
    assert!(!segs.is_empty());
    // The copies never reach the file: the retirements are taken back.
    log.fail_writes = Some(libc::ENOSPC);
    let err = log.flush().unwrap_err();
    assert!(err.is_disk_full(), "{err}");
    assert!(log.health().is_err());
    assert!(
        m.live.iter().any(|(loc, _)| !log.holds(*loc)),
        "the copies are lost"
    );
    for seg in &segs {
        let (live, size) = log.segment_usage(*seg).expect("taken back");
        assert_eq!(live, 0, "compacted again later");
        assert!(size > 0);
    }
    // The disk works again: later writes and syncs delete none of them.
    log.fail_writes = None;
    log.probe().unwrap();
    assert_eq!(log.health(), Ok(()));
    log.append(&payload(99)).unwrap();
    log.flush().unwrap();
    log.sync_now().unwrap();
    std::thread::sleep(Duration::from_millis(200));
    let retired: Vec<SyncEvent> = rx
        .try_iter()
        .filter(|e| matches!(e, SyncEvent::Retired(seg) if segs.contains(seg)))
        .collect();
    assert!(retired.is_empty(), "{retired:?}");
    for seg in &segs {
        assert!(d.0.join(segment_name("w0", *seg)).exists(), "{seg} deleted");
    }
}

#[test]
fn a_segment_whose_first_write_failed_leaves_no_file() {
    let d = TempDir::new("first-write");
    let s = Syncer::start(FsyncMode::Off).unwrap();
    let (mut log, _rx) = open(&d.0, "w0", cfg(1 << 20), &s);
    log.fail_writes = Some(libc::EIO);
    log.append(&payload(1)).unwrap();
    let err = log.flush().unwrap_err();
    assert!(
        matches!(
            err,
            StoreError::WriteFailed {
                lost: Lsns { first: 1, last: 1 },
                ..
            }
        ),
        "{err}"
    );
    assert!(
        list_segments_in(&d.0).is_empty(),
        "{:?}",
        list_segments_in(&d.0)
    );
    assert_eq!(log.usage(), (0, 0));
    log.fail_writes = None;
    log.append(&payload(2)).unwrap();
    log.flush().unwrap();
    drop(log);
    let (found, _) = read_back(&d.0);
    assert_eq!(found.len(), 1);
    assert_eq!(found[0].2, payload(2));
}

fn list_segments_in(dir: &Path) -> Vec<String> {
    files::list_segments(dir)
        .unwrap()
        .into_iter()
        .map(|(o, id, _)| segment_name(&o, id))
        .collect()
}
