//! The signed POSTs of `notify::Notifier` (DECISIONS 13) as a loopback receiver gets them:
//! a watch event for each matching registration, `{"eventAuth":["<JWT>"]}` whose JWT
//! verifies against the relay's public key and carries relay-api.md (a)'s claims; a push to
//! `{push url}/clients/{id}` whose `X-Ed25519-Signature` verifies exactly as push-server's
//! `validate_signature.rs` computes it; a 5xx retried, a 4xx not.
//!
//! The engines call the notifier (issue 47's client-id subscriptions); here the test calls it
//! itself, through the library, with the real webhook pool and sockets.

mod common;

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use common::jwt::{claims_of, did_key, unhex, verifies, Signer};
use common::wait::wait_until;
use common::webhook::{Receiver, Reply, Seen};
use serde_json::{json, Value};
use walletrelay::identity::RelayKey;
use walletrelay::notice::{Notice, Notify, PushNotice, Status, Typ};
use walletrelay::notify::push_urls::PushUrls;
use walletrelay::notify::Notifier;
use walletrelay::webhook::{WebhookConfig, WebhookPool};

const WAIT: Duration = Duration::from_secs(10);

fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

fn notifier(push: PushUrls) -> Notifier {
    let pool = WebhookPool::start(
        WebhookConfig {
            allow_private: true,
            threads: 1,
            ..WebhookConfig::default()
        },
        Arc::new(|_, _| {}),
    );
    let key = RelayKey::random().unwrap();
    Notifier::new(Arc::new(key), 1000, pool, push, None)
}

fn register(n: &Notifier, c: &Signer, whu: &str, typ: &str, sts: Value, tag: Value) {
    let t = now();
    let token = c.sign(&json!({
        "iss": c.did(), "aud": "https://relay.example", "sub": "https://svc.example/",
        "iat": t, "exp": t + 3600, "act": "irn_watchRegister", "typ": typ, "whu": whu,
        "tag": tag, "sts": sts,
    }));
    assert_eq!(n.register(&token).unwrap(), n.key().did_key());
}

fn notice<'a>(client: &'a str, typ: Typ, status: Status, id: u64, tag: u32) -> Notice<'a> {
    Notice {
        client,
        typ,
        status,
        message_id: id,
        topic: "ab",
        message: "the \"message\"",
        attestation: Some("att"),
        published_at: 1_764_000_000_123,
        tag,
        ttl: 300,
    }
}

/// The event JWT of a webhook POST, checked against the relay's key; its claims.
fn event_claims(n: &Notifier, seen: &Seen) -> Value {
    assert_eq!(seen.method, "POST");
    assert_eq!(seen.header("content-type"), Some("application/json"));
    let body: Value = serde_json::from_slice(&seen.body).unwrap();
    let list = body["eventAuth"].as_array().unwrap();
    assert_eq!(list.len(), 1, "{body}");
    let jwt = list[0].as_str().unwrap();
    let public = unhex(n.key().public_hex());
    assert!(verifies(jwt, &public), "signature");
    let c = claims_of(jwt);
    assert_eq!(c["iss"], did_key(&public));
    c
}

#[test]
fn events_go_to_the_matching_registrations_signed_by_the_relay() {
    let hooks = Receiver::start(|_| Reply::Status(204));
    let n = notifier(PushUrls::Off);
    let c = Signer::random();
    let client = c.did();
    assert!(!n.watched(&client));
    let queued = json!(["queued"]);
    register(&n, &c, &hooks.url("/sub"), "subscriber", queued, json!([]));
    register(
        &n,
        &c,
        &hooks.url("/pub"),
        "publisher",
        json!(["accepted"]),
        json!([7]),
    );
    assert!(n.watched(&client));

    // Not wanted: a status, a tag or a side nobody registered for; nobody watches the other.
    n.event(&notice(&client, Typ::Subscriber, Status::Accepted, 1, 7));
    n.event(&notice(&client, Typ::Publisher, Status::Accepted, 2, 8));
    n.event(&notice(
        "did:key:zOther",
        Typ::Subscriber,
        Status::Queued,
        3,
        7,
    ));
    // Wanted: the subscriber watch (every tag), then the publisher watch (tag 7).
    n.event(&notice(&client, Typ::Subscriber, Status::Queued, 4, 1108));
    let first = hooks.next(WAIT).expect("an event");
    assert_eq!(first.target, "/sub");
    let e = event_claims(&n, &first);
    assert_eq!(e["aud"], "https://svc.example/");
    assert_eq!(e["sub"], client);
    assert_eq!(e["act"], "irn_watchEvent");
    assert_eq!(e["typ"], "subscriber");
    assert_eq!(e["whu"], hooks.url("/sub"));
    let iat = e["iat"].as_u64().unwrap();
    assert_eq!(e["exp"].as_u64().unwrap(), iat + 300);
    assert_eq!(
        e["evt"],
        json!({"messageId": 4, "status": "queued", "topic": "ab", "message": "the \"message\"",
               "attestation": "att", "publishedAt": 1_764_000_000_123u64, "tag": 1108})
    );
    n.event(&notice(&client, Typ::Publisher, Status::Accepted, 5, 7));
    let second = hooks.next(WAIT).expect("an event");
    assert_eq!(second.target, "/pub");
    let e = event_claims(&n, &second);
    assert_eq!(
        (e["typ"].clone(), e["evt"]["messageId"].clone()),
        (json!("publisher"), json!(5))
    );
    assert_eq!(hooks.hits(), 2, "the unwanted notices were never sent");
    let mut text = String::new();
    n.render_metrics(&mut text);
    assert!(
        wait_until(WAIT, || {
            let mut t = String::new();
            n.render_metrics(&mut t);
            t.contains("walletrelay_watch_events_total{result=\"delivered\"} 2")
        }),
        "{text}"
    );
}

#[test]
fn a_push_is_signed_as_push_server_checks_it_and_a_5xx_is_retried() {
    // The first try fails with 503, the retry gets 202 (push-server's answer).
    let push = Receiver::start(|i| Reply::Status(if i == 0 { 503 } else { 202 }));
    let urls = PushUrls::new(Some(&push.url("/{projectId}")), None).unwrap();
    let n = notifier(urls);
    assert!(n.pushes());
    let wallet = Signer::random().did();
    n.push(&PushNotice {
        client: &wallet,
        project: "p1",
        topic: "cd",
        message: "ciphertext",
        tag: 1108,
        ttl: 300,
    });
    let first = push.next(WAIT).expect("a push");
    let retry = push.next(WAIT).expect("the push retried after a 503");
    for seen in [&first, &retry] {
        let id = wallet.strip_prefix("did:key:").unwrap();
        assert_eq!(seen.target, format!("/p1/clients/{id}"));
        assert_eq!(seen.header("content-type"), Some("application/json"));
        let ts = seen.header("x-ed25519-timestamp").unwrap();
        let sig = unhex(seen.header("x-ed25519-signature").unwrap());
        // validate_signature.rs: format!("{}.{}.{}", timestamp, body.len(), body).
        let body = String::from_utf8(seen.body.clone()).unwrap();
        let signed = format!("{}.{}.{}", ts, body.len(), body);
        let public = unhex(n.key().public_hex());
        let ok = ring::signature::UnparsedPublicKey::new(&ring::signature::ED25519, &public)
            .verify(signed.as_bytes(), &sig)
            .is_ok();
        assert!(ok, "signature");
        let v: Value = serde_json::from_str(&body).unwrap();
        assert_eq!(v["topic"], "cd");
        assert_eq!(v["tag"], 1108);
        assert_eq!(v["message"], "ciphertext");
        let digest = ring::digest::digest(&ring::digest::SHA256, b"ciphertext");
        let hex: String = digest.as_ref().iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(v["id"], hex);
        assert_eq!(
            v["payload"],
            json!({"topic": "cd", "flags": 3, "blob": "ciphertext"})
        );
    }
    assert_eq!(first.body, retry.body);
    assert!(wait_until(WAIT, || {
        let mut t = String::new();
        n.render_metrics(&mut t);
        t.contains("walletrelay_pushes_total{result=\"delivered\"} 1")
    }));
}

#[test]
fn a_4xx_is_final_and_a_project_without_a_push_url_is_not_pushed() {
    let push = Receiver::start(|_| Reply::Status(400));
    let dir = common::tempdir::TempDir::new("push-urls");
    std::fs::create_dir_all(dir.path()).unwrap();
    let file = dir.path().join("urls");
    std::fs::write(&file, format!("# project url\np1 {}\n", push.url("/echo"))).unwrap();
    let urls = PushUrls::new(None, Some(&format!("@{}", file.display()))).unwrap();
    let n = notifier(urls);
    let p = |project| PushNotice {
        client: "did:key:z6MkWallet",
        project,
        topic: "cd",
        message: "m",
        tag: 1100,
        ttl: 300,
    };
    n.push(&p("p2"));
    n.push(&p("p1"));
    let seen = push.next(WAIT).expect("a push");
    assert_eq!(seen.target, "/echo/clients/z6MkWallet");
    // Counted as rejected only when the pool gave the call up (a retry would not count).
    assert!(wait_until(WAIT, || {
        let mut t = String::new();
        n.render_metrics(&mut t);
        t.contains("walletrelay_pushes_total{result=\"rejected\"} 1")
    }));
    assert_eq!(push.hits(), 1, "p2 has no push URL");
}
