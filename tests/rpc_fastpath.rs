//! The fast path of `rpc::decode` against the general parser (`serde` + `simd-json`, the
//! reference): for every message the fast path handles, both give the same result (then the
//! same `conn::methods::parse`), on the real clients' requests (tests/e2e-sdk/WIRE.md, loadtest's
//! encoder), on generated requests of the usual shape with random ids, topics, messages,
//! ttls and tags (escapes, unicode, edge numbers, whitespace, member orders, unknown and
//! duplicate members) and on mutations of them; and the fast path does handle the usual
//! shapes (it cannot silently decline everything).

use proptest::prelude::*;
use walletrelay::conn::methods;
use walletrelay::rpc::{self, Incoming, Item};

/// `max_topic` of the default limits.
const MAX_TOPIC: usize = 256;

/// The general parser's result on a copy of `msg`.
fn general(msg: &[u8]) -> Result<Incoming<'static>, rpc::ParseError> {
    let buf: &'static mut [u8] = Box::leak(msg.to_vec().into_boxed_slice());
    rpc::decode_general(buf, &mut simd_json::Buffers::default())
}

/// `conn::methods::parse` of a single call.
fn op(i: Incoming<'_>) -> Option<Result<methods::Request<'_>, rpc::RpcError>> {
    match i {
        Incoming::Single(Item::Call(mut c)) => Some(methods::parse(&mut c, MAX_TOPIC)),
        _ => None,
    }
}

/// Checks agreement; returns whether the fast path handled `msg`.
fn agree(msg: &[u8]) -> bool {
    let Some(fast) = rpc::decode_fast(msg) else {
        return false;
    };
    let reference = general(msg);
    assert_eq!(
        Ok(&fast),
        reference.as_ref(),
        "fast path differs on {}",
        String::from_utf8_lossy(msg)
    );
    // And so does everything computed from it.
    if let Ok(reference) = reference {
        let fast = op(fast);
        if let Some(Ok(req)) = &fast {
            // The fast path calls its strings plain (the encoder then writes them without
            // looking): each must be one JSON writes as it is.
            assert!(req.plain.0, "{}", String::from_utf8_lossy(msg));
            for s in strings(&req.op) {
                let written = serde_json::to_string(s).unwrap();
                assert_eq!(written, format!("\"{s}\""), "called plain: {s:?}");
            }
        }
        assert_eq!(fast, op(reference));
    }
    // `decode` itself takes the fast path and gives the same.
    let mut buf = msg.to_vec();
    let mut again = msg.to_vec();
    assert_eq!(
        rpc::decode(&mut buf, &mut simd_json::Buffers::default()),
        rpc::decode_general(&mut again, &mut simd_json::Buffers::default())
    );
    true
}

/// Every string of an operation.
fn strings<'o>(op: &'o methods::Op<'_>) -> Vec<&'o str> {
    use methods::Op;
    match op {
        Op::Subscribe(m) => vec![&m.topic],
        Op::FetchMessages(m) => vec![&m.topic],
        Op::BatchSubscribe(methods::subscribe::BatchSubscribe { topics })
        | Op::BatchFetchMessages(methods::fetch::BatchFetchMessages { topics })
        | Op::BatchSubscribeBlocking(methods::subscribe::BatchSubscribeBlocking { topics }) => {
            topics.iter().map(|t| &**t).collect()
        }
        Op::Publish(m) => [Some(&*m.topic), Some(&*m.message), m.attestation.as_deref()]
            .into_iter()
            .flatten()
            .collect(),
        Op::Unsubscribe(m) => [m.topic.as_deref(), m.id.as_deref()]
            .into_iter()
            .flatten()
            .collect(),
        Op::BatchUnsubscribe(m) => m
            .subs
            .iter()
            .flat_map(|(t, i)| [Some(&**t), i.as_deref()])
            .flatten()
            .collect(),
        Op::SubscribeBlocking(m) => vec![&m.topic],
        Op::CreateTopic(m) => vec![&m.topic],
        Op::BatchReceive(m) => m.receipts.iter().map(|(t, _)| &**t).collect(),
        Op::ProposeSession(m) => vec![&m.pairing_topic, &m.proposal],
        Op::ApproveSession(m) => vec![
            &m.session_topic,
            &m.pairing_topic,
            &m.response,
            &m.settlement,
        ],
        Op::WatchRegister(m) => vec![&m.auth],
        Op::WatchUnregister(m) => vec![&m.auth],
    }
}

/// What the SDK and loadtest send (tests/e2e-sdk/WIRE.md, loadtest/src/proto).
const REAL: &[&str] = &[
    r#"{"id":"1795638982153439488","jsonrpc":"2.0","method":"wc_proposeSession","params":{"pairingTopic":"2ee50ea3261266d46407d97c1ed343d1063984728d8c621932533a929dfb0f68","sessionProposal":"AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8gISIjJCUmJygpKissLS4vMDEyMzQ1Njc4OTo7PD0+P0BBQkNERUZHSElKS0xNTk9QUVJTVFVWV1hZWltcXV5fYGFiY2RlZmdoaWprbG1ub3BxcnN0dXZ3eHl6e3x9fn8=","ttl":300,"correlationId":1795638982149978}}"#,
    r#"{"id":"1795638982166306048","jsonrpc":"2.0","method":"irn_subscribe","params":{"topic":"2ee50ea3261266d46407d97c1ed343d1063984728d8c621932533a929dfb0f68"}}"#,
    r#"{"id":66,"jsonrpc":"2.0","result":true}"#,
    r#"{"id":"1795638982196598016","jsonrpc":"2.0","method":"wc_approveSession","params":{"sessionTopic":"ab1b6b64d02ba6393f716eb0c15068325b8695005a7d32ef435df257fe2def6c","pairingTopic":"2ee50ea3261266d46407d97c1ed343d1063984728d8c621932533a929dfb0f68","sessionProposalResponse":"AAEC","sessionSettlementRequest":"AAECAwQ=","ttl":300,"correlationId":1795638982149978,"approvedChains":["eip155:1"],"approvedMethods":["personal_sign","eth_sendTransaction"],"approvedEvents":["chainChanged","accountsChanged"]}}"#,
    r#"{"id":"1795638982218767360","jsonrpc":"2.0","method":"irn_publish","params":{"topic":"ab1b6b64d02ba6393f716eb0c15068325b8695005a7d32ef435df257fe2def6c","message":"AAECAwQFBgcICQ==","ttl":300,"prompt":false,"tag":1103,"correlationId":1795638982195974}}"#,
    r#"{"id":"1795638982221395200","jsonrpc":"2.0","method":"irn_publish","params":{"topic":"ab1b6b64d02ba6393f716eb0c15068325b8695005a7d32ef435df257fe2def6c","message":"AAECAwQFBgcICQ==","ttl":900,"prompt":true,"tag":1108,"correlationId":1795638982221335,"rpcMethods":["personal_sign"],"chainId":"eip155:1","txHashes":[],"contractAddresses":[]}}"#,
    r#"{"id":"1795638982230310144","jsonrpc":"2.0","method":"irn_publish","params":{"topic":"ab1b6b64d02ba6393f716eb0c15068325b8695005a7d32ef435df257fe2def6c","message":"AAEC","ttl":900,"prompt":false,"tag":1109,"correlationId":1795638982221335,"rpcMethods":["personal_sign"],"chainId":"eip155:1","txHashes":["0xabababababababababababababababababababababababababababababababababababababababababababababababababababababababababababababababab01"],"contractAddresses":[]}}"#,
    r#"{"id":"1795638982753453824","jsonrpc":"2.0","method":"irn_batchSubscribe","params":{"topics":["2ee50ea3261266d46407d97c1ed343d1063984728d8c621932533a929dfb0f68","ab1b6b64d02ba6393f716eb0c15068325b8695005a7d32ef435df257fe2def6c"]}}"#,
    r#"{"id":"1795638938114774272","jsonrpc":"2.0","method":"irn_unsubscribe","params":{"topic":"6c32985bfd20065b80861840f0a37f44670004d854eb554adfe912f8cadf1f37","id":"cb1665d03614a7aadd326eaf7605ec68a85430a3c228a15807fc4e2693efb373"}}"#,
    r#"{"id":1000000000005,"jsonrpc":"2.0","method":"waku_publish","params":{"topic":"abcd","message":"00000000000000100000000200000003","ttl":30}}"#,
    r#"{"id":9,"jsonrpc":"2.0","method":"waku_subscribe","params":{"topic":"tt"}}"#,
    r#"{"id":1234567890123456,"jsonrpc":"2.0","result":true}"#,
    r#"{"jsonrpc": "2.0", "method": "waku_subscription", "params": {"data": {"message": "00ff", "topic": "t"}, "id": "x"}, "id": 7}"#,
    r#"{"topic":"abc","type":"pub","payload":"{\"x\":1}","silent":true}"#,
    r#"{"topic":"abc","type":"sub","payload":""}"#,
    r#"{"id":1,"jsonrpc":"2.0","method":"irn_batchUnsubscribe","params":{"subscriptions":[{"topic":"a","id":"b"},{"id":"c","topic":"d","x":[1]}]}}"#,
    r#"{"id":1,"jsonrpc":"2.0","method":"irn_batchFetchMessages","params":{"topics":["a",1,{"topic":"b"},[],null]}}"#,
];

#[test]
fn the_real_clients_requests_take_the_fast_path_and_agree() {
    for m in REAL {
        let handled = agree(m.as_bytes());
        // The v1 frame with an escaped payload goes to the general parser; all else is fast.
        assert_eq!(handled, !m.contains('\\'), "{m}");
    }
}

#[test]
fn edge_cases_agree_or_are_declined() {
    let cases: &[&str] = &[
        r#"{"id":18446744073709551615,"jsonrpc":"2.0","method":"m"}"#,
        r#"{"id":9999999999999999999,"jsonrpc":"2.0","method":"m"}"#,
        r#"{"id":9223372036854775807,"jsonrpc":"2.0","method":"m"}"#,
        r#"{"id":9223372036854775808,"jsonrpc":"2.0","method":"m"}"#,
        r#"{"id":-9223372036854775807,"jsonrpc":"2.0","method":"m"}"#,
        r#"{"id":-9223372036854775808,"jsonrpc":"2.0","method":"m"}"#,
        r#"{"id":-0,"jsonrpc":"2.0","method":"m"}"#,
        r#"{"id":0,"jsonrpc":"2.0","method":"m"}"#,
        r#"{"id":01,"jsonrpc":"2.0","method":"m"}"#,
        r#"{"id":1.0,"jsonrpc":"2.0","method":"m"}"#,
        r#"{"id":1e3,"jsonrpc":"2.0","method":"m"}"#,
        r#"{"id":-,"jsonrpc":"2.0","method":"m"}"#,
        r#"{"id":1,"id":"2","jsonrpc":"2.0","method":"m","method":"irn_subscribe","params":{"topic":"a"},"params":5}"#,
        r#"{"id":1,"jsonrpc":"2.0","method":"irn_publish","params":{"topic":"a","topic":"b","message":"","ttl":true,"tag":[],"prompt":{}}}"#,
        r#"{"id":1,"jsonrpc":"2.0","method":"irn_publish","params":{"topic":"é","message":"日本","ttl":10}}"#,
        "{\"id\":1,\"jsonrpc\":\"2.0\",\"method\":\"a\tb\"}",
        "{\"id\":1,\"jsonrpc\":\"2.0\",\"method\":\"a\u{7f}b\"}",
        " \t\r\n{ \"id\" : 1 , \"jsonrpc\" : \"2.0\" , \"method\" : \"m\" } \n",
        r#"{"id":1,"jsonrpc":"2.0","method":"m"} x"#,
        r#"{"id":1,"jsonrpc":"2.0","method":"m",}"#,
        r#"{"id":1,"jsonrpc":"2.0","method":"m""#,
        r#"{"id":1,"jsonrpc":"2.0","method":"m"#,
        r#"{}"#,
        r#"{"x":{"a":{"b":{"c":{"d":{"e":{"f":{"g":{"h":{}}}}}}}}}}"#,
        r#"{"x":[[[[[[[[[]]]]]]]]]}"#,
        r#"{"x":[1,2,3,[true,false,null],{"k":"v"}]}"#,
        r#"{"x":tru}"#,
        r#"{"x":nulll}"#,
        r#"{"id":true,"jsonrpc":"2.0","method":"x"}"#,
        r#"{"id":1,"jsonrpc":"1.0","method":"waku_subscribe"}"#,
        r#"{"type":"pub","jsonrpc":"2.0"}"#,
        r#"{"type":5}"#,
        // Acknowledgements in and out of the exact form taken without a scan.
        r#"{"id":0,"jsonrpc":"2.0","result":true}"#,
        r#"{"id":00,"jsonrpc":"2.0","result":true}"#,
        r#"{"id":07,"jsonrpc":"2.0","result":true}"#,
        r#"{"id":9999999999999999999,"jsonrpc":"2.0","result":true}"#,
        r#"{"id":18446744073709551615,"jsonrpc":"2.0","result":true}"#,
        r#"{"id":99999999999999999999999,"jsonrpc":"2.0","result":true}"#,
        r#"{"id":-1,"jsonrpc":"2.0","result":true}"#,
        r#"{"id":,"jsonrpc":"2.0","result":true}"#,
        r#"{"id":1x,"jsonrpc":"2.0","result":true}"#,
        r#"{"id":"1","jsonrpc":"2.0","result":true}"#,
        r#"{"id":1,"jsonrpc":"2.0","result":false}"#,
        r#"{"id":1,"jsonrpc":"2.0","result":true} "#,
        r#"{"id":1,"jsonrpc":"2.0","result":true}}"#,
        r#"{"id":1,"jsonrpc":"2.0","result":true,"topic":"t"}"#,
        r#"{"id":1,"jsonrpc":"1.0","result":true}"#,
        r#"{"id":1 ,"jsonrpc":"2.0","result":true}"#,
        r#"{"id":1,"jsonrpc":"2.0","error":{"code":1,"message":"m"}}"#,
    ];
    for c in cases {
        agree(c.as_bytes());
    }
    // Invalid UTF-8 inside a string.
    agree(b"{\"id\":1,\"jsonrpc\":\"2.0\",\"method\":\"\xff\"}");
    agree(b"{\"id\":1,\"jsonrpc\":\"2.0\",\"method\":\"\xc3\"}");
    // 500 topics are a list, 501 too long.
    for n in [500, 501] {
        let topics = vec!["\"t\""; n].join(",");
        let m = format!(
            r#"{{"id":1,"jsonrpc":"2.0","method":"irn_batchSubscribe","params":{{"topics":[{topics}]}}}}"#
        );
        assert!(agree(m.as_bytes()));
    }
}

/// A JSON value to write in one of several ways.
#[derive(Debug, Clone)]
enum J {
    Str(String, Esc),
    U(u64),
    I(i64),
    F(f64),
    Raw(&'static str),
    Arr(Vec<J>),
    Obj(Vec<(String, J)>),
}

/// How a string is written.
#[derive(Debug, Clone, Copy)]
enum Esc {
    /// Only what must be escaped.
    Needed,
    /// Every character as `\uXXXX`.
    All,
}

fn write_str(out: &mut String, s: &str, esc: Esc) {
    match esc {
        Esc::Needed => out.push_str(&serde_json::to_string(s).unwrap_or_default()),
        Esc::All => {
            out.push('"');
            for u in s.encode_utf16() {
                out.push_str(&format!("\\u{u:04x}"));
            }
            out.push('"');
        }
    }
}

fn write(out: &mut String, j: &J, ws: &str) {
    match j {
        J::Str(s, e) => write_str(out, s, *e),
        J::U(n) => out.push_str(&n.to_string()),
        J::I(n) => out.push_str(&n.to_string()),
        J::F(f) => out.push_str(&serde_json::to_string(f).unwrap_or_default()),
        J::Raw(r) => out.push_str(r),
        J::Arr(v) => {
            out.push('[');
            for (i, x) in v.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                    out.push_str(ws);
                }
                write(out, x, ws);
            }
            out.push(']');
        }
        J::Obj(v) => {
            out.push('{');
            out.push_str(ws);
            for (i, (k, x)) in v.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                    out.push_str(ws);
                }
                write_str(out, k, Esc::Needed);
                out.push_str(ws);
                out.push(':');
                out.push_str(ws);
                write(out, x, ws);
            }
            out.push_str(ws);
            out.push('}');
        }
    }
}

/// Strings clients send (hex, base64) and ones they do not (escapes, unicode, controls).
fn string() -> impl Strategy<Value = String> {
    prop_oneof![
        4 => "[0-9a-f]{64}",
        3 => "[A-Za-z0-9+/=]{0,700}",
        1 => "[a-zA-Z_]{0,20}",
        1 => "\\PC{0,30}",
        1 => "[\"\\\\/\u{0}-\u{1f}a\u{7f}\u{e9}\u{65e5}\u{1f600}]{0,12}",
        1 => Just("2.0".to_string()),
    ]
}

/// Plain strings only: what the fast path must take.
fn plain_string() -> impl Strategy<Value = String> {
    prop_oneof![
        "[0-9a-f]{64}",
        "[A-Za-z0-9+/=]{0,700}",
        "[a-zA-Z_ .:\u{e9}\u{65e5}\u{1f600}]{0,20}",
    ]
}

fn number() -> impl Strategy<Value = J> {
    prop_oneof![
        3 => (0u64..3_000_000).prop_map(J::U),
        2 => any::<u64>().prop_map(J::U),
        1 => prop::sample::select(vec![
            0u64, 1, 9, 10, 9_999_999_999_999_999_999, 10_000_000_000_000_000_000,
            u64::MAX, i64::MAX as u64, i64::MAX as u64 + 1, u32::MAX as u64,
            u32::MAX as u64 + 1, 2_592_000, 2_592_001,
        ]).prop_map(J::U),
        1 => any::<i64>().prop_map(J::I),
        1 => prop::sample::select(vec![i64::MIN, i64::MIN + 1, -1]).prop_map(J::I),
        1 => prop::sample::select(vec![0.0, -0.0, 1.5, 300.0, 1e300, -2.5e-7]).prop_map(J::F),
        1 => prop::sample::select(vec!["-0", "1E2", "1e+2", "0.0"]).prop_map(J::Raw),
    ]
}

fn scalar() -> impl Strategy<Value = J> {
    prop_oneof![
        4 => (string(), prop_oneof![9 => Just(Esc::Needed), 1 => Just(Esc::All)])
            .prop_map(|(s, e)| J::Str(s, e)),
        3 => number(),
        1 => prop::sample::select(vec!["true", "false", "null"]).prop_map(J::Raw),
    ]
}

fn value() -> impl Strategy<Value = J> {
    scalar().prop_recursive(4, 24, 5, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..5).prop_map(J::Arr),
            prop::collection::vec((member_name(), inner), 0..5).prop_map(J::Obj),
        ]
    })
}

fn member_name() -> impl Strategy<Value = String> {
    prop_oneof![
        8 => prop::sample::select(vec![
            "topic", "message", "ttl", "prompt", "tag", "attestation", "id", "topics",
            "subscriptions", "pairingTopic", "sessionTopic", "sessionProposal",
            "sessionProposalResponse", "sessionSettlementRequest", "correlationId",
            "rpcMethods", "txHashes", "jsonrpc", "method", "params", "type", "payload",
            "silent", "result", "error",
        ]).prop_map(str::to_string),
        1 => "[a-zA-Z\"\\\\\u{e9}]{0,8}",
    ]
}

fn method() -> impl Strategy<Value = String> {
    prop_oneof![
        6 => prop::sample::select(vec![
            "irn_publish", "waku_publish", "iridium_publish", "irn_subscribe",
            "waku_subscribe", "irn_unsubscribe", "irn_batchSubscribe", "irn_fetchMessages",
            "irn_batchFetchMessages", "irn_batchUnsubscribe", "wc_proposeSession",
            "wc_approveSession", "irn_nope",
        ]).prop_map(str::to_string),
        1 => string(),
    ]
}

/// A request of the usual shape with random members (values of any JSON type), in a random
/// order, with or without whitespace.
fn request() -> impl Strategy<Value = String> {
    let id = prop_oneof![
        3 => number(),
        2 => "[0-9]{1,20}".prop_map(|s| J::Str(s, Esc::Needed)),
        1 => scalar(),
    ];
    let params = prop::collection::vec((member_name(), value()), 0..9).prop_map(J::Obj);
    let extra = prop::collection::vec((member_name(), value()), 0..2);
    let ws = prop::sample::select(vec!["", "", "", " ", "\n\t", "\r "]);
    (
        id,
        method(),
        params,
        extra,
        ws,
        any::<prop::sample::Index>(),
    )
        .prop_map(|(id, method, params, extra, ws, rot)| {
            let mut members = vec![
                ("id".to_string(), id),
                ("jsonrpc".to_string(), J::Str("2.0".into(), Esc::Needed)),
                ("method".to_string(), J::Str(method, Esc::Needed)),
                ("params".to_string(), params),
            ];
            members.extend(extra);
            let k = rot.index(members.len());
            members.rotate_left(k);
            let mut out = String::new();
            write(&mut out, &J::Obj(members), ws);
            out
        })
}

/// A publish or subscribe exactly as clients send them: the fast path must take it.
fn usual() -> impl Strategy<Value = String> {
    let id = prop_oneof![
        (0u64..10_000_000_000_000_000_000).prop_map(|n| n.to_string()),
        "[0-9]{1,19}".prop_map(|s| format!("\"{s}\"")),
    ];
    (
        id,
        prop::sample::select(vec!["irn", "waku", "iridium"]),
        "[0-9a-f]{64}",
        plain_string(),
        0u32..3_000_000,
        prop::option::of(any::<bool>()),
        prop::option::of(any::<u32>()),
        any::<bool>(),
    )
        .prop_map(|(id, d, topic, message, ttl, prompt, tag, subscribe)| {
            if subscribe {
                return format!(
                    r#"{{"id":{id},"jsonrpc":"2.0","method":"{d}_subscribe","params":{{"topic":"{topic}"}}}}"#
                );
            }
            let mut p = format!(r#""topic":"{topic}","message":"{message}","ttl":{ttl}"#);
            if let Some(b) = prompt {
                p.push_str(&format!(r#","prompt":{b}"#));
            }
            if let Some(t) = tag {
                p.push_str(&format!(r#","tag":{t},"correlationId":{id_n}"#, id_n = t as u64 * 7));
            }
            format!(r#"{{"id":{id},"jsonrpc":"2.0","method":"{d}_publish","params":{{{p}}}}}"#)
        })
}

/// A request whose members come in the order clients write them (`id`, `jsonrpc`, `method`,
/// `params`; in params `topic`, `message`, `ttl`, `prompt`, `tag`), all or the first few,
/// then any others (duplicates of those among them), with values of any JSON type: the
/// members the scanner recognises by one comparison each, and where it returns to the
/// general loop.
fn in_order() -> impl Strategy<Value = String> {
    const TOP: [&str; 4] = ["id", "jsonrpc", "method", "params"];
    const PARAMS: [&str; 5] = ["topic", "message", "ttl", "prompt", "tag"];
    // Mostly values the scanner takes (so that it reads on), sometimes any.
    let usual_value = || {
        prop_oneof![
            3 => plain_string().prop_map(|s| J::Str(s, Esc::Needed)),
            2 => (0u64..3_000_000).prop_map(J::U),
            1 => prop::sample::select(vec!["true", "false", "null"]).prop_map(J::Raw),
            1 => value(),
        ]
    };
    let first = move |names: &'static [&'static str]| {
        let k = prop_oneof![2 => Just(names.len()), 1 => 0..=names.len()];
        (k, prop::collection::vec(usual_value(), names.len())).prop_map(move |(k, values)| {
            names[..k]
                .iter()
                .map(|n| n.to_string())
                .zip(values)
                .collect::<Vec<_>>()
        })
    };
    // A request the classification keeps the params of, most of the time.
    let jsonrpc = prop_oneof![
        4 => Just(J::Str("2.0".into(), Esc::Needed)),
        1 => usual_value(),
    ];
    let method = prop_oneof![
        4 => method().prop_map(|m| J::Str(m, Esc::Needed)),
        1 => usual_value(),
    ];
    let params = (
        first(&PARAMS),
        prop::collection::vec((member_name(), usual_value()), 0..3),
        prop::bool::weighted(0.9),
    )
        .prop_map(|(mut members, more, object)| {
            members.extend(more);
            if object {
                J::Obj(members)
            } else {
                members.pop().map_or(J::Obj(vec![]), |(_, v)| v)
            }
        });
    let ws = prop::sample::select(vec!["", "", "", "", " ", "\n"]);
    (
        first(&TOP),
        (jsonrpc, method, params),
        prop::collection::vec((member_name(), usual_value()), 0..3),
        ws,
    )
        .prop_map(|(mut members, (jsonrpc, method, params), more, ws)| {
            for (name, value) in &mut members {
                match name.as_str() {
                    "jsonrpc" => *value = jsonrpc.clone(),
                    "method" => *value = method.clone(),
                    "params" => *value = params.clone(),
                    _ => {}
                }
            }
            members.extend(more);
            let mut out = String::new();
            write(&mut out, &J::Obj(members), ws);
            out
        })
}

/// A byte-level change: delete, insert, overwrite, truncate, or double a range.
fn mutate(msg: &str, edits: &[(prop::sample::Index, u8, u8)]) -> Vec<u8> {
    const BYTES: &[u8] = b"\"\\{}[],:0123456789-.eE tfn\x00\x1f\xff\xc3";
    let mut b = msg.as_bytes().to_vec();
    for (at, kind, byte) in edits {
        let at = at.index(b.len() + 1);
        let byte = BYTES[*byte as usize % BYTES.len()];
        match kind % 5 {
            0 if at < b.len() => {
                b.remove(at);
            }
            1 => b.insert(at, byte),
            2 if at < b.len() => b[at] = byte,
            3 => b.truncate(at),
            _ => {
                let tail = b[at..].to_vec();
                b.extend_from_slice(&tail[..tail.len().min(8)]);
            }
        }
    }
    b
}

/// Acknowledgements with any id text of up to 22 digits, some with a byte changed.
fn ack() -> impl Strategy<Value = Vec<u8>> {
    (
        "[0-9]{0,22}",
        proptest::option::of((any::<prop::sample::Index>(), any::<u8>())),
    )
        .prop_map(|(id, edit)| {
            let mut m = format!(r#"{{"id":{id},"jsonrpc":"2.0","result":true}}"#).into_bytes();
            if let Some((at, b)) = edit {
                let i = at.index(m.len());
                m[i] = b;
            }
            m
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1024))]

    /// Every acknowledgement the exact-form check takes agrees with the general parser.
    #[test]
    fn acknowledgements_agree(msg in ack()) {
        agree(&msg);
    }

    #[test]
    fn generated_requests_agree(msg in request()) {
        agree(msg.as_bytes());
    }

    #[test]
    fn requests_in_the_usual_order_agree(msg in in_order()) {
        agree(msg.as_bytes());
    }

    #[test]
    fn mutated_requests_agree(
        msg in prop_oneof![request(), usual(), in_order()],
        edits in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>(), any::<u8>()), 1..4),
    ) {
        agree(&mutate(&msg, &edits));
    }

    #[test]
    fn usual_requests_take_the_fast_path(msg in usual()) {
        prop_assert!(agree(msg.as_bytes()), "declined: {}", msg);
    }
}
