//! Unit tests of the client-id subscriptions of a home's topics: the notices a stored
//! message gives (sockets, none, prompt, the publisher), receipts, fetches and expiry.

use std::sync::atomic::AtomicUsize;
use std::sync::{Arc, Mutex};

use super::super::HomeTopics;
use crate::config::Limits;
use crate::engine::clients::{ClientOp, ClientRef, MailboxTable};
use crate::engine::{Origin, Position, PublishReq, Stored};
use crate::message::{Body, Meta};
use crate::metrics::Metrics;
use crate::notice::{Notice, Notify, PushNotice, Status, Typ};

/// What a notice said, as recorded.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Heard {
    Event(String, Typ, Status, u64),
    Push(String, String),
}

/// A `Notify` that records everything; every client is watched, pushes are on.
#[derive(Default)]
struct Recorder {
    heard: Mutex<Vec<Heard>>,
    unwatched: Mutex<Vec<String>>,
}

impl Notify for Recorder {
    fn watched(&self, client: &str) -> bool {
        !self.unwatched.lock().unwrap().iter().any(|c| c == client)
    }
    fn event(&self, n: &Notice<'_>) {
        let h = Heard::Event(n.client.into(), n.typ, n.status, n.message_id);
        self.heard.lock().unwrap().push(h);
    }
    fn pushes(&self) -> bool {
        true
    }
    fn push(&self, p: &PushNotice<'_>) {
        let h = Heard::Push(p.client.into(), p.project.into());
        self.heard.lock().unwrap().push(h);
    }
}

impl Recorder {
    fn take(&self) -> Vec<Heard> {
        std::mem::take(&mut *self.heard.lock().unwrap())
    }
}

fn home(rec: &Arc<Recorder>, ttl_ms: u64) -> HomeTopics {
    let mut h = HomeTopics::new(
        0,
        64,
        1 << 20,
        Limits::default(),
        Metrics::new(1),
        Arc::new(AtomicUsize::new(0)),
    );
    h.set_mailboxes(ttl_ms, Arc::new(MailboxTable::default()), rec.clone());
    h
}

fn client(id: &str) -> ClientRef {
    ClientRef {
        id: id.into(),
        project: format!("project-{id}").into(),
    }
}

const PUBLISHED_AT: u64 = 1_764_000_000_123;

fn req(topic: &Arc<str>, message: &str, prompt: bool, publisher: Option<&str>) -> PublishReq {
    let meta = Meta {
        published_at: PUBLISHED_AT,
        tag: 1108,
        ..Meta::default()
    };
    PublishReq {
        topic: topic.clone(),
        body: Body::encode(topic, message, meta),
        ttl: 300,
        prompt,
        origin: Origin::NONE,
        hash: None,
        publisher: publisher.map(|p| Arc::new(client(p))),
    }
}

/// Stores `r` and gives its notices; returns its position.
fn store(h: &mut HomeTopics, r: &PublishReq, now: u64) -> Position {
    let o = h.store(r, r.body.beta_bytes().len() as u64 ^ now, now);
    let Stored::New(pos) = o.stored else {
        panic!("not stored")
    };
    h.client_notices(o.slot, r, pos);
    pos
}

#[test]
fn a_message_is_accepted_for_every_client_and_queued_and_pushed_for_those_without_a_socket() {
    let rec = Arc::new(Recorder::default());
    let mut h = home(&rec, 60_000);
    let t: Arc<str> = Arc::from("t");
    let (awake, asleep, publisher) = (client("awake"), client("asleep"), client("pub"));
    h.client_op(&t, &awake, ClientOp::Subscribe { socket: true }, 1);
    h.client_op(&t, &publisher, ClientOp::Subscribe { socket: true }, 1);
    h.client_op(&t, &asleep, ClientOp::Subscribe { socket: true }, 1);
    h.client_op(&t, &asleep, ClientOp::SocketGone { at: Position::ZERO }, 2);
    let pos = store(&mut h, &req(&t, "hello", true, Some("pub")), 3);
    let id = crate::notice::message_id(PUBLISHED_AT, pos.seq);
    let heard = rec.take();
    let ev = |c: &str, typ, st| Heard::Event(c.into(), typ, st, id);
    assert_eq!(
        heard,
        [
            ev("pub", Typ::Publisher, Status::Accepted),
            ev("awake", Typ::Subscriber, Status::Accepted),
            ev("asleep", Typ::Subscriber, Status::Accepted),
            ev("asleep", Typ::Subscriber, Status::Queued),
            Heard::Push("asleep".into(), "project-asleep".into()),
        ]
    );
    // Without `prompt`: no push; an unwatched client: no event, still its push.
    store(&mut h, &req(&t, "quiet", false, None), 4);
    assert!(!rec.take().iter().any(|x| matches!(x, Heard::Push(..))));
    rec.unwatched.lock().unwrap().push("asleep".into());
    store(&mut h, &req(&t, "again", true, None), 5);
    let heard = rec.take();
    assert!(!heard
        .iter()
        .any(|x| matches!(x, Heard::Event(c, ..) if c == "asleep")));
    assert!(heard.contains(&Heard::Push("asleep".into(), "project-asleep".into())));
}

#[test]
fn a_topic_without_client_ids_hears_nothing() {
    let rec = Arc::new(Recorder::default());
    let mut h = home(&rec, 60_000);
    let t: Arc<str> = Arc::from("t");
    store(&mut h, &req(&t, "x", true, None), 1);
    assert!(rec.take().is_empty());
}

#[test]
fn a_fetch_delivers_what_it_gives_and_receipts_leave_messages_out() {
    let rec = Arc::new(Recorder::default());
    let mut h = home(&rec, 60_000);
    let t: Arc<str> = Arc::from("t");
    let c = client("c");
    h.client_op(&t, &c, ClientOp::Subscribe { socket: false }, 1);
    let p1 = store(&mut h, &req(&t, "1", false, None), 2);
    let p2 = store(&mut h, &req(&t, "2", false, None), 3);
    let p3 = store(&mut h, &req(&t, "3", false, None), 4);
    rec.take();
    // A receipt of message 2: not read again, and the position moves over it once 1 is
    // delivered.
    let id2 = crate::notice::message_id(PUBLISHED_AT, p2.seq);
    h.client_op(&t, &c, ClientOp::Receive { ids: vec![id2] }, 5);
    let read = h.read_for("t", Position::ZERO, "c", None);
    let got: Vec<Position> = read.messages.iter().map(|m| m.pos).collect();
    assert_eq!(got, [p1, p3]);
    let fetched = h.read_for("t", Position::ZERO, "c", Some(1));
    assert_eq!(fetched.messages.len(), 1);
    assert_eq!(fetched.messages[0].pos, p1);
    let id1 = crate::notice::message_id(PUBLISHED_AT, p1.seq);
    assert_eq!(
        rec.take(),
        [Heard::Event(
            "c".into(),
            Typ::Subscriber,
            Status::Delivered,
            id1
        )]
    );
    h.client_op(&t, &c, ClientOp::Delivered { at: p1 }, 6);
    assert_eq!(h.client_sub("t", "c").map(|s| s.delivered), Some(p2));
    let rest = h.read_for("t", Position::ZERO, "c", Some(500));
    assert_eq!(
        rest.messages.iter().map(|m| m.pos).collect::<Vec<_>>(),
        [p3]
    );
    assert!(h
        .read_for("t", Position::ZERO, "c", Some(500))
        .messages
        .is_empty());
}

#[test]
fn a_mailbox_expires_after_its_last_socket_and_an_unsubscribe_ends_it_at_once() {
    let rec = Arc::new(Recorder::default());
    let mut h = home(&rec, 1_000);
    let t: Arc<str> = Arc::from("t");
    let (a, b) = (client("a"), client("b"));
    h.client_op(&t, &a, ClientOp::Subscribe { socket: true }, 1);
    h.client_op(&t, &a, ClientOp::Subscribe { socket: true }, 1);
    h.client_op(&t, &a, ClientOp::SocketGone { at: Position::ZERO }, 10);
    h.sweep(5_000);
    assert!(
        h.client_sub("t", "a").is_some(),
        "one socket still follows it"
    );
    h.client_op(&t, &a, ClientOp::SocketGone { at: Position::ZERO }, 5_000);
    h.sweep(5_999);
    assert!(h.client_sub("t", "a").is_some());
    h.sweep(6_000);
    assert!(h.client_sub("t", "a").is_none(), "expired");
    h.client_op(&t, &b, ClientOp::Subscribe { socket: false }, 7_000);
    h.client_op(&t, &b, ClientOp::Unsubscribe { socket: false }, 7_001);
    assert!(h.client_sub("t", "b").is_none());
    assert_eq!(h.client_subs(), 0);
    assert!(h.find("t").is_none(), "the topic went with its last client");
}
