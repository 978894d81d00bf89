//! The publish/deliver engine behind `pairs` and `fanout`: connections grouped on topics,
//! some publishing, some subscribed; open loop on a fixed schedule or closed loop.
//!
//! Latency is measured from each message's *scheduled* send time (stamped into the payload),
//! so a stalled server or a late sender shows up as latency instead of disappearing
//! (no coordinated omission). Loss is computed after the run from every sender's acked set and
//! every thread's delivery counts.

use crate::proto;

use super::{split, Ctx, MsgStats, Sender};

mod drive;
pub use drive::run;

/// How connections sit on topics.
#[derive(Debug, Clone, Copy)]
pub enum Shape {
    /// Topic `p` has connections `2p` (dApp) and `2p + 1` (wallet); both subscribe and publish.
    Pairs {
        /// Number of pairs.
        pairs: usize,
    },
    /// One topic: connection 0 publishes (not subscribed), `1..=subs` subscribe.
    Fanout {
        /// Number of subscribers.
        subs: usize,
    },
}

impl Shape {
    /// Connections in all.
    pub fn conns(&self) -> usize {
        match *self {
            Shape::Pairs { pairs } => 2 * pairs,
            Shape::Fanout { subs } => subs + 1,
        }
    }

    fn topic_index(&self, g: usize) -> usize {
        match self {
            Shape::Pairs { .. } => g / 2,
            Shape::Fanout { .. } => 0,
        }
    }

    fn publishes(&self, g: usize) -> bool {
        match self {
            Shape::Pairs { .. } => true,
            Shape::Fanout { .. } => g == 0,
        }
    }

    fn subscribes(&self, g: usize) -> bool {
        match self {
            Shape::Pairs { .. } => true,
            Shape::Fanout { .. } => g != 0,
        }
    }

    /// Deliveries one message should produce.
    pub fn expected(&self) -> u32 {
        match *self {
            Shape::Pairs { .. } => 1,
            Shape::Fanout { subs } => subs as u32,
        }
    }

    /// Global connection range thread `t` owns (pairs never split across threads).
    fn range(&self, threads: usize, t: usize) -> std::ops::Range<usize> {
        match *self {
            Shape::Pairs { pairs } => {
                let r = split(pairs, threads, t);
                2 * r.start..2 * r.end
            }
            Shape::Fanout { subs } => {
                let r = split(subs, threads, t);
                let start = if t == 0 { 0 } else { r.start + 1 };
                start..r.end + 1
            }
        }
    }
}

/// Load flags shared by `pairs` and `fanout`.
#[derive(Debug, Clone)]
pub struct Load {
    /// Total publishes per second; 0 = closed loop.
    pub rate: u64,
    /// Closed loop: messages in flight per pair / per publisher.
    pub inflight: usize,
    /// Message size in hex characters.
    pub size: usize,
    /// Publish ttl, seconds.
    pub ttl: u64,
    /// Time after the window to wait for deliveries, ns.
    pub drain_ns: u64,
    /// Acknowledge deliveries.
    pub ack: bool,
    /// Cap on publishes in the window (0 = none).
    pub count: u64,
    /// Speak WalletConnect 1.0 frames instead of waku JSON-RPC: a `sub` is ready when the
    /// pong of the ping sent after it comes; a `pub` is unanswered, counted acked when sent.
    pub v1: bool,
    /// Pairs in the 2.x SDK's shape: string ids, an `irn_batchSubscribe` of a pairing and
    /// the session topic, the dApp (even connection) sends requests (1108) and the wallet
    /// (odd) answers each one (1109) at once; only the dApps follow the schedule.
    pub sdk: bool,
    /// The JSON-RPC methods (`waku_*` or `irn_*`) when not `v1`.
    pub rpc: proto::Rpc,
}

/// What one thread hands back.
pub struct ThreadOut {
    /// Counters and latency.
    pub stats: MsgStats,
    /// (global sender id, its bookkeeping).
    pub senders: Vec<(u32, Sender)>,
    /// Delivery counts per global sender per sequence number.
    pub recv: Vec<Vec<u32>>,
    /// Setup time, ns.
    pub setup_ns: u64,
}

/// The name of the run's topic number `i`.
pub fn topic_name(ctx: &Ctx, i: usize) -> String {
    proto::topic(ctx.nonce, 0x70, i as u64)
}

/// The pairing topic of pair `i` in the SDK's shape (subscribed, never published on).
pub fn pairing_topic_name(ctx: &Ctx, i: usize) -> String {
    proto::topic(ctx.nonce, 0x71, i as u64)
}

/// Merge the threads: total figures, with loss computed over all of them.
/// Returns (stats, lost deliveries, messages with a lost delivery, sent-but-unacked).
pub fn merge(outs: Vec<ThreadOut>, shape: Shape) -> (MsgStats, u64, u64, u64) {
    let mut total = MsgStats::default();
    let mut recv: Vec<Vec<u32>> = vec![Vec::new(); shape.conns()];
    let mut senders = Vec::new();
    for o in outs {
        total.merge(&o.stats);
        for (g, counts) in o.recv.into_iter().enumerate() {
            let r = &mut recv[g];
            if r.len() < counts.len() {
                r.resize(counts.len(), 0);
            }
            for (i, c) in counts.into_iter().enumerate() {
                r[i] += c;
            }
        }
        senders.extend(o.senders);
    }
    let expected = shape.expected();
    let (mut lost_deliveries, mut lost_messages, mut unacked) = (0, 0, 0);
    for (g, s) in &senders {
        let Some(first) = s.win_first else {
            continue;
        };
        let end = s.win_end.unwrap_or(s.next_seq);
        let counts = &recv[*g as usize];
        for seq in first..end {
            if !s.acked.get(seq) {
                unacked += 1;
                continue;
            }
            let got = counts.get(seq as usize).copied().unwrap_or(0);
            if got < expected {
                lost_deliveries += (expected - got) as u64;
                lost_messages += 1;
            }
        }
    }
    (total, lost_deliveries, lost_messages, unacked)
}
