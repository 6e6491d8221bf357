//! What a host tells the working set of its engine outside an attempt
//! (the rebuild cost, answers it refused itself), and the working set's
//! figures. Each is a no-op, or `None`, in reference mode, which reads no
//! capacity.

use super::ledger::Ledger;
use super::working_set::{self, WorkingSetStats};
use super::Core;

impl Core {
    /// Whether an engine answer is consistent with the earlier ones: its
    /// tier no smaller than the GPU cache and, when the answer `says_tier`
    /// (it speaks of tiers and tells none), no tier lost. Always `Ok` in
    /// reference mode, which reads no capacity. For a host that must hear
    /// of a refusal before its attempt moves on (the C ABI's event loop);
    /// an attempt's own answers are checked once, where the working set
    /// records them.
    pub fn check_engine_answer(
        &self,
        engine: &working_set::EngineCapacity,
        says_tier: bool,
    ) -> Result<(), working_set::TierError> {
        self.working_set()
            .map_or(Ok(()), |l| l.check_engine(engine, says_tier))
    }

    /// Tells the working set what the engine's prefill costs (a host that
    /// fits it to the engine's steps tells it again as it refits); the
    /// windows and deadlines follow at `now`. A no-op in reference mode,
    /// which prices nothing.
    pub fn set_rebuild_cost(&self, cost: working_set::RebuildCost, now: u64) {
        if let Some(ledger) = self.working_set() {
            self.hand_over(ledger.set_rebuild_cost(cost, now));
        }
    }

    /// Counts, in [`WorkingSetStats::refused_answers`], an engine answer or
    /// turn report that a surface refused itself before it reached the
    /// working set (one [`Core::check_engine_answer`] refused, or a
    /// [`working_set::TierError`] its host's figures made), so that every
    /// refusal shows in one figure. A no-op in reference mode.
    pub fn count_refused_answer(&self) {
        if let Some(ledger) = self.working_set() {
            ledger.count_refused();
        }
    }

    /// The working set's figures, in working-set admission.
    pub fn working_set_stats(&self) -> Option<WorkingSetStats> {
        self.working_set().map(Ledger::stats)
    }
}
