//! The durable store (DECISIONS §6) with real processes and a real full disk: a second
//! process is refused the data directory, every record acknowledged before a `kill -9`
//! comes back, and a full disk is reported, leaves whole records only, and recovers once
//! space is freed.
//!
//! The child processes are this test binary itself, re-run with `WR_STORE_CHILD` set.

mod common;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use common::tempdir::Tmpfs;
use common::TempDir;
use walletrelay::store::{self, DirLock, FsyncMode, Log, LogConfig, StoreError, Syncer};

const CHILD: &str = "WR_STORE_CHILD";

fn payload(i: u64) -> Vec<u8> {
    format!("{i:08} {}", "m".repeat(590)).into_bytes()
}

fn open(dir: &Path, segment_bytes: u64, s: &Syncer) -> Log {
    let cfg = LogConfig {
        segment_bytes,
        ..LogConfig::default()
    };
    Log::open(dir, "w0", cfg, s, Box::new(|_| {})).unwrap()
}

fn recovered(dir: &Path) -> (Vec<Vec<u8>>, store::RecoveryStats) {
    let mut v = Vec::new();
    let stats = store::recover(dir, |_, _, p| {
        v.push(p.to_vec());
        Ok(())
    })
    .unwrap();
    (v, stats)
}

/// Runs this binary's test `name` as a child process with `WR_STORE_CHILD=value`.
fn child(name: &str, value: &str) -> Command {
    let mut c = Command::new(std::env::current_exe().unwrap());
    c.args([name, "--exact", "--nocapture", "--test-threads=1"])
        .env(CHILD, value)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    c
}

#[test]
fn a_second_process_on_the_same_directory_is_refused_with_the_holders_pid() {
    if let Ok(dir) = std::env::var(CHILD) {
        // Child: the lock must be refused.
        match DirLock::acquire(Path::new(&dir)) {
            Err(e @ StoreError::Locked { .. }) => println!("REFUSED: {e}"),
            other => println!("NOT REFUSED: {other:?}"),
        }
        return;
    }
    let temp = TempDir::new("store-lock");
    let dir = temp.path();
    let held = DirLock::acquire(dir).unwrap();
    let name = "a_second_process_on_the_same_directory_is_refused_with_the_holders_pid";
    let out = child(name, dir.to_str().unwrap()).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let want = format!(
        "REFUSED: data directory {} is in use by another walletrelay process (pid {})",
        dir.display(),
        std::process::id()
    );
    assert!(text.contains(&want), "child said: {text}");
    drop(held);
    // Released: a new process gets the directory. Another test of this binary may be
    // spawning a child at the moment of the drop; between its fork and its exec that child
    // holds a copy of every descriptor (close-on-exec acts only at exec), lock included, so
    // a first try may still meet the lock for an instant: a few bounded tries.
    let mut text = String::new();
    for _ in 0..20 {
        let out = child(name, dir.to_str().unwrap()).output().unwrap();
        text = String::from_utf8_lossy(&out.stdout).into_owned();
        if !text.contains("REFUSED: data") || text.contains("NOT REFUSED") {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    assert!(text.contains("NOT REFUSED: Ok"), "after release: {text}");
}

#[test]
fn every_record_acknowledged_before_kill_9_comes_back() {
    let name = "every_record_acknowledged_before_kill_9_comes_back";
    if let Ok(dir) = std::env::var(CHILD) {
        // Child: append and flush batches forever, acknowledging each written LSN.
        let dir = PathBuf::from(dir);
        let _lock = DirLock::acquire(&dir).unwrap();
        let s = Syncer::start(FsyncMode::Off).unwrap();
        let mut log = open(&dir, 256 << 10, &s);
        for i in 0..1_000_000u64 {
            log.append(&payload(i)).unwrap();
            if i % 7 == 6 {
                println!("ack {}", log.flush().unwrap());
            }
        }
        return;
    }
    let temp = TempDir::new("store-kill9");
    let dir = temp.path();
    let mut c = child(name, dir.to_str().unwrap()).spawn().unwrap();
    let mut lines = BufReader::new(c.stdout.take().unwrap()).lines();
    let mut acked = 0u64;
    for line in lines.by_ref() {
        let line = line.unwrap();
        if let Some(n) = line.strip_prefix("ack ") {
            acked = n.parse().unwrap();
            if acked >= 5_000 {
                break;
            }
        }
    }
    c.kill().unwrap();
    c.wait().unwrap();
    // Lines already in the pipe were acknowledged too.
    for line in lines {
        if let Some(n) = line.unwrap().strip_prefix("ack ") {
            acked = acked.max(n.parse().unwrap());
        }
    }
    let _lock = DirLock::acquire(dir).expect("the dead child's lock is gone");
    let (got, stats) = recovered(dir);
    assert!(got.len() as u64 >= acked, "{} of {acked} back", got.len());
    for (i, p) in got.iter().enumerate() {
        assert_eq!(*p, payload(i as u64), "record {i}");
    }
    assert_eq!(stats.skipped_regions, 0);
}

#[test]
fn a_full_disk_is_reported_leaves_whole_records_and_recovers_when_space_is_freed() {
    let dir = TempDir::new("store-full");
    let fs = match Tmpfs::mount(&dir, "1m") {
        Ok(fs) => fs,
        Err(why) => {
            let test =
                "a_full_disk_is_reported_leaves_whole_records_and_recovers_when_space_is_freed";
            common::skip::skip(test, &why);
            return;
        }
    };
    let filler = fs.path().join("filler");
    std::fs::write(&filler, vec![1u8; 600 << 10]).unwrap();
    let s = Syncer::start(FsyncMode::Everysec).unwrap();
    let mut log = open(fs.path(), 128 << 10, &s);
    let mut acked = Vec::new();
    let mut pending = Vec::new();
    let mut lost = None;
    for i in 0..10_000u64 {
        log.append(&payload(i)).unwrap();
        pending.push(i);
        if i % 5 == 4 {
            match log.flush() {
                Ok(_) => acked.append(&mut pending),
                Err(e) => {
                    assert!(e.is_disk_full(), "{e}");
                    lost = Some(e);
                    break;
                }
            }
        }
    }
    let Some(StoreError::DiskFull { lost, .. }) = lost else {
        panic!("the disk never filled: {lost:?}");
    };
    assert_eq!(lost.last - lost.first + 1, pending.len() as u64);
    let why = log.health().unwrap_err();
    assert!(why.contains("No space left"), "{why}");
    // Still full: appends or writes keep failing, health stays bad.
    let r = log.append(&payload(99_999)).and_then(|_| log.flush());
    assert!(r.is_err_and(|e| e.is_disk_full()));
    assert!(log.health().is_err());
    // Space freed: the log recovers on its own.
    std::fs::remove_file(&filler).unwrap();
    for i in 20_000..20_005u64 {
        log.append(&payload(i)).unwrap();
        acked.push(i);
    }
    log.flush().unwrap();
    assert_eq!(log.health(), Ok(()));
    assert!(log.metrics().write_errors.get() >= 2);
    drop((log, s));
    let (got, stats) = recovered(fs.path());
    let want: Vec<Vec<u8>> = acked.iter().map(|&i| payload(i)).collect();
    assert_eq!(got, want, "exactly the acknowledged records, in order");
    assert_eq!((stats.skipped_regions, stats.torn_tails), (0, 0));
}
