//! `loadtest forwarder`: this machine's floor for `pairs`. A trivial relay, one thread, one
//! `mio` loop, that speaks just enough of the protocol for `loadtest pairs` to run against it,
//! so that every latency figure of the relay can have the machine's own tail beside it
//! (docs/PERFORMANCE.md, "The tail").
//!
//! What it does, and nothing else: answers the upgrade (the fixed `Sec-WebSocket-Accept` of
//! the fixed key `loadtest` sends), answers a `*_subscribe` with its topic as the
//! subscription id and pairs the two connections that subscribed to one topic; a
//! `*_publish` read on one connection is written to its pair as a `*_subscription` push
//! (topic and message, no cache, no dedup, no `publishedAt`) and acknowledged to its sender;
//! pings are answered, a close frame closes. Every other message is dropped. Output is
//! queued while a poll's events are read and written once per connection after them, as the
//! relay does. Loopback only; bounded by `--duration`.

use std::io::{self, Read, Write};
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use memchr::memmem;
use mio::net::{TcpListener, TcpStream};
use mio::{Events, Interest, Poll, Token};
use slab::Slab;

use crate::upgrade::ACCEPT;
use crate::ws::{self, op};

const LISTENER: Token = Token(usize::MAX);

#[derive(Default)]
struct Conn {
    upgraded: bool,
    input: Vec<u8>,
    out: Vec<u8>,
    /// The topic it subscribed to, and the connection that shares it.
    topic: Option<Box<str>>,
    peer: Option<usize>,
    dirty: bool,
    closed: bool,
}

/// Runs the forwarder on `listen` (a loopback address) for `duration`.
pub fn run(listen: SocketAddr, duration: Duration, cpu: Option<usize>) -> io::Result<()> {
    if !listen.ip().is_loopback() {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, "loopback only"));
    }
    if let Some(c) = cpu {
        crate::sys::pin_current_thread(c)?;
    }
    let mut poll = Poll::new()?;
    let mut listener = TcpListener::bind(listen)?;
    poll.registry()
        .register(&mut listener, LISTENER, Interest::READABLE)?;
    let mut conns: Slab<(TcpStream, Conn)> = Slab::new();
    let mut waiting: std::collections::HashMap<Box<str>, usize> = Default::default();
    let mut events = Events::with_capacity(1024);
    let mut dirty = Vec::new();
    let mut gone = Vec::new();
    let until = Instant::now() + duration;
    let mut push_id = 1u64;
    let mut scratch = vec![0u8; 256 << 10];
    eprintln!("loadtest forwarder: listening on {listen}");
    while Instant::now() < until {
        poll.poll(&mut events, Some(Duration::from_millis(100)))?;
        for ev in events.iter() {
            if ev.token() == LISTENER {
                while let Ok((mut s, _)) = listener.accept() {
                    let _ = s.set_nodelay(true);
                    let e = conns.vacant_entry();
                    let both = Interest::READABLE | Interest::WRITABLE;
                    poll.registry().register(&mut s, Token(e.key()), both)?;
                    e.insert((s, Conn::default()));
                }
                continue;
            }
            let key = ev.token().0;
            if ev.is_writable() {
                dirty.push(key);
            }
            let Some((s, c)) = conns.get_mut(key) else {
                continue;
            };
            let eof = loop {
                match s.read(&mut scratch) {
                    Ok(0) => break true,
                    Ok(n) => c.input.extend_from_slice(&scratch[..n]),
                    Err(e) => break e.kind() != io::ErrorKind::WouldBlock,
                }
            };
            let mut input = std::mem::take(&mut c.input);
            let used = on_input(
                &mut conns,
                &mut waiting,
                key,
                &mut input,
                &mut push_id,
                &mut dirty,
            );
            input.drain(..used);
            let c = &mut conns[key].1;
            c.input = input;
            c.closed |= eof;
            if c.closed {
                gone.push(key);
            }
        }
        for key in dirty.drain(..) {
            let Some((s, c)) = conns.get_mut(key) else {
                continue;
            };
            c.dirty = false;
            while !c.out.is_empty() {
                match s.write(&c.out) {
                    Ok(n) => drop(c.out.drain(..n)),
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                    Err(_) => {
                        c.closed = true;
                        gone.push(key);
                        break;
                    }
                }
            }
        }
        for key in gone.drain(..) {
            let Some((_, c)) = conns.try_remove(key) else {
                continue;
            };
            if let Some(p) = c.peer.and_then(|p| conns.get_mut(p)) {
                p.1.peer = None;
            }
            if let Some(t) = c.topic {
                waiting.remove(&t);
            }
        }
    }
    Ok(())
}

/// Handles what connection `key` sent; returns how many bytes of `input` were used.
fn on_input(
    conns: &mut Slab<(TcpStream, Conn)>,
    waiting: &mut std::collections::HashMap<Box<str>, usize>,
    key: usize,
    input: &mut [u8],
    push_id: &mut u64,
    dirty: &mut Vec<usize>,
) -> usize {
    let mut at = 0;
    if !conns[key].1.upgraded {
        let Some(end) = memmem::find(input, b"\r\n\r\n") else {
            return 0;
        };
        let c = &mut conns[key].1;
        c.upgraded = true;
        c.out.extend_from_slice(
            format!(
                "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
                 Sec-WebSocket-Accept: {ACCEPT}\r\n\r\n"
            )
            .as_bytes(),
        );
        mark(c, key, dirty);
        at = end + 4;
    }
    while let Ok(Some(h)) = ws::parse_head(&input[at..], 16 << 20, false) {
        let end = at + h.head_len + h.payload_len;
        if end > input.len() {
            break;
        }
        let msg = &mut input[at + h.head_len..end];
        if let Some(m) = h.mask {
            ws::apply_mask(msg, m, 0);
        }
        at = end;
        match h.opcode {
            op::TEXT => on_message(conns, waiting, key, msg, push_id, dirty),
            op::PING => {
                let c = &mut conns[key].1;
                server_frame(&mut c.out, op::PONG, &[msg]);
                mark(c, key, dirty);
            }
            op::CLOSE => conns[key].1.closed = true,
            _ => {}
        }
    }
    at
}

fn on_message(
    conns: &mut Slab<(TcpStream, Conn)>,
    waiting: &mut std::collections::HashMap<Box<str>, usize>,
    key: usize,
    msg: &[u8],
    push_id: &mut u64,
    dirty: &mut Vec<usize>,
) {
    let id = string_after(msg, b"{\"id\":", b',').unwrap_or(b"0");
    let irn = memmem::find(msg, b"\"irn_").is_some();
    if memmem::find(msg, b"_subscribe\"").is_some() {
        let Some(topic) = string_after(msg, b"\"topic\":\"", b'"') else {
            return;
        };
        let topic: Box<str> = String::from_utf8_lossy(topic).into();
        let c = &mut conns[key].1;
        let answer = [
            &b"{\"id\":"[..],
            id,
            b",\"jsonrpc\":\"2.0\",\"result\":\"",
            topic.as_bytes(),
            b"\"}",
        ];
        server_frame(&mut c.out, op::TEXT, &answer);
        mark(c, key, dirty);
        c.topic = Some(topic.clone());
        match waiting.remove(&topic) {
            Some(p) if p != key && conns.contains(p) => {
                conns[key].1.peer = Some(p);
                conns[p].1.peer = Some(key);
            }
            _ => drop(waiting.insert(topic, key)),
        }
    } else if memmem::find(msg, b"_publish\"").is_some() {
        let Some(message) = string_after(msg, b"\"message\":\"", b'"') else {
            return;
        };
        let c = &mut conns[key].1;
        let ack = [
            &b"{\"id\":"[..],
            id,
            b",\"jsonrpc\":\"2.0\",\"result\":true}",
        ];
        server_frame(&mut c.out, op::TEXT, &ack);
        mark(c, key, dirty);
        let Some(p) = c.peer else {
            return;
        };
        let Some(((_, c), (_, pc))) = conns.get2_mut(key, p) else {
            return;
        };
        let topic = c.topic.as_deref().unwrap_or("").as_bytes();
        let mut digits = [0u8; 20];
        let n = decimal(*push_id, &mut digits);
        *push_id += 1;
        let method: &[u8] = if irn {
            b"irn_subscription"
        } else {
            b"waku_subscription"
        };
        let push = [
            &b"{\"id\":"[..],
            n,
            b",\"jsonrpc\":\"2.0\",\"method\":\"",
            method,
            b"\",\"params\":{\"id\":\"",
            topic,
            b"\",\"data\":{\"topic\":\"",
            topic,
            b"\",\"message\":\"",
            message,
            b"\"}}}",
        ];
        server_frame(&mut pc.out, op::TEXT, &push);
        mark(pc, p, dirty);
    }
}

/// `v` in decimal, written at the end of `buf`.
fn decimal(mut v: u64, buf: &mut [u8; 20]) -> &[u8] {
    let mut i = buf.len();
    loop {
        i -= 1;
        buf[i] = b'0' + (v % 10) as u8;
        v /= 10;
        if v == 0 {
            return &buf[i..];
        }
    }
}

fn mark(c: &mut Conn, key: usize, dirty: &mut Vec<usize>) {
    if !c.dirty {
        c.dirty = true;
        dirty.push(key);
    }
}

/// The bytes after `key` up to (not including) `end`.
fn string_after<'a>(msg: &'a [u8], key: &[u8], end: u8) -> Option<&'a [u8]> {
    let from = memmem::find(msg, key)? + key.len();
    let len = memchr::memchr(end, &msg[from..])?;
    Some(&msg[from..from + len])
}

/// Appends one unmasked, final frame whose payload is `parts` in order.
fn server_frame(out: &mut Vec<u8>, opcode: u8, parts: &[&[u8]]) {
    let n: usize = parts.iter().map(|p| p.len()).sum();
    out.push(0x80 | opcode);
    if n < 126 {
        out.push(n as u8);
    } else if n <= 0xffff {
        out.push(126);
        out.extend_from_slice(&(n as u16).to_be_bytes());
    } else {
        out.push(127);
        out.extend_from_slice(&(n as u64).to_be_bytes());
    }
    for p in parts {
        out.extend_from_slice(p);
    }
}
