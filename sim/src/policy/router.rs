//! Sticky least-loaded routing: a session lands on the replica with the
//! fewest sessions in flight (lowest index on ties) at its first turn and
//! stays there until it finishes, as verl's sticky `AsyncLLMServerManager`
//! does. Probes for a session go to its replica.

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

    /// A session on `replica` finished.
    pub fn release(&mut self, replica: usize) {
        self.in_flight[replica] -= 1;
    }

    /// Sessions in flight on `replica`.
    pub fn load(&self, replica: usize) -> usize {
        self.in_flight[replica]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
