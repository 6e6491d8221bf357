//! The leases C holds, by handle.
//!
//! C gets a `uint64_t` (the admission's gate-unique, never reused
//! `lease_id`) instead of a pointer, so a double release or a stale handle
//! finds nothing and is answered `KVGATE_UNKNOWN_LEASE`: it can neither
//! corrupt memory nor release a lease twice. The registry is lock-sharded by
//! a hash of the id, so releases on many threads rarely meet on one lock,
//! and a lease is always dropped (released to the gate) outside that lock.

use std::hash::{BuildHasherDefault, Hasher};

use crossbeam_utils::CachePadded;
use hashbrown::HashMap;

use crate::sync::Mutex;

/// Hashes a lease id for the registry's maps.
///
/// Why not SipHash: the std default hashes the id twice per open-path turn
/// (insert, remove), a large share of an acquire + release through the C
/// ABI. The keys are ids the library minted itself, unique and never
/// reused, so there is no flood of chosen keys to resist (a host can only
/// *look up* an arbitrary id, once per release call). A multiply mixes the
/// id's bits (its low bits are the core's shard index, shared by many ids)
/// and the fold brings the mixed high half down to the low bits the table
/// indexes with.
#[derive(Debug, Default)]
struct IdHasher(u64);

impl Hasher for IdHasher {
    fn finish(&self) -> u64 {
        let h = self.0.wrapping_mul(0x9E37_79B9_7F4A_7C15);
        h ^ (h >> 32)
    }

    fn write(&mut self, bytes: &[u8]) {
        // Only `u64` keys are hashed here; this keeps the trait whole.
        for &b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(b);
        }
    }

    fn write_u64(&mut self, id: u64) {
        self.0 = id;
    }
}

type IdMap<T> = HashMap<u64, T, BuildHasherDefault<IdHasher>>;

#[derive(Debug)]
struct Shard<T> {
    leases: IdMap<T>,
    /// Set by [`LeaseRegistry::close`]: nothing is inserted any more.
    closed: bool,
}

/// Outstanding leases by id. Generic so tests can count drops without a gate.
#[derive(Debug)]
pub(crate) struct LeaseRegistry<T> {
    shards: Box<[CachePadded<Mutex<Shard<T>>>]>,
    shard_bits: u32,
}

fn default_shard_bits() -> u32 {
    crate::sync::default_shard_bits(4, 8, 64)
}

impl<T> LeaseRegistry<T> {
    pub(crate) fn new() -> Self {
        Self::with_shard_bits(default_shard_bits())
    }

    pub(crate) fn with_shard_bits(shard_bits: u32) -> Self {
        let shards = (0..1usize << shard_bits)
            .map(|_| {
                CachePadded::new(Mutex::new(Shard {
                    leases: IdMap::default(),
                    closed: false,
                }))
            })
            .collect();
        Self { shards, shard_bits }
    }

    fn shard(&self, id: u64) -> &Mutex<Shard<T>> {
        // Fibonacci hashing: the id's low bits are the core's shard index,
        // its high bits a per-shard sequence; the product mixes both.
        let index = if self.shard_bits == 0 {
            0
        } else {
            (id.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> (64 - self.shard_bits)) as usize
        };
        &self.shards[index]
    }

    /// Keeps `lease` under `id`. Hands it back if the registry was closed
    /// (the gate is being freed): the caller drops it, releasing it.
    pub(crate) fn insert(&self, id: u64, lease: T) -> Result<(), T> {
        let mut shard = self.shard(id).lock();
        if shard.closed {
            return Err(lease);
        }
        let previous = shard.leases.insert(id, lease);
        drop(shard);
        // Ids are gate-unique and never reused; two gates never share a registry.
        debug_assert!(previous.is_none(), "lease id {id} issued twice");
        drop(previous);
        Ok(())
    }

    /// Takes the lease out; `None` if it is not outstanding. Of two threads
    /// removing the same id, exactly one gets it.
    pub(crate) fn remove(&self, id: u64) -> Option<T> {
        self.shard(id).lock().leases.remove(&id)
    }

    /// Closes every shard and hands back every outstanding lease.
    pub(crate) fn close(&self) -> Vec<T> {
        let mut all = Vec::new();
        for shard in self.shards.iter() {
            let mut shard = shard.lock();
            shard.closed = true;
            all.extend(shard.leases.drain().map(|(_, lease)| lease));
        }
        all
    }

    /// Outstanding leases (a sum over the shards, not one instant).
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.shards.iter().map(|s| s.lock().leases.len()).sum()
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::{Arc, Barrier};

    /// Counts its drops: a dropped lease is a released lease.
    struct Counted(Arc<AtomicUsize>);
    impl Drop for Counted {
        fn drop(&mut self) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    #[test]
    fn a_lease_is_removed_once() {
        let registry = LeaseRegistry::with_shard_bits(3);
        let drops = Arc::new(AtomicUsize::new(0));
        registry.insert(17, Counted(drops.clone())).ok().unwrap();
        assert_eq!(registry.len(), 1);
        assert!(registry.remove(18).is_none(), "never issued");
        drop(registry.remove(17).expect("outstanding"));
        assert!(registry.remove(17).is_none(), "already released");
        assert_eq!(drops.load(Ordering::SeqCst), 1);
        assert_eq!(registry.len(), 0);
    }

    #[test]
    fn close_hands_back_everything_and_refuses_more() {
        let registry = LeaseRegistry::with_shard_bits(2);
        let drops = Arc::new(AtomicUsize::new(0));
        for id in 1..=20u64 {
            registry
                .insert(id << 4 | 3, Counted(drops.clone()))
                .ok()
                .unwrap();
        }
        let outstanding = registry.close();
        assert_eq!(outstanding.len(), 20);
        drop(outstanding);
        assert_eq!(drops.load(Ordering::SeqCst), 20);
        let refused = registry.insert(99, Counted(drops.clone())).unwrap_err();
        drop(refused);
        assert_eq!(drops.load(Ordering::SeqCst), 21);
        assert_eq!(registry.len(), 0);
    }

    #[test]
    fn ids_spread_over_shards() {
        let registry: LeaseRegistry<()> = LeaseRegistry::with_shard_bits(4);
        // Ids as the core mints them: sequence << shard_bits | shard index.
        let mut used = std::collections::HashSet::new();
        for seq in 1..=64u64 {
            let shard: *const _ = registry.shard(seq << 5 | 7);
            used.insert(shard);
        }
        assert!(used.len() >= 12, "only {} of 16 shards used", used.len());
    }

    #[test]
    fn racing_releases_of_one_handle_release_it_once() {
        const THREADS: usize = 8;
        let registry = Arc::new(LeaseRegistry::with_shard_bits(3));
        let drops = Arc::new(AtomicUsize::new(0));
        for round in 0..200u64 {
            registry.insert(round, Counted(drops.clone())).ok().unwrap();
            let barrier = Arc::new(Barrier::new(THREADS));
            let winners: usize = (0..THREADS)
                .map(|_| {
                    let (registry, barrier) = (registry.clone(), barrier.clone());
                    std::thread::spawn(move || {
                        barrier.wait();
                        usize::from(registry.remove(round).is_some())
                    })
                })
                .collect::<Vec<_>>()
                .into_iter()
                .map(|t| t.join().unwrap())
                .sum();
            assert_eq!(winners, 1, "round {round}");
        }
        assert_eq!(drops.load(Ordering::SeqCst), 200);
    }
}
