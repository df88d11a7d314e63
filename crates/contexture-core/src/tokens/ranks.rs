//! Exact byte-pair encoding over rank tables read in place from the binary.
//!
//! An encoding is its tokens' ranks: a piece of text (what pre-tokenizing cuts, see
//! [`super::pieces`]) starts as its single bytes, and the adjacent pair whose joined bytes
//! have the lowest rank is merged, leftmost first, until no joined pair is a token. The
//! tokens left are the encoding; their ranks are the token ids. This is tiktoken's
//! definition, and its results.
//!
//! The tables come from each encoding's tiktoken rank file, built by the build script: every
//! token's bytes, and a hash table from bytes to rank whose slots say where each token's
//! bytes are (see `build.rs`).
//! They are part of the binary and read where they lie, so nothing is loaded or built when a
//! process starts counting: a lookup touches a few of their pages.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use super::rank_hash::rank_hash;

mod cl100k {
    include!(concat!(env!("OUT_DIR"), "/cl100k_base.rs"));
}

mod o200k {
    include!(concat!(env!("OUT_DIR"), "/o200k_base.rs"));
}

/// Pieces up to this many bytes are merged by scanning their pairs for the lowest rank on
/// each merge (quadratic, fast when short); longer ones keep their pairs in a heap.
const SCAN_PIECE_BYTES: usize = 128;

/// No pair: a rank past every token's.
const NO_RANK: u32 = u32::MAX;

/// One encoding's rank tables.
pub(super) struct Ranks {
    /// Every token's bytes, in rank order.
    bytes: &'static [u8],
    /// Hash table slots (little-endian `u64`s): a token's rank (low 32 bits), length (next
    /// 8) and start in `bytes` (top 24), or 0 when empty.
    slots: &'static [u8],
    /// `slots`' length in slots, less one (a power of two less one).
    slot_mask: usize,
    /// The longest token, in bytes.
    max_token_bytes: usize,
}

/// cl100k_base's tables.
pub(super) static CL100K_BASE: Ranks = Ranks {
    bytes: include_bytes!(concat!(env!("OUT_DIR"), "/cl100k_base.bytes")),
    slots: include_bytes!(concat!(env!("OUT_DIR"), "/cl100k_base.slots")),
    slot_mask: cl100k::SLOTS - 1,
    max_token_bytes: cl100k::MAX_TOKEN_BYTES,
};

/// o200k_base's tables.
pub(super) static O200K_BASE: Ranks = Ranks {
    bytes: include_bytes!(concat!(env!("OUT_DIR"), "/o200k_base.bytes")),
    slots: include_bytes!(concat!(env!("OUT_DIR"), "/o200k_base.slots")),
    slot_mask: o200k::SLOTS - 1,
    max_token_bytes: o200k::MAX_TOKEN_BYTES,
};

impl Ranks {
    /// The slot at `index`.
    fn slot(&self, index: usize) -> u64 {
        let at = index * 8;
        let mut word = [0u8; 8];
        word.copy_from_slice(&self.slots[at..at + 8]);
        u64::from_le_bytes(word)
    }

    /// The rank of `bytes` when they are a token.
    pub(super) fn rank(&self, bytes: &[u8]) -> Option<u32> {
        if bytes.is_empty() || bytes.len() > self.max_token_bytes {
            return None;
        }
        let mut index = rank_hash(bytes) as usize & self.slot_mask;
        loop {
            let slot = self.slot(index);
            if slot == 0 {
                return None;
            }
            let len = (slot >> 32) as u8 as usize;
            if len == bytes.len() {
                let start = (slot >> 40) as usize;
                if &self.bytes[start..start + len] == bytes {
                    return Some(slot as u32);
                }
            }
            index = (index + 1) & self.slot_mask;
        }
    }

    /// The rank of `bytes`, or [`NO_RANK`].
    fn rank_or_none(&self, bytes: &[u8]) -> u32 {
        self.rank(bytes).unwrap_or(NO_RANK)
    }

    /// How many tokens `piece` encodes to.
    pub(super) fn count(&self, piece: &[u8]) -> usize {
        match piece.len() {
            0 => 0,
            1 => 1,
            _ if self.rank(piece).is_some() => 1,
            _ => self.merge(piece, |_| {}),
        }
    }

    /// Appends the token ids of `piece` to `ids`.
    pub(super) fn encode(&self, piece: &[u8], ids: &mut Vec<u32>) {
        if piece.is_empty() {
            return;
        }
        if let Some(rank) = self.rank(piece) {
            ids.push(rank);
            return;
        }
        self.merge(piece, |token| ids.push(self.rank_or_none(token)));
    }

    /// Merges `piece` (of at least two bytes) into its tokens, handing each to `token` in
    /// order; returns how many there are.
    fn merge(&self, piece: &[u8], token: impl FnMut(&[u8])) -> usize {
        if piece.len() <= SCAN_PIECE_BYTES {
            self.merge_by_scan(piece, token)
        } else {
            self.merge_by_heap(piece, token)
        }
    }

    /// tiktoken's merge loop: `parts[i]` is a part's start and the rank of it joined with
    /// the next part; each round merges the lowest-ranked pair (the leftmost of equals).
    fn merge_by_scan(&self, piece: &[u8], mut token: impl FnMut(&[u8])) -> usize {
        let mut parts: Vec<(usize, u32)> = Vec::with_capacity(piece.len() + 1);
        for start in 0..piece.len() - 1 {
            parts.push((start, self.rank_or_none(&piece[start..start + 2])));
        }
        parts.push((piece.len() - 1, NO_RANK));
        parts.push((piece.len(), NO_RANK));
        // The rank of part `i` joined with the part after the next one's merge.
        let joined = |parts: &[(usize, u32)], i: usize| match parts.get(i + 3) {
            Some(&(end, _)) => self.rank_or_none(&piece[parts[i].0..end]),
            None => NO_RANK,
        };
        loop {
            let (mut lowest, mut at) = (NO_RANK, 0);
            for (i, &(_, rank)) in parts[..parts.len() - 1].iter().enumerate() {
                if rank < lowest {
                    (lowest, at) = (rank, i);
                }
            }
            if lowest == NO_RANK {
                break;
            }
            if at > 0 {
                parts[at - 1].1 = joined(&parts, at - 1);
            }
            parts[at].1 = joined(&parts, at);
            parts.remove(at + 1);
        }
        for pair in parts.windows(2) {
            token(&piece[pair[0].0..pair[1].0]);
        }
        parts.len() - 1
    }

    /// The same merges as [`Ranks::merge_by_scan`], in `n log n`: the parts are a linked
    /// list over their starts and the candidate pairs a heap ordered by rank, then start (so
    /// the leftmost of equal ranks comes first). A pair taken from the heap is merged if it
    /// still exists: its part still starts there and joined with the next one still has that
    /// rank (a rank is one token's bytes, so the same rank from the same start is the same
    /// pair).
    fn merge_by_heap(&self, piece: &[u8], mut token: impl FnMut(&[u8])) -> usize {
        let len = piece.len();
        // `next[start]`: where the part starting at `start` ends; `previous[start]`: where
        // the part before it starts (`usize::MAX`: none). Only live starts are read.
        let mut next: Vec<usize> = (1..=len).collect();
        let mut previous: Vec<usize> = (0..len).map(|start| start.wrapping_sub(1)).collect();
        let mut live = vec![true; len];
        let pair_rank = |next: &[usize], start: usize| -> u32 {
            let middle = next[start];
            if middle >= len {
                return NO_RANK;
            }
            self.rank_or_none(&piece[start..next[middle]])
        };
        let mut heap = BinaryHeap::with_capacity(len);
        for start in 0..len - 1 {
            let rank = pair_rank(&next, start);
            if rank != NO_RANK {
                heap.push(Reverse((rank, start)));
            }
        }
        let mut parts = len;
        while let Some(Reverse((rank, start))) = heap.pop() {
            if !live[start] || pair_rank(&next, start) != rank {
                continue;
            }
            let middle = next[start];
            let end = next[middle];
            live[middle] = false;
            next[start] = end;
            if end < len {
                previous[end] = start;
            }
            parts -= 1;
            let before = previous[start];
            if before != usize::MAX {
                let rank = pair_rank(&next, before);
                if rank != NO_RANK {
                    heap.push(Reverse((rank, before)));
                }
            }
            let rank = pair_rank(&next, start);
            if rank != NO_RANK {
                heap.push(Reverse((rank, start)));
            }
        }
        let mut start = 0;
        while start < len {
            token(&piece[start..next[start]]);
            start = next[start];
        }
        parts
    }

    /// [`Ranks::merge_by_heap`] for any piece length (tests compare it with the scan).
    #[cfg(test)]
    fn count_by_heap(&self, piece: &[u8]) -> usize {
        match piece.len() {
            0 => 0,
            1 => 1,
            _ => self.merge_by_heap(piece, |_| {}),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn tables() -> [(&'static Ranks, &'static bpe_openai::Tokenizer); 2] {
        [
            (&CL100K_BASE, bpe_openai::cl100k_base()),
            (&O200K_BASE, bpe_openai::o200k_base()),
        ]
    }

    #[test]
    fn every_token_is_found_at_its_own_rank() {
        for (ranks, tokenizer) in tables() {
            let tokens = tokenizer.bpe.num_tokens();
            let mut found = 0;
            for index in 0..=ranks.slot_mask {
                found += usize::from(ranks.slot(index) != 0);
            }
            assert_eq!(found, tokens);
            for rank in 0..tokens as u32 {
                assert_eq!(ranks.rank(tokenizer.bpe.token_bytes(rank)), Some(rank));
            }
            assert_eq!(ranks.rank(b""), None);
            assert_eq!(ranks.rank(&[b'x'; 300]), None);
        }
    }

    /// Pieces of a few byte values, so that long merges happen; and of any bytes.
    fn pieces() -> impl Strategy<Value = Vec<u8>> {
        prop_oneof![
            proptest::collection::vec(proptest::sample::select(b" aehinrst.\n".to_vec()), 0..300),
            proptest::collection::vec(any::<u8>(), 0..40),
            "[a-zA-Z]{0,400}".prop_map(String::into_bytes),
            "\\PC{0,60}".prop_map(String::into_bytes),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(3_000))]

        #[test]
        fn pieces_encode_as_bpe_openai_encodes_them(piece in pieces()) {
            for (ranks, tokenizer) in tables() {
                let mut ids = Vec::new();
                ranks.encode(&piece, &mut ids);
                prop_assert_eq!(&ids, &tokenizer.bpe.encode_via_backtracking(&piece));
                prop_assert_eq!(ranks.count(&piece), ids.len());
                prop_assert_eq!(ranks.count_by_heap(&piece), ids.len());
            }
        }
    }

    #[test]
    fn a_long_run_of_one_letter_merges_in_n_log_n() {
        let piece = vec![b'a'; 1 << 20];
        for (ranks, tokenizer) in tables() {
            assert_eq!(ranks.count(&piece), tokenizer.bpe.count(&piece));
        }
    }
}
