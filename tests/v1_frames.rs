//! WalletConnect 1.0 bridge frames on the relay's socket (DECISIONS §8, issue 17), byte for
//! byte through a raw WebSocket client, at one worker and at four (topics homed on another
//! worker than their clients): a `pub` reaches every other v1 subscriber and not its
//! publisher; a `pub` nobody listens to is kept pending and handed to the next `sub`, oldest
//! first, then gone; v1 and v2 topics of the same name are apart; malformed frames get -32600
//! with `id: null` and change nothing; the metrics count v1 frames under `protocol="v1"`.
//!
//! "Nothing came" is checked with a barrier, never with a pause: a later frame that must
//! arrive through the same home worker (so after anything sent before it), or a ping whose
//! pong must be the very next frame. A `sub` is in place at the topic's home once the
//! subscriber's pong came back (its worker hands messages for other workers on before it
//! writes any socket).

mod common;

use common::v1::{client_frame, null_id_error, sent_pub};
use common::{each_server, topic, RawWs, Server};
use serde_json::json;

/// Opens `n` v1 subscribers of `tp`, each in place at the topic's home.
fn subscribers(s: &Server, tp: &str, n: usize) -> Vec<RawWs> {
    (0..n)
        .map(|i| {
            let mut c = RawWs::open(s);
            c.v1_sub(tp);
            c.settled(&format!("subscriber {i}"));
            c
        })
        .collect()
}

#[test]
fn a_pub_reaches_every_other_subscriber_byte_for_byte_and_not_its_publisher() {
    each_server(&[], |s| {
        let tp = topic();
        let mut v = subscribers(s, &tp, 3);
        let (a, rest) = v.split_at_mut(1);
        let (a, (b, c)) = (&mut a[0], rest.split_at_mut(1));
        let (b, c) = (&mut b[0], &mut c[0]);

        a.v1_pub(&tp, "p1", Some(true));
        b.expect_text(&sent_pub(&tp, "p1", true), "B");
        c.expect_text(&sent_pub(&tp, "p1", true), "C");
        // A's next frame is B's pub: its own p1 never came back to it.
        b.v1_pub(&tp, "p2", Some(false));
        a.expect_text(&sent_pub(&tp, "p2", false), "A");
        c.expect_text(&sent_pub(&tp, "p2", false), "C");
        // Without `silent` the frame goes on with `"silent":false`; key order and spacing
        // of the client's frame do not matter, the frame sent on is always the same.
        c.send_text(&format!(
            "{{ \"payload\" : \"p3\", \"type\":\"pub\",\n \"topic\": \"{tp}\" }}"
        ));
        a.expect_text(&sent_pub(&tp, "p3", false), "A");
        b.expect_text(&sent_pub(&tp, "p3", false), "B");
        // Characters JSON escapes are escaped again, the same way.
        a.v1_pub(&tp, "say \"hi\" \\ é/\u{1}", None);
        let want = format!(
            "{{\"topic\":\"{tp}\",\"type\":\"pub\",\"payload\":\"say \\\"hi\\\" \\\\ é/\\u0001\",\"silent\":false}}"
        );
        b.expect_text(&want, "B");
        c.expect_text(&want, "C");
        // `ack`s (the 1.0 client sends one per frame it gets) are consumed: no answer.
        b.v1_ack(&tp);
        for (x, who) in [(a, "A"), (b, "B"), (c, "C")] {
            x.settled(who);
        }
    });
}

#[test]
fn a_pub_nobody_listens_to_is_pending_for_the_next_sub_oldest_first_then_gone() {
    each_server(&[], |s| {
        let tp = topic();
        let mut a = RawWs::open(s);
        for p in ["p1", "p2", "p3"] {
            a.v1_pub(&tp, p, Some(true));
        }
        a.settled("publisher");

        // The next sub gets them at once, oldest first, byte for byte.
        let mut b = RawWs::open(s);
        b.v1_sub(&tp);
        for p in ["p1", "p2", "p3"] {
            b.expect_text(&sent_pub(&tp, p, true), "first subscriber");
        }
        b.settled("first subscriber");

        // They are gone: a second subscriber, and the first one subscribing again, get
        // nothing of them; their next frame is the next pub.
        let mut c = RawWs::open(s);
        c.v1_sub(&tp);
        c.settled("second subscriber");
        b.v1_sub(&tp);
        b.settled("first subscriber, again");
        a.v1_pub(&tp, "p4", Some(true));
        b.expect_text(&sent_pub(&tp, "p4", true), "first subscriber");
        c.expect_text(&sent_pub(&tp, "p4", true), "second subscriber");
        for (x, who) in [(&mut b, "first"), (&mut c, "second")] {
            x.settled(who);
        }
    });
}

#[test]
fn a_pub_whose_only_subscriber_is_its_publisher_is_kept_for_the_next_sub() {
    each_server(&[], |s| {
        let tp = topic();
        let mut a = RawWs::open(s);
        a.v1_sub(&tp);
        a.settled("publisher");
        a.v1_pub(&tp, "for-the-peer", None);
        a.settled("publisher");
        let mut b = RawWs::open(s);
        b.v1_sub(&tp);
        b.expect_text(&sent_pub(&tp, "for-the-peer", false), "peer");
        b.settled("peer");
        // Now that the topic has another subscriber, a pub goes live both ways.
        b.v1_pub(&tp, "back", None);
        a.expect_text(&sent_pub(&tp, "back", false), "publisher");
        a.settled("publisher");
    });
}

#[test]
fn v1_and_v2_topics_of_the_same_name_are_apart() {
    each_server(&[], |s| {
        let tp = topic();
        let mut v2 = RawWs::open(s);
        let id = v2.subscribe(&tp);
        let mut v1 = subscribers(s, &tp, 1).remove(0);
        let mut publ = RawWs::open(s);

        // A v1 pub reaches the v1 subscriber only; a v2 publish the v2 subscriber only.
        publ.v1_pub(&tp, "v1-live", None);
        v1.expect_text(&sent_pub(&tp, "v1-live", false), "v1 subscriber");
        let n = publ.call(
            "waku_publish",
            json!({"topic": tp, "message": "v2-live", "ttl": 60}),
        );
        assert_eq!(
            publ.recv_json(),
            json!({"id": n, "jsonrpc": "2.0", "result": true})
        );
        let push = v2.recv_json();
        assert_eq!(push["params"]["id"], id.as_str(), "{push}");
        assert_eq!(
            push["params"]["data"],
            json!({"topic": tp, "message": "v2-live"}),
            "the v2 subscriber's next push is the v2 message, not the v1 pub"
        );
        publ.v1_pub(&tp, "v1-barrier", None);
        v1.expect_text(&sent_pub(&tp, "v1-barrier", false), "v1 subscriber");

        // Kept messages are apart too: a v1 pending frame is no v2 history, a v2 cached
        // message no v1 pending frame.
        let tp2 = topic();
        publ.v1_pub(&tp2, "v1-pending", None);
        let n = publ.call(
            "waku_publish",
            json!({"topic": tp2, "message": "v2-cached", "ttl": 60}),
        );
        assert_eq!(publ.recv_json()["id"], n);
        let mut late_v2 = RawWs::open(s);
        let id2 = late_v2.subscribe(&tp2);
        let push = late_v2.recv_json();
        assert_eq!(push["params"]["id"], id2.as_str(), "{push}");
        assert_eq!(push["params"]["data"]["message"], "v2-cached", "{push}");
        late_v2.settled("late v2 subscriber");
        let mut late_v1 = RawWs::open(s);
        late_v1.v1_sub(&tp2);
        late_v1.expect_text(&sent_pub(&tp2, "v1-pending", false), "late v1 subscriber");
        late_v1.settled("late v1 subscriber");
        for (x, who) in [(&mut v2, "v2"), (&mut v1, "v1"), (&mut publ, "publisher")] {
            x.settled(who);
        }
    });
}

/// Frames meant as v1 frames (they have `type`, no `jsonrpc` nor `method`) that are not
/// valid ones, and the exact error message each gets.
fn malformed(tp: &str) -> Vec<(String, String)> {
    let long = "a".repeat(257);
    let ty = "Invalid v1 frame: \"type\" must be pub, sub or ack";
    let topic = "Invalid v1 frame: missing or invalid \"topic\"";
    let payload = "Invalid v1 frame: missing or invalid \"payload\"";
    [
        (client_frame(tp, "put", "x", None), ty),
        (format!(r#"{{"topic":"{tp}","type":5,"payload":"x"}}"#), ty),
        (
            format!(r#"{{"topic":"{tp}","type":null,"payload":"x"}}"#),
            ty,
        ),
        (r#"{"type":"pub","payload":"x"}"#.to_string(), topic),
        (client_frame("", "pub", "x", None), topic),
        (
            r#"{"topic":7,"type":"sub","payload":""}"#.to_string(),
            topic,
        ),
        (format!(r#"{{"topic":"{tp}","type":"pub"}}"#), payload),
        (
            format!(r#"{{"topic":"{tp}","type":"pub","payload":{{"a":1}}}}"#),
            payload,
        ),
        (
            format!(r#"{{"topic":"{tp}","type":"pub","payload":"x","silent":"yes"}}"#),
            "Invalid v1 frame: \"silent\" must be a boolean",
        ),
        (
            client_frame(&long, "pub", "x", None),
            "Invalid v1 frame: \"topic\" longer than 256 bytes",
        ),
    ]
    .into_iter()
    .map(|(f, m)| (f, null_id_error(-32600, m)))
    .collect()
}

#[test]
fn malformed_v1_frames_get_32600_with_a_null_id_and_change_nothing() {
    each_server(&[], |s| {
        let tp = topic();
        let mut sub = subscribers(s, &tp, 1).remove(0);
        let mut c = RawWs::open(s);
        for (frame, answer) in malformed(&tp) {
            c.send_text(&frame);
            c.expect_text(&answer, &format!("answer to {frame}"));
        }
        // A v1 frame inside a JSON-RPC batch: an error in the batch's answer.
        c.send_text(&format!("[{}]", client_frame(&tp, "pub", "batched", None)));
        c.expect_text(
            &format!(
                "[{}]",
                null_id_error(-32600, "Invalid request: a v1 frame inside a batch")
            ),
            "batch",
        );
        // With `jsonrpc` it is no v1 frame (§8), and without `method`, `result` or `error`
        // no JSON-RPC request or response: -32600, nothing published.
        c.send_text(&format!(
            r#"{{"jsonrpc":"2.0","topic":"{tp}","type":"pub","payload":"x"}}"#
        ));
        c.expect_text(
            &null_id_error(
                -32600,
                r#"Invalid request: no "method", and no "result" or "error""#,
            ),
            "v1 members with jsonrpc",
        );
        // With a `result` too, it is a JSON-RPC response: consumed, not published.
        c.send_text(&format!(
            r#"{{"jsonrpc":"2.0","result":true,"topic":"{tp}","type":"pub","payload":"x"}}"#
        ));
        c.settled("client after its bad frames");
        // None of them was published: the subscriber's next frame is the valid pub.
        c.v1_pub(&tp, "valid", None);
        sub.expect_text(&sent_pub(&tp, "valid", false), "subscriber");
        sub.settled("subscriber");
        assert!(s.metric("walletrelay_rpc_errors_total") >= 11.0);
    });
}

#[test]
fn metrics_count_v1_frames_under_protocol_v1() {
    each_server(&[], |s| {
        let tp = topic();
        // Two pending frames, taken by the first subscriber.
        let mut publ = RawWs::open(s);
        publ.v1_pub(&tp, "pending-1", None);
        publ.v1_pub(&tp, "pending-2", None);
        publ.settled("publisher");
        let mut first = RawWs::open(s);
        first.v1_sub(&tp);
        first.expect_text(&sent_pub(&tp, "pending-1", false), "first subscriber");
        first.expect_text(&sent_pub(&tp, "pending-2", false), "first subscriber");
        first.settled("first subscriber");
        let mut subs = subscribers(s, &tp, 1);
        subs.insert(0, first);
        // Three live frames to both subscribers.
        for i in 0..3 {
            publ.v1_pub(&tp, &format!("live-{i}"), Some(i == 0));
        }
        for (k, sub) in subs.iter_mut().enumerate() {
            for i in 0..3 {
                sub.expect_text(
                    &sent_pub(&tp, &format!("live-{i}"), i == 0),
                    &format!("subscriber {k}"),
                );
            }
        }
        assert_eq!(
            s.v1_metric("walletrelay_messages_published_total"),
            5.0,
            "pubs"
        );
        assert_eq!(
            s.v1_metric("walletrelay_messages_delivered_total"),
            2.0 + 2.0 * 3.0,
            "frames delivered: 2 pending + 2 x 3 live"
        );
        // The v2 series (no protocol label) count none of them.
        let text = s.metrics_text().unwrap_or_default();
        for name in [
            "walletrelay_messages_published_total",
            "walletrelay_messages_delivered_total",
        ] {
            let v2: f64 = text
                .lines()
                .filter(|l| l.starts_with(&format!("{name}{{")) && !l.contains("protocol="))
                .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
                .sum();
            assert_eq!(v2, 0.0, "{name} without a protocol label");
        }
        // v1 subscriptions are subscriptions.
        assert_eq!(s.metric("walletrelay_subscriptions"), 2.0);
        drop(subs);
        s.wait_unsubscribed(0.0);
    });
}

#[test]
fn a_pub_right_after_the_last_subscriber_left_is_kept_for_the_next_sub() {
    // At four workers the subscriber's worker is mostly not the topic's home: the home must
    // hear of the close before a pub that follows it, or the pub goes to nobody.
    let s = Server::start(&["--threads", "4"]);
    for i in 0..12 {
        let tp = topic();
        let mut gone = subscribers(&s, &tp, 1).remove(0);
        // The close handshake, then the client hangs up.
        gone.send_close(Some(1000), "");
        assert_eq!(gone.frame().close_code(), Some(1000), "round {i}");
        drop(gone);
        s.wait_unsubscribed(0.0);
        let mut publ = RawWs::open(&s);
        publ.v1_pub(&tp, "after", None);
        publ.settled("publisher");
        let mut next = RawWs::open(&s);
        next.v1_sub(&tp);
        next.expect_text(&sent_pub(&tp, "after", false), &format!("round {i}"));
    }
}

#[test]
fn a_connection_that_pubs_then_subs_gets_its_own_pending_frame_at_any_worker_count() {
    // One write carries the `pub` and the `sub`, so the worker reads both in one round;
    // sixteen topics put some of them on the connection's own worker (its home), where the
    // `sub` once took effect before the `pub` it follows.
    each_server(&[], |s| {
        let mut a = RawWs::open(s);
        for i in 0..16 {
            let tp = topic();
            let mut both = a.masked_frame(0x81, client_frame(&tp, "pub", "mine", None).as_bytes());
            both.extend(a.masked_frame(0x81, client_frame(&tp, "sub", "", None).as_bytes()));
            a.send_raw(&both);
            a.expect_text(&sent_pub(&tp, "mine", false), &format!("topic {i}"));
        }
        a.settled("the connection");
    });
}
