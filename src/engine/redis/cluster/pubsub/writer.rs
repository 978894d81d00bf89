//! The subscriber's writer thread: takes `watch`/`unwatch` from the shard's bounded queue,
//! keeps the table of watched topics, and writes (S)SUBSCRIBE / (S)UNSUBSCRIBE, batched and
//! in order, and a PING every heartbeat. A failed write closes the socket (the reader
//! reconnects).
//!
//! Owns: the writing side of the subscriber connection. Shares the topic table with the
//! reader (`pubsub`) under its lock.

use std::sync::Arc;
use std::time::Instant;

use crossbeam_channel::{select, Receiver};

use super::super::script::{self, Packer};
use super::super::subconn::Sock;
use super::super::types::Followup;
use super::{route_of, Ctl, Shared, State, TopicSub};
use crate::event::Event;

/// Most channels in one SUBSCRIBE / UNSUBSCRIBE command (one in sharded mode: an
/// SSUBSCRIBE names channels of one slot only).
const CHANNELS_PER_COMMAND: usize = 256;
/// Most control messages handled before the writer flushes.
const CTL_PER_FLUSH: usize = 1024;

/// SUBSCRIBE / UNSUBSCRIBE runs waiting to be written, in order.
#[derive(Default)]
struct Out {
    runs: Vec<(bool, Vec<Box<[u8]>>)>,
}

impl Out {
    fn push(&mut self, subscribe: bool, chan: Box<[u8]>, per_command: usize) {
        match self.runs.last_mut() {
            Some((s, v)) if *s == subscribe && v.len() < per_command => v.push(chan),
            _ => self.runs.push((subscribe, vec![chan])),
        }
    }
}

pub(super) struct Writer {
    sh: Arc<Shared>,
    /// The connection written to and its generation.
    sock: Option<(u64, Arc<Sock>)>,
    out: Out,
    /// `Subscribed` events to emit after the lock is released.
    now_live: Vec<(usize, u8, Arc<str>)>,
    last_ping: Instant,
    buf: Vec<u8>,
}

impl Writer {
    /// Channels per (un)subscribe command.
    fn per_command(&self) -> usize {
        match self.sh.sharded() {
            true => 1,
            false => CHANNELS_PER_COMMAND,
        }
    }

    pub(super) fn new(sh: Arc<Shared>) -> Writer {
        Writer {
            sh,
            sock: None,
            out: Out::default(),
            now_live: Vec::new(),
            last_ping: Instant::now(),
            buf: Vec::new(),
        }
    }

    pub(super) fn run(mut self, ctl: &Receiver<Ctl>, bell: &Receiver<()>, stop: &Receiver<()>) {
        let hb = self.sh.ctx.cfg.heartbeat;
        loop {
            select! {
                recv(ctl) -> m => {
                    let Ok(m) = m else { return };
                    self.handle(m);
                    for _ in 0..CTL_PER_FLUSH {
                        match ctl.try_recv() {
                            Ok(m) => self.handle(m),
                            Err(_) => break,
                        }
                    }
                }
                recv(bell) -> _ => self.resubscribe_all(),
                recv(self.sh.ctx.commands_back.1) -> _ => self.resync_live(),
                recv(stop) -> _ => return,
                default(hb) => {}
            }
            if self.last_ping.elapsed() >= hb {
                self.last_ping = Instant::now();
                if self.sock.is_some() {
                    self.buf.extend_from_slice(b"*1\r\n$4\r\nPING\r\n");
                }
            }
            self.flush();
            for (w, ns, topic) in self.now_live.drain(..) {
                (self.sh.ctx.events)(w, Event::Engine(Followup::Subscribed { ns, topic }));
            }
        }
    }

    fn connected(&self, st: &State) -> bool {
        matches!(&self.sock, Some((g, _)) if *g == st.gen && st.sock.is_some())
    }

    fn handle(&mut self, m: Ctl) {
        let sh = Arc::clone(&self.sh);
        let mut st = sh.lock();
        let connected = self.connected(&st);
        match m {
            Ctl::Watch { worker, ns, topic } => {
                let chan: Box<[u8]> =
                    script::channel(self.sh.ctx.keys(), ns, topic.as_bytes()).into();
                let t = st.topics.entry(chan.clone()).or_insert_with(|| TopicSub {
                    ns,
                    topic: Arc::clone(&topic),
                    watchers: Vec::new(),
                    sub_sent: false,
                    pending: 0,
                    live: false,
                    was_live: false,
                });
                if !t.watchers.contains(&worker) {
                    t.watchers.push(worker);
                    self.sh.routes.send(&chan, route_of(t));
                }
                if t.live {
                    self.now_live.push((worker, ns, topic));
                } else if !t.sub_sent {
                    t.sub_sent = true;
                    if connected {
                        t.pending += 1;
                        self.out.push(true, chan, self.per_command());
                    }
                }
            }
            Ctl::Unwatch { worker, ns, topic } => {
                let chan = script::channel(self.sh.ctx.keys(), ns, topic.as_bytes());
                let Some(t) = st.topics.get_mut(&chan[..]) else {
                    return;
                };
                let before = t.watchers.len();
                t.watchers.retain(|w| *w != worker);
                if t.watchers.len() != before {
                    self.sh.routes.send(&chan, route_of(t));
                }
                if !t.watchers.is_empty() || !t.sub_sent {
                    return;
                }
                t.sub_sent = false;
                t.live = false;
                t.was_live = false;
                if connected {
                    t.pending += 1;
                    self.out.push(false, chan.into(), self.per_command());
                } else if t.pending == 0 {
                    st.topics.remove(&chan[..]);
                }
            }
        }
    }

    /// The command connection is back: every live topic's watchers read again (a read
    /// refused during the outage would otherwise wait for the next reconnect).
    fn resync_live(&mut self) {
        let sh = Arc::clone(&self.sh);
        let st = sh.lock();
        for t in st.topics.values().filter(|t| t.live) {
            sh.ctx.stats.resyncs.inc();
            for &w in &t.watchers {
                self.now_live.push((w, t.ns, Arc::clone(&t.topic)));
            }
        }
    }

    /// A new connection: take it and subscribe every wanted topic on it.
    fn resubscribe_all(&mut self) {
        let sh = Arc::clone(&self.sh);
        let per_command = self.per_command();
        let mut st = sh.lock();
        self.out.runs.clear();
        self.buf.clear();
        self.sock = st.sock.as_ref().map(|s| (st.gen, Arc::clone(s)));
        if self.sock.is_none() {
            return;
        }
        for (chan, t) in st.topics.iter_mut() {
            if t.sub_sent {
                t.pending = 1;
                self.out.push(true, chan.clone(), per_command);
            }
        }
    }

    /// Writes what is waiting; a failed write closes the socket (the reader reconnects).
    fn flush(&mut self) {
        let runs = std::mem::take(&mut self.out.runs);
        for (subscribe, chans) in runs {
            let mut p = Packer::new(&mut self.buf);
            p.cmd(chans.len() + 1);
            p.arg(match (subscribe, self.sh.sharded()) {
                (true, false) => &b"SUBSCRIBE"[..],
                (false, false) => b"UNSUBSCRIBE",
                (true, true) => b"SSUBSCRIBE",
                (false, true) => b"SUNSUBSCRIBE",
            });
            for c in &chans {
                p.arg(c);
            }
            if self.buf.len() >= 64 * 1024 {
                self.write();
            }
        }
        self.write();
    }

    fn write(&mut self) {
        if self.buf.is_empty() {
            return;
        }
        if let Some((_, s)) = self.sock.as_ref() {
            let sent = s.writer().send(&self.buf);
            if let Err(e) = sent {
                log::warn!(
                    shard = self.sh.ctx.idx, addr:% = self.sh.ctx.addr;
                    "redis shard {}: subscriber write: {e}", self.sh.ctx.addr
                );
                s.shutdown();
                self.sock = None;
            }
        }
        self.buf.clear();
    }
}
