//! A replica's host tier of KV: vLLM's native CPU offloading
//! (`--kv-offloading-size`, the `OffloadingConnector` with its LRU policy).
//!
//! - **Write-through**: each block the engine computes full is stored in
//!   the tier as well (the connector offers every new full block of a
//!   scheduled request for storing); a block already there is not stored
//!   again.
//! - **LRU**: storing takes room from the least recently used block. A
//!   request's blocks are touched when it finishes, head to tail (the
//!   connector applies one request's accesses at its end, in prefix order),
//!   so within a session the head is older than the tail.
//! - **Lookups do not touch**; a lookup continues the GPU hit: the longest
//!   run of tier blocks right after the blocks found in GPU memory.
//! - **Reloads** copy a hit back into GPU blocks; the scheduler charges
//!   their copy time to the step ([`TierConfig::reload_ns`]) and no
//!   compute. vLLM loads asynchronously, between steps, so charging the
//!   step is the pessimistic side: a reload delays the whole batch.

use rustc_hash::FxHashMap;

use super::hashing::BlockHash;

/// A replica's host tier: its size and copy rate.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TierConfig {
    /// Blocks the tier holds (of the engine's block size).
    pub blocks: usize,
    /// Tokens of KV per second copied from the tier into GPU memory.
    pub reload_tokens_per_sec: f64,
}

impl TierConfig {
    /// A tier of `tokens` tokens (rounded down to blocks of `block_size`)
    /// copying `gb_per_s` GB/s of KV at `kv_bytes_per_token` bytes a token.
    pub fn from_bandwidth(
        tokens: usize,
        block_size: usize,
        gb_per_s: f64,
        kv_bytes_per_token: f64,
    ) -> Self {
        Self {
            blocks: tokens / block_size.max(1),
            reload_tokens_per_sec: gb_per_s * 1e9 / kv_bytes_per_token,
        }
    }

    /// How long copying `tokens` tokens back takes, ns.
    pub fn reload_ns(&self, tokens: usize) -> u64 {
        (tokens as f64 / self.reload_tokens_per_sec * 1e9).round() as u64
    }

    /// Refuses a tier the model cannot run.
    pub fn validate(&self, gpu_blocks: usize) -> Result<(), String> {
        if self.blocks < gpu_blocks {
            return Err(format!(
                "the host tier ({} blocks) is smaller than the GPU cache ({gpu_blocks} blocks): with write-through it holds a copy of every GPU block",
                self.blocks
            ));
        }
        if !(self.reload_tokens_per_sec.is_finite() && self.reload_tokens_per_sec > 0.0) {
            return Err(format!(
                "the host tier's reload rate must be finite and > 0, not {}",
                self.reload_tokens_per_sec
            ));
        }
        Ok(())
    }
}

const NIL: u32 = u32::MAX;

#[derive(Debug, Clone, Copy)]
struct Entry {
    hash: BlockHash,
    prev: u32,
    next: u32,
}

/// The tier's blocks in LRU order (an intrusive list over a slab, with a
/// map from hash to slot: the tier sees as many blocks as the GPU pool).
#[derive(Debug)]
pub struct HostTier {
    cfg: TierConfig,
    entries: Vec<Entry>,
    free: Vec<u32>,
    index: FxHashMap<BlockHash, u32>,
    /// Least recently used.
    head: u32,
    /// Most recently used.
    tail: u32,
    evictions: u64,
}

impl HostTier {
    /// An empty tier.
    pub fn new(cfg: TierConfig) -> Self {
        assert!(cfg.blocks > 0, "an empty host tier");
        Self {
            cfg,
            entries: Vec::new(),
            free: Vec::new(),
            index: FxHashMap::default(),
            head: NIL,
            tail: NIL,
            evictions: 0,
        }
    }

    /// The tier's size and rate.
    pub fn config(&self) -> TierConfig {
        self.cfg
    }

    /// Blocks held.
    pub fn len(&self) -> usize {
        self.index.len()
    }

    /// Whether it holds nothing.
    pub fn is_empty(&self) -> bool {
        self.index.is_empty()
    }

    /// Blocks evicted so far.
    pub fn evictions(&self) -> u64 {
        self.evictions
    }

    /// Whether the tier holds `hash`. Read-only.
    pub fn contains(&self, hash: BlockHash) -> bool {
        self.index.contains_key(&hash)
    }

    /// How many of `hashes`, from the first, the tier holds in a row.
    pub fn run_length(&self, hashes: &[BlockHash]) -> usize {
        hashes.iter().take_while(|&&h| self.contains(h)).count()
    }

    /// Stores blocks the engine computed full (a block held already stays
    /// where it is in the LRU order).
    pub fn store(&mut self, hashes: &[BlockHash]) {
        for &h in hashes {
            if !self.index.contains_key(&h) {
                self.insert(h);
            }
        }
    }

    /// Marks `hashes` most recently used, in order (the last one ends
    /// most recent).
    pub fn touch(&mut self, hashes: &[BlockHash]) {
        for &h in hashes {
            if let Some(&i) = self.index.get(&h) {
                self.unlink(i);
                self.push_tail(i);
            }
        }
    }

    fn insert(&mut self, hash: BlockHash) {
        if self.index.len() == self.cfg.blocks {
            let lru = self.head;
            self.unlink(lru);
            self.index.remove(&self.entries[lru as usize].hash);
            self.free.push(lru);
            self.evictions += 1;
        }
        let e = Entry {
            hash,
            prev: NIL,
            next: NIL,
        };
        let i = match self.free.pop() {
            Some(i) => {
                self.entries[i as usize] = e;
                i
            }
            None => {
                self.entries.push(e);
                (self.entries.len() - 1) as u32
            }
        };
        self.index.insert(hash, i);
        self.push_tail(i);
    }

    fn unlink(&mut self, i: u32) {
        let Entry { prev, next, .. } = self.entries[i as usize];
        if prev == NIL {
            self.head = next;
        } else {
            self.entries[prev as usize].next = next;
        }
        if next == NIL {
            self.tail = prev;
        } else {
            self.entries[next as usize].prev = prev;
        }
    }

    fn push_tail(&mut self, i: u32) {
        let e = &mut self.entries[i as usize];
        e.prev = self.tail;
        e.next = NIL;
        if self.tail == NIL {
            self.head = i;
        } else {
            self.entries[self.tail as usize].next = i;
        }
        self.tail = i;
    }

    /// Hashes from least to most recently used (tests).
    #[cfg(test)]
    fn order(&self) -> Vec<BlockHash> {
        let mut out = Vec::new();
        let mut i = self.head;
        while i != NIL {
            out.push(self.entries[i as usize].hash);
            i = self.entries[i as usize].next;
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tier(blocks: usize) -> HostTier {
        HostTier::new(TierConfig {
            blocks,
            reload_tokens_per_sec: 1e6,
        })
    }

    #[test]
    fn storing_past_the_size_evicts_the_least_recently_used() {
        let mut t = tier(3);
        t.store(&[1, 2, 3]);
        t.store(&[2]); // held already: stays where it is
        assert_eq!(t.order(), vec![1, 2, 3]);
        t.store(&[4]);
        assert_eq!(t.order(), vec![2, 3, 4]);
        assert_eq!((t.evictions(), t.len()), (1, 3));
        assert!(!t.contains(1));
    }

    #[test]
    fn a_touch_in_prefix_order_leaves_the_head_oldest() {
        let mut t = tier(4);
        t.store(&[1, 2, 3, 9]);
        t.touch(&[1, 2, 3]);
        assert_eq!(t.order(), vec![9, 1, 2, 3]);
        t.store(&[5, 6]);
        // 9 went first, then the session's head, which breaks its prefix.
        assert_eq!(t.order(), vec![2, 3, 5, 6]);
        assert_eq!(t.run_length(&[1, 2, 3]), 0);
        assert_eq!(t.run_length(&[2, 3, 7]), 2);
    }

    #[test]
    fn the_rate_comes_from_bandwidth_and_bytes_per_token() {
        // Llama-8B: 128 KiB a token at 55.5 GB/s, about 2.4 ms per 1,024 tokens.
        let c = TierConfig::from_bandwidth(1 << 20, 16, 55.5, 131_072.0);
        assert_eq!(c.blocks, (1 << 20) / 16);
        let ms = c.reload_ns(1024) as f64 / 1e6;
        assert!((ms - 2.42).abs() < 0.05, "{ms}");
        assert!(c.validate(c.blocks + 1).is_err());
        assert!(c.validate(c.blocks).is_ok());
    }
}
