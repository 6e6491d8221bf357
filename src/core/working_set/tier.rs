//! A second tier of KV behind the engine's GPU cache: host memory (vLLM's
//! native offloading, LMCache, SGLang's HiCache) that keeps a copy of each
//! block the engine computed, so a session whose blocks left GPU memory
//! comes back by a copy instead of a recomputation.
//!
//! The host tells the tier with the capacity answer ([`KvTier`] in
//! [`EngineCapacity::with_tier`]) and, per turn, how many of the turn's
//! cached tokens the tier served ([`TurnReport::with_tier_cached`]). Input
//! that would make the gate overcommit is refused here, before it reaches
//! the policy: a tier smaller than the GPU cache (with write-through, the
//! tier holds a copy of everything the GPU does), a reload rate that is not
//! a finite positive number, tier hits larger than the turn's cached tokens.

use std::fmt;

use super::{EngineCapacity, TurnReport};

/// The engine's host tier: its size and how fast it copies KV back.
#[derive(Debug, Clone, Copy, PartialEq)]
#[non_exhaustive]
pub struct KvTier {
    /// Tokens of KV the tier holds (vLLM: `kv_offloading_size` bytes over
    /// the model's KV bytes per token).
    pub tokens: u64,
    /// Tokens of KV per second the engine copies from the tier back into
    /// GPU memory (host-to-device bandwidth over KV bytes per token).
    pub reload_tokens_per_sec: f64,
}

impl KvTier {
    /// A tier of `tokens` tokens that reloads `reload_tokens_per_sec`.
    /// Refuses an empty tier and a rate that is not finite and positive.
    pub fn new(tokens: u64, reload_tokens_per_sec: f64) -> Result<Self, TierError> {
        if tokens == 0 {
            return Err(TierError::Empty);
        }
        if !(reload_tokens_per_sec.is_finite() && reload_tokens_per_sec > 0.0) {
            return Err(TierError::ReloadRate(reload_tokens_per_sec));
        }
        Ok(Self {
            tokens,
            reload_tokens_per_sec,
        })
    }

    /// Refuses a tier whose fields were set past [`KvTier::new`].
    pub(super) fn check(&self) -> Result<(), TierError> {
        Self::new(self.tokens, self.reload_tokens_per_sec).map(|_| ())
    }
}

/// Why a tier figure was refused. The gate keeps what it knew before.
#[derive(Debug, Clone, Copy, PartialEq)]
#[non_exhaustive]
pub enum TierError {
    /// A tier of no tokens: a host without a tier tells none.
    Empty,
    /// The reload rate is zero, negative or not finite.
    ReloadRate(f64),
    /// The tier holds fewer tokens than the GPU cache: with write-through
    /// it keeps a copy of every GPU block, so it cannot be smaller.
    SmallerThanCache {
        /// The tier's tokens.
        tier_tokens: u64,
        /// The GPU cache's tokens.
        cache_tokens: u64,
    },
    /// An engine that told a tier answered without one: a tier is part of
    /// the engine's configuration, fixed while it runs.
    Disappeared,
    /// A turn's report says the tier served more tokens than the turn found
    /// cached at all (or tier hits without the cached tokens).
    TierHitsOverCached {
        /// Tokens the report says came from the tier.
        tier_cached: u64,
        /// The turn's cached tokens (0 when the report does not say).
        cached: u64,
    },
}

impl fmt::Display for TierError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Empty => write!(f, "a KV tier of 0 tokens (a host without a tier tells none)"),
            Self::ReloadRate(r) => {
                write!(f, "the KV tier's reload rate must be finite and > 0 tokens/s, not {r}")
            }
            Self::SmallerThanCache {
                tier_tokens,
                cache_tokens,
            } => write!(
                f,
                "the KV tier ({tier_tokens} tokens) is smaller than the GPU cache ({cache_tokens} tokens)"
            ),
            Self::Disappeared => write!(
                f,
                "the engine told a KV tier before and none now (a tier is fixed while the engine runs)"
            ),
            Self::TierHitsOverCached {
                tier_cached,
                cached,
            } => write!(
                f,
                "the turn's tier hits ({tier_cached} tokens) exceed its cached tokens ({cached})"
            ),
        }
    }
}

impl std::error::Error for TierError {}

impl EngineCapacity {
    /// This answer with the engine's host tier. Refuses a tier smaller
    /// than the GPU capacity it comes with.
    pub fn with_tier(mut self, tier: KvTier) -> Result<Self, TierError> {
        tier.check()?;
        if tier.tokens < self.tokens {
            return Err(TierError::SmallerThanCache {
                tier_tokens: tier.tokens,
                cache_tokens: self.tokens,
            });
        }
        self.tier = Some(tier);
        Ok(self)
    }
}

impl TurnReport {
    /// This report, saying that `tier_cached` of its cached tokens came
    /// from the host tier (the rest from GPU memory). Refuses more than
    /// the report's cached tokens, or any when those are unknown.
    pub fn with_tier_cached(mut self, tier_cached: u64) -> Result<Self, TierError> {
        check_tier_hits(self.cached_tokens, tier_cached)?;
        self.tier_cached_tokens = Some(tier_cached);
        Ok(self)
    }

    /// The tier hits of a report whose fields may have been set by hand:
    /// `None` when it says none or says more than its cached tokens.
    pub(super) fn checked_tier_cached(&self) -> Option<u64> {
        let t = self.tier_cached_tokens?;
        check_tier_hits(self.cached_tokens, t).ok().map(|()| t)
    }
}

fn check_tier_hits(cached: Option<u64>, tier_cached: u64) -> Result<(), TierError> {
    match cached {
        Some(c) if tier_cached <= c => Ok(()),
        _ => Err(TierError::TierHitsOverCached {
            tier_cached,
            cached: cached.unwrap_or(0),
        }),
    }
}

/// Checks an engine answer against what the gate knew: `known_cache` and
/// `known_tier` from earlier answers. `says_tier`: the answer speaks of a
/// tier (an answer that does not keeps the tier known).
pub(super) fn check_answer(
    engine: &EngineCapacity,
    says_tier: bool,
    known_cache: u64,
    known_tier: Option<KvTier>,
) -> Result<(), TierError> {
    let cache = if engine.tokens > 0 {
        engine.tokens
    } else {
        known_cache
    };
    let tier = match (engine.tier, known_tier) {
        (Some(t), _) => {
            t.check()?;
            t
        }
        (None, Some(_)) if says_tier => return Err(TierError::Disappeared),
        (None, Some(t)) => t,
        (None, None) => return Ok(()),
    };
    if tier.tokens < cache {
        return Err(TierError::SmallerThanCache {
            tier_tokens: tier.tokens,
            cache_tokens: cache,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::super::{Tuning, WorkingSet};
    use super::*;

    #[test]
    fn bad_tiers_are_refused_when_built() {
        assert_eq!(KvTier::new(0, 1.0), Err(TierError::Empty));
        for rate in [0.0, -1.0, f64::NAN, f64::INFINITY] {
            assert!(matches!(
                KvTier::new(10, rate),
                Err(TierError::ReloadRate(_))
            ));
        }
        let tier = KvTier::new(999, 1e5).unwrap();
        assert_eq!(
            EngineCapacity::new(1000, 16, 1e4).with_tier(tier),
            Err(TierError::SmallerThanCache {
                tier_tokens: 999,
                cache_tokens: 1000
            })
        );
        let ok = EngineCapacity::new(1000, 16, 1e4)
            .with_tier(KvTier::new(1000, 1e5).unwrap())
            .unwrap();
        assert_eq!(ok.tier.map(|t| t.tokens), Some(1000));
    }

    #[test]
    fn tier_hits_over_the_cached_tokens_are_refused() {
        let r = TurnReport::new(Some(100), None);
        assert_eq!(
            r.with_tier_cached(100).unwrap().tier_cached_tokens,
            Some(100)
        );
        assert!(r.with_tier_cached(101).is_err());
        assert!(TurnReport::new(None, Some(5)).with_tier_cached(1).is_err());
        // Set by hand past the check: read as no tier hits.
        let mut forged = r;
        forged.tier_cached_tokens = Some(500);
        assert_eq!(forged.checked_tier_cached(), None);
    }

    #[test]
    fn the_working_set_keeps_its_tier_against_inconsistent_answers() {
        let mut ws: WorkingSet<u32> = WorkingSet::new(Tuning::default());
        let tiered = EngineCapacity::new(1000, 16, 1e4)
            .with_tier(KvTier::new(4000, 1e5).unwrap())
            .unwrap();
        ws.set_engine(tiered).unwrap();
        // An answer that says nothing of a tier keeps it.
        ws.set_engine(EngineCapacity::new(1000, 16, 1e4)).unwrap();
        assert_eq!(ws.tier().map(|t| t.tokens), Some(4000));
        // One that speaks of tiers and tells none is refused.
        let plain = EngineCapacity::new(1000, 16, 1e4);
        assert_eq!(ws.check_engine(&plain, true), Err(TierError::Disappeared));
        // A GPU cache grown past the tier is refused, and changes nothing.
        let mut bigger = EngineCapacity::new(5000, 16, 1e4);
        assert!(ws.set_engine(bigger).is_err());
        // So is a tier forged past `with_tier`.
        bigger.tokens = 1000;
        bigger.tier = Some(KvTier {
            tokens: 10,
            reload_tokens_per_sec: 1.0,
        });
        assert!(ws.set_engine(bigger).is_err());
        let s = ws.stats();
        assert_eq!(
            (s.capacity_tokens, s.tier_tokens, s.refused_answers),
            (1000, 4000, 2)
        );
    }
}
