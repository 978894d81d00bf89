//! Tests of `script`: packing and decoding the scripts' calls and replies.
use super::*;

fn body(message: &str) -> Body {
    Body::encode("t", message, crate::message::Meta::default())
}

fn args<'a>(topic: &'a [u8], body: &'a Body) -> PublishArgs<'a> {
    PublishArgs {
        ns: 2,
        topic,
        body,
        ttl_ms: 5000,
        origin: Origin { node: 1, conn: 2 },
        prompt: true,
        publisher: b"",
    }
}

const CLIENTS: ClientArgs = ClientArgs {
    mailbox_ttl_ms: 60_000,
    alive_ms: 3000,
    mixed: false,
};

#[test]
fn on_a_cluster_every_key_of_a_topic_is_in_its_slot() {
    let mut buf = Vec::new();
    let shas = Shas(["a", "b", "c", "d", "e", "f", "g", "h"].map(String::from));
    let b1 = body("{}");
    let keys = Keys {
        db: 0,
        tagged: true,
    };
    let mut hook = Vec::new();
    pack_publish_group(
        &mut buf,
        &shas,
        10,
        keys,
        b"r",
        CLIENTS,
        &[args(b"t}x", &b1)],
    );
    pack_webhook_add(&mut hook, &shas, keys, b"t}x", b"http://h", 16, 100);
    let mut names = Vec::new();
    for b in [&buf, &hook] {
        let Value::Array(a) = redis::parse_redis_value(b).unwrap() else {
            panic!()
        };
        let n_keys: usize = match &a[2] {
            Value::BulkString(b) => std::str::from_utf8(b).unwrap().parse().unwrap(),
            _ => panic!(),
        };
        for k in &a[3..3 + n_keys] {
            let Value::BulkString(k) = k else { panic!() };
            names.push(k.clone());
        }
    }
    assert_eq!(
        names.len(),
        6,
        "meta, stream, clients, hooks; hooks, counter"
    );
    assert_eq!(names[0], b"wr:2:m:{t}x}");
    assert_eq!(names[1], channel(keys, 2, b"t}x"));
    let want = slots::topic_slot(b"t}x");
    for k in &names {
        assert_eq!(slots::key_slot(k), want, "{}", String::from_utf8_lossy(k));
    }
    assert!(webhooks_per_slot(100_000) >= 8 + 2 * 7);
}

#[test]
fn a_publish_group_packs_as_resp_and_parses_back() {
    let mut buf = Vec::new();
    let shas = Shas(["a", "b", "c", "d", "e", "f", "g", "h"].map(String::from));
    let (b1, b2) = (body("{}"), body("x"));
    let quiet = PublishArgs {
        prompt: false,
        ..args(b"u", &b2)
    };
    let keys = Keys {
        db: 3,
        tagged: false,
    };
    pack_publish_group(
        &mut buf,
        &shas,
        1000,
        keys,
        b"rid",
        CLIENTS,
        &[args(b"t\r\n", &b1), quiet],
    );
    let v = redis::parse_redis_value(&buf).unwrap();
    let Value::Array(a) = v else { panic!() };
    let s: Vec<Vec<u8>> = a
        .into_iter()
        .map(|x| match x {
            Value::BulkString(b) => b,
            _ => panic!(),
        })
        .collect();
    // 4 keys for the prompt message, 3 for the quiet one; 8 global arguments (the last: "0",
    // the cluster is not mixed), 8 each.
    assert_eq!(s.len(), 3 + 7 + 8 + 16);
    assert_eq!(s[0], b"EVALSHA");
    assert_eq!(s[2], b"7");
    assert_eq!(s[3], b"wr:2:m:t\r\n");
    assert_eq!(s[4], b"wr:3:2:t\r\n");
    assert_eq!(
        channel(keys, 2, b"t\r\n"),
        s[4],
        "the stream is the channel"
    );
    assert_eq!(s[5], b"wr:c:t\r\n");
    assert_eq!(s[6], b"wr:w:t\r\n");
    assert_eq!(s[7], b"wr:2:m:u");
    assert_eq!(s[8], b"wr:3:2:u");
    assert_eq!(s[9], b"wr:c:u");
    assert_eq!(s[10], b"1000");
    assert_eq!(s[11], b"rid");
    assert_eq!(s[12], b"PUBLISH");
    assert_eq!(s[13], b"60000");
    assert_eq!(s[14], b"wr:node:");
    assert_eq!(s[17], b"0");
    assert_eq!(s[18], &b1.irn()[..]);
    assert_eq!(s[19], b"5000");
    assert_eq!(s[20], [0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 2]);
    assert_eq!(s[21], b"1");
    assert_eq!(s[22], digest(br#"{"topic":"t","message":"{}""#));
    assert_eq!(s[23], b1.beta_len().to_string().as_bytes());
    assert_eq!((&s[24][..], &s[25][..]), (&b""[..], &b""[..]));
    assert_eq!(s[26], &b2.irn()[..]);
    assert_eq!(s[29], b"0");
}

#[test]
fn the_digest_is_fixed() {
    // xxh3-128 of "" (the reference value), so every node and build agrees.
    let want = 0x99aa_06d3_0147_98d8_6001_c324_468d_497f_u128.to_be_bytes();
    assert_eq!(digest(b""), want);
    assert_ne!(digest(b"a"), digest(b"b"));
}

#[test]
fn a_group_reply_decodes_per_message() {
    let b = |s: &str| Value::BulkString(s.as_bytes().to_vec());
    let v = Value::Array(vec![
        b("17"),
        Value::Int(3),
        Value::Int(2),
        b("http://a/"),
        b("http://b/"),
        Value::Int(1),
        b("did:key:z1"),
        b("p"),
        b("0"),
        b("17"),
        Value::Int(-2),
        Value::Int(0),
        Value::Int(0),
    ]);
    let got = decode_publish_group(v, 2).unwrap();
    assert_eq!(
        got,
        [
            PublishOutcome::Stored {
                epoch: 17,
                seq: 3,
                webhooks: vec!["http://a/".into(), "http://b/".into()],
                clients: vec![ClientSeen {
                    id: "did:key:z1".into(),
                    project: "p".into(),
                    socket: false,
                }],
            },
            PublishOutcome::Duplicate { epoch: 17, seq: 2 },
        ]
    );
    // Short, long, a zero seq, a missing url: errors, never a guess.
    let one = || vec![b("1"), Value::Int(1), Value::Int(0), Value::Int(0)];
    assert!(decode_publish_group(Value::Array(one()), 2).is_err());
    let mut long = one();
    long.push(Value::Int(0));
    assert!(decode_publish_group(Value::Array(long), 1).is_err());
    let zero = vec![b("1"), Value::Int(0), Value::Int(0), Value::Int(0)];
    assert!(decode_publish_group(Value::Array(zero), 1).is_err());
    let url = vec![b("1"), Value::Int(1), Value::Int(1), Value::Int(0)];
    assert!(decode_publish_group(Value::Array(url), 1).is_err());
}

#[test]
fn live_payload_round_trip_and_garbage() {
    let mut p = b"1700000000000001:42:".to_vec();
    p.extend_from_slice(&Origin { node: 7, conn: 9 }.to_bytes());
    p.extend_from_slice(b"{\"topic\":\"t\"}");
    let l = decode_live(p).unwrap();
    assert_eq!((l.epoch, l.seq), (1_700_000_000_000_001, 42));
    assert_eq!(l.origin, Origin { node: 7, conn: 9 });
    assert_eq!(&l.data[..], b"{\"topic\":\"t\"}");
    for bad in [
        &b""[..],
        b"1:2:",
        b"x:2:0123456789abcdef",
        b":1:0123456789abcdef",
        b"1:2",
    ] {
        assert!(decode_live(bad.to_vec()).is_none());
    }
}

#[test]
fn replies_of_the_wrong_shape_are_errors() {
    assert!(decode_publish_group(Value::Nil, 1).is_err());
    assert!(decode_publish_group(Value::Array(vec![Value::Int(5)]), 1).is_err());
    assert!(decode_read(Value::Array(vec![Value::Int(1)]), false).is_err());
    assert!(decode_webhook_add(&Value::Int(9)).is_err());
    let ok = decode_read(
        Value::Array(vec![
            Value::BulkString(b"0".to_vec()),
            Value::Int(0),
            Value::Int(0),
        ]),
        false,
    )
    .unwrap();
    assert_eq!((ok.epoch, ok.last_seq, ok.messages.len()), (0, 0, 0));
    // A read for a client id: whether it has a subscription, and its receipts.
    let b = |s: &str| Value::BulkString(s.as_bytes().to_vec());
    let head = vec![b("5"), Value::Int(0), Value::Int(0), b("1"), b("7,9")];
    let ok = decode_read(Value::Array(head.clone()), true).unwrap();
    let c = ok.client.unwrap();
    assert!(c.subscribed);
    assert_eq!(c.received, [7, 9]);
    assert!(decode_read(Value::Array(head), false).is_err());
    let bad = vec![b("5"), Value::Int(0), Value::Int(0), b("1"), b("x")];
    assert!(decode_read(Value::Array(bad), true).is_err());
}
