//! The per-address counts every worker shares (DECISIONS §11, issue 48): the open
//! connections of each IP address (IPv6: its /64) and its accept rate, exact across the
//! workers, so that the N-th connection of an address is let in and the N+1-th refused
//! whichever workers the kernel hands them to, and a burst of B lets exactly B through.
//!
//! A fixed table of [`SLOTS`] slots of two `AtomicU64`s, allocated once, touched only at
//! accept, at close and by a sweep once a second (never on the way of a message), and never
//! locked: every change is one compare-and-swap. The one wait is that of an accept which
//! finds another thread adding its own address right then: that claim is a few dozen loads
//! from settled, and the accept spins (then yields) until it is.
//! - **Where.** An address lives in one of the [`WINDOW`] slots from where a keyed hash of it
//!   points (lookups always read the whole window, so a freed slot needs no tombstone).
//! - **The id word** holds who the slot is for and how many connections it counts:
//!   `ident << 20 | state`. `ident` is the IPv4 address itself (with a flag bit), or 43 bits of
//!   the keyed hash of an IPv6 /64 (with the 17 bits that chose the window, 60 bits tell two
//!   /64s apart; the key is random per process, so no one can aim at a collision). `state` is
//!   the count (at most [`MAX_CONNS`]) or one of three transient marks: `PENDING` (claimed,
//!   not yet known to be the only slot of its address), `LOST` (a claim another claim of the
//!   same address beat; only its claimer frees it) and `MARK` (being removed by the sweep).
//!   Since who and how many are one word, a compare-and-swap that changes the count also
//!   checks whose count it is: no slot can change hands under a reservation.
//! - **The rate word** is a GCRA "theoretical arrival time" in microseconds ([`Gcra`]); only
//!   a thread holding one of the slot's connections (or the sweep, under `MARK`) changes it,
//!   so a slot's rate word always belongs to the address of its id word.
//! - **A new address** claims the first free slot of its window as `PENDING`, then reads the
//!   window again: an established slot of the same address, or a `PENDING` one nearer the
//!   window's start, beats it (it frees its claim and looks again); a `PENDING` one further
//!   on it marks `LOST`. Then it publishes its claim with one connection, which fails if a
//!   rival marked it `LOST`. Two claims are ordered by their compare-and-swaps, and the later
//!   one always sees the earlier one, so an address never has two established slots. An
//!   accept that finds only a `PENDING` slot of its address waits for it to settle.
//! - **Removal.** A slot with no connection whose rate word is full again (its arrival time
//!   past) is freed by the sweep: `MARK`, reset the rate word, free. An accept that finds
//!   its address under `MARK` takes the mark off and goes on (the sweep then finds its slot
//!   changed and leaves it); one sweep at a time, so no two removals of a slot overlap.
//! - **No room** (every slot of the window held by other addresses, or a race lost too many
//!   times in a row) is [`Admit::NoRoom`]: the caller counts the connection on its own worker,
//!   as the limits were counted before this table (split over the workers).
//!
//! What it must not do: know about workers, sockets or the limits of requests.

use std::hash::{BuildHasher, RandomState};
use std::sync::atomic::Ordering::SeqCst;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize};

use super::Kind;
use crate::ip;

/// Slots in the table (a power of two; 16 bytes each, 2 MiB in all). Filled with random
/// addresses, the first to find its window full comes at about 65,000 (half full); at
/// 100,000, 3 in 1,000 do.
pub const SLOTS: usize = 1 << 17;

/// The slots an address may live in, from where its hash points (256 bytes of id words).
pub const WINDOW: usize = 32;

/// Bits of the id word that hold the count or a mark.
const STATE_BITS: u32 = 20;
const STATE_MASK: u64 = (1 << STATE_BITS) - 1;
/// Claimed by a new address, not yet published.
const PENDING: u64 = STATE_MASK;
/// A claim beaten by another claim of the same address (freed by its claimer).
const LOST: u64 = STATE_MASK - 1;
/// Being removed by the sweep.
const MARK: u64 = STATE_MASK - 2;
/// A free slot's id word (no ident is 0).
const FREE: u64 = 0;
/// The most connections one address can have counted (a higher `--max-connections-per-ip`
/// is this).
pub const MAX_CONNS: u32 = (STATE_MASK - 3) as u32;

/// Attempts at an address's slot before giving up ([`Admit::NoRoom`]): each failed one means
/// another thread changed the window meanwhile.
const ATTEMPTS: u32 = 32;

/// Looks at a claim of the same address in progress before giving up ([`Admit::NoRoom`]):
/// a spin each, a `yield` every 16th (its claimer may be off its core).
const MAX_WAITS: u32 = 1 << 20;

/// A rate of new connections as a GCRA: one every `every_us`, `tau_us` ahead at most (a
/// burst of `tau_us / every_us + 1`). Off when `every_us` is 0.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Gcra {
    every_us: u64,
    tau_us: u64,
}

impl Gcra {
    /// Every connection passes.
    pub const OFF: Gcra = Gcra {
        every_us: 0,
        tau_us: 0,
    };

    /// `per_sec` a second with bursts of `burst`; off when either is 0 (or not a number).
    pub fn new(per_sec: f64, burst: u64) -> Gcra {
        if per_sec.is_nan() || per_sec <= 0.0 || burst == 0 {
            return Gcra::OFF;
        }
        // `as` saturates: a rate so low that the interval overflows is one in 584,000 years.
        let every_us = ((1e6 / per_sec).round() as u64).max(1);
        Gcra {
            every_us,
            tau_us: every_us.saturating_mul(burst - 1),
        }
    }

    /// Whether every connection passes.
    pub fn is_off(&self) -> bool {
        self.every_us == 0
    }

    /// The arrival time after one more connection at `now_us`, if it may come now.
    fn next(self, tat: u64, now_us: u64) -> Option<u64> {
        let from = tat.max(now_us);
        (from - now_us <= self.tau_us).then(|| from.saturating_add(self.every_us))
    }
}

/// What [`AddrCounts::admit`] says of a new connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admit {
    /// Counted in this slot: give it back with [`AddrCounts::release`] when it closes.
    In(u32),
    /// Over the cap or the rate: nothing counted.
    Refused(Kind),
    /// No slot for the address: nothing counted, the caller counts it on its own.
    NoRoom,
}

/// The table, shared by every worker through an `Arc`.
pub struct AddrCounts {
    /// `ident << 20 | state` per slot.
    ids: Box<[AtomicU64]>,
    /// The GCRA arrival time (µs) per slot; 0 in a free slot.
    tats: Box<[AtomicU64]>,
    /// Keys the hash (random per process).
    seed: RandomState,
    /// `--max-connections-per-ip` (0: no cap).
    max_conns: u32,
    /// `--accept-rate-per-ip` / `--accept-burst-per-ip`.
    accept: Gcra,
    /// A sweep is running (one at a time).
    sweeping: AtomicBool,
    /// Where the next sweep starts.
    hand: AtomicUsize,
}

impl std::fmt::Debug for AddrCounts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AddrCounts")
            .field("slots", &self.ids.len())
            .field("max_conns", &self.max_conns)
            .field("accept", &self.accept)
            .finish()
    }
}

/// What a compare-and-swap on a known slot found.
enum Reserve {
    /// One more connection counted.
    Done,
    /// Over a limit.
    Refused(Kind),
    /// The slot is no longer the address's: look again.
    Gone,
}

/// What a window holds of an address.
enum Seen {
    /// A slot counting its connections (or being removed).
    Established(usize),
    /// None, but another thread's claim in progress.
    Claimed,
    /// Neither.
    Nothing,
}

/// What a claim of a free slot for a new address came to.
enum Claim {
    /// Published with one connection.
    Won(usize),
    /// Beaten, or the window changed: look again.
    Lost,
    /// No free slot in the window.
    Full,
}

impl AddrCounts {
    /// A table of [`SLOTS`] slots for a cap of `max_conns` (0: none) and an accept rate.
    pub fn new(max_conns: u32, accept: Gcra) -> AddrCounts {
        AddrCounts::with_slots(SLOTS, max_conns, accept)
    }

    /// A table of `slots` slots (rounded up to a power of two, at least a window).
    pub fn with_slots(slots: usize, max_conns: u32, accept: Gcra) -> AddrCounts {
        let n = slots.max(WINDOW).next_power_of_two();
        let zeros = || (0..n).map(|_| AtomicU64::new(0)).collect::<Box<[_]>>();
        AddrCounts {
            ids: zeros(),
            tats: zeros(),
            seed: RandomState::new(),
            max_conns: max_conns.min(MAX_CONNS),
            accept,
            sweeping: AtomicBool::new(false),
            hand: AtomicUsize::new(0),
        }
    }

    /// The first slot of `key`'s window, and its ident (never 0, below 2^44).
    fn place(&self, key: u128) -> (usize, u64) {
        let h = self.seed.hash_one(key);
        let home = h as usize & (self.ids.len() - 1);
        let ident = if ip::key_is_v4(key) {
            1 << 43 | u64::from(key as u32)
        } else {
            // Bits apart from those that chose the window.
            (h >> 21).max(1)
        };
        (home, ident)
    }

    /// The `i`-th slot of the window from `home`.
    fn at(&self, home: usize, i: usize) -> usize {
        (home + i) & (self.ids.len() - 1)
    }

    /// Counts a new connection of `key` at `now` (ms): in its slot, or refused.
    pub fn admit(&self, key: u128, now: u64) -> Admit {
        let (home, ident) = self.place(key);
        let (mut attempts, mut waits) = (0, 0);
        let slot = loop {
            if attempts >= ATTEMPTS || waits >= MAX_WAITS {
                return Admit::NoRoom;
            }
            match self.look(home, ident) {
                Seen::Established(s) => match self.reserve(s, ident) {
                    Reserve::Done => break s,
                    Reserve::Refused(k) => return Admit::Refused(k),
                    Reserve::Gone => attempts += 1,
                },
                Seen::Claimed => {
                    // Another thread is adding the address, a few dozen loads from done.
                    waits += 1;
                    if waits % 16 == 0 {
                        std::thread::yield_now();
                    } else {
                        std::hint::spin_loop();
                    }
                }
                Seen::Nothing => match self.claim(home, ident) {
                    Claim::Won(s) => break s,
                    Claim::Lost => attempts += 1,
                    Claim::Full => return Admit::NoRoom,
                },
            }
        };
        if let Err(kind) = self.take_accept(slot, now) {
            self.release(slot as u32);
            return Admit::Refused(kind);
        }
        Admit::In(slot as u32)
    }

    /// What the window holds of `ident`.
    fn look(&self, home: usize, ident: u64) -> Seen {
        let mut seen = Seen::Nothing;
        for i in 0..WINDOW {
            let s = self.at(home, i);
            let w = self.ids[s].load(SeqCst);
            if w >> STATE_BITS != ident {
                continue;
            }
            match w & STATE_MASK {
                PENDING => seen = Seen::Claimed,
                LOST => {}
                _ => return Seen::Established(s),
            }
        }
        seen
    }

    /// Counts another connection of `key`, which holds one in `slot` already (no lookup).
    pub fn admit_at(&self, slot: u32, key: u128, now: u64) -> Admit {
        let (_, ident) = self.place(key);
        let s = slot as usize;
        if s >= self.ids.len() {
            return self.admit(key, now);
        }
        match self.reserve(s, ident) {
            Reserve::Done => match self.take_accept(s, now) {
                Ok(()) => Admit::In(slot),
                Err(kind) => {
                    self.release(slot);
                    Admit::Refused(kind)
                }
            },
            Reserve::Refused(k) => Admit::Refused(k),
            Reserve::Gone => self.admit(key, now),
        }
    }

    /// One more connection in slot `s` if it is still `ident`'s and under the cap.
    fn reserve(&self, s: usize, ident: u64) -> Reserve {
        loop {
            let w = self.ids[s].load(SeqCst);
            if w >> STATE_BITS != ident {
                return Reserve::Gone;
            }
            let n = match w & STATE_MASK {
                // Being removed: take the mark off (the sweep then leaves the slot alone).
                MARK => {
                    let _ = self.ids[s].compare_exchange(w, ident << STATE_BITS, SeqCst, SeqCst);
                    continue;
                }
                PENDING | LOST => return Reserve::Gone,
                n => n,
            };
            let cap = match self.max_conns {
                0 => MAX_CONNS,
                m => m,
            };
            if n >= u64::from(cap) {
                return Reserve::Refused(Kind::Connections);
            }
            if self.ids[s]
                .compare_exchange(w, w + 1, SeqCst, SeqCst)
                .is_ok()
            {
                return Reserve::Done;
            }
        }
    }

    /// Claims a free slot of the window for `ident` and publishes it with one connection,
    /// unless another slot of the same address beats it.
    fn claim(&self, home: usize, ident: u64) -> Claim {
        let pending = ident << STATE_BITS | PENDING;
        let lost = ident << STATE_BITS | LOST;
        let mut claimed = None;
        for i in 0..WINDOW {
            let s = self.at(home, i);
            if self.ids[s].load(SeqCst) == FREE
                && self.ids[s]
                    .compare_exchange(FREE, pending, SeqCst, SeqCst)
                    .is_ok()
            {
                claimed = Some(i);
                break;
            }
        }
        let Some(mine) = claimed else {
            return Claim::Full;
        };
        let s = self.at(home, mine);
        // Its rate word is 0: the sweep resets it before it frees a slot, and no one else
        // writes a slot without a connection in it.
        for i in (0..WINDOW).filter(|&i| i != mine) {
            let other = self.at(home, i);
            loop {
                let w = self.ids[other].load(SeqCst);
                if w >> STATE_BITS != ident {
                    break;
                }
                match w & STATE_MASK {
                    LOST => break,
                    PENDING if i > mine => {
                        // A claim of the same address further on: it loses to this one.
                        if self.ids[other]
                            .compare_exchange(w, lost, SeqCst, SeqCst)
                            .is_ok()
                        {
                            break;
                        }
                    }
                    // Established, or claimed nearer the window's start: it wins.
                    _ => {
                        self.ids[s].store(FREE, SeqCst);
                        return Claim::Lost;
                    }
                }
            }
        }
        match self.ids[s].compare_exchange(pending, ident << STATE_BITS | 1, SeqCst, SeqCst) {
            Ok(_) => Claim::Won(s),
            Err(_) => {
                // Marked `LOST` by a claim nearer the window's start: only its claimer frees a
                // slot so marked.
                self.ids[s].store(FREE, SeqCst);
                Claim::Lost
            }
        }
    }

    /// Takes one connection's worth from slot `s`'s rate (the caller holds a connection
    /// there, so the word is its address's).
    fn take_accept(&self, s: usize, now: u64) -> Result<(), Kind> {
        if self.accept.is_off() {
            return Ok(());
        }
        let now_us = now.saturating_mul(1000);
        let tat = &self.tats[s];
        let mut cur = tat.load(SeqCst);
        loop {
            let Some(next) = self.accept.next(cur, now_us) else {
                return Err(Kind::AcceptRate);
            };
            match tat.compare_exchange(cur, next, SeqCst, SeqCst) {
                Ok(_) => return Ok(()),
                Err(seen) => cur = seen,
            }
        }
    }

    /// A connection counted in `slot` is gone.
    pub fn release(&self, slot: u32) {
        let Some(id) = self.ids.get(slot as usize) else {
            return;
        };
        let mut w = id.load(SeqCst);
        loop {
            let n = w & STATE_MASK;
            if w == FREE || n == 0 || n > u64::from(MAX_CONNS) {
                // Nothing counted there: never so for a slot a connection holds.
                return;
            }
            match id.compare_exchange(w, w - 1, SeqCst, SeqCst) {
                Ok(_) => return,
                Err(seen) => w = seen,
            }
        }
    }

    /// Frees, of the next `budget` slots, those with no connection whose rate is full again
    /// at `now` (ms); skipped if another sweep is running. Returns how many it freed.
    pub fn sweep(&self, now: u64, budget: usize) -> usize {
        if self
            .sweeping
            .compare_exchange(false, true, SeqCst, SeqCst)
            .is_err()
        {
            return 0;
        }
        let n = self.ids.len();
        let budget = budget.min(n);
        let start = self.hand.fetch_add(budget, SeqCst);
        let now_us = now.saturating_mul(1000);
        let freed = (0..budget)
            .filter(|&i| self.remove_idle(start.wrapping_add(i) & (n - 1), now_us))
            .count();
        self.sweeping.store(false, SeqCst);
        freed
    }

    /// Frees slot `s` if it holds no connection and its rate is full again.
    fn remove_idle(&self, s: usize, now_us: u64) -> bool {
        let w = self.ids[s].load(SeqCst);
        if w == FREE || w & STATE_MASK != 0 {
            return false;
        }
        let marked = w | MARK;
        if self.ids[s]
            .compare_exchange(w, marked, SeqCst, SeqCst)
            .is_err()
        {
            return false;
        }
        // Under the mark no connection can be counted here, so the rate word stays as read
        // unless an accept takes the mark off first (then its change fails the swap below).
        let tat = self.tats[s].load(SeqCst);
        if tat <= now_us
            && self.tats[s]
                .compare_exchange(tat, 0, SeqCst, SeqCst)
                .is_ok()
        {
            // Fails if an accept took the mark off: the slot stays, with a full rate word
            // (0 passes as any arrival time already past).
            return self.ids[s]
                .compare_exchange(marked, FREE, SeqCst, SeqCst)
                .is_ok();
        }
        let _ = self.ids[s].compare_exchange(marked, w, SeqCst, SeqCst);
        false
    }

    /// Connections counted for `key` now (tests, diagnostics).
    pub fn conns(&self, key: u128) -> u32 {
        let (home, ident) = self.place(key);
        (0..WINDOW)
            .map(|i| self.ids[self.at(home, i)].load(SeqCst))
            .filter(|w| w >> STATE_BITS == ident)
            .map(|w| w & STATE_MASK)
            .filter(|&n| n <= u64::from(MAX_CONNS))
            .map(|n| n as u32)
            .sum()
    }

    /// Slots in use (a scan of the whole table: tests, diagnostics).
    pub fn len(&self) -> usize {
        self.ids.iter().filter(|w| w.load(SeqCst) != FREE).count()
    }

    /// Whether no slot is in use.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
#[path = "counts_tests.rs"]
mod tests;
