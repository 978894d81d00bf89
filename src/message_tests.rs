//! Tests of `message`: bodies, their encodings and buffers.

use super::*;

fn meta(at: u64, tag: u32, a: Option<&str>) -> Meta<'_> {
    Meta {
        published_at: at,
        tag,
        attestation: a,
        plain: false,
    }
}

#[test]
fn each_body_carries_its_own_time_stamp() {
    // The same millisecond again (written from the thread's last one), another, and
    // back; lengths that differ.
    for at in [
        5,
        5,
        1_700_000_000_000,
        1_700_000_000_000,
        1_700_000_000_001,
        5,
        0,
    ] {
        for plain in [false, true] {
            let m = Meta {
                plain,
                ..meta(at, 3, None)
            };
            let b = Body::encode("t", "m", m);
            let want = format!(r#"{{"topic":"t","message":"m","publishedAt":{at},"tag":3}}"#);
            assert_eq!(&b.irn()[..], want.as_bytes());
        }
    }
}

#[test]
fn both_shapes_come_from_one_encoding() {
    let b = Body::encode(
        "t\"1",
        "m,\"publishedAt\":",
        meta(1700000000123, 1108, None),
    );
    assert_eq!(
        &b.irn()[..],
        br#"{"topic":"t\"1","message":"m,\"publishedAt\":","publishedAt":1700000000123,"tag":1108}"#
    );
    let (buf, n) = b.beta();
    let mut beta = buf[..n].to_vec();
    beta.push(b'}');
    assert_eq!(beta, br#"{"topic":"t\"1","message":"m,\"publishedAt\":"}"#);
    assert_eq!(Body::from_stored(b.irn().clone()), Some(b.clone()));
    let v: serde_json::Value = serde_json::from_slice(b.irn()).unwrap();
    assert_eq!(v["publishedAt"], 1700000000123u64);
}

#[test]
fn a_body_knows_whether_it_holds_its_strings_verbatim() {
    for (t, m, verbatim) in [
        ("t", "m", true),
        ("", "", true),
        ("t\"", "m", false),
        ("t", "m\\", false),
        ("t", "\u{1}", false),
        ("é", "\u{7f}", true),
    ] {
        let b = Body::encode(t, m, meta(5, 7, Some("a\"b")));
        assert_eq!(b.is_verbatim(t, m), verbatim, "{t:?} {m:?}");
    }
}

#[test]
fn attestation_is_escaped_and_last() {
    let b = Body::encode("t", "m", meta(5, 0, Some("a\"b")));
    assert_eq!(
        &b.irn()[..],
        br#"{"topic":"t","message":"m","publishedAt":5,"tag":0,"attestation":"a\"b"}"#
    );
    assert_eq!(b.beta_bytes(), br#"{"topic":"t","message":"m""#);
    assert_eq!(Body::from_stored(b.irn().clone()), Some(b));
}

#[test]
fn a_beta_body_is_upgraded_and_other_bytes_refused() {
    let b = Body::from_beta(br#"{"topic":"t","message":"m"}"#, meta(9, 0, None)).unwrap();
    assert_eq!(
        &b.irn()[..],
        br#"{"topic":"t","message":"m","publishedAt":9,"tag":0}"#
    );
    assert_eq!(b, Body::encode("t", "m", meta(9, 0, None)));
    assert_eq!(
        Body::from_stored(ArcBuf::copy_from_slice(br#"{"topic":"t"}"#)),
        None
    );
    assert_eq!(Body::from_beta(b"{", meta(0, 0, None)), None);
}

/// Bodies of sizes that grow, repeat, shrink a little and jump (each taking the buffer
/// prepared for it or not), the largest numbers, an attestation and bodies over the
/// prepared size: each is exactly its reference encoding, and none changes when later
/// ones are written.
#[test]
fn every_body_is_its_own_exact_encoding_whatever_buffer_it_took() {
    let sizes = [
        0, 1, 500, 500, 501, 498, 440, 512, 512, 9000, 512, 4100, 3, 512,
    ];
    let mut made = Vec::new();
    for (i, &n) in sizes.iter().enumerate() {
        let topic = format!("t{i}");
        let message: String = "ab".repeat(n / 2 + n % 2).chars().take(n).collect();
        let att = (i % 5 == 4).then(|| "x\"y".repeat(i));
        let m = meta(u64::MAX - i as u64, u32::MAX - i as u32, att.as_deref());
        let b = Body::encode(&topic, &message, m);
        let mut want = format!(
            r#"{{"topic":"{topic}","message":"{message}","publishedAt":{},"tag":{}"#,
            m.published_at, m.tag
        );
        if let Some(a) = &att {
            want += &format!(r#","attestation":{}"#, serde_json::to_string(a).unwrap());
        }
        want.push('}');
        assert_eq!(std::str::from_utf8(b.irn()).unwrap(), want, "body {i}");
        made.push((b.clone(), want));
    }
    for (i, (b, want)) in made.iter().enumerate() {
        assert_eq!(
            std::str::from_utf8(b.irn()).unwrap(),
            want,
            "body {i} later"
        );
    }
}

/// An evicted body's allocation is written again by a later body of about its size, but
/// only when nothing else held it: a body still shared when it was given back (a push
/// queued by reference, a slice) keeps its bytes, and every body is its own encoding.
#[test]
fn an_evicted_body_is_reused_only_when_nothing_else_holds_it() {
    let body = |i: u64, message: &str| {
        let b = Body::encode("topic", message, meta(1_700_000_000_000 + i, 1, None));
        let want = format!(
            r#"{{"topic":"topic","message":"{message}","publishedAt":{},"tag":1}}"#,
            1_700_000_000_000 + i
        );
        assert_eq!(std::str::from_utf8(b.irn()).unwrap(), want, "body {i}");
        (b, want)
    };
    let m = "m".repeat(500);
    let (first, _) = body(0, &m);
    let (_second, _) = body(1, &m);
    let at = first.irn().as_ptr();
    let only = first.irn().clone();
    drop(first);
    recycle(only);
    // The next body takes the buffer prepared before the eviction, and prepares the
    // evicted one, which the body after it takes.
    let (_third, _) = body(2, &m);
    let (fourth, _) = body(3, &m);
    assert_eq!(
        fourth.irn().as_ptr(),
        at,
        "the evicted allocation, written again"
    );

    // Shared when given back: left alone, and the bodies after it are fresh.
    let kept = fourth.clone();
    let want = std::str::from_utf8(kept.irn()).unwrap().to_string();
    recycle(fourth.irn().clone());
    let later: Vec<_> = (4..8).map(|i| body(i, &m)).collect();
    assert_eq!(std::str::from_utf8(kept.irn()).unwrap(), want);
    assert!(later.iter().all(|(b, _)| b.irn().as_ptr() != at));
    for (b, want) in &later {
        assert_eq!(std::str::from_utf8(b.irn()).unwrap(), *want);
    }

    // Much larger than the next body: freed, never taken (a body holds at most an eighth
    // more than it needs; its address may be the freed one's, which the allocator reuses).
    let (big, _) = body(8, &"x".repeat(2000));
    let only = big.irn().clone();
    drop(big);
    recycle(only);
    let after: Vec<_> = (9..12).map(|i| body(i, &m)).collect();
    for (b, _) in &after {
        assert!(
            b.irn().capacity() <= b.irn().len() + 100,
            "{}",
            b.irn().capacity()
        );
    }
}
