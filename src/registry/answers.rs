//! A worker's cache of assembled registry answers (pages and searches), kept in an in-memory
//! file so that a repeated query is answered like a precomputed list: a `sendfile` of bytes
//! already built, with no search, no assembly and no copy into the kernel.
//!
//! A cache answers for one registry: a worker that swaps its registry (SIGHUP) starts a new
//! cache with it, so a cached answer never goes stale and the cache only has to bound its
//! memory. Answers are appended to an *arena* (a `memfd`); when the
//! arena is full the cache starts a new one and forgets every entry (a generation). Ranges
//! already queued on connections keep their arena alive (`Arc<File>`) until they are sent;
//! bytes once written are never written again (the cache only appends, and the file is
//! sealed against shrinking), so a queued range always sends the bytes it named.
//!
//! Each worker owns its cache (no locks, no shared reference counts). What is cached: every
//! `200` answer assembled per request (a page or a search result, gzip-compressed on the
//! miss; not the precomputed full lists, which are in the registry's own file already),
//! those under [`FILE_BODY`] in memory, counted with their keys in the same budget, for
//! requests without `If-None-Match` (those take the registry's cheap tag check, which
//! builds nothing). Keys are the path, the query and whether gzip is accepted: everything an
//! answer depends on.

use std::collections::HashMap;
use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::sync::Arc;

use bytes::Bytes;

use crate::http::response::{Body, Response};
use crate::http::Request;
use crate::outbuf::FileRange;

use super::Registry;

/// What an entry costs beside its body and key (the map's slot, the response's headers).
const ENTRY_OVERHEAD: usize = 256;

/// Bodies at least this large are cached in the arena file and sent with `sendfile`;
/// smaller ones are kept in memory (one `writev` with the head beats two calls).
pub const FILE_BODY: usize = 16 << 10;

/// Longest path plus query that is cached (longer ones are answered, not cached).
const MAX_KEY: usize = 512;

/// A worker's answer cache. `capacity` 0 disables it.
#[derive(Debug)]
pub struct AnswerCache {
    capacity: usize,
    map: HashMap<Key, Response, foldhash::fast::RandomState>,
    arena: Option<Arena>,
    /// Bytes of this generation's answers (in the arena and in memory).
    used: usize,
    /// Arenas started (1 for the first), for tests and metrics.
    generations: u64,
}

/// What an answer depends on.
#[derive(Debug, PartialEq, Eq, Hash)]
struct Key {
    path_query: Box<[u8]>,
    gzip: bool,
}

/// The current arena: a memfd and how much of it is written.
#[derive(Debug)]
struct Arena {
    file: Arc<File>,
    len: usize,
}

impl AnswerCache {
    /// A cache of at most `capacity` bytes of answers (0: no cache).
    pub fn new(capacity: usize) -> AnswerCache {
        AnswerCache {
            capacity,
            map: HashMap::default(),
            arena: None,
            used: 0,
            generations: 0,
        }
    }

    /// Answers `req` from the cache, or from `registry` (caching the answer when it
    /// qualifies).
    pub fn respond(&mut self, registry: &Registry, req: &Request<'_>) -> Response {
        if self.capacity == 0
            || req.if_none_match.is_some()
            || req.path.len() + req.query.len() + 1 > MAX_KEY
        {
            return registry.respond(req);
        }
        let mut path_query = Vec::with_capacity(req.path.len() + 1 + req.query.len());
        path_query.extend_from_slice(req.path.as_bytes());
        path_query.push(b'?');
        path_query.extend_from_slice(req.query.as_bytes());
        let key = Key {
            path_query: path_query.into_boxed_slice(),
            gzip: req.accept_gzip,
        };
        if let Some(r) = self.map.get(&key) {
            return r.clone();
        }
        let resp = registry.respond(req);
        let cacheable = resp.status == 200
            && matches!(resp.body, Body::Mem(_))
            && resp.body.len() <= self.capacity / 4;
        if !cacheable {
            return resp;
        }
        match self.store(&resp.body, key.path_query.len()) {
            Ok(body) => {
                let cached = Response {
                    status: resp.status,
                    headers: resp.headers,
                    body,
                };
                self.map.insert(key, cached.clone());
                cached
            }
            Err(e) => {
                log::warn!("registry answer cache: {e}; answering without it");
                self.capacity = 0;
                resp
            }
        }
    }

    /// Number of cached answers.
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// Nothing cached.
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// Arena files started so far.
    pub fn generations(&self) -> u64 {
        self.generations
    }

    /// Keeps `body` (of an entry whose key has `key_len` bytes) in this generation (a new
    /// generation, forgetting every entry, when it does not fit): appended to the arena when
    /// large, in memory otherwise.
    fn store(&mut self, body: &Body, key_len: usize) -> io::Result<Body> {
        let bytes = body.to_vec()?;
        let cost = bytes.len() + key_len + ENTRY_OVERHEAD;
        if self.used + cost > self.capacity {
            self.map.clear();
            self.arena = None;
            self.used = 0;
        }
        self.used += cost;
        if bytes.len() < FILE_BODY {
            return Ok(Body::Mem(Bytes::from(bytes)));
        }
        if self.arena.is_none() {
            self.arena = Some(Arena {
                file: Arc::new(new_memfd()?),
                len: 0,
            });
            self.generations += 1;
        }
        let arena = self.arena.as_mut().ok_or(io::ErrorKind::Other)?;
        let offset = arena.len as u64;
        // Only ever at the end: written bytes are never written again.
        arena.file.write_all_at(&bytes, offset)?;
        arena.len += bytes.len();
        Ok(Body::File(FileRange {
            file: Arc::clone(&arena.file),
            offset,
            len: bytes.len(),
        }))
    }
}

/// A new memfd that can grow but never shrink.
fn new_memfd() -> io::Result<File> {
    let file = super::blob::memfd(c"walletrelay-answers")?;
    super::blob::seal(&file, libc::F_SEAL_SHRINK)?;
    Ok(file)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Limits;
    use crate::http::parse;

    fn req_bytes(target: &str, extra: &str) -> Vec<u8> {
        format!("GET {target} HTTP/1.1\r\nHost: x\r\n{extra}\r\n").into_bytes()
    }

    fn answer(c: &mut AnswerCache, r: &Registry, target: &str, extra: &str) -> Response {
        let raw = req_bytes(target, extra);
        let (_, req) = parse(&raw, &Limits::default()).unwrap().unwrap();
        c.respond(r, &req)
    }

    fn direct(r: &Registry, target: &str, extra: &str) -> Response {
        let raw = req_bytes(target, extra);
        let (_, req) = parse(&raw, &Limits::default()).unwrap().unwrap();
        r.respond(&req)
    }

    fn same(a: &Response, b: &Response) -> bool {
        a.status == b.status
            && a.headers == b.headers
            && a.body.to_vec().unwrap() == b.body.to_vec().unwrap()
    }

    #[test]
    fn cached_answers_are_the_registrys_bytes_and_generations_bound_memory() {
        let r = Registry::load(None, "https://img.example").unwrap();
        let mut c = AnswerCache::new(1 << 20);
        let cases = [
            ("/api/v1/all?search=wallet", ""),
            ("/api/v1/all?search=wallet", "Accept-Encoding: gzip\r\n"),
            ("/api/v1/all?entries=100&page=2", ""),
            (
                "/api/v1/all?entries=100&page=2",
                "Accept-Encoding: gzip\r\n",
            ),
            ("/api/v1/wallets?entries=5", ""),
            ("/api/v1/all", ""),
            ("/api/v1/all?entries=abc", ""),
        ];
        for round in 0..3 {
            for (t, x) in cases {
                let a = answer(&mut c, &r, t, x);
                assert!(same(&a, &direct(&r, t, x)), "{t} {x} round {round}");
            }
        }
        // Cached: the assembled answers, the large ones in the arena file; not the
        // precomputed list or the 400s.
        let search = answer(&mut c, &r, "/api/v1/all?search=wallet", "");
        assert!(matches!(search.body, Body::File(_)));
        let gz = answer(
            &mut c,
            &r,
            "/api/v1/all?search=wallet",
            "Accept-Encoding: gzip\r\n",
        );
        assert!(matches!(gz.body, Body::Mem(_)));
        assert_eq!(c.generations(), 1);
        assert_eq!(c.len(), 4);
        // Conditional requests bypass it (and still get their 304).
        let tag = std::str::from_utf8(&search.headers)
            .unwrap()
            .split("\r\n")
            .find_map(|l| l.strip_prefix("ETag: "))
            .unwrap()
            .to_string();
        let nm = answer(
            &mut c,
            &r,
            "/api/v1/all?search=wallet",
            &format!("If-None-Match: {tag}\r\n"),
        );
        assert_eq!(nm.status, 304);
        // Many distinct answers: the cache starts new arenas instead of growing, and every
        // answer stays right, including ranges of arenas it has forgotten.
        let mut held = Vec::new();
        for p in 1..=40 {
            let t = format!("/api/v1/all?entries={}&page=1", 20 + p);
            let a = answer(&mut c, &r, &t, "");
            assert!(same(&a, &direct(&r, &t, "")), "{t}");
            held.push((t, a));
        }
        assert!(c.generations() > 1, "{}", c.generations());
        for (t, a) in &held {
            assert!(same(a, &direct(&r, t, "")), "{t} after newer generations");
        }
        assert!(c.used <= 1 << 20);
    }

    #[test]
    fn capacity_zero_is_no_cache() {
        let r = Registry::load(None, "https://img.example").unwrap();
        let mut c = AnswerCache::new(0);
        let a = answer(&mut c, &r, "/api/v1/all?search=wallet", "");
        assert!(!matches!(a.body, Body::File(_)));
        assert!(c.is_empty());
    }
}
