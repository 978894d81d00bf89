//! Tests of the entry encoding: every kind round-trips, malformed bytes have typed errors,
//! the compact message kind takes its topic from its body, varints have one form.

use super::*;
use proptest::prelude::*;

fn samples() -> Vec<Entry<'static>> {
    vec![
        Entry::Message {
            ns: Ns::V2,
            topic: "7f3a",
            epoch: 3,
            seq: u64::MAX,
            expires_unix_ms: 1_800_000_000_000,
            prompt: true,
            body: true,
            data: b"{\"x\":1}",
        },
        Entry::Message {
            ns: Ns::V1,
            topic: "",
            epoch: 0,
            seq: 0,
            expires_unix_ms: 0,
            prompt: false,
            body: false,
            data: b"",
        },
        Entry::Body {
            topic: "7f3a",
            epoch: 1_764_000_000_000_000,
            seq: 300,
            expires_unix_ms: 1_800_000_000_000,
            prompt: true,
            data: br#"{"topic":"7f3a","message":"m","publishedAt":1,"tag":0}"#,
        },
        Entry::Body {
            topic: "",
            epoch: u64::MAX,
            seq: 0,
            expires_unix_ms: 127,
            prompt: false,
            data: br#"{"topic":"""#,
        },
        Entry::Forget {
            ns: Ns::V1,
            topic: "t\u{e9}",
            epoch: 1,
            seq: 2,
        },
        Entry::WebhookAdd {
            topic: "t",
            url: "https://example.com/hook",
        },
        Entry::WebhookRemove {
            topic: "t",
            url: "https://example.com/hook",
        },
        Entry::ClientSub {
            topic: "7f3a",
            client: "did:key:z6MkhaXgBZDvotDkL5257faiztiGiC2QtKLGpbnnEGta2doK",
            project: "p",
            epoch: 1_764_000_000_000_000,
            seq: 41,
            expires_unix_ms: 1_800_000_000_000,
            received: &[1, 0, 0, 0, 0, 0, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0],
        },
        Entry::ClientSub {
            topic: "",
            client: "",
            project: "",
            epoch: 0,
            seq: 0,
            expires_unix_ms: 0,
            received: &[],
        },
        Entry::ClientEnd {
            topic: "t",
            client: "did:key:z6Mk",
        },
    ]
}

#[test]
fn every_kind_round_trips_and_every_prefix_is_truncated() {
    for e in samples() {
        let mut buf = Vec::new();
        e.encode(&mut buf).unwrap();
        assert_eq!(buf.len(), e.encoded_len());
        assert_eq!(Entry::decode(&buf), Ok(e));
        if matches!(e, Entry::Body { .. }) {
            // Its data runs to the end of the record: the record's framing and checksum
            // say where that is.
            continue;
        }
        for cut in 0..buf.len() {
            assert!(Entry::decode(&buf[..cut]).is_err(), "{e:?} cut at {cut}");
        }
        buf.push(0);
        assert_eq!(Entry::decode(&buf), Err(EntryError::Trailing(1)));
    }
}

#[test]
fn malformed_fields_have_typed_errors() {
    assert_eq!(Entry::decode(&[9]), Err(EntryError::UnknownKind(9)));
    assert_eq!(Entry::decode(&[2, 3]), Err(EntryError::UnknownNs(3)));
    assert_eq!(Entry::decode(&[1, 2, 2]), Err(EntryError::BadFlags(2)));
    assert_eq!(
        Entry::decode(&[3, 1, 0, 0xFF, 0, 0]),
        Err(EntryError::NotUtf8("topic"))
    );
    // A message's data is text: bytes that are not UTF-8 never came from this server.
    for bad in [&b"\xff"[..], b"ok\xc3", b"\xed\xa0\x80"] {
        let e = Entry::Message {
            ns: Ns::V2,
            topic: "t",
            epoch: 1,
            seq: 2,
            expires_unix_ms: 3,
            prompt: false,
            body: true,
            data: bad,
        };
        let mut buf = Vec::new();
        e.encode(&mut buf).unwrap();
        assert_eq!(Entry::decode(&buf), Err(EntryError::NotUtf8("data")));
        let mut data = br#"{"topic":"t","message":"m"}"#.to_vec();
        data.extend_from_slice(bad);
        let e = Entry::Body {
            topic: "t",
            epoch: 1,
            seq: 2,
            expires_unix_ms: 3,
            prompt: false,
            data: &data,
        };
        let mut buf = Vec::new();
        e.encode(&mut buf).unwrap();
        assert_eq!(Entry::decode(&buf), Err(EntryError::NotUtf8("data")));
    }
    let long = "x".repeat(70_000);
    let mut out = vec![7];
    let e = Entry::WebhookAdd {
        topic: "t",
        url: &long,
    };
    assert_eq!(e.encode(&mut out), Err(EntryError::TooLong("url")));
    assert_eq!(out, vec![7], "a failed encode leaves the buffer as it was");
}

#[test]
fn a_body_entry_takes_its_topic_from_the_body_and_nothing_else() {
    let data: &[u8] = br#"{"topic":"abc","message":"m","publishedAt":1,"tag":0}"#;
    assert!(Entry::topic_in_body("abc", data));
    for other in ["ab", "abcd", "", "x"] {
        assert!(!Entry::topic_in_body(other, data), "{other}");
    }
    // A topic whose JSON string is escaped fails the check (it is written as kind 5).
    for t in [
        "abc", "a\"b", "a\\", "a\\\"", "\\\\", "t\n", "\u{e9}", "\"", "",
    ] {
        let body = crate::message::Body::encode(t, "m", crate::message::Meta::default());
        let plain = serde_json::to_string(t).unwrap() == format!("\"{t}\"");
        assert_eq!(Entry::topic_in_body(t, body.irn()), plain, "{t:?}");
    }
    let esc: &[u8] = br#"{"topic":"a\"b","message":"m"}"#;
    let e = Entry::Body {
        topic: "abd",
        epoch: 1,
        seq: 1,
        expires_unix_ms: 1,
        prompt: false,
        data,
    };
    let mut out = Vec::new();
    assert_eq!(e.encode(&mut out), Err(EntryError::TopicNotInBody));
    assert!(out.is_empty());
    let mut bad = vec![BODY, 0, 1, 1, 1, 1];
    bad.extend_from_slice(esc);
    assert_eq!(Entry::decode(&bad), Err(EntryError::TopicNotInBody));
    // It reads back as the kind 5 entry it stands for.
    let e = Entry::Body {
        topic: "abc",
        epoch: 1,
        seq: 1,
        expires_unix_ms: 1,
        prompt: false,
        data,
    };
    let mut buf = Vec::new();
    e.encode(&mut buf).unwrap();
    assert_eq!(buf.len(), 2 + 4 + data.len());
    assert_eq!(
        Entry::decode(&buf).map(Entry::expanded),
        Ok(Entry::Message {
            ns: Ns::V2,
            topic: "abc",
            epoch: 1,
            seq: 1,
            expires_unix_ms: 1,
            prompt: false,
            body: true,
            data
        })
    );
}

#[test]
fn varints_are_shortest_and_at_most_64_bits() {
    for v in [0, 1, 127, 128, 16_383, 16_384, 1 << 41, u64::MAX] {
        let mut buf = [0u8; 10];
        let n = put_var_at(&mut buf, v);
        let b = &buf[..n];
        assert_eq!(b.len(), var_len(v), "{v}");
        assert_eq!(Reader { buf: b }.var(), Ok(v));
    }
    for bad in [&[0x80, 0x00][..], &[0xFF; 10][..], &[0x80; 11][..]] {
        assert_eq!(Reader { buf: bad }.var(), Err(EntryError::BadVarint));
    }
    let mut max = vec![0xFF; 9];
    max.push(2);
    assert_eq!(Reader { buf: &max }.var(), Err(EntryError::BadVarint));
}

proptest! {
    #[test]
    fn decoder_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..128)) {
        if let Ok(e) = Entry::decode(&bytes) {
            let mut again = Vec::new();
            e.encode(&mut again).unwrap();
            prop_assert_eq!(again, bytes);
        }
    }

    #[test]
    fn messages_round_trip(v1 in any::<bool>(), topic in ".{0,40}", epoch in any::<u64>(),
                           seq in any::<u64>(), exp in any::<u64>(), prompt in any::<bool>(), body in any::<bool>(),
                           data in ".{0,100}") {
        let e = Entry::Message { ns: if v1 { Ns::V1 } else { Ns::V2 }, topic: &topic, epoch,
                                 seq, expires_unix_ms: exp, prompt, body, data: data.as_bytes() };
        let mut buf = Vec::new();
        e.encode(&mut buf).unwrap();
        prop_assert_eq!(Entry::decode(&buf), Ok(e));
    }
}
