//! "The server still serves": the checks the hostile-client tests make after an attack
//! (greeting, health, a relay round trip). They use only the public interface.

use serde_json::json;

use super::tls::Stream;
use super::{topic, Server, Ws};

/// The `/hello` greeting of a server started without `--service-name`.
pub const HELLO: &str = "Hello World, this is WalletRelay v2.0";

/// A relay round trip on a fresh topic: `sub` subscribes, `publ` publishes message number
/// `n`, `sub` receives exactly it and unsubscribes.
pub fn relay_round_trip<A: Stream, B: Stream>(sub: &mut Ws<A>, publ: &mut Ws<B>, n: usize) {
    let tp = topic();
    let id = sub.subscribe(&tp);
    let msg = format!("round trip {n}");
    publ.publish(&tp, &msg);
    let (_, t, m) = sub.next_push();
    assert_eq!((t.as_str(), m.as_str()), (tp.as_str(), msg.as_str()));
    let r = sub.call("waku_unsubscribe", json!({"topic": tp, "id": id}));
    assert_eq!(r["result"], true, "{r}");
}

impl Server {
    /// The server still answers `/hello`, `/health` and a relay round trip (after `what`).
    pub fn assert_serving(&self, what: &str) {
        let (st, body) = self.get("/hello");
        assert_eq!(st, Some(200), "/hello after {what}");
        assert_eq!(body, HELLO.as_bytes(), "after {what}");
        assert_eq!(self.get("/health").0, Some(204), "/health after {what}");
        let (mut a, mut b) = (self.ws(), self.ws());
        relay_round_trip(&mut a, &mut b, 0);
    }
}
