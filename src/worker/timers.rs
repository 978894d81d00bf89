//! A worker's deadlines: each connection has one (slowloris, keep-alive idle, heartbeat,
//! linger), kept in the timer wheel; when it falls due the phase decides what it means.
//! Also the periodic work of each round: the relay's tick (expiry) and retrying `accept`.

use super::Worker;
use crate::conn::{self, HttpWait, Phase};
use crate::http::response;
use crate::metrics::DropReason;
use crate::relay::ConnRef;
use crate::ws::close;

/// What a due deadline calls for.
enum Action {
    Rearm,
    Close,
    RequestTimeout,
    Ping,
}

impl Worker {
    /// Fires the timers due now, then the relay's periodic work; returns how many fell due.
    pub(super) fn fire_timers(&mut self) -> u32 {
        let mut due = Vec::new();
        self.timers.wheel.advance(self.clock.now, &mut due);
        for &(key, uid, tick) in &due {
            self.on_timer(key, uid, tick);
        }
        self.relay.tick(self.clock.now);
        self.tools.limits.tick(self.clock.now);
        self.m()
            .limit_split_accepts
            .set(self.tools.limits.split_accepts());
        self.apply_blocks();
        if self.listeners.retry && !due.is_empty() {
            self.listeners.retry = false;
            self.accept(false);
            self.accept(true);
        }
        self.deliver();
        due.len() as u32
    }

    /// Makes sure the wheel holds an entry no later than the connection's deadline.
    pub(super) fn arm(&mut self, key: usize) {
        let Some(c) = self.conns.get_mut(key) else {
            return;
        };
        if c.marks.closed {
            return;
        }
        let tick = self.timers.wheel.tick_of(c.deadline);
        if c.timer_tick == 0 || tick < c.timer_tick {
            c.timer_tick = self.timers.wheel.schedule(key, c.uid, c.deadline);
        }
    }

    fn on_timer(&mut self, key: usize, uid: u64, tick: u64) {
        let now = self.clock.now;
        let interval = self.shared.config.limits.ping_interval().as_millis() as u64;
        let r = ConnRef { key, uid };
        let Some(c) = conn::live(&mut self.conns, r).filter(|c| c.timer_tick == tick) else {
            return;
        };
        c.timer_tick = 0;
        let action = if now < c.deadline {
            Action::Rearm
        } else {
            match &c.phase {
                Phase::Http(HttpWait::Webhook { .. } | HttpWait::Rpc { .. }) => {
                    c.deadline = now + 1000;
                    Action::Rearm
                }
                Phase::Http(_) if c.rbuf.is_empty() && c.out.is_empty() => Action::Close,
                Phase::Http(_) => Action::RequestTimeout,
                Phase::Ws(w) if now >= w.last_rx + 2 * interval => {
                    self.shared.metrics.cores[self.id].heartbeat_closes.inc();
                    Action::Close
                }
                Phase::Ws(w) if now >= w.next_ping => Action::Ping,
                Phase::Ws(w) => {
                    c.deadline = w.next_ping.min(w.last_rx + 2 * interval);
                    Action::Rearm
                }
                Phase::Closing { .. } => Action::Close,
            }
        };
        match action {
            Action::Rearm => {}
            Action::Close => return self.close_now(key),
            Action::RequestTimeout => {
                if !c.rbuf.is_empty() {
                    let resp =
                        response::Response::json_error(408, "request head not received in time");
                    c.rbuf = Vec::new();
                    response::write(&mut c.out, &resp, self.clock.date.as_bytes(), false, true);
                }
                // Idle with a response still on its way out: finish it, then close.
                c.begin_close(now, self.round.out.close_ms);
                self.mark_dirty(key);
            }
            Action::Ping => {
                if let Phase::Ws(w) = &mut c.phase {
                    w.next_ping = now + interval;
                    c.deadline = w.next_ping.min(w.last_rx + 2 * interval);
                }
                c.out
                    .extend(&crate::ws::frame(crate::ws::Opcode::Ping, b""));
                self.mark_dirty(key);
            }
        }
        self.arm(key);
    }

    /// Closes a WebSocket whose outbound buffer passed the limit (DECISIONS §3: 1008).
    pub(super) fn check_outbound(&mut self, key: usize) {
        let max = self.shared.config.limits.max_outbound;
        let now = self.clock.now;
        let Some(c) = self.conns.get_mut(key) else {
            return;
        };
        if c.outbound_len() <= max || c.marks.closed || !matches!(c.phase, Phase::Ws(_)) {
            return;
        }
        self.shared.metrics.cores[self.id].drop(DropReason::SlowConsumer, 1);
        c.ws_close(
            close::POLICY,
            "outbound buffer full",
            now,
            self.round.out.close_ms,
        );
        self.mark_dirty(key);
        self.arm(key);
    }
}
