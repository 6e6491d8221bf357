//! Lazily fired deadlines: grace-window expiries and session retirements.
//!
//! No thread ever sleeps on these. Whoever touches the gate next compares
//! `now` with [`TimerQueue::earliest`] (one relaxed load on the fast path)
//! and, when something is due, pops it and re-checks the session's record:
//! an entry is only a hint to look, never the truth, so stale entries are
//! harmless. Each record keeps at most one live entry per queue (see
//! `SessionRecord::grace_timer` / `retire_timer`), which bounds memory.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use crate::core::sessions::SessionKey;
use crate::sync::{AtomicU64, Mutex, Ordering};

/// No deadline pending.
pub(crate) const NEVER: u64 = u64::MAX;

#[derive(Debug)]
struct Entry {
    deadline: u64,
    key: SessionKey,
}

impl PartialEq for Entry {
    fn eq(&self, other: &Self) -> bool {
        self.deadline == other.deadline
    }
}
impl Eq for Entry {}
impl PartialOrd for Entry {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Entry {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.deadline.cmp(&other.deadline)
    }
}

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

    /// Asks to look at `key` again at `deadline`.
    pub(crate) fn arm(&self, deadline: u64, key: SessionKey) {
        let mut heap = self.heap.lock();
        heap.push(Reverse(Entry { deadline, key }));
        self.publish_earliest(&heap);
    }

    /// Pops up to `max` entries due at `now`.
    pub(crate) fn pop_due(&self, now: u64, max: usize, out: &mut Vec<(u64, SessionKey)>) {
        if now < self.earliest() {
            return;
        }
        let mut heap = self.heap.lock();
        while out.len() < max {
            match heap.peek() {
                Some(Reverse(e)) if e.deadline <= now => {
                    let Reverse(e) = heap.pop().expect("peeked entry exists");
                    out.push((e.deadline, e.key));
                }
                _ => break,
            }
        }
        self.publish_earliest(&heap);
    }

    /// Number of entries (live or stale) held.
    pub(crate) fn len(&self) -> usize {
        self.heap.lock().len()
    }

    fn publish_earliest(&self, heap: &BinaryHeap<Reverse<Entry>>) {
        let earliest = heap.peek().map_or(NEVER, |Reverse(e)| e.deadline);
        self.earliest.store(earliest, Ordering::SeqCst);
    }
}
