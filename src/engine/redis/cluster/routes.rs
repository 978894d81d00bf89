//! Who watches each channel, as the subscriber's reader thread forwards by it: the reader's
//! own table ([`Routes`]), kept up to date by whoever changes the watchers (the writer
//! thread, under the subscriber's state lock, so the changes arrive in order) through a
//! bounded queue ([`RouteSender`]). Forwarding a message takes no lock: the reader looks
//! in its own table after taking the changes sent since.
//!
//! Every change carries the channel's whole watcher list, so applying the changes in order
//! ends in the latest state. When the queue is full a change is not lost silently: the
//! table is marked stale, and the reader then rebuilds it whole from the shared state (one
//! lock, once).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use crossbeam_channel::{Receiver, Sender};

/// Changes waiting for the reader at most.
const QUEUE: usize = 65_536;

/// A channel's topic and the workers watching it.
#[derive(Debug, Clone)]
pub(crate) struct Route {
    /// Namespace of the topic.
    pub ns: u8,
    /// The topic.
    pub topic: Arc<str>,
    /// Workers watching it (none: the channel is forgotten).
    pub watchers: Vec<usize>,
}

type Change = (Box<[u8]>, Route);

/// The sending side, kept with the shared state.
pub(crate) struct RouteSender {
    tx: Sender<Change>,
    stale: Arc<AtomicBool>,
}

/// The reader thread's table.
pub(crate) struct Routes {
    rx: Receiver<Change>,
    stale: Arc<AtomicBool>,
    table: HashMap<Box<[u8]>, Route>,
}

/// A table and the sender that keeps it up to date.
pub(crate) fn routes() -> (RouteSender, Routes) {
    let (tx, rx) = crossbeam_channel::bounded(QUEUE);
    let stale = Arc::new(AtomicBool::new(false));
    (
        RouteSender {
            tx,
            stale: stale.clone(),
        },
        Routes {
            rx,
            stale,
            table: HashMap::new(),
        },
    )
}

impl RouteSender {
    /// Channel `chan` is now watched as `route` says.
    pub(crate) fn send(&self, chan: &[u8], route: Route) {
        if self.tx.try_send((chan.into(), route)).is_err() {
            self.stale.store(true, Ordering::Release);
        }
    }
}

impl Routes {
    /// Takes the changes sent since the last call; when some could not be sent, rebuilds
    /// the table from `whole` (every channel's route, read under the shared state's lock).
    pub(crate) fn refresh(&mut self, whole: impl FnOnce() -> Vec<Change>) {
        if self.stale.load(Ordering::Acquire) && self.stale.swap(false, Ordering::AcqRel) {
            while self.rx.try_recv().is_ok() {}
            self.table = whole()
                .into_iter()
                .filter(|(_, r)| !r.watchers.is_empty())
                .collect();
        }
        for (chan, route) in self.rx.try_iter() {
            if route.watchers.is_empty() {
                self.table.remove(&chan);
            } else {
                self.table.insert(chan, route);
            }
        }
    }

    /// The route of `chan`, if some worker watches it.
    pub(crate) fn get(&self, chan: &[u8]) -> Option<&Route> {
        self.table.get(chan)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn route(watchers: Vec<usize>) -> Route {
        Route {
            ns: 0,
            topic: Arc::from("t"),
            watchers,
        }
    }

    #[test]
    fn changes_apply_in_order_and_a_lost_one_rebuilds_the_table() {
        let (tx, mut rx) = routes();
        tx.send(b"a", route(vec![1]));
        tx.send(b"a", route(vec![1, 2]));
        tx.send(b"b", route(vec![0]));
        tx.send(b"b", route(vec![]));
        rx.refresh(Vec::new); // nothing was lost: not called
        assert_eq!(rx.get(b"a").map(|r| r.watchers.clone()), Some(vec![1, 2]));
        assert!(rx.get(b"b").is_none());
        for i in 0..QUEUE + 1 {
            tx.send(b"c", route(vec![i]));
        }
        rx.refresh(|| vec![(b"d"[..].into(), route(vec![3]))]);
        assert!(rx.get(b"a").is_none(), "rebuilt from the whole state");
        assert_eq!(rx.get(b"d").map(|r| r.watchers.clone()), Some(vec![3]));
    }
}
