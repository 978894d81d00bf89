//! The table's methods read from whole messages: each method's params and refusals, and
//! what each costs.

use std::borrow::Cow;

use super::fetch::BatchReceive;
use super::publish::Publish;
use super::session::CreateTopic;
use super::subscribe::{BatchSubscribeBlocking, Subscribe, SubscribeBlocking};
use super::unsubscribe::{BatchUnsubscribe, Unsubscribe};
use super::*;
use crate::rpc::{one, Item};

fn op(s: &str) -> Result<Op<'static>, RpcError> {
    match one(s) {
        Item::Call(mut c) => parse(&mut c, 256).map(|r| r.op),
        other => panic!("not a call: {other:?}"),
    }
}

#[test]
fn decodes_publish_with_escapes() {
    let o = op(
        r#"{"id":1,"jsonrpc":"2.0","method":"waku_publish","params":{"topic":"t\"1","message":"a\nb","ttl":21600,"extra":[1,{"x":2}]}}"#,
    );
    assert_eq!(
        o,
        Ok(Op::Publish(Publish {
            topic: "t\"1".into(),
            message: "a\nb".into(),
            ttl: 21600,
            prompt: true,
            tag: 0,
            attestation: None,
        }))
    );
}

#[test]
fn params_errors_name_the_param() {
    let e = |s: &str| op(s).unwrap_err();
    assert_eq!(
        e(r#"{"id":1,"jsonrpc":"2.0","method":"waku_subscribe","params":{}}"#).message,
        "Missing or invalid \"topic\" param"
    );
    assert_eq!(
        e(r#"{"id":1,"jsonrpc":"2.0","method":"waku_subscribe","params":{"topic":""}}"#).code,
        -32602
    );
    assert_eq!(e(r#"{"id":1,"jsonrpc":"2.0","method":"waku_publish","params":{"topic":"a","message":"b","ttl":0}}"#).message, "Missing or invalid \"ttl\" param");
    assert_eq!(e(r#"{"id":1,"jsonrpc":"2.0","method":"waku_publish","params":{"topic":"a","message":"b","ttl":2592001}}"#).code, -32602);
    assert_eq!(e(r#"{"id":1,"jsonrpc":"2.0","method":"waku_publish","params":{"topic":"a","message":"b","ttl":1.5}}"#).code, -32602);
    assert_eq!(e(r#"{"id":1,"jsonrpc":"2.0","method":"waku_publish","params":{"topic":"a","message":7,"ttl":5}}"#).message, "Missing or invalid \"message\" param");
    assert_eq!(
        e(r#"{"id":1,"jsonrpc":"2.0","method":"waku_unsubscribe","params":{"topic":"a"}}"#).message,
        "Missing or invalid \"id\" param"
    );
    assert_eq!(
        e(r#"{"id":1,"jsonrpc":"2.0","method":"nope","params":{}}"#).code,
        -32601
    );
    assert_eq!(
        e(r#"{"id":1,"jsonrpc":"2.0","method":"waku_subscribe","params":[1]}"#).code,
        -32602
    );
    let long = format!(
        r#"{{"id":1,"jsonrpc":"2.0","method":"waku_subscribe","params":{{"topic":"{}"}}}}"#,
        "a".repeat(257)
    );
    assert_eq!(e(&long).code, -32602);
}

#[test]
fn decodes_the_methods_of_today_s_relay() {
    let t = "ab".repeat(32);
    let call = |m: &str, p: &str| {
        op(&format!(
            r#"{{"id":1,"jsonrpc":"2.0","method":"{m}","params":{p}}}"#
        ))
    };
    assert_eq!(
        call("irn_unsubscribe", &format!(r#"{{"topic":"{t}"}}"#)),
        Ok(Op::Unsubscribe(Unsubscribe {
            topic: Some(t.clone().into()),
            id: None
        }))
    );
    assert_eq!(
        call(
            "irn_batchUnsubscribe",
            &format!(r#"{{"subscriptions":[{{"topic":"{t}"}}]}}"#)
        ),
        Ok(Op::BatchUnsubscribe(BatchUnsubscribe {
            subs: vec![(t.clone().into(), None)]
        }))
    );
    // An id alone is still required without a topic, and under the beta prefix.
    assert_eq!(call("irn_unsubscribe", "{}").unwrap_err().code, -32602);
    assert_eq!(
        call("waku_unsubscribe", &format!(r#"{{"topic":"{t}"}}"#))
            .unwrap_err()
            .code,
        -32602
    );
    assert_eq!(
        call(
            "iridium_subscribeBlocking",
            &format!(r#"{{"topic":"{t}"}}"#)
        ),
        Ok(Op::SubscribeBlocking(SubscribeBlocking {
            topic: t.clone().into()
        }))
    );
    assert_eq!(
        call(
            "irn_batchSubscribeBlocking",
            &format!(r#"{{"topics":["{t}"]}}"#)
        ),
        Ok(Op::BatchSubscribeBlocking(BatchSubscribeBlocking {
            topics: vec![t.clone().into()]
        }))
    );
    assert_eq!(
        call("wc_createTopic", &format!(r#"{{"topic":"{t}"}}"#)),
        Ok(Op::CreateTopic(CreateTopic {
            topic: t.clone().into()
        }))
    );
    assert_eq!(
        call(
            "irn_batchReceive",
            &format!(
                r#"{{"receipts":[{{"topic":"{t}","message_id":5}},{{"messageId":"6","topic":"{t}"}}]}}"#
            )
        ),
        Ok(Op::BatchReceive(BatchReceive {
            receipts: vec![(t.clone().into(), 5), (t.clone().into(), 6)]
        }))
    );
    let e = call("irn_batchReceive", r#"{"receipts":[]}"#).unwrap_err();
    assert_eq!(
        (e.code, e.data),
        (-32600, Some(crate::rpc::ErrorData::Tag("BatchEmpty")))
    );
    for m in ["waku_subscribeBlocking", "waku_batchReceive", "wc_nothing"] {
        assert_eq!(call(m, "{}").unwrap_err().code, -32601, "{m}");
    }
}

#[test]
fn new_methods_cost_what_their_nearest_method_costs() {
    let t = || Cow::Borrowed("t");
    let one = Op::Subscribe(Subscribe { topic: t() }).cost();
    assert_eq!(one.subscribes, 1);
    for op in [
        Op::SubscribeBlocking(SubscribeBlocking { topic: t() }),
        Op::CreateTopic(CreateTopic { topic: t() }),
    ] {
        let c = op.cost();
        assert_eq!((c.subscribes, c.publishes, c.bytes), (1, 0, 0));
    }
    let c = Op::BatchSubscribeBlocking(BatchSubscribeBlocking {
        topics: vec![t(), t(), t()],
    })
    .cost();
    assert_eq!((c.subscribes, c.publishes), (3, 0));
    let c = Op::BatchReceive(BatchReceive {
        receipts: vec![(t(), 1)],
    })
    .cost();
    assert_eq!((c.subscribes, c.publishes, c.bytes), (0, 0, 0));
}

#[test]
fn names_are_known_under_their_prefixes_only() {
    let known = |m: &str| lookup(m).map(|(d, _)| d);
    assert_eq!(known("waku_publish"), Some(Dialect::Waku));
    assert_eq!(known("iridium_publish"), Some(Dialect::Iridium));
    assert_eq!(known("irn_watchRegister"), Some(Dialect::Irn));
    assert_eq!(known("wc_createTopic"), Some(Dialect::Irn));
    for m in [
        "publish",
        "waku_watchRegister",
        "irn_wc_createTopic",
        "iridium_",
    ] {
        assert!(known(m).is_none(), "{m}");
    }
}
