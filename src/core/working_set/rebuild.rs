//! What re-prefilling a session's history costs the engine.
//!
//! A prefill chunk of `n` tokens over `c` cached ones does the linear
//! layers' work for `n` tokens and attends `n·c + n(n+1)/2` query-key
//! pairs. Re-prefilling `own` tokens of history after a cached prefix of
//! `p` tokens (the shared system prompt), in whatever chunks, therefore
//! costs
//!
//! ```text
//! T = a·own + b·(own·p + own·(own + 1)/2)
//! ```
//!
//! with `a` the engine's time per prefilled token and `b` its time per
//! attended pair. The second term is why a long history is dearer per token
//! than a short one: on an H200 an 8B model re-prefills 10k tokens at about
//! 1.1× the linear figure and 100k at about 4×. What the wait bound's
//! parks may spend (module `rotation_budget`) and what running every
//! session cold would serve (module `holding`) are priced with `T`; the
//! refill window is not (module docs of the working set).
//!
//! The host tells `a` and `b` with the capacity answer
//! ([`EngineCapacity::with_rebuild_cost`](super::EngineCapacity::with_rebuild_cost)), as the vLLM plugin fits them to
//! the engine's own steps. Where the engine also measures its prefill rate
//! `r`, `a = 1/r`: a rebuild runs in the engine's batches like any prefill,
//! and `r` is what prefill costs in them. A host that tells no cost gets
//! `a` the same way and `b` learned from the turns
//! ([`LearnedPairCost`]): the fastest turns at each context length bound
//! what a token costs there, and how that bound grows with the context is
//! `b`. A slow turn (a busy engine, a long output) never raises it.

use std::fmt;

/// The engine's cost of prefilling: seconds per token and per attended
/// query-key pair. Built only by [`RebuildCost::new`], which refuses terms
/// that would make a rebuild free of its length or negative.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RebuildCost {
    secs_per_token: f64,
    secs_per_pair: f64,
}

/// Why a rebuild cost was refused. The gate keeps what it knew before.
#[derive(Debug, Clone, Copy, PartialEq)]
#[non_exhaustive]
pub enum CostError {
    /// The per-token term is not a finite number above zero.
    PerToken(f64),
    /// The per-pair term is not a finite number at or above zero.
    PerPair(f64),
}

impl fmt::Display for CostError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::PerToken(v) => write!(
                f,
                "the rebuild cost per prefilled token must be finite and > 0 seconds, not {v}"
            ),
            Self::PerPair(v) => write!(
                f,
                "the rebuild cost per attended pair must be finite and >= 0 seconds, not {v}"
            ),
        }
    }
}

impl std::error::Error for CostError {}

impl RebuildCost {
    /// `secs_per_token`: the engine's time per prefilled token (the linear
    /// layers, and a step's fixed cost spread over a full chunk);
    /// `secs_per_pair`: its time per query-key pair attended (and any cost
    /// per context token read, divided by the chunk size: a chunk reads its
    /// whole context once). Refuses a per-token term that is not finite
    /// and positive, or a per-pair term that is negative or not finite.
    pub fn new(secs_per_token: f64, secs_per_pair: f64) -> Result<Self, CostError> {
        if !(secs_per_token.is_finite() && secs_per_token > 0.0) {
            return Err(CostError::PerToken(secs_per_token));
        }
        if !(secs_per_pair.is_finite() && secs_per_pair >= 0.0) {
            return Err(CostError::PerPair(secs_per_pair));
        }
        Ok(Self {
            secs_per_token,
            secs_per_pair,
        })
    }

    /// Seconds per prefilled token.
    pub fn secs_per_token(&self) -> f64 {
        self.secs_per_token
    }

    /// Seconds per attended query-key pair.
    pub fn secs_per_pair(&self) -> f64 {
        self.secs_per_pair
    }

    /// Seconds to prefill `own` tokens after `prefix` cached ones.
    pub fn secs(&self, prefix: u64, own: u64) -> f64 {
        self.secs_per_token * own as f64 + self.secs_per_pair * pairs(prefix, own)
    }
}

/// Query-key pairs attended by `own` new tokens after `prefix` cached ones.
pub(super) fn pairs(prefix: u64, own: u64) -> f64 {
    let (p, n) = (prefix as f64, own as f64);
    n * p + n * (n + 1.0) / 2.0
}

/// The per-pair term learned from turns, for a host that tells no cost.
///
/// A turn that prefilled `u` tokens after `c` cached ones in `d` seconds
/// spent at most `d / u` a token on a prefill whose tokens attend, on
/// average, `x = c + (u + 1) / 2` keys: `d / u ≥ a + b·x`, with the gap
/// the turn's queueing and decoding. The least `d / u` seen at each scale
/// of `x` (a power of two) is the lower envelope of those bounds, which
/// the busiest turns never raise; the slope of a least-squares line through
/// the envelope's points is `b`. Until two scales have been seen, or while
/// the slope is not positive, `b` is 0 and a rebuild is priced linearly.
#[derive(Debug)]
pub(super) struct LearnedPairCost {
    /// Per scale of `x` (bucket `i` holds `x` in `[2^i, 2^(i+1))`): the
    /// least seconds a token seen, and the `x` it was seen at.
    envelope: [Option<(f64, f64)>; SCALES],
    secs_per_pair: f64,
}

/// Scales of attended keys per token tracked: up to 2^40.
const SCALES: usize = 41;

impl Default for LearnedPairCost {
    fn default() -> Self {
        Self {
            envelope: [None; SCALES],
            secs_per_pair: 0.0,
        }
    }
}

impl LearnedPairCost {
    /// A turn prefilled `uncached` tokens after `cached` ones in `secs`.
    pub(super) fn turn(&mut self, cached: u64, uncached: u64, secs: f64) {
        if uncached == 0 || !(secs.is_finite() && secs > 0.0) {
            return;
        }
        let per_token = secs / uncached as f64;
        let x = cached as f64 + (uncached as f64 + 1.0) / 2.0;
        let scale = (x.log2().floor() as usize).min(SCALES - 1);
        match &mut self.envelope[scale] {
            Some((least, _)) if *least <= per_token => return,
            slot => *slot = Some((per_token, x)),
        }
        self.secs_per_pair = self.slope();
    }

    /// The least-squares slope of seconds a token over keys attended, 0
    /// unless positive and from two scales or more.
    fn slope(&self) -> f64 {
        // (keys attended, seconds a token) of each scale seen; a release asks
        // this, so it allocates nothing.
        let points = || self.envelope.iter().flatten().map(|&(y, x)| (x, y));
        let n = points().count();
        if n < 2 {
            return 0.0;
        }
        let n = n as f64;
        let mx = points().map(|p| p.0).sum::<f64>() / n;
        let my = points().map(|p| p.1).sum::<f64>() / n;
        let sxx: f64 = points().map(|p| (p.0 - mx).powi(2)).sum();
        let sxy: f64 = points().map(|p| (p.0 - mx) * (p.1 - my)).sum();
        if sxx <= 0.0 {
            return 0.0;
        }
        (sxy / sxx).max(0.0)
    }

    /// Seconds per attended pair (0 while unknown).
    pub(super) fn secs_per_pair(&self) -> f64 {
        self.secs_per_pair
    }

    /// The envelope's points, for a saved summary: (scale, seconds a
    /// token, keys attended).
    pub(super) fn envelope(&self) -> Vec<(u8, f64, f64)> {
        (0..SCALES)
            .filter_map(|i| self.envelope[i].map(|(y, x)| (i as u8, y, x)))
            .collect()
    }

    /// The cost learned from an envelope [`LearnedPairCost::envelope`]
    /// gave; points at a scale out of range are ignored.
    pub(super) fn from_envelope(points: &[(u8, f64, f64)]) -> Self {
        let mut cost = Self::default();
        for &(i, y, x) in points {
            if let Some(slot) = cost.envelope.get_mut(usize::from(i)) {
                *slot = Some((y, x));
            }
        }
        cost.secs_per_pair = cost.slope();
        cost
    }
}

/// Scales of the per-pair cost's envelope: a summary's parser refuses more.
pub(super) const PAIR_SCALES: usize = SCALES;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_long_history_costs_more_per_token_than_a_short_one() {
        // The H200's fit: 25.9 us a token, 0.00152 us a pair.
        let c = RebuildCost::new(25.9e-6, 1.52e-9).unwrap();
        let short = c.secs(0, 10_000) / 10_000.0;
        let long = c.secs(0, 100_000) / 100_000.0;
        assert!(short / 25.9e-6 < 1.35, "10k: {}", short / 25.9e-6);
        assert!(long / 25.9e-6 > 3.5, "100k: {}", long / 25.9e-6);
        // The prefix it attends over counts too.
        assert!(c.secs(50_000, 1000) > c.secs(0, 1000) * 3.0);
    }

    #[test]
    fn terms_that_are_not_finite_or_negative_are_refused() {
        assert_eq!(RebuildCost::new(0.0, 0.0), Err(CostError::PerToken(0.0)));
        assert_eq!(
            RebuildCost::new(-1e-6, 0.0),
            Err(CostError::PerToken(-1e-6))
        );
        assert!(matches!(
            RebuildCost::new(f64::NAN, 0.0),
            Err(CostError::PerToken(_))
        ));
        assert_eq!(
            RebuildCost::new(1e-6, f64::INFINITY),
            Err(CostError::PerPair(f64::INFINITY))
        );
        assert_eq!(
            RebuildCost::new(1e-6, -1e-9),
            Err(CostError::PerPair(-1e-9))
        );
        assert!(RebuildCost::new(1e-6, 0.0).is_ok());
        let msg = CostError::PerPair(-1e-9).to_string();
        assert!(msg.contains("per attended pair"), "{msg}");
    }

    #[test]
    fn the_learned_pair_cost_follows_the_fastest_turns_at_each_context() {
        let mut l = LearnedPairCost::default();
        assert_eq!(l.secs_per_pair(), 0.0);
        let (a, b) = (25.9e-6, 1.52e-9);
        let exact = |c: u64, u: u64| a * u as f64 + b * pairs(c, u);
        // One context length says nothing of the slope.
        l.turn(1000, 2000, exact(1000, 2000));
        assert_eq!(l.secs_per_pair(), 0.0);
        // Slow turns (queued, decoding) at longer contexts: an upper bound.
        l.turn(40_000, 2000, exact(40_000, 2000) + 3.0);
        let loose = l.secs_per_pair();
        assert!(loose > b * 10.0, "{loose}");
        // Faster turns there replace them; slower ones never count.
        l.turn(40_000, 2000, exact(40_000, 2000));
        l.turn(40_000, 2000, exact(40_000, 2000) + 5.0);
        l.turn(100_000, 1000, exact(100_000, 1000));
        let learned = l.secs_per_pair();
        assert!((learned - b).abs() < b * 0.01, "{learned} against {b}");
        // Nothing prefilled, or no time, teaches nothing.
        l.turn(50_000, 0, 3.0);
        l.turn(50_000, 10, 0.0);
        assert_eq!(l.secs_per_pair(), learned);
    }
}
