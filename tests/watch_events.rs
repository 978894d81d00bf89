//! Watch events end to end through the real binary (issue 47 requirement 1, DECISIONS 13,
//! relay-api.md (a)): a service registers a watch of a client (over a socket or `POST /rpc`,
//! from any connection) and its webhook on loopback gets exactly one POST per matching
//! message, each a JWT that verifies against `GET /public-key` with exactly the spec's claims
//! (`common::watch::Service::check`):
//! - publisher `accepted`: the watched client's publishes (socket and HTTP), not another's;
//! - subscriber with a socket: `accepted`, then `delivered` when the socket acknowledges the
//!   push (as the SDK does), never `queued`; `messageId` is the push's id;
//! - subscriber without a socket (closed, or subscribed over HTTP): `accepted` + `queued`,
//!   then `delivered` by a fetch (socket or HTTP); a message acknowledged by
//!   `irn_batchReceive` is neither fetched nor `delivered` later;
//! - filters: `typ`, `sts` subsets, `tag` lists, an empty tag list (every tag);
//! - a renewal still gives one event per message, an unregistration none, a forged, expired
//!   or wrong-`act` registration none;
//! - retries: 500 then 204 gets the event again and counts one success; a 4xx is never
//!   retried;
//! - `kill -9`: the registration and the client's subscription survive (`accepted` +
//!   `queued` after the restart); a POST still being retried when the node died is not
//!   resumed (the webhook queue is memory, as for topic webhooks in DECISIONS §6: the
//!   registration is kept, calls in flight are not), the message itself waits in the
//!   client's mailbox and its fetch reports it `delivered`.
//!
//! Each case runs in memory (`--data-dir none`) and on a data directory, on one worker and
//! on four (a topic's home, the watched client's socket and the service's socket on
//! different workers). "Nothing more" checks wait [`STRAGGLERS`] after the events that
//! must come: a slow machine can only make them miss a stray event, never fail one.

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::durability::Node;
use common::jwt::Signer;
use common::wait::wait_until;
use common::watch::{
    connect_as, http_call, now, public_key, Event, Filter, Service, DAY, SERVICE, STRAGGLERS,
    SUBSCRIBER_ALL,
};
use common::webhook::Reply;
use common::ws::Ws;
use common::{topic, Server, TempDir, THREADS};
use serde_json::{json, Value};

/// Which engine and how many workers a case runs on (its `Display` labels its failures).
struct Run {
    engine: &'static str,
    threads: &'static str,
}

impl std::fmt::Display for Run {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}, --threads {}", self.engine, self.threads)
    }
}

impl Run {
    /// A new socket on another worker than `worker`, when there are several.
    fn ws_elsewhere(&self, s: &Server, worker: usize) -> Ws {
        if self.threads == "1" {
            s.ws()
        } else {
            s.ws_not_on(worker)
        }
    }
}

/// Runs `f` on each engine (memory, a data directory) at each worker count.
fn each_engine(f: impl Fn(&Server, &Run)) {
    for threads in THREADS {
        let args = ["--threads", threads, "--webhook-allow-private"];
        let s = Server::start(&args);
        f(
            &s,
            &Run {
                engine: "memory",
                threads,
            },
        );
        drop(s);
        let dir = TempDir::new("watch-events");
        let node = Node::start(&dir, &args);
        f(
            &node,
            &Run {
                engine: "durable",
                threads,
            },
        );
    }
}

/// `irn_publish` of `message` on `topic` with `tag` (answered `true`).
fn publish(ws: &mut Ws, topic: &str, message: &str, tag: u32) {
    let p = json!({"topic": topic, "message": message, "ttl": 3600, "tag": tag});
    let r = ws.call("irn_publish", p);
    assert_eq!(r["result"], true, "{r}");
}

/// `irn_subscribe` over `ws`, answered with a subscription id.
fn subscribe(ws: &mut Ws, topic: &str) {
    let r = ws.call("irn_subscribe", json!({ "topic": topic }));
    assert!(r["result"].is_string(), "{r}");
}

/// Closes `ws` and waits until the server has let its connection go.
fn close(s: &Server, ws: Ws) {
    let open = s.metric("walletrelay_websockets_open");
    drop(ws);
    let n = s.wait_metric(
        "walletrelay_websockets_open",
        Duration::from_secs(10),
        |v| v < open,
    );
    assert!(n < open, "the connection is still open ({n})");
}

/// The messages of a fetch's answer.
fn messages(r: &Value) -> Vec<&str> {
    assert_eq!(r["result"]["hasMore"], false, "{r}");
    let list = r["result"]["messages"].as_array();
    let list = list.unwrap_or_else(|| panic!("no messages: {r}"));
    list.iter()
        .map(|m| m["message"].as_str().unwrap())
        .collect()
}

/// `(path of webhook i, status, message)`, as [`Event::key`].
fn key(i: usize, status: &str, message: &str) -> (String, String, String) {
    (Service::path(i), status.into(), message.into())
}

/// The keys of `events`.
fn keys(events: &[Event]) -> Vec<(String, String, String)> {
    events.iter().map(Event::key).collect()
}

/// Asserts the claims every event of `client`'s `typ` watch on `topic` carries.
fn about(e: &Event, client: &Signer, typ: &str, topic: &str, run: &Run) {
    let c = &e.claims;
    assert_eq!(c["aud"], SERVICE, "{run}: {c}");
    assert_eq!(c["sub"], client.did(), "{run}: the watched client: {c}");
    assert_eq!(c["typ"], typ, "{run}: {c}");
    assert_eq!(c["evt"]["topic"], topic, "{run}: {c}");
    let at = c["evt"]["publishedAt"].as_u64().unwrap();
    assert_eq!(e.message_id() >> 8, at, "{run}: notice::message_id: {c}");
}

#[test]
fn a_publisher_watch_gets_one_accepted_per_publish_of_its_client_and_none_for_another() {
    each_engine(|s, run| {
        let svc = Service::ok(s);
        let (c, d) = (Signer::random(), Signer::random());
        let f = Filter {
            typ: "publisher",
            sts: &["accepted"],
            tag: &[],
        };
        svc.register(&mut s.ws(), &c, 0, f);
        let (t, u) = (topic(), topic());
        let mut sub = s.ws();
        subscribe(&mut sub, &t);
        let (mut cw, mut dw) = (connect_as(s, &c), connect_as(s, &d));
        publish(&mut dw, &t, "from d", 1100);
        publish(&mut cw, &t, "from c", 1100);
        let p = json!({"topic": u, "message": "attested", "ttl": 300, "tag": 1108,
            "attestation": "att.jwt.x"});
        assert_eq!(cw.call("irn_publish", p)["result"], true);
        let p = json!({"topic": u, "message": "over http", "ttl": 300, "tag": 4000});
        assert_eq!(http_call(s, &c, "irn_publish", p)["result"], true, "{run}");
        let ev = svc.exactly(3);
        assert_eq!(
            keys(&ev),
            [
                key(0, "accepted", "attested"),
                key(0, "accepted", "from c"),
                key(0, "accepted", "over http")
            ],
            "{run}"
        );
        for (e, topic, tag) in [(&ev[0], &u, 1108), (&ev[1], &t, 1100), (&ev[2], &u, 4000)] {
            about(e, &c, "publisher", topic, run);
            assert_eq!(e.claims["evt"]["tag"], tag, "{run}");
        }
        assert_eq!(ev[0].claims["evt"]["attestation"], "att.jwt.x", "{run}");
        assert_eq!(ev[1].claims["evt"]["attestation"], Value::Null, "{run}");
        // The id and time of the push that carried it to a subscriber.
        let push = sub.recv();
        assert_eq!(push["params"]["data"]["message"], "from d", "{push}");
        let push = sub.recv();
        assert_eq!(push["params"]["data"]["message"], "from c", "{push}");
        assert_eq!(ev[1].message_id(), push["id"].as_u64().unwrap(), "{run}");
        let at = &push["params"]["data"]["publishedAt"];
        assert_eq!(&ev[1].claims["evt"]["publishedAt"], at, "{run}");
    });
}

#[test]
fn a_subscriber_with_a_socket_gets_accepted_then_delivered_when_it_acknowledges() {
    each_engine(|s, run| {
        let svc = Service::ok(s);
        let c = Signer::random();
        let t = topic();
        let mut cw = connect_as(s, &c);
        subscribe(&mut cw, &t);
        // Registered over HTTP by another client (anyone may send it).
        svc.register_http(s, &Signer::random(), &c, 0, SUBSCRIBER_ALL);
        let mut dapp = run.ws_elsewhere(s, cw.worker);
        publish(&mut dapp, &t, "m1", 1100);
        let push = cw.recv();
        assert_eq!(push["method"], "irn_subscription", "{push}");
        let id = push["id"].as_u64().expect("a numeric push id");
        let ev = svc.exactly(1);
        assert_eq!(
            keys(&ev),
            [key(0, "accepted", "m1")],
            "{run}: not yet acked"
        );
        about(&ev[0], &c, "subscriber", &t, run);
        assert_eq!(ev[0].message_id(), id, "{run}");
        cw.send(&json!({"id": push["id"], "jsonrpc": "2.0", "result": true}));
        let ev = svc.exactly(1);
        assert_eq!(keys(&ev), [key(0, "delivered", "m1")], "{run}: no queued");
        about(&ev[0], &c, "subscriber", &t, run);
        assert_eq!(ev[0].message_id(), id, "{run}");
        assert_eq!(ev[0].claims["evt"]["tag"], 1100);
        let at = &push["params"]["data"]["publishedAt"];
        assert_eq!(&ev[0].claims["evt"]["publishedAt"], at, "{run}");
    });
}

#[test]
fn a_client_without_a_socket_gets_accepted_and_queued_then_delivered_when_it_fetches() {
    each_engine(|s, run| {
        let svc = Service::ok(s);
        let mut any = s.ws();
        let (c, h) = (Signer::random(), Signer::random());
        let (t, u) = (topic(), topic());
        // c subscribed on a socket that closed; h subscribed over POST /rpc.
        let mut cw = connect_as(s, &c);
        subscribe(&mut cw, &t);
        close(s, cw);
        let r = http_call(s, &h, "irn_subscribe", json!({ "topic": u }));
        assert!(r["result"].is_string(), "{run}: {r}");
        svc.register(&mut any, &c, 0, SUBSCRIBER_ALL);
        svc.register(&mut any, &h, 1, SUBSCRIBER_ALL);
        publish(&mut any, &t, "m1", 1100);
        publish(&mut any, &t, "m2", 1100);
        publish(&mut any, &u, "n1", 1108);
        let ev = svc.exactly(6);
        let want = [
            key(0, "accepted", "m1"),
            key(0, "accepted", "m2"),
            key(0, "queued", "m1"),
            key(0, "queued", "m2"),
            key(1, "accepted", "n1"),
            key(1, "queued", "n1"),
        ];
        assert_eq!(keys(&ev), want, "{run}");
        let id_of = |m: &str| ev.iter().find(|e| e.message() == m).unwrap().message_id();
        for e in &ev {
            let (who, topic) = if e.message() == "n1" {
                (&h, &u)
            } else {
                (&c, &t)
            };
            about(e, who, "subscriber", topic, run);
            assert_eq!(
                e.message_id(),
                id_of(e.message()),
                "{run}: one id per message"
            );
        }
        assert_ne!(id_of("m1"), id_of("m2"));

        // A fetch on a socket of c: delivered, once.
        let mut cw = connect_as(s, &c);
        let r = cw.call("irn_fetchMessages", json!({ "topic": t }));
        assert_eq!(messages(&r), ["m1", "m2"], "{run}");
        let got = svc.exactly(2);
        assert_eq!(
            keys(&got),
            [key(0, "delivered", "m1"), key(0, "delivered", "m2")]
        );
        for e in &got {
            assert_eq!(e.message_id(), id_of(e.message()), "{run}");
        }
        let r = cw.call("irn_fetchMessages", json!({ "topic": t }));
        assert!(messages(&r).is_empty(), "{run}: {r}");
        svc.nothing_more();

        // A fetch over HTTP by h.
        let r = http_call(s, &h, "irn_fetchMessages", json!({ "topic": u }));
        assert_eq!(messages(&r), ["n1"], "{run}");
        let got = svc.exactly(1);
        assert_eq!(keys(&got), [key(1, "delivered", "n1")], "{run}");
        assert_eq!(got[0].message_id(), id_of("n1"));
        let r = http_call(s, &h, "irn_fetchMessages", json!({ "topic": u }));
        assert!(messages(&r).is_empty(), "{run}: {r}");
        svc.nothing_more();
    });
}

#[test]
fn a_queued_message_pushed_when_the_client_subscribes_again_is_delivered_on_its_ack() {
    each_engine(|s, run| {
        let svc = Service::ok(s);
        let c = Signer::random();
        let t = topic();
        let mut cw = connect_as(s, &c);
        subscribe(&mut cw, &t);
        close(s, cw);
        svc.register(&mut s.ws(), &c, 0, SUBSCRIBER_ALL);
        publish(&mut s.ws(), &t, "m1", 1100);
        let ev = svc.exactly(2);
        assert_eq!(
            keys(&ev),
            [key(0, "accepted", "m1"), key(0, "queued", "m1")]
        );
        // 2.25.0's reconnect: subscribe again; the mailbox's message is pushed.
        let mut cw = connect_as(s, &c);
        subscribe(&mut cw, &t);
        let push = cw.recv();
        assert_eq!(push["params"]["data"]["message"], "m1", "{run}: {push}");
        assert_eq!(push["id"].as_u64(), Some(ev[1].message_id()), "{run}");
        svc.nothing_more();
        cw.send(&json!({"id": push["id"], "jsonrpc": "2.0", "result": true}));
        let got = svc.exactly(1);
        assert_eq!(keys(&got), [key(0, "delivered", "m1")], "{run}");
        assert_eq!(got[0].message_id(), ev[1].message_id(), "{run}");
    });
}

#[test]
fn a_message_acknowledged_by_batch_receive_is_neither_fetched_nor_delivered_later() {
    each_engine(|s, run| {
        let svc = Service::ok(s);
        let h = Signer::random();
        let u = topic();
        let r = http_call(s, &h, "irn_subscribe", json!({ "topic": u }));
        assert!(r["result"].is_string(), "{run}: {r}");
        svc.register_http(s, &h, &h, 0, SUBSCRIBER_ALL);
        let mut dapp = s.ws();
        publish(&mut dapp, &u, "r1", 1108);
        let ev = svc.exactly(2);
        assert_eq!(
            keys(&ev),
            [key(0, "accepted", "r1"), key(0, "queued", "r1")]
        );
        // What Notify server does with a queued event.
        let receipt = json!({"receipts": [{"topic": u, "message_id": ev[1].message_id()}]});
        let r = http_call(s, &h, "irn_batchReceive", receipt);
        assert_eq!(r["result"], true, "{run}: {r}");
        publish(&mut dapp, &u, "r2", 1108);
        let ev = svc.exactly(2);
        assert_eq!(
            keys(&ev),
            [key(0, "accepted", "r2"), key(0, "queued", "r2")]
        );
        let r = http_call(s, &h, "irn_fetchMessages", json!({ "topic": u }));
        assert_eq!(messages(&r), ["r2"], "{run}: r1 was received");
        let ev = svc.exactly(1);
        assert_eq!(keys(&ev), [key(0, "delivered", "r2")], "{run}");
    });
}

#[test]
fn filters_typ_sts_subsets_and_tags_an_empty_tag_list_is_every_tag() {
    each_engine(|s, run| {
        let svc = Service::ok(s);
        let mut any = s.ws();
        let c = Signer::random();
        let (t, u) = (topic(), topic());
        let r = http_call(s, &c, "irn_subscribe", json!({ "topic": t }));
        assert!(r["result"].is_string(), "{run}: {r}");
        let filters = [
            ("subscriber", &["queued"][..], &[1108][..]),
            ("subscriber", &["accepted"][..], &[][..]),
            ("subscriber", &["delivered"][..], &[1100, 1108][..]),
            (
                "publisher",
                &["accepted", "queued", "delivered"][..],
                &[4000][..],
            ),
        ];
        for (i, (typ, sts, tag)) in filters.into_iter().enumerate() {
            svc.register(&mut any, &c, i, Filter { typ, sts, tag });
        }
        publish(&mut any, &t, "m1", 1108);
        publish(&mut any, &t, "m2", 4000);
        let r = http_call(s, &c, "irn_fetchMessages", json!({ "topic": t }));
        assert_eq!(messages(&r), ["m1", "m2"], "{run}");
        // c publishes: tag 4000 for its publisher watch, 1108 for none.
        let p = json!({"topic": u, "message": "p1", "ttl": 300, "tag": 4000});
        assert_eq!(http_call(s, &c, "irn_publish", p)["result"], true);
        let p = json!({"topic": u, "message": "p2", "ttl": 300, "tag": 1108});
        assert_eq!(http_call(s, &c, "irn_publish", p)["result"], true);
        let ev = svc.exactly(5);
        let want = [
            key(0, "queued", "m1"),
            key(1, "accepted", "m1"),
            key(1, "accepted", "m2"),
            key(2, "delivered", "m1"),
            key(3, "accepted", "p1"),
        ];
        assert_eq!(keys(&ev), want, "{run}");
        assert_eq!(ev[4].claims["typ"], "publisher");
        assert_eq!(
            ev[4].claims["whu"],
            svc.hook.url(&Service::path(3)).as_str()
        );
    });
}

#[test]
fn a_renewal_gives_one_event_an_unregistration_none_a_refused_registration_none() {
    each_engine(|s, run| {
        let svc = Service::ok(s);
        let mut any = s.ws();
        let (c, b) = (Signer::random(), Signer::random());
        let (t, bt) = (topic(), topic());
        for (who, topic) in [(&c, &t), (&b, &bt)] {
            let r = http_call(s, who, "irn_subscribe", json!({ "topic": topic }));
            assert!(r["result"].is_string(), "{run}: {r}");
        }
        let f = Filter {
            typ: "subscriber",
            sts: &["queued"],
            tag: &[],
        };
        svc.register(&mut any, &c, 0, f);
        // Renewed: the same registration again, another exp.
        let renew = c.sign(&svc.claims(&c, 0, f, json!({"exp": now() + DAY})));
        let r = any.call("irn_watchRegister", json!({ "registerAuth": renew }));
        assert!(r["result"]["relayId"].is_string(), "{run}: {r}");
        // Refused, each on a webhook of its own: nothing fires there later.
        let mut forged = c.sign(&svc.claims(&c, 1, f, json!({})));
        let last = forged.pop().unwrap();
        forged.push(if last == 'A' { 'B' } else { 'A' });
        let mallory = Signer::random().sign(&svc.claims(&c, 2, f, json!({})));
        let expired = json!({"iat": now() - 2 * DAY, "exp": now() - DAY});
        let expired = c.sign(&svc.claims(&c, 3, f, expired));
        let act = json!({"act": "irn_watchUnregister"});
        let act = c.sign(&svc.claims(&c, 4, f, act));
        for (token, tag) in [
            (forged, "InvalidJwt"),
            (mallory, "InvalidJwt"),
            (expired, "InvalidJwt"),
            (act, "InvalidAction"),
        ] {
            let r = any.call("irn_watchRegister", json!({ "registerAuth": token }));
            assert_eq!(r["error"]["code"], -32000, "{run}: {r}");
            assert_eq!(r["error"]["data"], tag, "{run}: {r}");
        }
        publish(&mut any, &t, "m1", 1100);
        assert_eq!(keys(&svc.exactly(1)), [key(0, "queued", "m1")], "{run}");

        svc.unregister(&mut any, &c, 0, "subscriber");
        svc.register(&mut any, &b, 9, f);
        publish(&mut any, &t, "m2", 1100);
        publish(&mut any, &bt, "b1", 1100);
        let ev = svc.exactly(1);
        assert_eq!(keys(&ev), [key(9, "queued", "b1")], "{run}: none for m2");
        about(&ev[0], &b, "subscriber", &bt, run);
    });
}

#[test]
fn a_5xx_is_posted_again_until_a_success_and_a_4xx_is_never_retried() {
    each_engine(|s, run| {
        let svc = Service::start(s, |n| Reply::Status(if n == 0 { 500 } else { 204 }));
        let c = Signer::random();
        let f = Filter {
            typ: "publisher",
            sts: &["accepted"],
            tag: &[],
        };
        svc.register(&mut s.ws(), &c, 0, f);
        let mut cw = connect_as(s, &c);
        publish(&mut cw, &topic(), "m1", 1100);
        let (first, again) = (svc.event(), svc.event());
        assert_eq!(first.claims, again.claims, "{run}: the same event again");
        assert_eq!(first.key(), key(0, "accepted", "m1"));
        svc.nothing_more();
        let series =
            |r: &str| s.series(&format!("walletrelay_watch_events_total{{result=\"{r}\"}}"));
        assert!(wait_until(Duration::from_secs(10), || series("delivered") == 1.0));

        // A webhook that answers 422: tried once, counted rejected, never again.
        let rejecting = Service::start(s, |_| Reply::Status(422));
        rejecting.register(&mut s.ws(), &c, 1, f);
        publish(&mut cw, &topic(), "m2", 1100);
        assert_eq!(keys(&svc.exactly(1)), [key(0, "accepted", "m2")], "{run}");
        assert_eq!(rejecting.event().key(), key(1, "accepted", "m2"), "{run}");
        let done = || series("rejected") == 1.0 && series("delivered") == 2.0;
        assert!(wait_until(Duration::from_secs(10), done), "{run}");
        rejecting.nothing_more();
        assert_eq!(rejecting.hook.hits(), 1, "{run}");
        assert_eq!(series("failed"), 0.0, "{run}");
    });
}

#[test]
fn registrations_and_client_subscriptions_survive_kill_9_a_post_in_retry_does_not() {
    for threads in THREADS {
        let run = format!("--threads {threads}");
        let dir = TempDir::new("watch-events-kill");
        let args = ["--threads", threads, "--webhook-allow-private"];
        let node = Node::start(&dir, &args);
        let failing = Arc::new(AtomicBool::new(true));
        let f = failing.clone();
        let svc = Service::start(&node, move |_| {
            Reply::Status(if f.load(Ordering::SeqCst) { 500 } else { 204 })
        });
        let key_before = public_key(&node);
        let c = Signer::random();
        let t = topic();
        let mut cw = connect_as(&node, &c);
        subscribe(&mut cw, &t);
        close(&node, cw);
        let sts = Filter {
            typ: "subscriber",
            sts: &["accepted", "queued"],
            tag: &[],
        };
        svc.register(&mut node.ws(), &c, 0, sts);
        // m0's events are tried, answered 500, and wait for their retry when the node dies.
        publish(&mut node.ws(), &t, "m0", 1100);
        let mut tried = [svc.event().key(), svc.event().key()];
        tried.sort();
        assert_eq!(tried, [key(0, "accepted", "m0"), key(0, "queued", "m0")]);
        node.kill9();
        failing.store(false, Ordering::SeqCst);
        // Retries that got in before the kill are m0's.
        while let Some(seen) = svc.hook.next(STRAGGLERS) {
            assert_eq!(svc.check(&seen).message(), "m0", "{run}");
        }

        let node = Node::start(&dir, &args);
        assert_eq!(public_key(&node), key_before, "{run}");
        publish(&mut node.ws(), &t, "m1", 1100);
        let ev = svc.exactly(2);
        let want = [key(0, "accepted", "m1"), key(0, "queued", "m1")];
        assert_eq!(keys(&ev), want, "{run}: m0's retries died with the process");
        // m0 waits in the client's mailbox: its fetch reports both delivered (the
        // registration's sts does not ask for it: registered again with delivered).
        svc.register(&mut node.ws(), &c, 0, SUBSCRIBER_ALL);
        let r = connect_as(&node, &c).call("irn_fetchMessages", json!({ "topic": t }));
        assert_eq!(messages(&r), ["m0", "m1"], "{run}");
        let ev = svc.exactly(2);
        let want = [key(0, "delivered", "m0"), key(0, "delivered", "m1")];
        assert_eq!(keys(&ev), want, "{run}");
    }
}
