//! JSON-RPC 2.0 framing rules of the relay (DECISIONS §3): ids echoed exactly, batches,
//! acknowledgements consumed, every error code, and the connection stays usable after each.

mod common;
use common::{topic, Server};
use serde_json::{json, Value};

fn err_code(v: &Value) -> i64 {
    v["error"]["code"]
        .as_i64()
        .unwrap_or_else(|| panic!("not an error: {v}"))
}

/// After an error the same connection still subscribes fine.
fn still_usable(ws: &mut common::Ws) {
    let id = ws.subscribe(&topic());
    assert_eq!(id.len(), 64);
}

#[test]
fn parse_error_is_32700_with_null_id() {
    let s = Server::start(&["--threads", "1"]);
    let mut ws = s.ws();
    ws.send_text("{not json");
    let r = ws.recv();
    assert_eq!(
        r,
        json!({"id": null, "jsonrpc": "2.0", "error": {"code": -32700, "message": "Parse error"}})
    );
    still_usable(&mut ws);
}

#[test]
fn invalid_request_is_32600() {
    let s = Server::start(&["--threads", "1"]);
    let mut ws = s.ws();
    for bad in [
        json!({"id": 1, "jsonrpc": "1.0", "method": "waku_subscribe", "params": {"topic": "a"}}),
        json!({"id": 2, "method": "waku_subscribe", "params": {"topic": "a"}}),
        json!({"id": 3, "jsonrpc": "2.0", "method": 42}),
        json!(17),
        json!([]),
        // Neither a request (no `method`) nor a response (no `result` or `error`) nor a
        // v1 frame (DECISIONS §8).
        json!({}),
        json!({"foo": 1}),
        json!({"id": 6, "jsonrpc": "2.0"}),
    ] {
        ws.send(&bad);
        let r = ws.recv();
        assert_eq!(err_code(&r), -32600, "for {bad}: {r}");
        if let Some(id) = bad.get("id") {
            assert_eq!(&r["id"], id);
        } else {
            assert_eq!(r["id"], Value::Null);
        }
    }
    still_usable(&mut ws);
}

#[test]
fn unknown_method_is_32601() {
    let s = Server::start(&["--threads", "1"]);
    let mut ws = s.ws();
    let r = ws.call("waku_nope", json!({}));
    assert_eq!(err_code(&r), -32601);
    assert_eq!(r["error"]["message"], "Method not found");
    still_usable(&mut ws);
}

#[test]
fn invalid_params_are_32602_naming_the_param() {
    let s = Server::start(&["--threads", "1"]);
    let mut ws = s.ws();
    let long = "t".repeat(257);
    let cases = [
        ("waku_subscribe", json!({}), "topic"),
        ("waku_subscribe", json!({"topic": ""}), "topic"),
        ("waku_subscribe", json!({"topic": 5}), "topic"),
        ("waku_subscribe", json!({"topic": long}), "topic"),
        ("waku_publish", json!({"message": "m", "ttl": 10}), "topic"),
        ("waku_publish", json!({"topic": "t", "ttl": 10}), "message"),
        (
            "waku_publish",
            json!({"topic": "t", "message": "", "ttl": 10}),
            "message",
        ),
        ("waku_publish", json!({"topic": "t", "message": "m"}), "ttl"),
        (
            "waku_publish",
            json!({"topic": "t", "message": "m", "ttl": 0}),
            "ttl",
        ),
        (
            "waku_publish",
            json!({"topic": "t", "message": "m", "ttl": -5}),
            "ttl",
        ),
        (
            "waku_publish",
            json!({"topic": "t", "message": "m", "ttl": 2592001}),
            "ttl",
        ),
        (
            "waku_publish",
            json!({"topic": "t", "message": "m", "ttl": "60"}),
            "ttl",
        ),
        (
            "waku_publish",
            json!({"topic": "t", "message": "m", "ttl": 1.5}),
            "ttl",
        ),
        (
            "waku_publish",
            json!({"topic": "t", "message": "m", "ttl": 60, "prompt": "yes"}),
            "prompt",
        ),
        ("waku_unsubscribe", json!({"topic": "t"}), "id"),
    ];
    for (method, params, name) in cases {
        let r = ws.call(method, params.clone());
        assert_eq!(err_code(&r), -32602, "{method} {params}: {r}");
        assert_eq!(
            r["error"]["message"],
            format!("Missing or invalid \"{name}\" param"),
            "{method} {params}"
        );
    }
    let r = ws.call("waku_subscribe", json!(["a"]));
    assert_eq!(err_code(&r), -32602);
    // Extra keys are ignored; the 30-day ttl is accepted.
    let r = ws.call(
        "waku_publish",
        json!({"topic": topic(), "message": "m", "ttl": 2592000, "x": [1]}),
    );
    assert_eq!(r["result"], true);
    still_usable(&mut ws);
}

#[test]
fn subscription_quota_is_32000() {
    let s = Server::start(&["--threads", "4", "--max-subscriptions", "3"]);
    let mut ws = s.ws();
    for _ in 0..3 {
        ws.subscribe(&topic());
    }
    let r = ws.call("waku_subscribe", json!({"topic": topic()}));
    assert_eq!(err_code(&r), -32000, "{r}");
    // Publishing and resubscribing to a held topic still work.
    let r = ws.call(
        "waku_publish",
        json!({"topic": topic(), "message": "m", "ttl": 60}),
    );
    assert_eq!(r["result"], true);
}

#[test]
fn string_and_large_numeric_ids_are_echoed_exactly() {
    let s = Server::start(&["--threads", "1"]);
    let mut ws = s.ws();
    ws.send_text(r#"{"id":"abc-1","jsonrpc":"2.0","method":"waku_publish","params":{"topic":"t","message":"m","ttl":60}}"#);
    assert_eq!(
        ws.recv(),
        json!({"id": "abc-1", "jsonrpc": "2.0", "result": true})
    );
    ws.send_text(r#"{"id":1637012345678901,"jsonrpc":"2.0","method":"waku_publish","params":{"topic":"t","message":"n","ttl":60}}"#);
    let raw = loop {
        match ws.sock.read().unwrap() {
            tungstenite::Message::Text(t) => break t.to_string(),
            _ => continue,
        }
    };
    assert_eq!(
        raw,
        r#"{"id":1637012345678901,"jsonrpc":"2.0","result":true}"#
    );
}

#[test]
fn batches_are_answered_with_arrays_in_order() {
    let s = Server::start(&["--threads", "4"]);
    let mut ws = s.ws();
    let tp = topic();
    ws.send(&json!([
        {"id": 1, "jsonrpc": "2.0", "method": "waku_subscribe", "params": {"topic": tp}},
        {"id": 2, "jsonrpc": "2.0", "method": "waku_nope", "params": {}},
        {"id": 3, "jsonrpc": "2.0", "result": true},
        5,
        {"jsonrpc": "2.0", "method": "waku_publish", "params": {"topic": topic(), "message": "n", "ttl": 9}},
        {"id": 4, "jsonrpc": "2.0", "method": "waku_publish", "params": {"topic": topic(), "message": "m", "ttl": 9}}
    ]));
    let r = ws.recv();
    let arr = r.as_array().unwrap_or_else(|| panic!("not an array: {r}"));
    assert_eq!(arr.len(), 4, "{r}");
    assert_eq!(arr[0]["id"], 1);
    assert_eq!(arr[0]["result"].as_str().unwrap().len(), 64);
    assert_eq!(arr[1]["id"], 2);
    assert_eq!(arr[1]["error"]["code"], -32601);
    assert_eq!(arr[2]["id"], Value::Null);
    assert_eq!(arr[2]["error"]["code"], -32600);
    assert_eq!(arr[3], json!({"id": 4, "jsonrpc": "2.0", "result": true}));
}

#[test]
fn acknowledgements_and_notifications_get_no_answer() {
    let s = Server::start(&["--threads", "1"]);
    let mut ws = s.ws();
    let mut other = s.ws();
    let tp = topic();
    ws.send(&json!({"id": 99, "jsonrpc": "2.0", "result": true}));
    ws.send(&json!({"id": 97, "jsonrpc": "2.0", "error": {"code": 1, "message": "no"}}));
    ws.send(&json!([{"id": 98, "jsonrpc": "2.0", "result": true}]));
    // A notification (no id) is executed but not answered.
    ws.send(&json!({"jsonrpc": "2.0", "method": "waku_publish", "params": {"topic": tp, "message": "note", "ttl": 60}}));
    let id = ws.subscribe(&topic());
    assert_eq!(id.len(), 64);
    other.subscribe(&tp);
    assert_eq!(other.next_push().2, "note");
}

#[test]
fn a_batch_over_100_elements_is_one_32600_error() {
    let s = Server::start(&["--threads", "1"]);
    let mut ws = s.ws();
    let batch: Vec<Value> = (0..101)
        .map(|i| json!({"id": i, "jsonrpc": "2.0", "method": "waku_nope", "params": {}}))
        .collect();
    ws.send(&Value::Array(batch));
    let r = ws.recv();
    assert_eq!(err_code(&r), -32600, "{r}");
    assert_eq!(r["id"], Value::Null);
    // 100 elements are still answered one by one.
    let batch: Vec<Value> = (0..100)
        .map(|i| json!({"id": i, "jsonrpc": "2.0", "method": "waku_nope", "params": {}}))
        .collect();
    ws.send(&Value::Array(batch));
    assert_eq!(ws.recv().as_array().map(Vec::len), Some(100));
    still_usable(&mut ws);
}

#[test]
fn half_a_surrogate_pair_is_a_parse_error_and_changes_no_topic() {
    let s = Server::start(&["--threads", "1"]);
    let mut sub = s.ws();
    let mut publ = s.ws();
    let tp = topic();
    // `simd-json` wrote a lone high surrogate as U+0000: `tp\udbff` became `tp\u0000`,
    // another topic's name. Refused as a parse error, as `serde_json` refuses it.
    sub.subscribe(&format!("{tp}\u{0}"));
    for text in [
        format!(
            r#"{{"id":2,"jsonrpc":"2.0","method":"waku_publish","params":{{"topic":"{tp}\udbff","message":"m","ttl":60}}}}"#
        ),
        format!(
            r#"{{"id":3,"jsonrpc":"2.0","method":"waku_publish","params":{{"topic":"{tp}","message":"m\ud800x","ttl":60}}}}"#
        ),
        r#"{"id":"\ud800","jsonrpc":"2.0","method":"waku_subscribe","params":{"topic":"a"}}"#
            .to_string(),
    ] {
        publ.send_text(&text);
        assert_eq!(
            publ.recv(),
            json!({"id": null, "jsonrpc": "2.0", "error": {"code": -32700, "message": "Parse error"}}),
            "{text}"
        );
    }
    // A whole pair is text like any other.
    let r = publ.call(
        "waku_publish",
        json!({"topic": format!("{tp}\u{0}"), "message": "\u{1F600}", "ttl": 60}),
    );
    assert_eq!(r["result"], true, "{r}");
    assert_eq!(sub.next_push().2, "\u{1F600}");
    still_usable(&mut publ);
}

#[test]
fn integers_past_64_bits_are_numbers_not_parse_errors() {
    let s = Server::start(&["--threads", "1"]);
    let mut ws = s.ws();
    // An ignored member may hold any JSON number.
    ws.send_text(&format!(
        r#"{{"id":1,"jsonrpc":"2.0","method":"waku_publish","params":{{"topic":"{}","message":"m","ttl":60,"x":123456789012345678901234}}}}"#,
        topic()
    ));
    assert_eq!(
        ws.recv(),
        json!({"id": 1, "jsonrpc": "2.0", "result": true})
    );
    // A ttl past 64 bits is out of range: invalid params, not a parse error.
    ws.send_text(&format!(
        r#"{{"id":2,"jsonrpc":"2.0","method":"waku_publish","params":{{"topic":"{}","message":"m","ttl":123456789012345678901234}}}}"#,
        topic()
    ));
    let r = ws.recv();
    assert_eq!(err_code(&r), -32602, "{r}");
    assert_eq!(r["id"], 1 + 1);
    still_usable(&mut ws);
}
