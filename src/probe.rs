//! The engine probes the gate asks before admitting a turn under pressure.

pub use crate::core::working_set::EngineCapacity;
use crate::core::working_set::KvTier;
pub use crate::core::ProbeAnswer;

/// Answers the gate's two questions about the engine.
///
/// In production both are RPCs to the engine (vLLM UTILITY calls): they may
/// be slow, they run on the acquiring thread, possibly on many threads at
/// once, and never while the gate holds a lock, so a probe may itself call
/// back into the gate. `None` means "unavailable"; so does any value that is
/// NaN, infinite or outside `[0, 1]` (the gate counts those separately as
/// invalid answers).
pub trait Probe: Send + Sync {
    /// Fraction of the engine's KV blocks in use (vLLM's `kv_cache_usage`),
    /// as seen by the replica serving `session`. In working-set mode, with
    /// the capacity known, a gate told neither prompt ids nor cached
    /// tokens learns from it what the turns in flight share (the blocks
    /// they hold against their prompts): it must be the engine's own
    /// figure, not a stand-in.
    fn kv_cache_usage(&self, session: &[u8]) -> Option<f64>;

    /// Fraction of `prompt` whose KV blocks are resident in the prefix cache
    /// of the replica serving `session` (longest cached prefix / prompt length).
    fn prefix_hit_ratio(&self, session: &[u8], prompt: &[u32]) -> Option<f64>;

    /// The KV capacity of the replica serving `session`: tokens
    /// (`num_gpu_blocks × block_size`), block size, and the prefill
    /// throughput the engine measured (0 for any it does not know).
    /// An engine that offloads KV to host memory adds its tier
    /// ([`EngineCapacity::with_tier`]); an answer without one keeps the
    /// tier told before. Working-set admission asks it with every usage
    /// probe; without it, the capacity is estimated from usage answers.
    /// Reference mode ignores it. The default says nothing.
    fn kv_cache_capacity(&self, session: &[u8]) -> Option<EngineCapacity> {
        let _ = session;
        None
    }
}

impl<P: Probe + ?Sized> Probe for std::sync::Arc<P> {
    fn kv_cache_usage(&self, session: &[u8]) -> Option<f64> {
        (**self).kv_cache_usage(session)
    }

    fn prefix_hit_ratio(&self, session: &[u8], prompt: &[u32]) -> Option<f64> {
        (**self).prefix_hit_ratio(session, prompt)
    }

    fn kv_cache_capacity(&self, session: &[u8]) -> Option<EngineCapacity> {
        (**self).kv_cache_capacity(session)
    }
}

/// The engine's probes as a gate holds them: a Rust host's [`Probe`], or
/// the C ABI's probes, which may also speak of a host tier. Crate-internal,
/// so that [`Probe`] keeps the one way a Rust host tells its tier (with
/// the capacity, [`EngineCapacity::with_tier`]).
pub(crate) trait EngineProbe: Send + Sync {
    /// [`Probe::kv_cache_usage`].
    fn kv_cache_usage(&self, session: &[u8]) -> Option<f64>;
    /// [`Probe::prefix_hit_ratio`].
    fn prefix_hit_ratio(&self, session: &[u8], prompt: &[u32]) -> Option<f64>;
    /// [`Probe::kv_cache_capacity`].
    fn kv_cache_capacity(&self, session: &[u8]) -> Option<EngineCapacity>;
    /// The engine's host tier, asked right after the capacity, from a
    /// probe that speaks of tiers: the tier as the host told it, unchecked
    /// (`Some(None)`: the engine has none). `None`: this probe never
    /// speaks of tiers.
    fn kv_tier(&self, session: &[u8]) -> Option<Option<KvTier>> {
        let _ = session;
        None
    }
}

impl<P: Probe + ?Sized> EngineProbe for P {
    fn kv_cache_usage(&self, session: &[u8]) -> Option<f64> {
        Probe::kv_cache_usage(self, session)
    }

    fn prefix_hit_ratio(&self, session: &[u8], prompt: &[u32]) -> Option<f64> {
        Probe::prefix_hit_ratio(self, session, prompt)
    }

    fn kv_cache_capacity(&self, session: &[u8]) -> Option<EngineCapacity> {
        Probe::kv_cache_capacity(self, session)
    }
}
