//! `rpc::decode` on a mutable copy of arbitrary bytes (with parser buffers reused across
//! inputs, as a worker reuses its own), then `conn::methods::parse` on every call: no panic, and every
//! answer the server would write for it (result, error, push data) is valid JSON.
#![no_main]

use std::cell::RefCell;

use libfuzzer_sys::fuzz_target;
use walletrelay::conn::methods::{self, Op};
use walletrelay::rpc::{self, Incoming, Item};

/// `max_topic` of the default `Limits`.
const MAX_TOPIC: usize = 256;

fn valid_json(v: &[u8]) {
    if let Err(e) = serde_json::from_slice::<serde_json::Value>(v) {
        panic!(
            "server would write invalid JSON ({e}): {}",
            String::from_utf8_lossy(v)
        );
    }
}

fn item(it: Item<'_>) {
    let mut out = Vec::new();
    match it {
        Item::Ack(_) => {}
        Item::Invalid(id, e) => {
            rpc::write_error(&mut out, &id, &e);
            valid_json(&out);
        }
        Item::Call(mut call) => {
            let id = call.id.clone();
            let _ = call.method();
            let res = methods::parse(&mut call, MAX_TOPIC);
            let id = id.unwrap_or(rpc::Id::Null);
            match res {
                Ok(req) => {
                    if let Op::Publish(methods::publish::Publish {
                        topic,
                        message,
                        ttl,
                        tag,
                        attestation,
                        ..
                    }) = &req.op
                    {
                        assert!(!topic.is_empty() && topic.len() <= MAX_TOPIC);
                        assert!((1..=rpc::MAX_TTL).contains(&u64::from(*ttl)));
                        valid_json(&rpc::encode_data(topic, message));
                        // The stored body is JSON in both shapes, and reads back as itself.
                        let meta = walletrelay::message::Meta {
                            published_at: 1_700_000_000_000,
                            tag: *tag,
                            attestation: attestation.as_deref(),
                            plain: req.plain.0,
                        };
                        let body = walletrelay::message::Body::encode(topic, message, meta);
                        valid_json(body.irn());
                        // Strings the decoder called plain need no escape: the body is
                        // the one written after looking at each of them.
                        let looked = walletrelay::message::Meta {
                            plain: false,
                            ..meta
                        };
                        let again = walletrelay::message::Body::encode(topic, message, looked);
                        assert_eq!(body.irn(), again.irn());
                        let back = walletrelay::message::Body::from_stored(body.irn().clone());
                        assert_eq!(back.as_ref(), Some(&body));
                    }
                    rpc::write_result(&mut out, &id, b"true");
                }
                Err(e) => rpc::write_error(&mut out, &id, &e),
            }
            valid_json(&out);
        }
        Item::V1(f) => {
            // Every v1 frame the decoder accepts is re-sent (to its subscribers, or from the
            // pending list) as `encode_pub`: that must round-trip to the same frame.
            let wire = rpc::v1::encode_pub(&f.topic, &f.payload, f.silent);
            valid_json(&wire);
            let mut again = wire.clone();
            match rpc::decode(&mut again, &mut simd_json::Buffers::new(256)) {
                Ok(Incoming::Single(Item::V1(g))) => {
                    assert_eq!(
                        (&g.topic, &g.payload, g.silent),
                        (&f.topic, &f.payload, f.silent)
                    );
                }
                other => panic!("re-encoded v1 frame did not decode as one: {other:?}"),
            }
        }
    }
}

thread_local! {
    static BUFFERS: RefCell<simd_json::Buffers> = RefCell::new(simd_json::Buffers::new(4096));
}

fuzz_target!(|data: &[u8]| {
    let mut buf = data.to_vec();
    BUFFERS.with(|b| {
        let mut scratch = b.borrow_mut();
        match rpc::decode(&mut buf, &mut scratch) {
            Err(_) => {}
            Ok(Incoming::Single(it)) => item(it),
            Ok(Incoming::Batch(items)) => items.into_iter().for_each(item),
        }
    });
});
