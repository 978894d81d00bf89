//! A home worker's durable log as the in-memory engine uses it (DECISIONS §6): every change
//! of the worker's home state that must survive a restart becomes a record (`store::Entry`)
//! in the worker's own `store::Log`; the memory stays the working state.
//!
//! Owns the log, its sync thread, the answers held until their records are synced (`--fsync
//! always`), the webhook tombstones, and the compaction in progress. It never blocks its
//! worker beyond a `write` to the page cache: syncs, deletes and their reports run on the
//! sync thread, whose [`SyncEvent`]s come back through the engine's mailbox.
//!
//! Compaction: a sealed segment whose live records fell below half is rewritten by
//! re-appending its live records from memory (a scan of the cache, a slice of it per loop
//! round), then retired; the store deletes the file once the copies are synced.
//!
//! A failing disk (DECISIONS §6): from the first failed write the journal is unhealthy
//! (`/health` says why). It then appends nothing: with `--fsync always` the engine refuses
//! publishes ([`Journal::refuses`]); otherwise messages stay in memory only (counted as
//! deferred). Once a second it probes the disk ([`Log::probe`]); when the probe succeeds,
//! a repair pass re-appends from memory every record that a failed write lost or that was
//! deferred, and only then does compaction start again. A compaction during which a write
//! failed is abandoned (its segments are not retired: some copies may be lost).

use std::collections::VecDeque;
use std::sync::Arc;

use super::home::HomeTopics;
use crate::engine::{Position, Stored, Ticket};
use crate::health::Health;
use crate::store::entry::{Entry, Ns};
use crate::store::{FsyncMode, Loc, Log, SegmentId, StoreError, SyncEvent, Syncer};

/// Cache keys looked at per loop round while compacting.
const COMPACT_KEYS: usize = 1024;

/// Cache keys looked at per loop round while repairing (most need no copy, and `--fsync
/// always` refuses publishes until the repair is done).
const REPAIR_KEYS: usize = 16 * 1024;

/// Segments rewritten by one compaction at most.
const COMPACT_SEGMENTS: usize = 4;

/// Milliseconds between two probes of a failing disk.
const PROBE_MS: u64 = 1000;

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
    pub ticket: Ticket,
    /// What was held.
    pub what: Held,
    /// The record is on stable storage.
    pub ok: bool,
}

/// What a tombstone cancels.
#[derive(Debug, Clone)]
pub enum Cancels {
    /// A webhook registration (`WebhookRemove`).
    Webhook {
        /// Its topic.
        topic: Arc<str>,
        /// Its address.
        url: Arc<str>,
    },
    /// A v1 pending frame, delivered (`Forget`).
    Frame {
        /// Its topic.
        topic: Arc<str>,
        /// Its position.
        pos: Position,
    },
    /// A client id's subscription, ended (`ClientEnd`).
    Client {
        /// Its topic.
        topic: Arc<str>,
        /// The client id.
        client: Arc<str>,
    },
}

impl Cancels {
    /// Whether this is the end of `client`'s subscription of `topic`.
    fn is_client(&self, topic: &str, client: &str) -> bool {
        matches!(self, Cancels::Client { topic: t, client: c } if &**t == topic && &**c == client)
    }

    /// Whether this is the removal of webhook `url` of `topic`.
    fn is_webhook(&self, topic: &str, url: &str) -> bool {
        matches!(self, Cancels::Webhook { topic: t, url: u } if &**t == topic && &**u == url)
    }

    fn entry(&self) -> Entry<'_> {
        match self {
            Cancels::Webhook { topic, url } => Entry::WebhookRemove { topic, url },
            Cancels::Frame { topic, pos } => Entry::Forget {
                ns: Ns::V1,
                topic,
                epoch: pos.epoch,
                seq: pos.seq,
            },
            Cancels::Client { topic, client } => Entry::ClientEnd { topic, client },
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

/// A pass over the cache in progress: a compaction of `segments`, or (no segments) a repair
/// of what the log lost.
#[derive(Debug)]
struct Compaction {
    segments: Vec<SegmentId>,
    next_key: usize,
    /// The journal's failure count when the pass started: a pass that saw a failure is not
    /// finished (a compaction retires nothing, a repair goes again).
    failures: u64,
}

/// One home worker's journal.
pub struct Journal {
    log: Log,
    /// The log's sync thread; dropping it syncs everything once more (SIGTERM).
    syncer: Option<Syncer>,
    mode: FsyncMode,
    /// Answers waiting for their record's sync: (lsn, to whom, what), in lsn order.
    held: VecDeque<(u64, u16, Ticket, Held)>,
    tombstones: Vec<Tombstone>,
    /// Cancellations not recorded (the disk was failing): (what, segment of the cancelled
    /// record), recorded by the repair.
    unrecorded: Vec<(Cancels, SegmentId)>,
    compaction: Option<Compaction>,
    /// Whether the disk works, and what its failures left to repair.
    disk: DiskState,
    /// The highest log sequence number reported synced.
    synced: u64,
    /// Answers settled outside [`Journal::flush`] and [`Journal::on_sync`], handed out by
    /// them.
    settled: Vec<Settled>,
    scratch: Vec<Loc>,
    /// See [`unix_offset`]; refreshed by [`Journal::tick`].
    unix_offset: i64,
}

/// What a journal knows of its disk: whether it works (reported to `/health`), how often it
/// failed, and whether what a failure lost still waits for the repair.
#[derive(Debug)]
struct DiskState {
    health: Arc<Health>,
    /// This journal's name in `/health` (`storage w0`).
    part: String,
    healthy: bool,
    /// Failed writes and appends so far.
    failures: u64,
    /// Some record was lost or deferred since the last complete repair.
    dirty: bool,
    /// When the failing disk is probed next (worker clock, ms).
    next_probe: u64,
}

impl Drop for Journal {
    fn drop(&mut self) {
        let _ = self.log.flush();
        if let Some(s) = self.syncer.take() {
            s.shutdown();
        }
    }
}

/// Wall clock minus worker clock (ms), to turn a worker-clock expiry into the Unix time a
/// record keeps. Read once per tick, not per record (two clock reads a record would be a
/// share of every publish), and a wall clock that moves within a tick moves expiries by
/// that much at most.
fn unix_offset() -> i64 {
    crate::clock::unix_ms() as i64 - crate::clock::now_ms() as i64
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
            unrecorded: Vec::new(),
            unix_offset: unix_offset(),
            compaction: None,
            disk: DiskState {
                health,
                part,
                healthy: true,
                failures: 0,
                dirty: false,
                next_probe: 0,
            },
            synced: 0,
            settled: Vec::new(),
            scratch: Vec::new(),
        }
    }

    /// Answers wait for the disk (`--fsync always`).
    pub fn answers_after_sync(&self) -> bool {
        self.mode == FsyncMode::Always
    }

    /// Refuse what would be answered after a sync while the disk fails (DECISIONS §6),
    /// and until the repair after it has written again what the failure lost.
    pub fn refuses(&self) -> bool {
        self.answers_after_sync() && (!self.disk.healthy || self.disk.dirty)
    }

    /// With `--fsync always`, the log sequence number to wait for before answering a
    /// duplicate: its original may still be waiting for its sync (`None`: answer now).
    pub fn unsynced(&self) -> Option<u64> {
        let last = self.log.last_lsn();
        (self.answers_after_sync() && last > self.synced).then_some(last)
    }

    /// The log (to keep recovered records).
    pub fn log_mut(&mut self) -> &mut Log {
        &mut self.log
    }

    fn note(&mut self, r: Result<(), String>) {
        let ok = r.is_ok();
        if ok != self.disk.healthy {
            self.disk.healthy = ok;
            match &r {
                Ok(()) => {
                    log::info!(part:% = self.disk.part; "{}: the disk works again", self.disk.part)
                }
                Err(why) => log::error!(part:% = self.disk.part, error:% = why;
                    "{}: {why}; {}",
                    self.disk.part,
                    if self.answers_after_sync() {
                        "publishes are refused until the disk works again"
                    } else {
                        "messages are kept in memory only until the disk works again"
                    }
                ),
            }
            self.disk.health.report(&self.disk.part, r.err());
        }
    }

    /// A failed write or append: the answers of the records it lost are settled as
    /// failed, and what it lost will be repaired.
    fn fail(&mut self, err: &StoreError) {
        self.disk.failures += 1;
        self.disk.dirty = true;
        if let StoreError::DiskFull { lost, .. } | StoreError::WriteFailed { lost, .. } = err {
            self.settle_lost(*lost);
        }
        self.note(Err(err.to_string()));
    }

    fn append(&mut self, e: &Entry<'_>) -> Option<crate::store::Appended> {
        if !self.disk.healthy {
            // Kept in memory only; the repair writes it once the disk works.
            self.disk.dirty = true;
            self.log.metrics().records_deferred.add(1);
            return None;
        }
        match self.log.append_entry(e) {
            Ok(a) => Some(a),
            Err(err) => {
                self.fail(&err);
                None
            }
        }
    }

    /// Once per worker tick: the clock offset of the records written until the next.
    pub fn tick(&mut self) {
        self.unix_offset = unix_offset();
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
        let expires_unix_ms = expires.saturating_add_signed(self.unix_offset);
        // A v2 body holds its topic: the compact kind does not write it twice.
        if !v1 && Entry::topic_in_body(topic, data) {
            return self.append(&Entry::Body {
                topic,
                epoch: pos.epoch,
                seq: pos.seq,
                expires_unix_ms,
                prompt,
                data,
            });
        }
        self.append(&Entry::Message {
            ns: if v1 { Ns::V1 } else { Ns::V2 },
            topic,
            epoch: pos.epoch,
            seq: pos.seq,
            expires_unix_ms,
            prompt,
            body: !v1,
            data,
        })
    }

    /// Records a new webhook registration; a tombstone of the same pair is no longer needed
    /// (a copy of it after this record would cancel it on replay).
    pub fn webhook_add(&mut self, topic: &str, url: &str) -> Option<crate::store::Appended> {
        self.unrecorded
            .retain(|(what, _)| !what.is_webhook(topic, url));
        let mut i = 0;
        while i < self.tombstones.len() {
            if self.tombstones[i].what.is_webhook(topic, url) {
                let t = self.tombstones.swap_remove(i);
                self.log.release(t.record);
            } else {
                i += 1;
            }
        }
        self.append(&Entry::WebhookAdd { topic, url })
    }

    /// Records a client id's subscription as it stands now (it supersedes its older record,
    /// which the caller releases); a tombstone of the same pair is no longer needed.
    pub fn client_sub(
        &mut self,
        topic: &str,
        sub: &crate::engine::clients::ClientSub,
    ) -> Option<crate::store::Appended> {
        let client = &*sub.client.id;
        self.unrecorded
            .retain(|(what, _)| !what.is_client(topic, client));
        let mut i = 0;
        while i < self.tombstones.len() {
            if self.tombstones[i].what.is_client(topic, client) {
                let t = self.tombstones.swap_remove(i);
                self.log.release(t.record);
            } else {
                i += 1;
            }
        }
        let expires_unix_ms = sub.expires.saturating_add_signed(self.unix_offset);
        let received: Vec<u8> = sub
            .received
            .iter()
            .take(255)
            .flat_map(|id| id.to_le_bytes())
            .collect();
        self.append(&Entry::ClientSub {
            topic,
            client,
            project: &sub.client.project,
            epoch: sub.delivered.epoch,
            seq: sub.delivered.seq,
            expires_unix_ms,
            received: &received,
        })
    }

    /// Records the end of a client id's subscription whose record is `record`.
    pub fn client_gone(&mut self, topic: &Arc<str>, client: &Arc<str>, record: Loc) {
        let what = Cancels::Client {
            topic: topic.clone(),
            client: client.clone(),
        };
        self.cancel(what, record);
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
        self.tombstone(what, record.segment);
    }

    /// Appends the record of `what`, which cancels a record in segment `cancels`; when the
    /// log cannot take it, the repair will.
    fn tombstone(&mut self, what: Cancels, cancels: SegmentId) {
        match self.append(&what.entry()) {
            Some(a) => self.tombstones.push(Tombstone {
                record: a.loc,
                cancels,
                what,
            }),
            None => self.unrecorded.push((what, cancels)),
        }
    }

    /// Holds an answer until record `lsn` is synced.
    pub fn hold(&mut self, lsn: u64, core: u16, ticket: Ticket, what: Held) {
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

    /// Takes the held answers of records a failed write lost (`lost`); the earlier ones
    /// keep waiting for their sync.
    fn settle_lost(&mut self, lost: crate::store::Lsns) {
        let mut kept = VecDeque::with_capacity(self.held.len());
        for (lsn, core, ticket, what) in self.held.drain(..) {
            if (lost.first..=lost.last).contains(&lsn) {
                self.settled.push(Settled {
                    core,
                    ticket,
                    what,
                    ok: false,
                });
            } else {
                kept.push_back((lsn, core, ticket, what));
            }
        }
        self.held = kept;
    }

    /// A report of the sync thread; the answers it settles go to `out`.
    pub fn on_sync(&mut self, ev: SyncEvent, out: &mut Vec<Settled>) {
        out.append(&mut self.settled);
        match ev {
            SyncEvent::Synced(n) => {
                self.synced = self.synced.max(n);
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
                self.unrecorded.retain(|r| r.1 != seg);
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
        if let Err(e) = self.log.flush() {
            self.fail(&e);
        }
        out.append(&mut self.settled);
    }

    /// Probes a failing disk, at most once a second.
    fn probe(&mut self) {
        let now = crate::clock::now_ms();
        if now < self.disk.next_probe {
            return;
        }
        self.disk.next_probe = now + PROBE_MS;
        match self.log.probe() {
            Ok(()) => {
                let h = self.log.health();
                self.note(h);
            }
            Err(e) => self.fail(&e),
        }
    }

    /// A tombstone (`WebhookRemove` or `Forget`) read back at start that still cancels a
    /// record in segment `cancels`: kept, with its own record, until that one is gone.
    pub fn restore_tombstone(&mut self, what: Cancels, record: Loc, cancels: SegmentId) {
        self.log.keep(record);
        self.tombstones.push(Tombstone {
            record,
            cancels,
            what,
        });
    }

    /// This log's figures.
    pub fn metrics(&self) -> Arc<crate::store::StoreMetrics> {
        self.log.metrics().clone()
    }
}

mod compact;
pub mod recover;
mod recover_clients;

#[cfg(test)]
mod tests;
