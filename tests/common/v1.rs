//! WalletConnect 1.0 bridge frames (DECISIONS §8) over a [`RawWs`]: the frames a 1.0 client
//! sends, written exactly as `@walletconnect/socket-transport` 1.8 writes them, the exact
//! bytes the server must send on, and "nothing else came" checks. Pure client side: which
//! frame is right is the tests' business.

use std::time::{Duration, Instant};

use super::raw_ws::{Frame, Next, RawWs, OP_TEXT};
use super::Server;

/// A client frame as the 1.0 client writes it (`JSON.stringify` of `{topic, type, payload,
/// silent}`); `silent: None` leaves the key out, as other clients do.
pub fn client_frame(topic: &str, kind: &str, payload: &str, silent: Option<bool>) -> String {
    let mut out = format!(
        "{{\"topic\":{},\"type\":{},\"payload\":{}",
        serde_json::to_string(topic).unwrap_or_default(),
        serde_json::to_string(kind).unwrap_or_default(),
        serde_json::to_string(payload).unwrap_or_default()
    );
    if let Some(s) = silent {
        out.push_str(&format!(",\"silent\":{s}"));
    }
    out.push('}');
    out
}

/// The exact text the server sends a `pub` on as: `{"topic":..,"type":"pub","payload":..,
/// "silent":..}` (for payloads and topics without characters JSON must escape).
pub fn sent_pub(topic: &str, payload: &str, silent: bool) -> String {
    format!(
        "{{\"topic\":\"{topic}\",\"type\":\"pub\",\"payload\":\"{payload}\",\"silent\":{silent}}}"
    )
}

/// The exact text of a JSON-RPC error with `id: null` (what a refused v1 frame gets).
pub fn null_id_error(code: i32, message: &str) -> String {
    format!(
        "{{\"id\":null,\"jsonrpc\":\"2.0\",\"error\":{{\"code\":{code},\"message\":{}}}}}",
        serde_json::to_string(message).unwrap_or_default()
    )
}

impl RawWs {
    /// Sends a v1 `sub` as the 1.0 client does (`payload: ""`, `silent: true`).
    pub fn v1_sub(&mut self, topic: &str) {
        self.send_text(&client_frame(topic, "sub", "", Some(true)));
    }

    /// Sends a v1 `pub`.
    pub fn v1_pub(&mut self, topic: &str, payload: &str, silent: Option<bool>) {
        self.send_text(&client_frame(topic, "pub", payload, silent));
    }

    /// Sends a v1 `ack` as the 1.0 client does after each frame it receives.
    pub fn v1_ack(&mut self, topic: &str) {
        self.send_text(&client_frame(topic, "ack", "", Some(true)));
    }

    /// The next frame must be a text frame of exactly `text`.
    pub fn expect_text(&mut self, text: &str, who: &str) {
        match self.next() {
            Next::Frame(Frame {
                op: OP_TEXT,
                fin: true,
                payload,
                ..
            }) => assert_eq!(
                String::from_utf8_lossy(&payload),
                text,
                "{who}: another frame than expected"
            ),
            other => panic!("{who}: expected the text {text:?}, got {other:?}"),
        }
    }

    /// Nothing is waiting for this client: the answer to a ping is the very next frame (so
    /// everything it sent before was processed, and nothing was queued for it meanwhile).
    pub fn settled(&mut self, who: &str) {
        if let Err(e) = self.ping_pong() {
            panic!("{who}: {e}");
        }
    }
}

impl Server {
    /// The sum of every series of `name` labelled `protocol="v1"`.
    pub fn v1_metric(&self, name: &str) -> f64 {
        let text = self.metrics_text().unwrap_or_default();
        super::metrics::sum_labelled(&text, name, "protocol=\"v1\"")
    }

    /// Polls `/metrics` until the per-worker gauge `name`, summed, satisfies `ok` (10 s at
    /// most); returns its last value.
    pub fn wait_gauge(&self, name: &str, ok: impl Fn(f64) -> bool) -> f64 {
        self.wait_metric(name, Duration::from_secs(10), ok)
    }

    /// Waits until the connections closed so far have left the relay: the subscriptions
    /// gauge is down to `subs` (a v1 subscription leaves it once the topic's home worker has
    /// been told).
    pub fn wait_unsubscribed(&self, subs: f64) {
        let start = Instant::now();
        let got = self.wait_gauge("walletrelay_subscriptions", |n| n <= subs);
        assert!(
            got <= subs,
            "still {got} subscriptions after {:?}",
            start.elapsed()
        );
    }
}
