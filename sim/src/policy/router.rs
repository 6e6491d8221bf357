//! Sticky least-loaded routing: a session lands on the replica with the
//! fewest sessions in flight (lowest index on ties) at its first turn and
//! stays there until it finishes, as verl's sticky `AsyncLLMServerManager`
//! does. Probes for a session go to its replica.
//!
//! The other placements of [`crate::simulation::Routing`] use the same
//! counts: `hash` places a session where a hash of its id says
//! ([`hash_replica`], [`Router::assign_to`]), as a session-affinity router
//! (a consistent hash of `X-Session-ID`) does; `least-loaded` places every
//! turn anew, so a session migrates whenever another replica has fewer.

/// Sessions in flight per replica.
#[derive(Debug, Clone)]
pub struct Router {
    in_flight: Vec<usize>,
}

impl Router {
    /// A router over `replicas` replicas.
    pub fn new(replicas: usize) -> Self {
        assert!(replicas > 0);
        Self {
            in_flight: vec![0; replicas],
        }
    }

    /// Places a new session on the least-loaded replica.
    pub fn assign(&mut self) -> usize {
        self.assign_below(usize::MAX).expect("no limit")
    }

    /// Places a new session on the least-loaded replica if it has fewer than
    /// `limit` sessions in flight (the `cap-K` policy).
    pub fn assign_below(&mut self, limit: usize) -> Option<usize> {
        let (r, &n) = self
            .in_flight
            .iter()
            .enumerate()
            .min_by_key(|&(i, &n)| (n, i))
            .expect("at least one replica");
        (n < limit).then(|| {
            self.in_flight[r] += 1;
            r
        })
    }

    /// Places a session on `replica` (a placement decided elsewhere).
    pub fn assign_to(&mut self, replica: usize) -> usize {
        self.in_flight[replica] += 1;
        replica
    }

    /// A session on `replica` finished.
    pub fn release(&mut self, replica: usize) {
        self.in_flight[replica] -= 1;
    }

    /// Sessions in flight on `replica`.
    pub fn load(&self, replica: usize) -> usize {
        self.in_flight[replica]
    }
}

/// The replica a session-affinity router sends session `session` to: a
/// fixed hash of the id (SplitMix64's finalizer), modulo the replicas. The
/// same session always lands on the same replica, whatever the load.
pub fn hash_replica(session: usize, replicas: usize) -> usize {
    assert!(replicas > 0);
    let mut z = (session as u64).wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^= z >> 31;
    (z % replicas as u64) as usize
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hash_placement_is_fixed_per_session_and_spreads() {
        let first: Vec<usize> = (0..512).map(|s| hash_replica(s, 8)).collect();
        let again: Vec<usize> = (0..512).map(|s| hash_replica(s, 8)).collect();
        assert_eq!(first, again);
        let mut per = [0usize; 8];
        for &r in &first {
            per[r] += 1;
        }
        // 64 each on average; a hash is not a balancer, but none starves
        assert!(per.iter().all(|&n| (32..=96).contains(&n)), "{per:?}");
        let mut r = Router::new(8);
        assert_eq!(r.assign_to(first[0]), first[0]);
        assert_eq!(r.load(first[0]), 1);
    }

    #[test]
    fn least_loaded_first_lowest_index_on_ties() {
        let mut r = Router::new(3);
        assert_eq!(
            (r.assign(), r.assign(), r.assign(), r.assign()),
            (0, 1, 2, 0)
        );
        r.release(1);
        assert_eq!(r.assign(), 1);
        assert_eq!((r.load(0), r.load(1), r.load(2)), (2, 1, 1));
    }

    #[test]
    fn a_cap_refuses_when_every_replica_is_full() {
        let mut r = Router::new(2);
        assert_eq!(r.assign_below(1), Some(0));
        assert_eq!(r.assign_below(1), Some(1));
        assert_eq!(r.assign_below(1), None);
        r.release(0);
        assert_eq!(r.assign_below(1), Some(0));
    }
}
