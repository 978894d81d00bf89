//! The two kinds of number every figure of `/metrics` is made of: a [`Cell`] that exactly one
//! thread writes (a relaxed load and store: no locked instruction on the hot path) and a
//! [`Counter`] that any thread may add to (a relaxed atomic add). Both are read from any
//! thread, without a lock.
//!
//! Owns these two types only; what is counted, and its name on `/metrics`, belong to the
//! module that counts it.

use std::sync::atomic::{AtomicU64, Ordering};

/// A counter or gauge written by exactly one thread and read by any.
#[derive(Debug, Default)]
pub struct Cell(AtomicU64);

impl Cell {
    /// Adds `n` (single writer: a plain load and store).
    #[inline]
    pub fn add(&self, n: u64) {
        self.0.store(
            self.0.load(Ordering::Relaxed).wrapping_add(n),
            Ordering::Relaxed,
        );
    }
    /// Adds one.
    #[inline]
    pub fn inc(&self) {
        self.add(1);
    }
    /// Subtracts `n` (gauges).
    #[inline]
    pub fn sub(&self, n: u64) {
        self.0.store(
            self.0.load(Ordering::Relaxed).wrapping_sub(n),
            Ordering::Relaxed,
        );
    }
    /// Sets the value (gauges).
    #[inline]
    pub fn set(&self, v: u64) {
        self.0.store(v, Ordering::Relaxed);
    }
    /// Reads the value.
    #[inline]
    pub fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

/// A counter or gauge that any thread may add to (an atomic add) or set, and any read.
#[derive(Debug, Default)]
pub struct Counter(AtomicU64);

impl Counter {
    /// Adds `n`.
    #[inline]
    pub fn add(&self, n: u64) {
        self.0.fetch_add(n, Ordering::Relaxed);
    }
    /// Adds one.
    #[inline]
    pub fn inc(&self) {
        self.add(1);
    }
    /// Sets the value (gauges).
    #[inline]
    pub fn set(&self, v: u64) {
        self.0.store(v, Ordering::Relaxed);
    }
    /// Reads the value.
    #[inline]
    pub fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}
