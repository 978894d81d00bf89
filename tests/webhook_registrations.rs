//! `POST /subscribe` registration limits: at most `--max-webhooks-per-topic` webhooks per
//! topic (400 past it) and `--max-webhooks` in all (429 past it), decided on the topic's home
//! worker whichever worker accepted the request.

mod common;
use common::{topic, Server};

fn register(s: &Server, topic: &str, url: &str) -> (u16, String) {
    let body = format!(r#"{{"topic":"{topic}","webhook":"{url}"}}"#);
    let req = format!(
        "POST /subscribe HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    let raw = String::from_utf8(s.raw_exchange(req.as_bytes())).unwrap();
    let status = raw[9..12].parse().unwrap();
    let body = raw.split("\r\n\r\n").nth(1).unwrap_or("").to_string();
    (status, body)
}

#[test]
fn per_topic_webhook_limit_answers_400_and_duplicates_do_not_count() {
    for t in common::THREADS {
        let s = Server::start(&["--threads", t, "--max-webhooks-per-topic", "3"]);
        let tp = topic();
        for i in 0..3 {
            let (st, body) = register(&s, &tp, &format!("https://hooks.example.com/{i}"));
            assert_eq!((st, body.as_str()), (200, r#"{"success":true}"#));
        }
        // The same pair again is still one registration.
        assert_eq!(register(&s, &tp, "https://hooks.example.com/1").0, 200);
        let (st, body) = register(&s, &tp, "https://hooks.example.com/4");
        assert_eq!(st, 400, "{body}");
        assert_eq!(
            body,
            r#"{"success":false,"error":"Too many webhooks for this topic"}"#
        );
        // Another topic is not affected.
        assert_eq!(register(&s, &topic(), "https://hooks.example.com/4").0, 200);
    }
}

#[test]
fn global_webhook_limit_answers_429() {
    let s = Server::start(&["--threads", "4", "--max-webhooks", "5"]);
    for i in 0..5 {
        assert_eq!(
            register(&s, &topic(), &format!("https://h.example.com/{i}")).0,
            200
        );
    }
    let (st, body) = register(&s, &topic(), "https://h.example.com/x");
    assert_eq!(st, 429, "{body}");
    assert_eq!(
        body,
        r#"{"success":false,"error":"Too many webhook registrations"}"#
    );
}
