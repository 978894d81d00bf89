//! How a thread reaches a worker: the worker's [`Doorbell`] (the `mio::Waker` of its poll
//! loop and a flag saying it may be asleep) and bounded [`Mailbox`]es that ring it.
//!
//! A worker has one mailbox for itself (shutdown, reload: `worker`) and its engine has its
//! own (messages from other workers' engines and from the engine's helper threads): each is
//! read by its owner alone, on the worker's thread, and every sender is given the sending
//! half at construction. No lock is taken on the way of a message: a sender `try_send`s and
//! rings the doorbell only when the worker said it may sleep.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crossbeam_channel::{Sender, TrySendError};

pub use crossbeam_channel::Receiver;

/// Wakes one worker's poll loop.
#[derive(Debug)]
pub struct Doorbell {
    waker: mio::Waker,
    /// Set by the owner just before it may block in `poll`; a sender that finds it set
    /// clears it and wakes the owner.
    sleeping: AtomicBool,
}

impl Doorbell {
    /// The doorbell of the poll loop `waker` wakes.
    pub fn new(waker: mio::Waker) -> Arc<Doorbell> {
        Arc::new(Doorbell {
            waker,
            sleeping: AtomicBool::new(false),
        })
    }

    /// Wakes the owner if it said it may sleep.
    pub fn ring(&self) {
        if self.sleeping.swap(false, Ordering::SeqCst) {
            let _ = self.waker.wake();
        }
    }

    /// Sets or clears the sleeping flag (only the owner calls this; it looks at its
    /// mailboxes once more after setting it, so nothing slips in between).
    pub fn set_sleeping(&self, v: bool) {
        self.sleeping.store(v, Ordering::SeqCst);
    }
}

/// The sending half of a bounded queue to one worker, ringing its doorbell.
#[derive(Debug)]
pub struct Mailbox<T> {
    tx: Sender<T>,
    bell: Arc<Doorbell>,
}

impl<T> Clone for Mailbox<T> {
    fn clone(&self) -> Self {
        Mailbox {
            tx: self.tx.clone(),
            bell: self.bell.clone(),
        }
    }
}

/// A queue of at most `cap` messages to the worker of `bell`: its sending half and the
/// receiving half the owner keeps.
pub fn bounded<T>(bell: Arc<Doorbell>, cap: usize) -> (Mailbox<T>, Receiver<T>) {
    let (tx, rx) = crossbeam_channel::bounded(cap.max(1));
    (Mailbox { tx, bell }, rx)
}

impl<T> Mailbox<T> {
    /// Sends without blocking; gives the message back when the queue is full (or its
    /// owner is gone).
    pub fn try_send(&self, msg: T) -> Result<(), T> {
        match self.tx.try_send(msg) {
            Ok(()) => {
                self.bell.ring();
                Ok(())
            }
            Err(TrySendError::Full(m)) | Err(TrySendError::Disconnected(m)) => Err(m),
        }
    }

    /// Sends from a helper thread that may wait (an answer that must not be dropped):
    /// retries while the queue is full; gives up only when the owner is gone.
    pub fn send_blocking(&self, msg: T) {
        let mut msg = msg;
        let mut pause = Duration::from_micros(50);
        loop {
            match self.tx.try_send(msg) {
                Ok(()) => {
                    self.bell.ring();
                    return;
                }
                Err(TrySendError::Disconnected(_)) => return,
                Err(TrySendError::Full(m)) => msg = m,
            }
            std::thread::sleep(pause);
            pause = (pause * 2).min(Duration::from_millis(10));
        }
    }

    /// Sends a control message from outside any worker (the signal thread, the webhook
    /// pool), retrying for up to a second while the queue is full; `false` when it was
    /// dropped.
    pub fn send_patient(&self, msg: T) -> bool {
        let mut msg = msg;
        for _ in 0..1000 {
            match self.try_send(msg) {
                Ok(()) => return true,
                Err(m) => msg = m,
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_mailbox_gives_the_message_back() {
        let poll = mio::Poll::new().unwrap();
        let waker = mio::Waker::new(poll.registry(), mio::Token(0)).unwrap();
        let (mb, rx) = bounded(Doorbell::new(waker), 1);
        assert!(mb.try_send(1u8).is_ok());
        assert_eq!(mb.try_send(2u8), Err(2));
        assert_eq!(rx.try_recv(), Ok(1));
        drop(rx);
        assert_eq!(mb.try_send(3u8), Err(3), "the owner is gone");
        mb.send_blocking(4u8); // returns: nobody to wait for
    }
}
