//! One round of a worker's loop ([`Round`]): its lists (connections with output, with input to
//! resume, over their outbound limit, to remove) and its budgets (accepts, bytes read, a
//! connection's turn and the fan-out budget, the engine's mailbox, output held within the
//! round), and the limits on a connection's output. It decides, in one place each, when a connection yields ([`Round::turn`],
//! [`Round::fanout_full`], [`Round::read_more`]) and when the round's output is written
//! early ([`Round::write_early`]); the worker carries the decisions out. It touches no
//! socket and no connection but their list marks.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use slab::Slab;

use super::apply::OutLimits;
use crate::config::Limits;
use crate::conn::{self, Conn, Turn};
use crate::relay::{ConnRef, Relay};

/// Most connections accepted from one listener in one round (more wait in the backlog for
/// the next round, which then polls without sleeping).
pub const ACCEPT_BUDGET: usize = 16;

/// Bodies copied into connections' buffers within a round past which its output is written
/// early (see [`Round::write_early`]): a saturated round queues more than the core's L2
/// cache (about 1 MiB) holds, and written at its end the kernel would read it back from
/// further out. At a third of this bound a saturated worker serves fewer deliveries (0.96x).
const FLUSH_WITHIN_ROUND_BYTES: usize = 384 << 10;

/// ... and the average per connection waiting to be written: a fan-out's rounds keep several
/// pushes per write.
const FLUSH_PER_CONN_BYTES: usize = 8 << 10;

/// The clock is read for `--round-hold-us` (`Limits::round_hold_us`) once every this many
/// connection events of a round, not once per message (a read is a vDSO call, some 20 ns; an
/// event is a `read` syscall and up to `messages_per_turn` messages). A round may so pass the
/// bound by up to this many events' work.
const CLOCK_EVERY: u32 = 4;

/// Why a round's output is written before its end.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Early {
    /// The bodies copied into buffers passed [`FLUSH_WITHIN_ROUND_BYTES`].
    Bytes,
    /// Output was held longer than `--round-hold-us` (`Limits::round_hold_us`).
    Held,
}

/// Whether the engine handed all its work on at the last write-out (`Engine::flush`).
pub use crate::engine::Handoff;

/// A worker's round: its lists and its budgets.
pub struct Round {
    /// Connections with queued output, written at the round's end (or early).
    pub dirty: Vec<usize>,
    /// Connections with input left (their turn ended, or they were resumed), driven again
    /// after the others without waiting for an event.
    pub ready: VecDeque<ConnRef>,
    /// WebSockets whose outbound buffer passed the limit during a delivery.
    pub overflow: Vec<usize>,
    /// Connections to remove at the round's end.
    pub closing: Vec<usize>,
    /// A listener (plain, TLS) still had connections waiting when its accept budget ran out:
    /// accept again next round, without sleeping.
    pub accept_more: [bool; 2],
    /// What the engine did with its work at the last write-out.
    pub handoff: Handoff,
    /// A connection's turn in this round (its messages, the round's fan-out budget).
    turn: Turn,
    /// What a round may do, from the limits.
    budgets: Budgets,
    /// What decides an early write-out.
    early: EarlyState,
    /// The limits a delivery applies to a connection's output.
    pub out: OutLimits,
}

/// What a round may do, set once from the limits.
#[derive(Debug, Clone, Copy)]
struct Budgets {
    /// `Limits::messages_per_turn`.
    messages_per_turn: usize,
    /// `Limits::fanout_min`, `Limits::fanout_per_conn`.
    fanout_min: usize,
    fanout_per_conn: usize,
    /// `Limits::read_budget`: bytes read from one connection per turn.
    read_budget: usize,
    /// `Limits::inbox_budget`: batches the engine reads from its mailbox per round.
    inbox_budget: usize,
    /// `--round-hold-us` (`None`: 0, no time bound).
    hold: Option<Duration>,
}

/// What [`Round::write_early`] reads and moves.
#[derive(Debug, Clone, Copy)]
struct EarlyState {
    /// Bytes of bodies the early deliveries copied into buffers since the output was last
    /// written.
    bytes: usize,
    /// Since when output has been held, as last read (`None`: unknown since the last early
    /// write, set at the next clock read).
    held_since: Option<Instant>,
    /// Connection events since the clock was last read.
    events: u32,
}

impl Round {
    /// A worker's rounds under `limits`, the first beginning at `now`.
    pub fn new(limits: &Limits, now: Instant) -> Round {
        Round {
            dirty: Vec::new(),
            ready: VecDeque::new(),
            overflow: Vec::new(),
            closing: Vec::new(),
            accept_more: [false; 2],
            handoff: Handoff::Done,
            turn: Turn::new(limits.messages_per_turn, limits.fanout_min),
            budgets: Budgets {
                messages_per_turn: limits.messages_per_turn,
                fanout_min: limits.fanout_min,
                fanout_per_conn: limits.fanout_per_conn,
                read_budget: limits.read_budget,
                inbox_budget: limits.inbox_budget,
                hold: (limits.round_hold_us > 0)
                    .then(|| Duration::from_micros(limits.round_hold_us)),
            },
            early: EarlyState {
                bytes: 0,
                held_since: Some(now),
                events: 0,
            },
            out: OutLimits::new(limits),
        }
    }

    /// A round begins at `at` for a worker holding `connections`: its fan-out budget grows
    /// with them.
    pub fn begin(&mut self, at: Instant, connections: usize) {
        let b = &self.budgets;
        let fanout = connections
            .saturating_mul(b.fanout_per_conn)
            .max(b.fanout_min);
        self.turn = Turn::new(b.messages_per_turn, fanout);
        self.early.held_since = Some(at);
        self.early.events = 0;
    }

    /// Work is ready without an event: poll without sleeping.
    pub fn has_work(&self) -> bool {
        !self.ready.is_empty() || self.accept_more.contains(&true)
    }

    /// A fresh turn for a connection's input.
    pub fn turn(&self) -> Turn {
        self.turn
    }

    /// The queued deliveries have reached the round's fan-out budget: no more input is read
    /// until they are delivered and written.
    pub fn fanout_full(&self, relay: &Relay) -> bool {
        self.turn.fanout_full(relay)
    }

    /// A connection that has read `total` bytes this turn may read more.
    pub fn read_more(&self, total: usize) -> bool {
        total < self.budgets.read_budget
    }

    /// Batches the engine may read from its mailbox this round.
    pub fn inbox_budget(&self) -> usize {
        self.budgets.inbox_budget
    }

    /// Puts connection `key` on the list to write (once).
    pub fn mark_dirty(&mut self, conns: &mut Slab<Conn>, key: usize) {
        if let Some(c) = conns.get_mut(key) {
            if !c.marks.dirty {
                c.marks.dirty = true;
                self.dirty.push(key);
            }
        }
    }

    /// Puts connection `key` on the ready list (once): its input is driven again after this
    /// round's deliveries, without waiting for an event.
    pub fn resume_later(&mut self, conns: &mut Slab<Conn>, key: usize) {
        if let Some(c) = conns.get_mut(key) {
            if !c.marks.ready && !c.marks.closed {
                c.marks.ready = true;
                self.ready.push_back(c.at(key));
            }
        }
    }

    /// [`Round::resume_later`] for the connection `r` names, if it is still that one.
    pub fn resume(&mut self, conns: &mut Slab<Conn>, r: ConnRef) {
        if let Some(c) = conn::live(conns, r) {
            if !c.marks.ready {
                c.marks.ready = true;
                self.ready.push_back(r);
            }
        }
    }

    /// Marks connection `key` for removal at the round's end (once).
    pub fn close(&mut self, conns: &mut Slab<Conn>, key: usize) {
        if let Some(c) = conns.get_mut(key) {
            if !c.marks.closed {
                c.marks.closed = true;
                self.closing.push(key);
            }
        }
    }

    /// An early delivery copied `bytes` of bodies into buffers.
    pub fn copied(&mut self, bytes: usize) {
        self.early.bytes += bytes;
    }

    /// The round's output was written (early or at its end).
    pub fn written(&mut self) {
        self.early.bytes = 0;
    }

    /// After a connection's event: whether the round's output is written now, before its
    /// end, and why. By bytes: once the bodies copied into buffers pass
    /// [`FLUSH_WITHIN_ROUND_BYTES`] and average [`FLUSH_PER_CONN_BYTES`] per connection to
    /// write, so that the buffers are written, and taken again from the pool, while they are
    /// in the core's cache. By time: once output (a connection to write, or deliveries
    /// `queued` in the relay) has waited `--round-hold-us` (`Limits::round_hold_us`, unless
    /// 0); `clock` is read at most once every [`CLOCK_EVERY`] events.
    pub fn write_early(&mut self, queued: bool, clock: impl FnOnce() -> Instant) -> Option<Early> {
        let e = &mut self.early;
        if e.bytes >= FLUSH_WITHIN_ROUND_BYTES && e.bytes >= FLUSH_PER_CONN_BYTES * self.dirty.len()
        {
            e.held_since = None;
            e.events = 0;
            return Some(Early::Bytes);
        }
        let hold = self.budgets.hold?;
        e.events += 1;
        if e.events < CLOCK_EVERY {
            return None;
        }
        e.events = 0;
        let now = clock();
        let held = queued || !self.dirty.is_empty();
        match e.held_since {
            Some(since) if held && now.saturating_duration_since(since) >= hold => {
                e.held_since = Some(now);
                Some(Early::Held)
            }
            Some(_) if held => None,
            // Nothing held (it can only have begun since), or unknown since the last early
            // write: counted from now.
            _ => {
                e.held_since = Some(now);
                None
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The default `--round-hold-us`.
    const HOLD_BOUND: Duration = Duration::from_micros(crate::config::DEFAULT_ROUND_HOLD_US);

    fn round(at: Instant) -> Round {
        let mut r = Round::new(&Limits::default(), at);
        r.begin(at, 10);
        r
    }

    /// `write_early` with the clock at `at`: its answer, and whether it read the clock.
    fn early(r: &mut Round, queued: bool, at: Instant) -> (Option<Early>, bool) {
        let read = std::cell::Cell::new(false);
        let answer = r.write_early(queued, || {
            read.set(true);
            at
        });
        (answer, read.get())
    }

    /// Calls `write_early` until the clock is read (at `at`), returning its answer.
    fn at_clock(r: &mut Round, queued: bool, at: Instant) -> Option<Early> {
        for _ in 1..CLOCK_EVERY {
            assert_eq!(early(r, queued, at), (None, false));
        }
        let (answer, read) = early(r, queued, at);
        assert!(read);
        answer
    }

    #[test]
    fn output_held_past_the_bound_is_written_early() {
        let t0 = Instant::now();
        let mut r = round(t0);
        r.dirty.push(3);
        assert_eq!(at_clock(&mut r, false, t0 + HOLD_BOUND / 2), None);
        assert_eq!(at_clock(&mut r, false, t0 + HOLD_BOUND), Some(Early::Held));
        // Counted again from that write.
        assert_eq!(at_clock(&mut r, false, t0 + HOLD_BOUND * 3 / 2), None);
        assert_eq!(
            at_clock(&mut r, true, t0 + HOLD_BOUND * 2),
            Some(Early::Held)
        );
    }

    #[test]
    fn nothing_held_means_no_early_write_and_the_wait_counts_from_the_next_read() {
        let t0 = Instant::now();
        let mut r = round(t0);
        assert_eq!(at_clock(&mut r, false, t0 + HOLD_BOUND * 4), None);
        r.dirty.push(1);
        assert_eq!(at_clock(&mut r, false, t0 + HOLD_BOUND * 9 / 2), None);
        assert_eq!(
            at_clock(&mut r, false, t0 + HOLD_BOUND * 5),
            Some(Early::Held)
        );
    }

    #[test]
    fn bytes_past_the_bound_are_written_early_and_the_time_is_then_read_again() {
        let t0 = Instant::now();
        let mut r = round(t0);
        r.dirty.extend([1, 2]);
        r.copied(FLUSH_WITHIN_ROUND_BYTES - 1);
        assert_eq!(early(&mut r, false, t0), (None, false));
        r.copied(1);
        assert_eq!(early(&mut r, false, t0), (Some(Early::Bytes), false));
        r.written();
        // Since when output is held is unknown after that write: the next read starts it.
        assert_eq!(at_clock(&mut r, false, t0 + HOLD_BOUND * 10), None);
        assert_eq!(
            at_clock(&mut r, false, t0 + HOLD_BOUND * 11),
            Some(Early::Held)
        );
    }

    #[test]
    fn a_fan_out_keeps_several_pushes_per_write() {
        let t0 = Instant::now();
        let mut r = round(t0);
        r.dirty.extend(0..100);
        r.copied(FLUSH_WITHIN_ROUND_BYTES);
        assert_eq!(early(&mut r, false, t0), (None, false));
        r.copied(FLUSH_PER_CONN_BYTES * 100);
        assert_eq!(early(&mut r, false, t0), (Some(Early::Bytes), false));
    }

    #[test]
    fn a_connection_reads_up_to_its_budget() {
        let limits = Limits::default();
        let r = Round::new(&limits, Instant::now());
        assert!(r.read_more(limits.read_budget - 1));
        assert!(!r.read_more(limits.read_budget));
    }
}
