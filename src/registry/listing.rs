//! One listings endpoint's precomputed data and the assembly of its answers.
//!
//! A [`List`] holds the full identity body of its endpoint, built once, and the byte span
//! of every entry inside it: a page of consecutive entries is one slice of that body, a
//! search result a few slices; the `{"count":..,"total":..,"listings":{` prefix is the only
//! part written per request. Gzip answers are assembled from per-entry deflate fragments
//! ([`super::gzip`]); their CRC-32 from CRC marks at both ends of every entry
//! ([`super::crc`]), so no answer is read byte by byte. It knows the JSON layout of a
//! listings answer and nothing of HTTP.

use std::ops::Range;

use bytes::Bytes;

use crate::http::response::{Body, Part};
use crate::outbuf::FileRange;

use super::crc::{Mark, Span};
use super::data::Record;
use super::etag::TagHasher;
use super::gzip::{self, Member};
use super::index::{IndexTooLarge, SearchIndex};

/// Assembled bodies at least this large are gzip-compressed (from fragments) for clients
/// that accept it; smaller ones gain too little to be worth the header.
pub const GZIP_MIN: usize = 1024;

/// Runs of entries at least this long are sent from the registry's file (`sendfile`, no
/// copy) rather than copied into the answer; shorter ones cost less to copy than a call.
pub const FILE_RUN_MIN: usize = 8 << 10;

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

    /// Calls `f` with each maximal run of consecutive positions, in order: one for a range,
    /// one per gap-free stretch of positions. A run is one slice of the list's body.
    fn for_each_run(&self, mut f: impl FnMut(Range<usize>)) {
        match self {
            Selection::Range(r) if r.is_empty() => {}
            Selection::Range(r) => f(r.clone()),
            Selection::Positions(p) => {
                let mut i = 0;
                while let Some(&first) = p.get(i) {
                    let first = first as usize;
                    let mut j = i + 1;
                    while p.get(j).is_some_and(|&x| x as usize == first + (j - i)) {
                        j += 1;
                    }
                    f(first..first + (j - i));
                    i = j;
                }
            }
        }
    }
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
    /// CRC marks at the start and the end of each entry in `body`: `marks[2p]`,
    /// `marks[2p + 1]`.
    marks: Vec<Mark>,
    /// The CRC span of each entry (between its two marks, made once: a search result is
    /// mostly lone entries).
    entries: Vec<Span>,
    /// Record number of each position (to find its standalone gzip fragment).
    records: Vec<u32>,
    /// Chained gzip fragment of `,<entry>` for each position after the first, valid right
    /// after the previous position's entry: `chain[chain_offs[p]..chain_offs[p + 1]]`, never
    /// empty. Those of consecutive positions are consecutive.
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
        let marks = Mark::at(&body, spans.iter().flat_map(|&(s, e)| [s, e]));
        let entries = marks
            .chunks_exact(2)
            .map(|m| match m {
                [a, b] => Span::between(a, b),
                _ => Span::EMPTY,
            })
            .collect();
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
            marks,
            entries,
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
        let (mut members, mut runs) = (0, 0usize);
        sel.for_each_run(|r| {
            members += self.run(r.start, r.end).len();
            runs += 1;
        });
        // A comma between runs (those inside a run are in its slice).
        prefix_len(sel.len(), total) + members + runs.saturating_sub(1) + 2
    }

    /// Size of the gzip body of `sel` assembled from fragments, without building it.
    fn gzip_len(&self, sel: &Selection<'_>, total: usize, frags: &Fragments) -> usize {
        let (mut frag_bytes, mut runs) = (0, 0usize);
        sel.for_each_run(|r| {
            frag_bytes += self.frag(r.start, frags).len() + self.chained(r.start + 1, r.end).len();
            runs += 1;
        });
        let commas = runs.saturating_sub(1);
        gzip::member_len(
            1 + commas,
            prefix_len(sel.len(), total) + commas,
            frag_bytes,
            2,
        )
    }

    /// The size of the gzip body of `sel` if the answer is sent gzip-compressed to a client
    /// that does or does not accept gzip: when it does, the identity body is at least
    /// [`GZIP_MIN`] bytes and the fragments make it smaller. Decided from sizes alone, before
    /// anything is built.
    pub fn gzip_size(
        &self,
        sel: &Selection<'_>,
        total: usize,
        accept_gzip: bool,
        frags: &Fragments,
    ) -> Option<usize> {
        if !accept_gzip {
            return None;
        }
        let plain = self.identity_len(sel, total);
        let gz = self.gzip_len(sel, total, frags);
        (plain >= GZIP_MIN && gz < plain).then_some(gz)
    }

    /// Builds the body of `sel` (out of `total` matches): gzip-compressed if `gzip` holds
    /// its size ([`List::gzip_size`]; only a capacity, a wrong one costs a reallocation).
    pub fn assemble(
        &self,
        sel: &Selection<'_>,
        total: usize,
        gzip: Option<usize>,
        frags: &Fragments,
    ) -> Assembled {
        if let Some(size) = gzip {
            Assembled {
                body: self.assemble_gzip(sel, total, size, frags),
                gzip: true,
            }
        } else {
            Assembled {
                body: self.assemble_identity(sel, total),
                gzip: false,
            }
        }
    }

    /// The identity body of `sel`: its prefix and separators in memory, each run of at
    /// least [`FILE_RUN_MIN`] bytes as a range of `file` (this list's `body` in the
    /// registry's file), shorter runs copied. Without a file, one buffer.
    pub fn identity_body(
        &self,
        sel: &Selection<'_>,
        total: usize,
        file: Option<&FileRange>,
    ) -> Body {
        let Some(file) = file else {
            return Body::from(self.assemble_identity(sel, total));
        };
        // Sized once: the prefix, the copied runs, the commas and the closing braces.
        let (mut copied, mut runs) = (0, 0usize);
        sel.for_each_run(|r| {
            let (start, end) = self.run_span(r.start, r.end);
            runs += 1;
            if end - start < FILE_RUN_MIN {
                copied += end - start;
            }
        });
        let mut parts = Vec::new();
        let mut buf = Vec::with_capacity(prefix_len(sel.len(), total) + copied + runs + 2);
        write_prefix(&mut buf, sel.len(), total);
        let mut first = true;
        sel.for_each_run(|r| {
            if !first {
                buf.push(b',');
            }
            first = false;
            let (start, end) = self.run_span(r.start, r.end);
            if end - start >= FILE_RUN_MIN {
                parts.push(Part::Mem(Bytes::from(std::mem::take(&mut buf))));
                parts.push(Part::File(file.slice(start, end - start)));
            } else {
                buf.extend_from_slice(self.body.get(start..end).unwrap_or(&[]));
            }
        });
        buf.extend_from_slice(b"}}");
        if parts.is_empty() {
            return Body::from(buf);
        }
        parts.push(Part::Mem(Bytes::from(buf)));
        Body::Parts(parts)
    }

    fn assemble_identity(&self, sel: &Selection<'_>, total: usize) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.identity_len(sel, total));
        write_prefix(&mut out, sel.len(), total);
        let mut first = true;
        sel.for_each_run(|r| {
            if !first {
                out.push(b',');
            }
            first = false;
            out.extend_from_slice(self.run(r.start, r.end));
        });
        out.extend_from_slice(b"}}");
        out
    }

    /// Each run of `sel` is the standalone fragment of its first entry and the chained
    /// fragments of the others (one slice of `chain`); a stored comma goes between runs.
    /// The run's uncompressed bytes are one slice of `body`, whose CRC comes from its marks.
    fn assemble_gzip(
        &self,
        sel: &Selection<'_>,
        total: usize,
        size: usize,
        frags: &Fragments,
    ) -> Vec<u8> {
        let mut prefix = Vec::with_capacity(64);
        write_prefix(&mut prefix, sel.len(), total);
        let mut m = Member::new(size);
        m.stored(&prefix);
        let mut first = true;
        sel.for_each_run(|r| {
            if !first {
                m.stored(b",");
            }
            first = false;
            m.fragments(self.frag(r.start, frags));
            m.fragments(self.chained(r.start + 1, r.end));
            m.plain(&self.span(r));
        });
        m.finish(b"}}")
    }

    /// The chained fragments of positions `a..b` (empty if b <= a), one after the other.
    fn chained(&self, a: usize, b: usize) -> &[u8] {
        match (self.chain_offs.get(a), self.chain_offs.get(b)) {
            (Some(&s), Some(&e)) => self.chain.get(s..e).unwrap_or(&[]),
            _ => &[],
        }
    }

    /// The CRC span of the bytes of positions `r` in `body` (those of [`List::run`]).
    fn span(&self, r: Range<usize>) -> Span {
        if r.len() == 1 {
            return self.entries.get(r.start).copied().unwrap_or(Span::EMPTY);
        }
        let start = self.marks.get(2 * r.start);
        let end = r.end.checked_sub(1).and_then(|l| self.marks.get(2 * l + 1));
        match (start, end) {
            (Some(a), Some(b)) if r.end > r.start => Span::between(a, b),
            _ => Span::EMPTY,
        }
    }

    /// The bytes of positions `a..b` (b > a) in `body`, commas between them included.
    fn run(&self, a: usize, b: usize) -> &[u8] {
        let (start, end) = self.run_span(a, b);
        self.body.get(start..end).unwrap_or(&[])
    }

    /// Byte range in `body` of the entries at positions `a..b`.
    fn run_span(&self, a: usize, b: usize) -> (usize, usize) {
        let start = self.spans.get(a).map_or(0, |s| s.0);
        let end = b
            .checked_sub(1)
            .and_then(|l| self.spans.get(l))
            .map_or(start, |s| s.1);
        (start, end.max(start))
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
    use super::super::test_gzip::gunzip;
    use super::*;

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
            let id = list.assemble(&sel, 99, None, &frags);
            assert!(!id.gzip);
            assert_eq!(
                serde_json::from_slice::<serde_json::Value>(&id.body).unwrap(),
                want
            );
            let gz = list.assemble(&sel, 99, Some(0), &frags);
            assert!(gz.gzip);
            assert_eq!(gunzip(&gz.body), id.body, "{pos:?}");
            assert_eq!(
                list.gzip_size(&sel, 99, true, &frags),
                (id.body.len() >= GZIP_MIN && gz.body.len() < id.body.len())
                    .then_some(gz.body.len())
            );
            assert_eq!(list.identity_len(&sel, 99), id.body.len());
            assert_eq!(list.gzip_len(&sel, 99, &frags), gz.body.len());
        }
    }

    /// The gzip body as it was built before CRC marks: entry by entry, chained after its
    /// predecessor, and the CRC read from the uncompressed bytes.
    fn gzip_entry_by_entry(list: &List, pos: &[usize], total: usize, frags: &Fragments) -> Vec<u8> {
        let mut prefix = Vec::new();
        write_prefix(&mut prefix, pos.len(), total);
        let mut m = Member::new(0);
        m.stored(&prefix);
        let mut prev: Option<usize> = None;
        for &p in pos {
            let plain = match prev {
                Some(q) if q + 1 == p => {
                    m.fragments(list.chained(p, p + 1));
                    &list.body[list.spans[q].1..list.spans[p].1]
                }
                _ => {
                    if prev.is_some() {
                        m.stored(b",");
                    }
                    m.fragments(list.frag(p, frags));
                    list.run(p, p + 1)
                }
            };
            m.plain(&Span::of(plain));
            prev = Some(p);
        }
        m.finish(b"}}")
    }

    #[test]
    fn gzip_bodies_of_random_selections() {
        let recs = records();
        let mut fr = gzip::Fragmenter::default();
        let frags = Fragments::build(&recs, &mut fr);
        let list = List::build(&recs, (0..40).rev().collect(), 3, &mut fr).unwrap();
        let mut rng = super::super::tests::xorshift(0x2545_F491_4F6C_DD1D);
        let mut next = move || rng() as usize;
        for i in 0..300 {
            let subset: Vec<u32>;
            let sel = if i % 3 == 0 {
                let a = next() % 41;
                Selection::Range(a..a + next() % (41 - a))
            } else {
                // Sorted subsets, dense or sparse, down to the empty one.
                let keep = next() % 5;
                subset = (0..40).filter(|_| next() % 5 < keep).collect();
                Selection::Positions(&subset)
            };
            let mut pos = Vec::new();
            sel.for_each(|p| pos.push(p));
            let id = list.assemble(&sel, 77, None, &frags).body;
            let gz = list.assemble(&sel, 77, Some(0), &frags).body;
            assert_eq!(gz, gzip_entry_by_entry(&list, &pos, 77, &frags), "{pos:?}");
            let n = gz.len();
            assert_eq!(gz[n - 8..n - 4], crc32fast::hash(&id).to_le_bytes());
            assert_eq!(gz[n - 4..], (id.len() as u32).to_le_bytes());
            assert_eq!(gunzip(&gz), id);
            assert_eq!(list.gzip_len(&sel, 77, &frags), n);
            assert_eq!(list.identity_len(&sel, 77), id.len());
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
