//! What every clone of a [`Gate`](crate::Gate) and every [`Lease`](crate::Lease)
//! it hands out share: the core, the host's probes and the clock.

use crate::clock::Clock;
use crate::core::{Core, LeaseToken};
use crate::probe::{EngineCapacity, EngineProbe};
use crate::watch::DeadlineWatch;
use crate::TurnReport;

/// The state behind a gate, kept alive by its clones, its leases and the C
/// ABI's event-loop attempts.
pub(crate) struct Shared {
    pub(crate) core: Core,
    pub(crate) watch: DeadlineWatch,
    pub(crate) probe: Box<dyn EngineProbe>,
    pub(crate) clock: Box<dyn Clock>,
}

impl Shared {
    pub(crate) fn release(&self, token: LeaseToken, report: TurnReport) {
        self.core.release_with(token, report, self.clock.now_ns());
    }

    /// The capacity probe's answer that goes with a usage answer just
    /// received, or `None` without asking it: reference mode never asks it
    /// (its table has no use for it), and neither does an attempt whose
    /// gate closed meanwhile, e.g. from inside the usage probe (a C host
    /// may even have freed the gate there, and the probes' `user_data`
    /// with it: after that no probe may be called again). The attempt then
    /// fails `Closed` on the answer without asking anything more.
    ///
    /// From a probe that speaks of tiers (the C ABI's with a tier probe),
    /// the tier comes with the capacity and the answer speaks of tiers (the
    /// `bool`): "none" after a tier was told is refused where the answer is
    /// recorded, and the whole answer ignored there, so the gate keeps what
    /// it knew.
    pub(crate) fn probe_capacity(&self, session: &[u8]) -> (Option<EngineCapacity>, bool) {
        if !self.core.wants_capacity() || self.core.is_closed() {
            return (None, false);
        }
        let capacity = self.probe.kv_cache_capacity(session);
        // The tier is not asked once the capacity probe closed (or freed) the gate.
        if !self.core.is_closed() {
            if let Some(tier) = self.probe.kv_tier(session) {
                let answer = EngineCapacity {
                    tier,
                    ..capacity.unwrap_or_default()
                };
                return (Some(answer), true);
            }
        }
        (capacity, false)
    }
}
