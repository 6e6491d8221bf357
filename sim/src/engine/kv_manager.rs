//! vLLM's `KVCacheManager` for one full-attention group: prefix lookup,
//! slot allocation and freeing, on top of the [`BlockPool`].
//!
//! - `find_longest_cache_hit` walks the request's block hashes left to right
//!   and stops at the first miss; `get_computed_blocks` caps the hit at
//!   `num_tokens - 1` tokens (the last token must be recomputed to get
//!   logits), so a fully resident prompt still recomputes 1..=block_size tokens.
//! - `allocate_slots` counts hit blocks nobody references as blocks to take
//!   from the free queue, refuses (changing nothing) if the pool is short,
//!   then touches the hits, pops new blocks, and caches every block that is
//!   full once the scheduled tokens are computed, so requests scheduled in
//!   the same step already share them.
//! - `free` releases a request's blocks in reverse order, so its tail is
//!   evicted before its head.

use super::block_pool::{BlockId, BlockPool};
use super::hashing::BlockHash;

/// One request's block table.
#[derive(Debug, Default, Clone)]
pub struct BlockTable {
    blocks: Vec<BlockId>,
    /// Leading blocks already in the cache map.
    num_cached: usize,
}

impl BlockTable {
    /// The blocks, in token order.
    pub fn blocks(&self) -> &[BlockId] {
        &self.blocks
    }

    /// Takes the blocks out (for pinning), leaving the table empty.
    pub fn take(&mut self) -> Vec<BlockId> {
        self.num_cached = 0;
        std::mem::take(&mut self.blocks)
    }
}

/// A replica's KV cache: the pool and its block size.
#[derive(Debug)]
pub struct KvCacheManager {
    pool: BlockPool,
    block_size: usize,
}

impl KvCacheManager {
    /// A cache of `num_blocks` blocks of `block_size` tokens.
    pub fn new(num_blocks: usize, block_size: usize) -> Self {
        assert!(block_size > 0);
        Self {
            pool: BlockPool::new(num_blocks),
            block_size,
        }
    }

    /// Tokens per block.
    pub fn block_size(&self) -> usize {
        self.block_size
    }

    /// The pool (read-only).
    pub fn pool(&self) -> &BlockPool {
        &self.pool
    }

    /// vLLM's usage figure.
    pub fn usage(&self) -> f64 {
        self.pool.usage()
    }

    /// The longest run of cached blocks at the start of `hashes`, covering at
    /// most `max_tokens` tokens. Read-only: no LRU touch, no statistics.
    pub fn find_longest_cache_hit(
        &self,
        hashes: &[BlockHash],
        max_tokens: usize,
        out: &mut Vec<BlockId>,
    ) {
        out.clear();
        let limit = (max_tokens / self.block_size).min(hashes.len());
        for &h in &hashes[..limit] {
            match self.pool.get_cached(h) {
                Some(id) => out.push(id),
                None => break,
            }
        }
    }

    /// Tokens of a `num_tokens`-token sequence (full-block chain `hashes`)
    /// that would hit the cache now: vLLM's `get_computed_blocks`, capped at
    /// `num_tokens - 1`. Read-only.
    pub fn hit_tokens(&self, hashes: &[BlockHash], num_tokens: usize) -> usize {
        let limit = (num_tokens.saturating_sub(1) / self.block_size).min(hashes.len());
        hashes[..limit]
            .iter()
            .take_while(|&&h| self.pool.get_cached(h).is_some())
            .count()
            * self.block_size
    }

    /// Allocates slots for `num_new_tokens` more tokens of a request with
    /// `num_computed` tokens computed so far plus the prefix hits `hits`
    /// (only non-empty when the request is scheduled from waiting).
    /// `hashes` covers the request's full blocks; `num_tokens` is its known
    /// length (prompt + outputs so far). Returns `None`, changing nothing,
    /// if the free queue is short, else the blocks (by index in the table)
    /// that it made full and cached.
    pub fn allocate_slots(
        &mut self,
        table: &mut BlockTable,
        num_computed: usize,
        hits: &[BlockId],
        num_new_tokens: usize,
        hashes: &[BlockHash],
        num_tokens: usize,
    ) -> Option<std::ops::Range<usize>> {
        let bs = self.block_size;
        let computed = num_computed + hits.len() * bs;
        let required = (computed + num_new_tokens).div_ceil(bs);
        let new_blocks = required.saturating_sub(table.blocks.len() + hits.len());
        let evictable_hits = hits.iter().filter(|&&b| self.pool.ref_cnt(b) == 0).count();
        if new_blocks + evictable_hits > self.pool.num_free() {
            return None;
        }
        if !hits.is_empty() {
            debug_assert!(table.blocks.is_empty(), "hits only extend an empty table");
            self.pool.touch(hits);
            table.blocks.extend_from_slice(hits);
            table.num_cached = hits.len();
        }
        self.pool.allocate(new_blocks, &mut table.blocks);
        let full = (computed + num_new_tokens).min(num_tokens) / bs;
        for (&block, &hash) in table.blocks[..full]
            .iter()
            .zip(hashes)
            .skip(table.num_cached)
        {
            self.pool.cache(block, hash);
        }
        let newly = table.num_cached..full.max(table.num_cached);
        table.num_cached = table.num_cached.max(full);
        Some(newly)
    }

    /// Frees a request's blocks, last block first.
    pub fn free(&mut self, table: &mut BlockTable) {
        let blocks = table.take();
        self.pool.free(blocks.into_iter().rev());
    }

    /// Frees blocks taken out of a table (a pin), last block first.
    pub fn free_blocks(&mut self, blocks: Vec<BlockId>) {
        self.pool.free(blocks.into_iter().rev());
    }
}

#[cfg(test)]
mod tests {
    use super::super::hashing::chain;
    use super::*;

    fn seq(n: usize, salt: u32) -> Vec<u32> {
        (0..n as u32).map(|i| i ^ (salt << 20)).collect()
    }

    /// Runs a request of `tokens` to completion of its prefill and frees it.
    fn prefill_and_free(kv: &mut KvCacheManager, tokens: &[u32]) -> Vec<BlockId> {
        let hashes = chain(tokens, kv.block_size());
        let mut table = BlockTable::default();
        assert!(kv
            .allocate_slots(&mut table, 0, &[], tokens.len(), &hashes, tokens.len())
            .is_some());
        let blocks = table.blocks().to_vec();
        kv.free(&mut table);
        blocks
    }

    #[test]
    fn a_fully_cached_prompt_still_recomputes_its_last_block() {
        let mut kv = KvCacheManager::new(64, 16);
        let p = seq(64, 1); // exactly 4 full blocks
        prefill_and_free(&mut kv, &p);
        let hashes = chain(&p, 16);
        // Capped at 63 tokens: only 3 whole blocks may hit.
        assert_eq!(kv.hit_tokens(&hashes, 64), 48);
        // One token more and all four blocks hit.
        let mut longer = p.clone();
        longer.push(9);
        assert_eq!(kv.hit_tokens(&chain(&longer, 16), 65), 64);
    }

    #[test]
    fn the_hit_stops_at_the_first_missing_block() {
        let mut kv = KvCacheManager::new(64, 16);
        let p = seq(16 * 5, 2);
        prefill_and_free(&mut kv, &p);
        let mut q = p.clone();
        q[16 * 2 + 1] ^= 1; // block 2 differs, so 3 and 4 differ too
        q.extend(seq(10, 3));
        assert_eq!(kv.hit_tokens(&chain(&q, 16), q.len()), 32);
        // An unrelated prompt misses entirely.
        let r = seq(100, 4);
        assert_eq!(kv.hit_tokens(&chain(&r, 16), r.len()), 0);
    }

    #[test]
    fn lookups_do_not_touch_lru_order() {
        let mut kv = KvCacheManager::new(16, 4);
        let p = seq(12, 5);
        prefill_and_free(&mut kv, &p);
        let before = kv.pool().free_queue();
        let mut out = Vec::new();
        kv.find_longest_cache_hit(&chain(&p, 4), 11, &mut out);
        assert_eq!(out.len(), 2);
        assert_eq!(kv.hit_tokens(&chain(&p, 4), 12), 8);
        assert_eq!(kv.pool().free_queue(), before);
    }

    #[test]
    fn hits_on_free_blocks_count_against_the_free_queue() {
        // 9 usable blocks of 4 tokens. A 32-token prompt fills 8 and is freed.
        let mut kv = KvCacheManager::new(10, 4);
        let p = seq(32, 6);
        prefill_and_free(&mut kv, &p);
        let mut q = p.clone();
        q.extend(seq(8, 7)); // 40 tokens: 10 blocks, one more than the pool
        let hashes = chain(&q, 4);
        let mut hits = Vec::new();
        kv.find_longest_cache_hit(&hashes, q.len() - 1, &mut hits);
        assert_eq!(hits.len(), 8);
        let mut table = BlockTable::default();
        // 8 evictable hits + 2 new blocks > 9 free: refused, nothing changed.
        let queue = kv.pool().free_queue();
        assert!(kv
            .allocate_slots(&mut table, 0, &hits, 8, &hashes, q.len())
            .is_none());
        assert!(table.blocks().is_empty());
        assert_eq!(kv.pool().free_queue(), queue);
        // A chunk of 4 fits: 8 hits + 1 new block.
        assert_eq!(
            kv.allocate_slots(&mut table, 0, &hits, 4, &hashes, q.len()),
            Some(8..9)
        );
        assert_eq!(table.blocks().len(), 9);
        assert_eq!(kv.pool().num_free(), 0);
        assert_eq!(kv.usage(), 1.0);
    }

    #[test]
    fn blocks_are_cached_as_soon_as_they_are_scheduled_full() {
        let mut kv = KvCacheManager::new(32, 4);
        let p = seq(10, 8);
        let hashes = chain(&p, 4);
        let mut table = BlockTable::default();
        // First chunk of 6 tokens: block 0 full, block 1 half.
        assert_eq!(
            kv.allocate_slots(&mut table, 0, &[], 6, &hashes, 10),
            Some(0..1)
        );
        assert_eq!(kv.hit_tokens(&hashes, 10), 4);
        assert_eq!(
            kv.allocate_slots(&mut table, 6, &[], 4, &hashes, 10),
            Some(1..2)
        );
        assert_eq!(table.blocks().len(), 3);
        assert_eq!(kv.hit_tokens(&hashes, 10), 8);
        // The partial third block is never cached.
        assert_eq!(kv.pool().hash_of(table.blocks()[2]), None);
    }

    #[test]
    fn freeing_puts_a_request_tail_first_in_the_queue() {
        let mut kv = KvCacheManager::new(8, 4);
        let blocks = prefill_and_free(&mut kv, &seq(10, 9)); // blocks 1, 2, 3
        assert_eq!(blocks, vec![1, 2, 3]);
        assert_eq!(kv.pool().free_queue(), vec![4, 5, 6, 7, 3, 2, 1]);
    }
}
