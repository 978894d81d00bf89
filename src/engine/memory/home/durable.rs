//! What the durable engine needs of a home's state: restoring it at start, and finding the
//! records of a segment to copy forward when the log compacts.

use std::sync::Arc;

use super::{Cached, HomeTopic, HomeTopics};
use crate::engine::Message;
use crate::metrics::DropReason;
use crate::store::{Loc, SegmentId};

impl HomeTopics {
    /// Restores a message at start; returns whether it is cached. `expires` is on the
    /// worker clock. Messages of a topic must come in position order: a newer epoch
    /// replaces what an older one left (its messages were gone before the topic was
    /// forgotten; only their records were still on disk).
    pub fn restore(
        &mut self,
        topic: &Arc<str>,
        msg: Message,
        hash: u64,
        expires: u64,
        record: Loc,
    ) -> bool {
        let mut slot = self.slot_of(topic);
        let t = &self.topics[slot as usize];
        if msg.pos.epoch > t.epoch && !t.cached.is_empty() {
            let stale: Vec<usize> = t.cached.iter().copied().collect();
            for k in stale {
                self.evict(k, DropReason::Expired);
            }
            slot = self.slot_of(topic);
        }
        let t = &mut self.topics[slot as usize];
        if (t.cached.is_empty() && t.last_seq == 0) || msg.pos.epoch > t.epoch {
            // A topic new here takes the epoch of the history it is restored from.
            t.epoch = msg.pos.epoch;
            t.last_seq = 0;
        }
        if msg.pos.epoch < t.epoch || msg.pos.seq <= t.last_seq {
            self.released.push(record);
            self.gc(slot);
            return false;
        }
        t.last_seq = msg.pos.seq;
        let key = self.insert(slot, msg.pos.seq, hash, &msg.body, expires, msg.origin);
        let cached = self
            .cache
            .get(key)
            .is_some_and(|m| m.topic == slot && m.topic_seq == msg.pos.seq);
        if cached {
            self.cache.set_record(key, record);
        } else {
            self.released.push(record);
        }
        cached
    }

    /// Keys of cached messages in `keys` whose record lies in one of `segments`.
    pub fn records_in(&self, keys: std::ops::Range<usize>, segments: &[SegmentId]) -> Vec<usize> {
        keys.filter(|&k| {
            self.cache
                .get(k)
                .and_then(|m| m.record)
                .is_some_and(|r| segments.contains(&r.segment))
        })
        .collect()
    }

    /// One past the highest cache key in use (see `Cache::key_bound`).
    pub fn key_bound(&self) -> usize {
        self.cache.key_bound()
    }

    /// The cached message at `key` with its topic.
    pub fn message(&self, key: usize) -> Option<(&HomeTopic, &Cached)> {
        let m = self.cache.get(key)?;
        Some((self.topics.get(m.topic as usize)?, m))
    }

    /// Records where the cached message at `key` now lives in the log.
    pub fn set_record(&mut self, key: usize, loc: Loc) {
        self.cache.set_record(key, loc);
    }

    /// Every webhook registration with its record: (topic, url, record).
    pub fn webhook_records(&self) -> Vec<(Arc<str>, Arc<str>, Option<Loc>)> {
        self.topics
            .iter()
            .flat_map(|(_, t)| {
                t.webhooks
                    .iter()
                    .map(|w| (t.name.clone(), w.url.clone(), w.record))
            })
            .collect()
    }

    /// Webhook registrations whose record lies in one of `segments`: (topic, url).
    pub fn webhooks_in(&self, segments: &[SegmentId]) -> Vec<(Arc<str>, Arc<str>)> {
        self.topics
            .iter()
            .flat_map(|(_, t)| {
                t.webhooks
                    .iter()
                    .filter(|w| w.record.is_some_and(|r| segments.contains(&r.segment)))
                    .map(|w| (t.name.clone(), w.url.clone()))
            })
            .collect()
    }
}
