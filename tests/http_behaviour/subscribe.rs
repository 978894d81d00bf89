//! `POST /subscribe` over raw HTTP (DECISIONS §4): the exact answers, every 400 naming its
//! parameter, registrations pipelined across workers answered in order. A part of
//! `http_behaviour.rs`, in a file of its own for its size.

use super::*;

#[test]
fn subscribe_with_valid_topic_and_webhook_is_200_success_true() {
    let s = Server::start(&[]);
    let r = s.request(&post_subscribe(
        r#"{"topic":"t","webhook":"https://example.com/hook"}"#,
    ));
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(r.header("Content-Type"), Some(JSON));
    assert_eq!(r.body_str(), r#"{"success":true}"#);
}

#[test]
fn subscribe_without_webhook_is_400_naming_webhook() {
    let s = Server::start(&[]);
    let r = s.request(&post_subscribe(r#"{"topic":"t"}"#));
    assert_eq!(r.status, 400, "{r:?}");
    assert_eq!(r.header("Content-Type"), Some(JSON));
    assert_eq!(r.body_str(), WEBHOOK_ERR);
}

#[test]
fn subscribe_without_topic_is_400_naming_topic() {
    let s = Server::start(&[]);
    for body in [
        r#"{"webhook":"https://example.com/hook"}"#,
        r#"{"topic":"","webhook":"https://example.com/hook"}"#,
        r#"{"topic":7,"webhook":"https://example.com/hook"}"#,
    ] {
        let r = s.request(&post_subscribe(body));
        assert_eq!(r.status, 400, "{body}: {r:?}");
        assert_eq!(r.body_str(), TOPIC_ERR, "{body}");
    }
}

#[test]
fn subscribe_with_a_non_http_webhook_is_400_naming_webhook() {
    let s = Server::start(&[]);
    for body in [
        r#"{"topic":"t","webhook":"ftp://x"}"#,
        r#"{"topic":"t","webhook":""}"#,
        r#"{"topic":"t","webhook":"example.com/hook"}"#,
        r#"{"topic":"t","webhook":42}"#,
    ] {
        let r = s.request(&post_subscribe(body));
        assert_eq!(r.status, 400, "{body}: {r:?}");
        assert_eq!(r.body_str(), WEBHOOK_ERR, "{body}");
    }
}

#[test]
fn subscribe_with_a_body_that_is_not_json_is_400_success_false() {
    let s = Server::start(&[]);
    for body in ["topic=t&webhook=https://example.com", "{\"topic\":", ""] {
        let r = s.request(&post_subscribe(body));
        assert_eq!(r.status, 400, "{body:?}: {r:?}");
        assert_eq!(r.header("Content-Type"), Some(JSON));
        let v = r.json();
        assert_eq!(v["success"], false, "{v}");
        assert!(v["error"].as_str().is_some_and(|e| !e.is_empty()), "{v}");
    }
}

#[test]
fn subscribing_the_same_pair_twice_is_200_both_times() {
    let s = Server::start(&["--threads", "4"]);
    let body = format!(
        r#"{{"topic":"{}","webhook":"https://example.com/hook"}}"#,
        topic()
    );
    for _ in 0..2 {
        let r = s.request(&post_subscribe(&body));
        assert_eq!(r.status, 200, "{r:?}");
        assert_eq!(r.body_str(), r#"{"success":true}"#);
    }
}

#[test]
fn many_topic_registrations_pipelined_across_workers_are_answered_in_order() {
    let s = Server::start(&["--threads", "4"]);
    let mut c = HttpConn::open(&s);
    // Valid registrations for 100 distinct topics (about three in four are homed on another
    // worker than this connection's), interleaved with answers computed locally, so that a
    // reordering shows in the sequence of statuses and bodies.
    let mut raw = String::new();
    let mut expect: Vec<(u16, &str)> = Vec::new();
    for i in 0..100 {
        raw.push_str(&post_subscribe(&format!(
            r#"{{"topic":"{}","webhook":"https://example.com/h{i}"}}"#,
            topic()
        )));
        expect.push((200, r#"{"success":true}"#));
        match i % 3 {
            0 => {
                raw.push_str(&get("/hello"));
                expect.push((200, HELLO));
            }
            1 => {
                raw.push_str(&post_subscribe(r#"{"topic":"t"}"#));
                expect.push((400, WEBHOOK_ERR));
            }
            _ => {}
        }
    }
    c.send(raw.as_bytes());
    for (i, (status, body)) in expect.iter().enumerate() {
        let r = c.response(false);
        if *status == 400 {
            // Compared as JSON: the exact bytes are checked by the dedicated tests above,
            // this test is about the order of the answers.
            let want: Value = serde_json::from_str(body).unwrap();
            assert_eq!(
                (r.status, r.json()),
                (*status, want),
                "answer #{i} out of order or wrong"
            );
        } else {
            assert_eq!(
                (r.status, r.body_str()),
                (*status, *body),
                "answer #{i} out of order or wrong"
            );
        }
    }
    c.expect_open_and_silent(300);
}
