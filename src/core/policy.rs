//! The two admission policies, one of which a core runs (the config's
//! `admission`).

use super::ledger::Ledger;
use super::reference::Thresholds;

/// The admission policy in force.
// One per core, so the variants' sizes do not matter; boxing the ledger
// would only add a pointer chase to every turn.
#[allow(clippy::large_enum_variant)]
#[derive(Debug)]
pub(crate) enum Policy {
    /// The seed's decision table over the engine's usage and the prompt's
    /// resident prefix (module `reference`), with per-session grace windows
    /// kept in the session table.
    Reference(Thresholds),
    /// The working set of sessions whose histories fit the cache (module
    /// `working_set`), behind its lock; it keeps each member's place
    /// itself.
    WorkingSet(Ledger),
}

/// What the rest of the core asks of the policy in force. Only these, and
/// the decision itself (`Attempt`'s `ask_policy`), look at which it is.
impl Policy {
    /// The working set's ledger, in working-set admission; `None` under the
    /// seed's table, which keeps nothing beyond the sessions' reservations.
    pub(crate) fn ledger(&self) -> Option<&Ledger> {
        match self {
            Policy::WorkingSet(ledger) => Some(ledger),
            Policy::Reference(_) => None,
        }
    }

    /// Whether a waiter woken asks the policy again without asking the
    /// engine first: the working set's place in line and any grant handed
    /// over while it slept are the ledger's, and the members' own passes
    /// keep the engine's figures fresh.
    pub(crate) fn waiter_asks_again_unprobed(&self) -> bool {
        self.ledger().is_some()
    }

    /// Whether room is announced as a capacity event that one woken waiter
    /// takes and passes on if it does not use it (the seed's table), rather
    /// than handed over as grants by the ledger.
    pub(crate) fn passes_capacity_events(&self) -> bool {
        self.ledger().is_none()
    }

    /// Whether every admission keeps the session's place (a member of the
    /// working set), whatever its reason.
    pub(crate) fn every_admission_retains(&self) -> bool {
        self.ledger().is_some()
    }
}
