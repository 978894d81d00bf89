//! The webhook tests' support: a small HTTP/1.1 webhook receiver on 127.0.0.1 (its own
//! threads, keep-alive) that records every request and answers as the test says.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Arc};
use std::thread;
use std::time::Duration;

/// What a receiver does with its n-th request (0-based, over all connections).
#[derive(Clone, Copy, Debug)]
pub enum Reply {
    /// Answer this status at once (3xx with a `Location` on the same receiver).
    Status(u16),
    /// Wait, then answer this status.
    After(Duration, u16),
    /// Never answer; keep the connection open until the client gives up.
    Hang,
}

/// A request as the receiver saw it.
#[derive(Debug)]
pub struct Seen {
    /// Which accepted connection it came on.
    pub conn: usize,
    /// Request method.
    pub method: String,
    /// Request target (path and query).
    pub target: String,
    /// Header fields in order.
    pub headers: Vec<(String, String)>,
    /// The body (by `Content-Length`).
    pub body: Vec<u8>,
}

impl Seen {
    /// The first header field named `name` (any case).
    pub fn header(&self, name: &str) -> Option<&str> {
        super::http::find_header(&self.headers, name)
    }
}

/// A small HTTP/1.1 receiver with keep-alive, on its own threads.
pub struct Receiver {
    /// Where it listens.
    pub addr: SocketAddr,
    seen: mpsc::Receiver<Seen>,
    hits: Arc<AtomicUsize>,
}

impl Receiver {
    /// Starts a receiver answering its n-th request (0-based) with `reply(n)`.
    pub fn start(reply: impl Fn(usize) -> Reply + Send + Sync + 'static) -> Receiver {
        Receiver::start_on("127.0.0.1:0", reply)
    }

    /// [`Receiver::start`] on the address `at` (a webhook URL stored by another run, as in
    /// the layout fixtures).
    pub fn start_on(at: &str, reply: impl Fn(usize) -> Reply + Send + Sync + 'static) -> Receiver {
        let listener = TcpListener::bind(at).unwrap_or_else(|e| panic!("bind receiver {at}: {e}"));
        let addr = listener.local_addr().expect("receiver address");
        let (tx, seen) = mpsc::channel();
        let hits = Arc::new(AtomicUsize::new(0));
        let reply = Arc::new(reply);
        let counter = hits.clone();
        thread::spawn(move || {
            for (conn, stream) in listener.incoming().enumerate() {
                let Ok(stream) = stream else { continue };
                let (tx, reply, hits) = (tx.clone(), reply.clone(), counter.clone());
                thread::spawn(move || serve(conn, stream, &tx, &*reply, &hits));
            }
        });
        Receiver { addr, seen, hits }
    }

    /// `http://<addr><path>`.
    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    /// The next request seen, if one comes within `within`.
    pub fn next(&self, within: Duration) -> Option<Seen> {
        self.seen.recv_timeout(within).ok()
    }

    /// Requests seen so far.
    pub fn hits(&self) -> usize {
        self.hits.load(Ordering::SeqCst)
    }

    /// Adds the POSTs seen so far to `counts`, by the topic their JSON body names.
    pub fn count_by_topic(&self, counts: &mut std::collections::HashMap<String, usize>) {
        while let Some(s) = self.next(Duration::from_millis(1)) {
            assert_eq!(s.method, "POST");
            let body: serde_json::Value = serde_json::from_slice(&s.body).expect("json body");
            *counts
                .entry(body["topic"].as_str().expect("topic").to_string())
                .or_default() += 1;
        }
    }
}

fn serve(
    conn: usize,
    stream: TcpStream,
    tx: &mpsc::Sender<Seen>,
    reply: &(dyn Fn(usize) -> Reply + Send + Sync),
    hits: &AtomicUsize,
) {
    let mut writer = match stream.try_clone() {
        Ok(w) => w,
        Err(_) => return,
    };
    let mut reader = BufReader::new(stream);
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).unwrap_or(0) == 0 {
            return;
        }
        let mut parts = line.split_whitespace();
        let method = parts.next().unwrap_or_default().to_string();
        let target = parts.next().unwrap_or_default().to_string();
        let mut headers = Vec::new();
        loop {
            let mut h = String::new();
            if reader.read_line(&mut h).unwrap_or(0) == 0 {
                return;
            }
            let h = h.trim_end();
            if h.is_empty() {
                break;
            }
            if let Some((k, v)) = h.split_once(':') {
                headers.push((k.trim().to_string(), v.trim().to_string()));
            }
        }
        let len = super::http::find_header(&headers, "content-length")
            .and_then(|v| v.parse::<usize>().ok())
            .unwrap_or(0);
        let mut body = vec![0; len];
        if reader.read_exact(&mut body).is_err() {
            return;
        }
        let n = hits.fetch_add(1, Ordering::SeqCst);
        let _ = tx.send(Seen {
            conn,
            method,
            target,
            headers,
            body,
        });
        let status = match reply(n) {
            Reply::Status(s) => s,
            Reply::After(d, s) => {
                thread::sleep(d);
                s
            }
            Reply::Hang => {
                // Returns when the client gives up and closes the connection.
                let _ = reader.read(&mut [0u8; 1]);
                return;
            }
        };
        let location = if (300..400).contains(&status) {
            "Location: /elsewhere\r\n"
        } else {
            ""
        };
        // A 204 has no body (and so no Content-Length).
        let body = if status == 204 {
            "\r\n"
        } else {
            "Content-Length: 2\r\n\r\nok"
        };
        let answer = format!("HTTP/1.1 {status} X\r\n{location}Connection: keep-alive\r\n{body}");
        if writer.write_all(answer.as_bytes()).is_err() {
            return;
        }
    }
}
