//! The one way a connection leaves a worker: marked during the round ([`Worker::close_now`]),
//! removed at its end ([`Worker::reap`]) with its subscriptions, so a reused slab key never
//! receives a stale event. Also the worker's shutdown: stop accepting, close every
//! connection (WebSocket close 1001), exit when they are gone or the grace period ends.

use super::Worker;
use crate::conn::Phase;
use crate::relay::ConnRef;
use crate::ws::close;

impl Worker {
    /// Marks a connection for removal at the end of the iteration.
    pub(super) fn close_now(&mut self, key: usize) {
        self.round.close(&mut self.conns, key);
    }

    /// Removes the connections marked this round.
    pub(super) fn reap(&mut self) {
        let (mut subscribed, mut closed, mut websockets) = (false, 0, 0);
        while let Some(key) = self.round.closing.pop() {
            let mut c = self.conns.remove(key);
            if let Some(tls) = c.tls.as_deref_mut() {
                // A clean end for the client (only after a handshake, never after a
                // failure), best effort: whatever the socket takes now.
                let _ = super::tls::close_notify(tls, &mut c.sock);
            }
            self.tools.limits.release(&mut c.limit);
            let me = ConnRef { key, uid: c.uid };
            subscribed |= !c.subs.is_empty();
            let mut acks = c.ws().and_then(|w| w.acks().map(std::mem::take));
            for s in &c.subs {
                // A client id's subscription was given for sure what precedes its first
                // push not acknowledged (`conn::acks`).
                let unacked = acks.as_mut().and_then(|a| a.first_unacked(s.slot));
                self.relay.closed(s.slot, me, unacked);
            }
            for t in c.v1_topics() {
                self.relay.v1_unsubscribe(me, t);
            }
            // Dropping the socket closes its only descriptor (sockets are never duplicated),
            // which removes it from the epoll set: no `epoll_ctl(DEL)` per connection.
            closed += 1;
            websockets += u64::from(c.was_ws());
        }
        if subscribed {
            // A client id's `-1 socket` leaves now, not a round later, and before the
            // connection counts as gone: a reconnect reaches the topic's home after it
            // (DECISIONS 13), unless the home's queue is full.
            let handoff = self.relay.flush();
            self.round.handoff = self.round.handoff.and(handoff);
        }
        let m = &self.shared.metrics.cores[self.id];
        m.connections_open.sub(closed);
        m.websockets_open.sub(websockets);
    }

    /// During the shutdown: a connection upgraded since it began (its first request was
    /// an upgrade) is closed at once (1001), like the others were.
    pub(super) fn close_late_upgrades(&mut self) {
        let now = self.clock.now;
        let late: Vec<usize> = self
            .conns
            .iter()
            .filter(|(_, c)| matches!(c.phase, Phase::Ws(_)) && !c.marks.closed)
            .map(|(k, _)| k)
            .collect();
        for key in late {
            self.conns[key].ws_close(
                close::GOING_AWAY,
                "server shutting down",
                now,
                self.round.out.close_ms,
            );
            self.mark_dirty(key);
        }
    }

    /// Stops accepting and starts closing every connection.
    pub(super) fn begin_shutdown(&mut self) {
        if self.timers.stop_at.is_some() {
            return;
        }
        for mut l in [self.listeners.plain.take(), self.listeners.tls.take()]
            .into_iter()
            .flatten()
        {
            let _ = self.waits.poll.registry().deregister(&mut l);
        }
        let now = self.clock.now;
        self.timers.stop_at =
            Some(now + self.shared.config.limits.shutdown_grace().as_millis() as u64);
        self.tools.stopping = true;
        let keys: Vec<usize> = self.conns.iter().map(|(k, _)| k).collect();
        for key in keys {
            let c = &mut self.conns[key];
            match c.phase {
                Phase::Ws(_) => {
                    c.ws_close(
                        close::GOING_AWAY,
                        "server shutting down",
                        now,
                        self.round.out.close_ms,
                    );
                    self.mark_dirty(key);
                }
                Phase::Http(_) if c.out.is_empty() && c.marks.answered => self.close_now(key),
                // Accepted, its first request not read yet (it may be on its way: a
                // connection accepted this round has not been read at all): answered
                // first, then closed (`Tools::stopping`), or closed at its head deadline.
                Phase::Http(crate::conn::HttpWait::Nothing) if !c.marks.answered => {}
                _ => {
                    c.begin_close(now, self.round.out.close_ms);
                    self.mark_dirty(key);
                }
            }
        }
    }
}
