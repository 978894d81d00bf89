//! Unit tests of a home's topics.

use super::*;
use crate::relay::engine::Origin;
use bytes::Bytes;

fn topics(limits: Limits) -> HomeTopics {
    HomeTopics::new(
        0,
        64,
        1 << 20,
        limits,
        Metrics::new(1),
        Arc::new(AtomicUsize::new(0)),
    )
}

fn req(topic: &Arc<str>, body: &str) -> PublishReq {
    PublishReq {
        topic: topic.clone(),
        data: Bytes::copy_from_slice(body.as_bytes()),
        ttl: 60,
        prompt: true,
        origin: Origin::NONE,
    }
}

#[test]
fn positions_count_stored_messages_and_skip_duplicates() {
    let mut h = topics(Limits::default());
    let t: Arc<str> = Arc::from("t");
    let a = h.store(&req(&t, "one"), 3, 1).stored;
    let dup = h.store(&req(&t, "one"), 3, 2).stored;
    let b = h.store(&req(&t, "two"), 3, 3).stored;
    let (Stored::New(a), Stored::New(b)) = (a, b) else {
        panic!("{a:?} {b:?}");
    };
    assert_eq!(dup, Stored::Duplicate);
    assert_eq!((a.seq, b.seq), (1, 2));
    assert_eq!(a.epoch, b.epoch);
    let hist = h.read("t", Position::ZERO);
    assert_eq!(hist.last, b);
    assert_eq!(hist.messages.len(), 2);
    let after_a = h.read("t", a);
    assert_eq!(after_a.messages.len(), 1);
    assert_eq!(after_a.messages[0].pos, b);
    // A position of another epoch means nothing here: the whole cache is returned.
    let other = Position {
        epoch: a.epoch - 1,
        seq: 5,
    };
    assert_eq!(h.read("t", other).messages.len(), 2);
}

#[test]
fn a_forgotten_topic_comes_back_in_a_new_epoch() {
    let mut h = topics(Limits::default());
    let t: Arc<str> = Arc::from("t");
    let Stored::New(first) = h.store(&req(&t, "x"), 1, 1).stored else {
        panic!()
    };
    h.sweep(1 + 60_000);
    assert_eq!(h.find("t"), None, "expired and unwatched: forgotten");
    let Stored::New(again) = h.store(&req(&t, "x"), 1, 70_000).stored else {
        panic!()
    };
    assert_eq!(again.seq, 1);
    assert!(again.epoch > first.epoch);
}

#[test]
fn the_per_topic_cap_evicts_the_oldest_but_positions_go_on() {
    let mut h = topics(Limits {
        max_cached_per_topic: 2,
        ..Limits::default()
    });
    let t: Arc<str> = Arc::from("t");
    for body in ["a", "bb", "ccc"] {
        h.store(&req(&t, body), body.len() as u64, 1);
    }
    let hist = h.read("t", Position::ZERO);
    let seqs: Vec<u64> = hist.messages.iter().map(|m| m.pos.seq).collect();
    assert_eq!(seqs, [2, 3]);
    assert_eq!(hist.last.seq, 3);
    // An evicted message is new again.
    let again = h.store(&req(&t, "a"), 1, 2).stored;
    assert!(matches!(again, Stored::New(p) if p.seq == 4));
}

#[test]
fn a_topics_hash_filter_counts_copies_and_lets_its_memory_go_when_empty() {
    let mut t = HomeTopic::new(Arc::from("t"));
    t.note(1);
    t.note(1);
    t.note(2);
    t.forget(1);
    assert!(
        t.hashes.contains_key(&1),
        "one copy of hash 1 is still cached"
    );
    t.forget(1);
    assert!(!t.hashes.contains_key(&1));
    t.forget(7); // never noted: nothing happens
    t.forget(2);
    assert!(t.hashes.is_empty());
    assert_eq!(t.hashes.capacity(), 0, "an empty filter keeps no table");
}

#[test]
fn webhooks_are_kept_once_and_bounded() {
    let mut h = topics(Limits {
        max_webhooks_per_topic: 1,
        ..Limits::default()
    });
    let t: Arc<str> = Arc::from("t");
    assert_eq!(h.add_webhook(&t, Arc::from("http://a/")), Ok(true));
    assert_eq!(h.add_webhook(&t, Arc::from("http://a/")), Ok(false));
    assert_eq!(
        h.add_webhook(&t, Arc::from("http://b/")),
        Err(RelayError::TooManyWebhooksForTopic)
    );
    assert_eq!(h.remove_webhook("t", "http://a/"), Some(None));
    assert_eq!(h.remove_webhook("t", "http://a/"), None);
    assert_eq!(h.find("t"), None, "nothing left: forgotten");
}

#[test]
fn the_home_keeps_no_state_for_a_topic_only_its_own_subscribers_watch() {
    let mut h = topics(Limits::default());
    let t: Arc<str> = Arc::from("t");
    h.watch(&t, 0);
    assert_eq!(h.find("t"), None, "watched by the home alone: nothing kept");
    assert_eq!(h.read("t", Position::ZERO).last, Position::ZERO);
    // Another worker's watch is kept, and goes with its unwatch.
    h.watch(&t, 1);
    let slot = h.find("t").unwrap();
    assert_eq!(h.get(slot).unwrap().watchers, vec![1]);
    h.unwatch("t", 0);
    assert!(h.find("t").is_some(), "the home's unwatch leaves the others'");
    h.unwatch("t", 1);
    assert_eq!(h.find("t"), None);
    // The first message of a topic nobody else watches starts a history that a
    // subscription at ZERO follows on from (a new epoch, position 1).
    let Stored::New(p) = h.store(&req(&t, "m"), 9, 1).stored else {
        panic!()
    };
    assert_eq!(p.seq, 1);
    assert!(p.epoch > Position::ZERO.epoch);
}
