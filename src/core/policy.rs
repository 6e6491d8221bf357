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
