//! Merging a topic's history and its live messages by position, for the subscriptions one
//! worker holds on the topic. Pure: no engine, no connection, no clock; `relay` calls it
//! with what arrived and a `push` callback, and the model test below drives it through
//! random interleavings.
//!
//! A new subscription starts *syncing*: it asked the engine for the topic's history and
//! waits for it, while live messages of the topic keep arriving (by another path, in any
//! order relative to the history). Live messages that arrive meanwhile are *held* (once per
//! topic, bounded). When the history comes, the subscription gets the history, then the held
//! messages after the history's last position, and becomes *active* at the last position it
//! was given; from then on it gets every live message after that position. Positions make
//! each message count once, whichever path brought it first.
//!
//! Live messages of a topic reach a worker in position order. A subscription that is given
//! a live message which does not directly follow its position (one was dropped on the way,
//! a store reconnected) has hit a *gap*: it goes back to syncing from its position and the
//! topic is read again. When the engine says that live messages may have been lost
//! ([`Feed::resync_all`]), every subscription of the topic, syncing ones included, reads
//! again from its position. A syncing subscription whose held messages do not follow on
//! from the history, or from which a held message had to be dropped for room, reads again
//! too.

use std::collections::VecDeque;

use crate::engine::{History, Message, Origin, Position, Ticket};

/// Where one subscription stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SubState {
    /// Waiting for the history of read `ticket`, having been given everything up to `from`.
    Syncing {
        /// The read it waits for.
        ticket: Ticket,
        /// The last position it was given ([`Position::ZERO`] for a new subscription).
        from: Position,
    },
    /// Following live messages; given everything up to this position.
    Active(Position),
}

/// One subscription as the feed sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Follow {
    /// Where it stands.
    pub state: SubState,
    /// Its connection: a message this connection published is not given to it, though its
    /// position counts as given.
    pub owner: Origin,
}

/// Anything holding a [`Follow`] (the relay's subscription entries, the model test's).
pub trait Follower {
    /// The subscription's feed state.
    fn follow(&mut self) -> &mut Follow;
}

impl Follower for Follow {
    fn follow(&mut self) -> &mut Follow {
        self
    }
}

/// The ticket of subscriptions that must read again and have no read yet: the caller asks
/// for one and moves them to it with [`Feed::retag`].
pub const UNASKED: Ticket = Ticket::MAX;

/// A topic's feed on one worker.
#[derive(Debug, Default)]
pub struct Feed {
    /// Live messages received while some subscription syncs, oldest first. Dropping the
    /// oldest for room needs no record: the first one left no longer follows on from a
    /// history that ended before the dropped one, so that subscription reads again.
    held: VecDeque<Message>,
}

/// Whether a subscription given everything up to `at` can take `next` without missing one:
/// the next position of the same history, or the first of a newer one.
fn continues(at: Position, next: Position) -> bool {
    at.is_followed_by(next) || (next.epoch > at.epoch && next.seq == 1)
}

impl Feed {
    /// Every subscription, active or syncing, syncs again from its position (on
    /// [`UNASKED`]); returns the position to read after (the oldest of theirs), `None` if
    /// there is no subscription.
    pub fn resync_all<S: Follower>(&mut self, subs: &mut [S]) -> Option<Position> {
        let mut from: Option<Position> = None;
        for s in subs.iter_mut() {
            let f = s.follow();
            let at = match f.state {
                SubState::Active(at) => at,
                SubState::Syncing { from, .. } => from,
            };
            f.state = SubState::Syncing {
                ticket: UNASKED,
                from: at,
            };
            from = Some(from.map_or(at, |p| p.min(at)));
        }
        from
    }

    /// Delivers a live message to the active subscriptions it follows on from; an active
    /// subscription it does not follow on from has missed messages and syncs again (on
    /// [`UNASKED`]); syncing subscriptions get it held (at most `cap` held; the oldest is
    /// dropped past it). Returns the position to read after when some subscription must
    /// read again.
    // Inlined into the relay's delivery of each live message, with its `push` closure
    // (docs/PERFORMANCE.md, "Smaller choices").
    #[inline]
    pub fn deliver_live<S: Follower>(
        &mut self,
        subs: &mut [S],
        msg: &Message,
        cap: usize,
        push: &mut impl FnMut(usize, &mut S, &Message),
    ) -> Option<Position> {
        let mut hold = false;
        let mut again: Option<Position> = None;
        for (i, s) in subs.iter_mut().enumerate() {
            let f = s.follow();
            match f.state {
                SubState::Active(at) if msg.pos <= at => {}
                SubState::Active(at) if continues(at, msg.pos) => {
                    f.state = SubState::Active(msg.pos);
                    if msg.origin != f.owner {
                        push(i, s, msg);
                    }
                }
                SubState::Active(at) => {
                    f.state = SubState::Syncing {
                        ticket: UNASKED,
                        from: at,
                    };
                    again = Some(again.map_or(at, |p| p.min(at)));
                    hold = true;
                }
                SubState::Syncing { .. } => hold = true,
            }
        }
        if hold {
            if self.held.len() >= cap.max(1) {
                self.held.pop_front();
            }
            self.held.push_back(msg.clone());
        }
        again
    }

    /// The history of read `ticket` arrived: each subscription syncing on it gets the
    /// history after its position, then the held messages that follow on, and becomes
    /// active. Returns the position to read after again (the oldest position of those
    /// that could not be brought up to date: held messages missing), `None` when all are
    /// active; those keep syncing on `ticket` (see [`Feed::retag`]).
    pub fn on_history<S: Follower>(
        &mut self,
        subs: &mut [S],
        ticket: Ticket,
        history: &History,
        push: &mut impl FnMut(usize, &mut S, &Message),
    ) -> Option<Position> {
        let mut again: Option<Position> = None;
        for (i, s) in subs.iter_mut().enumerate() {
            let SubState::Syncing { ticket: t, from } = s.follow().state else {
                continue;
            };
            if t != ticket {
                continue;
            }
            let mut at = from;
            for m in &history.messages {
                at = give(i, s, at, m, push);
            }
            at = at.max(history.last);
            let mut complete = true;
            for m in &self.held {
                if m.pos <= at {
                    continue;
                }
                if !continues(at, m.pos) {
                    complete = false;
                    break;
                }
                at = give(i, s, at, m, push);
            }
            let f = s.follow();
            if complete {
                f.state = SubState::Active(at);
            } else {
                f.state = SubState::Syncing { ticket, from: at };
                again = Some(again.map_or(at, |p| p.min(at)));
            }
        }
        self.release_held(subs);
        again
    }

    /// Moves the subscriptions syncing on `old` to read `new`.
    pub fn retag<S: Follower>(subs: &mut [S], old: Ticket, new: Ticket) {
        for s in subs.iter_mut() {
            let f = s.follow();
            if let SubState::Syncing { ticket, from } = f.state {
                if ticket == old {
                    f.state = SubState::Syncing { ticket: new, from };
                }
            }
        }
    }

    /// Forgets the held messages once no subscription syncs any more.
    pub fn release_held<S: Follower>(&mut self, subs: &mut [S]) {
        let syncing = subs
            .iter_mut()
            .any(|s| matches!(s.follow().state, SubState::Syncing { .. }));
        if !syncing {
            self.held = VecDeque::new();
        }
    }

    /// Messages held now.
    pub fn held(&self) -> usize {
        self.held.len()
    }
}

/// Gives `m` to subscription `i`, `s`, at `at` if it comes after; returns its new position.
fn give<S: Follower>(
    i: usize,
    s: &mut S,
    at: Position,
    m: &Message,
    push: &mut impl FnMut(usize, &mut S, &Message),
) -> Position {
    if m.pos <= at {
        return at;
    }
    if m.origin != s.follow().owner {
        push(i, s, m);
    }
    m.pos
}

#[cfg(test)]
mod model;
