//! `*_fetchMessages` and `*_batchFetchMessages` (DECISIONS §10): a topic's stored messages
//! that this connection has not yet received, oldest first, at most [`MAX_FETCH`] an answer,
//! `hasMore: true` when it should call again.
//!
//! What a connection has received of a topic is the later of two positions: its
//! subscription's (what was pushed to it) and its fetch cursor (what earlier fetches gave
//! it), kept per topic in the connection's WebSocket state. Messages the connection
//! published itself are not given back (as a subscription never gets them), but the cursor
//! moves past them. The reads go to the topic's engine like a new subscription's; each
//! answer is folded into the pending answer (`outbound::Gathered::Fetch`).

use std::collections::HashMap;
use std::sync::Arc;

use super::outbound::{Fetched, Gathered};
use super::{Conn, Ctx};
use crate::engine::History;
use crate::message::{Origin, Position};
use crate::relay::RelayError;

/// Most messages in one fetch answer.
pub const MAX_FETCH: usize = crate::engine::clients::MAX_FETCH;

/// Most topics a connection keeps a fetch cursor for.
pub const MAX_CURSORS: usize = 1000;

/// A connection's fetch cursors: per topic, the last position a fetch gave it. At most
/// [`MAX_CURSORS`] topics; past it one is forgotten (its next fetch starts from its
/// subscription's position, or from the start: the SDK drops messages it has seen).
#[derive(Debug, Default)]
pub struct Cursors(HashMap<Arc<str>, Position, ahash::RandomState>);

impl Cursors {
    fn get(&self, topic: &str) -> Position {
        self.0.get(topic).copied().unwrap_or(Position::ZERO)
    }

    fn set(&mut self, topic: &Arc<str>, at: Position, max: usize) {
        if !self.0.contains_key(topic) && self.0.len() >= max.max(1) {
            let old = self.0.keys().next().cloned();
            if let Some(old) = old {
                self.0.remove(&old);
            }
        }
        self.0.insert(topic.clone(), at);
    }
}

/// Asks the relay for each topic's messages after what the connection has received; the
/// answers come back through `resolve` with the connection's answer number `answer`.
pub fn start<S>(
    conn: &mut Conn<S>,
    topics: &[std::borrow::Cow<'_, str>],
    answer: u64,
    ctx: &mut Ctx<'_>,
) {
    let client = conn.ws().and_then(|w| w.client_ref().cloned());
    start_for(conn, topics, answer, client, ctx);
}

/// [`start`] for the client id `client` when it is not the connection's own (`POST /rpc`:
/// the request's token names it).
pub fn start_for<S>(
    conn: &mut Conn<S>,
    topics: &[std::borrow::Cow<'_, str>],
    answer: u64,
    client: Option<Arc<crate::engine::clients::ClientRef>>,
    ctx: &mut Ctx<'_>,
) {
    let me = ctx.conn_ref(conn);
    for topic in topics {
        let relay = &*ctx.relay;
        let subscribed = conn
            .subs
            .iter()
            .find(|s| relay.topic_name(s.slot).is_some_and(|t| **t == **topic))
            .and_then(|s| relay.sub_position(s.slot, me));
        let cursor = conn
            .ws()
            .and_then(|w| w.cursors())
            .map_or(Position::ZERO, |c| c.get(topic));
        let after = subscribed.map_or(cursor, |p| p.max(cursor));
        match &client {
            // Also after the client id's delivered position (DECISIONS 13), which the
            // home moves past what it returns.
            Some(c) => ctx.relay.fetch_as(me, answer, topic, after, c, MAX_FETCH),
            None => ctx.relay.fetch(me, answer, topic, after),
        }
    }
}

/// Folds a topic's history (read after `after`) into the connection's pending fetch answer
/// `answer`, and moves the topic's cursor past what it gave; `me`: the connection's origin.
/// Returns whether the answer was found.
pub fn resolve<S>(
    conn: &mut Conn<S>,
    answer: u64,
    topic: &Arc<str>,
    after: Position,
    me: Origin,
    result: Result<History, RelayError>,
) -> bool {
    let history = match result {
        Ok(h) => h,
        Err(e) => return conn.resolve(answer, Err(e)),
    };
    let mut last = after;
    let found = conn.resolve_with(answer, |o| {
        if let Gathered::Fetch(f) = o {
            last = take(f, &history, after, me);
        }
    });
    if found && last > after {
        if let Some(w) = conn.ws() {
            w.cursors_mut().set(topic, last, MAX_CURSORS);
        }
    }
    found
}

/// Appends the messages of `h` after `after` (not published by `me`) to `f` while it has
/// room; returns the position of the last one looked at.
fn take(f: &mut Fetched, h: &History, after: Position, me: Origin) -> Position {
    let mut last = after;
    for m in &h.messages {
        if m.pos <= after {
            continue;
        }
        if m.origin != me {
            if f.count == MAX_FETCH {
                f.more = true;
                break;
            }
            if f.count > 0 {
                f.items.push(b',');
            }
            f.items.extend_from_slice(m.body.irn());
            f.count += 1;
        }
        last = m.pos;
    }
    // A client id's read stops at MAX_FETCH messages (its own among them): more may follow.
    let fresh = h.messages.len() - h.messages.partition_point(|m| m.pos <= after);
    if fresh >= MAX_FETCH && last == h.messages.last().map_or(after, |m| m.pos) {
        f.more = true;
    }
    last
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::message::{Body, Message, Meta};

    fn msg(seq: u64, origin: Origin) -> Message {
        Message {
            pos: Position { epoch: 1, seq },
            body: Body::encode("t", &seq.to_string(), Meta::default()),
            origin,
        }
    }

    #[test]
    fn a_fetch_takes_what_follows_skips_its_own_and_stops_at_the_limit() {
        let me = Origin { node: 1, conn: 1 };
        let other = Origin { node: 1, conn: 2 };
        let mut messages: Vec<Message> = (1..=600).map(|s| msg(s, other)).collect();
        messages[2].origin = me;
        let h = History {
            last: Position { epoch: 1, seq: 600 },
            messages,
        };
        let mut f = Fetched::default();
        let last = take(&mut f, &h, Position { epoch: 1, seq: 1 }, me);
        // Seqs 2 and 4..=502: 500 messages; seq 3 was the connection's own.
        assert_eq!((f.count, f.more), (500, true));
        assert_eq!(last, Position { epoch: 1, seq: 502 });
        let text = format!("[{}]", String::from_utf8(f.items).unwrap());
        let v: Vec<serde_json::Value> = serde_json::from_str(&text).unwrap();
        assert_eq!(v[0]["message"], "2");
        assert_eq!(v[1]["message"], "4");
        let mut g = Fetched::default();
        assert_eq!(take(&mut g, &h, last, me).seq, 600);
        assert_eq!((g.count, g.more), (98, false));
    }

    #[test]
    fn cursors_are_bounded() {
        let mut c = Cursors::default();
        for i in 0..10 {
            c.set(&Arc::from(i.to_string()), Position { epoch: 1, seq: i }, 4);
        }
        assert_eq!(c.0.len(), 4);
        assert_eq!(c.get("9").seq, 9);
    }
}
