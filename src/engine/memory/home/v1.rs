//! A home topic's WalletConnect 1.0 state (DECISIONS §8): which workers have v1
//! subscribers, and the frames pending for a subscriber (kept in the worker's cache, with
//! the 6-hour ttl, the per-topic cap and the byte budget of every cached message).

use std::sync::Arc;

use super::HomeTopics;
use crate::engine::memory::cache::Entry;
use crate::engine::{Origin, Position};
use crate::metrics::DropReason;
use crate::store::Loc;

impl HomeTopics {
    /// Worker `core` gained (`delta` 1) or lost (-1) a v1 subscription of the topic.
    pub fn v1_watch(&mut self, topic: &Arc<str>, core: u16, delta: i32) {
        let slot = self.slot_of(topic);
        let w = &mut self.topics[slot as usize].v1_watchers;
        match w.iter().position(|(c, _)| *c == core) {
            Some(i) if delta < 0 => {
                w[i].1 = w[i].1.saturating_sub(1);
                if w[i].1 == 0 {
                    w.swap_remove(i);
                }
            }
            Some(i) => w[i].1 += 1,
            None if delta > 0 => w.push((core, 1)),
            None => {}
        }
        self.gc(slot);
    }

    /// The workers to send a v1 `pub` to, when the topic has v1 subscribers besides the
    /// publishing connection (`self_subscribed`: it is one of them); `None`: keep it pending.
    pub fn v1_route(&self, topic: &str, self_subscribed: bool) -> Option<Vec<u16>> {
        let t = self.topics.get(self.find(topic)? as usize)?;
        let all: u32 = t.v1_watchers.iter().map(|(_, n)| n).sum();
        let others = all.saturating_sub(u32::from(self_subscribed));
        (others > 0).then(|| t.v1_watchers.iter().map(|(c, _)| *c).collect())
    }

    /// Keeps a v1 frame pending until `expires` (worker clock); returns its cache key and
    /// position while it is still cached (the byte budget may evict it at once).
    pub fn v1_keep(
        &mut self,
        topic: &Arc<str>,
        frame: bytes::Bytes,
        expires: u64,
        origin: Origin,
    ) -> Option<(usize, Position)> {
        let slot = self.slot_of(topic);
        let t = &mut self.topics[slot as usize];
        t.v1_seq += 1;
        let pos = Position {
            epoch: t.v1_epoch,
            seq: t.v1_seq,
        };
        let frame = crate::arcbuf::ArcBuf::copy_from_slice(&frame);
        self.insert_v1(slot, pos.seq, frame, expires, origin)
            .map(|k| (k, pos))
    }

    fn insert_v1(
        &mut self,
        slot: u32,
        seq: u64,
        frame: crate::arcbuf::ArcBuf,
        expires: u64,
        origin: Origin,
    ) -> Option<usize> {
        let key = self.cache.insert(Entry {
            topic: slot,
            topic_seq: seq,
            hash: 0,
            data: frame,
            beta_len: 0,
            expires,
            origin,
        });
        self.cache.mark_v1(key);
        self.topics[slot as usize].v1_pending.push_back(key);
        self.m().cached_messages.inc();
        self.bound(slot, true);
        self.cache
            .get(key)
            .is_some_and(|m| m.v1 && m.topic == slot && m.topic_seq == seq)
            .then_some(key)
    }

    /// Takes the topic's pending v1 frames, oldest first: (frame, position, record).
    pub fn v1_take(&mut self, topic: &str) -> Vec<(bytes::Bytes, Position, Option<Loc>)> {
        let Some(slot) = self.find(topic) else {
            return Vec::new();
        };
        let t = &mut self.topics[slot as usize];
        let epoch = t.v1_epoch;
        let keys: Vec<usize> = t.v1_pending.drain(..).collect();
        let mut frames = Vec::with_capacity(keys.len());
        for k in keys {
            if let Some(m) = self.cache.remove(k) {
                self.m().cached_messages.sub(1);
                // The position its record names: the Forget must name the same.
                let pos = Position {
                    epoch,
                    seq: m.topic_seq,
                };
                frames.push((m.data.to_bytes(), pos, m.record));
            }
        }
        self.m().cached_bytes.set(self.cache.bytes() as u64);
        self.gc(slot);
        frames
    }

    /// Restores a pending v1 frame at start, at the position its record names (frames of a
    /// topic in position order). A frame of an older history than the next one is dropped:
    /// a topic starts a new history only when none of its frames is pending, so such a
    /// frame was gone (taken, evicted) and only its record was left. A second record of
    /// the same position (a compaction's copy beside the original) is dropped too.
    pub fn v1_restore(
        &mut self,
        topic: &Arc<str>,
        pos: Position,
        frame: crate::arcbuf::ArcBuf,
        expires: u64,
        record: Loc,
    ) {
        let mut slot = self.slot_of(topic);
        let t = &self.topics[slot as usize];
        let first = t.v1_pending.is_empty() && t.v1_seq == 0;
        if first || pos.epoch > t.v1_epoch {
            let stale: Vec<usize> = t.v1_pending.iter().copied().collect();
            for k in stale {
                self.evict(k, DropReason::Expired);
            }
            slot = self.slot_of(topic);
            let t = &mut self.topics[slot as usize];
            t.v1_epoch = pos.epoch;
            t.v1_seq = 0;
        }
        let t = &mut self.topics[slot as usize];
        if pos.epoch != t.v1_epoch || pos.seq <= t.v1_seq {
            self.released.push(record);
            self.gc(slot);
            return;
        }
        t.v1_seq = pos.seq;
        match self.insert_v1(slot, pos.seq, frame, expires, Origin::NONE) {
            Some(key) => self.cache.set_record(key, record),
            None => self.released.push(record),
        }
    }

    /// A `Forget` read back at start names frame `pos` of `topic` (once every frame is
    /// restored): a frame kept from now on in that history takes a later position, or the
    /// next start would take that Forget for its own.
    pub fn v1_forgotten(&mut self, topic: &str, pos: Position) {
        let Some(slot) = self.find(topic) else { return };
        let t = &mut self.topics[slot as usize];
        if pos.epoch == t.v1_epoch {
            t.v1_seq = t.v1_seq.max(pos.seq);
        }
    }
}
