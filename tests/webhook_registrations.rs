//! `POST /subscribe` registration limits: at most `--max-webhooks-per-topic` webhooks per
//! topic (400 past it) and `--max-webhooks` in all (429 past it), decided on the topic's home
//! worker whichever worker accepted the request.

mod common;
use common::{topic, Server};

#[test]
fn per_topic_webhook_limit_answers_400_and_duplicates_do_not_count() {
    for t in common::THREADS {
        let s = Server::start(&["--threads", t, "--max-webhooks-per-topic", "3"]);
        let tp = topic();
        for i in 0..3 {
            let (st, body) = s.register_webhook(&tp, &format!("https://hooks.example.com/{i}"));
            assert_eq!((st, body.as_str()), (200, r#"{"success":true}"#));
        }
        // The same pair again is still one registration.
        assert_eq!(
            s.register_webhook(&tp, "https://hooks.example.com/1").0,
            200
        );
        let (st, body) = s.register_webhook(&tp, "https://hooks.example.com/4");
        assert_eq!(st, 400, "{body}");
        assert_eq!(
            body,
            r#"{"success":false,"error":"Too many webhooks for this topic"}"#
        );
        // Another topic is not affected.
        assert_eq!(
            s.register_webhook(&topic(), "https://hooks.example.com/4")
                .0,
            200
        );
    }
}

#[test]
fn global_webhook_limit_answers_429() {
    let s = Server::start(&["--threads", "4", "--max-webhooks", "5"]);
    for i in 0..5 {
        assert_eq!(
            s.register_webhook(&topic(), &format!("https://h.example.com/{i}"))
                .0,
            200
        );
    }
    let (st, body) = s.register_webhook(&topic(), "https://h.example.com/x");
    assert_eq!(st, 429, "{body}");
    assert_eq!(
        body,
        r#"{"success":false,"error":"Too many webhook registrations"}"#
    );
}
