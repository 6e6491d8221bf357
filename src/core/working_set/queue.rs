//! The sessions waiting to join, first come first served.
//!
//! One queue, whether a session is new or was a member before (parked, or
//! out of its window): no class of sessions goes ahead of another, so none
//! waits behind a stream of the other (`docs/decisions/fifo-returns.md`). A
//! retry keeps its place; a withdrawn attempt loses it.

use std::collections::BTreeMap;

use super::types::Slot;

/// The queue, by sequence number.
#[derive(Debug, Default)]
pub(super) struct Queue {
    by_place: BTreeMap<u64, Slot>,
    next_seq: u64,
}

impl Queue {
    /// Queues the session at `s` at the back; returns its place.
    pub(super) fn push(&mut self, s: Slot) -> u64 {
        let at = self.next_seq;
        self.next_seq += 1;
        self.by_place.insert(at, s);
        at
    }

    pub(super) fn remove(&mut self, at: u64) {
        self.by_place.remove(&at);
    }

    /// The session at the head of the queue.
    pub(super) fn head(&self) -> Option<Slot> {
        self.by_place.values().next().copied()
    }

    pub(super) fn len(&self) -> usize {
        self.by_place.len()
    }

    pub(super) fn iter(&self) -> impl Iterator<Item = (&u64, &Slot)> {
        self.by_place.iter()
    }
}
