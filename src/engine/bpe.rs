//! Byte-pair counting over a compact rank table: tiktoken's own algorithm (merge the
//! adjacent pair whose bytes have the lowest rank, leftmost first, until no pair is a
//! token), so counts are tiktoken's by construction.
//!
//! A table is the token bytes concatenated in rank order (embedded in the binary, written by
//! `scripts/tokenizer-tables.py`), their offsets, and an open-addressing index from bytes to
//! rank: about 2.8 MB of heap for o200k and 1.4 MB for cl100k, built in a few milliseconds at
//! first use. (bpe-openai's automata, which this replaces, took 47 MB of binary and ~70 MB
//! of heap.)

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::sync::LazyLock;

static O200K: LazyLock<Ranks> =
    LazyLock::new(|| Ranks::new(include_bytes!("../../data/tokenizers/o200k_base.ranks")));
static CL100K: LazyLock<Ranks> =
    LazyLock::new(|| Ranks::new(include_bytes!("../../data/tokenizers/cl100k_base.ranks")));

/// o200k's table, built on first use.
pub fn o200k_base() -> &'static Ranks {
    &O200K
}

/// cl100k's table, built on first use.
pub fn cl100k_base() -> &'static Ranks {
    &CL100K
}

/// A token's rank: its id, and its merge priority (lower merges first).
type Rank = u32;

/// No token: an empty index slot, or a pair that does not merge.
const NONE: Rank = Rank::MAX;

/// Pieces up to this length merge in a fixed array by tiktoken's linear scan; longer ones
/// (runs of one character, base64 without separators) through a heap, so that no input
/// costs quadratic time.
const SHORT: usize = 64;

/// One encoding's tokens, looked up by their bytes.
pub struct Ranks {
    /// Every token's bytes, in rank order.
    bytes: &'static [u8],
    /// Token `r` is `bytes[offsets[r]..offsets[r + 1]]`.
    offsets: Vec<u32>,
    /// Open addressing with linear probing; a power of two long, at most half full.
    index: Vec<Rank>,
}

impl Ranks {
    /// Reads a table in the format `scripts/tokenizer-tables.py` writes. Malformed data (it
    /// is embedded and checked by the tests, so this cannot happen in a build) yields the
    /// tokens read up to the fault.
    pub fn new(data: &'static [u8]) -> Ranks {
        let n = data
            .get(..4)
            .and_then(|h| h.try_into().ok())
            .map_or(0, |h| u32::from_le_bytes(h) as usize);
        let lengths = data.get(4..4 + n).unwrap_or_default();
        let bytes = data.get(4 + n..).unwrap_or_default();
        let mut offsets = Vec::with_capacity(lengths.len() + 1);
        let mut end = 0u32;
        offsets.push(end);
        for &len in lengths {
            end += u32::from(len);
            if end as usize > bytes.len() {
                break;
            }
            offsets.push(end);
        }
        let count = offsets.len() - 1;
        let mut ranks = Ranks {
            bytes,
            offsets,
            index: vec![NONE; (count * 2).next_power_of_two().max(2)],
        };
        let mask = ranks.index.len() - 1;
        for rank in 0..count as Rank {
            let mut slot = hash(ranks.token(rank)) & mask;
            while ranks.index[slot] != NONE {
                slot = (slot + 1) & mask;
            }
            ranks.index[slot] = rank;
        }
        ranks
    }

    fn token(&self, rank: Rank) -> &'static [u8] {
        let r = rank as usize;
        match (self.offsets.get(r), self.offsets.get(r + 1)) {
            (Some(&s), Some(&e)) => self.bytes.get(s as usize..e as usize).unwrap_or_default(),
            _ => &[],
        }
    }

    /// The number of tokens in the table.
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.offsets.len() - 1
    }

    /// The bytes of token `rank`, for the tests' comparison with tiktoken.
    #[cfg(test)]
    pub fn bytes_of(&self, rank: u32) -> &[u8] {
        self.token(rank)
    }

    /// The rank of the token whose bytes are `piece`, or [`NONE`].
    fn rank(&self, piece: &[u8]) -> Rank {
        let mask = self.index.len() - 1;
        let mut slot = hash(piece) & mask;
        loop {
            let rank = self.index[slot];
            if rank == NONE || self.token(rank) == piece {
                return rank;
            }
            slot = (slot + 1) & mask;
        }
    }

    /// How many tokens `piece` (one pre-token) encodes to.
    pub fn count(&self, piece: &[u8]) -> usize {
        if piece.len() <= 1 || self.rank(piece) != NONE {
            return piece.len().min(1);
        }
        if piece.len() <= SHORT {
            self.count_short(piece)
        } else {
            self.count_long(piece)
        }
    }

    /// tiktoken's `_byte_pair_merge`: `parts[i]` is a part's start and the rank of the pair
    /// it starts; each round merges the lowest-ranked pair (the first of equals).
    fn count_short(&self, piece: &[u8]) -> usize {
        let mut parts = [(0u32, NONE); SHORT + 1];
        let n = piece.len();
        for (i, part) in parts.iter_mut().enumerate().take(n) {
            *part = (i as u32, piece.get(i..i + 2).map_or(NONE, |p| self.rank(p)));
        }
        parts[n] = (n as u32, NONE);
        let mut len = n + 1;
        // The rank of the pair starting at part `i` once part `i + 1` is gone.
        let pair = |parts: &[(u32, Rank)], len: usize, i: usize| {
            if i + 3 < len {
                self.rank(&piece[parts[i].0 as usize..parts[i + 3].0 as usize])
            } else {
                NONE
            }
        };
        loop {
            let mut min = (NONE, 0);
            for (i, &(_, rank)) in parts[..len - 1].iter().enumerate() {
                if rank < min.0 {
                    min = (rank, i);
                }
            }
            if min.0 == NONE {
                return len - 1;
            }
            let i = min.1;
            if i > 0 {
                parts[i - 1].1 = pair(&parts, len, i - 1);
            }
            parts[i].1 = pair(&parts, len, i);
            parts.copy_within(i + 2..len, i + 1);
            len -= 1;
        }
    }

    /// The same merges in the same order, with the parts in a linked list and the pairs in a
    /// min-heap by (rank, start): O(n log n). A heap entry is stale once its part is gone or
    /// its pair has changed (a merged pair's bytes are longer, so its rank differs).
    fn count_long(&self, piece: &[u8]) -> usize {
        let n = piece.len();
        // Per byte position: whether a part starts there, the next part's start, the
        // previous part's start, and the rank of the pair it starts.
        let mut next: Vec<usize> = (1..=n).collect();
        let mut prev: Vec<usize> = (0..n).map(|i| i.wrapping_sub(1)).collect();
        let mut rank: Vec<Rank> = vec![NONE; n];
        let mut alive = vec![true; n];
        let mut heap = BinaryHeap::with_capacity(n);
        for i in 0..n - 1 {
            rank[i] = self.rank(&piece[i..i + 2]);
            if rank[i] != NONE {
                heap.push(Reverse((rank[i], i)));
            }
        }
        let mut parts = n;
        // The rank of the pair of parts starting at `i` (0 if `i` is the last part).
        let pair_at = |next: &[usize], i: usize| {
            let j = next[i];
            if j >= n {
                NONE
            } else {
                self.rank(&piece[i..next[j]])
            }
        };
        while let Some(Reverse((r, i))) = heap.pop() {
            if !alive[i] || rank[i] != r {
                continue;
            }
            // Merge part i with the part after it.
            let j = next[i];
            alive[j] = false;
            next[i] = next[j];
            if next[i] < n {
                prev[next[i]] = i;
            }
            parts -= 1;
            rank[i] = pair_at(&next, i);
            if rank[i] != NONE {
                heap.push(Reverse((rank[i], i)));
            }
            let p = prev[i];
            if p < n {
                rank[p] = pair_at(&next, p);
                if rank[p] != NONE {
                    heap.push(Reverse((rank[p], p)));
                }
            }
        }
        parts
    }
}

/// The Fx multiply-rotate hash, word at a time: tokens are short, and a lookup must cost
/// little more than the comparison it ends with.
pub fn hash(bytes: &[u8]) -> usize {
    const K: u64 = 0x517c_c1b7_2722_0a95;
    let mut h = 0u64;
    let mut chunks = bytes.chunks_exact(8);
    for c in &mut chunks {
        let mut w = [0u8; 8];
        w.copy_from_slice(c);
        h = (h.rotate_left(5) ^ u64::from_le_bytes(w)).wrapping_mul(K);
    }
    let rest = chunks.remainder();
    if !rest.is_empty() {
        let mut w = [0u8; 8];
        w[..rest.len()].copy_from_slice(rest);
        h = (h.rotate_left(5) ^ u64::from_le_bytes(w) ^ rest.len() as u64).wrapping_mul(K);
    }
    // The high bits are the well-mixed ones.
    (h >> 32 ^ h) as usize
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn every_token_is_tiktokens() {
        for (ranks, tik, n) in [
            (&*O200K, tiktoken_rs::o200k_base_singleton(), 199_998),
            (&*CL100K, tiktoken_rs::cl100k_base_singleton(), 100_256),
        ] {
            assert_eq!(ranks.len(), n);
            for r in 0..n as u32 {
                assert_eq!(ranks.bytes_of(r), tik.decode_bytes(&[r]).unwrap(), "{r}");
                assert_eq!(ranks.rank(ranks.bytes_of(r)), r);
            }
        }
    }

    /// tiktoken's count of one pre-token, through its own encoder.
    fn tiktoken_count(piece: &[u8], cl100k: bool) -> usize {
        let tik = if cl100k {
            tiktoken_rs::cl100k_base_singleton()
        } else {
            tiktoken_rs::o200k_base_singleton()
        };
        tik.encode_ordinary(std::str::from_utf8(piece).unwrap())
            .len()
    }

    #[test]
    fn short_and_long_merges_agree() {
        // Pieces tiktoken would not split: one run of a letter, of digits-free base64.
        for piece in [
            "a".repeat(65),
            "a".repeat(300),
            "abcdefghij".repeat(30),
            "QUJDREVGR0hJSktMTU5PUFFSU1RVVldYWVo".repeat(9),
        ] {
            for ranks in [&*O200K, &*CL100K] {
                let b = piece.as_bytes();
                assert_eq!(ranks.count_long(b), count_linear(ranks, b), "{piece}");
            }
        }
    }

    /// tiktoken's linear merge with no length limit, as the reference for the heap.
    fn count_linear(ranks: &Ranks, piece: &[u8]) -> usize {
        let mut parts: Vec<(usize, Rank)> = (0..piece.len())
            .map(|i| (i, piece.get(i..i + 2).map_or(NONE, |p| ranks.rank(p))))
            .collect();
        parts.push((piece.len(), NONE));
        loop {
            let Some((i, &(_, r))) = parts[..parts.len() - 1]
                .iter()
                .enumerate()
                .min_by_key(|(i, (_, r))| (*r, *i))
            else {
                return 0;
            };
            if r == NONE {
                return parts.len() - 1;
            }
            let get = |parts: &Vec<(usize, Rank)>, i: usize| {
                if i + 3 < parts.len() {
                    ranks.rank(&piece[parts[i].0..parts[i + 3].0])
                } else {
                    NONE
                }
            };
            if i > 0 {
                parts[i - 1].1 = get(&parts, i - 1);
            }
            parts[i].1 = get(&parts, i);
            parts.remove(i + 1);
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]
        /// Letters only, so that the whole text is one pre-token for both encodings' patterns
        /// and tiktoken's count is the count of this one piece.
        #[test]
        fn one_piece_counts_are_tiktokens(piece in "[a-z]{1,200}") {
            let b = piece.as_bytes();
            prop_assert_eq!(O200K.count(b), tiktoken_count(b, false));
            prop_assert_eq!(CL100K.count(b), tiktoken_count(b, true));
            prop_assert_eq!(O200K.count_long(b), count_linear(&O200K, b));
        }
    }
}
