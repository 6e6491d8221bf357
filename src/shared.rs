//! What every clone of a [`Gate`](crate::Gate) and every [`Lease`](crate::Lease)
//! it hands out share: the core, the host's probes and the clock.

use crate::clock::Clock;
use crate::core::{Core, LeaseToken};
use crate::probe::{EngineCapacity, Probe};
use crate::watch::DeadlineWatch;
use crate::{KvTier, TurnReport};

/// The state behind a gate, kept alive by its clones, its leases and the C
/// ABI's event-loop attempts.
pub(crate) struct Shared {
    pub(crate) core: Core,
    pub(crate) watch: DeadlineWatch,
    pub(crate) probe: Box<dyn Probe>,
    /// The C ABI's tier probe (`kvgate_config_set_tier_probe`), asked
    /// right after the capacity probe.
    pub(crate) tier_probe: Option<Box<dyn TierProbe>>,
    pub(crate) clock: Box<dyn Clock>,
}

/// A probe of the engine's host tier, asked after the capacity probe: the
/// tier as the host told it, unchecked (`None`: the engine has none). Only
/// the C ABI has one; a Rust host tells its tier with the capacity
/// ([`EngineCapacity::with_tier`]).
pub(crate) trait TierProbe: Send + Sync {
    fn kv_tier(&self, session: &[u8]) -> Option<KvTier>;
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
    /// With a tier probe, the tier comes with the capacity and the answer
    /// speaks of tiers (the `bool`): "none" after a tier was told is
    /// refused where the answer is recorded, and the whole answer ignored
    /// there, so the gate keeps what it knew.
    pub(crate) fn probe_capacity(&self, session: &[u8]) -> (Option<EngineCapacity>, bool) {
        if !self.core.wants_capacity() || self.core.is_closed() {
            return (None, false);
        }
        let capacity = self.probe.kv_cache_capacity(session);
        match &self.tier_probe {
            // Not asked once the capacity probe closed (or freed) the gate.
            Some(tier_probe) if !self.core.is_closed() => {
                let tier = tier_probe.kv_tier(session);
                let answer = EngineCapacity {
                    tier,
                    ..capacity.unwrap_or_default()
                };
                (Some(answer), true)
            }
            _ => (capacity, false),
        }
    }
}
