//! Byte-pair encoding of one pre-tokenized piece, over a byte-level BPE's vocabulary and merges,
//! giving exactly the ids `tokenizers`' BPE model gives.
//!
//! `tokenizers` starts from one symbol per byte and keeps merging the adjacent pair whose merge
//! comes first in the merges list (the leftmost such pair on a tie), each merge making the token
//! the two parts spell; with `ignore_merges`, a piece that is itself a token is taken whole.
//! The same order is followed here over ids: a short piece is merged in place, scanning for the
//! first merge, a long one through a heap, so that a run of thousands of bytes costs
//! O(n log n), not O(n²). Without `ignore_merges`, a piece that is a token is taken whole only
//! once that token's own bytes are known to merge into it, which is worked out the first time.
use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::sync::atomic::{AtomicU8, Ordering};

use ahash::AHashMap;

/// Pieces longer than this are merged through a heap.
const SHORT: usize = 64;

/// What merging one pair gives: the merge's place in the merges list and the merged token.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Merge {
    rank: u32,
    id: u32,
}

/// Whether a token's own bytes merge into it, once worked out.
const UNKNOWN: u8 = 0;
const WHOLE: u8 = 1;
const SPLIT: u8 = 2;

/// A byte-level BPE model: every token by its bytes, every merge by its pair of ids.
pub struct BytePairModel {
    tokens: AHashMap<Box<[u8]>, u32>,
    /// The token of each single byte.
    bytes: [u32; 256],
    merges: AHashMap<u64, Merge>,
    ignore_merges: bool,
    /// By token id, without `ignore_merges`: `WHOLE`, `SPLIT` or not yet `UNKNOWN`.
    whole: Vec<AtomicU8>,
}

/// Buffers one caller reuses from piece to piece.
#[derive(Default)]
pub struct Scratch {
    ids: Vec<u32>,
    ranks: Vec<Merge>,
    next: Vec<usize>,
    prev: Vec<usize>,
}

/// Pieces merged before, as `tokenizers`' BPE cache keeps them: pieces under `CACHED_BYTES`,
/// at most `CACHED_PIECES` of them (then it starts over).
#[derive(Default)]
pub struct PieceCache {
    pieces: AHashMap<Box<[u8]>, Box<[u32]>>,
}

const CACHED_BYTES: usize = 256;
const CACHED_PIECES: usize = 10_000;

impl PieceCache {
    fn keep(&mut self, piece: &[u8], ids: &[u32]) {
        if piece.len() >= CACHED_BYTES {
            return;
        }
        if self.pieces.len() >= CACHED_PIECES {
            self.pieces.clear();
        }
        self.pieces.insert(piece.into(), ids.into());
    }

    /// How many pieces are kept.
    pub fn len(&self) -> usize {
        self.pieces.len()
    }

    pub fn is_empty(&self) -> bool {
        self.pieces.is_empty()
    }
}

const NO_MERGE: Merge = Merge {
    rank: u32::MAX,
    id: u32::MAX,
};
const NONE: usize = usize::MAX;

fn pair(left: u32, right: u32) -> u64 {
    (u64::from(left) << 32) | u64::from(right)
}

impl BytePairModel {
    /// The model of `tokens` (each token's bytes and id) and `merges` (pairs of token bytes, in
    /// priority order), or why it cannot be one: a byte without a token, a merge of unknown
    /// tokens, or several tokens sharing an id.
    ///
    /// As in `tokenizers`, a pair listed twice keeps its later place.
    pub fn new(
        tokens: impl IntoIterator<Item = (Vec<u8>, u32)>,
        merges: impl IntoIterator<Item = (Vec<u8>, Vec<u8>)>,
        ignore_merges: bool,
    ) -> Result<Self, String> {
        let tokens: AHashMap<Box<[u8]>, u32> = tokens
            .into_iter()
            .map(|(bytes, id)| (bytes.into_boxed_slice(), id))
            .collect();
        let mut seen = ahash::AHashSet::with_capacity(tokens.len());
        if !tokens.values().all(|id| seen.insert(*id)) {
            return Err("its vocabulary gives several tokens one id".into());
        }
        let mut bytes = [0; 256];
        for (byte, slot) in bytes.iter_mut().enumerate() {
            *slot = *tokens
                .get(&[byte as u8][..])
                .ok_or_else(|| format!("byte {byte:#04x} has no token of its own"))?;
        }
        let mut merged = AHashMap::new();
        for (rank, (left, right)) in merges.into_iter().enumerate() {
            let id_of = |part: &[u8]| {
                tokens.get(part).copied().ok_or_else(|| {
                    format!(
                        "merge {rank} uses {:?}, which is not a byte-level token",
                        String::from_utf8_lossy(part)
                    )
                })
            };
            let key = pair(id_of(&left)?, id_of(&right)?);
            let id = id_of(&[left, right].concat())?;
            let rank = u32::try_from(rank).map_err(|_| "it has too many merges".to_string())?;
            merged.insert(key, Merge { rank, id });
        }
        let ids = if ignore_merges {
            0
        } else {
            tokens.values().max().map_or(0, |max| *max as usize + 1)
        };
        Ok(BytePairModel {
            tokens,
            bytes,
            merges: merged,
            ignore_merges,
            whole: (0..ids).map(|_| AtomicU8::new(UNKNOWN)).collect(),
        })
    }

    /// Append the ids of `piece` (the bytes of one pre-tokenized piece) to `out`, through
    /// `cache` when there is one.
    pub fn encode(
        &self,
        piece: &[u8],
        out: &mut Vec<u32>,
        scratch: &mut Scratch,
        cache: Option<&mut PieceCache>,
    ) {
        match piece {
            [] => {}
            [byte] => out.push(self.bytes[usize::from(*byte)]),
            _ => match self.tokens.get(piece) {
                Some(&id) if self.taken_whole(id, piece, scratch) => out.push(id),
                _ => match cache {
                    None => self.merge(piece, out, scratch),
                    Some(cache) => {
                        if let Some(ids) = cache.pieces.get(piece) {
                            out.extend_from_slice(ids);
                            return;
                        }
                        let start = out.len();
                        self.merge(piece, out, scratch);
                        cache.keep(piece, &out[start..]);
                    }
                },
            },
        }
    }

    /// Whether a piece that is token `id` is encoded as that one token.
    fn taken_whole(&self, id: u32, piece: &[u8], scratch: &mut Scratch) -> bool {
        if self.ignore_merges {
            return true;
        }
        let flag = &self.whole[id as usize];
        match flag.load(Ordering::Relaxed) {
            WHOLE => true,
            SPLIT => false,
            _ => {
                let mut ids = Vec::with_capacity(2);
                self.merge(piece, &mut ids, scratch);
                let whole = ids == [id];
                flag.store(if whole { WHOLE } else { SPLIT }, Ordering::Relaxed);
                whole
            }
        }
    }

    fn lookup(&self, left: u32, right: u32) -> Merge {
        self.merges
            .get(&pair(left, right))
            .copied()
            .unwrap_or(NO_MERGE)
    }

    /// Merge `piece` from its bytes up, appending the resulting ids to `out`.
    fn merge(&self, piece: &[u8], out: &mut Vec<u32>, scratch: &mut Scratch) {
        if piece.len() > SHORT {
            self.merge_long(piece, out, scratch);
        } else {
            self.merge_short(piece, out, scratch);
        }
    }

    /// Scan for the first merge, apply it, repeat: fast for the few bytes of most pieces.
    fn merge_short(&self, piece: &[u8], out: &mut Vec<u32>, scratch: &mut Scratch) {
        let Scratch { ids, ranks, .. } = scratch;
        ids.clear();
        ids.extend(piece.iter().map(|b| self.bytes[usize::from(*b)]));
        ranks.clear();
        ranks.extend(ids.windows(2).map(|w| self.lookup(w[0], w[1])));
        // The first of the lowest ranks: the leftmost pair on a tie.
        while let Some((at, best)) = ranks
            .iter()
            .enumerate()
            .min_by_key(|(at, merge)| (merge.rank, *at))
            .map(|(at, merge)| (at, *merge))
        {
            if best == NO_MERGE {
                break;
            }
            ids[at] = best.id;
            ids.remove(at + 1);
            ranks.remove(at);
            if at > 0 {
                ranks[at - 1] = self.lookup(ids[at - 1], ids[at]);
            }
            if at + 1 < ids.len() {
                ranks[at] = self.lookup(ids[at], ids[at + 1]);
            }
        }
        out.extend_from_slice(ids);
    }

    /// The same merges in the same order, kept in a heap over a linked list of symbols. A heap
    /// entry goes stale when either of its symbols changes; it is then skipped, because its
    /// pair no longer gives its merge (symbols only grow, so the pair at a position never
    /// comes back).
    fn merge_long(&self, piece: &[u8], out: &mut Vec<u32>, scratch: &mut Scratch) {
        let Scratch {
            ids, next, prev, ..
        } = scratch;
        let n = piece.len();
        ids.clear();
        ids.extend(piece.iter().map(|b| self.bytes[usize::from(*b)]));
        next.clear();
        next.extend((1..=n).map(|at| if at < n { at } else { NONE }));
        prev.clear();
        prev.extend((0..n).map(|at| at.checked_sub(1).unwrap_or(NONE)));
        let mut heap: BinaryHeap<Reverse<(u32, usize, u32)>> = ids
            .windows(2)
            .enumerate()
            .filter_map(|(at, w)| {
                let merge = self.lookup(w[0], w[1]);
                (merge != NO_MERGE).then_some(Reverse((merge.rank, at, merge.id)))
            })
            .collect();
        // A removed symbol has `prev` pointing at itself.
        while let Some(Reverse((rank, at, id))) = heap.pop() {
            let right = next[at];
            if prev[at] == at || right == NONE {
                continue;
            }
            if self.lookup(ids[at], ids[right]) != (Merge { rank, id }) {
                continue;
            }
            ids[at] = id;
            let after = next[right];
            next[at] = after;
            prev[right] = right;
            if after != NONE {
                prev[after] = at;
                let merge = self.lookup(id, ids[after]);
                if merge != NO_MERGE {
                    heap.push(Reverse((merge.rank, at, merge.id)));
                }
            }
            let before = prev[at];
            if before != NONE {
                let merge = self.lookup(ids[before], id);
                if merge != NO_MERGE {
                    heap.push(Reverse((merge.rank, before, merge.id)));
                }
            }
        }
        let mut at = 0;
        while at != NONE {
            out.push(ids[at]);
            at = next[at];
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Tokens: every byte (id = byte), then each merge's result, in order.
    fn model(merges: &[(&str, &str)], ignore_merges: bool) -> BytePairModel {
        let mut tokens: Vec<(Vec<u8>, u32)> = (0..=255u8).map(|b| (vec![b], b.into())).collect();
        for (left, right) in merges {
            let joined = format!("{left}{right}").into_bytes();
            if !tokens.iter().any(|(bytes, _)| *bytes == joined) {
                let id = tokens.len() as u32;
                tokens.push((joined, id));
            }
        }
        let merges = merges
            .iter()
            .map(|(l, r)| (l.as_bytes().to_vec(), r.as_bytes().to_vec()));
        BytePairModel::new(tokens, merges, ignore_merges).unwrap()
    }

    fn encode(model: &BytePairModel, text: &str) -> Vec<u32> {
        let mut out = Vec::new();
        model.encode(text.as_bytes(), &mut out, &mut Scratch::default(), None);
        let mut cache = PieceCache::default();
        for _ in 0..2 {
            let mut cached = Vec::new();
            model.encode(
                text.as_bytes(),
                &mut cached,
                &mut Scratch::default(),
                Some(&mut cache),
            );
            assert_eq!(cached, out);
        }
        out
    }

    fn both(model: &BytePairModel, piece: &[u8]) -> (Vec<u32>, Vec<u32>) {
        let (mut short, mut long) = (Vec::new(), Vec::new());
        let mut scratch = Scratch::default();
        model.merge_short(piece, &mut short, &mut scratch);
        model.merge_long(piece, &mut long, &mut scratch);
        (short, long)
    }

    #[test]
    fn merges_follow_the_list_not_the_text() {
        // "bc" is listed before "ab": "abc" becomes a + bc, then abc.
        let m = model(&[("b", "c"), ("a", "b"), ("a", "bc")], false);
        assert_eq!(encode(&m, "abc"), [258]);
        assert_eq!(encode(&m, "ab"), [257]);
        assert_eq!(encode(&m, "abd"), [257, u32::from(b'd')]);
    }

    #[test]
    fn ties_go_to_the_leftmost_pair() {
        let m = model(&[("a", "a")], false);
        assert_eq!(encode(&m, "aaa"), [256, u32::from(b'a')]);
        assert_eq!(encode(&m, "aaaa"), [256, 256]);
    }

    #[test]
    fn a_token_that_its_bytes_do_not_merge_into_is_split_without_ignore_merges() {
        // "ab" is only reachable through "a"+"b" ranked after "b"+"c"; "abc" is a token made
        // from "ab"+"c", but its own bytes merge as a + bc first, which has no merge with "a".
        let merges = [("b", "c"), ("a", "b"), ("ab", "c")];
        let strict = model(&merges, false);
        assert_eq!(encode(&strict, "abc"), [u32::from(b'a'), 256]);
        // Asked again, the worked-out answer is kept.
        assert_eq!(encode(&strict, "abc"), [u32::from(b'a'), 256]);
        let whole = model(&merges, true);
        assert_eq!(encode(&whole, "abc"), [258]);
    }

    #[test]
    fn a_pair_listed_twice_keeps_its_later_rank() {
        // ("a","b") at 0 and 2, ("b","c") at 1: the later rank loses to "bc".
        let m = model(&[("a", "b"), ("b", "c"), ("a", "b")], false);
        assert_eq!(encode(&m, "abc"), [u32::from(b'a'), 257]);
    }

    #[test]
    fn the_heap_merges_as_the_scan_does() {
        let m = model(
            &[
                ("a", "a"),
                ("aa", "a"),
                ("a", "b"),
                ("aa", "aa"),
                ("b", "a"),
                ("ab", "a"),
                ("aaaa", "aaaa"),
                ("ba", "b"),
                ("aaa", "b"),
            ],
            false,
        );
        // A small deterministic generator: every mix of "a" and "b" up to 12 bytes, and long
        // pseudo-random ones.
        for len in 2..=12 {
            for bits in 0..(1u32 << len) {
                let piece: Vec<u8> = (0..len)
                    .map(|i| if bits >> i & 1 == 1 { b'b' } else { b'a' })
                    .collect();
                let (short, long) = both(&m, &piece);
                assert_eq!(short, long, "{:?}", String::from_utf8_lossy(&piece));
            }
        }
        let mut state = 7u64;
        for len in [65, 100, 300, 1000] {
            let piece: Vec<u8> = (0..len)
                .map(|_| {
                    state = state.wrapping_mul(6364136223846793005).wrapping_add(1);
                    if state >> 60 < 11 {
                        b'a'
                    } else {
                        b'b'
                    }
                })
                .collect();
            let (short, long) = both(&m, &piece);
            assert_eq!(short, long);
            assert_eq!(encode(&m, std::str::from_utf8(&piece).unwrap()), long);
        }
        let spaces = vec![b'a'; 10_000];
        let (short, long) = both(&m, &spaces);
        assert_eq!(short, long);
        assert_eq!(long.len(), 10_000 / 8);
    }

    #[test]
    fn bad_vocabularies_say_why() {
        let missing = BytePairModel::new([(b"a".to_vec(), 0)], [], false);
        assert_eq!(missing.err().unwrap(), "byte 0x00 has no token of its own");
        let bytes = || (0..=255u8).map(|b| (vec![b], u32::from(b)));
        let unknown = BytePairModel::new(bytes(), [(b"a".to_vec(), b"b".to_vec())], false);
        assert_eq!(
            unknown.err().unwrap(),
            "merge 0 uses \"ab\", which is not a byte-level token"
        );
        let shared = BytePairModel::new(bytes().chain([(b"ab".to_vec(), 3)]), [], false);
        assert_eq!(
            shared.err().unwrap(),
            "its vocabulary gives several tokens one id"
        );
    }
}
