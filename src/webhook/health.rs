//! Bounded bookkeeping kept by the delivery pool: since when each webhook URL has been
//! failing (to give up on it after the give-up period), and which (topic, url) refusals were
//! already logged. Both are insertion-ordered maps that evict their oldest entry past a cap,
//! so no amount of distinct webhooks grows memory without bound.
//!
//! Pure data structures with the time passed in; the pool holds them behind mutexes.

use std::collections::{HashMap, VecDeque};
use std::hash::Hash;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// URLs whose failures are tracked at once (the default global registration cap).
pub(crate) const MAX_TRACKED_URLS: usize = 100_000;

/// (topic, url) pairs remembered as already logged for an SSRF refusal.
pub(crate) const MAX_LOGGED_REFUSALS: usize = 4096;

/// A map that forgets its oldest entry (by first insertion) when it grows past `cap`.
#[derive(Debug)]
pub(crate) struct BoundedMap<K, V> {
    /// Entries with the sequence number they were inserted under.
    map: HashMap<K, (u64, V)>,
    /// Insertion order; entries whose key was removed (or re-inserted under a newer number)
    /// are skipped when met, and compacted away when they pile up.
    order: VecDeque<(u64, K)>,
    next: u64,
    cap: usize,
}

impl<K: Hash + Eq + Clone, V> BoundedMap<K, V> {
    /// An empty map holding at most `cap` (at least 1) entries.
    pub(crate) fn new(cap: usize) -> Self {
        BoundedMap {
            map: HashMap::new(),
            order: VecDeque::new(),
            next: 0,
            cap: cap.max(1),
        }
    }

    /// The value for `k`, inserting `make()` first if absent (evicting the oldest entry if
    /// that goes past the cap).
    pub(crate) fn get_or_insert_with(&mut self, k: &K, make: impl FnOnce() -> V) -> &mut V {
        let seq = self.next;
        if !self.map.contains_key(k) {
            self.make_room();
            self.next += 1;
            self.order.push_back((seq, k.clone()));
        }
        &mut self.map.entry(k.clone()).or_insert_with(|| (seq, make())).1
    }

    /// Inserts `k` if absent; true if it was absent.
    pub(crate) fn insert_new(&mut self, k: &K, v: V) -> bool {
        let absent = !self.map.contains_key(k);
        if absent {
            self.get_or_insert_with(k, || v);
        }
        absent
    }

    /// Removes `k`.
    pub(crate) fn remove(&mut self, k: &K) {
        self.map.remove(k);
        if self.order.len() > 2 * self.cap + 16 {
            let map = &self.map;
            self.order
                .retain(|(s, k)| map.get(k).is_some_and(|e| e.0 == *s));
        }
    }

    /// Number of entries.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.map.len()
    }

    /// Evicts the oldest entries until there is room for one more.
    fn make_room(&mut self) {
        while self.map.len() >= self.cap {
            let Some((seq, k)) = self.order.pop_front() else {
                break;
            };
            if self.map.get(&k).is_some_and(|e| e.0 == seq) {
                self.map.remove(&k);
            }
        }
    }
}

/// Since when each failing webhook URL has failed every try.
#[derive(Debug)]
pub(crate) struct Health {
    failing_since: BoundedMap<Arc<str>, Instant>,
}

impl Health {
    /// Empty bookkeeping tracking at most `cap` URLs.
    pub(crate) fn new(cap: usize) -> Health {
        Health {
            failing_since: BoundedMap::new(cap),
        }
    }

    /// A call to `url` succeeded: it is healthy again.
    pub(crate) fn success(&mut self, url: &Arc<str>) {
        self.failing_since.remove(url);
    }

    /// A call to `url` failed every try at `now`. Returns true when the URL has been
    /// failing for at least `give_up_after`: the caller gives up the registration. The
    /// entry stays (until a success or eviction), so every other topic registered with the
    /// same dead URL is given up at its next failure too.
    pub(crate) fn failure(
        &mut self,
        url: &Arc<str>,
        now: Instant,
        give_up_after: Duration,
    ) -> bool {
        let since = *self.failing_since.get_or_insert_with(url, || now);
        now.saturating_duration_since(since) >= give_up_after
    }

    /// URLs currently tracked as failing.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.failing_since.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounded_map_evicts_oldest() {
        let mut m = BoundedMap::new(3);
        for k in 0..3 {
            assert!(m.insert_new(&k, ()));
        }
        assert!(!m.insert_new(&1, ()));
        assert!(m.insert_new(&3, ()));
        assert_eq!(m.len(), 3);
        // 0 was the oldest and is gone; 1 is still known.
        assert!(m.insert_new(&0, ()));
        assert!(!m.insert_new(&3, ()));
    }

    #[test]
    fn bounded_map_stays_bounded_under_churn() {
        let mut m = BoundedMap::new(10);
        for k in 0..10_000u32 {
            m.insert_new(&(k % 37), ());
            m.remove(&(k % 5));
            assert!(m.len() <= 10);
            assert!(m.order.len() <= 3 * 10 + 17, "{}", m.order.len());
        }
    }

    #[test]
    fn gives_up_after_the_period_and_success_resets() {
        let day = Duration::from_secs(24 * 3600);
        let url: Arc<str> = "https://example.com/hook".into();
        let t0 = Instant::now();
        let mut h = Health::new(100);
        assert!(!h.failure(&url, t0, day));
        assert!(!h.failure(&url, t0 + Duration::from_secs(3600), day));
        assert!(h.failure(&url, t0 + day, day));
        // Still gone for another topic using the same URL.
        assert!(h.failure(&url, t0 + day + Duration::from_secs(1), day));
        h.success(&url);
        assert_eq!(h.len(), 0);
        assert!(!h.failure(&url, t0 + 2 * day, day));
    }

    #[test]
    fn zero_period_gives_up_at_first_failure() {
        let url: Arc<str> = "http://x/".into();
        assert!(Health::new(1).failure(&url, Instant::now(), Duration::ZERO));
    }

    #[test]
    fn tracking_is_bounded() {
        let mut h = Health::new(50);
        let t0 = Instant::now();
        for i in 0..1000 {
            let url: Arc<str> = format!("http://h{i}/").into();
            h.failure(&url, t0, Duration::from_secs(1));
        }
        assert_eq!(h.len(), 50);
    }
}
