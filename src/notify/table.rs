//! The watch table (DECISIONS 13): every registration, identified by (watched client, `sub`,
//! `whu`, `typ`); the same again renews it; at most [`MAX_PER_CLIENT`] per watched client
//! and `--max-watches` in all; expired ones dropped.
//!
//! [`WatchHub`] owns the master table behind a mutex taken only by registrations (rare) and
//! publishes an immutable [`Snapshot`] through `arc-swap`, which the workers read on the
//! hot path (`Notify::watched`, `Notify::event`) without a lock. A change rings the
//! `changed` hook (the persister thread, `store.rs`).

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use arc_swap::ArcSwap;

use super::claims::{WatchClaims, WatchError};
use crate::notice::{Notice, Typ};

/// Most registrations of one watched client.
pub const MAX_PER_CLIENT: usize = 64;

/// One registration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Registration {
    /// The service URL (`sub`): the event JWT's `aud`.
    pub sub: Arc<str>,
    /// The webhook URL (`whu`).
    pub whu: Arc<str>,
    /// Which side of the client's messages.
    pub typ: Typ,
    /// The statuses reported (`Status::bit`s).
    pub sts: u8,
    /// The tags reported, sorted; empty: every tag.
    pub tag: Arc<[u32]>,
    /// When it ends, Unix seconds.
    pub exp: u64,
}

impl Registration {
    /// From checked claims (a registration's always carry `exp`).
    pub fn of(c: &WatchClaims) -> Registration {
        Registration {
            sub: c.sub.as_str().into(),
            whu: c.whu.as_str().into(),
            typ: c.typ,
            sts: c.sts,
            tag: c.tag.as_slice().into(),
            exp: c.exp.unwrap_or(0),
        }
    }

    fn same(&self, sub: &str, whu: &str, typ: Typ) -> bool {
        &*self.sub == sub && &*self.whu == whu && self.typ == typ
    }

    /// Whether a notice is one this registration reports at `now` (Unix seconds).
    pub fn wants(&self, n: &Notice<'_>, now: u64) -> bool {
        self.exp >= now
            && self.typ == n.typ
            && self.sts & n.status.bit() != 0
            && (self.tag.is_empty() || self.tag.binary_search(&n.tag).is_ok())
    }
}

/// What changed in the table (told to the `changed` hook).
#[derive(Debug, Clone, Copy)]
pub enum Change<'a> {
    /// A registration of `client` was added or renewed.
    Set {
        /// The watched client.
        client: &'a str,
        /// The registration as it is now.
        reg: &'a Registration,
    },
    /// A registration of `client` was removed.
    Del {
        /// The watched client.
        client: &'a str,
        /// Its service URL.
        sub: &'a str,
        /// Its webhook URL.
        whu: &'a str,
        /// Its side.
        typ: Typ,
    },
    /// Expired registrations were dropped.
    Swept,
}

/// The hook told of every change made here (not of what another node's table sent, see
/// [`WatchHub::set_client`]); it must not block.
pub type Changed = Box<dyn Fn(&Change<'_>) + Send + Sync>;

/// Every registration, by watched client, as the workers read it.
#[derive(Debug, Default)]
pub struct Snapshot {
    /// Registrations of each watched client.
    pub by_client: HashMap<Arc<str>, Arc<[Registration]>>,
}

impl Snapshot {
    /// Registrations in all.
    pub fn len(&self) -> usize {
        self.by_client.values().map(|r| r.len()).sum()
    }

    /// No registration at all.
    pub fn is_empty(&self) -> bool {
        self.by_client.is_empty()
    }
}

/// The master table and its published snapshot.
pub struct WatchHub {
    snap: ArcSwap<Snapshot>,
    /// How many clients the published snapshot watches: a relay with none (most publishes
    /// anywhere) answers [`WatchHub::watched`] with one relaxed load, not a snapshot's.
    clients: AtomicUsize,
    master: Mutex<Master>,
    max_total: usize,
    changed: Changed,
}

#[derive(Default)]
struct Master {
    by_client: HashMap<Arc<str>, Arc<[Registration]>>,
    total: usize,
}

impl std::fmt::Debug for WatchHub {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WatchHub")
            .field("total", &lock(&self.master).total)
            .field("max_total", &self.max_total)
            .finish_non_exhaustive()
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl WatchHub {
    /// An empty table of at most `max_total` registrations; `changed` is rung after every
    /// change (it must not block).
    pub fn new(max_total: usize, changed: Changed) -> WatchHub {
        WatchHub {
            snap: ArcSwap::from_pointee(Snapshot::default()),
            clients: AtomicUsize::new(0),
            master: Mutex::new(Master::default()),
            max_total,
            changed,
        }
    }

    /// The current snapshot (lock-free).
    pub fn snapshot(&self) -> Arc<Snapshot> {
        self.snap.load_full()
    }

    /// Whether any client has a registration (one relaxed load).
    pub fn watching(&self) -> bool {
        self.clients.load(Ordering::Relaxed) > 0
    }

    /// Whether `client` has any registration (lock-free; the hot path's question).
    pub fn watched(&self, client: &str) -> bool {
        if !self.watching() {
            return false;
        }
        self.snap.load().by_client.contains_key(client)
    }

    /// The registrations of `client`, if any (lock-free).
    pub fn of(&self, client: &str) -> Option<Arc<[Registration]>> {
        self.snap.load().by_client.get(client).cloned()
    }

    /// Adds or renews a registration of `client` at `now` (Unix seconds).
    pub fn register(&self, client: &str, r: Registration, now: u64) -> Result<(), WatchError> {
        let mut m = lock(&self.master);
        let old = m
            .by_client
            .get(client)
            .cloned()
            .unwrap_or_else(|| Arc::from([]));
        let mut list: Vec<Registration> = old.iter().filter(|x| x.exp >= now).cloned().collect();
        let expired = old.len() - list.len();
        match list.iter_mut().find(|x| x.same(&r.sub, &r.whu, r.typ)) {
            Some(x) => *x = r.clone(),
            None => {
                if list.len() >= MAX_PER_CLIENT || m.total - expired >= self.max_total {
                    return Err(WatchError::WatchLimitExceeded);
                }
                list.push(r.clone());
            }
        }
        m.total = m.total - old.len() + list.len();
        m.by_client.insert(Arc::from(client), list.into());
        self.publish(&m);
        (self.changed)(&Change::Set { client, reg: &r });
        Ok(())
    }

    /// Removes a registration; true if there was one.
    pub fn unregister(&self, client: &str, sub: &str, whu: &str, typ: Typ) -> bool {
        let mut m = lock(&self.master);
        let Some(old) = m.by_client.get(client).cloned() else {
            return false;
        };
        let list: Vec<Registration> = old
            .iter()
            .filter(|x| !x.same(sub, whu, typ))
            .cloned()
            .collect();
        if list.len() == old.len() {
            return false;
        }
        m.total -= old.len() - list.len();
        if list.is_empty() {
            m.by_client.remove(client);
        } else {
            m.by_client.insert(Arc::from(client), list.into());
        }
        self.publish(&m);
        (self.changed)(&Change::Del {
            client,
            sub,
            whu,
            typ,
        });
        true
    }

    /// Drops every registration expired at `now`; returns how many.
    pub fn sweep(&self, now: u64) -> usize {
        let mut m = lock(&self.master);
        let before = m.total;
        let mut total = 0;
        m.by_client.retain(|_, regs| {
            if regs.iter().any(|r| r.exp < now) {
                let kept: Vec<Registration> =
                    regs.iter().filter(|r| r.exp >= now).cloned().collect();
                *regs = kept.into();
            }
            total += regs.len();
            !regs.is_empty()
        });
        m.total = total;
        let dropped = before - total;
        if dropped > 0 {
            self.publish(&m);
            (self.changed)(&Change::Swept);
        }
        dropped
    }

    /// Replaces the registrations of `client` with what the cluster holds (another node's
    /// change, `redis_sync`); the `changed` hook is not told. Expired ones are left out.
    pub fn set_client(&self, client: &str, regs: Vec<Registration>, now: u64) {
        let mut m = lock(&self.master);
        let regs: Vec<Registration> = regs.into_iter().filter(|r| r.exp >= now).collect();
        let old = m.by_client.get(client).map_or(0, |r| r.len());
        m.total = m.total - old + regs.len();
        if regs.is_empty() {
            m.by_client.remove(client);
        } else {
            m.by_client.insert(Arc::from(client), regs.into());
        }
        self.publish(&m);
    }

    fn publish(&self, m: &Master) {
        self.snap.store(Arc::new(Snapshot {
            by_client: m.by_client.clone(),
        }));
        self.clients.store(m.by_client.len(), Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::notice::Status;

    fn reg(i: usize, typ: Typ, exp: u64) -> Registration {
        Registration {
            sub: "https://s.example/".into(),
            whu: format!("https://s.example/hook/{i}").into(),
            typ,
            sts: Status::Accepted.bit() | Status::Queued.bit(),
            tag: Arc::from([1100u32, 1108]),
            exp,
        }
    }

    #[test]
    fn renews_caps_unregisters_and_expires() {
        let hub = WatchHub::new(70, Box::new(|_| {}));
        for i in 0..MAX_PER_CLIENT {
            hub.register("a", reg(i, Typ::Subscriber, 100), 10).unwrap();
        }
        // The same again renews; a 65th is refused; the other typ is another registration.
        hub.register("a", reg(3, Typ::Subscriber, 200), 10).unwrap();
        assert_eq!(
            hub.register("a", reg(99, Typ::Subscriber, 100), 10),
            Err(WatchError::WatchLimitExceeded)
        );
        assert_eq!(hub.of("a").unwrap().len(), MAX_PER_CLIENT);
        assert_eq!(hub.of("a").unwrap()[3].exp, 200);
        // The total cap.
        for i in 0..6 {
            hub.register("b", reg(i, Typ::Publisher, 100), 10).unwrap();
        }
        assert_eq!(
            hub.register("c", reg(0, Typ::Publisher, 100), 10),
            Err(WatchError::WatchLimitExceeded)
        );
        assert!(hub.unregister(
            "b",
            "https://s.example/",
            "https://s.example/hook/0",
            Typ::Publisher
        ));
        assert!(!hub.unregister(
            "b",
            "https://s.example/",
            "https://s.example/hook/0",
            Typ::Publisher
        ));
        hub.register("c", reg(0, Typ::Publisher, 100), 10).unwrap();
        assert!(hub.watched("c"));
        // Expiry: all but the renewed one of "a" end at 100.
        assert_eq!(hub.sweep(150), MAX_PER_CLIENT - 1 + 5 + 1);
        assert!(!hub.watched("b") && !hub.watched("c"));
        assert_eq!(hub.snapshot().len(), 1);
    }

    #[test]
    fn filters_by_typ_status_tag_and_time() {
        let r = reg(0, Typ::Subscriber, 100);
        let mut n = Notice {
            client: "a",
            typ: Typ::Subscriber,
            status: Status::Queued,
            message_id: 1,
            topic: "t",
            message: "m",
            attestation: None,
            published_at: 0,
            tag: 1108,
            ttl: 300,
        };
        assert!(r.wants(&n, 50));
        assert!(!r.wants(&n, 101));
        n.tag = 1;
        assert!(!r.wants(&n, 50));
        let any_tag = Registration {
            tag: Arc::from([]),
            ..r.clone()
        };
        assert!(any_tag.wants(&n, 50));
        n.status = Status::Delivered;
        assert!(!any_tag.wants(&n, 50));
        n.status = Status::Accepted;
        n.typ = Typ::Publisher;
        assert!(!any_tag.wants(&n, 50));
    }
}
