//! Whether a member keeps its place between turns.
//!
//! A member between turns keeps its place for one refill window `C / r`
//! after its turn ends (the break-even of holding against re-prefilling,
//! derived at the top of the module). A session whose own tool calls
//! usually outlast the window gets none: holding its place would cost more
//! than refilling what it loses. "Usually" is the median of its last
//! [`GAP_SAMPLES`] gaps; a session with fewer than [`GAPS_TO_JUDGE`] keeps
//! a window.

use std::hash::Hash;

use super::lifecycle::{Gaps, Leaving, Stage, ToolGap};
use super::roster::InTier;
use super::tuning::GAPS_TO_JUDGE;
#[cfg(doc)]
use super::tuning::GAP_SAMPLES;
use super::WorkingSet;

/// Whether a session with these recent tool gaps keeps a window of
/// `window_ns`. The median of `n` gaps (the upper one of an even count) is
/// at most the window exactly when more than `n / 2` of them are.
pub(super) fn keeps_window(gaps: &Gaps, window_ns: u64) -> bool {
    if gaps.len() < GAPS_TO_JUDGE {
        return true;
    }
    gaps.at_most(window_ns) > gaps.len() / 2
}

impl<K: Eq + Hash + Clone> WorkingSet<K> {
    /// Ends the windows that are over at `now` (and presumes ended the
    /// sessions quiet for long enough).
    pub fn expire(&mut self, now: u64) {
        while let Some(first) = self.idle.first {
            let released = self.sessions[first].member().map_or(0, |m| m.released_at);
            let until = released.saturating_add(self.window_ns());
            if until > now {
                break;
            }
            // It left when its window ended, however late this is asked.
            self.leave(first, until, Leaving::BetweenTurns);
        }
        self.presume_ends(now);
    }

    /// Presumes ended the sessions quiet for long enough at `now`, while
    /// the host tells no ends: each one's turn count joins the lifetimes
    /// (taken back if it asks again).
    pub(super) fn presume_ends(&mut self, now: u64) {
        // A session's silence is judged on the refill window whatever the
        // tier: it says how long sessions stay away, not what a return costs.
        while let Some(gone) = self.silences.pop_due(now, self.capacity.window_ns()) {
            let Some(r) = self.sessions.get_mut(gone.slot) else {
                continue;
            };
            // Asked since, or a newer turn ended, or the slot is another
            // session's now.
            let quiet = matches!(r.stage, Stage::Away | Stage::Parked)
                && r.gap
                    == ToolGap::Open {
                        since: gone.released_at,
                    };
            if quiet {
                self.lifetimes.record(r.history.turns);
                r.gap = ToolGap::Quiet {
                    since: gone.released_at,
                };
                self.out_of_tier(gone.slot, InTier::Ended);
            }
        }
    }

    /// When this working set next changes by itself: the earliest window
    /// end, or the queue head reaching the wait bound.
    pub fn next_deadline(&self) -> Option<u64> {
        let window = self
            .oldest_idle_release()
            .map(|released| released.saturating_add(self.window_ns()));
        [window, self.wait_bound_end()].into_iter().flatten().min()
    }
}
