//! What a host tells the working set of its engine beside an attempt's
//! own steps (an answer it must hear refused, the rebuild cost, a report
//! it refused itself), and the working set's figures. Each is a no-op, or `None`, in reference mode, which reads no
//! capacity.

use super::working_set::{self, WorkingSetStats};
use super::Core;

impl Core {
    /// Takes an engine answer from a host that must hear of a refusal
    /// before its attempt moves on (the C ABI's event loop): the answer as
    /// the host's figures made it (`Err`: refused in itself; `Ok(None)`:
    /// the engine cannot say), speaking of a tier. The working set checks
    /// it where it records it (when `record`: the attempt's step that
    /// takes it), and counts a refusal. Reference mode reads no capacity:
    /// it refuses only an answer refused in itself, and counts nothing.
    pub(crate) fn take_engine_answer(
        &self,
        answer: Result<Option<working_set::EngineCapacity>, working_set::TierError>,
        record: bool,
    ) -> Result<(), working_set::TierError> {
        self.policy.take_answer(answer, record)
    }

    /// Tells the working set what the engine's prefill costs (a host that
    /// fits it to the engine's steps tells it again as it refits); the
    /// windows and deadlines follow at `now`. A no-op in reference mode,
    /// which prices nothing.
    pub fn set_rebuild_cost(&self, cost: working_set::RebuildCost, now: u64) {
        self.hand_over(self.policy.set_rebuild_cost(cost, now));
    }

    /// Counts, in [`WorkingSetStats::refused_answers`], a turn report that
    /// its host's figures made inconsistent (a [`working_set::TierError`]):
    /// refused before its lease is released, so it never reaches the
    /// working set. A no-op in reference mode.
    pub(crate) fn count_refused_report(&self) {
        self.policy.count_refused();
    }

    /// The working set's figures, in working-set admission.
    pub fn working_set_stats(&self) -> Option<WorkingSetStats> {
        self.policy.stats()
    }
}
