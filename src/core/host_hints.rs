//! What a host tells the core beside an attempt's steps (issue 51):
//! the engine's `max_model_len`, a session's budget, and a saved summary
//! of what the working set learned. Each is stored by the working set
//! (`working_set::hints`, `working_set::learned`); reference mode, which
//! reads no capacity and learns nothing, checks them and keeps nothing.

use super::sessions::SessionKey;
use super::summary::{self, SummaryError};
use super::working_set::{Budget, EngineCapacity, HintError};
use super::Core;

impl Core {
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
