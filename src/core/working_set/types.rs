//! The working set's plain types: what the engine tells (its capacity,
//! its host tier, a turn's report), a session's slot, the verdict on a
//! turn, the figures for monitoring. A leaf: the parent re-exports them,
//! and the modules that check or keep the figures import them from here.

use std::fmt;

use super::rebuild::RebuildCost;

/// A session's index in `WorkingSet::sessions`: stable while the working
/// set knows the session, so the queue and the list of members between
/// turns name sessions by it.
pub(super) type Slot = usize;

/// What the engine says about its KV cache (the capacity probe).
#[derive(Debug, Clone, Copy, PartialEq, Default)]
#[non_exhaustive]
pub struct EngineCapacity {
    /// KV capacity in tokens (vLLM: `num_gpu_blocks × block_size`); 0 when unknown.
    pub tokens: u64,
    /// Tokens per KV block (vLLM's `block_size`); 0 when unknown.
    pub block_tokens: u32,
    /// The engine's typical prefill throughput (`kvgate_vllm`: the median
    /// of its recent steps that were mostly prefill), tokens per second; 0
    /// when unknown.
    pub prefill_tokens_per_sec: f64,
    /// The host tier behind the GPU cache, if the engine offloads KV
    /// ([`EngineCapacity::with_tier`]); `None` says nothing of a tier.
    pub tier: Option<KvTier>,
    /// What the engine's prefill costs ([`EngineCapacity::with_rebuild_cost`]);
    /// `None` keeps what was told before, or the estimate learned from turns.
    pub rebuild_cost: Option<RebuildCost>,
    /// The engine's longest sequence, tokens ([`EngineCapacity::with_max_model_len`]);
    /// `None` keeps what was told before.
    pub max_model_len: Option<u64>,
}

impl EngineCapacity {
    /// An answer with all three figures (0 for any that is unknown).
    pub fn new(tokens: u64, block_tokens: u32, prefill_tokens_per_sec: f64) -> Self {
        let rate = if prefill_tokens_per_sec.is_finite() && prefill_tokens_per_sec > 0.0 {
            prefill_tokens_per_sec
        } else {
            0.0
        };
        Self {
            tokens,
            block_tokens,
            prefill_tokens_per_sec: rate,
            tier: None,
            rebuild_cost: None,
            max_model_len: None,
        }
    }

    /// This answer with what the engine's prefill costs.
    pub fn with_rebuild_cost(mut self, cost: RebuildCost) -> Self {
        self.rebuild_cost = Some(cost);
        self
    }
}

/// What the host learned from the engine about one finished turn.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct TurnReport {
    /// Prompt tokens the engine served from its prefix cache (vLLM's
    /// `num_cached_tokens`), if known.
    pub cached_tokens: Option<u64>,
    /// Tokens the turn generated, if known.
    pub output_tokens: Option<u64>,
    /// Of `cached_tokens`, those the engine copied back from its host
    /// tier ([`TurnReport::with_tier_cached`]), if known.
    pub tier_cached_tokens: Option<u64>,
}

impl TurnReport {
    /// A report of what the engine measured (`None` for what is unknown).
    pub fn new(cached_tokens: Option<u64>, output_tokens: Option<u64>) -> Self {
        Self {
            cached_tokens,
            output_tokens,
            tier_cached_tokens: None,
        }
    }
}

/// The working set's answer to a turn.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// The session is a member: its window carries it in.
    Member,
    /// Its footprint fits beside the members'.
    Fits,
    /// Nobody else is in the working set (liveness).
    Empty,
    /// It waited past the wait bound, and members were parked for it.
    WaitBound,
    /// Holding sessions out does not pay now ([`holding_pays`](super::WorkingSet::holding_pays)):
    /// it goes in whether or not it fits.
    RunningColdPays,
    /// It waits in the queue.
    Wait,
}

/// Figures for monitoring.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
#[non_exhaustive]
pub struct WorkingSetStats {
    /// Sessions in the working set.
    pub members: usize,
    /// Sessions waiting to join.
    pub waiting: usize,
    /// Tokens counted now (members, the shared prefix, ghosts).
    pub load_tokens: u64,
    /// Capacity in force, tokens (0 while unknown).
    pub capacity_tokens: u64,
    /// Shared prefixes, each counted once while a member uses it, tokens.
    pub shared_prefix_tokens: u64,
    /// The refill window, ns.
    pub window_ns: u64,
    /// What re-prefilling costs the engine per token, seconds: the inverse
    /// of the prefill rate the engine measures, else the host's told term
    /// ([`RebuildCost`]; 0 while neither is known).
    pub rebuild_secs_per_token: f64,
    /// What re-prefilling costs the engine per attended query-key pair,
    /// seconds: told by the host, else learned from the turns (0: a
    /// rebuild is priced linearly).
    pub rebuild_secs_per_pair: f64,
    /// Members parked so far.
    pub parked: u64,
    /// Whether holding sessions out pays ([`holding_pays`](super::WorkingSet::holding_pays)), as
    /// last decided for a queue head.
    pub holding: bool,
    /// How many turns ahead a joining session must still fit beside the
    /// members: the turns a session runs in one refill window (1 while
    /// that is unknown).
    pub horizon_turns: u32,
    /// The engine's host tier, tokens (0: none told).
    pub tier_tokens: u64,
    /// Engine answers and turn reports whose tier figures were refused
    /// ([`TierError`]); each kept what was known before.
    pub refused_answers: u64,
    /// Cached tokens that turn reports said the host tier served, summed.
    pub tier_cached_tokens: u64,
    /// Own tokens of the sessions parked in the host tier, which come back
    /// by a copy (0 without a tier).
    pub tier_parked_tokens: u64,
    /// Saved summaries dropped at the engine's first answer because they
    /// were learned on another engine (`Gate::load_summary`).
    pub summaries_dropped: u64,
}

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
