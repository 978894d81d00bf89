//! Merging a topic's history reads with its live messages, per worker and topic, so that each
//! stored message is delivered once, in seq order, with no gap (DECISIONS §7: "merge by the
//! store's per-topic sequence number").
//!
//! Owns: the position bookkeeping of one (worker, topic) only. Pure: no I/O, no clock; it
//! says when to read, the caller issues the read ([`super::ClusterHandle::read`]) and feeds
//! back the answer. Must not touch subscribers or sockets.
//!
//! Use: `on_resync` on [`super::ClusterEvent::Resync`], `on_live` on `Live`, `on_history`
//! on `History` (with `Ok`), `on_read_failed` on `History(Err)` or a refused read, `retry`
//! now and then (a timer) for topics whose read failed. Each may return a [`ReadAt`]: issue
//! that read. Messages to deliver are appended to `out`, in order.

use std::collections::BTreeMap;

use bytes::Bytes;

use super::{History, Origin};

/// A read to issue: after `after` in `epoch` (the store reads from the start when `epoch`
/// is not current).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReadAt {
    /// The epoch the position belongs to.
    pub epoch: u64,
    /// The last seq delivered.
    pub after: u64,
}

/// A message to deliver.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Delivery {
    /// Its sequence number.
    pub seq: u64,
    /// The stored bytes.
    pub data: Bytes,
    /// Who published it.
    pub origin: Origin,
}

/// The merge state of one topic on one worker.
#[derive(Debug)]
pub struct Merge {
    /// Epoch of `last` (0: none known yet).
    epoch: u64,
    /// Last seq delivered in `epoch`.
    last: u64,
    /// A read answered since the last resync and nothing forces another: live messages
    /// may be delivered directly.
    synced: bool,
    /// A read is in flight.
    reading: bool,
    /// Another read is wanted once the one in flight is answered.
    again: bool,
    /// Live messages waiting for a read, by (epoch, seq); at most `cap`.
    buffered: BTreeMap<(u64, u64), (Bytes, Origin)>,
    cap: usize,
}

impl Merge {
    /// A fresh topic: nothing delivered yet; at most `cap` live messages are buffered while
    /// a read is in flight (past it they are dropped and read again instead).
    pub fn new(cap: usize) -> Merge {
        Merge {
            epoch: 0,
            last: 0,
            synced: false,
            reading: false,
            again: false,
            buffered: BTreeMap::new(),
            cap: cap.max(1),
        }
    }

    /// The position delivered so far: `(epoch, last seq)`.
    pub fn position(&self) -> (u64, u64) {
        (self.epoch, self.last)
    }

    fn want_read(&mut self) -> Option<ReadAt> {
        self.synced = false;
        if self.reading {
            self.again = true;
            return None;
        }
        self.reading = true;
        self.again = false;
        Some(ReadAt {
            epoch: self.epoch,
            after: self.last,
        })
    }

    /// The node's subscription is live: read after the current position.
    pub fn on_resync(&mut self) -> Option<ReadAt> {
        self.want_read()
    }

    /// A read failed (`Unavailable`): the next `Resync` (sent when the store is back), the
    /// next live message, or [`Merge::retry`] on the caller's timer reads again.
    pub fn on_read_failed(&mut self) -> Option<ReadAt> {
        self.reading = false;
        self.synced = false;
        None
    }

    /// For the caller's timer: a read when the last one failed and none is in flight (so a
    /// topic that gets no live message still catches up), else `None`.
    pub fn retry(&mut self) -> Option<ReadAt> {
        if self.synced || self.reading {
            return None;
        }
        self.want_read()
    }

    fn buffer(&mut self, epoch: u64, seq: u64, data: Bytes, origin: Origin) {
        if self.buffered.len() >= self.cap {
            // Too much to hold: forget it all; a read after the current one fetches it.
            self.buffered.clear();
            self.again = true;
            return;
        }
        self.buffered.insert((epoch, seq), (data, origin));
    }

    /// A live message arrived.
    pub fn on_live(
        &mut self,
        epoch: u64,
        seq: u64,
        data: Bytes,
        origin: Origin,
        out: &mut Vec<Delivery>,
    ) -> Option<ReadAt> {
        if self.synced && !self.reading && self.epoch == 0 && self.last == 0 && seq == 1 {
            self.epoch = epoch; // the topic's first message ever seen here
        }
        if !self.synced || self.reading {
            self.buffer(epoch, seq, data, origin);
            // Not synced and no read in flight (the last one failed): read again now.
            return if self.reading { None } else { self.want_read() };
        }
        if epoch == self.epoch {
            if seq <= self.last {
                return None;
            }
            if seq == self.last + 1 {
                self.last = seq;
                out.push(Delivery { seq, data, origin });
                return None;
            }
        }
        // A gap, or another epoch: read to find out.
        self.buffer(epoch, seq, data, origin);
        self.want_read()
    }

    /// A read was answered.
    pub fn on_history(&mut self, h: History, out: &mut Vec<Delivery>) -> Option<ReadAt> {
        self.reading = false;
        if h.epoch != self.epoch {
            self.epoch = h.epoch;
            self.last = 0;
        }
        for m in h.messages {
            if m.seq > self.last {
                self.last = m.seq;
                out.push(Delivery {
                    seq: m.seq,
                    data: m.data,
                    origin: m.origin,
                });
            }
        }
        self.last = self.last.max(h.scanned_to);
        if h.scanned_to < h.last_seq || self.again {
            return self.want_read();
        }
        self.synced = true;
        self.drain(out)
    }

    /// Delivers buffered messages that follow on; a gap or a newer epoch asks for a read.
    fn drain(&mut self, out: &mut Vec<Delivery>) -> Option<ReadAt> {
        while let Some(((e, s), _)) = self.buffered.first_key_value() {
            let (e, s) = (*e, *s);
            if (e == self.epoch && s > self.last + 1) || e > self.epoch {
                return self.want_read();
            }
            let Some((_, (data, origin))) = self.buffered.pop_first() else {
                break;
            };
            if e == self.epoch && s == self.last + 1 {
                self.last = s;
                out.push(Delivery {
                    seq: s,
                    data,
                    origin,
                });
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::HistoryMessage;

    fn hist(epoch: u64, last: u64, seqs: &[u64]) -> History {
        History {
            epoch,
            last_seq: last,
            scanned_to: last,
            messages: seqs
                .iter()
                .map(|&s| HistoryMessage {
                    seq: s,
                    data: Bytes::from(s.to_string()),
                    origin: Origin::default(),
                    expires_ms: 0,
                })
                .collect(),
        }
    }

    fn live(m: &mut Merge, e: u64, s: u64, out: &mut Vec<Delivery>) -> Option<ReadAt> {
        m.on_live(e, s, Bytes::from(s.to_string()), Origin::default(), out)
    }

    fn seqs(out: &[Delivery]) -> Vec<u64> {
        out.iter().map(|d| d.seq).collect()
    }

    #[test]
    fn late_subscriber_gets_history_then_live_without_gap_or_double() {
        let mut m = Merge::new(100);
        let mut out = Vec::new();
        assert_eq!(m.on_resync(), Some(ReadAt { epoch: 0, after: 0 }));
        // Live 3 and 4 arrive while the read (which saw 1..3) is in flight.
        assert_eq!(live(&mut m, 9, 3, &mut out), None);
        assert_eq!(live(&mut m, 9, 4, &mut out), None);
        assert!(out.is_empty());
        assert_eq!(m.on_history(hist(9, 3, &[1, 2, 3]), &mut out), None);
        assert_eq!(seqs(&out), [1, 2, 3, 4]);
        assert_eq!(live(&mut m, 9, 4, &mut out), None);
        assert_eq!(live(&mut m, 9, 5, &mut out), None);
        assert_eq!(seqs(&out), [1, 2, 3, 4, 5]);
        assert_eq!(m.position(), (9, 5));
    }

    #[test]
    fn a_gap_reads_again_and_fills_in() {
        let mut m = Merge::new(100);
        let mut out = Vec::new();
        m.on_resync();
        m.on_history(hist(9, 2, &[1, 2]), &mut out);
        assert_eq!(
            live(&mut m, 9, 5, &mut out),
            Some(ReadAt { epoch: 9, after: 2 })
        );
        assert_eq!(m.on_history(hist(9, 5, &[3, 4, 5]), &mut out), None);
        assert_eq!(seqs(&out), [1, 2, 3, 4, 5]);
    }

    #[test]
    fn a_new_epoch_starts_over_and_resync_rereads_after_position() {
        let mut m = Merge::new(100);
        let mut out = Vec::new();
        m.on_resync();
        m.on_history(hist(9, 2, &[1, 2]), &mut out);
        assert_eq!(m.on_resync(), Some(ReadAt { epoch: 9, after: 2 }));
        assert_eq!(m.on_history(hist(12, 1, &[1]), &mut out), None);
        assert_eq!(seqs(&out), [1, 2, 1]);
        assert_eq!(m.position(), (12, 1));
        assert_eq!(
            live(&mut m, 15, 1, &mut out),
            Some(ReadAt {
                epoch: 12,
                after: 1
            })
        );
    }

    #[test]
    fn empty_topic_adopts_its_first_epoch_and_paged_reads_continue() {
        let mut m = Merge::new(100);
        let mut out = Vec::new();
        m.on_resync();
        assert_eq!(m.on_history(hist(0, 0, &[]), &mut out), None);
        assert_eq!(live(&mut m, 7, 1, &mut out), None);
        assert_eq!(seqs(&out), [1]);
        let mut h = hist(7, 10, &[2, 3]);
        h.scanned_to = 3;
        m.on_resync();
        assert_eq!(
            m.on_history(h, &mut out),
            Some(ReadAt { epoch: 7, after: 3 })
        );
        assert_eq!(m.on_read_failed(), None);
        assert_eq!(m.retry(), Some(ReadAt { epoch: 7, after: 3 }));
        assert_eq!(m.retry(), None, "one read in flight at most");
    }

    #[test]
    fn an_overflowing_buffer_is_replaced_by_another_read() {
        let mut m = Merge::new(2);
        let mut out = Vec::new();
        m.on_resync();
        for s in 1..=5 {
            live(&mut m, 9, s, &mut out);
        }
        let again = m.on_history(hist(9, 1, &[1]), &mut out);
        assert_eq!(again, Some(ReadAt { epoch: 9, after: 1 }));
        assert_eq!(m.on_history(hist(9, 5, &[2, 3, 4, 5]), &mut out), None);
        assert_eq!(seqs(&out), [1, 2, 3, 4, 5]);
    }
}
