//! The journal's background work, a slice per loop round: while the disk fails, a probe now
//! and then; then the repair pass that writes again what a failed write lost or what was
//! deferred; else compaction of mostly dead segments. Also the full rewrite at start when
//! the worker layout changed. Works on the journal's own fields and the home's cache only.

use super::{Compaction, Journal, Tombstone, COMPACT_KEYS, COMPACT_SEGMENTS, REPAIR_KEYS};
use crate::engine::memory::home::HomeTopics;
use crate::store::entry::Entry;
use crate::store::{SegmentId, StoreError};

impl Journal {
    /// One slice of background work (called every loop round): while the disk fails, a
    /// probe now and then; then the repair of what was lost; else compaction.
    pub fn compact_step(&mut self, home: &mut HomeTopics) {
        self.log.report_usage();
        if !self.disk.healthy {
            return self.probe();
        }
        if self.compaction.is_none() {
            let segments = if self.disk.dirty {
                self.repair_records(home);
                Vec::new()
            } else {
                let mut segments = self.log.candidates();
                if segments.is_empty() {
                    return;
                }
                segments.truncate(COMPACT_SEGMENTS);
                self.copy_webhooks(home, &segments);
                segments
            };
            self.compaction = Some(Compaction {
                segments,
                next_key: 0,
                failures: self.disk.failures,
            });
        }
        let Some(c) = self.compaction.as_ref() else {
            return;
        };
        let from = c.next_key;
        let slice = if c.segments.is_empty() {
            REPAIR_KEYS
        } else {
            COMPACT_KEYS
        };
        let to = (from + slice).min(home.key_bound());
        let keys: Vec<usize> = if c.segments.is_empty() {
            (from..to).filter(|&k| self.lost(home, k)).collect()
        } else {
            home.records_in(from..to, &c.segments)
        };
        if let Some(c) = self.compaction.as_mut() {
            c.next_key = to;
        }
        for key in keys {
            self.copy_message(home, key);
        }
        if to >= home.key_bound() {
            self.finish_pass();
        }
    }

    /// The end of a pass over the cache: a compaction retires its segments, a repair
    /// leaves the journal clean; unless a write failed meanwhile.
    fn finish_pass(&mut self) {
        let Some(c) = self.compaction.take() else {
            return;
        };
        if c.failures != self.disk.failures {
            return;
        }
        if c.segments.is_empty() {
            self.disk.dirty = false;
        }
        for s in c.segments {
            if let Err(e) = self.log.retire(s) {
                log::warn!("{}: {e}", self.disk.part);
            }
        }
    }

    /// The cached message at `key` has no record in the log (deferred, or lost by a
    /// failed write).
    fn lost(&self, home: &HomeTopics, key: usize) -> bool {
        home.message(key)
            .is_some_and(|(_, m)| !m.record.is_some_and(|r| self.log.holds(r)))
    }

    /// The start of a repair: the webhook registrations and removals the log lost.
    fn repair_records(&mut self, home: &mut HomeTopics) {
        for (topic, sub) in home.client_records() {
            if !sub.record.is_some_and(|r| self.log.holds(r)) {
                if let Some(a) = self.client_sub(&topic, &sub) {
                    home.set_client_record(&topic, &sub.client.id, a.loc);
                }
            }
        }
        for (topic, url, record) in home.webhook_records() {
            if !record.is_some_and(|r| self.log.holds(r)) {
                if let Some(a) = self.append(&Entry::WebhookAdd {
                    topic: &topic,
                    url: &url,
                }) {
                    home.set_webhook_record(&topic, &url, a.loc);
                }
            }
        }
        let (lost, kept): (Vec<Tombstone>, Vec<Tombstone>) = std::mem::take(&mut self.tombstones)
            .into_iter()
            .partition(|t| !self.log.holds(t.record));
        self.tombstones = kept;
        let mut cancels = std::mem::take(&mut self.unrecorded);
        cancels.extend(lost.into_iter().map(|t| (t.what, t.cancels)));
        for (what, segment) in cancels {
            self.tombstone(what, segment);
        }
    }

    /// Writes the whole home state to this log at start, syncs it, and deletes the log's
    /// segments of earlier runs (the worker layout changed: records must be in their
    /// topics' homes' logs).
    pub fn rewrite(&mut self, home: &mut HomeTopics) -> Result<(), StoreError> {
        // What the restore dropped lies in the earlier layout's logs, deleted below: not
        // places in this log, whose live bytes they would lower.
        let mut earlier = Vec::new();
        home.take_released(&mut earlier);
        for key in 0..home.key_bound() {
            self.copy_message(home, key);
        }
        for (topic, url, _) in home.webhook_records() {
            if let Some(a) = self.append(&Entry::WebhookAdd {
                topic: &topic,
                url: &url,
            }) {
                home.set_webhook_record(&topic, &url, a.loc);
            }
        }
        for (topic, sub) in home.client_records() {
            if let Some(a) = self.client_sub(&topic, &sub) {
                home.set_client_record(&topic, &sub.client.id, a.loc);
            }
        }
        home.take_released(&mut earlier);
        self.log.flush()?;
        self.log.sync_now()?;
        self.log.discard_previous()?;
        Ok(())
    }

    fn copy_message(&mut self, home: &mut HomeTopics, key: usize) {
        let Some((t, m)) = home.message(key) else {
            return;
        };
        // The position it was recorded at (a Forget names it when a v1 frame is taken).
        let pos = t.position(m);
        let (topic, expires, data, v1) = (t.name.clone(), m.expires, m.data.clone(), m.v1);
        if let Some(a) = self.message(v1, &topic, pos, expires, false, &data) {
            home.set_record(key, a.loc);
        }
    }

    fn copy_webhooks(&mut self, home: &mut HomeTopics, segments: &[SegmentId]) {
        for (topic, sub) in home.client_records() {
            if sub.record.is_some_and(|r| segments.contains(&r.segment)) {
                if let Some(a) = self.client_sub(&topic, &sub) {
                    home.set_client_record(&topic, &sub.client.id, a.loc);
                }
            }
        }
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
            self.tombstone(what, cancels);
        }
    }
}
