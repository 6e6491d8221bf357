//! Event-loop hosts: attempts driven step by step (`kvgate_attempt_*`) and
//! the gate's timer (`kvgate_tick`); the wake descriptor or callback that
//! reaches a sleeping one (`kvgate_waker_*`) is module `waker`.
//!
//! The protocol, which is the Rust core's `Attempt` seen through handles:
//!
//! ```text
//! kvgate_attempt_begin ─▶ step
//!   PROBE_USAGE  ─ ask the engine (await it, any thread) ─▶ kvgate_attempt_answer_usage  ─▶ step
//!   PROBE_PREFIX ─ ask the engine                        ─▶ kvgate_attempt_answer_prefix ─▶ step
//!   SLEEP        ─ until the waker delivers the tag or sleep_ns pass ─▶ kvgate_attempt_wake ─▶ step
//!   ADMITTED     ─ step.admission.lease: kvgate_release it when the turn is done
//!   FAILED       ─ step.status: PREEMPTED, TIMED_OUT, CANCELLED or CLOSED
//! kvgate_attempt_end before the end: ended as PREEMPTED or TIMED_OUT (the host's outcome)
//! kvgate_attempt_free at any point (an attempt not ended is cancelled)
//! ```
//!
//! Time is the gate's own monotonic clock (`kvgate_now_ns`): timeouts, grace
//! windows and retention run exactly as for `kvgate_acquire`, which drives
//! the same machine. The gate's own deadlines (a window ending) are asked by
//! `kvgate_tick`, which the host's one timer calls.

use std::time::Duration;

use super::error::{Failure, SessionName};
use super::gate::{acquire_failure, kvgate_admission, register_lease};
use super::gate_handle::GateHandle;
use super::handles::{self, kvgate_attempt, kvgate_gate, kvgate_waker, Castable};
use super::panic::{ffi_boundary, ffi_status};
use super::status::{kvgate_reason, kvgate_status};
use super::waker::{TagNotifier, Waker};
use crate::core::{Attempt, Step, StepError};
use crate::driver::{GateCore, TurnPrompt};
use crate::sync::{Arc, Mutex};
use crate::{AcquireError, EngineCapacity, KvTier, TierError};

/// What an event-loop attempt asks its host to do next
/// (`kvgate_step.kind`).
#[repr(u32)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum kvgate_step_kind {
    /// Ask the engine for its KV-cache usage (and, for working-set
    /// admission, its capacity), then call `kvgate_attempt_answer_usage`.
    KVGATE_STEP_PROBE_USAGE = 0,
    /// Ask the engine which fraction of the prompt is resident in its prefix
    /// cache, then call `kvgate_attempt_answer_prefix` (reference mode only).
    KVGATE_STEP_PROBE_PREFIX = 1,
    /// Wait until the attempt's waker delivers its tag or `sleep_ns` pass,
    /// whichever comes first, then call `kvgate_attempt_wake`. In
    /// working-set mode a woken attempt decides without asking the engine
    /// again: the step after a wake is admitted, asleep or failed.
    KVGATE_STEP_SLEEP = 2,
    /// Admitted: `admission` holds the lease, to `kvgate_release` (or
    /// `kvgate_release_with_report`) once the engine is done with the turn.
    /// The attempt has ended.
    KVGATE_STEP_ADMITTED = 3,
    /// Ended without a lease: `status` says why (`KVGATE_PREEMPTED`,
    /// `KVGATE_TIMED_OUT`, `KVGATE_CANCELLED`, `KVGATE_CLOSED`). The call
    /// that returned this step succeeded (`KVGATE_OK`), so it sets no
    /// `kvgate_last_error`; `kvgate_status_str(status)` names the reason.
    KVGATE_STEP_FAILED = 4,
}

/// The next step of an event-loop attempt.
///
/// This struct never changes layout: new figures come with new functions.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct kvgate_step {
    /// What to do next.
    pub kind: kvgate_step_kind,
    /// `KVGATE_STEP_FAILED`: why the attempt ended. `KVGATE_OK` otherwise.
    pub status: kvgate_status,
    /// `KVGATE_STEP_SLEEP`: the latest time to call `kvgate_attempt_wake`,
    /// on the gate's clock (`kvgate_now_ns`). 0 otherwise.
    pub until_ns: u64,
    /// `KVGATE_STEP_SLEEP`: `until_ns` minus the time the step was made
    /// (what a relative timer wants). 0 otherwise.
    pub sleep_ns: u64,
    /// `KVGATE_STEP_ADMITTED`: the admission and its lease. Otherwise all
    /// zero (`lease` is `KVGATE_NO_LEASE`).
    pub admission: kvgate_admission,
}

const NO_ADMISSION: kvgate_admission = kvgate_admission {
    lease: super::gate::KVGATE_NO_LEASE,
    reason: kvgate_reason::KVGATE_REASON_OPEN,
    wait_sec: 0.0,
    usage: 0.0,
    hit_ratio: 0.0,
    retain_session: false,
    waited: false,
};

impl kvgate_step {
    fn of(kind: kvgate_step_kind) -> Self {
        Self {
            kind,
            status: kvgate_status::KVGATE_OK,
            until_ns: 0,
            sleep_ns: 0,
            admission: NO_ADMISSION,
        }
    }

    fn failed(status: kvgate_status) -> Self {
        Self {
            status,
            ..Self::of(kvgate_step_kind::KVGATE_STEP_FAILED)
        }
    }
}

/// The payload of a `kvgate_attempt *`.
#[derive(Debug)]
pub(crate) struct AttemptHandle {
    /// Keeps the gate's memory and its lease registry alive while the
    /// attempt lives (even past `kvgate_free`: the attempt then fails with
    /// `KVGATE_CLOSED`).
    gate: Arc<GateHandle>,
    /// One step at a time: a probe answer may come from any thread.
    attempt: Mutex<Attempt<GateCore>>,
    timeout_ms: i64,
}

impl Castable for kvgate_attempt {
    type Rust = AttemptHandle;
}

impl AttemptHandle {
    /// Runs one step of the attempt and turns its outcome into a C step:
    /// an answer the step refused (the outer `Err`, whatever the attempt's
    /// step) changed nothing.
    fn step(
        &self,
        function: &'static str,
        f: impl FnOnce(&mut Attempt<GateCore>, u64) -> Result<Result<Step, StepError>, TierError>,
    ) -> Result<kvgate_step, Failure> {
        let mut attempt = self.attempt.lock();
        let now = self.gate.gate.now_ns();
        let step = f(&mut attempt, now)
            .map_err(|err| Failure::invalid(err.to_string()))?
            .map_err(|err| out_of_order(function, &attempt, err))?;
        Ok(self.c_step(attempt.session_id(), step, now))
    }

    fn c_step(&self, session: &[u8], step: Step, now: u64) -> kvgate_step {
        match step {
            Step::ProbeUsage => kvgate_step::of(kvgate_step_kind::KVGATE_STEP_PROBE_USAGE),
            Step::ProbePrefix => kvgate_step::of(kvgate_step_kind::KVGATE_STEP_PROBE_PREFIX),
            Step::Sleep { until_ns } => kvgate_step {
                until_ns,
                sleep_ns: until_ns.saturating_sub(now),
                ..kvgate_step::of(kvgate_step_kind::KVGATE_STEP_SLEEP)
            },
            Step::Admitted(token) => match register_lease(&self.gate, session, token) {
                Ok(admission) => kvgate_step {
                    admission,
                    ..kvgate_step::of(kvgate_step_kind::KVGATE_STEP_ADMITTED)
                },
                // The gate was freed meanwhile: the lease is already released.
                Err(failure) => kvgate_step::failed(failure.status),
            },
            Step::Failed(err) => {
                kvgate_step::failed(acquire_failure(err, session, self.timeout_ms).status)
            }
        }
    }
}

/// The message for a step the attempt did not ask for, in the C names.
fn out_of_order(function: &'static str, attempt: &Attempt<GateCore>, err: StepError) -> Failure {
    let session = SessionName(attempt.session_id());
    let message = match err {
        StepError::OutOfOrder { expected, .. } => format!(
            "the attempt of session {session} does not wait for {function}: it waits for {}",
            c_name(expected)
        ),
        _ => format!(
            "the attempt of session {session} has ended (admitted, failed or cancelled): \
             it takes no more steps"
        ),
    };
    Failure::new(kvgate_status::KVGATE_OUT_OF_ORDER, message)
}

/// The C function that answers what the core's attempt waits for.
fn c_name(step: &str) -> &'static str {
    match step {
        "on_usage" => "kvgate_attempt_answer_usage (its step is KVGATE_STEP_PROBE_USAGE)",
        "on_prefix" => "kvgate_attempt_answer_prefix (its step is KVGATE_STEP_PROBE_PREFIX)",
        "on_wake" => "kvgate_attempt_wake (its step is KVGATE_STEP_SLEEP)",
        _ => "nothing",
    }
}

/// A probe answer from C: NaN means unavailable.
fn answer(raw: f64) -> Option<f64> {
    (!raw.is_nan()).then_some(raw)
}

/// Begins an attempt to admit a turn of session `session_id` whose prompt
/// has `prompt_len` tokens, driven by the host step by step (an event loop:
/// nothing blocks, no thread waits), and writes the attempt to
/// `*out_attempt` and its first step to `*out_step`.
///
/// The same decision as `kvgate_acquire`, with the same `timeout_ms`
/// (`< 0` no limit, `0` one pass then `KVGATE_TIMED_OUT` instead of a sleep,
/// `> 0` milliseconds on the gate's clock), preemption by a newer attempt of
/// the session, `kvgate_cancel_session`, and stats. The difference: the
/// gate's probe callbacks are not called; the host answers each probe step
/// itself, whenever the answer arrives, from any thread. While the attempt
/// sleeps, `waker` delivers `tag` when it has something to look at.
///
/// A host that has the prompt's token ids should pass them with
/// `kvgate_attempt_begin_with_prompt`: given only the length, working-set
/// admission cannot see from the prompts what sessions share (it then
/// learns it from cached-token reports, or from the usage answers).
///
/// On `KVGATE_OK`, the caller owns `*out_attempt` and frees it once with
/// `kvgate_attempt_free` (after its end, or to abandon it). Any step may
/// come first, `KVGATE_STEP_ADMITTED` and `KVGATE_STEP_FAILED` included.
///
/// Returns `KVGATE_CLOSED` (nothing written) if the gate is closed, and
/// `KVGATE_INVALID_ARGUMENT` for a NULL `gate`, `waker`, `out_attempt` or
/// `out_step`, or a NULL `session_id` with a non-zero length.
///
/// # Safety
/// `gate` is NULL or a live gate (see `kvgate_free`); `session_id` holds
/// `session_id_len` bytes if not NULL; `waker` is NULL or a live waker;
/// the out-pointers are NULL or writable.
#[unsafe(no_mangle)]
#[allow(clippy::too_many_arguments)] // the C signature: one value per argument
pub unsafe extern "C" fn kvgate_attempt_begin(
    gate: *mut kvgate_gate,
    session_id: *const u8,
    session_id_len: usize,
    prompt_len: usize,
    timeout_ms: i64,
    waker: *const kvgate_waker,
    tag: u64,
    out_attempt: *mut *mut kvgate_attempt,
    out_step: *mut kvgate_step,
) -> kvgate_status {
    ffi_status("kvgate_attempt_begin", || {
        // SAFETY: pointer contracts forwarded (caller).
        let args = unsafe {
            BeginArgs::new(
                gate,
                session_id,
                session_id_len,
                waker,
                out_attempt,
                out_step,
            )?
        };
        begin(args, TurnPrompt::Length(prompt_len), timeout_ms, tag)
    })
}

/// `kvgate_attempt_begin` with the prompt's token ids instead of its length
/// (`prompt_len` of them at `prompt_ids`, read during the call only): the
/// gate keeps a few of them per session (a sketch, not the prompt), to see
/// how far each turn's prompt begins like the session's last one.
/// Working-set admission compares sessions' first prompts, which shows the
/// prefix they share (a system prompt, tool definitions) to a host whose
/// engine reports no cached tokens.
///
/// Statuses as `kvgate_attempt_begin`, and `KVGATE_INVALID_ARGUMENT` for a
/// NULL `prompt_ids` with a non-zero `prompt_len` or a misaligned one.
///
/// # Safety
/// As `kvgate_attempt_begin`; `prompt_ids` holds `prompt_len` token ids if
/// not NULL.
#[unsafe(no_mangle)]
#[allow(clippy::too_many_arguments)] // the C signature: one value per argument
pub unsafe extern "C" fn kvgate_attempt_begin_with_prompt(
    gate: *mut kvgate_gate,
    session_id: *const u8,
    session_id_len: usize,
    prompt_ids: *const u32,
    prompt_len: usize,
    timeout_ms: i64,
    waker: *const kvgate_waker,
    tag: u64,
    out_attempt: *mut *mut kvgate_attempt,
    out_step: *mut kvgate_step,
) -> kvgate_status {
    ffi_status("kvgate_attempt_begin_with_prompt", || {
        // SAFETY: pointer contracts forwarded (caller).
        let (args, prompt) = unsafe {
            (
                BeginArgs::new(
                    gate,
                    session_id,
                    session_id_len,
                    waker,
                    out_attempt,
                    out_step,
                )?,
                handles::slice_arg(prompt_ids, prompt_len, "prompt_ids", "prompt_len")?,
            )
        };
        begin(args, TurnPrompt::Tokens(prompt), timeout_ms, tag)
    })
}

/// The checked arguments both begin calls share.
struct BeginArgs<'a> {
    gate: Arc<GateHandle>,
    session: &'a [u8],
    waker: Arc<Waker>,
    out_attempt: handles::Out<'a, *mut kvgate_attempt>,
    out_step: handles::Out<'a, kvgate_step>,
}

impl<'a> BeginArgs<'a> {
    /// # Safety
    /// The pointer contracts of `kvgate_attempt_begin`.
    unsafe fn new(
        gate: *mut kvgate_gate,
        session_id: *const u8,
        session_id_len: usize,
        waker: *const kvgate_waker,
        out_attempt: *mut *mut kvgate_attempt,
        out_step: *mut kvgate_step,
    ) -> Result<Self, Failure> {
        // SAFETY: pointer contracts forwarded (caller).
        unsafe {
            Ok(Self {
                gate: handles::gate_clone(gate, "gate")?,
                session: handles::session_arg(session_id, session_id_len)?,
                waker: handles::waker_clone(waker)?,
                out_attempt: handles::out_arg(out_attempt, "out_attempt")?,
                out_step: handles::out_arg(out_step, "out_step")?,
            })
        }
    }
}

fn begin(
    args: BeginArgs<'_>,
    prompt: TurnPrompt<'_>,
    timeout_ms: i64,
    tag: u64,
) -> Result<(), Failure> {
    let BeginArgs {
        gate: gate_handle,
        session,
        waker,
        out_attempt,
        out_step,
    } = args;
    let timeout = u64::try_from(timeout_ms).ok().map(Duration::from_millis);
    let notifier = Box::new(TagNotifier { waker, tag });
    let (mut attempt, now) = gate_handle
        .gate
        .begin_attempt(session, prompt, timeout, notifier)
        .map_err(|err| acquire_failure(err, session, timeout_ms))?;
    let first = attempt
        .start(now)
        .expect("a new attempt waits for its start");
    let handle = AttemptHandle {
        gate: gate_handle,
        attempt: Mutex::new(attempt),
        timeout_ms,
    };
    let step = handle.c_step(session, first, now);
    out_step.write(step);
    out_attempt.write(handles::attempt_into_raw(Box::new(handle)));
    Ok(())
}

/// Answers a `KVGATE_STEP_PROBE_USAGE` step: the engine's KV-cache usage in
/// [0, 1] (NaN when unavailable; out of range counts as unavailable), and
/// for working-set admission its capacity as `kvgate_capacity_fn` answers
/// it (tokens, tokens per block, measured prefill tokens per second; 0 for any
/// figure unknown, all three 0 when the engine cannot say). Writes the next
/// step to `*out_step`.
///
/// Returns `KVGATE_OUT_OF_ORDER` if the attempt's step is not
/// `KVGATE_STEP_PROBE_USAGE` (nothing changes), `KVGATE_INVALID_ARGUMENT`
/// for a NULL pointer. Thread-safe (steps of one attempt are serialised).
///
/// It says nothing of a host tier: a tier told earlier (by
/// `kvgate_attempt_answer_usage_tiered` or the tier probe) is kept. A host
/// whose engine may have a tier answers with
/// `kvgate_attempt_answer_usage_tiered`, which also catches a tier that
/// disappears.
///
/// # Safety
/// `attempt` is NULL or a live attempt; `out_step` is NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kvgate_attempt_answer_usage(
    attempt: *mut kvgate_attempt,
    usage: f64,
    capacity_tokens: u64,
    block_tokens: u32,
    prefill_tokens_per_sec: f64,
    out_step: *mut kvgate_step,
) -> kvgate_status {
    // `new` already turns an invalid rate into 0, the "unknown" figure.
    let capacity = EngineCapacity::new(capacity_tokens, block_tokens, prefill_tokens_per_sec);
    let capacity = (capacity != EngineCapacity::default()).then_some(capacity);
    // SAFETY: forwarded (caller).
    unsafe {
        drive(
            "kvgate_attempt_answer_usage",
            attempt,
            out_step,
            |a, now| Ok(a.on_cache_state(answer(usage), capacity, now)),
        )
    }
}

/// `kvgate_attempt_answer_usage` from a host that speaks of host tiers of
/// KV (vLLM's `--kv-offloading-size`, LMCache, SGLang's HiCache): with the
/// capacity, the engine's tier as `kvgate_tier_fn` answers it, its tokens
/// (`tier_tokens`, 0: the engine has no tier) and the tokens per second the
/// engine copies back from it into GPU memory (`reload_tokens_per_sec`,
/// read only with a tier). All of `capacity_tokens`, `block_tokens`,
/// `prefill_tokens_per_sec` and `tier_tokens` 0 means the engine cannot
/// say: the answer then says nothing of a tier either, like
/// `kvgate_attempt_answer_usage` (which keeps the tier told earlier).
///
/// Refused with `KVGATE_INVALID_ARGUMENT` (`kvgate_last_error` says why):
/// a reload rate that is not finite and > 0 with a tier; a tier smaller
/// than the GPU capacity (this answer's, or the one the gate knows); no
/// tier (`tier_tokens` 0 with some other figure) after a tier was told: a
/// tier is part of the engine's configuration. A refused answer changes
/// nothing: the attempt stays at its `KVGATE_STEP_PROBE_USAGE` step, so the
/// host answers again, `*out_step` is not written, the gate keeps what it
/// knew. The refusal is counted in
/// `kvgate_stats.working_set_refused_answers` (working-set mode; reference
/// mode, which reads no capacity, refuses only an answer inconsistent in
/// itself, and counts nothing).
///
/// Other statuses as `kvgate_attempt_answer_usage`; an answer that is
/// refused is refused whatever the attempt's step.
///
/// # Safety
/// `attempt` is NULL or a live attempt; `out_step` is NULL or writable.
#[unsafe(no_mangle)]
#[allow(clippy::too_many_arguments)] // the C signature: one value per argument
pub unsafe extern "C" fn kvgate_attempt_answer_usage_tiered(
    attempt: *mut kvgate_attempt,
    usage: f64,
    capacity_tokens: u64,
    block_tokens: u32,
    prefill_tokens_per_sec: f64,
    tier_tokens: u64,
    reload_tokens_per_sec: f64,
    out_step: *mut kvgate_step,
) -> kvgate_status {
    let function = "kvgate_attempt_answer_usage_tiered";
    let capacity = EngineCapacity::new(capacity_tokens, block_tokens, prefill_tokens_per_sec);
    // `Ok(None)`: the engine cannot say. Else the answer as the figures
    // make it (`Err`: refused in itself), which the step checks against
    // what the gate knew where it records it ("no tier" after a tier too).
    let answer: Result<Option<EngineCapacity>, TierError> = if tier_tokens == 0 {
        Ok((capacity != EngineCapacity::default()).then_some(capacity))
    } else {
        KvTier::new(tier_tokens, reload_tokens_per_sec)
            .and_then(|tier| capacity.with_tier(tier))
            .map(Some)
    };
    // SAFETY: forwarded (caller).
    unsafe {
        drive(function, attempt, out_step, |a, now| {
            a.on_told_answers(self::answer(usage), answer, now)
        })
    }
}

/// Answers a `KVGATE_STEP_PROBE_PREFIX` step: the fraction of the prompt
/// resident in the engine's prefix cache (NaN when unavailable). Writes the
/// next step to `*out_step`. Statuses as `kvgate_attempt_answer_usage`.
///
/// # Safety
/// `attempt` is NULL or a live attempt; `out_step` is NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kvgate_attempt_answer_prefix(
    attempt: *mut kvgate_attempt,
    hit_ratio: f64,
    out_step: *mut kvgate_step,
) -> kvgate_status {
    // SAFETY: forwarded (caller).
    unsafe {
        drive(
            "kvgate_attempt_answer_prefix",
            attempt,
            out_step,
            |a, now| Ok(a.on_prefix(answer(hit_ratio), now)),
        )
    }
}

/// After a `KVGATE_STEP_SLEEP` step: the waker delivered the attempt's tag,
/// or `until_ns` passed (calling it earlier, spuriously, is harmless: the
/// attempt sleeps again). Writes the next step to `*out_step`. Statuses as
/// `kvgate_attempt_answer_usage`.
///
/// # Safety
/// `attempt` is NULL or a live attempt; `out_step` is NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kvgate_attempt_wake(
    attempt: *mut kvgate_attempt,
    out_step: *mut kvgate_step,
) -> kvgate_status {
    // SAFETY: forwarded (caller).
    unsafe {
        drive("kvgate_attempt_wake", attempt, out_step, |a, now| {
            Ok(a.on_wake(now))
        })
    }
}

/// The body the step exports share: both pointers checked, one step
/// of the attempt, the next step written to `*out_step`.
///
/// # Safety
/// `attempt` is NULL or a live attempt; `out_step` is NULL or writable.
unsafe fn drive(
    function: &'static str,
    attempt: *mut kvgate_attempt,
    out_step: *mut kvgate_step,
    f: impl FnOnce(&mut Attempt<GateCore>, u64) -> Result<Result<Step, StepError>, TierError>,
) -> kvgate_status {
    ffi_status(function, || {
        // SAFETY: forwarded (caller).
        let (handle, out) = unsafe {
            (
                handles::attempt_ref(attempt)?,
                handles::out_arg(out_step, "out_step")?,
            )
        };
        out.write(handle.step(function, f)?);
        Ok(())
    })
}

/// Cancels the attempt if it has not ended (counted as cancelled, like
/// `kvgate_cancel_session`): it leaves the queue, gives back any capacity it
/// was handed, and takes no more steps (`KVGATE_OUT_OF_ORDER`). A no-op on
/// an ended attempt. Use it when the host gives up on the turn (a client
/// disconnected, an asyncio task was cancelled). Thread-safe.
///
/// Returns `KVGATE_INVALID_ARGUMENT` for a NULL `attempt`.
///
/// # Safety
/// `attempt` is NULL or a live attempt.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kvgate_attempt_cancel(attempt: *mut kvgate_attempt) -> kvgate_status {
    ffi_status("kvgate_attempt_cancel", || {
        // SAFETY: forwarded (caller).
        let handle = unsafe { handles::attempt_ref(attempt) }?;
        let now = handle.gate.gate.now_ns();
        handle.attempt.lock().abandon(now);
        Ok(())
    })
}

/// Ends an attempt that has not ended (its host waits on a probe answer,
/// or it sleeps) with the outcome its host saw, counted under it in the
/// attempts-failed stats: `KVGATE_PREEMPTED` (the host preempted it: a newer
/// retry of the session won; also the session's `num_preempted`) or
/// `KVGATE_TIMED_OUT` (a probe hung past the attempt's timeout). It leaves
/// the queue, gives back any capacity it was handed, and takes no more
/// steps, exactly as after `kvgate_attempt_cancel`. If a newer attempt of
/// the session or `kvgate_cancel_session` ended it first, that outcome is
/// the one counted. Thread-safe.
///
/// `why` is a `kvgate_status` value passed as a plain `uint32_t`, so that
/// any value is safe to pass. Returns `KVGATE_INVALID_ARGUMENT` for a NULL
/// `attempt` or any other `why` (nothing changes), and `KVGATE_OUT_OF_ORDER`
/// once the attempt has ended (admitted, failed, cancelled or ended here;
/// nothing changes).
///
/// # Safety
/// `attempt` is NULL or a live attempt.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kvgate_attempt_end(
    attempt: *mut kvgate_attempt,
    why: u32,
) -> kvgate_status {
    ffi_status("kvgate_attempt_end", || {
        // SAFETY: forwarded (caller).
        let handle = unsafe { handles::attempt_ref(attempt) }?;
        let why = match why {
            w if w == kvgate_status::KVGATE_PREEMPTED as u32 => AcquireError::Preempted,
            w if w == kvgate_status::KVGATE_TIMED_OUT as u32 => AcquireError::TimedOut,
            other => {
                return Err(Failure::invalid(format!(
                    "kvgate_attempt_end: why must be KVGATE_PREEMPTED (1) or \
                     KVGATE_TIMED_OUT (2), not {other}"
                )))
            }
        };
        let mut attempt = handle.attempt.lock();
        let now = handle.gate.gate.now_ns();
        match attempt.end(why, now) {
            Ok(_) => Ok(()),
            Err(err) => Err(out_of_order("kvgate_attempt_end", &attempt, err)),
        }
    })
}

/// Frees an attempt, cancelling it first if it has not ended. NULL is a
/// no-op. A lease it was admitted with stays valid (release it as usual).
///
/// # Safety
/// `attempt` is NULL or a live attempt, freed once, with no other call on
/// it in progress.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kvgate_attempt_free(attempt: *mut kvgate_attempt) {
    ffi_boundary("kvgate_attempt_free", || {
        // SAFETY: NULL or the host's attempt, handed back once (caller).
        if let Some(handle) = unsafe { handles::attempt_take(attempt) } {
            let now = handle.gate.gate.now_ns();
            handle.attempt.lock().abandon(now);
        }
    })
}

/// The gate's clock, in nanoseconds: the time base of `kvgate_step.until_ns`
/// and `kvgate_tick`. Monotonic; its origin is unspecified.
///
/// Returns `KVGATE_INVALID_ARGUMENT` for a NULL argument.
///
/// # Safety
/// `gate` is NULL or a live gate (see `kvgate_free`); `out_now_ns` is NULL
/// or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kvgate_now_ns(
    gate: *mut kvgate_gate,
    out_now_ns: *mut u64,
) -> kvgate_status {
    ffi_status("kvgate_now_ns", || {
        // SAFETY: forwarded (caller).
        let (handle, out) = unsafe {
            (
                handles::gate_ref(gate, "gate")?,
                handles::out_arg(out_now_ns, "out_now_ns")?,
            )
        };
        out.write(handle.gate.now_ns());
        Ok(())
    })
}

/// The gate's timer, for an event loop: fires what is due now (a window
/// that ended wakes a waiting attempt through its waker) and writes when to
/// call it next: `*out_until_ns` on the gate's clock and `*out_sleep_ns`
/// from now, both `UINT64_MAX` when nothing is pending.
///
/// A loop keeps one timer per gate at that time, and looks again after
/// each `kvgate_waker_drain` and each `kvgate_release` it makes (either may
/// move the deadline earlier). Sleeping attempts have their own
/// `until_ns`. Hosts whose only attempts are blocking `kvgate_acquire`
/// calls never need it. Thread-safe.
///
/// Returns `KVGATE_INVALID_ARGUMENT` for a NULL argument.
///
/// # Safety
/// `gate` is NULL or a live gate (see `kvgate_free`); the out-pointers are
/// NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kvgate_tick(
    gate: *mut kvgate_gate,
    out_until_ns: *mut u64,
    out_sleep_ns: *mut u64,
) -> kvgate_status {
    ffi_status("kvgate_tick", || {
        // SAFETY: forwarded (caller).
        let (handle, until, sleep) = unsafe {
            (
                handles::gate_ref(gate, "gate")?,
                handles::out_arg(out_until_ns, "out_until_ns")?,
                handles::out_arg(out_sleep_ns, "out_sleep_ns")?,
            )
        };
        match handle.gate.tick() {
            Some(at) => {
                until.write(at);
                sleep.write(at.saturating_sub(handle.gate.now_ns()));
            }
            None => {
                until.write(u64::MAX);
                sleep.write(u64::MAX);
            }
        }
        Ok(())
    })
}

/// For the loom models (`tests/loom_event_loop.rs`): whether the waker's
/// bell is rung, i.e. whether a poll of its descriptor would report it
/// readable. Not part of the C ABI (a model cannot poll a descriptor).
///
/// # Safety
/// `waker` is a live waker.
#[cfg(loom)]
#[doc(hidden)]
pub unsafe fn waker_is_rung_for_models(waker: *const kvgate_waker) -> bool {
    // SAFETY: forwarded (caller).
    unsafe { handles::waker_ref(waker) }.is_ok_and(|w| w.is_rung())
}
