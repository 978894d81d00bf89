//! Unit tests of a home's topics.

use super::*;
use crate::engine::Origin;
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
        body: crate::message::Body::encode("t", body, crate::message::Meta::default()),
        ttl: 60,
        prompt: true,
        origin: Origin::NONE,
        hash: None,
        publisher: None,
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
fn a_topic_is_found_by_its_name_whichever_allocation_carries_it() {
    let mut h = topics(Limits::default());
    let (a1, a2): (Arc<str>, Arc<str>) = (Arc::from("a"), Arc::from("a"));
    let seq = |h: &mut HomeTopics, t: &Arc<str>, body: &str, now: u64| match h
        .store(&req(t, body), body.len() as u64, now)
        .stored
    {
        Stored::New(p) => p.seq,
        Stored::Duplicate => 0,
    };
    // Created by a1 (the shortcut knows a1), then found by a2 as well: one topic.
    assert_eq!(seq(&mut h, &a1, "x", 1), 1);
    assert_eq!(seq(&mut h, &a2, "yy", 2), 2);
    assert_eq!(seq(&mut h, &a1, "zzz", 3), 3);
    // Forgotten, its slot reused by another topic: a1 still means "a", and "b" keeps its own.
    h.sweep(3 + 60_000);
    assert_eq!(h.find("a"), None);
    let b: Arc<str> = Arc::from("b");
    assert_eq!(seq(&mut h, &b, "x", 70_000), 1);
    assert_eq!(seq(&mut h, &a1, "x", 70_001), 1);
    assert_eq!(seq(&mut h, &b, "yy", 70_002), 2);
    assert_eq!(h.read("a", Position::ZERO).messages.len(), 1);
    assert_eq!(h.read("b", Position::ZERO).messages.len(), 2);
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
    let (one, two) = (1 << 40, 2 << 40);
    t.hashes.note(one);
    t.hashes.note(one);
    t.hashes.note(two);
    t.hashes.forget(one);
    assert!(
        t.hashes.may_contain(one),
        "one copy of hash 1 is still cached"
    );
    t.hashes.forget(one);
    assert!(!t.hashes.may_contain(one));
    t.hashes.forget(7 << 40); // never noted: nothing happens
    t.hashes.forget(two);
    assert_eq!(t.hashes.len(), 0);
    assert_eq!(t.hashes.capacity(), 0, "an empty filter keeps no table");
}

#[test]
fn webhooks_are_kept_once_and_bounded() {
    let mut h = topics(Limits {
        max_webhooks_per_topic: 1,
        ..Limits::default()
    });
    let t: Arc<str> = Arc::from("t");
    assert_eq!(
        h.add_webhook(&t, Arc::from("http://a/")),
        Ok(WebhookAdded::New)
    );
    assert_eq!(
        h.add_webhook(&t, Arc::from("http://a/")),
        Ok(WebhookAdded::Exists)
    );
    assert_eq!(
        h.add_webhook(&t, Arc::from("http://b/")),
        Err(RelayError::TooManyWebhooksForTopic)
    );
    assert_eq!(
        h.remove_webhook("t", "http://a/"),
        WebhookRemoved::Unrecorded
    );
    assert_eq!(h.remove_webhook("t", "http://a/"), WebhookRemoved::NotThere);
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
    assert!(
        h.find("t").is_some(),
        "the home's unwatch leaves the others'"
    );
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

/// A record's place in a log that no test reads (the home only hands it back).
fn loc(n: u32) -> Loc {
    Loc {
        segment: 1,
        offset: n * 64,
        len: 64,
    }
}

fn pos(epoch: u64, seq: u64) -> Position {
    Position { epoch, seq }
}

/// What `v1_take` gave: (frame, position).
fn taken(h: &mut HomeTopics, topic: &str) -> Vec<(String, Position)> {
    h.v1_take(topic)
        .into_iter()
        .map(|(f, p, _)| (String::from_utf8_lossy(&f).into_owned(), p))
        .collect()
}

fn restore_frame(h: &mut HomeTopics, t: &Arc<str>, at: Position, body: &'static str, n: u32) {
    let frame = crate::arcbuf::ArcBuf::copy_from_slice(body.as_bytes());
    h.v1_restore(t, at, frame, 60_000, loc(n));
}

// Epochs of an earlier run are far smaller than the ones this process makes (`new_epoch`).
const EARLIER: u64 = 1_000;

#[test]
fn a_restored_v1_frame_is_taken_at_the_position_its_record_names() {
    let mut h = topics(Limits::default());
    let t: Arc<str> = Arc::from("t");
    restore_frame(&mut h, &t, pos(EARLIER, 3), "a", 0);
    restore_frame(&mut h, &t, pos(EARLIER, 4), "b", 1);
    // A frame kept after the restart goes on in the same history.
    let kept = h.v1_keep(&t, Bytes::from_static(b"c"), 60_000, Origin::NONE);
    assert_eq!(kept.map(|k| k.1), Some(pos(EARLIER, 5)));
    // The positions a take reports are the ones the Forget records name: they must be the
    // records' own, or the frames come back at the next start.
    assert_eq!(
        taken(&mut h, "t"),
        [
            ("a".to_string(), pos(EARLIER, 3)),
            ("b".to_string(), pos(EARLIER, 4)),
            ("c".to_string(), pos(EARLIER, 5)),
        ]
    );
}

#[test]
fn restoring_v1_frames_keeps_one_copy_of_a_position_and_only_the_newest_history() {
    let mut h = topics(Limits::default());
    let t: Arc<str> = Arc::from("t");
    // In position order, as recovery sorts them: a frame left from an older history (its
    // topic was forgotten since: it was not pending any more), then two frames of the
    // newest one, the second also in a compaction's copy that a kill left beside it.
    restore_frame(&mut h, &t, pos(EARLIER, 1), "old", 0);
    restore_frame(&mut h, &t, pos(EARLIER + 1, 1), "x", 1);
    restore_frame(&mut h, &t, pos(EARLIER + 1, 2), "y", 2);
    restore_frame(&mut h, &t, pos(EARLIER + 1, 2), "y", 3);
    let mut released = Vec::new();
    h.take_released(&mut released);
    released.sort_by_key(|l| l.offset);
    assert_eq!(released, [loc(0), loc(3)], "the stale frame and the copy");
    assert_eq!(
        taken(&mut h, "t"),
        [
            ("x".to_string(), pos(EARLIER + 1, 1)),
            ("y".to_string(), pos(EARLIER + 1, 2)),
        ]
    );
}

#[test]
fn v1_frames_keep_their_own_history_beside_the_v2_cache() {
    let mut h = topics(Limits::default());
    let t: Arc<str> = Arc::from("t");
    let m = |seq, body: &'static str| Message {
        pos: pos(EARLIER, seq),
        body: crate::message::Body::encode("t", body, crate::message::Meta::default()),
        origin: Origin::NONE,
    };
    assert!(h.restore(&t, m(1, "m1"), 1, 60_000, loc(0)));
    assert!(h.restore(&t, m(2, "m2"), 2, 60_000, loc(1)));
    // No frame came back, but Forgets of this epoch may still be on disk (positions 1 and 2
    // of the topic's v1 frames, taken before the restart): a new frame must not take one
    // of their positions, or the next start would cancel it.
    let (_, p) = h
        .v1_keep(&t, Bytes::from_static(b"f"), 60_000, Origin::NONE)
        .unwrap();
    assert!(p.epoch > EARLIER, "{p:?}");
    // And frames do not move the v2 cache's history.
    let hist = h.read("t", Position::ZERO);
    assert_eq!(hist.last, pos(EARLIER, 2));
    let Stored::New(next) = h.store(&req(&t, "m3"), 3, 1).stored else {
        panic!()
    };
    assert_eq!(next, pos(EARLIER, 3));
}

#[test]
fn a_frame_kept_after_a_restart_comes_after_every_forgotten_position_of_its_history() {
    let mut h = topics(Limits::default());
    let t: Arc<str> = Arc::from("t");
    restore_frame(&mut h, &t, pos(EARLIER, 2), "a", 0);
    // Frames 3 and 4 were taken (their Forgets were read back), frame 2 was not (it came
    // back): the next frame is 5, never a position a Forget on disk names.
    h.v1_forgotten("t", pos(EARLIER, 3));
    h.v1_forgotten("t", pos(EARLIER, 4));
    h.v1_forgotten("t", pos(EARLIER - 1, 9));
    h.v1_forgotten("unknown", pos(EARLIER, 9));
    assert_eq!(h.find("unknown"), None, "a Forget creates no topic");
    let kept = h.v1_keep(&t, Bytes::from_static(b"b"), 60_000, Origin::NONE);
    assert_eq!(kept.map(|k| k.1), Some(pos(EARLIER, 5)));
}
