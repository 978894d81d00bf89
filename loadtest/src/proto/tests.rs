//! Unit tests of the wire helpers: frames, templates, pushes of every shape.

use super::*;
use crate::ws::{apply_mask, parse_head};

fn unmasked_payload(frame: &[u8]) -> Vec<u8> {
    let h = parse_head(frame, 1 << 24, false).unwrap().unwrap();
    let mut p = frame[h.head_len..h.head_len + h.payload_len].to_vec();
    apply_mask(&mut p, h.mask.unwrap(), 0);
    p
}

#[test]
fn stamp_round_trip() {
    let s = Stamp {
        sched_ns: 0x0123_4567_89ab_cdef,
        sender: 0xdead_beef,
        seq: 7,
    };
    let mut b = [0u8; STAMP_LEN];
    s.encode(&mut b);
    assert_eq!(&b, b"0123456789abcdefdeadbeef00000007");
    assert_eq!(Stamp::decode(&b), Some(s));
    assert_eq!(Stamp::decode(&b[..31]), None);
    let mut bad = b;
    bad[3] = b'G';
    assert_eq!(Stamp::decode(&bad), None);
}

#[test]
fn publish_template_patches_id_and_stamp_under_the_mask() {
    let t = PublishTemplate::new(Rpc::Waku, "abcd", 100, 30);
    let mut out = Vec::new();
    let stamp = Stamp {
        sched_ns: 123_456_789,
        sender: 3,
        seq: 42,
    };
    t.write(&mut out, 5, &stamp);
    assert_eq!(out.len(), t.len());
    let json = String::from_utf8(unmasked_payload(&out)).unwrap();
    let msg = format!(
        "{{\"id\":1000000000005,\"jsonrpc\":\"2.0\",\"method\":\"waku_publish\",\"params\":{{\"topic\":\"abcd\",\"message\":\"{}{}\",\"ttl\":30}}}}",
        "00000000075bcd15000000030000002a",
        String::from_utf8_lossy(&filler(100)[32..])
    );
    assert_eq!(json, msg);
    // A second write differs only in the patched fields.
    t.write(&mut out, 6, &Stamp { seq: 43, ..stamp });
    let second = String::from_utf8(unmasked_payload(&out[t.len()..])).unwrap();
    assert!(second.starts_with("{\"id\":1000000000006,"));
    assert!(second.contains("\"message\":\"00000000075bcd15000000030000002b"));
}

#[test]
fn v1_pub_template_patches_the_stamp_and_v1_frames_classify_as_deliveries() {
    let t = PublishTemplate::new_v1("abcd", 40);
    let mut out = Vec::new();
    let stamp = Stamp {
        sched_ns: 7,
        sender: 1,
        seq: 2,
    };
    t.write(&mut out, 99, &stamp);
    let json = String::from_utf8(unmasked_payload(&out)).unwrap();
    assert_eq!(
        json,
        format!(
            "{{\"topic\":\"abcd\",\"type\":\"pub\",\"payload\":\"{}{}\",\"silent\":true}}",
            "00000000000000070000000100000002",
            String::from_utf8_lossy(&filler(40)[32..])
        )
    );
    // What the server sends on is the same object with `silent` as it came.
    let c = Classifier::new(Rpc::Waku);
    assert_eq!(
        c.classify(json.as_bytes()),
        Incoming::Delivery {
            rpc_id: None,
            stamp: Some(stamp)
        }
    );
    let mut sub = Vec::new();
    write_v1_sub(&mut sub, "tt");
    assert_eq!(
        unmasked_payload(&sub),
        b"{\"topic\":\"tt\",\"type\":\"sub\",\"payload\":\"\",\"silent\":true}"
    );
    // A refused v1 frame (JSON-RPC error, id null) is an error, not a delivery.
    let e = br#"{"id":null,"jsonrpc":"2.0","error":{"code":-32600,"message":"Invalid v1 frame: missing or invalid \"payload\""}}"#;
    assert_eq!(
        c.classify(e),
        Incoming::Error {
            id: None,
            code: Some(-32600)
        }
    );
}

#[test]
fn large_payload_uses_long_head() {
    let t = PublishTemplate::new(Rpc::Waku, "t", 70_000, 1);
    let mut out = Vec::new();
    t.write(
        &mut out,
        0,
        &Stamp {
            sched_ns: 1,
            sender: 2,
            seq: 3,
        },
    );
    let json = unmasked_payload(&out);
    let s = String::from_utf8(json).unwrap();
    assert!(s.contains("\"message\":\"00000000000000010000000200000003"));
    assert!(s.ends_with("\",\"ttl\":1}}"));
}

#[test]
fn subscribe_and_ack_frames() {
    let mut out = Vec::new();
    write_subscribe(&mut out, Rpc::Waku, 9, "tt");
    assert_eq!(
        unmasked_payload(&out),
        b"{\"id\":9,\"jsonrpc\":\"2.0\",\"method\":\"waku_subscribe\",\"params\":{\"topic\":\"tt\"}}"
    );
    let mut out = Vec::new();
    write_ack(&mut out, b"1234567890123456");
    assert_eq!(
        unmasked_payload(&out),
        b"{\"id\":1234567890123456,\"jsonrpc\":\"2.0\",\"result\":true}"
    );
}

#[test]
fn classifies_server_messages() {
    let c = Classifier::new(Rpc::Waku);
    let d = br#"{"id":1650000000000001,"jsonrpc":"2.0","method":"waku_subscription","params":{"id":"ab12","data":{"topic":"t","message":"0000000000000010000000020000000300ff"}}}"#;
    assert_eq!(
        c.classify(d),
        Incoming::Delivery {
            rpc_id: Some(&b"1650000000000001"[..]),
            stamp: Some(Stamp {
                sched_ns: 16,
                sender: 2,
                seq: 3
            })
        }
    );
    // Key order and spacing may differ.
    let d2 = br#"{"jsonrpc": "2.0", "method": "waku_subscription", "params": {"data": {"message": "0000000000000010000000020000000300ff", "topic": "t"}, "id": "x"}, "id": 7}"#;
    assert!(matches!(
        c.classify(d2),
        Incoming::Delivery {
            rpc_id: Some(b"7"),
            stamp: Some(_)
        }
    ));
    // A message without our stamp is still a delivery.
    let d3 = br#"{"id":1,"jsonrpc":"2.0","method":"waku_subscription","params":{"id":"x","data":{"topic":"t","message":"hello"}}}"#;
    assert!(matches!(
        c.classify(d3),
        Incoming::Delivery { stamp: None, .. }
    ));
    assert_eq!(
        c.classify(br#"{"id":1000000000005,"jsonrpc":"2.0","result":true}"#),
        Incoming::Result {
            id: Some(1_000_000_000_005),
            value: ResultValue::True
        }
    );
    assert_eq!(
        c.classify(br#"{"id":3,"jsonrpc":"2.0","result":"a1b2"}"#),
        Incoming::Result {
            id: Some(3),
            value: ResultValue::Str
        }
    );
    assert_eq!(
        c.classify(br#"{"id":4,"jsonrpc":"2.0","error":{"code":-32602,"message":"Missing or invalid \"topic\" param"}}"#),
        Incoming::Error { id: Some(4), code: Some(-32602) }
    );
    assert_eq!(
        c.classify(
            br#"{"id":null,"jsonrpc":"2.0","error":{"code":-32700,"message":"Parse error"}}"#
        ),
        Incoming::Error {
            id: None,
            code: Some(-32700)
        }
    );
    assert_eq!(c.classify(b"[]"), Incoming::Other);
    assert_eq!(c.classify(b""), Incoming::Other);
}

#[test]
fn irn_frames() {
    let t = PublishTemplate::new(Rpc::Irn, "abcd", 40, 300);
    let mut out = Vec::new();
    let stamp = Stamp {
        sched_ns: 5,
        sender: 6,
        seq: 7,
    };
    t.write(&mut out, 8, &stamp);
    assert_eq!(
        String::from_utf8(unmasked_payload(&out)).unwrap(),
        format!(
            "{{\"id\":1000000000008,\"jsonrpc\":\"2.0\",\"method\":\"irn_publish\",\"params\":{{\"topic\":\"abcd\",\"message\":\"{}{}\",\"ttl\":300,\"tag\":1108}}}}",
            "00000000000000050000000600000007",
            String::from_utf8_lossy(&filler(40)[32..])
        )
    );
    let mut out = Vec::new();
    write_subscribe(&mut out, Rpc::Irn, 1, "tt");
    assert_eq!(
        unmasked_payload(&out),
        b"{\"id\":1,\"jsonrpc\":\"2.0\",\"method\":\"irn_subscribe\",\"params\":{\"topic\":\"tt\"}}"
    );
}

#[test]
fn classifies_irn_pushes() {
    let hex64 = "0123456789abcdef".repeat(4);
    let stamp = Stamp {
        sched_ns: 0x10,
        sender: 2,
        seq: 3,
    };
    let mut s = [0u8; STAMP_LEN];
    stamp.encode(&mut s);
    let msg = format!("{}{}", std::str::from_utf8(&s).unwrap(), "ab".repeat(20));
    // Exactly what the relay pushes: data.message followed by publishedAt and tag.
    let push = format!(
        r#"{{"id":1,"jsonrpc":"2.0","method":"irn_subscription","params":{{"id":"{hex64}","data":{{"topic":"{hex64}","message":"{msg}","publishedAt":1700000000000,"tag":1108}}}}}}"#
    );
    let irn = Classifier::new(Rpc::Irn);
    assert_eq!(
        irn.classify(push.as_bytes()),
        Incoming::Delivery {
            rpc_id: Some(&b"1"[..]),
            stamp: Some(stamp)
        }
    );
    // A large push id (up to 2^53), other key orders, attestation after tag.
    let push2 = format!(
        r#"{{"id":9007199254740991,"jsonrpc":"2.0","method":"irn_subscription","params":{{"id":"{hex64}","data":{{"publishedAt":1700000000000,"tag":1108,"topic":"{hex64}","message":"{msg}","attestation":"x"}}}}}}"#
    );
    assert_eq!(
        irn.classify(push2.as_bytes()),
        Incoming::Delivery {
            rpc_id: Some(&b"9007199254740991"[..]),
            stamp: Some(stamp)
        }
    );
    // Each classifier knows its own push only: a waku push on an irn connection (or the
    // reverse) is not a delivery.
    let waku = Classifier::new(Rpc::Waku);
    assert_eq!(waku.classify(push.as_bytes()), Incoming::Other);
    let wpush = push.replace("irn_subscription", "waku_subscription");
    assert_eq!(irn.classify(wpush.as_bytes()), Incoming::Other);
    assert!(matches!(
        waku.classify(wpush.as_bytes()),
        Incoming::Delivery { stamp: Some(_), .. }
    ));
    // Answers to irn requests classify as before.
    assert_eq!(
        irn.classify(br#"{"id":1000000000005,"jsonrpc":"2.0","result":true}"#),
        Incoming::Result {
            id: Some(1_000_000_000_005),
            value: ResultValue::True
        }
    );
    assert_eq!(
        irn.classify(br#"{"id":4,"jsonrpc":"2.0","error":{"code":-32602,"message":"bad ttl"}}"#),
        Incoming::Error {
            id: Some(4),
            code: Some(-32602)
        }
    );
}

#[test]
fn topics_are_64_hex_and_distinct() {
    let a = topic(1, 2, 3);
    let b = topic(1, 2, 4);
    assert_eq!(a.len(), 64);
    assert!(a.bytes().all(|c| c.is_ascii_hexdigit()));
    assert_ne!(a, b);
}

#[test]
fn rate_limited_refusals_are_recognised() {
    let m = br#"{"id":3,"jsonrpc":"2.0","error":{"code":-32000,"message":"rate limited","data":{"retryAfterMs":250}}}"#;
    assert_eq!(rate_limited(m), Some(250));
    let spaced = br#"{"id": 3, "error": {"data": {"retryAfterMs" : 0}, "code" : -32000, "message":"rate limited"}}"#;
    assert_eq!(rate_limited(spaced), Some(0));
    // Another error, a -32000 without the wait, a result, a push: not refusals.
    for m in [
        &br#"{"id":3,"jsonrpc":"2.0","error":{"code":-32602,"message":"bad","data":{"retryAfterMs":5}}}"#[..],
        br#"{"id":3,"jsonrpc":"2.0","error":{"code":-32000,"message":"server error"}}"#,
        br#"{"id":3,"jsonrpc":"2.0","result":true}"#,
        br#"{"id":9,"jsonrpc":"2.0","method":"waku_subscription","params":{"data":{"message":"retryAfterMs"}}}"#,
        br#"{"id":3,"error":{"code":-32000,"data":{"retryAfterMs":-1}}}"#,
    ] {
        assert_eq!(rate_limited(m), None, "{}", String::from_utf8_lossy(m));
    }
    // The classifier still sees it as an error with code -32000 and our id.
    assert_eq!(
        Classifier::new(Rpc::Waku).classify(m),
        Incoming::Error {
            id: Some(3),
            code: Some(RATE_LIMITED)
        }
    );
}

#[test]
fn batch_subscribe_frame() {
    let mut out = Vec::new();
    let topics = vec!["aa".to_string(), "bb".to_string()];
    write_batch_subscribe(&mut out, Rpc::Irn, 7, &topics);
    assert_eq!(
        String::from_utf8(unmasked_payload(&out)).unwrap(),
        r#"{"id":7,"jsonrpc":"2.0","method":"irn_batchSubscribe","params":{"topics":["aa","bb"]}}"#
    );
    let mut out = Vec::new();
    write_batch_fetch(&mut out, Rpc::Waku, 2, &topics[..1]);
    assert_eq!(
        String::from_utf8(unmasked_payload(&out)).unwrap(),
        r#"{"id":2,"jsonrpc":"2.0","method":"waku_batchFetchMessages","params":{"topics":["aa"]}}"#
    );
}

#[test]
fn sdk_frames_carry_string_ids_and_the_sdks_fields() {
    let stamp = Stamp {
        sched_ns: 5,
        sender: 6,
        seq: 7,
    };
    let fill = String::from_utf8_lossy(&filler(40)[32..]).into_owned();
    let req = PublishTemplate::new_sdk("abcd", 40, SDK_TTL_S, false);
    let mut out = Vec::new();
    req.write(&mut out, 12, &stamp);
    assert_eq!(out.len(), req.len());
    assert_eq!(
        String::from_utf8(unmasked_payload(&out)).unwrap(),
        format!(
            "{{\"id\":\"1100000000000000012\",\"jsonrpc\":\"2.0\",\"method\":\"irn_publish\",\"params\":{{\"topic\":\"abcd\",\"message\":\"00000000000000050000000600000007{fill}\",\"ttl\":900,\"prompt\":true,\"tag\":1108,\"correlationId\":1795638982221335,\"rpcMethods\":[\"personal_sign\"],\"chainId\":\"eip155:1\",\"txHashes\":[],\"contractAddresses\":[]}}}}"
        )
    );
    let answer = PublishTemplate::new_sdk("abcd", 40, SDK_TTL_S, true);
    let mut out = Vec::new();
    answer.write(&mut out, 3, &stamp);
    let json = String::from_utf8(unmasked_payload(&out)).unwrap();
    assert!(
        json.starts_with("{\"id\":\"1100000000000000003\","),
        "{json}"
    );
    assert!(json.contains("\"prompt\":false,\"tag\":1109,"), "{json}");
    assert!(json.contains(&format!("\"txHashes\":[\"0x{}\"]", "ab".repeat(65))));

    let mut out = Vec::new();
    write_sdk_batch_subscribe(&mut out, &["aa".to_string(), "bb".to_string()]);
    assert_eq!(
        String::from_utf8(unmasked_payload(&out)).unwrap(),
        r#"{"id":"1000000000000000001","jsonrpc":"2.0","method":"irn_batchSubscribe","params":{"topics":["aa","bb"]}}"#
    );
}

#[test]
fn quoted_digit_ids_classify_and_array_results_are_recognised() {
    let c = Classifier::new(Rpc::Irn);
    assert_eq!(
        c.classify(br#"{"id":"1000000000000000001","jsonrpc":"2.0","result":["ab12","cd34"]}"#),
        Incoming::Result {
            id: Some(SDK_SUB_ID),
            value: ResultValue::Array,
        }
    );
    assert_eq!(
        c.classify(br#"{"id":"1100000000000000012","jsonrpc":"2.0","result":true}"#),
        Incoming::Result {
            id: Some(SDK_ID_BASE + 12),
            value: ResultValue::True,
        }
    );
    // A hex string is not a numeric id.
    assert!(matches!(
        c.classify(br#"{"id":"6116b8","jsonrpc":"2.0","result":true}"#),
        Incoming::Result { id: None, .. }
    ));
}
