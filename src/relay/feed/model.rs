//! Model-based test of the feed: a simulated home stores messages on one topic; a worker
//! subscribes at random moments; live messages travel on one first-in-first-out path (where
//! some are dropped, each drop followed a little later by a resync notice, as
//! `engine::local` does), reads and their answers on another, and the two paths advance in a
//! random interleaving. Whatever the schedule, every subscription must end up with every
//! message of the topic exactly once, in position order, except its own connection's.

use std::collections::VecDeque;

use super::{Feed, Follow, SubState};
use crate::engine::{History, Message, Origin, Position, Ticket};

use crate::rng::SplitMix as Rng;

/// A subscription of the model's worker and what it was given.
struct Sub {
    follow: Follow,
    got: Vec<Position>,
}

impl super::Follower for Sub {
    fn follow(&mut self) -> &mut Follow {
        &mut self.follow
    }
}

/// What travels on the live path.
enum Live {
    Msg(Message),
    Resync,
}

/// What travels from the worker to the home.
enum Request {
    Watch,
    Read(Position, Ticket),
}

struct World {
    rng: Rng,
    epoch: u64,
    /// Every stored message (the home's cache: nothing is evicted in this model).
    stored: Vec<Message>,
    watched: bool,
    live: VecDeque<Live>,
    /// Resync notices owed, and after how many more live messages they go out.
    owed: Option<u32>,
    requests: VecDeque<Request>,
    answers: VecDeque<(Ticket, History)>,
    feed: Feed,
    subs: Vec<Sub>,
    next_ticket: Ticket,
    hold_cap: usize,
    drop_per_mille: u64,
}

const PUBLISHERS: u64 = 3;

impl World {
    fn new(seed: u64) -> World {
        let mut rng = Rng(seed);
        let hold_cap = 1 + rng.below(6) as usize;
        let drop_per_mille = [0, 0, 50, 200][rng.below(4) as usize];
        World {
            rng,
            epoch: 1_000 + seed,
            stored: Vec::new(),
            watched: false,
            live: VecDeque::new(),
            owed: None,
            requests: VecDeque::new(),
            answers: VecDeque::new(),
            feed: Feed::default(),
            subs: Vec::new(),
            next_ticket: 1,
            hold_cap,
            drop_per_mille,
        }
    }

    fn ticket(&mut self) -> Ticket {
        self.next_ticket += 1;
        self.next_ticket
    }

    fn origin(publisher: u64) -> Origin {
        Origin {
            node: 7,
            conn: 100 + publisher,
        }
    }

    fn publish(&mut self) {
        let seq = self.stored.len() as u64 + 1;
        let msg = Message {
            pos: Position {
                epoch: self.epoch,
                seq,
            },
            body: crate::message::Body::encode(
                "t",
                &seq.to_string(),
                crate::message::Meta::default(),
            ),
            origin: World::origin(self.rng.below(PUBLISHERS + 1)),
        };
        self.stored.push(msg.clone());
        if !self.watched {
            return;
        }
        if self.rng.below(1000) < self.drop_per_mille {
            if self.owed.is_none() {
                self.owed = Some(self.rng.below(3) as u32);
            }
        } else {
            self.live.push_back(Live::Msg(msg));
        }
        self.send_owed(false);
    }

    /// Sends an owed resync notice once its delay is over (or at once when `now`).
    fn send_owed(&mut self, now: bool) {
        match self.owed {
            Some(0) => {
                self.live.push_back(Live::Resync);
                self.owed = None;
            }
            Some(_) if now => {
                self.live.push_back(Live::Resync);
                self.owed = None;
            }
            Some(n) => self.owed = Some(n - 1),
            None => {}
        }
    }

    fn subscribe(&mut self) {
        let ticket = self.ticket();
        let owner = World::origin(self.rng.below(PUBLISHERS + 2));
        if self.subs.is_empty() {
            self.requests.push_back(Request::Watch);
        }
        self.subs.push(Sub {
            follow: Follow {
                state: SubState::Syncing {
                    ticket,
                    from: Position::ZERO,
                },
                owner,
            },
            got: Vec::new(),
        });
        self.requests
            .push_back(Request::Read(Position::ZERO, ticket));
    }

    fn serve_request(&mut self) {
        match self.requests.pop_front() {
            Some(Request::Watch) => self.watched = true,
            Some(Request::Read(after, ticket)) => {
                let messages = self
                    .stored
                    .iter()
                    .filter(|m| m.pos > after)
                    .cloned()
                    .collect();
                let last = self.stored.last().map_or(
                    Position {
                        epoch: self.epoch,
                        seq: 0,
                    },
                    |m| m.pos,
                );
                self.answers.push_back((ticket, History { last, messages }));
            }
            None => {}
        }
    }

    /// Asks for a read for the subscriptions waiting on `UNASKED`.
    fn ask(&mut self, from: Option<Position>) {
        if let Some(from) = from {
            let ticket = self.ticket();
            Feed::retag(&mut self.subs, super::UNASKED, ticket);
            self.requests.push_back(Request::Read(from, ticket));
        }
    }

    fn take_live(&mut self) {
        let mut push = |_: usize, s: &mut Sub, m: &Message| s.got.push(m.pos);
        let again = match self.live.pop_front() {
            Some(Live::Msg(msg)) => {
                let cap = self.hold_cap;
                self.feed.deliver_live(&mut self.subs, &msg, cap, &mut push)
            }
            Some(Live::Resync) => self.feed.resync_all(&mut self.subs),
            None => None,
        };
        self.ask(again);
    }

    fn take_answer(&mut self) {
        let Some((ticket, history)) = self.answers.pop_front() else {
            return;
        };
        let mut push = |_: usize, s: &mut Sub, m: &Message| s.got.push(m.pos);
        if let Some(from) = self
            .feed
            .on_history(&mut self.subs, ticket, &history, &mut push)
        {
            Feed::retag(&mut self.subs, ticket, super::UNASKED);
            self.ask(Some(from));
        }
    }

    fn step(&mut self, publishing: bool) {
        if std::env::var_os("FEED_MODEL_TRACE").is_some() {
            let states: Vec<_> = self.subs.iter().map(|s| s.follow.state).collect();
            eprintln!(
                "stored {} live {:?} req {} ans {:?} subs {:?} held {}",
                self.stored.len(),
                self.live
                    .iter()
                    .map(|l| match l {
                        Live::Msg(m) => m.pos.seq as i64,
                        Live::Resync => -1,
                    })
                    .collect::<Vec<_>>(),
                self.requests.len(),
                self.answers
                    .iter()
                    .map(|(t, h)| (*t, h.last.seq, h.messages.len()))
                    .collect::<Vec<_>>(),
                states,
                self.feed.held.len(),
            );
        }
        match self.rng.below(10) {
            0..=2 if publishing => self.publish(),
            3 if publishing && self.subs.len() < 6 => self.subscribe(),
            4 | 5 => self.serve_request(),
            6 | 7 => self.take_live(),
            _ => self.take_answer(),
        }
    }

    fn quiet(&self) -> bool {
        self.live.is_empty()
            && self.requests.is_empty()
            && self.answers.is_empty()
            && self.owed.is_none()
    }

    fn drain(&mut self) {
        for _ in 0..100_000 {
            if self.quiet() {
                return;
            }
            self.send_owed(true);
            self.step(false);
        }
        panic!("the model did not settle");
    }

    fn check(&self, seed: u64) {
        for (i, s) in self.subs.iter().enumerate() {
            let want: Vec<Position> = self
                .stored
                .iter()
                .filter(|m| m.origin != s.follow.owner)
                .map(|m| m.pos)
                .collect();
            assert_eq!(
                s.got, want,
                "seed {seed}, subscription {i}: given {:?}, owed {:?} (hold cap {}, drops {}/1000)",
                s.got, want, self.hold_cap, self.drop_per_mille
            );
            let end = self.stored.last().map_or(
                Position {
                    epoch: self.epoch,
                    seq: 0,
                },
                |m| m.pos,
            );
            assert_eq!(
                s.follow.state,
                SubState::Active(end),
                "seed {seed}, subscription {i} ends active at the last position"
            );
        }
        assert_eq!(self.feed.held(), 0, "seed {seed}: nothing held at rest");
    }
}

#[test]
fn every_subscription_gets_every_message_once_in_order_whatever_the_interleaving() {
    let seeds = std::env::var("FEED_MODEL_SEEDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(3000u64);
    for seed in 0..seeds {
        let mut w = World::new(seed);
        let steps = 50 + w.rng.below(250);
        for _ in 0..steps {
            w.step(true);
        }
        w.drain();
        w.check(seed);
    }
}

#[test]
fn a_live_message_already_given_by_the_history_is_not_given_again() {
    let mut feed = Feed::default();
    let p = |seq| Position { epoch: 5, seq };
    let msg = |seq| Message {
        pos: p(seq),
        body: crate::message::Body::encode("t", "", crate::message::Meta::default()),
        origin: Origin::NONE,
    };
    let mut subs = [Sub {
        follow: Follow {
            state: SubState::Syncing {
                ticket: 9,
                from: Position::ZERO,
            },
            owner: World::origin(99),
        },
        got: Vec::new(),
    }];
    let mut push = |_: usize, s: &mut Sub, m: &Message| s.got.push(m.pos);
    // Live 2 and 3 arrive before the history that holds 1 and 2.
    for seq in [2, 3] {
        assert_eq!(feed.deliver_live(&mut subs, &msg(seq), 16, &mut push), None);
    }
    let history = History {
        last: p(2),
        messages: vec![msg(1), msg(2)],
    };
    assert_eq!(feed.on_history(&mut subs, 9, &history, &mut push), None);
    assert_eq!(subs[0].got, [p(1), p(2), p(3)]);
    assert_eq!(subs[0].follow.state, SubState::Active(p(3)));
    // A repeat of 3 is nothing; 5 after a missing 4 is a gap: read again after 3.
    assert_eq!(feed.deliver_live(&mut subs, &msg(3), 16, &mut push), None);
    assert_eq!(
        feed.deliver_live(&mut subs, &msg(5), 16, &mut push),
        Some(p(3))
    );
    assert_eq!(subs[0].got.len(), 3);
    // A newer epoch starting at 1 follows on from anything.
    let mut active = [Follow {
        state: SubState::Active(p(9)),
        owner: World::origin(1),
    }];
    let first = Message {
        pos: Position { epoch: 6, seq: 1 },
        body: crate::message::Body::encode("t", "", crate::message::Meta::default()),
        origin: Origin::NONE,
    };
    let mut count = 0;
    let mut push = |_: usize, _: &mut Follow, _: &Message| count += 1;
    assert_eq!(feed.deliver_live(&mut active, &first, 16, &mut push), None);
    assert_eq!(count, 1);
}
