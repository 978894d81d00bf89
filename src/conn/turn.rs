//! A connection's turn within its worker's round ([`Turn`]) and why its input processing
//! stopped ([`Step`]). The worker's round (`worker::Round`) hands each connection a turn;
//! [`Turn::stop`] is the one place that decides whether a connection goes on to its next
//! message or yields (the worker asks the same question through its round before it reads).

use super::Conn;
use crate::relay::Relay;

/// Why a connection's input processing stopped ([`super::process`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// Every whole request or message was handled: what is left, if anything, is a partial
    /// one, and more input raises an event.
    Drained,
    /// Its turn's messages ran out (`Limits::messages_per_turn`): the rest of its input
    /// waits for the other connections' turns.
    TurnOver,
    /// The round's fan-out budget is reached (`Limits::fanout_min`, `fanout_per_conn`): the
    /// rest waits until the queued pushes are delivered and written.
    FanoutFull,
    /// It waits for its own answers (too many pending, an HTTP answer, output to drain).
    Blocked,
    /// It is closing: the rest of its input is discarded.
    Closed,
    /// Its upgrade's token waits for the round's batch of token checks: the upgrade is
    /// read again once they are verified (`auth::Gate::settle`).
    AuthPending,
}

impl Step {
    /// It stopped with input that no event will announce again: the worker resumes it
    /// after the other connections (and the round's deliveries).
    pub fn yields(self) -> bool {
        matches!(self, Step::TurnOver | Step::FanoutFull | Step::AuthPending)
    }
}

/// A connection's share of its worker's round: the messages it may still handle, and the
/// round's fan-out budget.
#[derive(Debug, Clone, Copy)]
pub struct Turn {
    /// WebSocket messages it may still handle.
    left: usize,
    /// Pushes the round's queued deliveries may reach before input processing pauses.
    fanout: usize,
    /// Its upgrade waits for the round's token checks.
    auth_pending: bool,
}

impl Turn {
    /// A turn of `messages` WebSocket messages within a round whose fan-out budget is
    /// `fanout` pushes.
    pub fn new(messages: usize, fanout: usize) -> Turn {
        Turn {
            left: messages,
            fanout,
            auth_pending: false,
        }
    }

    /// Its upgrade's token was queued for the round's batch: stop until it is verified.
    pub fn auth_pending(&mut self) {
        self.auth_pending = true;
    }

    /// One message handled.
    pub fn took_one(&mut self) {
        self.left = self.left.saturating_sub(1);
    }

    /// Its messages ran out.
    pub fn over(&self) -> bool {
        self.left == 0
    }

    /// The deliveries queued in `relay` have reached the round's fan-out budget.
    pub fn fanout_full(&self, relay: &Relay) -> bool {
        relay.pending_pushes() >= self.fanout
    }

    /// Why `conn` must stop before its next message, if it must: its turn is over, the
    /// round's fan-out budget is reached, or it waits for its answers.
    pub fn stop<S>(&self, conn: &Conn<S>, relay: &Relay, max_pending: usize) -> Option<Step> {
        if self.auth_pending {
            Some(Step::AuthPending)
        } else if self.over() {
            Some(Step::TurnOver)
        } else if self.fanout_full(relay) {
            Some(Step::FanoutFull)
        } else if conn.input_blocked(max_pending) {
            Some(Step::Blocked)
        } else {
            None
        }
    }
}
