//! Hostile clients (issue 5 §3 e), against the real binary over real sockets: clients that
//! half-close after a request still get their answer, then EOF; clients that vanish (FIN or
//! reset) mid-frame, mid-head, mid-body, right after a request or with output queued leave
//! no trace: the connection, WebSocket and subscription gauges return to their baseline.
//! Figures are printed (`--nocapture`) and recorded in `docs/RELIABILITY-hostile.md`.

mod common;

use std::io::{Read, Write};
use std::net::Shutdown;
use std::time::Duration;

use common::checks::HELLO;
use common::http::{get, post_subscribe, status_of};
use common::raw_ws::{client_frame, upgrade_request, OP_CONT, OP_TEXT, RELAY_PATH, RFC_KEY};
use common::{raise_nofile_limit, reset_on_close, topic, HttpConn, RawWs, Server, Ws, THREADS};
use serde_json::json;

#[test]
fn clients_that_vanish_or_half_close_leave_no_trace() {
    raise_nofile_limit();
    for t in THREADS {
        vanish_scenario(t);
    }
}

/// A webhook registration for `topic` (to a receiver nobody calls in this test).
fn webhook_registration(topic: &str) -> Vec<u8> {
    post_subscribe(&json!({"topic": topic, "webhook": "http://127.0.0.1:9/hook"}).to_string())
        .into_bytes()
}

fn vanish_scenario(threads: &str) {
    let mut server = Server::start(&["--threads", threads]);
    let base_open = server.wait_metric(
        "walletrelay_connections_open",
        Duration::from_secs(5),
        |v| v <= 1.0,
    );
    assert_eq!(base_open, 1.0, "only the /metrics connection is open");
    let mut counts: Vec<String> = Vec::new();

    counts.push(half_closed_http(&server));
    let mut listener = server.ws();
    let tp = topic();
    listener.subscribe(&tp);
    counts.push(half_closed_websockets(&server, &mut listener, &tp));
    let vanished = vanish_mid_frame(&server, &tp)
        + vanish_mid_request(&server)
        + vanish_with_output_queued(&server);
    counts.push(format!(
        "{vanished} connections vanished mid-frame / mid-head / mid-body / with output queued"
    ));
    drop(listener);

    server.assert_alive("after the vanishing clients");
    server.assert_serving("vanishing clients");
    let open = server.wait_metric(
        "walletrelay_connections_open",
        Duration::from_secs(20),
        |v| v <= base_open,
    );
    let ws_open = server
        .try_metric("walletrelay_websockets_open")
        .expect("/metrics");
    let subs = server.wait_metric("walletrelay_subscriptions", Duration::from_secs(5), |v| {
        v == 0.0
    });
    eprintln!(
        "vanish [--threads {threads}]: {}; afterwards connections_open {open} (baseline \
         {base_open}), websockets_open {ws_open}, subscriptions {subs}",
        counts.join("; ")
    );
    assert_eq!(
        open, base_open,
        "walletrelay_connections_open did not return to its baseline"
    );
    assert_eq!(ws_open, 0.0, "walletrelay_websockets_open");
    assert_eq!(subs, 0.0, "walletrelay_subscriptions");
}

/// Sends `request` on a fresh connection, half-closes it, and reads to EOF.
fn half_closed_exchange(server: &Server, request: &[u8]) -> Vec<u8> {
    let mut s = server.tcp();
    s.write_all(request).unwrap();
    s.shutdown(Shutdown::Write).unwrap();
    let mut got = Vec::new();
    s.read_to_end(&mut got).expect("read to EOF");
    got
}

/// A complete request, then half-close: the answer still comes, then EOF. Also three
/// pipelined requests (three answers in order) and a webhook registration (answered by the
/// topic's home worker).
fn half_closed_http(server: &Server) -> String {
    for i in 0..30 {
        let got = half_closed_exchange(server, get("/hello").as_bytes());
        assert_eq!(
            status_of(&got),
            Some(200),
            "half-closed /hello #{i}: {:?}",
            String::from_utf8_lossy(&got)
        );
        assert!(
            got.ends_with(format!("\r\n\r\n{HELLO}").as_bytes()),
            "{:?}",
            String::from_utf8_lossy(&got)
        );
    }
    for _ in 0..10 {
        let mut c = HttpConn::open(server);
        c.send(
            [get("/hello"), get("/health"), get("/nope")]
                .concat()
                .as_bytes(),
        );
        c.s.shutdown(Shutdown::Write).unwrap();
        let mut statuses = Vec::new();
        while let Ok(r) = c.try_response(false) {
            statuses.push(r.status);
        }
        assert_eq!(statuses, [200, 204, 404], "pipelined then half-closed");
    }
    for i in 0..20 {
        let got = half_closed_exchange(server, &webhook_registration(&topic()));
        assert_eq!(
            status_of(&got),
            Some(200),
            "half-closed POST /subscribe #{i}: {:?}",
            String::from_utf8_lossy(&got)
        );
        assert!(
            got.ends_with(b"{\"success\":true}"),
            "{:?}",
            String::from_utf8_lossy(&got)
        );
    }
    "30 GET + 10x3 pipelined + 20 POST /subscribe half-closed: all answered".into()
}

/// Upgrade and subscribe in one write, then half-close: the 101 and the answer come. And a
/// publish, then half-close: delivered to a live subscriber (`listener`, on `tp`).
fn half_closed_websockets(server: &Server, listener: &mut Ws, tp: &str) -> String {
    for i in 0..20 {
        let mut s = server.tcp();
        let mut b = upgrade_request(RELAY_PATH, RFC_KEY, "").into_bytes();
        let req = if i % 2 == 0 {
            json!({"id": 7, "jsonrpc": "2.0", "method": "waku_subscribe", "params": {"topic": topic()}})
        } else {
            json!({"id": 7, "jsonrpc": "2.0", "method": "waku_publish",
                   "params": {"topic": tp, "message": format!("half-closed {i}"), "ttl": 60}})
        };
        b.extend(client_frame(true, OP_TEXT, req.to_string().as_bytes()));
        s.write_all(&b).unwrap();
        s.shutdown(Shutdown::Write).unwrap();
        let mut c = RawWs::expect_101(s);
        let v = c.recv_json();
        assert_eq!(v["id"], 7, "{v}");
        if i % 2 == 0 {
            assert!(v["result"].is_string(), "{v}");
        } else {
            assert_eq!(v["result"], true, "{v}");
            let (_, t, m) = listener.next_push();
            assert_eq!((t.as_str(), m), (tp, format!("half-closed {i}")));
        }
        let (_, end) = c.close_code_and_end();
        assert!(
            end == "EOF" || end == "Eof",
            "half-closed WebSocket #{i}: {end}"
        );
    }
    "20 WebSockets half-closed after a request: answered, publishes delivered".into()
}

/// Subscribed WebSockets (a third of them on `tp`, which has a live subscriber) send part
/// of a frame, then FIN or reset: cut inside the header, the mask, the payload; or after a
/// whole first fragment of a fragmented message, inside the continuation. Returns how many.
fn vanish_mid_frame(server: &Server, tp: &str) -> usize {
    for i in 0..60 {
        let mut c = RawWs::open(server);
        c.subscribe(&if i % 3 == 0 { tp.to_string() } else { topic() });
        let mut f = Vec::new();
        if i % 4 == 3 {
            f.extend(client_frame(false, OP_TEXT, b"{\"id\":2,"));
        }
        let start = f.len();
        f.extend(client_frame(
            i % 4 != 3,
            if i % 4 == 3 { OP_CONT } else { OP_TEXT },
            &[b'x'; 1000],
        ));
        let cut = start + [1usize, 2, 5, 9, 100, 999][i % 6];
        c.send_raw(&f[..cut]);
        if i % 2 == 0 {
            reset_on_close(&c.sock);
        } else {
            let _ = c.sock.shutdown(Shutdown::Both);
        }
    }
    60
}

/// Vanish (FIN or reset) mid-head and mid-body, right after a webhook registration (gone
/// before its possibly cross-worker answer), and right after asking for an upgrade.
/// Returns how many.
fn vanish_mid_request(server: &Server) -> usize {
    for i in 0..80 {
        let mut s = server.tcp();
        let bytes: Vec<u8> = match i % 4 {
            0 => b"GET /hello HTTP/1.1\r\nHo".to_vec(),
            1 => {
                let mut b = webhook_registration(&topic());
                b.truncate(b.len() - 10);
                b
            }
            2 => webhook_registration(&topic()),
            _ => upgrade_request(RELAY_PATH, RFC_KEY, "").into_bytes(),
        };
        s.write_all(&bytes).unwrap();
        if i % 2 == 0 {
            reset_on_close(&s);
        }
    }
    80
}

/// Subscribers that stop reading while 8 KB messages pile up for them, then reset.
/// Returns how many.
fn vanish_with_output_queued(server: &Server) -> usize {
    let busy = topic();
    let stalled: Vec<RawWs> = (0..20)
        .map(|_| {
            let mut c = RawWs::open(server);
            c.subscribe(&busy);
            c
        })
        .collect();
    let mut publ = server.ws();
    for i in 0..100 {
        publ.publish(&busy, &format!("{i:04}{}", "z".repeat(8192)));
    }
    let n = stalled.len();
    for c in stalled {
        reset_on_close(&c.sock);
    }
    n
}
