//! How many turns sessions last: the turn counts of the sessions that
//! finished most recently, asked how likely a session still running is to
//! run some turns more.
//!
//! The working set uses it to see how the members' footprints will grow
//! before they end (`fits_ahead` in `admission`): a member that has run 9 turns
//! where every session seen ended after 10 will free its room soon, one that
//! has run 2 will grow for a while yet. The sessions still running count
//! too, as lives that reached their turn count so far (censored, in the
//! product-limit estimate's terms): before any session finishes, the
//! members are seen as far as the oldest has run. Only what was measured
//! is used: past that, no answer.

use std::collections::VecDeque;

use super::tuning::LIFETIMES_REMEMBERED as REMEMBERED;

/// The turn counts of the last [`REMEMBERED`] finished sessions.
#[derive(Debug, Default, Clone)]
pub(crate) struct Lifetimes {
    /// In the order they finished: the oldest is forgotten first.
    by_finish: VecDeque<u32>,
    /// The same counts, ascending: a survival question is a binary search.
    sorted: Vec<u32>,
}

impl Lifetimes {
    /// A session ended after `turns` turns (none: nothing to learn).
    pub(crate) fn record(&mut self, turns: u32) {
        if turns == 0 {
            return;
        }
        if self.by_finish.len() == REMEMBERED {
            if let Some(oldest) = self.by_finish.pop_front() {
                let at = self.sorted.partition_point(|&t| t < oldest);
                self.sorted.remove(at);
            }
        }
        self.by_finish.push_back(turns);
        let at = self.sorted.partition_point(|&t| t < turns);
        self.sorted.insert(at, turns);
    }

    /// Takes back the most recent record of a session that ran `turns`
    /// turns: one presumed ended ([`super::silences`]) asked again.
    pub(crate) fn take_back(&mut self, turns: u32) {
        let Some(at) = self.by_finish.iter().rposition(|&t| t == turns) else {
            return;
        };
        self.by_finish.remove(at);
        let at = self.sorted.partition_point(|&t| t < turns);
        self.sorted.remove(at);
    }

    #[cfg(test)]
    pub(crate) fn by_finish_len(&self) -> usize {
        self.by_finish.len()
    }

    #[cfg(test)]
    pub(crate) fn is_empty(&self) -> bool {
        self.sorted.is_empty()
    }

    /// The most turns any remembered session ran (0 if none).
    pub(crate) fn longest(&self) -> u32 {
        self.sorted.last().copied().unwrap_or(0)
    }

    /// Remembered sessions that ran at least `turns` turns.
    fn lasting(&self, turns: u32) -> usize {
        self.sorted.len() - self.sorted.partition_point(|&t| t < turns)
    }

    /// Whether sessions end after `turns` turns: at least half of those
    /// remembered ran that many, and none ran more. A session that has run
    /// the longest life seen is not taken to end there unless most did:
    /// where lifetimes vary, the longest seen keeps being outlived.
    pub(crate) fn ends_after(&self, turns: u32) -> bool {
        let turns = turns.max(1);
        let reached = self.lasting(turns);
        reached > 0 && 2 * reached >= self.sorted.len() && self.lasting(turns + 1) == 0
    }

    /// The survival curve from the remembered lifetimes and the turn counts
    /// of the sessions still running (`running`): a running session that
    /// has begun `a` turns says lives reach `a`, not where they end. The
    /// product-limit (Kaplan-Meier) estimate: from `j` turns to `j + 1`,
    /// the share of the sessions known to have begun `j` whose next turn is
    /// known (finished after `j` or more, or running past `j`) that began
    /// it. Before any session finishes, lives are taken to go on as far as
    /// the oldest running one has, and no further is known.
    pub(crate) fn survival(&self, running: impl Iterator<Item = u32>) -> Survival {
        let mut running: Vec<u32> = running.filter(|&t| t > 0).collect();
        running.sort_unstable();
        let oldest = running.last().copied().unwrap_or(0).max(self.longest());
        // `curve[t]`: the chance that a session begins at least `t` turns.
        let mut curve = Vec::with_capacity(oldest as usize + 1);
        curve.push(1.0);
        let mut alive = 1.0;
        for j in 1..=oldest {
            curve.push(alive);
            let ended_here = self.lasting(j) - self.lasting(j + 1);
            let running_past = running.len() - running.partition_point(|&t| t <= j);
            let known_next = self.lasting(j) + running_past;
            if known_next == 0 {
                // Nobody is known to have begun a turn past `j`, nor to
                // have ended at it: the curve stops here.
                return Survival { curve };
            }
            alive *= 1.0 - ended_here as f64 / known_next as f64;
        }
        if oldest > 0 {
            curve.push(alive);
        }
        Survival { curve }
    }
}

/// A saved summary's view of the lifetimes (module `learned`).
impl Lifetimes {
    /// The remembered turn counts, in the order the sessions finished:
    /// recording them again in this order gives the same lifetimes.
    pub(crate) fn remembered(&self) -> impl Iterator<Item = u32> + '_ {
        self.by_finish.iter().copied()
    }
}

/// A survival curve: [`Lifetimes::survival`].
#[derive(Debug, Clone)]
pub(crate) struct Survival {
    curve: Vec<f64>,
}

impl Survival {
    /// The most turns the curve says anything about.
    pub(crate) fn reach(&self) -> u32 {
        (self.curve.len() as u32).saturating_sub(1)
    }

    /// The chance that a session that has begun `started` turns begins
    /// `ahead` more; `None` past what was measured.
    pub(crate) fn continuing(&self, started: u32, ahead: u32) -> Option<f64> {
        let from = *self.curve.get(started.max(1) as usize)?;
        let to = *self
            .curve
            .get(started.max(1).saturating_add(ahead) as usize)?;
        (from > 0.0).then(|| to / from)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nothing_is_known_before_a_session_finishes() {
        let l = Lifetimes::default();
        assert!(l.is_empty());
        assert_eq!(l.longest(), 0);
        assert_eq!(l.survival(std::iter::empty()).continuing(1, 1), None);
    }

    #[test]
    fn survival_is_the_share_of_those_that_got_as_far_and_went_further() {
        let mut l = Lifetimes::default();
        for t in [10, 10, 4, 2, 0] {
            l.record(t);
        }
        assert_eq!(l.longest(), 10);
        // Of the 4 that began a turn, 3 began a third and 2 a fifth.
        assert_eq!(l.survival(std::iter::empty()).continuing(1, 2), Some(0.75));
        assert_eq!(l.survival(std::iter::empty()).continuing(1, 4), Some(0.5));
        // Of the 2 that began 9 turns, both began a 10th, none an 11th.
        assert_eq!(l.survival(std::iter::empty()).continuing(9, 1), Some(1.0));
        assert_eq!(l.survival(std::iter::empty()).continuing(10, 1), Some(0.0));
        // None began 11: no answer, not a certain end.
        assert_eq!(l.survival(std::iter::empty()).continuing(11, 1), None);
        // A session that has begun no turn yet is asked as one beginning its first.
        assert_eq!(
            l.survival(std::iter::empty()).continuing(0, 2),
            l.survival(std::iter::empty()).continuing(1, 2)
        );
    }

    #[test]
    fn running_sessions_say_how_far_lives_reach_not_where_they_end() {
        let l = Lifetimes::default();
        // Nobody finished; the oldest running has begun 5 turns.
        let s = l.survival([5, 3, 0].into_iter());
        assert_eq!(s.reach(), 5);
        assert_eq!(s.continuing(1, 4), Some(1.0));
        assert_eq!(s.continuing(3, 2), Some(1.0));
        assert_eq!(s.continuing(3, 3), None, "nobody is known to begin a 6th");
        assert_eq!(l.survival(std::iter::empty()).continuing(1, 1), None);
        // One finished after 4 turns, one runs on at 6: of the two known
        // to begin a 4th, one began a 5th.
        let mut l = Lifetimes::default();
        l.record(4);
        let s = l.survival([6].into_iter());
        assert_eq!(s.continuing(1, 3), Some(1.0));
        assert_eq!(s.continuing(1, 4), Some(0.5));
        assert_eq!(s.continuing(4, 2), Some(0.5));
        assert_eq!(s.continuing(5, 1), Some(1.0));
        assert_eq!(s.continuing(6, 1), None);
    }

    #[test]
    fn sessions_end_where_most_ended_and_none_went_on() {
        let mut l = Lifetimes::default();
        assert!(!l.ends_after(1), "nothing known");
        for _ in 0..4 {
            l.record(10);
        }
        assert!(l.ends_after(10));
        assert!(!l.ends_after(9), "they went on");
        assert!(!l.ends_after(11), "none got as far");
        for t in [3, 4, 5, 6, 7] {
            l.record(t);
        }
        assert!(
            !l.ends_after(10),
            "4 of 9 got as far: the longest seen, not where sessions end"
        );
        let mut single = Lifetimes::default();
        single.record(1);
        assert!(single.ends_after(1));
        assert!(single.ends_after(0), "asked before a turn, as after one");
    }

    #[test]
    fn a_record_taken_back_no_longer_counts() {
        let mut l = Lifetimes::default();
        for t in [3, 5, 3] {
            l.record(t);
        }
        l.take_back(3);
        assert_eq!(l.by_finish, [3, 5], "the most recent 3 is taken back");
        assert_eq!(l.sorted, [3, 5]);
        l.take_back(4);
        assert_eq!(l.sorted, [3, 5], "nothing recorded, nothing taken");
        l.take_back(5);
        l.take_back(3);
        assert!(l.is_empty());
    }

    #[test]
    fn only_the_most_recent_sessions_are_remembered() {
        let mut l = Lifetimes::default();
        for _ in 0..REMEMBERED {
            l.record(30);
        }
        assert_eq!(l.survival(std::iter::empty()).continuing(20, 5), Some(1.0));
        for _ in 0..REMEMBERED {
            l.record(3);
        }
        assert_eq!(l.longest(), 3);
        assert_eq!(l.survival(std::iter::empty()).continuing(20, 5), None);
        assert_eq!(l.by_finish.len(), REMEMBERED);
        assert_eq!(l.sorted.len(), REMEMBERED);
    }
}
