//! Subscribe / publish / deliver over real WebSockets, at one and at four workers.

mod common;
use common::{topic, Server, THREADS};
use serde_json::json;

#[test]
fn subscriber_receives_what_another_connection_publishes() {
    for t in THREADS {
        let s = Server::start(&["--threads", t]);
        let mut sub = s.ws();
        let mut publ = s.ws();
        let tp = topic();
        let id = sub.subscribe(&tp);
        assert_eq!(id.len(), 64);
        assert!(id
            .bytes()
            .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase()));
        publ.publish(&tp, "hello");
        assert_eq!(sub.next_push(), (id, tp.clone(), "hello".to_string()));
    }
}
