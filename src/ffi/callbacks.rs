//! The host's probes, given as C function pointers and a `void *user_data`,
//! seen by the gate as one probe (a [`Probe`] that may also speak of a
//! host tier).

use std::ffi::c_void;

use crate::probe::EngineProbe;
use crate::{EngineCapacity, KvTier};

/// The usage probe (NULL: always unavailable). Asks the engine for its
/// KV-cache usage as seen by the replica serving a session: writes a
/// fraction in [0, 1] to `*out_usage` and returns true, or returns false
/// when the answer is unavailable.
///
/// `session_id` points to `session_id_len` bytes (not NUL-terminated) valid
/// only during the call. Called on the thread inside `kvgate_acquire`,
/// possibly on many threads at once, never while the gate holds a lock (so
/// it may call back into the gate). An answer that is NaN, infinite,
/// negative or above 1 counts as unavailable. Must not unwind (no C++
/// exception may escape it) or `longjmp` out.
pub type kvgate_usage_fn = Option<
    unsafe extern "C" fn(
        user_data: *mut c_void,
        session_id: *const u8,
        session_id_len: usize,
        out_usage: *mut f64,
    ) -> bool,
>;

/// The prefix probe (NULL: always unavailable). Asks the engine which
/// fraction of a prompt is resident in its prefix cache (longest cached
/// prefix / prompt length): writes it to `*out_hit_ratio` and returns true,
/// or returns false when unavailable.
///
/// `prompt_ids` points to `prompt_len` token ids, valid only during the
/// call (it may be a dangling non-NULL pointer when `prompt_len` is 0).
/// Threading, re-entrancy and answer rules are those of `kvgate_usage_fn`.
pub type kvgate_prefix_fn = Option<
    unsafe extern "C" fn(
        user_data: *mut c_void,
        session_id: *const u8,
        session_id_len: usize,
        prompt_ids: *const u32,
        prompt_len: usize,
        out_hit_ratio: *mut f64,
    ) -> bool,
>;

/// The host's probes as the configuration builder holds them
/// (`kvgate_config_set_probes`). Not a C struct: probes are set one setter
/// at a time, so a new probe (the engine's KV capacity, say) is a new
/// setter and no struct a host compiled against changes.
/// Asks the engine serving `session_id` for its KV capacity: writes the
/// capacity in tokens (vLLM: `num_gpu_blocks × block_size`) to
/// `*out_tokens`, the tokens per block to `*out_block_tokens`, and the
/// prefill throughput it typically measures, in tokens per second, to
/// `*out_prefill_tokens_per_sec` (0 for any figure it does not know), and
/// returns true; returns false if it cannot say. The typical rate, not the
/// best: `kvgate_vllm` answers the median of its recent steps that were
/// mostly prefill (the best of them made the refill window too short on
/// the CPU engine: 1.066x the best fixed cap against 0.996x). A host that
/// cannot tell the rate should report each turn's cached tokens at release
/// (`kvgate_release_with_report`): the gate then measures a rate from them;
/// with neither it keeps a 2 s refill window whatever the engine (README,
/// "Simulator": `decode-heavy` 1.22x the best cap against 0.94x).
/// Working-set admission asks it right after every usage probe (unless
/// the gate was closed or freed meanwhile, e.g. by the usage probe);
/// reference mode never calls it. Same threading and `user_data` contract
/// as `kvgate_usage_fn`.
pub type kvgate_capacity_fn = Option<
    unsafe extern "C" fn(
        user_data: *mut c_void,
        session_id: *const u8,
        session_id_len: usize,
        out_tokens: *mut u64,
        out_block_tokens: *mut u32,
        out_prefill_tokens_per_sec: *mut f64,
    ) -> bool,
>;

/// The tier probe (`kvgate_config_set_tier_probe`; NULL: the engine has
/// no host tier). Asks the engine serving `session_id` for its host tier of
/// KV (vLLM's `--kv-offloading-size`, LMCache, SGLang's HiCache): writes
/// the tokens of KV the tier holds to `*out_tier_tokens` and the tokens per
/// second the engine copies back from it into GPU memory to
/// `*out_reload_tokens_per_sec`, and returns true. Returning false, or
/// true with `*out_tier_tokens` 0, says the engine has no tier.
///
/// Asked right after the capacity probe (with every usage probe, in
/// working-set mode only; not once the gate was closed or freed meanwhile,
/// e.g. by the capacity probe). Same threading and `user_data` contract as
/// `kvgate_usage_fn`.
///
/// A tier is part of the engine's configuration. Nobody can be told of a
/// refused answer here, so an answer the gate refuses is ignored whole
/// (the capacity answered with it too, as if the engine had not answered:
/// the gate keeps the capacity and tier it knew) and counted in
/// `kvgate_stats.working_set_refused_answers`. Refused: a reload rate that
/// is not finite and > 0; a tier smaller than the GPU capacity (this
/// answer's, or the one known); no tier after a tier was told.
pub type kvgate_tier_fn = Option<
    unsafe extern "C" fn(
        user_data: *mut c_void,
        session_id: *const u8,
        session_id_len: usize,
        out_tier_tokens: *mut u64,
        out_reload_tokens_per_sec: *mut f64,
    ) -> bool,
>;

#[derive(Debug, Clone, Copy)]
pub(crate) struct ProbeFns {
    pub(crate) usage: kvgate_usage_fn,
    pub(crate) prefix: kvgate_prefix_fn,
    pub(crate) capacity: kvgate_capacity_fn,
    pub(crate) tier: kvgate_tier_fn,
    pub(crate) user_data: *mut c_void,
}

impl Default for ProbeFns {
    fn default() -> Self {
        Self {
            usage: None,
            prefix: None,
            capacity: None,
            tier: None,
            user_data: std::ptr::null_mut(),
        }
    }
}

/// [`ProbeFns`] as the probe the gate calls from any thread: a
/// [`Probe`](crate::Probe) that speaks of a host tier when the host set a
/// tier probe.
#[derive(Debug)]
pub(crate) struct CProbes(ProbeFns);

impl CProbes {
    pub(crate) fn new(probes: ProbeFns) -> Self {
        Self(probes)
    }
}

// SAFETY: the pointers are only passed back to the host's functions, which
// the header requires to be callable from any thread at once with this
// `user_data` until `kvgate_free` returns (and `kvgate_free` waits for every
// call in progress). Rust never dereferences `user_data`.
unsafe impl Send for CProbes {}
// SAFETY: as for `Send`: `&CProbes` only hands the pointers to those functions.
unsafe impl Sync for CProbes {}

impl EngineProbe for CProbes {
    fn kv_cache_usage(&self, session: &[u8]) -> Option<f64> {
        let usage = self.0.usage?;
        // Written NaN first: a probe that says true but writes nothing is invalid.
        let mut out = f64::NAN;
        // SAFETY: the host's function with its own `user_data`, a session
        // slice valid for the call and a writable `f64` (the header's contract).
        let ok = unsafe { usage(self.0.user_data, session.as_ptr(), session.len(), &mut out) };
        ok.then_some(out) // NaN or out of [0, 1]: the core counts it as invalid
    }

    fn prefix_hit_ratio(&self, session: &[u8], prompt: &[u32]) -> Option<f64> {
        let prefix = self.0.prefix?;
        let mut out = f64::NAN;
        // SAFETY: as in `kv_cache_usage`, plus a prompt slice valid for the call.
        let ok = unsafe {
            prefix(
                self.0.user_data,
                session.as_ptr(),
                session.len(),
                prompt.as_ptr(),
                prompt.len(),
                &mut out,
            )
        };
        ok.then_some(out)
    }

    fn kv_cache_capacity(&self, session: &[u8]) -> Option<EngineCapacity> {
        let capacity = self.0.capacity?;
        let (mut tokens, mut block, mut rate) = (0u64, 0u32, 0f64);
        // SAFETY: the host's function with its own `user_data`, a session
        // slice valid for the call and three writable outputs (the header's contract).
        let ok = unsafe {
            capacity(
                self.0.user_data,
                session.as_ptr(),
                session.len(),
                &mut tokens,
                &mut block,
                &mut rate,
            )
        };
        // A NaN, negative or infinite rate is "unknown" (`EngineCapacity::new`).
        ok.then(|| EngineCapacity::new(tokens, block, rate))
    }

    fn kv_tier(&self, session: &[u8]) -> Option<Option<KvTier>> {
        let tier = self.0.tier?;
        let (mut tokens, mut rate) = (0u64, f64::NAN);
        // SAFETY: the host's function with its own `user_data`, a session
        // slice valid for the call and two writable outputs (the header's contract).
        let ok = unsafe {
            tier(
                self.0.user_data,
                session.as_ptr(),
                session.len(),
                &mut tokens,
                &mut rate,
            )
        };
        // Unchecked on purpose: the gate checks the tier against what it
        // knows where it records the answer, and counts a refusal
        // (`WorkingSet::set_engine_answer`).
        Some((ok && tokens > 0).then_some(KvTier {
            tokens,
            reload_tokens_per_sec: rate,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    unsafe extern "C" fn usage_from_user_data(
        user_data: *mut c_void,
        _session: *const u8,
        len: usize,
        out: *mut f64,
    ) -> bool {
        // SAFETY: the test passes a live f64 as user_data and the gate a writable out.
        unsafe {
            *out = *user_data.cast::<f64>() + len as f64;
        }
        true
    }

    unsafe extern "C" fn prefix_says_true_writes_nothing(
        _user_data: *mut c_void,
        _session: *const u8,
        _len: usize,
        _prompt: *const u32,
        _prompt_len: usize,
        _out: *mut f64,
    ) -> bool {
        true
    }

    #[test]
    fn answers_reach_the_gate_and_silence_is_nan() {
        let mut base = 0.25f64;
        let probes = CProbes::new(ProbeFns {
            usage: Some(usage_from_user_data),
            prefix: Some(prefix_says_true_writes_nothing),
            capacity: None,
            tier: None,
            user_data: (&mut base as *mut f64).cast(),
        });
        assert_eq!(probes.kv_cache_usage(b"ab"), Some(2.25));
        assert!(probes.prefix_hit_ratio(b"ab", &[1, 2]).unwrap().is_nan());
        let none = CProbes::new(ProbeFns::default());
        assert_eq!(none.kv_cache_usage(b"x"), None);
        assert_eq!(none.prefix_hit_ratio(b"x", &[]), None);
    }
}
