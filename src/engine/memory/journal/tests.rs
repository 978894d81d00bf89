//! Tests of a home worker's journal over a real log in a temporary directory, with write
//! failures injected into the log: which held answers a failure settles, what the journal
//! refuses or defers while the disk fails, and that the repair writes again everything the
//! failure lost, so that recovery finds it.

use std::path::PathBuf;
use std::sync::atomic::AtomicUsize;
use std::sync::mpsc::{channel, Receiver};
use std::sync::Arc;
use std::time::Duration;

use super::*;
use crate::config::Limits;
use crate::engine::{Origin, PublishReq, Ticket};
use crate::metrics::Metrics;
use crate::store::{self, LogConfig};

/// A temporary directory, removed on drop.
struct TempDir(PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

struct Rig {
    dir: TempDir,
    j: Journal,
    home: HomeTopics,
    health: Arc<Health>,
    rx: Receiver<SyncEvent>,
    out: Vec<Settled>,
    topic: Arc<str>,
}

fn rig(name: &str, mode: FsyncMode) -> Rig {
    let dir = std::env::temp_dir().join(format!("wr-journal-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let syncer = Syncer::start(mode).unwrap();
    let (tx, rx) = channel();
    let on_sync = Box::new(move |ev| {
        let _ = tx.send(ev);
    });
    let log = Log::open(&dir, "w0", LogConfig::default(), &syncer, on_sync).unwrap();
    let health = Arc::new(Health::default());
    let home = HomeTopics::new(
        0,
        64,
        1 << 20,
        Limits::default(),
        Metrics::new(1),
        Arc::new(AtomicUsize::new(0)),
    );
    Rig {
        dir: TempDir(dir),
        j: Journal::new(log, syncer, health.clone()),
        home,
        health,
        rx,
        out: Vec::new(),
        topic: Arc::from("topic"),
    }
}

impl Rig {
    /// Stores a publish as the engine does and holds its answer when the journal says so;
    /// returns whether the record was appended.
    fn publish(&mut self, body: &str, ticket: Ticket) -> bool {
        let req = PublishReq {
            topic: self.topic.clone(),
            body: crate::message::Body::encode("t", body, crate::message::Meta::default()),
            ttl: 3600,
            prompt: false,
            origin: Origin::NONE,
            hash: None,
            publisher: None,
        };
        let now = crate::clock::now_ms();
        let o = self.home.store(&req, body.len() as u64, now);
        let (Stored::New(pos), Some(key)) = (o.stored, o.key) else {
            panic!("not stored: {o:?}");
        };
        let Some(a) = self.j.message(
            false,
            &self.topic,
            pos,
            now + 3_600_000,
            false,
            req.body.irn(),
        ) else {
            return false;
        };
        self.home.set_record(key, a.loc);
        if self.j.answers_after_sync() {
            self.j.hold(a.lsn, 0, ticket, Held::Published(o.stored));
        }
        true
    }

    fn flush(&mut self) {
        self.j.flush(&mut self.home, &mut self.out);
    }

    /// Feeds the sync thread's reports to the journal until one satisfies `want`.
    fn sync_until(&mut self, want: impl Fn(&SyncEvent) -> bool) {
        loop {
            let ev = self
                .rx
                .recv_timeout(Duration::from_secs(10))
                .expect("sync event");
            self.j.on_sync(ev, &mut self.out);
            if want(&ev) {
                return;
            }
        }
    }

    /// Settled answers so far as (ticket, ok).
    fn answers(&mut self) -> Vec<(Ticket, bool)> {
        self.out.drain(..).map(|s| (s.ticket, s.ok)).collect()
    }

    /// Stops the journal (a last sync) and reads the directory back: the message bodies
    /// and the webhook urls, in log order.
    fn recovered(self) -> (Vec<String>, Vec<String>) {
        let Rig { dir, j, .. } = self;
        drop(j);
        let (mut bodies, mut urls) = (Vec::new(), Vec::new());
        store::recover(&dir.0, |_, _, p| {
            match store::entry::Entry::decode(p).unwrap().expanded() {
                Entry::Message { data, body, .. } => {
                    assert!(body, "a v2 message is recorded as a body");
                    bodies.push(message_of(data))
                }
                Entry::WebhookAdd { url, .. } => urls.push(url.to_string()),
                _ => {}
            }
            Ok(())
        })
        .unwrap();
        (bodies, urls)
    }
}

#[test]
fn a_failed_write_fails_only_the_answers_it_lost_and_always_refuses_until_repaired() {
    let mut r = rig("always", FsyncMode::Always);
    assert!(r.publish("one", 1));
    r.flush();
    assert!(r.publish("two", 2));
    r.j.log_mut().fail_writes = Some(libc::ENOSPC);
    r.flush();
    assert_eq!(r.answers(), [(2, false)], "only the lost record's answer");
    assert!(r.j.refuses());
    let why = r.health.problem().expect("unhealthy");
    assert!(why.starts_with("storage w0: disk full"), "{why}");
    // The first record was written: its sync still answers it.
    r.sync_until(|e| matches!(e, SyncEvent::Synced(n) if *n >= 1));
    assert_eq!(r.answers(), [(1, true)]);

    // Still failing: the probe fails, nothing changes.
    r.j.compact_step(&mut r.home);
    assert!(r.j.refuses());
    // Space again; the next probe is a second later.
    r.j.log_mut().fail_writes = None;
    std::thread::sleep(Duration::from_millis(1100));
    r.j.compact_step(&mut r.home);
    assert_eq!(r.health.problem(), None);
    assert!(r.j.refuses(), "refused until the repair is done");
    r.j.compact_step(&mut r.home);
    assert!(!r.j.refuses());
    r.flush();
    let (bodies, _) = r.recovered();
    assert_eq!(
        bodies,
        ["one", "two"],
        "the repair wrote the lost record again"
    );
}

#[test]
fn while_the_disk_fails_records_are_deferred_then_written_by_the_repair() {
    let mut r = rig("everysec", FsyncMode::Everysec);
    let url: Arc<str> = Arc::from("http://hook/");
    assert!(r.publish("one", 1));
    r.j.log_mut().fail_writes = Some(libc::EIO);
    r.flush();
    assert!(r.health.problem().is_some());
    assert!(!r.j.refuses(), "everysec keeps taking publishes");
    // Kept in memory only while the disk fails.
    assert!(!r.publish("two", 2));
    assert_eq!(
        r.home.add_webhook(&r.topic, url.clone()),
        Ok(crate::engine::memory::home::WebhookAdded::New)
    );
    assert!(r.j.webhook_add(&r.topic, &url).is_none());
    assert_eq!(r.j.metrics().records_deferred.get(), 2);
    r.flush();
    r.j.log_mut().fail_writes = None;
    r.j.compact_step(&mut r.home);
    assert_eq!(
        r.health.problem(),
        None,
        "the first probe found the disk working"
    );
    r.j.compact_step(&mut r.home);
    assert!(r.publish("three", 3));
    r.flush();
    assert!(r.answers().is_empty(), "nothing is held with everysec");
    let (bodies, urls) = r.recovered();
    assert_eq!(bodies, ["one", "two", "three"]);
    assert_eq!(urls, [&*url]);
}

#[test]
fn with_fsync_always_a_duplicate_waits_for_its_originals_sync() {
    let mut r = rig("dup", FsyncMode::Always);
    assert_eq!(r.j.unsynced(), None, "nothing written yet");
    assert!(r.publish("one", 1));
    let lsn = r.j.unsynced().expect("the original is not synced");
    r.flush();
    r.sync_until(|e| matches!(e, SyncEvent::Synced(n) if *n >= lsn));
    assert_eq!(r.j.unsynced(), None);
}

/// Every record of the directory as (kind, epoch, seq, body), in log order.
/// The `message` of a recorded body.
fn message_of(data: &[u8]) -> String {
    let v: serde_json::Value = serde_json::from_slice(data).unwrap();
    v["message"].as_str().unwrap().to_string()
}

fn records(dir: &std::path::Path) -> Vec<(&'static str, u64, u64, String)> {
    let mut out = Vec::new();
    store::recover(dir, |_, _, p| {
        let text = |d: &[u8]| String::from_utf8_lossy(d).into_owned();
        match Entry::decode(p).unwrap().expanded() {
            Entry::Message {
                ns: Ns::V2,
                epoch,
                seq,
                data,
                ..
            } => out.push(("v2", epoch, seq, message_of(data))),
            Entry::Message {
                ns: Ns::V1,
                epoch,
                seq,
                data,
                ..
            } => out.push(("v1", epoch, seq, text(data))),
            Entry::Forget { epoch, seq, .. } => out.push(("forget", epoch, seq, String::new())),
            _ => {}
        }
        Ok(())
    })
    .unwrap();
    out
}

#[test]
fn a_rewrite_records_every_message_and_frame_at_its_own_position_and_a_take_forgets_it_there() {
    let mut r = rig("rewrite", FsyncMode::Off);
    let t = r.topic.clone();
    let far = crate::clock::now_ms() + 3_600_000;
    // Read back from another layout's logs (places in a log this journal does not have):
    // the v2 cache of one history, v1 frames of another, as two earlier runs left them.
    let elsewhere = |n: u32| Loc {
        segment: 9_000,
        offset: n * 64,
        len: 64,
    };
    for (seq, body) in [(4, "m4"), (5, "m5")] {
        let msg = crate::engine::Message {
            pos: Position { epoch: 70, seq },
            body: crate::message::Body::encode("t", body, crate::message::Meta::default()),
            origin: Origin::NONE,
        };
        assert!(r.home.restore(&t, msg, seq, far, elsewhere(seq as u32)));
    }
    for (seq, body) in [(2, "f2"), (3, "f3")] {
        let at = Position { epoch: 50, seq };
        let frame = crate::arcbuf::ArcBuf::copy_from_slice(body.as_bytes());
        r.home
            .v1_restore(&t, at, frame, far, elsewhere(10 + seq as u32));
    }
    r.j.rewrite(&mut r.home).unwrap();
    // The frames are delivered: each Forget must name its frame's record.
    for (_, at, record) in r.home.v1_take(&t) {
        r.j.frame_taken(&t, at, record.expect("rewritten"));
    }
    r.flush();
    let Rig { dir, j, .. } = r;
    drop(j);
    let mut got = records(&dir.0);
    got.sort();
    let want = [
        ("forget", 50, 2, ""),
        ("forget", 50, 3, ""),
        ("v1", 50, 2, "f2"),
        ("v1", 50, 3, "f3"),
        ("v2", 70, 4, "m4"),
        ("v2", 70, 5, "m5"),
    ];
    let want: Vec<_> = want
        .iter()
        .map(|&(k, e, s, b)| (k, e, s, b.to_string()))
        .collect();
    assert_eq!(got, want);
}
