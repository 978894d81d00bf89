//! A hashed timing wheel for connection deadlines (slowloris, keep-alive idle, heartbeat,
//! lingering close), one per worker.
//!
//! Each connection has at most one live entry. Entries are never removed: when one fires,
//! the worker checks the connection's own deadline and either acts or re-arms, so pushing a
//! deadline later (every received frame does) costs nothing here. A stale entry (closed
//! connection, re-armed earlier) is recognised by its uid or tick and ignored.

/// Milliseconds per tick.
pub const TICK_MS: u64 = 50;
const SLOTS: usize = 1024;

/// The wheel. Entries are `(connection key, connection uid, tick)`.
#[derive(Debug)]
pub struct Wheel {
    slots: Vec<Vec<(usize, u64, u64)>>,
    /// The next tick to process.
    next_tick: u64,
}

impl Wheel {
    /// An empty wheel starting at `now_ms`.
    pub fn new(now_ms: u64) -> Wheel {
        Wheel {
            slots: (0..SLOTS).map(|_| Vec::new()).collect(),
            next_tick: now_ms / TICK_MS,
        }
    }

    /// The tick a deadline falls in (rounded up, never before the next tick to process).
    pub fn tick_of(&self, at_ms: u64) -> u64 {
        at_ms.div_ceil(TICK_MS).max(self.next_tick)
    }

    /// Arms an entry for `at_ms`; returns its tick (store it to recognise the live entry).
    pub fn schedule(&mut self, key: usize, uid: u64, at_ms: u64) -> u64 {
        let tick = self.tick_of(at_ms);
        self.slots[(tick % SLOTS as u64) as usize].push((key, uid, tick));
        tick
    }

    /// Moves the wheel to `now_ms`, appending due entries to `due` as `(key, uid, tick)`.
    /// Entries armed for a later lap stay where they are.
    pub fn advance(&mut self, now_ms: u64, due: &mut Vec<(usize, u64, u64)>) {
        let now_tick = now_ms / TICK_MS;
        let mut processed = 0;
        while self.next_tick <= now_tick && processed < SLOTS {
            let slot = &mut self.slots[(self.next_tick % SLOTS as u64) as usize];
            let limit = now_tick;
            let mut i = 0;
            while i < slot.len() {
                if slot[i].2 <= limit {
                    due.push(slot.swap_remove(i));
                } else {
                    i += 1;
                }
            }
            self.next_tick += 1;
            processed += 1;
        }
        // After a stall longer than a lap every slot was visited once; skip ahead.
        if self.next_tick <= now_tick {
            self.next_tick = now_tick + 1;
        }
    }

    /// Milliseconds from `now_ms` to the next tick boundary (the poll timeout).
    pub fn until_next_tick(&self, now_ms: u64) -> u64 {
        (self.next_tick * TICK_MS).saturating_sub(now_ms).max(1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fires_at_or_after_the_deadline_never_before() {
        let mut w = Wheel::new(1000);
        w.schedule(1, 11, 1120);
        w.schedule(2, 22, 1000 + TICK_MS * SLOTS as u64 * 2 + 7);
        let mut due = Vec::new();
        w.advance(1100, &mut due);
        assert!(due.is_empty());
        w.advance(1150, &mut due);
        assert_eq!(due.iter().map(|d| d.0).collect::<Vec<_>>(), vec![1]);
        due.clear();
        // A lap later the far entry is still not due.
        w.advance(1000 + TICK_MS * SLOTS as u64 + 500, &mut due);
        assert!(due.is_empty());
        w.advance(1000 + TICK_MS * SLOTS as u64 * 2 + 60, &mut due);
        assert_eq!(due.iter().map(|d| d.0).collect::<Vec<_>>(), vec![2]);
    }
}
