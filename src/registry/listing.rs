//! One listings endpoint: its entries in list order, the full answer built once, the search
//! over its names, and the body of any page or search result.
//!
//! The registry is a few hundred entries, so a search is a scan of the folded names (a
//! `memmem` per name, microseconds) and a page or a search result is copied out of the full
//! body entry by entry. What makes repeated answers cost nothing is the worker's answer
//! cache ([`super::answers`]), not this file. It knows the JSON layout of a listings answer
//! and nothing of HTTP.

use std::io::Write;
use std::ops::Range;

use bytes::Bytes;
use flate2::{Compression, GzBuilder};
use memchr::memmem;

use super::data::Record;
use super::etag::TagHasher;

/// Assembled bodies at least this large are gzip-compressed for clients that accept it;
/// smaller ones gain too little to be worth the header.
pub const GZIP_MIN: usize = 1024;

/// Level of assembled answers, compressed when built (a cache miss): with zlib-rs, level 2
/// comes within a few per cent of level 6's size in a third of its time (level 1 is faster
/// but a third larger), which bounds what a stream of distinct queries costs a worker
/// (figures in docs/REGISTRY.md).
const ASSEMBLED_LEVEL: u32 = 2;

/// Bodies up to this size are compressed at the best level when built once at start, larger
/// ones at the default (a 100,000-entry registry would otherwise take seconds longer to
/// start).
const BEST_LEVEL_MAX: usize = 4 << 20;

/// Mixed into the tag of an assembled gzip body: its bytes are not those a build that
/// assembled gzip from precomputed fragments sent under the same selection's tag.
const ASSEMBLED_GZIP: u64 = 0x677a_2d66_6c61_7465;

/// Folds `s` with Unicode simple case folding (CaseFolding.txt statuses C and S): one
/// character to one character, so `ß` stays `ß` and `Σ`, `σ`, `ς` all become `σ`.
pub fn fold(s: &str) -> String {
    casefold::simple_fold(s.to_string())
}

/// Which entries of a list an answer holds, in list order.
#[derive(Debug, Clone)]
pub(crate) enum Selection<'a> {
    /// Consecutive positions.
    Range(Range<usize>),
    /// Positions a search found (sorted).
    Positions(&'a [u32]),
}

impl Selection<'_> {
    /// Number of entries.
    pub fn len(&self) -> usize {
        match self {
            Selection::Range(r) => r.len(),
            Selection::Positions(p) => p.len(),
        }
    }

    fn positions(&self) -> impl Iterator<Item = usize> + '_ {
        let (range, slice) = match self {
            Selection::Range(r) => (r.clone(), &[][..]),
            Selection::Positions(p) => (0..0, *p),
        };
        range.chain(slice.iter().map(|&p| p as usize))
    }
}

/// The positions of the entries whose names match a search.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Matches {
    /// Every entry (no search, or an empty one): positions `0..n`.
    All(usize),
    /// The positions found, in list order.
    Some(Vec<u32>),
}

impl Matches {
    /// Number of matching entries.
    pub fn len(&self) -> usize {
        match self {
            Matches::All(n) => *n,
            Matches::Some(v) => v.len(),
        }
    }

    /// The matches of `window` (indexes into the matches, not positions).
    pub fn select(&self, window: Range<usize>) -> Selection<'_> {
        match self {
            Matches::All(_) => Selection::Range(window),
            Matches::Some(v) => Selection::Positions(v.get(window).unwrap_or(&[])),
        }
    }
}

/// The precomputed data of one listings endpoint.
#[derive(Debug)]
pub(crate) struct List {
    /// `{"count":n,"total":n,"listings":{...}}` with every entry.
    pub body: Bytes,
    /// `body` gzip-compressed.
    pub gzip: Bytes,
    /// Byte range of each entry's `"id":{...}` member in `body`, in list order.
    spans: Vec<Range<usize>>,
    /// Each entry's folded name, in list order.
    names: Vec<Box<str>>,
    /// Seed of this list's tags (registry digest and list kind).
    seed: u64,
}

impl List {
    /// Builds the list of `positions` (record numbers, in list order) of `records`.
    pub fn build(records: &[Record], positions: &[u32], seed: u64) -> List {
        let members: Vec<&Record> = positions
            .iter()
            .filter_map(|&r| records.get(r as usize))
            .collect();
        let n = members.len();
        let size: usize = members.iter().map(|r| r.json.len() + 1).sum::<usize>() + 64;
        let mut body = Vec::with_capacity(size);
        write_prefix(&mut body, n, n);
        let mut spans = Vec::with_capacity(n);
        for (i, r) in members.iter().enumerate() {
            if i > 0 {
                body.push(b',');
            }
            let start = body.len();
            body.extend_from_slice(&r.json);
            spans.push(start..body.len());
        }
        body.extend_from_slice(b"}}");
        let level = if body.len() <= BEST_LEVEL_MAX {
            Compression::best()
        } else {
            Compression::default()
        };
        List {
            gzip: Bytes::from(gzip(&body, level)),
            body: Bytes::from(body),
            spans,
            names: members.iter().map(|r| fold(&r.name).into()).collect(),
            seed,
        }
    }

    /// Number of entries.
    pub fn len(&self) -> usize {
        self.spans.len()
    }

    /// The entries whose folded name contains the folded `search` (`None`: all of them).
    pub fn find(&self, search: Option<&str>) -> Matches {
        let query = match search.map(fold) {
            Some(q) if !q.is_empty() => q,
            _ => return Matches::All(self.len()),
        };
        let finder = memmem::Finder::new(query.as_bytes());
        let found = (0u32..)
            .zip(&self.names)
            .filter(|(_, name)| finder.find(name.as_bytes()).is_some())
            .map(|(p, _)| p)
            .collect();
        Matches::Some(found)
    }

    /// The tag hash of the answer holding `sel` out of `total` matches, in the
    /// representation `gzip` says (the full list's gzip body is the same in every build,
    /// so only assembled ones are told apart).
    pub fn tag(&self, sel: &Selection<'_>, total: usize, gzip: bool) -> u64 {
        let mut h = TagHasher::new(self.seed);
        h.word(total as u64);
        h.word(sel.len() as u64);
        sel.positions().for_each(|p| h.word(p as u64));
        if gzip && sel.len() != self.len() {
            h.word(ASSEMBLED_GZIP);
        }
        h.finish()
    }

    /// The length of [`List::body`] of `sel`, without building it.
    pub fn body_len(&self, sel: &Selection<'_>, total: usize) -> usize {
        let members: usize = sel.positions().map(|p| self.member(p).len()).sum();
        let mut b = itoa::Buffer::new();
        let numbers = b.format(sel.len()).len() + b.format(total).len();
        // `{"count":` `,"total":` `,"listings":{` and `}}`, a comma between members.
        9 + 9 + 13 + 2 + numbers + members + sel.len().saturating_sub(1)
    }

    /// The identity body of `sel` out of `total` matches.
    pub fn body(&self, sel: &Selection<'_>, total: usize) -> Vec<u8> {
        let members: usize = sel.positions().map(|p| self.member(p).len() + 1).sum();
        let mut out = Vec::with_capacity(members + 48);
        write_prefix(&mut out, sel.len(), total);
        for (i, p) in sel.positions().enumerate() {
            if i > 0 {
                out.push(b',');
            }
            out.extend_from_slice(self.member(p));
        }
        out.extend_from_slice(b"}}");
        out
    }

    fn member(&self, p: usize) -> &[u8] {
        let span = self.spans.get(p).cloned().unwrap_or(0..0);
        self.body.get(span).unwrap_or(&[])
    }
}

/// Whether an assembled body of `len` identity bytes goes gzip-compressed to a client that
/// accepts it: from [`GZIP_MIN`] bytes on (a listings body that long always compresses, its
/// keys and logo addresses repeat), decided from the length so that a 304 builds nothing.
pub fn worth_gzip(len: usize) -> bool {
    len >= GZIP_MIN
}

/// An assembled body gzip-compressed (per request on a cache miss).
pub fn gzip_assembled(body: &[u8]) -> Vec<u8> {
    gzip(body, Compression::new(ASSEMBLED_LEVEL))
}

/// One gzip member of `body`: no name, no mtime, OS unknown (byte-identical everywhere).
fn gzip(body: &[u8], level: Compression) -> Vec<u8> {
    let mut enc = GzBuilder::new()
        .operating_system(0xff)
        .write(Vec::with_capacity(body.len() / 4 + 64), level);
    // Writing into a Vec cannot fail.
    let _ = enc.write_all(body);
    enc.finish().unwrap_or_default()
}

fn write_prefix(out: &mut Vec<u8>, count: usize, total: usize) {
    let mut b = itoa::Buffer::new();
    out.extend_from_slice(b"{\"count\":");
    out.extend_from_slice(b.format(count).as_bytes());
    out.extend_from_slice(b",\"total\":");
    out.extend_from_slice(b.format(total).as_bytes());
    out.extend_from_slice(b",\"listings\":{");
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::registry::test_gzip::gunzip;
    use proptest::prelude::*;

    fn record(id: &str, name: &str) -> Record {
        let json = format!(
            r#""{id}":{{"id":"{id}","name":{}}}"#,
            serde_json::json!(name)
        );
        Record {
            id: id.into(),
            name: name.into(),
            json: json.into_bytes(),
        }
    }

    fn list(names: &[&str]) -> List {
        let recs: Vec<Record> = names
            .iter()
            .enumerate()
            .map(|(i, n)| record(&format!("id{i}"), n))
            .collect();
        let pos: Vec<u32> = (0..recs.len() as u32).collect();
        List::build(&recs, &pos, 7)
    }

    #[test]
    fn full_body_and_assembled_selections() {
        let l = list(&["Alpha", "Beta", "Gamma", "Delta"]);
        let full: serde_json::Value = serde_json::from_slice(&l.body).unwrap();
        assert_eq!(full["count"], 4);
        assert_eq!(full["total"], 4);
        assert_eq!(gunzip(&l.gzip), l.body.to_vec());
        assert_eq!(l.body(&Selection::Range(0..4), 4), l.body.to_vec());
        let page = l.body(&Selection::Range(1..3), 4);
        assert_eq!(
            page,
            br#"{"count":2,"total":4,"listings":{"id1":{"id":"id1","name":"Beta"},"id2":{"id":"id2","name":"Gamma"}}}"#
        );
        let some = l.body(&Selection::Positions(&[0, 3]), 2);
        let v: serde_json::Value = serde_json::from_slice(&some).unwrap();
        let keys: Vec<&String> = v["listings"].as_object().unwrap().keys().collect();
        assert_eq!(keys, ["id0", "id3"]);
        let none = l.body(&Selection::Range(4..4), 4);
        assert_eq!(none, br#"{"count":0,"total":4,"listings":{}}"#);
    }

    #[test]
    fn folds_with_simple_case_folding() {
        assert_eq!(fold("MetaMask"), "metamask");
        assert_eq!(fold("ΣΑΣ"), fold("σας"));
        assert_eq!(fold("\u{212A}"), "k");
        assert_eq!(fold("ſ"), "s");
        assert_ne!(fold("ß"), fold("ss"));
    }

    #[test]
    fn search_matches_folded_substrings_in_list_order() {
        let l = list(&[
            "Trust Wallet",
            "MetaMask",
            "wallet 3",
            "Rainbow",
            "ΣWAP",
            "ςwap",
        ]);
        assert_eq!(l.find(None), Matches::All(6));
        assert_eq!(l.find(Some("")), Matches::All(6));
        assert_eq!(l.find(Some("WALLET")), Matches::Some(vec![0, 2]));
        assert_eq!(l.find(Some("σwap")), Matches::Some(vec![4, 5]));
        assert_eq!(l.find(Some(" ")), Matches::Some(vec![0, 2]));
        assert_eq!(l.find(Some("nothing")), Matches::Some(vec![]));
    }

    #[test]
    fn tags_depend_on_selection_total_and_assembled_gzip() {
        let l = list(&["a", "b", "c"]);
        let t = |s: &Selection<'_>, total, gz| l.tag(s, total, gz);
        let r = Selection::Range(0..2);
        let p = Selection::Positions(&[0, 1]);
        assert_eq!(t(&r, 3, false), t(&p, 3, false), "same entries, same tag");
        assert_ne!(t(&r, 3, false), t(&r, 2, false));
        assert_ne!(t(&r, 3, false), t(&Selection::Range(1..3), 3, false));
        assert_ne!(t(&r, 3, false), t(&r, 3, true));
        let all = Selection::Range(0..3);
        assert_eq!(
            t(&all, 3, false),
            t(&all, 3, true),
            "the -gz suffix tells these apart"
        );
    }

    #[test]
    fn body_len_is_the_built_length() {
        let l = list(&["Alpha", "Beta", "Gamma", "Delta", "Epsilon"]);
        for sel in [
            Selection::Range(0..5),
            Selection::Range(1..4),
            Selection::Range(5..5),
            Selection::Positions(&[0, 2, 4]),
            Selection::Positions(&[]),
        ] {
            for total in [0, 3, 5, 1234] {
                assert_eq!(
                    l.body_len(&sel, total),
                    l.body(&sel, total).len(),
                    "{sel:?} {total}"
                );
            }
        }
        let big = vec![b'x'; 4096];
        assert_eq!(gunzip(&gzip_assembled(&big)), big);
        assert!(!worth_gzip(GZIP_MIN - 1) && worth_gzip(GZIP_MIN));
    }

    proptest! {
        /// The scan agrees with the definition: positions, in order, of the names whose
        /// folded text contains the folded query.
        #[test]
        fn search_is_the_definition(
            names in proptest::collection::vec("[aAbBσΣςkK\u{212A}ſsß ]{0,8}", 0..40),
            query in "[aAbBσΣςkK\u{212A}ſsß ]{1,3}",
        ) {
            let refs: Vec<&str> = names.iter().map(String::as_str).collect();
            let l = list(&refs);
            let q = fold(&query);
            let want: Vec<u32> = (0u32..)
                .zip(&names)
                .filter(|(_, n)| fold(n).contains(&q))
                .map(|(i, _)| i)
                .collect();
            prop_assert_eq!(l.find(Some(&query)), Matches::Some(want));
        }
    }
}
