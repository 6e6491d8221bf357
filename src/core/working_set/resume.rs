//! Whether a waiting turn's cache is gone (issue 54): a session the gate
//! counts as evicted here (new, parked, or out since its window ended, its
//! blocks at most a ghost) costs a full prefill wherever its next turn
//! runs, so a host may place that turn on another replica with room. A
//! member, or a session parked in the host tier (which comes back by a
//! copy), still has its cache here and keeps its place.
//!
//! The drop itself is [`WorkingSet::withdraw`]: the turn leaves the queue
//! as a withdrawn attempt does, and its history stays until the session
//! ends or is forgotten.

use super::lifecycle::{Session, Stage};

/// Whether the waiting turn of session `r` finds its prefix gone.
/// `Some(false)`: a member (its grant not collected yet), or parked in the
/// host tier: its cache is still here. `None`: the session neither waits
/// nor is a member.
pub(super) fn cache_gone<K>(r: &Session<K>) -> Option<bool> {
    match r.stage {
        Stage::Member(_) => Some(false),
        Stage::Waiting(w) => Some(!w.parked),
        Stage::Away | Stage::Parked => None,
    }
}

#[cfg(test)]
mod tests {
    use super::super::*;

    const MS: u64 = 1_000_000;

    #[test]
    fn a_parked_or_new_waiting_session_has_lost_its_cache_a_member_has_not() {
        // 1000 tokens of KV in blocks of 1; refill window 1 s.
        let mut ws = WorkingSet::new(Tuning::default());
        ws.set_engine(EngineCapacity::new(1000, 1, 1000.0)).unwrap();
        let report = || TurnReport::new(Some(0), Some(0));
        for k in ["a", "b", "c"] {
            ws.request(&k, 300, 0);
        }
        ws.release(&"a", 300, report(), 0, 600 * MS);
        ws.release(&"b", 300, report(), 0, 610 * MS);
        ws.release(&"c", 300, report(), 0, 620 * MS);
        // b grows: a, released first, is parked.
        assert_eq!(ws.request(&"b", 500, 700 * MS), Verdict::Member);
        assert_eq!(ws.stats().parked, 1);
        assert_eq!(ws.request(&"n", 300, 710 * MS), Verdict::Wait);
        assert_eq!(ws.request(&"a", 300, 720 * MS), Verdict::Wait);
        // New and parked: gone. Members: hot. Unknown: nothing to say.
        assert_eq!(ws.waiting_cache_gone(&"n"), Some(true));
        assert_eq!(ws.waiting_cache_gone(&"a"), Some(true));
        assert_eq!(ws.waiting_cache_gone(&"b"), Some(false));
        assert_eq!(ws.waiting_cache_gone(&"c"), Some(false));
        assert_eq!(ws.waiting_cache_gone(&"zz"), None);
        // The drop: a leaves the queue, n keeps its place at the head.
        let head = ws.queue_position(&"n");
        ws.withdraw(&"a");
        assert!(!ws.is_waiting(&"a"));
        assert_eq!(ws.waiting_cache_gone(&"a"), None);
        assert_eq!(ws.queue_position(&"n"), head);
        ws.audit().unwrap();
    }
}
