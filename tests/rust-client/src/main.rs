//! `wr-rust-client`: a client of walletrelay that is not the JS SDK. It runs scenarios of the
//! published Rust relay client against a relay and prints one JSON line per step:
//! `{"scenario", "step", "ok", ...}` (on failure `"error"`); it exits 0 once every step ran,
//! whatever their outcome, so the test reads every line (exit 2: bad arguments).
//!
//! - `ws --relay ws://HOST:PORT`: `reown-relay-client`'s WebSocket `Client` (crates.io 0.1.0,
//!   a release of reown-rust's `relay_client`): two clients connect with their own relay-auth
//!   JWTs, one subscribes, the other publishes, the first receives; a third fetches; then
//!   `irn_batchReceive` of the received message, `irn_unsubscribe`, `irn_subscribeBlocking`
//!   and `irn_batchSubscribeBlocking`.
//! - `http --relay http://HOST:PORT --topic HEX`: the HTTP transport (`POST /rpc`), as
//!   reown-rust's `relay_client/src/http.rs` does it ([`http`]: that module is not in the
//!   published crate); publish on `--topic` (the test's WebSocket subscriber waits there),
//!   fetch it, then as a watching service: subscribe a topic, `irn_watchRegister` with its own
//!   webhook, a second client publishes there, the event JWT is checked as Notify server
//!   does, `irn_batchReceive`, fetch again, `irn_watchUnregister`, `irn_unsubscribe`.

mod http;

use std::collections::HashMap;
use std::sync::mpsc;
use std::time::Duration;

use reown_relay_client::{
    websocket::{Client, ConnectionHandler, PublishedMessage},
    ConnectionOptions,
};
use reown_relay_rpc::{
    auth::{ed25519_dalek::SigningKey, AuthToken},
    domain::{DecodedClientId, Topic},
    rpc::Receipt,
};
use serde_json::{json, Value};

/// How long one step may take before it is reported as failed.
pub const STEP: Duration = Duration::from_secs(15);

/// The project id every client names (`--project-id`).
const DEFAULT_PROJECT: &str = "walletrelay-test";

/// Prints one result line.
pub fn report(scenario: &str, step: &str, result: Result<Value, String>) {
    let mut line = json!({"scenario": scenario, "step": step});
    match result {
        Ok(Value::Object(fields)) => {
            line["ok"] = json!(true);
            for (k, v) in fields {
                line[k] = v;
            }
        }
        Ok(other) => {
            line["ok"] = json!(true);
            line["result"] = other;
        }
        Err(e) => {
            line["ok"] = json!(false);
            line["error"] = json!(e);
        }
    }
    println!("{line}");
}

/// A fresh Ed25519 identity.
pub fn keypair() -> SigningKey {
    SigningKey::generate(&mut rand::thread_rng())
}

/// `did:key:z...` of a key.
pub fn did_key(key: &SigningKey) -> String {
    DecodedClientId::from_key(&key.verifying_key()).to_did_key()
}

/// 32 random bytes in hex: a topic.
pub fn random_topic() -> Topic {
    use rand::RngCore;
    let mut b = [0u8; 32];
    rand::thread_rng().fill_bytes(&mut b);
    Topic::from(b.iter().map(|x| format!("{x:02x}")).collect::<String>())
}

struct Args {
    scenario: String,
    relay: String,
    project: String,
    options: HashMap<String, String>,
}

fn args() -> Result<Args, String> {
    let mut it = std::env::args().skip(1);
    let scenario = it
        .next()
        .ok_or("usage: wr-rust-client ws|http --relay URL [--topic HEX]")?;
    let mut options = HashMap::new();
    while let Some(k) = it.next() {
        let name = k
            .strip_prefix("--")
            .ok_or(format!("unexpected argument {k}"))?;
        let v = it.next().ok_or(format!("{k} needs a value"))?;
        options.insert(name.to_string(), v);
    }
    let relay = options.remove("relay").ok_or("--relay URL is required")?;
    let project = options
        .remove("project-id")
        .unwrap_or_else(|| DEFAULT_PROJECT.to_string());
    Ok(Args {
        scenario,
        relay,
        project,
        options,
    })
}

fn main() {
    let a = match args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("{e}");
            std::process::exit(2);
        }
    };
    match a.scenario.as_str() {
        "ws" => {
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build();
            match rt {
                Ok(rt) => rt.block_on(ws_scenario(&a.relay, &a.project)),
                Err(e) => report("ws", "runtime", Err(e.to_string())),
            }
        }
        "http" => {
            let Some(topic) = a.options.get("topic") else {
                eprintln!("http needs --topic HEX");
                std::process::exit(2);
            };
            http::scenario(&a.relay, &a.project, topic);
        }
        other => {
            eprintln!("unknown scenario {other} (ws, http)");
            std::process::exit(2);
        }
    }
}

/// Hands the messages a WebSocket client receives to the scenario.
struct Inbox(mpsc::Sender<PublishedMessage>);

impl ConnectionHandler for Inbox {
    fn message_received(&mut self, message: PublishedMessage) {
        let _ = self.0.send(message);
    }
}

/// The options of one WebSocket client: its own key, a relay-auth JWT as the client's
/// examples make it (`AuthToken::new(sub).aud(..).ttl(..)`; walletrelay's upgrade wants
/// `exp`), the JWT in the query.
fn ws_options(relay: &str, project: &str, key: &SigningKey) -> Result<ConnectionOptions, String> {
    let origin = url::Url::parse(relay)
        .map_err(|e| e.to_string())?
        .origin()
        .unicode_serialization();
    let auth = AuthToken::new("wr-rust-client")
        .aud(origin)
        .ttl(Duration::from_secs(3600))
        .as_jwt(key)
        .map_err(|e| e.to_string())?;
    Ok(ConnectionOptions::new(project.to_string(), auth).with_address(relay))
}

async fn connect(
    relay: &str,
    project: &str,
) -> Result<(Client, mpsc::Receiver<PublishedMessage>, String), String> {
    let key = keypair();
    let (tx, rx) = mpsc::channel();
    let client = Client::new(Inbox(tx));
    let opts = ws_options(relay, project, &key)?;
    tokio::time::timeout(STEP, client.connect(&opts))
        .await
        .map_err(|_| "connect timed out".to_string())?
        .map_err(|e| e.to_string())?;
    Ok((client, rx, did_key(&key)))
}

async fn step<T, E: std::fmt::Display>(
    fut: impl std::future::Future<Output = Result<T, E>>,
) -> Result<T, String> {
    tokio::time::timeout(STEP, fut)
        .await
        .map_err(|_| format!("no answer within {STEP:?}"))?
        .map_err(|e| e.to_string())
}

async fn ws_scenario(relay: &str, project: &str) {
    const S: &str = "ws";
    let (subscriber, inbox, sub_id) = match connect(relay, project).await {
        Ok(c) => c,
        Err(e) => return report(S, "connect", Err(e)),
    };
    let (publisher, _pub_inbox, pub_id) = match connect(relay, project).await {
        Ok(c) => c,
        Err(e) => return report(S, "connect", Err(e)),
    };
    report(
        S,
        "connect",
        Ok(json!({"subscriber": sub_id, "publisher": pub_id})),
    );

    let topic = random_topic();
    // Bytes that a relay must pass through untouched: JSON escapes, non-ASCII, base64.
    let message = format!(
        "wr-rust-client \"ws\" \\ é ✓ {} AAECAwQ=",
        topic.value().get(..8).unwrap_or("")
    );
    let r = step(subscriber.subscribe(topic.clone())).await;
    report(
        S,
        "subscribe",
        r.map(|id| json!({"subscription_id": id.value().as_ref()})),
    );

    let r = step(publisher.publish(
        topic.clone(),
        message.as_str(),
        None,
        1000,
        Duration::from_secs(300),
        false,
    ))
    .await;
    report(
        S,
        "publish",
        r.map(|()| json!({"topic": topic.value().as_ref(), "message": message})),
    );

    let got = tokio::task::spawn_blocking(move || inbox.recv_timeout(STEP))
        .await
        .map_err(|e| e.to_string())
        .and_then(|r| r.map_err(|_| format!("nothing received within {STEP:?}")));
    let received = got.as_ref().ok().cloned();
    report(
        S,
        "receive",
        got.map(|m| {
            json!({"topic": m.topic.value().as_ref(), "message": m.message.as_ref(), "tag": m.tag,
                "message_id": m.message_id.value(), "subscription_id": m.subscription_id.value().as_ref()})
        }),
    );

    match connect(relay, project).await {
        Ok((fetcher, _, _)) => {
            let r = step(fetcher.fetch(topic.clone())).await;
            report(
                S,
                "fetch",
                r.map(|f| {
                    let messages: Vec<Value> = f
                        .messages
                        .iter()
                        .map(|m| json!({"topic": m.topic.value().as_ref(), "message": m.message.as_ref(), "tag": m.tag}))
                        .collect();
                    json!({"messages": messages, "has_more": f.has_more})
                }),
            );
            let _ = fetcher.disconnect().await;
        }
        Err(e) => report(S, "fetch", Err(e)),
    }

    match received {
        Some(m) => {
            let receipt = Receipt {
                topic: topic.clone(),
                message_id: m.message_id,
            };
            let r = step(subscriber.batch_receive(vec![receipt]).await).await;
            report(S, "batch_receive", r.map(|b| json!(b)));
        }
        None => report(S, "batch_receive", Err("nothing was received".into())),
    }

    let r = step(subscriber.unsubscribe(topic.clone())).await;
    report(S, "unsubscribe", r.map(|()| json!({})));

    let r = step(subscriber.subscribe_blocking(random_topic())).await;
    report(
        S,
        "subscribe_blocking",
        r.map(|id| json!({"subscription_id": id.value().as_ref()})),
    );
    let r = step(subscriber.batch_subscribe_blocking(vec![random_topic(), random_topic()])).await;
    report(
        S,
        "batch_subscribe_blocking",
        r.map(|results| {
            let ids: Vec<Value> = results
                .into_iter()
                .map(|x| match x {
                    Ok(id) => json!({"id": id.value().as_ref()}),
                    Err(e) => json!({"error": e.to_string()}),
                })
                .collect();
            json!({"results": ids})
        }),
    );
    let _ = subscriber.disconnect().await;
    let _ = publisher.disconnect().await;
    report(S, "done", Ok(json!({})));
}
