//! `loopback`: this machine's ceiling for the server's kind of traffic, without the server.
//!
//! One writer thread writes `size * batch` bytes to each of N loopback TCP sockets in turn
//! (one `write` per socket per round, like a server flushing one queued push per
//! connection); one reader thread drains the other ends with epoll, like a client. What it
//! reports, writes per second, is what "one write() per delivery" allows here: divide the
//! server's deliveries/s by it to see how close to the machine the server runs. Run it with
//! the same pinning as the server measurement (`--writer-cpu 0 --reader-cpu 1`).

use std::io::{ErrorKind, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use mio::{Events, Interest, Poll, Token};

use super::RunError;
use crate::cli::LoopbackOpts;
use crate::stats::Report;
use crate::sys;

/// Runs the measurement and reports writes/s and bytes/s.
pub fn run(o: &LoopbackOpts) -> Result<Report, RunError> {
    if o.sockets == 0 || o.size == 0 || o.batch == 0 {
        return Err(RunError::Options(
            "--sockets, --size and --batch must be > 0".into(),
        ));
    }
    let listener = TcpListener::bind("127.0.0.1:0")?;
    let addr = listener.local_addr()?;
    let mut readers = Vec::with_capacity(o.sockets);
    let mut writers = Vec::with_capacity(o.sockets);
    for _ in 0..o.sockets {
        let c = TcpStream::connect(addr)?;
        let (s, _) = listener.accept()?;
        for t in [&c, &s] {
            t.set_nodelay(true)?;
            t.set_nonblocking(true)?;
        }
        readers.push(mio::net::TcpStream::from_std(c));
        writers.push(s);
    }
    let stop = Arc::new(AtomicBool::new(false));
    let reader_stop = stop.clone();
    let reader_cpu = o.reader_cpu;
    let reader = std::thread::spawn(move || -> std::io::Result<u64> {
        if let Some(c) = reader_cpu {
            sys::pin_current_thread(c)?;
        }
        let mut poll = Poll::new()?;
        for (i, r) in readers.iter_mut().enumerate() {
            poll.registry().register(r, Token(i), Interest::READABLE)?;
        }
        let mut events = Events::with_capacity(1024);
        let mut buf = vec![0u8; 64 * 1024];
        let mut got = 0u64;
        while !reader_stop.load(Ordering::Relaxed) {
            poll.poll(&mut events, Some(Duration::from_millis(20)))?;
            for ev in events.iter() {
                let Some(r) = readers.get_mut(ev.token().0) else {
                    continue;
                };
                loop {
                    match r.read(&mut buf) {
                        Ok(0) => break,
                        Ok(n) => got += n as u64,
                        Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                        Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                        Err(e) => return Err(e),
                    }
                }
            }
        }
        Ok(got)
    });
    if let Some(c) = o.writer_cpu {
        sys::pin_current_thread(c)?;
    }
    let msg = vec![b'x'; o.size * o.batch];
    let (mut writes, mut blocked, mut short) = (0u64, 0u64, 0u64);
    let warm_end = Instant::now() + o.warmup;
    while Instant::now() < warm_end {
        for w in writers.iter_mut() {
            let _ = w.write(&msg);
        }
    }
    let start = Instant::now();
    let end = start + o.duration;
    let mut now = start;
    while now < end {
        for w in writers.iter_mut() {
            match w.write(&msg) {
                Ok(n) if n == msg.len() => writes += 1,
                Ok(_) => short += 1,
                Err(_) => blocked += 1,
            }
        }
        now = Instant::now();
    }
    let secs = now.duration_since(start).as_secs_f64();
    stop.store(true, Ordering::Relaxed);
    let read = reader
        .join()
        .map_err(|_| RunError::Setup("the reader thread panicked".into()))??;
    let mut r = Report::new("loopback");
    r.int("sockets", o.sockets as u64)
        .int("size", o.size as u64)
        .int("batch", o.batch as u64)
        .float("duration_s", secs, 1)
        .int("writes_per_s", (writes as f64 / secs) as u64)
        .int(
            "messages_per_s",
            (writes as f64 * o.batch as f64 / secs) as u64,
        )
        .float("us_per_write", secs * 1e6 / writes.max(1) as f64, 2)
        .int("blocked_writes", blocked)
        .int("short_writes", short)
        .float("mib_read_per_s", read as f64 / secs / (1 << 20) as f64, 1);
    if blocked > writes / 10 {
        r.note(format!(
            "{blocked} writes found a full socket buffer: the reader is the bottleneck"
        ));
    }
    Ok(r)
}
