//! `http`: registry requests over keep-alive connections, at a fixed rate (open loop, latency
//! from the scheduled time; requests wait for a free connection) or flat out (every connection
//! always has `--pipeline` requests in flight).

use std::collections::VecDeque;

use crate::cli::{HttpOpts, Target};
use crate::net::{self, CloseWhy, Handler, HttpResp, Io, Key, Proto};
use crate::stats::{merge_counts, Counts, Lat, Report};

use super::{bump, split, Connector, Ctx, RunError, Schedule};

/// The kinds of request the mix can name.
const KINDS: [&str; 6] = ["all", "wallets", "dapps", "page", "search", "health"];
/// Names searched for: common substrings of real wallet and dApp names, and misses.
const TERMS: [&str; 10] = [
    "wallet",
    "meta",
    "trust",
    "rain",
    "ledger",
    "a",
    "ex",
    "swap",
    "zzzz",
    "Wallet+Connect",
];
/// Distinct requests pre-built and cycled through.
const REQUESTS: usize = 256;

/// Parse `all=1,page=4,...` into weights in [`KINDS`] order.
pub fn parse_mix(s: &str) -> Result<[u32; 6], String> {
    let mut w = [0u32; 6];
    for part in s.split(',').filter(|p| !p.trim().is_empty()) {
        let (k, v) = part
            .split_once('=')
            .ok_or_else(|| format!("mix item {part:?} is not kind=weight"))?;
        let i = KINDS
            .iter()
            .position(|x| *x == k.trim())
            .ok_or_else(|| format!("unknown kind {k:?} (one of {KINDS:?})"))?;
        w[i] = v
            .trim()
            .parse()
            .map_err(|_| format!("bad weight in {part:?}"))?;
    }
    if w.iter().all(|&x| x == 0) {
        return Err("the mix has no weight".into());
    }
    Ok(w)
}

/// Build the request cycle: [`REQUESTS`] requests drawn by weight (deterministic).
pub fn build_requests(weights: &[u32; 6], host: &str, gzip: bool) -> Vec<(usize, Vec<u8>)> {
    let total: u32 = weights.iter().sum();
    let mut rng = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    let lists = ["wallets", "dapps", "all"];
    (0..REQUESTS)
        .map(|_| {
            let mut pick = (next() % total as u64) as u32;
            let kind = weights
                .iter()
                .position(|&w| {
                    if pick < w {
                        true
                    } else {
                        pick -= w;
                        false
                    }
                })
                .unwrap_or(0);
            let list = lists[(next() % 3) as usize];
            let path = match KINDS[kind] {
                "all" => "/api/v1/all".to_string(),
                "wallets" => "/api/v1/wallets".to_string(),
                "dapps" => "/api/v1/dapps".to_string(),
                "page" => {
                    let entries = [5, 10, 20, 50][(next() % 4) as usize];
                    let page = 1 + next() % 5;
                    format!("/api/v1/{list}?entries={entries}&page={page}")
                }
                "search" => {
                    let term = TERMS[(next() % TERMS.len() as u64) as usize];
                    if next() % 2 == 0 {
                        format!("/api/v1/{list}?search={term}")
                    } else {
                        format!("/api/v1/{list}?entries=10&page=1&search={term}")
                    }
                }
                _ => "/health".to_string(),
            };
            let enc = if gzip { "Accept-Encoding: gzip\r\n" } else { "" };
            let req = format!(
                "GET {path} HTTP/1.1\r\nHost: {host}\r\nUser-Agent: walletrelay-loadtest\r\nAccept: application/json\r\n{enc}\r\n"
            );
            (kind, req.into_bytes())
        })
        .collect()
}

struct HttpHandler<'a> {
    o: &'a HttpOpts,
    requests: &'a [(usize, Vec<u8>)],
    next_req: usize,
    keys: Vec<Option<Key>>,
    /// Scheduled (or sent) times of requests in flight, per connection, in order.
    inflight: Vec<VecDeque<u64>>,
    ready: usize,
    failed: usize,
    connector: Connector,
    measuring: bool,
    schedule: Option<Schedule>,
    queue: VecDeque<u64>,
    t_warm: u64,
    t_end: u64,
    now: u64,
    budget: u64,
    lat: Lat,
    responses_in_window: u64,
    body_bytes: u64,
    statuses: Counts,
    closes: Counts,
    lost_in_close: u64,
}

impl HttpHandler<'_> {
    fn send(&mut self, io: &mut Io, local: usize, sched: u64) -> bool {
        let Some(key) = self.keys[local] else {
            return false;
        };
        let Some(out) = io.out(key) else {
            return false;
        };
        let (_, req) = &self.requests[self.next_req % self.requests.len()];
        self.next_req += 1;
        out.extend_from_slice(req);
        self.inflight[local].push_back(sched);
        true
    }

    /// Give free connections work: queued requests (open loop) or new ones (flat out).
    fn fill(&mut self, io: &mut Io, local: usize, now: u64) {
        // Open loop: requests scheduled inside the window are still sent after it ends.
        let open_backlog = self.schedule.is_some() && !self.queue.is_empty();
        if !self.measuring || (now >= self.t_end && !open_backlog) || self.budget == 0 {
            return;
        }
        while self.keys[local].is_some() && self.inflight[local].len() < self.o.pipeline.max(1) {
            let sched = if self.schedule.is_some() {
                match self.queue.pop_front() {
                    Some(s) => s,
                    None => return,
                }
            } else {
                now
            };
            if !self.send(io, local, sched) {
                if self.schedule.is_some() {
                    self.queue.push_front(sched);
                }
                return;
            }
        }
    }
}

impl Handler for HttpHandler<'_> {
    fn on_open(&mut self, io: &mut Io, _key: Key, tag: u32, now: u64) {
        if !self.measuring {
            self.ready += 1;
            self.connector.in_progress = self.connector.in_progress.saturating_sub(1);
        }
        self.fill(io, tag as usize, now);
    }

    fn on_message(&mut self, _io: &mut Io, _key: Key, _tag: u32, _msg: &[u8], _now: u64) {}

    fn on_http(&mut self, io: &mut Io, _key: Key, tag: u32, resp: HttpResp, now: u64) {
        let local = tag as usize;
        let Some(sched) = self.inflight[local].pop_front() else {
            bump(&mut self.statuses, "unsolicited");
            return;
        };
        if sched >= self.t_warm && sched < self.t_end {
            self.lat.record(now.saturating_sub(sched), now);
            bump(&mut self.statuses, &resp.status.to_string());
            self.body_bytes += resp.body_len as u64;
            self.budget = self.budget.saturating_sub(1);
        }
        if now >= self.t_warm && now < self.t_end {
            self.responses_in_window += 1;
        }
        self.fill(io, local, now);
    }

    fn on_closed(&mut self, io: &mut Io, _key: Key, tag: u32, why: &CloseWhy, now: u64) {
        let local = tag as usize;
        self.keys[local] = None;
        if !self.measuring {
            self.failed += 1;
            self.connector.in_progress = self.connector.in_progress.saturating_sub(1);
            bump(&mut self.closes, &why.label());
            return;
        }
        bump(&mut self.closes, &why.label());
        self.lost_in_close += self.inflight[local].len() as u64;
        self.inflight[local].clear();
        if now < self.t_end {
            // Keep the connection count: reconnect.
            if let Ok(k) = io.connect(tag, Proto::Http) {
                self.keys[local] = Some(k);
            }
        }
    }

    fn tick(&mut self, io: &mut Io, now: u64) -> Option<u64> {
        self.now = now;
        if !self.measuring {
            let keys = &mut self.keys;
            self.failed += self.connector.pump(io, Proto::Http, |tag, key| {
                keys[tag as usize] = Some(key);
            });
            return None;
        }
        if let Some(mut s) = self.schedule.take() {
            while let Some((_, at)) = s.take_due(now) {
                if at >= self.t_end {
                    break;
                }
                self.queue.push_back(at);
            }
            let next = s.at(s.next);
            self.schedule = Some(s);
            if !self.queue.is_empty() {
                for l in 0..self.keys.len() {
                    self.fill(io, l, now);
                    if self.queue.is_empty() {
                        break;
                    }
                }
            }
            return Some(if now < self.t_end {
                next.min(self.t_end)
            } else {
                now + 1_000_000
            });
        }
        Some(self.t_end)
    }

    fn done(&self) -> bool {
        if !self.measuring {
            return self.ready + self.failed >= self.keys.len();
        }
        self.now >= self.t_end
            && self.queue.is_empty()
            && self.inflight.iter().all(|q| q.is_empty())
    }
}

struct HttpOut {
    lat: Lat,
    responses: u64,
    body_bytes: u64,
    statuses: Counts,
    closes: Counts,
    lost_in_close: u64,
    queued_at_end: u64,
}

/// Run `http` and build its report.
pub fn run(target: &Target, o: &HttpOpts) -> Result<Report, RunError> {
    let weights = parse_mix(&o.mix).map_err(RunError::Options)?;
    if o.connections == 0 {
        return Err(RunError::Options("--connections must be > 0".into()));
    }
    let requests = build_requests(&weights, &target.host, o.gzip);
    let common = &o.common;
    let threads = common.threads.max(1);
    let ctx = Ctx::new(target, common);
    let outs = ctx.run_threads(|t| {
        let r = split(o.connections, threads, t);
        let n = r.len();
        let mut io = ctx.io(t)?;
        let mut h = HttpHandler {
            o,
            requests: &requests,
            next_req: t * 37,
            keys: vec![None; n],
            inflight: vec![VecDeque::new(); n],
            ready: 0,
            failed: 0,
            connector: Connector::new(n, common.connect_concurrency),
            measuring: false,
            schedule: None,
            queue: VecDeque::new(),
            t_warm: u64::MAX,
            t_end: u64::MAX,
            now: 0,
            budget: u64::MAX,
            lat: Lat::new(),
            responses_in_window: 0,
            body_bytes: 0,
            statuses: Counts::new(),
            closes: Counts::new(),
            lost_in_close: 0,
        };
        let start = io.now_ns();
        net::run(
            &mut io,
            &mut h,
            start + common.setup_timeout.as_nanos() as u64,
        )?;
        let Some(t0) = ctx.sync_setup(h.ready == n) else {
            return Err(RunError::Setup(format!(
                "only {} of {n} connections connected: {:?}",
                h.ready, h.closes
            )));
        };
        h.measuring = true;
        h.t_warm = t0 + common.warmup.as_nanos() as u64;
        h.t_end = h.t_warm + common.duration.as_nanos() as u64;
        if o.count > 0 {
            h.budget = (o.count as usize).div_ceil(threads) as u64;
        }
        if o.rate > 0 {
            h.schedule = Some(Schedule {
                t0,
                rate: o.rate as f64 * n as f64 / o.connections as f64,
                next: 0,
            });
        }
        let now = io.now_ns();
        for l in 0..n {
            h.fill(&mut io, l, now);
        }
        // Responses still owed after the window get a few seconds.
        let until = h.t_end + 5_000_000_000;
        net::run(&mut io, &mut h, until)?;
        Ok(HttpOut {
            lat: h.lat,
            responses: h.responses_in_window,
            body_bytes: h.body_bytes,
            statuses: h.statuses,
            closes: h.closes,
            lost_in_close: h.lost_in_close,
            queued_at_end: h.queue.len() as u64,
        })
    })?;
    let mut lat = Lat::new();
    let (mut responses, mut body, mut lost, mut queued) = (0, 0, 0, 0);
    let (mut statuses, mut closes) = (Counts::new(), Counts::new());
    for x in &outs {
        lat.merge(&x.lat);
        responses += x.responses;
        body += x.body_bytes;
        lost += x.lost_in_close;
        queued += x.queued_at_end;
        merge_counts(&mut statuses, &x.statuses);
        merge_counts(&mut closes, &x.closes);
    }
    let secs = common.duration.as_secs_f64();
    let mut r = Report::new("http");
    r.text("mode", if o.rate > 0 { "open" } else { "flat out" })
        .int("connections", o.connections as u64)
        .int("pipeline", o.pipeline as u64)
        .int("threads", threads as u64)
        .int("target_rate", o.rate)
        .text("mix", &o.mix)
        .text("gzip", if o.gzip { "yes" } else { "no" })
        .float("duration_s", secs, 1)
        .float("requests_per_s", responses as f64 / secs, 0)
        .float("body_mib_per_s", body as f64 / secs / 1048576.0, 1)
        .int("lost_in_close", lost)
        .int("still_queued_at_end", queued)
        .lat("request", &lat)
        .counts("status", &statuses)
        .counts("closes", &closes);
    let non_2xx: u64 = statuses
        .iter()
        .filter(|(k, _)| !k.starts_with('2') && !k.starts_with('3'))
        .map(|(_, v)| v)
        .sum();
    if non_2xx > 0 {
        r.note(format!("{non_2xx} responses were not 2xx/3xx"));
    }
    Ok(r)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mix_parsing() {
        assert_eq!(parse_mix("all=1,page=4").unwrap(), [1, 0, 0, 4, 0, 0]);
        assert!(parse_mix("nope=1").is_err());
        assert!(parse_mix("all=0").is_err());
        assert!(parse_mix("all").is_err());
    }

    #[test]
    fn requests_follow_the_weights() {
        let reqs = build_requests(&[0, 0, 0, 1, 1, 0], "127.0.0.1:1", true);
        assert_eq!(reqs.len(), REQUESTS);
        assert!(reqs.iter().all(|(k, _)| *k == 3 || *k == 4));
        let (_, first) = &reqs[0];
        let s = String::from_utf8(first.clone()).unwrap();
        assert!(s.starts_with("GET /api/v1/"));
        assert!(s.contains("\r\nAccept-Encoding: gzip\r\n"));
        assert!(s.ends_with("\r\n\r\n"));
    }
}
