//! Chained block hashes over full blocks, as vLLM's prefix cache keys them.
//!
//! vLLM hashes block `i` as `hash(parent = hash of block i-1 (or NONE_HASH),
//! tokens of block i, extra keys)`, and only full blocks get a hash. A prompt
//! therefore hits exactly its longest cached block prefix: a block is found
//! only if every block before it matched too.
//!
//! vLLM uses sha256 (or xxhash). The simulator uses a 64-bit multiply-rotate
//! chain with a splitmix64 finish: about a nanosecond per token. With ~10^6
//! distinct blocks in a run, the chance of any 64-bit collision is about
//! n²/2⁶⁵ ≈ 3·10⁻⁸, so collisions are negligible (a collision would only
//! turn one miss into a spurious hit).

/// A block's key in the prefix cache.
pub type BlockHash = u64;

/// Parent of the first block (vLLM's `NONE_HASH`; there it is random per
/// process unless `PYTHONHASHSEED` is set, here a constant).
pub const NONE_HASH: BlockHash = 0x6b76_6761_7465_5f30;

const MUL: u64 = 0x9E37_79B9_7F4A_7C15;

/// The hash of one full block of `tokens` whose predecessor hashed to `parent`.
pub fn hash_block(parent: BlockHash, tokens: &[u32]) -> BlockHash {
    let mut h = parent ^ MUL;
    for &t in tokens {
        h = (h ^ u64::from(t)).wrapping_mul(MUL).rotate_left(29);
    }
    finish(h ^ tokens.len() as u64)
}

/// splitmix64's finaliser: every input bit reaches every output bit.
fn finish(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Appends to `hashes` the hashes of the full blocks of `tokens` not hashed
/// yet: `hashes` holds the chain of `tokens[..hashes.len() * block_size]`,
/// so a growing token stream is hashed incrementally, each block once.
pub fn extend_chain(hashes: &mut Vec<BlockHash>, tokens: &[u32], block_size: usize) {
    let full = tokens.len() / block_size;
    let mut parent = hashes.last().copied().unwrap_or(NONE_HASH);
    for i in hashes.len()..full {
        parent = hash_block(parent, &tokens[i * block_size..(i + 1) * block_size]);
        hashes.push(parent);
    }
}

/// The hashes of every full block of `tokens`.
pub fn chain(tokens: &[u32], block_size: usize) -> Vec<BlockHash> {
    let mut hashes = Vec::with_capacity(tokens.len() / block_size);
    extend_chain(&mut hashes, tokens, block_size);
    hashes
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tokens(n: u32, salt: u32) -> Vec<u32> {
        (0..n)
            .map(|i| i.wrapping_mul(2_654_435_761) ^ salt)
            .collect()
    }

    #[test]
    fn only_full_blocks_are_hashed() {
        assert_eq!(chain(&tokens(15, 0), 16).len(), 0);
        assert_eq!(chain(&tokens(16, 0), 16).len(), 1);
        assert_eq!(chain(&tokens(47, 0), 16).len(), 2);
    }

    #[test]
    fn a_block_hash_depends_on_its_tokens_and_its_parent() {
        let t = tokens(16, 1);
        assert_eq!(hash_block(NONE_HASH, &t), hash_block(NONE_HASH, &t));
        assert_ne!(hash_block(NONE_HASH, &t), hash_block(NONE_HASH ^ 1, &t));
        let mut u = t.clone();
        u[7] += 1;
        assert_ne!(hash_block(NONE_HASH, &t), hash_block(NONE_HASH, &u));
    }

    #[test]
    fn a_change_only_affects_its_block_and_every_later_one() {
        let a = tokens(16 * 6, 3);
        let mut b = a.clone();
        b[16 * 3 + 5] ^= 0xFFFF; // inside block 3
        let (ha, hb) = (chain(&a, 16), chain(&b, 16));
        assert_eq!(ha[..3], hb[..3]);
        for i in 3..6 {
            assert_ne!(ha[i], hb[i], "block {i}");
        }
    }

    #[test]
    fn the_same_block_after_different_prefixes_hashes_differently() {
        // Shared content at the same position but a different history is a miss,
        // as in vLLM: the cache is keyed by the whole prefix, not the block.
        let shared = tokens(16, 9);
        let mut a = tokens(16, 1);
        let mut b = tokens(16, 2);
        a.extend_from_slice(&shared);
        b.extend_from_slice(&shared);
        assert_ne!(chain(&a, 16)[1], chain(&b, 16)[1]);
    }

    #[test]
    fn incremental_hashing_equals_hashing_at_once() {
        let t = tokens(16 * 10 + 3, 5);
        let mut inc = Vec::new();
        for end in [5, 16, 40, 100, t.len()] {
            extend_chain(&mut inc, &t[..end], 16);
            assert_eq!(inc, chain(&t[..end], 16));
        }
    }

    #[test]
    fn no_collisions_among_many_distinct_blocks() {
        let mut seen = std::collections::HashSet::new();
        let t = tokens(16 * 50_000, 11);
        for h in chain(&t, 16) {
            assert!(seen.insert(h));
        }
    }
}
