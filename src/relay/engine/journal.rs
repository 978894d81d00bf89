//! A home worker's durable log as the in-memory engine uses it (DECISIONS §6): every change
//! of the worker's home state that must survive a restart becomes a record (`store::Entry`)
//! in the worker's own `store::Log`; the memory stays the working state.
//!
//! Owns the log, its sync thread, the answers held until their records are synced (`--fsync
//! always`), the webhook tombstones, and the compaction in progress. It never blocks its
//! worker beyond a `write` to the page cache: syncs, deletes and their reports run on the
//! sync thread, whose [`SyncEvent`]s come back through the worker's mailbox.
//!
//! Compaction: a sealed segment whose live records fell below half is rewritten by
//! re-appending its live records from memory (a scan of the cache, a slice of it per loop
//! round), then retired; the store deletes the file once the copies are synced.

use std::collections::VecDeque;
use std::sync::Arc;

use super::home::HomeTopics;
use super::{Position, Stored};
use crate::health::Health;
use crate::store::entry::{Entry, Ns};
use crate::store::{FsyncMode, Loc, Log, SegmentId, StoreError, SyncEvent, Syncer};

/// Cache keys looked at per loop round while compacting.
const COMPACT_KEYS: usize = 1024;

/// Segments rewritten by one compaction at most.
const COMPACT_SEGMENTS: usize = 4;

/// An answer held until its record is on stable storage.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Held {
    /// A publish stored at this outcome.
    Published(Stored),
    /// A webhook registration.
    WebhookAdded,
}

/// An answer whose record is settled: synced (`ok`), or lost (the write or the sync failed).
#[derive(Debug, Clone, Copy)]
pub struct Settled {
    /// The asking worker.
    pub core: u16,
    /// Its ticket.
    pub ticket: super::Ticket,
    /// What was held.
    pub what: Held,
    /// The record is on stable storage.
    pub ok: bool,
}

/// What a tombstone cancels.
#[derive(Debug, Clone)]
enum Cancels {
    /// A webhook registration (`WebhookRemove`).
    Webhook { topic: Arc<str>, url: Arc<str> },
    /// A v1 pending frame, delivered (`Forget`).
    Frame { topic: Arc<str>, pos: Position },
}

impl Cancels {
    fn entry(&self) -> Entry<'_> {
        match self {
            Cancels::Webhook { topic, url } => Entry::WebhookRemove { topic, url },
            Cancels::Frame { topic, pos } => Entry::Forget {
                ns: Ns::V1,
                topic,
                epoch: pos.epoch,
                seq: pos.seq,
            },
        }
    }
}

/// A tombstone record, kept until the record it cancels is gone from disk.
#[derive(Debug)]
struct Tombstone {
    record: Loc,
    /// The segment of the cancelled record.
    cancels: SegmentId,
    what: Cancels,
}

/// A compaction in progress.
#[derive(Debug)]
struct Compaction {
    segments: Vec<SegmentId>,
    next_key: usize,
}

/// One home worker's journal.
pub struct Journal {
    log: Log,
    /// The log's sync thread; dropping it syncs everything once more (SIGTERM).
    syncer: Option<Syncer>,
    mode: FsyncMode,
    /// Answers waiting for their record's sync: (lsn, to whom, what), in lsn order.
    held: VecDeque<(u64, u16, super::Ticket, Held)>,
    tombstones: Vec<Tombstone>,
    compaction: Option<Compaction>,
    health: Arc<Health>,
    /// This journal's name in `/health` (`storage w0`).
    part: String,
    healthy: bool,
    scratch: Vec<Loc>,
}

impl Drop for Journal {
    fn drop(&mut self) {
        let _ = self.log.flush();
        if let Some(s) = self.syncer.take() {
            s.shutdown();
        }
    }
}

/// Milliseconds since the Unix epoch at which a message expiring at `expires` (worker
/// clock) expires.
fn unix_expiry(expires: u64) -> u64 {
    let now = crate::clock::now_ms();
    crate::clock::unix_ms() + expires.saturating_sub(now)
}

impl Journal {
    /// The journal of a worker over its opened `log` and that log's sync thread.
    pub fn new(log: Log, syncer: Syncer, health: Arc<Health>) -> Journal {
        let part = format!("storage {}", log.owner());
        Journal {
            mode: syncer.mode(),
            log,
            syncer: Some(syncer),
            held: VecDeque::new(),
            tombstones: Vec::new(),
            compaction: None,
            health,
            part,
            healthy: true,
            scratch: Vec::new(),
        }
    }

    /// Answers wait for the disk (`--fsync always`).
    pub fn answers_after_sync(&self) -> bool {
        self.mode == FsyncMode::Always
    }

    /// Refuse what would be answered after a sync while the disk fails (DECISIONS §6).
    pub fn refuses(&self) -> bool {
        self.answers_after_sync() && !self.healthy
    }

    /// The log (to keep recovered records).
    pub fn log_mut(&mut self) -> &mut Log {
        &mut self.log
    }

    fn note(&mut self, r: Result<(), String>) {
        let ok = r.is_ok();
        if ok != self.healthy {
            self.healthy = ok;
            self.health.report(&self.part, r.err());
        }
    }

    fn append(&mut self, e: &Entry<'_>) -> Option<crate::store::Appended> {
        match self.log.append_entry(e) {
            Ok(a) => Some(a),
            Err(err) => {
                log::warn!("{}: {err}", self.part);
                self.note(Err(err.to_string()));
                None
            }
        }
    }

    /// Records a stored message (`v1`: a pending WalletConnect 1.0 frame); returns its
    /// location and log sequence number.
    pub fn message(
        &mut self,
        v1: bool,
        topic: &str,
        pos: Position,
        expires: u64,
        prompt: bool,
        data: &[u8],
    ) -> Option<crate::store::Appended> {
        self.append(&Entry::Message {
            ns: if v1 { Ns::V1 } else { Ns::V2 },
            topic,
            epoch: pos.epoch,
            seq: pos.seq,
            expires_unix_ms: unix_expiry(expires),
            prompt,
            data,
        })
    }

    /// Records a new webhook registration; a tombstone of the same pair is no longer needed
    /// (a copy of it after this record would cancel the registration on replay).
    pub fn webhook_add(&mut self, topic: &str, url: &str) -> Option<crate::store::Appended> {
        let mut i = 0;
        while i < self.tombstones.len() {
            let same = matches!(&self.tombstones[i].what,
                Cancels::Webhook { topic: t, url: u } if &**t == topic && &**u == url);
            if same {
                let t = self.tombstones.swap_remove(i);
                self.log.release(t.record);
            } else {
                i += 1;
            }
        }
        self.append(&Entry::WebhookAdd { topic, url })
    }

    /// Records a webhook removal that cancels `record` (kept until that record is gone).
    pub fn webhook_remove(&mut self, topic: &Arc<str>, url: &Arc<str>, record: Loc) {
        let what = Cancels::Webhook {
            topic: topic.clone(),
            url: url.clone(),
        };
        self.cancel(what, record);
    }

    /// Records that a pending v1 frame was delivered (its `record` must not come back).
    pub fn frame_taken(&mut self, topic: &Arc<str>, pos: Position, record: Loc) {
        let what = Cancels::Frame {
            topic: topic.clone(),
            pos,
        };
        self.cancel(what, record);
    }

    fn cancel(&mut self, what: Cancels, record: Loc) {
        self.log.release(record);
        if let Some(a) = self.append(&what.entry()) {
            self.tombstones.push(Tombstone {
                record: a.loc,
                cancels: record.segment,
                what,
            });
        }
    }

    /// Holds an answer until record `lsn` is synced.
    pub fn hold(&mut self, lsn: u64, core: u16, ticket: super::Ticket, what: Held) {
        self.held.push_back((lsn, core, ticket, what));
    }

    /// Takes the held answers whose records are settled at `lsn` (`ok`: synced; else the
    /// sync failed or the write was lost).
    fn settle(&mut self, lsn: u64, ok: bool, out: &mut Vec<Settled>) {
        while self.held.front().is_some_and(|h| h.0 <= lsn) {
            if let Some((_, core, ticket, what)) = self.held.pop_front() {
                out.push(Settled {
                    core,
                    ticket,
                    what,
                    ok,
                });
            }
        }
    }

    /// A report of the sync thread; the answers it settles go to `out`.
    pub fn on_sync(&mut self, ev: SyncEvent, out: &mut Vec<Settled>) {
        match ev {
            SyncEvent::Synced(n) => {
                self.settle(n, true, out);
                let h = self.log.health();
                self.note(h);
            }
            SyncEvent::Failed(n) => {
                self.settle(n, false, out);
                let h = self.log.health();
                self.note(h);
            }
            SyncEvent::Retired(seg) => {
                let mut i = 0;
                while i < self.tombstones.len() {
                    if self.tombstones[i].cancels == seg {
                        let t = self.tombstones.swap_remove(i);
                        self.log.release(t.record);
                    } else {
                        i += 1;
                    }
                }
            }
        }
    }

    /// End of a loop round: the home's released records are released, the batch goes to
    /// the kernel. A failed write settles the answers of the records it lost.
    pub fn flush(&mut self, home: &mut HomeTopics, out: &mut Vec<Settled>) {
        let mut released = std::mem::take(&mut self.scratch);
        home.take_released(&mut released);
        for loc in released.drain(..) {
            self.log.release(loc);
        }
        self.scratch = released;
        match self.log.flush() {
            Ok(_) => {}
            Err(e) => {
                log::warn!("{}: {e}", self.part);
                if let StoreError::DiskFull { lost, .. } | StoreError::WriteFailed { lost, .. } = &e
                {
                    self.settle(lost.last, false, out);
                }
                self.note(Err(e.to_string()));
            }
        }
    }

    /// One slice of compaction work (called every loop round).
    pub fn compact_step(&mut self, home: &mut HomeTopics) {
        if self.compaction.is_none() {
            let mut segments = self.log.candidates();
            if segments.is_empty() {
                return;
            }
            segments.truncate(COMPACT_SEGMENTS);
            self.copy_webhooks(home, &segments);
            self.compaction = Some(Compaction {
                segments,
                next_key: 0,
            });
        }
        let Some(c) = self.compaction.as_mut() else {
            return;
        };
        let from = c.next_key;
        let to = (from + COMPACT_KEYS).min(home.key_bound());
        let keys = home.records_in(from..to, &c.segments);
        c.next_key = to;
        let done = to >= home.key_bound();
        for key in keys {
            self.copy_message(home, key);
        }
        if done {
            if let Some(c) = self.compaction.take() {
                for s in c.segments {
                    if let Err(e) = self.log.retire(s) {
                        log::warn!("{}: {e}", self.part);
                    }
                }
            }
        }
    }

    /// A tombstone read back at start that still cancels a record in segment `cancels`.
    pub fn restore_tombstone(
        &mut self,
        topic: Arc<str>,
        url: Arc<str>,
        record: Loc,
        cancels: SegmentId,
    ) {
        self.log.keep(record);
        self.tombstones.push(Tombstone {
            record,
            cancels,
            what: Cancels::Webhook { topic, url },
        });
    }

    /// A `Forget` read back at start that still cancels a frame's record in `cancels`.
    pub fn restore_forget(
        &mut self,
        topic: Arc<str>,
        pos: Position,
        record: Loc,
        cancels: SegmentId,
    ) {
        self.log.keep(record);
        self.tombstones.push(Tombstone {
            record,
            cancels,
            what: Cancels::Frame { topic, pos },
        });
    }

    /// Writes the whole home state to this log at start, syncs it, and deletes the log's
    /// segments of earlier runs (the worker layout changed: records must be in their
    /// topics' homes' logs).
    pub fn rewrite(&mut self, home: &mut HomeTopics) -> Result<(), StoreError> {
        for key in 0..home.key_bound() {
            self.copy_message(home, key);
        }
        for (topic, url) in home.all_webhooks() {
            if let Some(a) = self.append(&Entry::WebhookAdd {
                topic: &topic,
                url: &url,
            }) {
                home.set_webhook_record(&topic, &url, a.loc);
            }
        }
        self.log.flush()?;
        self.log.sync_now()?;
        self.log.discard_previous()?;
        Ok(())
    }

    /// This log's figures.
    pub fn metrics(&self) -> Arc<crate::store::StoreMetrics> {
        self.log.metrics().clone()
    }

    fn copy_message(&mut self, home: &mut HomeTopics, key: usize) {
        let Some((t, m)) = home.message(key) else {
            return;
        };
        let pos = Position {
            epoch: t.last().epoch,
            seq: m.topic_seq,
        };
        let (topic, expires, data, v1) = (t.name.clone(), m.expires, m.data.clone(), m.v1);
        if let Some(a) = self.message(v1, &topic, pos, expires, false, &data) {
            home.set_record(key, a.loc);
        }
    }

    fn copy_webhooks(&mut self, home: &mut HomeTopics, segments: &[SegmentId]) {
        for (topic, url) in home.webhooks_in(segments) {
            if let Some(a) = self.append(&Entry::WebhookAdd {
                topic: &topic,
                url: &url,
            }) {
                home.set_webhook_record(&topic, &url, a.loc);
            }
        }
        let mut copies = Vec::new();
        for t in self
            .tombstones
            .iter()
            .filter(|t| segments.contains(&t.record.segment))
        {
            copies.push((t.what.clone(), t.cancels));
        }
        self.tombstones
            .retain(|t| !segments.contains(&t.record.segment));
        for (what, cancels) in copies {
            if let Some(a) = self.append(&what.entry()) {
                self.tombstones.push(Tombstone {
                    record: a.loc,
                    cancels,
                    what,
                });
            }
        }
    }
}
