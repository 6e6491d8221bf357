//! Sessions gone quiet: when a host never says that a session ended, the
//! working set presumes it from silence.
//!
//! An agent framework knows when its session ends and can say so
//! (`finish_session`); an OpenAI-compatible proxy sees only requests.
//! Without ends nothing is learned of how long sessions run
//! ([`super::lifetimes`]) until the core forgets an idle session after its
//! retention (minutes), and the survival estimates the fit test uses stay
//! empty.
//!
//! A session is presumed ended once it has been quiet (no request since
//! its last turn ended) for [`QUIET_FACTOR`] times the longer of the
//! refill window and the longest tool gap seen lately: only what is
//! learned of lifetimes changes. Sessions are listed as they leave the
//! working set between turns (at their window's end at the latest), so a
//! member's turn pays nothing for it; the list is in order of release only
//! to within a window, and a session may be presumed up to a window late.
//! A presumed end that asks again is taken back (the working set's part).
//! Once the host has said that one session ended it is trusted to say so
//! for all, and nothing is presumed any more.

use std::collections::VecDeque;

use super::tuning::{LONGEST_GAP_DECAY, QUIET_FACTOR};

/// A session that left the working set between turns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Departure {
    /// When its last turn ended: the quiet counts from then, and a later
    /// release means it asked since.
    pub(crate) released_at: u64,
    pub(crate) slot: usize,
}

/// The sessions that left the working set between turns, in the order they
/// left, while the host has not said that any session ended.
#[derive(Debug, Default, Clone)]
pub(crate) struct Silences {
    departed: VecDeque<Departure>,
    /// The host said that a session ended: nothing is presumed.
    told: bool,
    /// The longest tool gap seen lately, ns.
    longest_gap: u64,
}

impl Silences {
    /// The host said that a session ended: it will say so for the others.
    pub(crate) fn told(&mut self) {
        self.told = true;
        self.departed = VecDeque::new();
    }

    /// Whether the host has said that a session ended.
    #[inline]
    pub(crate) fn is_told(&self) -> bool {
        self.told
    }

    /// The session at `slot`, whose last turn ended at `released_at`, left
    /// the working set between turns (or a turn of it ended outside it).
    pub(crate) fn left(&mut self, slot: usize, released_at: u64) {
        if !self.told {
            self.departed.push_back(Departure { released_at, slot });
        }
    }

    /// A session asked again `gap` ns after its turn ended.
    pub(crate) fn gap(&mut self, gap: u64) {
        let kept = self.longest_gap - self.longest_gap / LONGEST_GAP_DECAY;
        self.longest_gap = gap.max(kept);
    }

    /// How long a session must be quiet to be presumed ended, ns.
    fn quiet_limit(&self, window: u64) -> u64 {
        window.max(self.longest_gap).saturating_mul(QUIET_FACTOR)
    }

    /// The first departure listed, if it has been quiet for long enough at
    /// `now`, taken off the list. The caller checks that the session has
    /// not asked since.
    #[inline]
    pub(crate) fn pop_due(&mut self, now: u64, window: u64) -> Option<Departure> {
        let first = self.departed.front()?;
        if first.released_at.saturating_add(self.quiet_limit(window)) > now {
            return None;
        }
        self.departed.pop_front()
    }

    #[cfg(test)]
    pub(crate) fn listed(&self) -> usize {
        self.departed.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: u64 = 1_000_000_000;

    fn gone(released_at: u64, slot: usize) -> Departure {
        Departure { released_at, slot }
    }

    #[test]
    fn a_departure_is_due_two_windows_after_its_release() {
        let mut q = Silences::default();
        q.left(3, 10 * S);
        assert_eq!(q.pop_due(12 * S - 1, S), None);
        assert_eq!(q.pop_due(12 * S, S), Some(gone(10 * S, 3)));
        assert_eq!(q.pop_due(100 * S, S), None, "taken off the list");
    }

    #[test]
    fn a_long_tool_gap_seen_lengthens_the_quiet_needed() {
        let mut q = Silences::default();
        q.gap(5 * S);
        q.left(1, 0);
        assert_eq!(q.pop_due(10 * S - 1, S), None, "2 x 5 s, not 2 x 1 s");
        assert_eq!(q.pop_due(10 * S, S), Some(gone(0, 1)));
    }

    #[test]
    fn the_longest_gap_fades_as_shorter_ones_come() {
        let mut q = Silences::default();
        q.gap(64 * S);
        q.gap(S);
        assert_eq!(q.longest_gap, 63 * S);
        for _ in 0..1000 {
            q.gap(S);
        }
        assert_eq!(q.longest_gap, S);
    }

    #[test]
    fn departures_come_due_in_the_order_they_left() {
        let mut q = Silences::default();
        q.left(1, 2 * S);
        // Released earlier, left later (at its window's end): behind.
        q.left(2, S);
        assert_eq!(q.pop_due(3 * S, S), None, "the first is not due before 4 s");
        assert_eq!(q.pop_due(4 * S, S), Some(gone(2 * S, 1)));
        assert_eq!(q.pop_due(4 * S, S), Some(gone(S, 2)));
    }

    #[test]
    fn nothing_is_presumed_once_the_host_tells_ends() {
        let mut q = Silences::default();
        q.left(1, 0);
        q.told();
        q.left(2, 0);
        assert_eq!(q.listed(), 0);
        assert_eq!(q.pop_due(u64::MAX, S), None);
    }
}
