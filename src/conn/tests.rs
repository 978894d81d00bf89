//! The connection state machine without a socket: bytes in through `conn::process`, bytes
//! out of its `OutBuf`, against a relay whose engine answers when the test says so.

use std::sync::Arc;

use clap::Parser;

use super::outbound::{PushTo, Writing};
use super::{process, Conn, Ctx, HttpWait, IdSource, Phase, Shared, Tools, Turn, WsState};
use crate::config::Config;
use crate::engine::{Events, History};
use crate::http::response::{Response, TEXT};
use crate::metrics::Metrics;
use crate::registry::answers::AnswerCache;
use crate::registry::Registry;
use crate::relay::{
    Deliveries, Delivery, Dialect, Done, Engine, Event, Origin, Position, PublishReq, Relay,
    RelayError, Stored, SubId, Ticket,
};
use crate::webhook::WebhookPool;

/// An engine that answers nothing by itself: every publish and read is answered later, by
/// the test, through the engine's mailbox (as a store's helper thread would).
struct Later {
    publishes: Arc<std::sync::Mutex<Vec<Ticket>>>,
    reads: Arc<std::sync::Mutex<Vec<Ticket>>>,
    inbox: crossbeam_channel::Receiver<Event>,
}

impl Engine for Later {
    fn publish(
        &mut self,
        _: PublishReq,
        t: Ticket,
        _: &mut Events,
    ) -> Done<Result<Stored, RelayError>> {
        if let Ok(mut p) = self.publishes.lock() {
            p.push(t);
        }
        Done::Later
    }
    fn read(&mut self, _: &Arc<str>, _: Position, t: Ticket, _: &mut Events) {
        if let Ok(mut r) = self.reads.lock() {
            r.push(t);
        }
    }
    fn watch(&mut self, _: &Arc<str>, _: &mut Events) {}
    fn unwatch(&mut self, _: &Arc<str>, _: &mut Events) {}
    fn add_webhook(
        &mut self,
        _: &Arc<str>,
        _: Arc<str>,
        _: Ticket,
        _: &mut Events,
    ) -> Done<Result<(), RelayError>> {
        Done::Later
    }
    fn remove_webhook(&mut self, _: &Arc<str>, _: &Arc<str>) {}
    fn v1_publish(&mut self, _: crate::engine::V1Publish, _: &mut Events) {}
    fn v1_take(&mut self, _: &Arc<str>, _: Ticket, _: &mut Events) {}
    fn v1_watch(&mut self, _: &Arc<str>, _: i32, _: &mut Events) {}
    fn on_mail(&mut self, budget: usize, out: &mut Events) -> usize {
        let before = out.len();
        out.extend(self.inbox.try_iter().take(budget));
        out.len() - before
    }
    fn has_mail(&self) -> bool {
        !self.inbox.is_empty()
    }
    fn tick(&mut self, _: u64, _: &mut Events) {}
    fn flush(&mut self, _: &mut Events) -> crate::engine::Handoff {
        crate::engine::Handoff::Done
    }
}

/// One connection and everything `process` needs.
struct Bench {
    conn: Conn<()>,
    shared: Shared,
    relay: Relay,
    publishes: Arc<std::sync::Mutex<Vec<Ticket>>>,
    reads: Arc<std::sync::Mutex<Vec<Ticket>>>,
    /// The engine's mailbox, sending half.
    mail: crossbeam_channel::Sender<Event>,
    tools: Tools,
    /// Messages each `feed` may handle (`Ctx::turn`).
    turn: usize,
}

/// The relay's deliveries applied to the one connection, as `worker/apply.rs` would.
fn apply(relay: &mut Relay, conn: &mut Conn<()>, d: Deliveries) {
    for one in &d.list {
        match one {
            Delivery::Push { at, msg, .. } => {
                let (s, _) = relay.sub_at(*at).expect("the pushed subscription");
                let (sub, dialect) = (s.id, s.dialect);
                let m = &d.messages[*msg as usize];
                let mut enc = Vec::new();
                let to = PushTo {
                    id: &sub,
                    dialect,
                    push_id: m.push_id,
                    live: true,
                };
                let w = Writing {
                    fill_mark: 1 << 16,
                    share_min: 1 << 16,
                    scratch: &mut enc,
                };
                conn.deliver(to, &m.body, w);
            }
            Delivery::Fetched(f) => {
                let f = &**f;
                let result = f.result.clone();
                super::fetch::resolve(conn, f.answer, &f.topic, f.after, Origin::NONE, result);
            }
            Delivery::Answer { answer, result, .. } => {
                conn.resolve(*answer, *result);
            }
            Delivery::Text { frame, .. } => {
                let (frame, _) = &d.frames[*frame as usize];
                conn.deliver_text(frame, true, 1 << 16, 1 << 16);
            }
            Delivery::Unacked { .. } | Delivery::Webhook { .. } => {}
        }
    }
    relay.recycle(d);
}

impl Bench {
    fn new(args: &[&str]) -> Bench {
        let config = Config::parse_from(["walletrelay"].iter().chain(args));
        let metrics = Metrics::new(1);
        let (mail, inbox) = crossbeam_channel::unbounded();
        let engine = Later {
            publishes: Arc::default(),
            reads: Arc::default(),
            inbox,
        };
        let (publishes, reads) = (engine.publishes.clone(), engine.reads.clone());
        let relay = Relay::new(
            0,
            1,
            Box::new(engine),
            config.limits.clone(),
            metrics.clone(),
        );
        let registry = Registry::load(None, &config.image_base).unwrap();
        let notifier = Arc::new(crate::notify::Notifier::memory(Arc::new(
            crate::identity::RelayKey::from_seed(&[5; 32]),
        )));
        Bench {
            conn: Conn::new((), 1, u64::MAX),
            shared: Shared {
                metrics,
                webhooks: WebhookPool::default(),
                relay_key: notifier.key().clone(),
                notifier,
                watch_reply: Arc::new(|_, _, _, _| {}),
                hello: Response::new(200, TEXT, "Hello World, this is WalletRelay v2.0"),
                health: Arc::default(),
                layouts: Arc::default(),
                layout_switch: None,
                drain: Arc::new(crate::drain::Drain::new(std::time::Duration::ZERO)),
                exporters: Vec::new(),
                limit_policy: crate::limits::Policy::new(&config.limits, 1),
                config,
                projects: None,
            },
            relay,
            publishes,
            reads,
            mail,
            tools: Tools {
                ids: IdSource::default(),
                scratch: Vec::new(),
                json: simd_json::Buffers::new(1024),
                registry: Arc::new(registry),
                answers: AnswerCache::new(0),
                deflate: super::DeflateKit::default(),
                gate: crate::auth::Gate::new(Vec::new(), false, None),
                limits: crate::limits::Limiter::new(crate::limits::Policy::new(
                    &crate::config::Limits::default(),
                    1,
                )),
                stopping: false,
            },
            turn: usize::MAX,
        }
    }

    /// Feeds bytes; returns how many were consumed.
    fn feed(&mut self, bytes: &[u8]) -> usize {
        let mut input = bytes.to_vec();
        let mut ctx = Ctx {
            me: 0,
            key: 0,
            time: super::Time {
                ms: 1,
                date: b"Thu, 01 Jan 1970 00:00:00 GMT",
            },
            shared: &self.shared,
            relay: &mut self.relay,
            tools: &mut self.tools,
            turn: Turn::new(self.turn, usize::MAX),
        };
        process(&mut self.conn, &mut input, &mut ctx).0
    }

    /// Everything the connection would write now.
    fn written(&mut self) -> Vec<u8> {
        let mut out = Vec::new();
        loop {
            let _ = self.conn.out.write_to(&mut out);
            if !self.conn.refill(1 << 16, &mut self.tools.scratch) {
                return out;
            }
        }
    }

    /// The text messages the connection would write now (after a 101, on a WebSocket).
    fn texts(&mut self) -> Vec<String> {
        let bytes = self.written();
        let mut texts = Vec::new();
        let mut pos = 0;
        while pos + 2 <= bytes.len() {
            let (len, off) = match bytes[pos + 1] {
                126 => (
                    usize::from(u16::from_be_bytes([bytes[pos + 2], bytes[pos + 3]])),
                    4,
                ),
                n => (usize::from(n), 2),
            };
            assert_eq!(bytes[pos], 0x81, "a final text frame");
            let body = &bytes[pos + off..pos + off + len];
            texts.push(String::from_utf8(body.to_vec()).unwrap());
            pos += off + len;
        }
        texts
    }

    /// The engine says `ev` (through the mailbox, as a store's helper would).
    fn inject(&mut self, ev: Event) {
        self.mail.send(ev).unwrap();
        self.relay.on_mail(usize::MAX);
        let d = self.relay.deliver();
        apply(&mut self.relay, &mut self.conn, d);
    }

    /// The store answers publish number `i` (in publish order).
    fn store_answers(&mut self, i: usize, result: Result<Stored, RelayError>) {
        let ticket = self.publishes.lock().unwrap()[i];
        self.inject(Event::Published { ticket, result });
    }

    fn upgrade(&mut self) {
        let req = b"GET /?protocol=wc&version=2 HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\n\
            Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\
            Sec-WebSocket-Version: 13\r\n\r\n";
        assert_eq!(self.feed(req), req.len());
        let head = String::from_utf8(self.written()).unwrap();
        assert!(head.starts_with("HTTP/1.1 101 "), "{head}");
        assert!(matches!(self.conn.phase, Phase::Ws(_)));
    }
}

/// A masked client text frame.
fn text(payload: &str) -> Vec<u8> {
    let p = payload.as_bytes();
    let mask = [1u8, 2, 3, 4];
    let mut f = vec![0x81];
    if p.len() < 126 {
        f.push(0x80 | p.len() as u8);
    } else {
        f.push(0x80 | 126);
        f.extend_from_slice(&(p.len() as u16).to_be_bytes());
    }
    f.extend_from_slice(&mask);
    f.extend(p.iter().enumerate().map(|(i, b)| b ^ mask[i % 4]));
    f
}

fn publish(id: u64, topic: &str) -> String {
    format!(
        r#"{{"id":{id},"jsonrpc":"2.0","method":"waku_publish","params":{{"topic":"{topic}","message":"m","ttl":60}}}}"#
    )
}

#[test]
fn pipelined_http_requests_are_answered_in_order_and_an_upgrade_elsewhere_is_404() {
    let mut b = Bench::new(&[]);
    let reqs = b"GET /hello HTTP/1.1\r\nHost: x\r\n\r\n\
        GET /api/v1/wallets HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
        Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n";
    assert_eq!(b.feed(reqs), reqs.len());
    let out = String::from_utf8(b.written()).unwrap();
    let first = out.find("Hello World, this is WalletRelay v2.0").unwrap();
    let second = out.find("HTTP/1.1 404 Not Found").unwrap();
    assert!(first < second, "{out}");
    assert!(out.ends_with("{\"error\":\"not found\"}"), "{out}");
    assert!(matches!(b.conn.phase, Phase::Http(HttpWait::Nothing)));
}

/// `/ready` on the public port: 204, 503 while the engine fails, 503 `draining` once the
/// drain began; `/metrics` there only without `--admin-listen`.
#[test]
fn ready_follows_health_and_the_drain_and_metrics_move_to_the_admin_address() {
    let status = |b: &mut Bench, path: &str| {
        let req = format!("GET {path} HTTP/1.1\r\nHost: x\r\n\r\n");
        assert_eq!(b.feed(req.as_bytes()), req.len());
        String::from_utf8(b.written()).unwrap()
    };
    let mut b = Bench::new(&[]);
    assert!(status(&mut b, "/ready").starts_with("HTTP/1.1 204 "));
    let m = status(&mut b, "/metrics");
    assert!(m.starts_with("HTTP/1.1 200 "), "{m}");
    assert!(m.contains("\nwalletrelay_ready 1\n") && m.contains("\nwalletrelay_draining 0\n"));
    assert!(m.contains("walletrelay_build_info{version=\""), "{m}");
    b.shared
        .health
        .report("storage w0", Some("disk full".into()));
    let r = status(&mut b, "/ready");
    assert!(
        r.starts_with("HTTP/1.1 503 ") && r.ends_with(r#"{"error":"storage w0: disk full"}"#),
        "{r}"
    );
    assert!(status(&mut b, "/metrics").contains("\nwalletrelay_ready 0\n"));
    b.shared.health.report("storage w0", None);
    b.shared.drain.begin(5);
    let r = status(&mut b, "/ready");
    assert!(
        r.starts_with("HTTP/1.1 503 ") && r.ends_with(r#"{"error":"draining"}"#),
        "{r}"
    );
    assert!(status(&mut b, "/metrics").contains("\nwalletrelay_draining 1\n"));
    let mut b = Bench::new(&["--admin-listen", "127.0.0.1:0"]);
    assert!(status(&mut b, "/metrics").starts_with("HTTP/1.1 404 "));
    assert!(status(&mut b, "/ready").starts_with("HTTP/1.1 204 "));
}

#[test]
fn answers_leave_in_request_order_while_a_publish_waits_for_its_store() {
    let mut b = Bench::new(&[]);
    b.upgrade();
    let sub = r#"{"id":2,"jsonrpc":"2.0","method":"waku_subscribe","params":{"topic":"t"}}"#;
    let mut input = text(&publish(1, "t"));
    input.extend(text(sub));
    input.extend(text(&publish(3, "u")));
    assert_eq!(b.feed(&input), input.len());
    assert!(
        b.texts().is_empty(),
        "everything waits behind the first publish"
    );
    assert_eq!(b.conn.backlog.pending_answers(), 2);
    // The second publish's store answers first: still nothing may leave.
    b.store_answers(1, Err(RelayError::StorageUnavailable));
    assert!(b.texts().is_empty());
    b.store_answers(0, Ok(Stored::Duplicate));
    let texts = b.texts();
    assert_eq!(texts.len(), 3, "{texts:?}");
    assert_eq!(texts[0], r#"{"id":1,"jsonrpc":"2.0","result":true}"#);
    assert!(texts[1].starts_with(r#"{"id":2,"jsonrpc":"2.0","result":""#));
    assert_eq!(
        texts[2],
        r#"{"id":3,"jsonrpc":"2.0","error":{"code":-32000,"message":"storage unavailable"}}"#
    );
}

/// Stores answered mostly in the order they were asked for, some out of it, a batch's two
/// apart, with answers leaving in between (so where a resolve starts looking moves on, and
/// back as the backlog drains): each answer is its own store's, all leave in request order.
#[test]
fn waiting_answers_resolve_in_whatever_order_their_stores_complete() {
    let mut b = Bench::new(&[]);
    b.upgrade();
    let mut input: Vec<u8> = (1..=6).flat_map(|i| text(&publish(i, "t"))).collect();
    input.extend(text(&format!("[{},{}]", publish(7, "t"), publish(8, "t"))));
    input.extend((9..=12).flat_map(|i| text(&publish(i, "t"))));
    assert_eq!(b.feed(&input), input.len());
    assert_eq!(b.conn.backlog.pending_answers(), 12);
    // Tickets in publish order: ids 1-6 are 0-5, the batch's two 6 and 7, ids 9-12 8-11.
    let ok = |b: &mut Bench, i| b.store_answers(i, Ok(Stored::Duplicate));
    ok(&mut b, 0);
    ok(&mut b, 1);
    let mut texts = b.texts();
    assert_eq!(texts.len(), 2);
    b.store_answers(3, Err(RelayError::StorageUnavailable));
    assert!(b.texts().is_empty(), "id 3 still waits");
    for i in [2, 4, 5, 7] {
        ok(&mut b, i);
    }
    texts.extend(b.texts());
    assert_eq!(texts.len(), 6, "the batch waits for its first");
    for i in [9, 6, 8, 11, 10] {
        ok(&mut b, i);
    }
    texts.extend(b.texts());
    assert_eq!(b.conn.backlog.pending_answers(), 0);
    let result = |id| format!(r#"{{"id":{id},"jsonrpc":"2.0","result":true}}"#);
    let mut want: Vec<String> = (1..=6).map(result).collect();
    want[3] = r#"{"id":4,"jsonrpc":"2.0","error":{"code":-32000,"message":"storage unavailable"}}"#
        .to_string();
    want.push(format!("[{},{}]", result(7), result(8)));
    want.extend((9..=12).map(result));
    assert_eq!(texts, want);
}

#[test]
fn a_batch_with_a_waiting_publish_is_one_array_in_order() {
    let mut b = Bench::new(&[]);
    b.upgrade();
    let batch = format!(
        r#"[{},{{"id":"x","jsonrpc":"2.0","method":"nope","params":{{}}}},{{"id":9,"result":true}}]"#,
        publish(7, "t")
    );
    let input = text(&batch);
    assert_eq!(b.feed(&input), input.len());
    assert!(b.texts().is_empty());
    b.store_answers(0, Ok(Stored::New(Position { epoch: 1, seq: 1 })));
    let texts = b.texts();
    assert_eq!(texts.len(), 1);
    let v: serde_json::Value = serde_json::from_str(&texts[0]).unwrap();
    assert_eq!(v[0]["id"], 7);
    assert_eq!(v[0]["result"], true);
    assert_eq!(v[1]["id"], "x");
    assert_eq!(v[1]["error"]["code"], -32601);
    assert_eq!(
        v.as_array().unwrap().len(),
        2,
        "the acknowledgement has no answer"
    );
}

#[test]
fn input_waits_past_the_pending_answers_limit_and_a_half_close_keeps_the_answers() {
    let mut b = Bench::new(&[]);
    b.shared.config.limits.max_pending_answers = 2;
    b.upgrade();
    let input: Vec<u8> = (1..=3).flat_map(|i| text(&publish(i, "t"))).collect();
    let used = b.feed(&input);
    assert!(used < input.len(), "the third publish waits in the buffer");
    assert_eq!(b.conn.backlog.pending_answers(), 2);
    assert!(b.conn.input_blocked(2));
    b.store_answers(0, Ok(Stored::Duplicate));
    assert!(!b.conn.input_blocked(2));
    // The peer half-closes: the answers it is owed still go out, pushes do not.
    let to = PushTo {
        id: &SubId::from_bytes(&[1; 32]),
        dialect: Dialect::Waku,
        push_id: 1,
        live: true,
    };
    let w = Writing {
        fill_mark: 0,
        share_min: 0,
        scratch: &mut Vec::new(),
    };
    let body = crate::message::Body::encode("t", "{}", crate::message::Meta::default());
    b.conn.deliver(to, &body, w);
    b.conn.finish(1, 1000);
    b.store_answers(1, Ok(Stored::Duplicate));
    let out = b.written();
    let s = String::from_utf8_lossy(&out);
    assert!(
        s.contains(r#"{"id":1,"jsonrpc":"2.0","result":true}"#),
        "{s}"
    );
    assert!(
        s.contains(r#"{"id":2,"jsonrpc":"2.0","result":true}"#),
        "{s}"
    );
    assert!(!s.contains("waku_subscription"), "{s}");
}

#[test]
fn a_live_message_that_comes_before_the_history_is_pushed_after_it() {
    let mut b = Bench::new(&[]);
    b.upgrade();
    let sub = r#"{"id":1,"jsonrpc":"2.0","method":"waku_subscribe","params":{"topic":"t"}}"#;
    b.feed(&text(sub));
    assert_eq!(
        b.texts().len(),
        1,
        "the subscription id is answered at once"
    );
    let pos = |seq| Position { epoch: 4, seq };
    let msg = |seq: u64| crate::relay::Message {
        pos: pos(seq),
        body: crate::message::Body::encode(
            "t",
            &format!("n{seq}"),
            crate::message::Meta::default(),
        ),
        origin: crate::relay::Origin::NONE,
    };
    let topic: Arc<str> = Arc::from("t");
    b.inject(Event::Live {
        topic: topic.clone(),
        msg: msg(2),
    });
    assert!(b.texts().is_empty(), "held while the history is awaited");
    let ticket = b.reads.lock().unwrap()[0];
    let history = History {
        last: pos(1),
        messages: vec![msg(1)],
    };
    b.inject(Event::History {
        ticket,
        result: Ok(history),
    });
    let texts = b.texts();
    assert_eq!(texts.len(), 2, "{texts:?}");
    let data = |n| format!(r#""data":{{"topic":"t","message":"n{n}"}}}}}}"#);
    assert!(texts[0].ends_with(&data(1)), "{}", texts[0]);
    assert!(texts[1].ends_with(&data(2)), "{}", texts[1]);
}

/// Idle memory per connection (issue 24: no higher than before the limits, when `WsState`
/// took mimalloc's 160-byte class and a slab entry 256 bytes): the WebSocket state stays in
/// the 128-byte class and the slab entry at 256 bytes with a release build's socket (one
/// file descriptor; debug builds of mio add a selector id to it).
#[test]
fn per_connection_state_stays_in_its_size_classes() {
    use std::mem::size_of;
    /// `slab::Entry`, whose slots the worker's slab holds.
    #[allow(dead_code, reason = "only measured")]
    enum SlabEntry<T> {
        Vacant(usize),
        Occupied(T),
    }
    assert!(size_of::<WsState>() <= 128, "{}", size_of::<WsState>());
    assert!(size_of::<crate::ws::Decoder>() <= 40);
    assert!(size_of::<crate::limits::ConnBuckets>() <= 40);
    assert!(size_of::<crate::limits::ConnLimit>() <= 10);
    assert!(size_of::<crate::limits::Handle>() <= 4);
    // A pending answer's outcome stays the size of a fetch's (every queued item holds one).
    assert!(
        size_of::<super::outbound::Gathered>() <= 40,
        "{}",
        size_of::<super::outbound::Gathered>()
    );
    let entry = size_of::<SlabEntry<Conn<std::os::fd::OwnedFd>>>();
    assert!(entry <= 256, "{entry}");
    assert!(size_of::<Conn>() <= 272, "{}", size_of::<Conn>());
}

#[test]
fn a_connection_hands_the_worker_back_after_its_turn_and_resumes_where_it_stopped() {
    let mut b = Bench::new(&[]);
    b.upgrade();
    b.turn = 2;
    let sub = |id: u64, t: &str| {
        text(&format!(
            r#"{{"id":{id},"jsonrpc":"2.0","method":"waku_subscribe","params":{{"topic":"{t}"}}}}"#
        ))
    };
    let (one, two, three) = (sub(1, "a"), sub(2, "b"), sub(3, "c"));
    let input = [one.clone(), two.clone(), three.clone()].concat();
    // Two messages this turn; the third is left unconsumed, whole, for the next.
    assert_eq!(b.feed(&input), one.len() + two.len());
    let texts = b.texts();
    assert_eq!(texts.len(), 2, "{texts:?}");
    assert!(texts[0].starts_with(r#"{"id":1,"#), "{texts:?}");
    assert!(texts[1].starts_with(r#"{"id":2,"#), "{texts:?}");
    assert_eq!(b.feed(&three), three.len());
    let texts = b.texts();
    assert_eq!(texts.len(), 1, "{texts:?}");
    assert!(texts[0].starts_with(r#"{"id":3,"#), "{texts:?}");
}
