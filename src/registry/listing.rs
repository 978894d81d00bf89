//! One listings endpoint's precomputed data and the assembly of its answers.
//!
//! A [`List`] holds the full identity body of its endpoint, built once, and the byte span
//! of every entry inside it: a page of consecutive entries is one slice of that body, a
//! search result a few slices; the `{"count":..,"total":..,"listings":{` prefix is the only
//! part written per request. Gzip answers are assembled from per-entry deflate fragments
//! ([`super::gzip`]). It knows the JSON layout of a listings answer and nothing of HTTP.

use std::ops::Range;

use bytes::Bytes;

use super::data::Record;
use super::etag::TagHasher;
use super::gzip::{self, Member};
use super::index::{IndexTooLarge, SearchIndex};

/// Assembled bodies at least this large are gzip-compressed (from fragments) for clients
/// that accept it; smaller ones gain too little to be worth the header.
pub const GZIP_MIN: usize = 1024;

/// Per-entry deflate fragments of every record, by record number.
#[derive(Debug, Default)]
pub(crate) struct Fragments {
    data: Vec<u8>,
    offs: Vec<usize>,
}

impl Fragments {
    /// Compresses every record's JSON member once, standalone.
    pub fn build(records: &[Record], fr: &mut gzip::Fragmenter) -> Fragments {
        let mut f = Fragments {
            data: Vec::new(),
            offs: Vec::with_capacity(records.len() + 1),
        };
        f.offs.push(0);
        for r in records {
            fr.standalone(&r.json, &mut f.data);
            f.offs.push(f.data.len());
        }
        f
    }

    fn get(&self, record: u32) -> &[u8] {
        let i = record as usize;
        match (self.offs.get(i), self.offs.get(i + 1)) {
            (Some(&s), Some(&e)) => self.data.get(s..e).unwrap_or(&[]),
            _ => &[],
        }
    }
}

/// Which entries of a list an answer holds, in list order.
#[derive(Debug, Clone)]
pub(crate) enum Selection<'a> {
    /// Consecutive positions.
    Range(Range<usize>),
    /// Positions from the search index (sorted).
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

    fn for_each(&self, mut f: impl FnMut(usize)) {
        match self {
            Selection::Range(r) => r.clone().for_each(f),
            Selection::Positions(p) => p.iter().for_each(|&x| f(x as usize)),
        }
    }
}

/// Which fragment carries one entry of a gzip answer.
#[derive(Debug, Clone, Copy)]
enum Piece {
    /// The position's chained fragment (`,<entry>`, after its list predecessor).
    Chained(usize),
    /// The record's standalone fragment; `true` if a stored comma goes first.
    Standalone(usize, bool),
}

/// An assembled body and its representation.
pub(crate) struct Assembled {
    /// The body bytes.
    pub body: Vec<u8>,
    /// Whether `body` is gzip-compressed.
    pub gzip: bool,
}

/// The precomputed data of one listings endpoint.
#[derive(Debug)]
pub(crate) struct List {
    /// `{"count":n,"total":n,"listings":{...}}` with every entry.
    pub body: Bytes,
    /// Byte range of each entry's `"id":{...}` member in `body`, in list order.
    spans: Vec<(usize, usize)>,
    /// Record number of each position (to find its standalone gzip fragment).
    records: Vec<u32>,
    /// Chained gzip fragment of `,<entry>` for each position after the first, valid right
    /// after the previous position's entry: `chain[chain_offs[p]..chain_offs[p + 1]]`.
    chain: Vec<u8>,
    /// Offsets into `chain`, one more than positions.
    chain_offs: Vec<usize>,
    /// Substring index over the entries' names.
    pub index: SearchIndex,
    /// Seed of this list's tags (registry digest and list kind).
    seed: u64,
}

impl List {
    /// Builds the list of `positions` (record numbers, in list order) of `records`.
    pub fn build(
        records: &[Record],
        positions: Vec<u32>,
        seed: u64,
        fr: &mut gzip::Fragmenter,
    ) -> Result<List, IndexTooLarge> {
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
            spans.push((start, body.len()));
        }
        body.extend_from_slice(b"}}");
        let mut chain = Vec::new();
        let mut chain_offs = Vec::with_capacity(n + 1);
        chain_offs.push(0);
        for (i, r) in members.iter().enumerate() {
            if let Some(prev) = i.checked_sub(1).and_then(|p| members.get(p)) {
                let mut data = Vec::with_capacity(r.json.len() + 1);
                data.push(b',');
                data.extend_from_slice(&r.json);
                fr.chained(&prev.json, &data, &mut chain);
            }
            chain_offs.push(chain.len());
        }
        let index = SearchIndex::new(members.iter().map(|r| r.name.as_str()))?;
        Ok(List {
            body: Bytes::from(body),
            spans,
            records: positions,
            chain,
            chain_offs,
            index,
            seed,
        })
    }

    /// Number of entries.
    pub fn len(&self) -> usize {
        self.spans.len()
    }

    /// The tag hash of the answer holding `sel` out of `total` matches.
    pub fn tag(&self, sel: &Selection<'_>, total: usize) -> u64 {
        let mut h = TagHasher::new(self.seed);
        h.word(total as u64);
        h.word(sel.len() as u64);
        sel.for_each(|p| h.word(p as u64));
        h.finish()
    }

    /// Size of the identity body of `sel`, without building it.
    fn identity_len(&self, sel: &Selection<'_>, total: usize) -> usize {
        let members = match sel {
            Selection::Range(r) if r.is_empty() => 0,
            Selection::Range(r) => self.run(r.start, r.end).len(),
            Selection::Positions(p) => {
                p.iter().map(|&x| self.span_len(x as usize)).sum::<usize>()
                    + p.len().saturating_sub(1)
            }
        };
        prefix_len(sel.len(), total) + members + 2
    }

    /// Size of the gzip body of `sel` assembled from fragments, without building it.
    fn gzip_len(&self, sel: &Selection<'_>, total: usize, frags: &Fragments) -> usize {
        let (mut frag_bytes, mut commas) = (0, 0);
        self.plan(sel, |piece| match piece {
            Piece::Chained(p) => frag_bytes += self.chained(p).len(),
            Piece::Standalone(p, comma) => {
                frag_bytes += self.frag(p, frags).len();
                commas += usize::from(comma);
            }
        });
        gzip::member_len(
            1 + commas,
            prefix_len(sel.len(), total) + commas,
            frag_bytes,
            2,
        )
    }

    /// Calls `f` with the fragment to use for each entry of `sel`, in order: chained when
    /// the entry follows its list predecessor, else standalone (after a comma but the first).
    fn plan(&self, sel: &Selection<'_>, mut f: impl FnMut(Piece)) {
        let mut prev: Option<usize> = None;
        sel.for_each(|p| {
            match prev {
                Some(q) if q + 1 == p && !self.chained(p).is_empty() => f(Piece::Chained(p)),
                _ => f(Piece::Standalone(p, prev.is_some())),
            }
            prev = Some(p);
        });
    }

    /// Whether the answer of `sel` is sent gzip-compressed to a client that does or does not
    /// accept gzip: when it does, the identity body is at least [`GZIP_MIN`] bytes and the
    /// fragments make it smaller. Decided from sizes alone, before anything is built.
    pub fn would_gzip(
        &self,
        sel: &Selection<'_>,
        total: usize,
        accept_gzip: bool,
        frags: &Fragments,
    ) -> bool {
        if !accept_gzip {
            return false;
        }
        let plain = self.identity_len(sel, total);
        plain >= GZIP_MIN && self.gzip_len(sel, total, frags) < plain
    }

    /// Builds the body of `sel` (out of `total` matches), gzip-compressed if `gzip`.
    pub fn assemble(
        &self,
        sel: &Selection<'_>,
        total: usize,
        gzip: bool,
        frags: &Fragments,
    ) -> Assembled {
        if gzip {
            Assembled {
                body: self.assemble_gzip(sel, total, frags),
                gzip: true,
            }
        } else {
            Assembled {
                body: self.assemble_identity(sel, total),
                gzip: false,
            }
        }
    }

    fn assemble_identity(&self, sel: &Selection<'_>, total: usize) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.identity_len(sel, total));
        write_prefix(&mut out, sel.len(), total);
        match sel {
            Selection::Range(r) if !r.is_empty() => out.extend_from_slice(self.run(r.start, r.end)),
            Selection::Range(_) => {}
            Selection::Positions(p) => {
                // Copy runs of consecutive positions as one slice (their commas included).
                let mut i = 0;
                while let Some(&first) = p.get(i) {
                    let mut j = i + 1;
                    while p
                        .get(j)
                        .is_some_and(|&x| x as usize == first as usize + (j - i))
                    {
                        j += 1;
                    }
                    if i > 0 {
                        out.push(b',');
                    }
                    out.extend_from_slice(self.run(first as usize, first as usize + (j - i)));
                    i = j;
                }
            }
        }
        out.extend_from_slice(b"}}");
        out
    }

    fn assemble_gzip(&self, sel: &Selection<'_>, total: usize, frags: &Fragments) -> Vec<u8> {
        let mut prefix = Vec::with_capacity(64);
        write_prefix(&mut prefix, sel.len(), total);
        let mut m = Member::new(self.gzip_len(sel, total, frags));
        m.stored(&prefix);
        self.plan(sel, |piece| match piece {
            Piece::Chained(p) => {
                // Its plain bytes are the comma and the entry: from the end of the previous
                // entry to the end of this one.
                let start = p
                    .checked_sub(1)
                    .and_then(|q| self.spans.get(q))
                    .map_or(0, |s| s.1);
                let end = self.spans.get(p).map_or(start, |s| s.1);
                m.fragment(self.chained(p), self.body.get(start..end).unwrap_or(&[]));
            }
            Piece::Standalone(p, comma) => {
                if comma {
                    m.stored(b",");
                }
                m.fragment(self.frag(p, frags), self.run(p, p + 1));
            }
        });
        m.finish(b"}}")
    }

    fn chained(&self, p: usize) -> &[u8] {
        match (self.chain_offs.get(p), self.chain_offs.get(p + 1)) {
            (Some(&s), Some(&e)) => self.chain.get(s..e).unwrap_or(&[]),
            _ => &[],
        }
    }

    /// The bytes of positions `a..b` (b > a) in `body`, commas between them included.
    fn run(&self, a: usize, b: usize) -> &[u8] {
        let start = self.spans.get(a).map_or(0, |s| s.0);
        let end = b
            .checked_sub(1)
            .and_then(|l| self.spans.get(l))
            .map_or(start, |s| s.1);
        self.body.get(start..end).unwrap_or(&[])
    }

    fn span_len(&self, p: usize) -> usize {
        self.spans.get(p).map_or(0, |s| s.1 - s.0)
    }

    fn frag<'f>(&self, p: usize, frags: &'f Fragments) -> &'f [u8] {
        self.records.get(p).map_or(&[], |&r| frags.get(r))
    }
}

fn write_prefix(out: &mut Vec<u8>, count: usize, total: usize) {
    let mut b = itoa::Buffer::new();
    out.extend_from_slice(b"{\"count\":");
    out.extend_from_slice(b.format(count).as_bytes());
    out.extend_from_slice(b",\"total\":");
    out.extend_from_slice(b.format(total).as_bytes());
    out.extend_from_slice(b",\"listings\":{");
}

fn prefix_len(count: usize, total: usize) -> usize {
    let mut b = itoa::Buffer::new();
    let c = b.format(count).len();
    let t = b.format(total).len();
    "{\"count\":,\"total\":,\"listings\":{".len() + c + t
}

#[cfg(test)]
mod tests {
    use super::super::data::{finish, parse_file, AppType};
    use super::*;
    use std::io::Read;

    fn records() -> Vec<Record> {
        let src: String = {
            let members: Vec<String> = (0..40)
                .map(|i| {
                    format!(
                        "\"id{i}\":{{\"id\":\"id{i}\",\"name\":\"Name {i}\",\"d\":\"{}\"}}",
                        "z".repeat(i * 3)
                    )
                })
                .collect();
            format!("{{{}}}", members.join(","))
        };
        parse_file("t.json", src.as_bytes())
            .unwrap()
            .into_iter()
            .map(|e| finish(e, AppType::Wallet, "https://i"))
            .collect()
    }

    fn gunzip(b: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        flate2::read::GzDecoder::new(b)
            .read_to_end(&mut out)
            .unwrap();
        out
    }

    fn expected(recs: &[Record], pos: &[usize], total: usize) -> serde_json::Value {
        let members: Vec<&[u8]> = pos.iter().map(|&p| &recs[p].json[..]).collect();
        let s = format!(
            "{{\"count\":{},\"total\":{total},\"listings\":{{{}}}}}",
            pos.len(),
            members
                .iter()
                .map(|m| std::str::from_utf8(m).unwrap())
                .collect::<Vec<_>>()
                .join(",")
        );
        serde_json::from_str(&s).unwrap()
    }

    #[test]
    fn full_body_and_assembled_selections() {
        let recs = records();
        let mut fr = gzip::Fragmenter::default();
        let frags = Fragments::build(&recs, &mut fr);
        let list = List::build(&recs, (0..40).collect(), 7, &mut fr).unwrap();
        let full: serde_json::Value = serde_json::from_slice(&list.body).unwrap();
        assert_eq!(full["count"], 40);
        assert_eq!(full["listings"].as_object().unwrap().len(), 40);
        let cases: Vec<(Selection<'_>, Vec<usize>)> = vec![
            (Selection::Range(0..0), vec![]),
            (Selection::Range(3..4), vec![3]),
            (Selection::Range(5..25), (5..25).collect()),
            (
                Selection::Positions(&[1, 2, 3, 7, 9, 10, 39]),
                vec![1, 2, 3, 7, 9, 10, 39],
            ),
            (Selection::Positions(&[]), vec![]),
        ];
        for (sel, pos) in cases {
            let want = expected(&recs, &pos, 99);
            let id = list.assemble(&sel, 99, false, &frags);
            assert!(!id.gzip);
            assert_eq!(
                serde_json::from_slice::<serde_json::Value>(&id.body).unwrap(),
                want
            );
            let gz = list.assemble(&sel, 99, true, &frags);
            assert!(gz.gzip);
            assert_eq!(gunzip(&gz.body), id.body, "{pos:?}");
            assert_eq!(
                list.would_gzip(&sel, 99, true, &frags),
                id.body.len() >= GZIP_MIN && gz.body.len() < id.body.len()
            );
            assert_eq!(list.identity_len(&sel, 99), id.body.len());
            assert_eq!(list.gzip_len(&sel, 99, &frags), gz.body.len());
        }
    }

    #[test]
    fn tags_depend_on_selection_and_total() {
        let recs = records();
        let mut fr = gzip::Fragmenter::default();
        let list = List::build(&recs, (0..40).collect(), 7, &mut fr).unwrap();
        let a = list.tag(&Selection::Range(2..5), 40);
        assert_eq!(a, list.tag(&Selection::Positions(&[2, 3, 4]), 40));
        assert_ne!(a, list.tag(&Selection::Range(2..5), 41));
        assert_ne!(a, list.tag(&Selection::Range(2..6), 40));
        let other = List::build(&recs, (0..40).collect(), 8, &mut fr).unwrap();
        assert_ne!(a, other.tag(&Selection::Range(2..5), 40));
    }
}
