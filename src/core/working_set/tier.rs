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
//! Sessions parked in the tier are a stage of the lifecycle (module
//! `lifecycle`), listed in the tier's eviction order (module `roster`).

use super::capacity::Capacity;
use super::types::{EngineCapacity, KvTier, TierError, TurnReport};

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
    fn checked_tier_cached(&self) -> Option<u64> {
        let t = self.tier_cached_tokens?;
        check_tier_hits(self.cached_tokens, t).ok().map(|()| t)
    }
}

/// What was counted of what the host told: answers and reports refused
/// ([`TierError`]), and the cached tokens reports said the tier served.
#[derive(Debug, Default)]
pub(super) struct TierTold {
    pub(super) refused: u64,
    pub(super) tier_cached: u64,
}

impl TierTold {
    /// Counts a turn report's tier hits, or its refusal.
    pub(super) fn report(&mut self, report: &TurnReport) {
        match report.checked_tier_cached() {
            Some(t) => self.tier_cached += t,
            None if report.tier_cached_tokens.is_some() => self.refused += 1,
            None => {}
        }
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

/// Checks an engine answer against what the gate knew from earlier
/// answers (`known`). `says_tier`: the answer speaks of a tier (an answer
/// that does not keeps the tier known).
pub(super) fn check_answer(
    engine: &EngineCapacity,
    says_tier: bool,
    known: &Capacity,
) -> Result<(), TierError> {
    let cache = if engine.tokens > 0 {
        engine.tokens
    } else {
        known.engine_tokens()
    };
    let tier = match (engine.tier, known.tier()) {
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
    use super::super::{Tuning, Verdict, WorkingSet};
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

    /// 1000 tokens of GPU cache in blocks of 1, prefilled at 1000 tokens/s
    /// (refill window 1 s), and a tier of `tier` tokens copied back at
    /// 10,000 tokens/s (a tenth of a second for the whole cache).
    fn tiered(tier: u64) -> WorkingSet<&'static str> {
        let mut ws = WorkingSet::new(Tuning::default());
        let engine = EngineCapacity::new(1000, 1, 1000.0)
            .with_tier(KvTier::new(tier, 10_000.0).unwrap())
            .unwrap();
        ws.set_engine(engine).unwrap();
        ws
    }

    const S: u64 = 1_000_000_000;
    const MS: u64 = S / 1000;

    fn done(ws: &mut WorkingSet<&'static str>, key: &'static str, prompt: u64, now: u64) {
        ws.release(&key, prompt, TurnReport::new(Some(0), Some(0)), 0, now);
    }

    #[test]
    fn with_a_tier_a_window_is_the_time_to_copy_the_cache_back() {
        let mut ws = tiered(3000);
        assert_eq!(ws.window_ns(), 100 * MS);
        ws.request(&"a", 600, 0);
        ws.request(&"b", 300, 0);
        assert_eq!(ws.request(&"c", 300, 0), Verdict::Wait);
        done(&mut ws, "a", 600, 10 * MS);
        // a's place is held for 0.1 s, not the refill window's 1 s.
        assert_eq!(ws.next_deadline(), Some(110 * MS));
        let mut out = Vec::new();
        ws.admit_waiting(110 * MS, &mut out);
        assert_eq!(out, vec![("c", Verdict::Fits)]);
        assert_eq!(ws.stats().tier_parked_tokens, 600);
        // Without a tier the same member keeps its place for a second.
        let mut plain: WorkingSet<&str> = WorkingSet::new(Tuning::default());
        plain
            .set_engine(EngineCapacity::new(1000, 1, 1000.0))
            .unwrap();
        assert_eq!(plain.window_ns(), S);
    }

    #[test]
    fn a_session_parked_in_the_tier_goes_before_newcomers() {
        let mut ws = tiered(3000);
        ws.request(&"a", 500, 0);
        ws.request(&"b", 500, 0);
        done(&mut ws, "a", 500, 0);
        let mut out = Vec::new();
        ws.admit_waiting(100 * MS, &mut out); // a parked in the tier
        assert_eq!(ws.request(&"new", 600, 200 * MS), Verdict::Wait);
        // a grew: it no longer fits beside b either.
        assert_eq!(ws.request(&"a", 550, 300 * MS), Verdict::Wait);
        // b's turn ends and its window passes: the cache is free, and a
        // takes it though the newcomer queued first.
        done(&mut ws, "b", 500, 300 * MS);
        ws.admit_waiting(400 * MS, &mut out);
        assert_eq!(out, vec![("a", Verdict::Empty)]);
        assert!(ws.is_waiting(&"new"));
    }

    #[test]
    fn a_parked_session_the_tier_outgrew_comes_back_as_a_newcomer() {
        let mut ws = tiered(1200);
        ws.request(&"a", 400, 0);
        ws.request(&"b", 400, 0);
        done(&mut ws, "a", 400, 0);
        let mut out = Vec::new();
        ws.admit_waiting(100 * MS, &mut out);
        assert_eq!(ws.stats().tier_parked_tokens, 400);
        // b grows to 900: with a, more than the tier holds, and a is the
        // least recently used.
        done(&mut ws, "b", 400, 60 * MS);
        assert_eq!(ws.request(&"b", 900, 100 * MS), Verdict::Member);
        done(&mut ws, "b", 900, 150 * MS);
        assert_eq!(ws.stats().tier_parked_tokens, 0);
        // b alone fits the tier: its own window stays the copy's.
        assert_eq!(ws.window_ns(), 100 * MS);
        // a, no longer parked there, is a newcomer: a session parked in the
        // tier since goes before it.
        ws.admit_waiting(250 * MS, &mut out); // b parked in the tier
        assert_eq!(ws.request(&"a", 400, 260 * MS), Verdict::Empty);
        assert_eq!(ws.request(&"b", 950, 270 * MS), Verdict::Wait);
        assert_eq!(ws.request(&"c", 100, 280 * MS), Verdict::Wait);
        done(&mut ws, "a", 400, 300 * MS);
        out.clear();
        ws.admit_waiting(400 * MS, &mut out);
        assert_eq!(out.first(), Some(&("b", Verdict::Empty)));
    }

    #[test]
    fn the_blocks_of_an_ended_session_push_older_parked_sessions_out() {
        let mut ws = tiered(1200);
        for k in ["a", "b", "c"] {
            ws.request(&k, 300, 0);
        }
        done(&mut ws, "a", 300, 0);
        let mut out = Vec::new();
        ws.admit_waiting(100 * MS, &mut out); // a parked in the tier
        done(&mut ws, "b", 300, 120 * MS);
        ws.finish(&"b", 150 * MS); // b's blocks stay in the tier, newer than a's
        assert_eq!(ws.stats().tier_parked_tokens, 300);
        // c grows to 700: c and a alone would fit the tier (1,000), but with
        // b's blocks they do not, and a's are the least recently used.
        done(&mut ws, "c", 700, 160 * MS);
        assert_eq!(ws.stats().tier_parked_tokens, 0);
    }

    #[test]
    fn a_session_parked_with_no_tokens_of_its_own_still_goes_first() {
        let mut ws = tiered(3000);
        // a's first turn finds its whole prompt cached: all of it is the
        // shared prefix, and a has no tokens of its own.
        ws.request(&"a", 400, 0);
        ws.release(&"a", 400, TurnReport::new(Some(400), Some(0)), 0, 0);
        ws.request(&"b", 900, 0);
        let mut out = Vec::new();
        ws.admit_waiting(100 * MS, &mut out); // a parked in the tier
        assert_eq!(ws.stats().tier_parked_tokens, 0);
        // A newcomer waits for room; a, asking after it, fits and goes first.
        assert_eq!(ws.request(&"new", 1000, 200 * MS), Verdict::Wait);
        assert_eq!(ws.request(&"a", 450, 300 * MS), Verdict::Fits);
    }
}
