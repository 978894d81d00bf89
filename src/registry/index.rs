//! The search index: answers "which names contain this text, ignoring case" for one list
//! without scanning every name.
//!
//! Names and queries are compared after Unicode simple case folding ([`fold`]), as UTF-8
//! bytes (a valid UTF-8 needle can only match a valid UTF-8 haystack at character
//! boundaries, so a byte match is a character match). The index keeps posting lists (sorted
//! positions of the names holding a gram) for
//! - every 1-, 2- and 3-byte gram of the folded names, and
//! - every 4-, 5- and 6-byte gram held by at least `long_min` names (default
//!   [`LONG_GRAM_MIN_NAMES`]): the frequent words and word parts people type ("wallet",
//!   "swap"), whose answers are large and would be costly to verify.
//!
//! A query that is itself an indexed gram (any query of 1 to 3 bytes, a frequent one of 4 to
//! 6) is answered by its posting list, borrowed, exactly, with no work. Any other query is
//! answered by intersecting the rarest posting lists of its grams and verifying each
//! survivor with a substring search on that one folded name; since frequent long grams are
//! indexed, the survivors are few unless the answer itself is large.
//!
//! Results are positions in list order, so paging is slicing. It owns no I/O and no HTTP.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

use memchr::memmem;

/// Grams of up to this many bytes are always indexed.
const SHORT_GRAM: usize = 3;
/// Longest indexed gram, bytes.
const LONG_GRAM: usize = 6;
/// Default minimum number of names holding a 4- to 6-byte gram for it to be indexed.
pub const LONG_GRAM_MIN_NAMES: usize = 32;

/// Folds `s` with Unicode simple case folding (CaseFolding.txt statuses C and S): one
/// character to one character, so `ß` stays `ß` and `Σ`, `σ`, `ς` all become `σ`.
pub fn fold(s: &str) -> String {
    casefold::simple_fold(s.to_string())
}

/// Positions (in list order) of the names that match a query.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Matches<'a> {
    /// Every name matches (the empty query): positions `0..n`.
    All(usize),
    /// A posting list of the index, borrowed.
    Slice(&'a [u32]),
    /// Positions computed for this query.
    Owned(Vec<u32>),
}

impl Matches<'_> {
    /// Number of matching names.
    pub fn len(&self) -> usize {
        match self {
            Matches::All(n) => *n,
            Matches::Slice(s) => s.len(),
            Matches::Owned(v) => v.len(),
        }
    }

    /// No name matches.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The position of the `i`-th match.
    pub fn get(&self, i: usize) -> Option<u32> {
        match self {
            Matches::All(n) => (i < *n).then(|| u32::try_from(i).ok()).flatten(),
            Matches::Slice(s) => s.get(i).copied(),
            Matches::Owned(v) => v.get(i).copied(),
        }
    }
}

/// Hasher for gram keys: a multiply and a fold, so that every key byte reaches the low bits
/// the table indexes with.
#[derive(Default)]
struct GramHasher(u64);

impl Hasher for GramHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u64(self.0.rotate_left(8) ^ u64::from(b));
        }
    }
    fn write_u64(&mut self, v: u64) {
        let h = (v ^ (v >> 29)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        self.0 = h ^ (h >> 32);
    }
}

type GramMap<V> = HashMap<u64, V, BuildHasherDefault<GramHasher>>;

/// The key of a gram of 1 to 6 bytes: its length in the top byte, its bytes below.
fn gram_key(g: &[u8]) -> u64 {
    g.iter().fold((g.len() as u64) << 56, |k, &b| {
        (k & (0xFF << 56)) | ((k << 8) & ((1 << 56) - 1)) | u64::from(b)
    })
}

/// Appends the distinct keys of the grams of `name` of lengths `lens` to `out` (cleared).
fn grams_of(name: &[u8], lens: std::ops::RangeInclusive<usize>, out: &mut Vec<u64>) {
    out.clear();
    for n in lens {
        out.extend(name.windows(n).map(gram_key));
    }
    out.sort_unstable();
    out.dedup();
}

/// Substring index over the case-folded names of one list.
#[derive(Debug, Clone)]
pub struct SearchIndex {
    /// All folded names, back to back.
    names: Vec<u8>,
    /// Name `i` is `names[offs[i]..offs[i + 1]]`.
    offs: Vec<u32>,
    /// Gram key -> its posting list `postings[start..end]`.
    grams: GramMap<(u32, u32)>,
    /// Every posting list, back to back; each sorted and without duplicates.
    postings: Vec<u32>,
    /// Longest folded name, bytes (a longer query matches nothing).
    max_len: usize,
}

impl SearchIndex {
    /// Builds the index of `names` (position `i` is the `i`-th name).
    ///
    /// Fails only if the names do not fit the index's 32-bit offsets (4 GiB of names).
    pub fn new<'a>(names: impl IntoIterator<Item = &'a str>) -> Result<SearchIndex, IndexTooLarge> {
        SearchIndex::with_long_min(names, LONG_GRAM_MIN_NAMES)
    }

    /// Like [`SearchIndex::new`], indexing 4- to 6-byte grams held by at least `long_min`
    /// names (tests use small values to exercise both paths).
    pub fn with_long_min<'a>(
        names: impl IntoIterator<Item = &'a str>,
        long_min: usize,
    ) -> Result<SearchIndex, IndexTooLarge> {
        let mut folded = Vec::new();
        let mut offs = vec![0u32];
        let mut max_len = 0;
        for name in names {
            let f = fold(name);
            max_len = max_len.max(f.len());
            folded.extend_from_slice(f.as_bytes());
            offs.push(u32::try_from(folded.len()).map_err(|_| IndexTooLarge)?);
        }
        let n = offs.len() - 1;
        u32::try_from(n).map_err(|_| IndexTooLarge)?;
        let name = |i: usize| -> &[u8] {
            match (offs.get(i), offs.get(i + 1)) {
                (Some(&s), Some(&e)) => folded.get(s as usize..e as usize).unwrap_or(&[]),
                _ => &[],
            }
        };
        // Pass 1: how many names hold each long gram.
        let mut grams = Vec::new();
        let mut long_count: GramMap<u32> = GramMap::default();
        for i in 0..n {
            grams_of(name(i), SHORT_GRAM + 1..=LONG_GRAM, &mut grams);
            for &g in &grams {
                *long_count.entry(g).or_default() += 1;
            }
        }
        long_count.retain(|_, c| *c as usize >= long_min.max(1));
        // Pass 2: posting lists, in name order so each is sorted.
        let mut lists: GramMap<Vec<u32>> = GramMap::default();
        for i in 0..n {
            let b = name(i);
            grams_of(b, 1..=LONG_GRAM, &mut grams);
            for &g in &grams {
                if (g >> 56) as usize <= SHORT_GRAM || long_count.contains_key(&g) {
                    lists.entry(g).or_default().push(i as u32);
                }
            }
        }
        drop(long_count);
        let total: usize = lists.values().map(Vec::len).sum();
        u32::try_from(total).map_err(|_| IndexTooLarge)?;
        let mut postings = Vec::with_capacity(total);
        let mut map = GramMap::with_capacity_and_hasher(lists.len(), Default::default());
        let mut keys: Vec<u64> = lists.keys().copied().collect();
        keys.sort_unstable();
        for k in keys {
            if let Some(list) = lists.remove(&k) {
                let start = postings.len() as u32;
                postings.extend_from_slice(&list);
                map.insert(k, (start, postings.len() as u32));
            }
        }
        Ok(SearchIndex {
            names: folded,
            offs,
            grams: map,
            postings,
            max_len,
        })
    }

    /// Number of names.
    pub fn len(&self) -> usize {
        self.offs.len() - 1
    }

    /// No names.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The positions of the names containing `query` after folding both; the empty query
    /// matches every name.
    pub fn find(&self, query: &str) -> Matches<'_> {
        self.find_folded(fold(query).as_bytes())
    }

    /// Like [`SearchIndex::find`] for a query already folded with [`fold`].
    pub fn find_folded(&self, q: &[u8]) -> Matches<'_> {
        if q.is_empty() {
            return Matches::All(self.len());
        }
        if q.len() > self.max_len {
            return Matches::Owned(Vec::new());
        }
        if q.len() <= LONG_GRAM {
            match self.posting(gram_key(q)) {
                Some(p) => return Matches::Slice(p),
                None if q.len() <= SHORT_GRAM => return Matches::Owned(Vec::new()),
                None => {}
            }
        }
        // Every gram of the query is in a matching name: gather the posting lists of its
        // grams (trigrams always indexed, longer ones when frequent), rarest first.
        let mut lists: Vec<&[u32]> = Vec::with_capacity(q.len() * 2);
        for w in q.windows(SHORT_GRAM) {
            match self.posting(gram_key(w)) {
                Some(p) => lists.push(p),
                None => return Matches::Owned(Vec::new()),
            }
        }
        for n in SHORT_GRAM + 1..=LONG_GRAM.min(q.len()) {
            lists.extend(q.windows(n).filter_map(|w| self.posting(gram_key(w))));
        }
        lists.sort_unstable_by_key(|l| l.len());
        lists.dedup_by(|a, b| std::ptr::eq(a.as_ptr(), b.as_ptr()));
        let mut cand: Vec<u32> = lists.first().map_or_else(Vec::new, |l| l.to_vec());
        // Intersecting with a much longer list costs more than verifying the candidates.
        for other in lists.iter().skip(1).take(3) {
            if cand.len() < 8 || other.len() > cand.len().saturating_mul(32) {
                break;
            }
            cand = intersect(&cand, other);
        }
        let finder = memmem::Finder::new(q);
        cand.retain(|&p| self.name(p).is_some_and(|n| finder.find(n).is_some()));
        Matches::Owned(cand)
    }

    fn posting(&self, key: u64) -> Option<&[u32]> {
        let &(s, e) = self.grams.get(&key)?;
        self.postings.get(s as usize..e as usize)
    }

    fn name(&self, pos: u32) -> Option<&[u8]> {
        let i = pos as usize;
        let s = *self.offs.get(i)? as usize;
        let e = *self.offs.get(i + 1)? as usize;
        self.names.get(s..e)
    }
}

/// Sorted intersection of two sorted lists: a merge when their sizes are close, else a
/// gallop through the longer one.
fn intersect(a: &[u32], b: &[u32]) -> Vec<u32> {
    let (small, mut big) = if a.len() <= b.len() { (a, b) } else { (b, a) };
    let mut out = Vec::with_capacity(small.len());
    if big.len() <= small.len().saturating_mul(8) {
        let (mut i, mut j) = (0, 0);
        while let (Some(&x), Some(&y)) = (small.get(i), big.get(j)) {
            if x == y {
                out.push(x);
            }
            i += usize::from(x <= y);
            j += usize::from(y <= x);
        }
        return out;
    }
    for &x in small {
        // Gallop to the first element >= x.
        let mut step = 1;
        while big.get(step).is_some_and(|&y| y < x) {
            step *= 2;
        }
        let upto = (step + 1).min(big.len());
        let i = big.get(..upto).map_or(0, |h| h.partition_point(|&y| y < x));
        big = big.get(i..).unwrap_or(&[]);
        match big.first() {
            Some(&y) if y == x => out.push(x),
            Some(_) => {}
            None => break,
        }
    }
    out
}

/// The names of one list are too large for the index's 32-bit offsets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the registry is too large to index (over 4 GiB of names or postings)")]
pub struct IndexTooLarge;

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn brute(folded: &[String], q: &str) -> Vec<u32> {
        let fq = fold(q);
        folded
            .iter()
            .enumerate()
            .filter(|(_, n)| n.contains(&fq))
            .map(|(i, _)| i as u32)
            .collect()
    }

    fn positions(m: &Matches<'_>) -> Vec<u32> {
        (0..m.len()).filter_map(|i| m.get(i)).collect()
    }

    #[test]
    fn folds_with_simple_case_folding() {
        assert_eq!(fold("MetaMask"), "metamask");
        assert_eq!(fold("ΣΑΣ ς"), "σασ σ");
        assert_eq!(fold("ÜBER"), "über");
        assert_eq!(fold("\u{212A}"), "k"); // KELVIN SIGN
        assert_eq!(fold("ß"), "ß"); // full folding would give "ss"
        assert_eq!(fold("ſ"), "s");
    }

    #[test]
    fn finds_substrings_ignoring_case() {
        let names = [
            "Rainbow",
            "Trust Wallet",
            "MetaMask",
            "wallet.io",
            "ΟΔΥΣΣΕΥΣ",
            "Ws",
        ];
        let idx = SearchIndex::new(names).unwrap();
        assert_eq!(positions(&idx.find("WALLET")), vec![1, 3]);
        assert_eq!(positions(&idx.find("w")), vec![0, 1, 3, 5]);
        assert_eq!(positions(&idx.find("et")), vec![1, 2, 3]);
        assert_eq!(positions(&idx.find("t wa")), vec![1]);
        assert_eq!(positions(&idx.find("οδυσσευς")), vec![4]);
        assert_eq!(positions(&idx.find("υς")), vec![4]);
        assert_eq!(idx.find(""), Matches::All(6));
        assert!(idx.find("zzzz").is_empty());
        assert!(idx.find("Rainbow and more").is_empty());
        assert!(idx.find("wallet wallet").is_empty());
    }

    #[test]
    fn intersect_merges_and_gallops() {
        let a: Vec<u32> = (0..100).map(|x| x * 3).collect();
        let b: Vec<u32> = (0..200).map(|x| x * 2).collect();
        let want: Vec<u32> = (0..300).filter(|x| x % 6 == 0).collect();
        assert_eq!(intersect(&a, &b), want);
        assert_eq!(intersect(&b, &a), want);
        let c: Vec<u32> = (0..5000).collect();
        let d = vec![3, 17, 4999, 6000];
        assert_eq!(intersect(&c, &d), vec![3, 17, 4999]);
        assert_eq!(intersect(&d, &c), vec![3, 17, 4999]);
        assert!(intersect(&[], &b).is_empty());
    }

    #[test]
    fn frequent_long_grams_are_answered_from_their_posting_list() {
        let names: Vec<String> = (0..100)
            .map(|i| format!("Wallet {i}"))
            .chain(["Rare Swap".to_string()])
            .collect();
        let idx = SearchIndex::with_long_min(names.iter().map(String::as_str), 10).unwrap();
        assert!(matches!(idx.find("WALLET"), Matches::Slice(s) if s.len() == 100));
        assert!(matches!(idx.find("wallet 1"), Matches::Owned(v) if v.len() == 11));
        assert!(matches!(idx.find("swap"), Matches::Owned(v) if v == vec![100]));
        assert!(idx.find("wallets").is_empty());
    }

    fn name_strategy() -> impl Strategy<Value = String> {
        // A small alphabet with case pairs, multi-byte letters and folding oddities, so that
        // random queries hit often.
        let chars = prop::sample::select(vec![
            'a', 'A', 'b', 'B', 'c', ' ', '.', 'é', 'É', 'ß', 'Σ', 'σ', 'ς', '\u{212A}', 'k', 'K',
            'ſ', 's', '日',
        ]);
        prop::collection::vec(chars, 0..12).prop_map(|v| v.into_iter().collect())
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]
        #[test]
        fn matches_brute_force(
            names in prop::collection::vec(name_strategy(), 0..60),
            queries in prop::collection::vec(name_strategy(), 1..20),
            long_min in prop::sample::select(vec![1usize, 2, 3, LONG_GRAM_MIN_NAMES]),
        ) {
            let idx = SearchIndex::with_long_min(names.iter().map(String::as_str), long_min).unwrap();
            let folded: Vec<String> = names.iter().map(|n| fold(n)).collect();
            for q in &queries {
                prop_assert_eq!(positions(&idx.find(q)), brute(&folded, q), "query {:?}", q);
            }
            // Substrings of real names are the interesting queries.
            for n in names.iter().take(8) {
                let chars: Vec<char> = n.chars().collect();
                for w in 1..=chars.len().min(6) {
                    for s in 0..=chars.len() - w {
                        let q: String = chars[s..s + w].iter().collect();
                        prop_assert_eq!(positions(&idx.find(&q)), brute(&folded, &q), "query {:?}", q);
                    }
                }
            }
        }
    }
}
