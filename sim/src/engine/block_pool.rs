//! vLLM's `BlockPool`: KV blocks, the LRU free queue and the prefix-cache map.
//!
//! Mirrors `vllm/v1/core/block_pool.py` and `FreeKVCacheBlockQueue`
//! (`kv_cache_utils.py`):
//! - the free queue is a doubly linked list that starts in block-id order;
//!   block 0 is taken out at start as the *null block* and never freed;
//! - allocation pops the head; if the popped block still has a hash, the
//!   hash is dropped from the cache map (the block is *evicted*);
//! - freeing appends blocks whose reference count reaches zero to the tail,
//!   *keeping their hash*: a freed block is still a cache hit until it is
//!   popped again;
//! - a hit on a free block ("touch") takes it out of the queue in O(1);
//! - duplicate blocks (the same hash computed twice) are not merged; a
//!   lookup returns the first one cached;
//! - `usage = 1 - free / (total - 1)`: cached blocks nobody references
//!   count as free, which is why usage cannot see an idle session's prefix.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

use super::hashing::BlockHash;

/// Index of a block in the pool.
pub type BlockId = u32;

const NIL: u32 = u32::MAX;

#[derive(Debug, Clone)]
struct Block {
    ref_cnt: u32,
    hash: Option<BlockHash>,
    in_queue: bool,
    prev: u32,
    next: u32,
}

/// Hashes a [`BlockHash`] to itself: block hashes are already mixed (a
/// splitmix64 finish, see `hashing`), so hashing them again is wasted work
/// on the simulator's hottest map.
#[derive(Debug, Default)]
struct BlockHashHasher(u64);

impl Hasher for BlockHashHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        // Only u64 keys are hashed here; fold anything else in, just in case.
        for &b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(b);
        }
    }
    fn write_u64(&mut self, v: u64) {
        self.0 = v;
    }
}

/// Blocks cached under one hash, first cached first (vLLM keeps a dict).
#[derive(Debug, Clone)]
enum Cached {
    One(BlockId),
    Many(Vec<BlockId>),
}

/// A replica's KV-cache blocks.
#[derive(Debug)]
pub struct BlockPool {
    blocks: Vec<Block>,
    head: u32,
    tail: u32,
    num_free: usize,
    cached: HashMap<BlockHash, Cached, BuildHasherDefault<BlockHashHasher>>,
    evictions: u64,
}

impl BlockPool {
    /// A pool of `num_blocks` blocks (block 0 becomes the null block).
    pub fn new(num_blocks: usize) -> Self {
        assert!(
            num_blocks >= 2 && num_blocks < NIL as usize,
            "pool size out of range"
        );
        let blocks = (0..num_blocks as u32)
            .map(|i| Block {
                ref_cnt: 0,
                hash: None,
                in_queue: true,
                prev: if i == 0 { NIL } else { i - 1 },
                next: if i + 1 == num_blocks as u32 {
                    NIL
                } else {
                    i + 1
                },
            })
            .collect();
        let mut pool = Self {
            blocks,
            head: 0,
            tail: num_blocks as u32 - 1,
            num_free: num_blocks,
            cached: HashMap::default(),
            evictions: 0,
        };
        let null = pool.pop_head();
        debug_assert_eq!(null, 0);
        pool
    }

    /// All blocks, the null block included.
    pub fn num_blocks(&self) -> usize {
        self.blocks.len()
    }

    /// Blocks in the free queue (cached-but-unreferenced ones included).
    pub fn num_free(&self) -> usize {
        self.num_free
    }

    /// vLLM's `get_usage`: `1 - free / (total - 1)`.
    pub fn usage(&self) -> f64 {
        1.0 - self.num_free as f64 / (self.blocks.len() - 1) as f64
    }

    /// Cached blocks evicted by allocation so far.
    pub fn evictions(&self) -> u64 {
        self.evictions
    }

    /// Number of hashes in the cache map.
    pub fn num_cached_hashes(&self) -> usize {
        self.cached.len()
    }

    /// The first block cached under `hash`, if any. Read-only.
    pub fn get_cached(&self, hash: BlockHash) -> Option<BlockId> {
        self.cached.get(&hash).map(|c| match c {
            Cached::One(id) => *id,
            Cached::Many(ids) => ids[0],
        })
    }

    /// References held on `id`.
    pub fn ref_cnt(&self, id: BlockId) -> u32 {
        self.blocks[id as usize].ref_cnt
    }

    /// The hash `id` is cached under, if any.
    pub fn hash_of(&self, id: BlockId) -> Option<BlockHash> {
        self.blocks[id as usize].hash
    }

    /// Pops `n` blocks from the head of the free queue (evicting their cached
    /// hashes) with one reference each, appending them to `out`.
    ///
    /// Panics if fewer than `n` blocks are free: callers check first, as
    /// vLLM's `allocate_slots` does.
    pub fn allocate(&mut self, n: usize, out: &mut Vec<BlockId>) {
        assert!(
            n <= self.num_free,
            "allocating {n} of {} free",
            self.num_free
        );
        for _ in 0..n {
            let id = self.pop_head();
            self.evict_hash(id);
            let b = &mut self.blocks[id as usize];
            debug_assert_eq!(b.ref_cnt, 0);
            b.ref_cnt = 1;
            out.push(id);
        }
    }

    /// Takes a reference on each block; a free one leaves the queue.
    pub fn touch(&mut self, ids: &[BlockId]) {
        for &id in ids {
            if self.blocks[id as usize].ref_cnt == 0 {
                self.unlink(id);
            }
            self.blocks[id as usize].ref_cnt += 1;
        }
    }

    /// Drops a reference on each block, in eviction order: a block reaching
    /// zero goes to the tail of the free queue (keeping its hash), so the
    /// first block given is evicted first.
    pub fn free(&mut self, ids_in_eviction_order: impl IntoIterator<Item = BlockId>) {
        for id in ids_in_eviction_order {
            debug_assert_ne!(id, 0, "the null block is never freed");
            let b = &mut self.blocks[id as usize];
            assert!(b.ref_cnt > 0, "double free of block {id}");
            b.ref_cnt -= 1;
            if b.ref_cnt == 0 {
                self.push_tail(id);
            }
        }
    }

    /// Records that `id` now holds the full block hashed `hash`.
    pub fn cache(&mut self, id: BlockId, hash: BlockHash) {
        let b = &mut self.blocks[id as usize];
        debug_assert!(b.hash.is_none(), "block {id} is already cached");
        b.hash = Some(hash);
        self.cached
            .entry(hash)
            .and_modify(|c| match c {
                Cached::One(first) => *c = Cached::Many(vec![*first, id]),
                Cached::Many(ids) => ids.push(id),
            })
            .or_insert(Cached::One(id));
    }

    /// The free queue from head (next evicted) to tail.
    pub fn free_queue(&self) -> Vec<BlockId> {
        let mut out = Vec::with_capacity(self.num_free);
        let mut at = self.head;
        while at != NIL {
            out.push(at);
            at = self.blocks[at as usize].next;
        }
        out
    }

    fn evict_hash(&mut self, id: BlockId) {
        let Some(hash) = self.blocks[id as usize].hash.take() else {
            return;
        };
        self.evictions += 1;
        // One lookup: the entry is removed, or narrowed, in place.
        let std::collections::hash_map::Entry::Occupied(mut entry) = self.cached.entry(hash) else {
            unreachable!("a hashed block is in the cache map");
        };
        match entry.get_mut() {
            Cached::One(only) => {
                debug_assert_eq!(*only, id);
                entry.remove();
            }
            Cached::Many(ids) => {
                ids.retain(|&b| b != id);
                if let [last] = ids[..] {
                    entry.insert(Cached::One(last));
                }
            }
        }
    }

    fn pop_head(&mut self) -> BlockId {
        let id = self.head;
        assert_ne!(id, NIL, "free queue is empty");
        self.unlink(id);
        id
    }

    fn unlink(&mut self, id: BlockId) {
        let (prev, next) = {
            let b = &mut self.blocks[id as usize];
            debug_assert!(b.in_queue, "block {id} is not in the free queue");
            b.in_queue = false;
            (
                std::mem::replace(&mut b.prev, NIL),
                std::mem::replace(&mut b.next, NIL),
            )
        };
        if prev == NIL {
            self.head = next;
        } else {
            self.blocks[prev as usize].next = next;
        }
        if next == NIL {
            self.tail = prev;
        } else {
            self.blocks[next as usize].prev = prev;
        }
        self.num_free -= 1;
    }

    fn push_tail(&mut self, id: BlockId) {
        let tail = self.tail;
        {
            let b = &mut self.blocks[id as usize];
            debug_assert!(!b.in_queue);
            b.in_queue = true;
            b.prev = tail;
            b.next = NIL;
        }
        if tail == NIL {
            self.head = id;
        } else {
            self.blocks[tail as usize].next = id;
        }
        self.tail = id;
        self.num_free += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn alloc(pool: &mut BlockPool, n: usize) -> Vec<BlockId> {
        let mut v = Vec::new();
        pool.allocate(n, &mut v);
        v
    }

    #[test]
    fn the_null_block_is_taken_out_and_usage_excludes_it() {
        let pool = BlockPool::new(11);
        assert_eq!(pool.num_free(), 10);
        assert_eq!(pool.free_queue(), (1..=10).collect::<Vec<_>>());
        assert_eq!(pool.usage(), 0.0);
    }

    #[test]
    fn usage_counts_cached_but_unreferenced_blocks_as_free() {
        let mut pool = BlockPool::new(11);
        let blocks = alloc(&mut pool, 4);
        assert!((pool.usage() - 0.4).abs() < 1e-12);
        for (i, &b) in blocks.iter().enumerate() {
            pool.cache(b, 100 + i as u64);
        }
        pool.free(blocks.iter().rev().copied());
        // Still cached, yet usage is back to zero: vLLM's blind spot.
        assert_eq!(pool.usage(), 0.0);
        assert_eq!(pool.get_cached(100), Some(blocks[0]));
        assert_eq!(pool.num_cached_hashes(), 4);
    }

    #[test]
    fn allocation_pops_the_head_in_id_order() {
        let mut pool = BlockPool::new(8);
        assert_eq!(alloc(&mut pool, 3), vec![1, 2, 3]);
        assert_eq!(pool.free_queue(), vec![4, 5, 6, 7]);
    }

    #[test]
    fn freed_blocks_go_to_the_tail_and_a_reversed_request_loses_its_tail_first() {
        let mut pool = BlockPool::new(8);
        let req = alloc(&mut pool, 3); // [1, 2, 3]
        for (i, &b) in req.iter().enumerate() {
            pool.cache(b, 10 + i as u64);
        }
        // vLLM frees a request's blocks in reverse: tail block evicted first.
        pool.free(req.iter().rev().copied());
        assert_eq!(pool.free_queue(), vec![4, 5, 6, 7, 3, 2, 1]);
        // The never-used blocks go first, then the request's last block.
        assert_eq!(alloc(&mut pool, 5), vec![4, 5, 6, 7, 3]);
        assert_eq!(pool.get_cached(12), None, "block 3 was evicted");
        assert_eq!(pool.get_cached(11), Some(2), "its head survives");
        assert_eq!(pool.get_cached(10), Some(1));
        assert_eq!(pool.evictions(), 1);
    }

    #[test]
    fn a_hit_on_a_free_block_takes_it_out_of_the_queue() {
        let mut pool = BlockPool::new(6);
        let req = alloc(&mut pool, 2);
        pool.cache(req[0], 7);
        pool.free(req.iter().rev().copied());
        assert_eq!(pool.free_queue(), vec![3, 4, 5, 2, 1]);
        pool.touch(&[1]);
        assert_eq!(pool.ref_cnt(1), 1);
        assert_eq!(pool.free_queue(), vec![3, 4, 5, 2]);
        // A second reader only adds a reference.
        pool.touch(&[1]);
        assert_eq!(pool.ref_cnt(1), 2);
        pool.free([1]);
        assert_eq!(pool.free_queue(), vec![3, 4, 5, 2], "still referenced once");
        pool.free([1]);
        assert_eq!(pool.free_queue(), vec![3, 4, 5, 2, 1]);
        assert_eq!(pool.get_cached(7), Some(1));
    }

    #[test]
    fn duplicate_blocks_are_kept_and_the_first_is_found() {
        let mut pool = BlockPool::new(6);
        let a = alloc(&mut pool, 1)[0];
        let b = alloc(&mut pool, 1)[0];
        pool.cache(a, 42);
        pool.cache(b, 42);
        assert_eq!(pool.get_cached(42), Some(a));
        pool.free([a]);
        pool.free([b]);
        // Evict `a` by allocating past the unused blocks.
        let got = alloc(&mut pool, 4);
        assert_eq!(got, vec![3, 4, 5, a]);
        assert_eq!(pool.get_cached(42), Some(b), "the duplicate survives");
        alloc(&mut pool, 1);
        assert_eq!(pool.get_cached(42), None);
    }

    #[test]
    #[should_panic(expected = "allocating")]
    fn over_allocation_panics() {
        let mut pool = BlockPool::new(3);
        alloc(&mut pool, 3);
    }
}
