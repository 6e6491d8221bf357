//! What a host tells the core beside an attempt's steps: the engine's
//! answer it must hear refused, its rebuild cost and `max_model_len`, a
//! report it refused itself, a session's budget, a saved summary of what
//! the working set learned; and the working set's figures. Each is the
//! policy's: the working set stores them (`working_set::hints`,
//! `working_set::learned`); reference mode, which reads no capacity and
//! learns nothing, checks them and keeps nothing.

use super::sessions::SessionKey;
use super::summary::{self, SummaryError};
use super::working_set::{self, Budget, EngineCapacity, HintError, WorkingSetStats};
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

    /// Tells the engine's longest sequence, tokens (refused if 0; the
    /// gate keeps what it had). The same as a capacity answer
    /// [`EngineCapacity::with_max_model_len`], for a host that tells it
    /// apart from its probes (the C ABI's).
    pub fn set_max_model_len(&self, tokens: u64, now: u64) -> Result<(), HintError> {
        let answer = EngineCapacity::default().with_max_model_len(tokens)?;
        self.hand_over(self.policy.set_max_model_len(answer, now));
        Ok(())
    }

    /// Tells `session`'s budget, before or at its first acquire; a later
    /// one replaces it, a refused one changes nothing. Forgotten with the
    /// session (`finish_session` forgets one told for a session that never
    /// acquired).
    pub fn set_session_budget(
        &self,
        session: &[u8],
        budget: Budget,
        now: u64,
    ) -> Result<(), HintError> {
        let key = SessionKey {
            hash: self.table.hash(session),
            bytes: session.into(),
        };
        // Reference mode stores nothing, but refuses what it would.
        let (result, grants) = self.policy.set_budget(&key, budget, now);
        self.hand_over(grants);
        result
    }

    /// What the working set learned, as a summary's bytes (reference mode:
    /// a summary of nothing learned).
    pub fn save_summary(&self) -> Vec<u8> {
        summary::encode(&self.policy.learned())
    }

    /// Adopts a saved summary, whole or not at all: refused if truncated,
    /// corrupted, of another version or of another engine than the one
    /// that answered; kept until the engine's first answer otherwise.
    /// Reference mode checks the bytes and keeps nothing.
    pub fn load_summary(&self, bytes: &[u8], now: u64) -> Result<(), SummaryError> {
        let learned = summary::decode(bytes)?;
        let (result, grants) = self.policy.adopt(learned, now);
        self.hand_over(grants);
        result
    }
}
