//! The wallet and dApp registry (DECISIONS §2): loads `wallets.json` and `dapps.json` once at
//! start (the embedded copy in `data/registry/` or `--registry-dir`), builds an immutable,
//! precomputed index, and answers `GET /api/v1/...` requests from it.
//!
//! It owns no sockets and no mutable state after start: every worker holds it and answers
//! from it without locks; each worker keeps its own cache of assembled answers
//! ([`answers`]). Submodules: [`data`] (file format and validation), [`query`] (query
//! strings), [`listing`] (a list's entries, its search and its answer bodies), [`etag`],
//! [`blob`] (the sealed memory file the full answers are sent from) and [`synth`]
//! (synthetic registries for benches and load tests). `docs/REGISTRY.md` explains the
//! choices.

pub mod answers;
mod blob;
mod data;
pub mod etag;
mod listing;
pub mod query;
pub mod synth;

use std::collections::HashSet;
use std::path::Path;
use std::sync::Arc;

use bytes::Bytes;
use thiserror::Error;

use crate::http::response::{Body, Response, JSON, TEXT};
use crate::http::Request;
use crate::outbuf::FileRange;

use data::{finish, parse_file, RawEntry, Record};
pub use data::{logo_url, AppType, SIZES};
use etag::TagHasher;
pub use listing::fold;
use listing::{List, Selection};
use query::ListQuery;

/// The embedded default `wallets.json`.
pub const EMBEDDED_WALLETS: &[u8] = include_bytes!("../../data/registry/wallets.json");
/// The embedded default `dapps.json`.
pub const EMBEDDED_DAPPS: &[u8] = include_bytes!("../../data/registry/dapps.json");
/// The licence of the embedded data (MIT).
pub const EMBEDDED_LICENSE: &str = include_str!("../../data/registry/LICENSE.md");

/// `Cache-Control` of every registry answer.
const CACHE_CONTROL: &str = "public, max-age=300";

/// Why a registry could not be loaded; the server refuses to start. Every message names the
/// file, and the entry where one is at fault.
#[derive(Debug, Error)]
pub enum RegistryError {
    /// A file could not be read.
    #[error("{file}: cannot read: {source}")]
    Io {
        /// The file at fault.
        file: String,
        /// The I/O error.
        source: std::io::Error,
    },
    /// A file is not valid JSON or not a JSON object.
    #[error("{file}: invalid registry file: {source}")]
    Json {
        /// The file at fault.
        file: String,
        /// The parser's error (with line and column).
        source: serde_json::Error,
    },
    /// An entry is invalid.
    #[error("{file}: entry {entry:?}: {msg}")]
    Entry {
        /// The file at fault.
        file: String,
        /// The entry's key in the file.
        entry: String,
        /// What is wrong with it.
        msg: String,
    },
    /// Any other problem with a file.
    #[error("{file}: {msg}")]
    Invalid {
        /// The file at fault.
        file: String,
        /// What is wrong.
        msg: String,
    },
}

/// Which listings endpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ListKind {
    /// `/api/v1/wallets`
    Wallets = 0,
    /// `/api/v1/dapps`
    Dapps = 1,
    /// `/api/v1/all`
    All = 2,
}

impl ListKind {
    /// The three endpoints, in index order.
    pub const ALL: [ListKind; 3] = [ListKind::Wallets, ListKind::Dapps, ListKind::All];

    /// The endpoint of a path below `/api/v1/`.
    pub fn from_path(rest: &str) -> Option<ListKind> {
        match rest {
            "wallets" => Some(ListKind::Wallets),
            "dapps" => Some(ListKind::Dapps),
            "all" => Some(ListKind::All),
            _ => None,
        }
    }
}

/// The shared, immutable part: the lists and the ids.
#[derive(Debug)]
struct Core {
    lists: [List; 3],
    ids: HashSet<String>,
    image_base: String,
    digest: u64,
}

/// A precomputed answer: its tag, its 200 and its 304.
#[derive(Debug)]
struct Answer {
    etag: Bytes,
    ok: Response,
    not_modified: Response,
}

impl Answer {
    fn new(tag: etag::Tag, body: Body, gzip: bool) -> Answer {
        Answer {
            ok: Response {
                status: 200,
                headers: headers(Some(JSON), gzip, &tag, true),
                body,
            },
            not_modified: Response {
                status: 304,
                headers: headers(None, false, &tag, true),
                body: Body::default(),
            },
            etag: Bytes::copy_from_slice(tag.as_bytes()),
        }
    }

    /// A copy that shares no reference count with `self` (see [`Registry`]'s `Clone`): a
    /// file-backed body gets its own handle (a duplicated descriptor) on the same file.
    fn deep_copy(&self) -> Answer {
        let copy = |b: &Bytes| Bytes::copy_from_slice(b);
        let body = match &self.ok.body {
            Body::File(f) => match f.file.try_clone() {
                Ok(dup) => Body::File(FileRange {
                    file: Arc::new(dup),
                    ..f.clone()
                }),
                Err(_) => Body::File(f.clone()),
            },
            Body::Mem(b) => Body::Mem(copy(b)),
        };
        Answer {
            etag: copy(&self.etag),
            ok: Response {
                status: self.ok.status,
                headers: copy(&self.ok.headers),
                body,
            },
            not_modified: Response {
                status: 304,
                headers: copy(&self.not_modified.headers),
                body: Body::default(),
            },
        }
    }

    fn respond(&self, req: &Request<'_>) -> Response {
        match req.if_none_match {
            Some(inm) if etag::if_none_match(inm, &self.etag) => self.not_modified.clone(),
            _ => self.ok.clone(),
        }
    }
}

/// The full answer of one endpoint, in both encodings.
#[derive(Debug)]
struct Fixed {
    identity: Answer,
    gzip: Answer,
}

impl Fixed {
    /// The three lists' full answers, their bodies (identity, then gzip) in one sealed
    /// memory file sent with `sendfile`, or from memory when the file cannot be made.
    fn build(lists: &[List; 3]) -> [Fixed; 3] {
        let bodies = [0, 1, 2].map(|i| &lists[i].body[..]);
        let gzips = [0, 1, 2].map(|i| &lists[i].gzip[..]);
        let all: Vec<&[u8]> = bodies.iter().chain(&gzips).copied().collect();
        let files = blob::Blob::build(&all).unwrap_or_else(|e| {
            log::warn!("registry: no memory file ({e}); answers are sent from memory");
            Vec::new()
        });
        let body = |i: usize, mem: &Bytes| match files.get(i) {
            Some(f) => Body::File(f.clone()),
            None => Body::Mem(mem.clone()),
        };
        [0, 1, 2].map(|i| {
            let l = &lists[i];
            let all = Selection::Range(0..l.len());
            let tag = l.tag(&all, l.len(), false);
            Fixed {
                identity: Answer::new(etag::Tag::new(tag, false), body(i, &l.body), false),
                gzip: Answer::new(etag::Tag::new(tag, true), body(3 + i, &l.gzip), true),
            }
        })
    }
}

/// The loaded registry and its precomputed answers. Immutable after [`Registry::load`].
///
/// `Clone` makes a copy for another core: the index is shared (`Arc`, read only), while the
/// three full answers' bytes are copied, so that serving them on different cores never
/// touches a shared reference count.
#[derive(Debug)]
pub struct Registry {
    core: Arc<Core>,
    fixed: [Fixed; 3],
}

impl Clone for Registry {
    fn clone(&self) -> Registry {
        let copy = |f: &Fixed| Fixed {
            identity: f.identity.deep_copy(),
            gzip: f.gzip.deep_copy(),
        };
        Registry {
            core: Arc::clone(&self.core),
            fixed: [0, 1, 2].map(|i| copy(&self.fixed[i])),
        }
    }
}

impl Registry {
    /// Loads the registry from `dir` (or the embedded default data when `None`).
    /// `image_base` is the logo address prefix (a trailing `/` is ignored).
    pub fn load(dir: Option<&Path>, image_base: &str) -> Result<Registry, RegistryError> {
        match dir {
            None => Registry::from_json(
                ("data/registry/wallets.json (embedded)", EMBEDDED_WALLETS),
                ("data/registry/dapps.json (embedded)", EMBEDDED_DAPPS),
                image_base,
            ),
            Some(dir) => {
                let read = |name: &str| {
                    let path = dir.join(name);
                    let file = path.display().to_string();
                    std::fs::read(&path)
                        .map(|b| (file.clone(), b))
                        .map_err(|source| RegistryError::Io { file, source })
                };
                let (wf, wallets) = read("wallets.json")?;
                let (df, dapps) = read("dapps.json")?;
                Registry::from_json((&wf, &wallets), (&df, &dapps), image_base)
            }
        }
    }

    /// Builds the registry from the contents of a wallets file and a dapps file, each given
    /// as `(name used in errors, bytes)`.
    pub fn from_json(
        wallets: (&str, &[u8]),
        dapps: (&str, &[u8]),
        image_base: &str,
    ) -> Result<Registry, RegistryError> {
        let image_base = image_base.trim_end_matches('/');
        let w = parse_file(wallets.0, wallets.1)?;
        let d = parse_file(dapps.0, dapps.1)?;
        if w.len() + d.len() > u32::MAX as usize {
            return Err(RegistryError::Invalid {
                file: format!("{} and {}", wallets.0, dapps.0),
                msg: "more than 2^32 entries".into(),
            });
        }
        let nw = w.len() as u32;
        let (records, all_pos) = records(w, d, image_base);
        let wallet_pos: Vec<u32> = (0..nw).collect();
        let dapp_pos: Vec<u32> = (nw..records.len() as u32).collect();

        let mut digest = TagHasher::new(0x7265_6769_7374_7279);
        for r in &records {
            digest.bytes(&r.json);
        }
        digest.word(u64::from(nw));
        let digest = digest.finish();
        let seed = |k: ListKind| digest ^ (k as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        // Each list's full gzip body is compressed at the best level: one thread per list.
        let build = |pos: &[u32], k| List::build(&records, pos, seed(k));
        let lists = std::thread::scope(|s| {
            let w = s.spawn(|| build(&wallet_pos, ListKind::Wallets));
            let d = s.spawn(|| build(&dapp_pos, ListKind::Dapps));
            let a = build(&all_pos, ListKind::All);
            let lost = || RegistryError::Invalid {
                file: format!("{} and {}", wallets.0, dapps.0),
                msg: "building a list failed".into(),
            };
            let w = w.join().map_err(|_| lost())?;
            let d = d.join().map_err(|_| lost())?;
            Ok::<_, RegistryError>([w, d, a])
        })?;
        let ids = records.iter().map(|r| r.id.clone()).collect();
        let fixed = Fixed::build(&lists);
        let core = Core {
            lists,
            ids,
            image_base: image_base.to_string(),
            digest,
        };
        Ok(Registry {
            core: Arc::new(core),
            fixed,
        })
    }

    /// Number of entries of a listings endpoint.
    pub fn len(&self, kind: ListKind) -> usize {
        self.core.lists[kind as usize].len()
    }

    /// Whether a listings endpoint has no entries.
    pub fn is_empty(&self, kind: ListKind) -> bool {
        self.len(kind) == 0
    }

    /// Answers a `GET` or `HEAD` request whose path starts with `/api/v1/`.
    pub fn respond(&self, req: &Request<'_>) -> Response {
        let rest = req.path.strip_prefix("/api/v1/").unwrap_or("");
        if let Some(kind) = ListKind::from_path(rest) {
            return self.listing(kind, req);
        }
        if let Some(logo) = rest.strip_prefix("logo/") {
            return self.logo(logo, req);
        }
        error(404, "unknown registry path; see /api/v1/wallets, /api/v1/dapps, /api/v1/all, /api/v1/logo/:size/:id")
    }

    fn listing(&self, kind: ListKind, req: &Request<'_>) -> Response {
        let q = if req.query.is_empty() {
            ListQuery::default()
        } else {
            match query::parse(req.query) {
                Ok(q) => q,
                Err(e) => return error(400, &e.to_string()),
            }
        };
        let list = &self.core.lists[kind as usize];
        let matches = list.find(q.search.as_deref());
        let total = matches.len();
        let window = match q.paging {
            None => 0..total,
            Some((entries, page)) => {
                let start = (page - 1).saturating_mul(u64::from(entries));
                let start = usize::try_from(start).unwrap_or(usize::MAX).min(total);
                start..start.saturating_add(entries as usize).min(total)
            }
        };
        if window.len() == list.len() {
            // Everything, in order: the precomputed answer.
            let f = &self.fixed[kind as usize];
            return if req.accept_gzip {
                f.gzip.respond(req)
            } else {
                f.identity.respond(req)
            };
        }
        let sel = matches.select(window);
        let gzip = req.accept_gzip && listing::worth_gzip(list.body_len(&sel, total));
        let tag = etag::Tag::new(list.tag(&sel, total, gzip), gzip);
        if let Some(r) = not_modified(req, &tag, true) {
            return r;
        }
        let body = list.body(&sel, total);
        let body = if gzip {
            listing::gzip_assembled(&body)
        } else {
            body
        };
        Response {
            status: 200,
            headers: headers(Some(JSON), gzip, &tag, true),
            body: Body::from(body),
        }
    }

    fn logo(&self, rest: &str, req: &Request<'_>) -> Response {
        let Some((size, id)) = rest.split_once('/') else {
            return error(
                404,
                "unknown registry path; logos are at /api/v1/logo/:size/:id",
            );
        };
        if id.contains('/') {
            return error(
                404,
                "unknown registry path; logos are at /api/v1/logo/:size/:id",
            );
        }
        // Both parts percent-decoded alike (`%73m` is `sm`).
        let size = match percent_decode_path(size) {
            Some(s) if SIZES.contains(&s.as_ref()) => s,
            _ => return error(400, "parameter \"size\" must be one of sm, md, lg"),
        };
        let id = percent_decode_path(id);
        match id {
            Some(id) if self.core.ids.contains(id.as_ref()) => {
                let body = logo_url(&self.core.image_base, &size, &id);
                let mut h = TagHasher::new(self.core.digest);
                h.bytes(body.as_bytes());
                let tag = etag::Tag::new(h.finish(), false);
                if let Some(r) = not_modified(req, &tag, false) {
                    return r;
                }
                Response {
                    status: 200,
                    headers: headers(Some(TEXT), false, &tag, false),
                    body: Body::from(Bytes::from(body)),
                }
            }
            _ => error(404, "parameter \"id\" is not the id of any entry"),
        }
    }
}

/// The finished records, wallets then dApps (a record's number is its place here), and the
/// record numbers of `/all`: every wallet, then the dApps whose id is not a wallet's (a
/// hybrid appears once, in the wallet's place, with the wallet's record).
fn records(w: Vec<RawEntry>, d: Vec<RawEntry>, image_base: &str) -> (Vec<Record>, Vec<u32>) {
    let wallet_ids: HashSet<String> = w.iter().map(|e| e.id.clone()).collect();
    let dapp_ids: HashSet<String> = d.iter().map(|e| e.id.clone()).collect();
    let nw = w.len() as u32;
    let mut all_pos: Vec<u32> = (0..nw).collect();
    let mut records: Vec<Record> = Vec::with_capacity(w.len() + d.len());
    for e in w {
        let t = match dapp_ids.contains(&e.id) {
            true => AppType::Hybrid,
            false => AppType::Wallet,
        };
        records.push(finish(e, t, image_base));
    }
    for (i, e) in (nw..).zip(d) {
        let t = match wallet_ids.contains(&e.id) {
            true => AppType::Hybrid,
            false => {
                all_pos.push(i);
                AppType::Dapp
            }
        };
        records.push(finish(e, t, image_base));
    }
    (records, all_pos)
}

/// Percent-decodes a path segment (`+` stays `+`); `None` if invalid or not UTF-8.
fn percent_decode_path(s: &str) -> Option<std::borrow::Cow<'_, str>> {
    if !s.contains('%') {
        return Some(std::borrow::Cow::Borrowed(s));
    }
    let mut out = Vec::with_capacity(s.len());
    let mut it = s.bytes();
    while let Some(b) = it.next() {
        if b == b'%' {
            let h = it.next().and_then(|c| char::from(c).to_digit(16))?;
            let l = it.next().and_then(|c| char::from(c).to_digit(16))?;
            out.push((h * 16 + l) as u8);
        } else {
            out.push(b);
        }
    }
    String::from_utf8(out).ok().map(std::borrow::Cow::Owned)
}

/// The 304 answer when the request's `If-None-Match` names `tag` (`vary` as for the 200 it
/// stands for), else `None`.
fn not_modified(req: &Request<'_>, tag: &etag::Tag, vary: bool) -> Option<Response> {
    let inm = req.if_none_match?;
    etag::if_none_match(inm, tag.as_bytes()).then(|| Response {
        status: 304,
        headers: headers(None, false, tag, vary),
        body: Body::default(),
    })
}

/// The header lines of a registry answer: content type (not on 304), encoding, tag, caching
/// and, where gzip may apply, `Vary`.
fn headers(content_type: Option<&str>, gzip: bool, tag: &etag::Tag, vary: bool) -> Bytes {
    let mut h = Vec::with_capacity(160);
    if let Some(ct) = content_type {
        h.extend_from_slice(b"Content-Type: ");
        h.extend_from_slice(ct.as_bytes());
        h.extend_from_slice(b"\r\n");
    }
    if gzip {
        h.extend_from_slice(b"Content-Encoding: gzip\r\n");
    }
    h.extend_from_slice(b"ETag: ");
    h.extend_from_slice(tag.as_bytes());
    h.extend_from_slice(b"\r\nCache-Control: ");
    h.extend_from_slice(CACHE_CONTROL.as_bytes());
    h.extend_from_slice(b"\r\n");
    if vary {
        h.extend_from_slice(b"Vary: Accept-Encoding\r\n");
    }
    Bytes::from(h)
}

/// A JSON error answer, tagged and cacheable like every registry answer.
fn error(status: u16, msg: &str) -> Response {
    let mut body = Vec::with_capacity(msg.len() + 16);
    body.extend_from_slice(b"{\"error\":");
    crate::json::write_str(&mut body, msg);
    body.push(b'}');
    let mut h = TagHasher::new(u64::from(status));
    h.bytes(&body);
    Response {
        status,
        headers: headers(Some(JSON), false, &etag::Tag::new(h.finish(), false), false),
        body: Body::from(body),
    }
}

#[cfg(test)]
mod tests;

/// The tests' one gzip decoder, shared with the integration tests.
#[cfg(test)]
#[path = "../../tests/common/gzip.rs"]
mod test_gzip;
