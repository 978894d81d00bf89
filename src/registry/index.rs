//! The search index: answers "which names contain this text, ignoring case" for one list
//! without scanning every name.
//!
//! Names and queries are compared after Unicode simple case folding ([`fold`]), as UTF-8
//! bytes (a valid UTF-8 needle can only match a valid UTF-8 haystack at character
//! boundaries, so a byte match is a character match). The index keeps, for every 1-, 2- and
//! 3-byte gram of the folded names, the sorted positions of the names holding it:
//! - a query of 1 to 3 bytes *is* one gram, so its posting list is the exact answer, served
//!   as a borrowed slice with no work;
//! - a longer query is answered by intersecting the posting lists of its rarest trigrams and
//!   verifying each survivor with a substring search on that one folded name.
//!
//! Results are positions in list order, so paging is slicing. It owns no I/O and no HTTP.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

use memchr::memmem;

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

/// Hasher for gram keys (already well spread `u32`s): one multiply.
#[derive(Default)]
struct GramHasher(u64);

impl Hasher for GramHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0.rotate_left(8) ^ u64::from(b)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        }
    }
    fn write_u32(&mut self, v: u32) {
        self.0 = (u64::from(v) ^ 0x5555_5555).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }
}

type GramMap<V> = HashMap<u32, V, BuildHasherDefault<GramHasher>>;

/// The gram key of 1 to 3 bytes: the length in the top byte, the bytes below.
fn gram_key(g: &[u8]) -> u32 {
    let mut k = (g.len() as u32) << 24;
    for &b in g {
        k = (k & 0xFF00_0000) | ((k << 8) & 0x00FF_FFFF) | u32::from(b);
    }
    k
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
        let mut folded = Vec::new();
        let mut offs = vec![0u32];
        let mut lists: GramMap<Vec<u32>> = GramMap::default();
        let mut grams = Vec::new();
        let mut max_len = 0;
        for (pos, name) in names.into_iter().enumerate() {
            let pos = u32::try_from(pos).map_err(|_| IndexTooLarge)?;
            let f = fold(name);
            let b = f.as_bytes();
            max_len = max_len.max(b.len());
            grams.clear();
            for n in 1..=3 {
                grams.extend(b.windows(n).map(gram_key));
            }
            grams.sort_unstable();
            grams.dedup();
            for &g in &grams {
                lists.entry(g).or_default().push(pos);
            }
            folded.extend_from_slice(b);
            offs.push(u32::try_from(folded.len()).map_err(|_| IndexTooLarge)?);
        }
        let total: usize = lists.values().map(Vec::len).sum();
        u32::try_from(total).map_err(|_| IndexTooLarge)?;
        let mut postings = Vec::with_capacity(total);
        let mut map = GramMap::with_capacity_and_hasher(lists.len(), Default::default());
        let mut keys: Vec<u32> = lists.keys().copied().collect();
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
        if q.len() <= 3 {
            return Matches::Slice(self.posting(gram_key(q)).unwrap_or(&[]));
        }
        // Every trigram of the query must be in a matching name; start from the rarest.
        let mut lists: Vec<&[u32]> = Vec::with_capacity(q.len() - 2);
        for w in q.windows(3) {
            match self.posting(gram_key(w)) {
                Some(p) => lists.push(p),
                None => return Matches::Owned(Vec::new()),
            }
        }
        lists.sort_unstable_by_key(|l| l.len());
        lists.dedup_by(|a, b| std::ptr::eq(a.as_ptr(), b.as_ptr()));
        let mut cand: Vec<u32> = lists.first().map_or_else(Vec::new, |l| l.to_vec());
        // Intersecting with a much longer list costs more than verifying the candidates.
        for other in lists.iter().skip(1).take(2) {
            if other.len() > cand.len().saturating_mul(16) {
                break;
            }
            cand = intersect(&cand, other);
        }
        let finder = memmem::Finder::new(q);
        cand.retain(|&p| self.name(p).is_some_and(|n| finder.find(n).is_some()));
        Matches::Owned(cand)
    }

    fn posting(&self, key: u32) -> Option<&[u32]> {
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

/// Sorted intersection of two sorted lists, galloping through the longer one.
fn intersect(a: &[u32], b: &[u32]) -> Vec<u32> {
    let (small, mut big) = if a.len() <= b.len() { (a, b) } else { (b, a) };
    let mut out = Vec::with_capacity(small.len());
    for &x in small {
        // Gallop to the first element >= x.
        let mut step = 1;
        while step < big.len() && big[step] < x {
            step *= 2;
        }
        let upto = (step + 1).min(big.len());
        let i = big[..upto].partition_point(|&y| y < x);
        big = &big[i..];
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
    fn intersect_gallops_correctly() {
        let a: Vec<u32> = (0..100).map(|x| x * 3).collect();
        let b: Vec<u32> = (0..200).map(|x| x * 2).collect();
        let want: Vec<u32> = (0..300).filter(|x| x % 6 == 0).collect();
        assert_eq!(intersect(&a, &b), want);
        assert_eq!(intersect(&b, &a), want);
        assert!(intersect(&[], &b).is_empty());
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
        ) {
            let idx = SearchIndex::new(names.iter().map(String::as_str)).unwrap();
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
