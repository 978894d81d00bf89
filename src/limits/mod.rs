//! Limits per client (DECISIONS §11): open connections and new connections a second per IP
//! address, and token buckets for publishes, published bytes and subscriptions per
//! connection, per authenticated client id and per IP address.
//!
//! The open connections and the accept rate of an address are counted exactly across the
//! workers, in one table of atomic counters they all share ([`counts`]; touched at accept
//! and close only, never locked). Everything else belongs to one worker ([`Limiter`]) and is
//! touched only from its loop: no lock, nothing shared. A request bucket shared by
//! connections on several workers (per IP, per client) is split evenly over the workers
//! instead (rate and burst divided by the worker count, at least 1), as §11 allows; so are
//! the cap and the accept rate of an address the shared table has no room for. A
//! connection's own buckets live in its WebSocket state ([`ConnBuckets`]); its IP's and
//! client's entries are reached through the [`Handle`]s it keeps in [`ConnLimit`], checked by
//! generation, never by hashing a key per message; the worker's entry of an address keeps
//! its slot in the shared table. Nothing here allocates per message.
//!
//! An address refused at accept too often within a second is blocked at the listener for a
//! while ([`block`]): the limiter keeps the list and makes the filter, the worker attaches it.
//!
//! What it must not do: touch sockets or the wire. Refusals are typed ([`Kind`],
//! [`Limited`]) and mapped to close-at-accept, HTTP 429 or JSON-RPC -32000 by `worker` and
//! `conn`.

pub mod block;
pub mod bucket;
pub mod counts;
pub mod table;

use crate::auth::ClientKey;
use crate::ip::{self, Cidr};
use std::net::IpAddr;
use std::sync::Arc;

pub use block::Blocks;
pub use bucket::{Bucket, ConnBuckets, Rate};
pub use counts::{AddrCounts, Admit, Gcra};
pub use table::Handle;
use table::{Entry, Table, BUCKETS};

/// What a refusal was for (also the `kind` label of `walletrelay_limited_total`, whose
/// vocabulary is `metrics`').
pub use crate::metrics::LimitKind as Kind;

/// A request refused by a token bucket.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("rate limited")]
pub struct Limited {
    /// Which bucket.
    pub kind: Kind,
    /// When it will let the request through, at the earliest (ms).
    pub retry_after_ms: u64,
}

/// Refusals in a row after which a WebSocket is closed with 1013.
pub const CLOSE_AFTER_REFUSALS: u8 = 100;

/// Doublings of a block at the listener for a storm that goes on (64 times
/// `--accept-block-ms` at most).
pub const MAX_DOUBLINGS: u8 = 6;

/// The WebSocket close code for a connection that keeps going after its refusals
/// ("try again later").
pub const CLOSE_TRY_AGAIN_LATER: u16 = 1013;

/// What one request asks of the buckets.
#[derive(Debug, Clone, Copy, Default)]
pub struct Cost {
    /// Publishes.
    pub publishes: u32,
    /// Published message bytes.
    pub bytes: usize,
    /// New subscriptions (a batch counts each topic).
    pub subscribes: u32,
}

/// The limits of the flags, as one worker applies them. Made once for the process: its
/// clones share the table of per-address counts.
#[derive(Debug, Clone)]
pub struct Policy {
    /// Per connection: publishes, bytes, subscriptions.
    conn: [Rate; 3],
    /// Per IP address and per client (split over the workers): publishes, bytes,
    /// subscriptions, accepts (the last only for addresses the shared table has no room
    /// for).
    shared: [Rate; BUCKETS],
    /// Open connections and accept rate per address, across the workers (`None`: both off).
    counts: Option<Arc<AddrCounts>>,
    /// Open connections per address on this worker, for an address the shared table has no
    /// room for (split; 0 = off).
    max_conns: u32,
    /// `--limit-exempt`.
    exempt: Vec<Cidr>,
    /// `--trusted-proxies`.
    trusted: Vec<Cidr>,
    /// Any request bucket is on.
    requests_on: bool,
    /// Any per-address limit is on.
    ip_on: bool,
    /// Refusals at accept in one second after which an address is blocked at the
    /// listener (split; 0 = never).
    block_after: u32,
    /// How long such a block lasts (ms).
    block_ms: u64,
}

impl Policy {
    /// The policy of `l` for the `workers` workers of a process (with a new table of
    /// per-address counts, which its clones share).
    pub fn new(l: &crate::config::Limits, workers: usize) -> Policy {
        let w = workers.max(1);
        let conn = [
            Rate::new(l.publish_rate, l.publish_burst as f64),
            Rate::new(l.publish_bytes_rate, l.publish_bytes_burst as f64),
            Rate::new(l.subscribe_rate, l.subscribe_burst as f64),
        ];
        let accept = Rate::new(l.accept_rate_per_ip, l.accept_burst_per_ip as f64);
        let shared = [
            conn[0].split(w),
            conn[1].split(w),
            conn[2].split(w),
            accept.split(w),
        ];
        let max_conns = match l.max_connections_per_ip {
            0 => 0,
            n => (n / w as u32).max(1),
        };
        let requests_on = conn.iter().any(|r| !r.is_off());
        let gcra = Gcra::new(l.accept_rate_per_ip, l.accept_burst_per_ip);
        let counts = (l.max_connections_per_ip > 0 || !gcra.is_off())
            .then(|| Arc::new(AddrCounts::new(l.max_connections_per_ip, gcra)));
        Policy {
            conn,
            shared,
            counts,
            max_conns,
            exempt: l.limit_exempt.clone(),
            trusted: l.trusted_proxies.clone(),
            requests_on,
            ip_on: requests_on || max_conns > 0 || !accept.is_off(),
            block_after: match (l.accept_block_after, l.accept_block_ms) {
                (0, _) | (_, 0) => 0,
                (n, _) => (n / w as u32).max(1),
            },
            block_ms: l.accept_block_ms,
        }
    }
}

/// A connection's place in the limits, kept in its slab entry from accept to removal
/// (10 bytes: two 4-byte [`Handle`]s and two flags).
#[derive(Debug, Clone, Copy, Default)]
pub struct ConnLimit {
    /// Its address's entry.
    ip: Handle,
    /// Its client id's entry (after a relay-auth upgrade).
    client: Handle,
    /// `--limit-exempt`: no limit applies.
    exempt: bool,
    /// Its peer is a trusted proxy: the address comes from `X-Forwarded-For`.
    proxied: bool,
}

impl ConnLimit {
    /// Whether its address comes from `X-Forwarded-For`.
    pub fn proxied(&self) -> bool {
        self.proxied
    }
}

/// One worker's limits: the policy and the per-address and per-client tables.
#[derive(Debug)]
pub struct Limiter {
    policy: Policy,
    ips: Table<u128>,
    clients: Table<[u8; 32]>,
    /// Addresses blocked at the listener.
    blocks: Blocks,
    /// Blocks begun since the start.
    blocked: u64,
    /// Connections counted on this worker alone (the shared table had no room).
    split_accepts: u64,
    /// The next time idle entries are looked for (ms).
    next_sweep: u64,
}

/// Entries per table per worker: about 100 bytes each, allocated as addresses come (the
/// most a [`Handle`] can name).
const TABLE_CAP: usize = u16::MAX as usize;
/// Entries a sweep looks at (one sweep a second).
const SWEEP_BUDGET: usize = 1024;
/// Slots of the shared table a worker's sweep looks at (one a second per worker, one at a
/// time: the whole table in 16 s with one worker; a few microseconds each).
const COUNTS_SWEEP_BUDGET: usize = 8192;

impl Limiter {
    /// A worker's limiter.
    pub fn new(policy: Policy) -> Limiter {
        Limiter {
            policy,
            ips: Table::new(TABLE_CAP),
            clients: Table::new(TABLE_CAP),
            blocks: Blocks::default(),
            blocked: 0,
            split_accepts: 0,
            next_sweep: 0,
        }
    }

    /// Fresh buckets for a connection that upgrades at `now`.
    pub fn conn_buckets(&self, now: u64) -> ConnBuckets {
        ConnBuckets::full(&self.policy.conn, now)
    }

    /// A connection accepted from `peer`: counted under its address, or refused.
    pub fn on_accept(&mut self, peer: IpAddr, now: u64) -> Result<ConnLimit, Kind> {
        let mut lim = ConnLimit::default();
        if ip::any_contains(&self.policy.trusted, peer) {
            // Its clients are counted when their requests say who they are.
            lim.proxied = true;
            return Ok(lim);
        }
        self.count_under(&mut lim, peer, now)?;
        Ok(lim)
    }

    /// Counts `lim` as a connection of `addr` (exempt, untracked when the table is full).
    fn count_under(&mut self, lim: &mut ConnLimit, addr: IpAddr, now: u64) -> Result<(), Kind> {
        if ip::any_contains(&self.policy.exempt, addr) {
            lim.exempt = true;
            return Ok(());
        }
        lim.exempt = false;
        if !self.policy.ip_on {
            return Ok(());
        }
        let key = ip::ip_key(addr);
        let Some(h) = self.ips.find_or_add(&key, &self.policy.shared, now) else {
            return Ok(());
        };
        let Some(e) = self.ips.get(h) else {
            return Ok(());
        };
        // Exact across the workers in the shared table; this worker's share where it has no
        // room for the address.
        let counted = match self.policy.counts.as_deref() {
            Some(c) => {
                let got = match e.held {
                    0 => c.admit(key, now),
                    _ => c.admit_at(e.slot, key, now),
                };
                match got {
                    Admit::In(slot) => {
                        e.slot = slot;
                        e.held += 1;
                        Ok(())
                    }
                    Admit::Refused(kind) => Err(kind),
                    Admit::NoRoom => {
                        let share = split_share(&self.policy, e, now);
                        self.split_accepts += u64::from(share.is_ok());
                        share
                    }
                }
            }
            None => split_share(&self.policy, e, now),
        };
        if let Err(kind) = counted {
            // A storm: `block_after` refusals within one second block the address at the
            // listener (`block`).
            if e.refused == 0 || now.saturating_sub(e.refused_since) >= 1000 {
                e.refused = 0;
                e.refused_since = now;
            }
            e.refused += 1;
            if self.policy.block_after > 0 && e.refused >= self.policy.block_after {
                e.refused = 0;
                // A storm that goes on: a block that begins within the last one's length
                // after it ended is twice as long, up to 2^MAX_DOUBLINGS times the first.
                if now >= e.strike_until {
                    e.strikes = 0;
                }
                let ms = self.policy.block_ms << e.strikes.min(MAX_DOUBLINGS);
                if self.blocks.add(key, now + ms) {
                    self.blocked += 1;
                    e.strikes = e.strikes.saturating_add(1);
                    e.strike_until = now + 2 * ms;
                }
            }
            return Err(kind);
        }
        e.conns += 1;
        lim.ip = h;
        Ok(())
    }

    /// A request on a connection from a trusted proxy, with its `X-Forwarded-For`: the
    /// connection is counted under the forwarded client address from now on (a request
    /// without one leaves it where it is).
    pub fn forwarded(
        &mut self,
        lim: &mut ConnLimit,
        header: Option<&[u8]>,
        now: u64,
    ) -> Result<(), Kind> {
        if !lim.proxied {
            return Ok(());
        }
        let Some(addr) = header.and_then(|h| ip::forwarded_client(h, &self.policy.trusted)) else {
            return Ok(());
        };
        if lim.ip.is_some() && self.ips.handle_of(&ip::ip_key(addr)) == Some(lim.ip) {
            return Ok(());
        }
        self.release_ip(lim);
        self.count_under(lim, addr, now)
    }

    /// A WebSocket upgraded with relay auth: its requests count against `client` too.
    pub fn bind_client(&mut self, lim: &mut ConnLimit, client: &ClientKey, now: u64) {
        if lim.exempt || !self.policy.requests_on || lim.client.is_some() {
            return;
        }
        if let Some(h) = self
            .clients
            .find_or_add(&client.0, &self.policy.shared, now)
        {
            if let Some(e) = self.clients.get(h) {
                e.conns += 1;
                lim.client = h;
            }
        }
    }

    fn release_ip(&mut self, lim: &mut ConnLimit) {
        if let Some(e) = self.ips.get(lim.ip) {
            // Which of the address's connections here closed does not matter, only how
            // many are counted where: those counted on this worker alone go first, so that
            // the shared count comes back to the truth as soon as it can.
            if e.held > 0 && e.conns <= e.held {
                if let Some(c) = self.policy.counts.as_deref() {
                    c.release(e.slot);
                }
                e.held -= 1;
            }
            e.conns = e.conns.saturating_sub(1);
        }
        lim.ip = Handle::NONE;
    }

    /// The connection is gone.
    pub fn release(&mut self, lim: &mut ConnLimit) {
        self.release_ip(lim);
        if let Some(e) = self.clients.get(lim.client) {
            e.conns = e.conns.saturating_sub(1);
        }
        lim.client = Handle::NONE;
    }

    /// Lets a request through (taking its tokens from every bucket it counts against) or
    /// refuses it whole (taking nothing), counting refusals in a row in `own`.
    #[inline]
    pub fn admit(
        &mut self,
        lim: &ConnLimit,
        own: &mut ConnBuckets,
        cost: Cost,
        now: u64,
    ) -> Result<(), Limited> {
        if !self.policy.requests_on || lim.exempt {
            return Ok(());
        }
        let asks = [
            cost.publishes as f64,
            cost.bytes as f64,
            cost.subscribes as f64,
        ];
        let mut refused: Option<Limited> = None;
        own.refill(&self.policy.conn, now);
        for (i, &n) in asks.iter().enumerate() {
            if n == 0.0 {
                continue;
            }
            let mut wait = own.wait(&self.policy.conn, i, n);
            let r = self.policy.shared[i];
            if let Some(e) = self.ips.get(lim.ip) {
                wait = wait.max(e.buckets[i].wait(r, now, n));
            }
            if let Some(e) = self.clients.get(lim.client) {
                wait = wait.max(e.buckets[i].wait(r, now, n));
            }
            if wait > 0 && refused.is_none_or(|l| l.retry_after_ms < wait) {
                refused = Some(Limited {
                    kind: Kind::ALL[i],
                    retry_after_ms: wait,
                });
            }
        }
        if let Some(l) = refused {
            own.refusals = own.refusals.saturating_add(1);
            return Err(l);
        }
        own.refusals = 0;
        for (i, &n) in asks.iter().enumerate() {
            if n == 0.0 {
                continue;
            }
            own.take(&self.policy.conn, i, n);
            let r = self.policy.shared[i];
            if let Some(e) = self.ips.get(lim.ip) {
                e.buckets[i].take(r, n);
                e.last = now;
            }
            if let Some(e) = self.clients.get(lim.client) {
                e.buckets[i].take(r, n);
                e.last = now;
            }
        }
        Ok(())
    }

    /// Periodic upkeep (called every loop iteration): ends the blocks due, and once a
    /// second drops idle entries, a bounded number at a time (the shared table's too).
    pub fn tick(&mut self, now: u64) {
        if !self.blocks.is_empty() {
            self.blocks.expire(now);
        }
        if now < self.next_sweep {
            return;
        }
        self.next_sweep = now + 1000;
        self.ips.sweep(&self.policy.shared, now, SWEEP_BUDGET);
        self.clients.sweep(&self.policy.shared, now, SWEEP_BUDGET);
        if let Some(c) = self.policy.counts.as_deref() {
            c.sweep(now, COUNTS_SWEEP_BUDGET);
        }
    }

    /// The listeners' filter if the blocked addresses changed since the last call
    /// (`Some(empty)`: no filter), for the worker to attach.
    pub fn take_block_change(&mut self) -> Option<Vec<block::Insn>> {
        self.blocks.take_change()
    }

    /// Blocks begun since the start, and addresses blocked now (metrics).
    pub fn blocks(&self) -> (u64, usize) {
        (self.blocked, self.blocks.len())
    }

    /// Addresses and clients currently tracked (tests, metrics).
    pub fn tracked(&self) -> (usize, usize) {
        (self.ips.len(), self.clients.len())
    }

    /// Connections counted on this worker alone since the start, because the shared table
    /// had no room for their address (metrics).
    pub fn split_accepts(&self) -> u64 {
        self.split_accepts
    }
}

/// The worker's own share of the cap and the accept rate (split over the workers), for an
/// address the shared table has no room for: taken, or why not.
fn split_share(p: &Policy, e: &mut Entry<u128>, now: u64) -> Result<(), Kind> {
    let accept = p.shared[Kind::AcceptRate as usize];
    if p.max_conns > 0 && e.conns >= p.max_conns {
        return Err(Kind::Connections);
    }
    if e.buckets[Kind::AcceptRate as usize].wait(accept, now, 1.0) > 0 {
        return Err(Kind::AcceptRate);
    }
    e.buckets[Kind::AcceptRate as usize].take(accept, 1.0);
    Ok(())
}

impl Drop for Limiter {
    /// Gives back what this worker holds in the shared table (a worker that stops before
    /// the others must not leave its connections counted).
    fn drop(&mut self) {
        if let Some(c) = self.policy.counts.as_deref() {
            self.ips.for_each(|e| {
                for _ in 0..e.held {
                    c.release(e.slot);
                }
                e.held = 0;
            });
        }
    }
}

#[cfg(test)]
mod tests;
