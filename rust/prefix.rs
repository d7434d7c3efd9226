//! Common-prefix length of two token sequences: the test every drift decision starts from.

/// Tokens skipped per step while the sequences agree: slice equality of a block is a
/// `memcmp`, the fastest way over long equal prefixes.
const BLOCK: usize = 256;

/// Tokens compared per step inside the block that differs. Sixteen u32 fill a 512-bit
/// register; the compiler turns the xor-or reduction into a few vector instructions.
const CHUNK: usize = 16;

/// Length of the longest common prefix of `a` and `b`.
pub fn common_prefix_len(a: &[u32], b: &[u32]) -> usize {
    let n = a.len().min(b.len());
    let mut start = 0;
    while start + BLOCK <= n && a[start..start + BLOCK] == b[start..start + BLOCK] {
        start += BLOCK;
    }
    let (a, b) = (&a[start..n], &b[start..n]);
    let mut equal = 0;
    for (x, y) in a.chunks_exact(CHUNK).zip(b.chunks_exact(CHUNK)) {
        if x.iter().zip(y).fold(0, |acc, (p, q)| acc | (p ^ q)) != 0 {
            break;
        }
        equal += CHUNK;
    }
    start
        + equal
        + a[equal..]
            .iter()
            .zip(&b[equal..])
            .take_while(|(x, y)| x == y)
            .count()
}

/// Bytes skipped per step while two byte strings agree (one `memcmp` each), then the
/// smaller step inside the block that differs.
const BYTE_BLOCKS: [usize; 2] = [4096, 64];

/// Length of the longest common prefix of two byte strings.
pub fn common_prefix_bytes(a: &[u8], b: &[u8]) -> usize {
    let n = a.len().min(b.len());
    let mut start = 0;
    for block in BYTE_BLOCKS {
        while start + block <= n && a[start..start + block] == b[start..start + block] {
            start += block;
        }
    }
    start
        + a[start..n]
            .iter()
            .zip(&b[start..n])
            .take_while(|(x, y)| x == y)
            .count()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_prefix_agrees_with_a_byte_by_byte_count_across_the_block_sizes() {
        let a: Vec<u8> = (0..10_000u32).map(|i| (i * 7 % 251) as u8).collect();
        for cut in [0, 1, 63, 64, 65, 4095, 4096, 4097, 4160, 9_999] {
            let mut b = a.clone();
            b[cut] ^= 1;
            let naive = a.iter().zip(&b).take_while(|(x, y)| x == y).count();
            assert_eq!(common_prefix_bytes(&a, &b), naive);
            assert_eq!(common_prefix_bytes(&a[..cut], &b), cut);
        }
        assert_eq!(common_prefix_bytes(&a, &a), a.len());
        assert_eq!(common_prefix_bytes(b"", &a), 0);
    }

    fn naive(a: &[u32], b: &[u32]) -> usize {
        a.iter().zip(b).take_while(|(x, y)| x == y).count()
    }

    #[test]
    fn empty_and_identical() {
        assert_eq!(common_prefix_len(&[], &[]), 0);
        assert_eq!(common_prefix_len(&[1, 2], &[]), 0);
        assert_eq!(common_prefix_len(&[], &[1, 2]), 0);
        let long: Vec<u32> = (0..100).collect();
        assert_eq!(common_prefix_len(&long, &long), 100);
    }

    #[test]
    fn one_is_a_prefix_of_the_other() {
        let long: Vec<u32> = (0..37).collect();
        assert_eq!(common_prefix_len(&long, &long[..20]), 20);
        assert_eq!(common_prefix_len(&long[..16], &long), 16);
    }

    #[test]
    fn mismatch_at_every_position_of_lengths_around_the_chunk() {
        for len in [1, 7, 15, 16, 17, 31, 32, 33, 50, 64, 65] {
            let a: Vec<u32> = (0..len as u32).collect();
            for at in 0..len {
                let mut b = a.clone();
                b[at] = u32::MAX;
                assert_eq!(common_prefix_len(&a, &b), at, "len {len}, mismatch at {at}");
                assert_eq!(common_prefix_len(&a, &b), naive(&a, &b));
            }
        }
    }

    #[test]
    fn only_the_first_mismatch_counts() {
        let a = [5u32; 40];
        let mut b = a;
        b[3] = 0;
        b[20] = 0;
        assert_eq!(common_prefix_len(&a, &b), 3);
    }
}
