//! Lazily fired deadlines: grace-window expiries and session retirements.
//!
//! No thread ever sleeps on these. Whoever touches the gate next compares
//! `now` with [`TimerQueue::earliest`] (one relaxed load on the fast path)
//! and, when something is due, pops it and re-checks the session's record:
//! an entry is only a hint to look, never the truth, so stale entries are
//! harmless. Each record keeps at most one live entry per queue (see
//! `SessionRecord::grace_timer` / `retire_timer`), which bounds memory.
//!
//! An entry names its record by the id's hash and the deadline, not by the
//! id itself: 16 bytes instead of 32, no reference count to bump when a
//! window opens, and a stale entry no longer keeps a finished session's id
//! alive until its deadline (benches/README.md, memory). The record is the
//! one of that hash whose entry is due at that deadline; should two ids
//! share a 64-bit hash and a deadline, their two entries are interchangeable.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use crate::core::shrink::sparse;
use crate::sync::{AtomicU64, Mutex, Ordering};

/// No deadline pending.
pub(crate) const NEVER: u64 = u64::MAX;

/// (deadline, hash of the session id): ordered by deadline first.
type Entry = (u64, u64);

/// A min-heap of (deadline, session) with a lock-free peek at its minimum.
#[derive(Debug)]
pub(crate) struct TimerQueue {
    heap: Mutex<BinaryHeap<Reverse<Entry>>>,
    /// Mirror of the heap's minimum deadline ([`NEVER`] when empty), written
    /// under the heap lock, read without it.
    earliest: AtomicU64,
}

impl TimerQueue {
    pub(crate) fn new() -> Self {
        Self {
            heap: Mutex::new(BinaryHeap::new()),
            earliest: AtomicU64::new(NEVER),
        }
    }

    /// Earliest pending deadline, or [`NEVER`].
    pub(crate) fn earliest(&self) -> u64 {
        self.earliest.load(Ordering::SeqCst)
    }

    /// Asks to look at the session whose id hashes to `hash` at `deadline`.
    /// Returns whether `deadline` became the earliest pending one.
    pub(crate) fn arm(&self, deadline: u64, hash: u64) -> bool {
        let mut heap = self.heap.lock();
        let earlier = deadline < self.earliest();
        heap.push(Reverse((deadline, hash)));
        self.publish_earliest(&heap);
        earlier
    }

    /// Pops up to `max` entries due at `now`.
    pub(crate) fn pop_due(&self, now: u64, max: usize, out: &mut Vec<Entry>) {
        if now < self.earliest() {
            return;
        }
        let mut heap = self.heap.lock();
        while out.len() < max {
            match heap.peek() {
                Some(Reverse((deadline, _))) if *deadline <= now => {
                    let Reverse(entry) = heap.pop().expect("peeked entry exists");
                    out.push(entry);
                }
                _ => break,
            }
        }
        if let Some(keep) = sparse(heap.len(), heap.capacity()) {
            heap.shrink_to(keep); // back to baseline once the windows are gone
        }
        self.publish_earliest(&heap);
    }

    /// Number of entries (live or stale) held.
    pub(crate) fn len(&self) -> usize {
        self.heap.lock().len()
    }

    fn publish_earliest(&self, heap: &BinaryHeap<Reverse<Entry>>) {
        let earliest = heap
            .peek()
            .map_or(NEVER, |Reverse((deadline, _))| *deadline);
        self.earliest.store(earliest, Ordering::SeqCst);
    }
}
