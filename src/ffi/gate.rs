//! The gate's life and its admissions: `kvgate_new` to `kvgate_free`,
//! `kvgate_acquire` / `kvgate_release`, finishing and cancelling sessions.

use std::mem::size_of;
use std::time::Duration;

use super::callbacks::CProbes;
use super::error::{Failure, SessionName};
use super::gate_handle::GateHandle;
use super::handles::{self, kvgate_config, kvgate_gate};
use super::panic::{ffi_boundary, ffi_status};
use super::stats::kvgate_session_stats;
use super::status::{kvgate_reason, kvgate_status};
use crate::clock::MonotonicClock;
use crate::core::{Admission, LeaseToken};
use crate::sync::Arc;
use crate::{AcquireError, Gate, ReleaseError, TurnReport};

/// A lease handle no admission ever has: lease handles start above 0, so 0
/// can mark "no lease" in host data structures.
pub const KVGATE_NO_LEASE: u64 = 0;

/// What `kvgate_acquire` admitted.
///
/// This struct never changes layout: new figures come with new functions.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct kvgate_admission {
    /// The lease handle: pass it to `kvgate_release` exactly once when the
    /// engine is done with the turn. Unique within the gate, never reused,
    /// never `KVGATE_NO_LEASE`.
    pub lease: u64,
    /// Which row of the decision table admitted the turn.
    pub reason: kvgate_reason,
    /// Seconds from the start of `kvgate_acquire` to the admission.
    pub wait_sec: f64,
    /// The usage probe's answer on the deciding pass; NaN when unavailable.
    pub usage: f64,
    /// The prefix probe's answer on the deciding pass; NaN when it was not
    /// asked (usage below the watermark, or a reserved session) or was
    /// unavailable. Never carried over from an earlier pass.
    pub hit_ratio: f64,
    /// Whether the lease holds the session's place, by mode. Reference
    /// mode: the session's reservation (its ownership window), true for
    /// `KVGATE_REASON_RESERVED_SESSION` and `KVGATE_REASON_RESIDENT_PREFIX`,
    /// and counted in `kvgate_session_stats.retaining_leases`. Working-set
    /// mode: always true, the session's place in the working set (kept
    /// between turns for `working_set_window_sec`), which is not a
    /// reservation: the session's reservation figures (`retaining_leases`,
    /// `reserved`, `in_grace`) stay 0 / false in that mode.
    pub retain_session: bool,
    /// Whether the attempt slept at least once before it was admitted.
    pub waited: bool,
}

impl From<&Admission> for kvgate_admission {
    fn from(a: &Admission) -> Self {
        Self {
            lease: a.lease_id,
            reason: a.reason.into(),
            wait_sec: a.wait.as_secs_f64(),
            usage: a.usage.unwrap_or(f64::NAN),
            hit_ratio: a.hit_ratio.unwrap_or(f64::NAN),
            retain_session: a.retain_session,
            waited: a.waited,
        }
    }
}

/// Creates a gate with the builder's configuration and probes
/// (`kvgate_config_set_probes`).
///
/// `config` is copied, not consumed: free it when convenient. On
/// `KVGATE_OK`, `*out` is a new gate that the caller owns and must free
/// once with `kvgate_free`. The library spawns no thread: probes run on the
/// threads that call `kvgate_acquire`. See `kvgate_config_set_probes` for
/// what the probes and `user_data` must guarantee.
///
/// Returns `KVGATE_INVALID_ARGUMENT` for a NULL `config` or `out`.
///
/// # Safety
/// `config` is NULL or a live builder not being changed meanwhile; `out`
/// is NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kvgate_new(
    config: *const kvgate_config,
    out: *mut *mut kvgate_gate,
) -> kvgate_status {
    ffi_status("kvgate_new", || {
        // SAFETY: pointer contracts forwarded (caller).
        let config = unsafe { handles::config_ref(config, "config") }?;
        // SAFETY: as above.
        let out = unsafe { handles::out_arg(out, "out") }?;
        let gate = Gate::with_parts(
            config.config.clone(),
            Box::new(CProbes::new(config.probes)),
            Box::new(MonotonicClock::new()),
        )
        .map_err(Failure::from)?;
        out.write(handles::gate_into_raw(Arc::new(GateHandle::new(gate))));
        Ok(())
    })
}

/// Closes the gate and frees it. NULL is a no-op.
///
/// What may overlap `kvgate_free`, exactly:
/// - a `kvgate_acquire` on this gate that has *entered* the gate: its
///   thread is inside one of this gate's probe callbacks for that call, or
///   it is counted in `pending_attempts` (`kvgate_get_stats`), e.g. it is
///   waiting. It wakes (or, inside a probe, returns once the probe
///   returns) with `KVGATE_CLOSED`, and `kvgate_free` returns only after
///   every such call on another thread has returned, so afterwards no probe
///   is called again and `user_data` may be freed;
/// - `kvgate_free` called from inside a probe callback of this gate: it
///   does not wait for its own thread's `kvgate_acquire`, which returns
///   `KVGATE_CLOSED` once the callback returns.
///
/// Nothing else may: no other call on this gate may be in progress or begin
/// once `kvgate_free` has begun, and that includes a `kvgate_acquire` made
/// at about the same time, which may not have entered the gate yet (the
/// handle is invalid memory then). The robust shutdown is the usual one for
/// a C object: `kvgate_close` (thread-safe at any time: every waiting
/// attempt returns `KVGATE_CLOSED`, new ones are refused), then make sure
/// your threads have stopped calling (join them), then `kvgate_free`.
///
/// Leases still outstanding are released; their handles become invalid.
///
/// # Safety
/// `gate` is NULL or a gate from `kvgate_new` not freed yet, and only the
/// calls listed above overlap this one.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kvgate_free(gate: *mut kvgate_gate) {
    ffi_boundary("kvgate_free", || {
        // SAFETY: NULL or the host's reference, handed back once (caller).
        let Some(handle) = (unsafe { handles::gate_take(gate) }) else {
            return;
        };
        handle.shut_down(gate as usize);
        // A woken acquire on its way out may still hold a reference; the
        // memory goes with the last one.
        drop(handle);
    })
}

/// Closes the gate without freeing it: attempts in progress (waiting or
/// about to wait) return `KVGATE_CLOSED` and new `kvgate_acquire` calls are
/// refused with `KVGATE_CLOSED`. Leases already granted stay valid and must
/// still be released. Idempotent. Thread-safe.
///
/// Returns `KVGATE_INVALID_ARGUMENT` for a NULL `gate`.
///
/// # Safety
/// `gate` is NULL or a live gate (see `kvgate_free`).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kvgate_close(gate: *mut kvgate_gate) -> kvgate_status {
    ffi_status("kvgate_close", || {
        // SAFETY: forwarded (caller).
        unsafe { handles::gate_ref(gate, "gate") }?.gate.close();
        Ok(())
    })
}

/// Blocks until the turn of session `session_id` carrying `prompt_ids` is
/// admitted, then writes the admission (with its lease handle) to `*out`.
///
/// `session_id` is `session_id_len` arbitrary bytes (not NUL-terminated);
/// NULL is allowed when the length is 0. `prompt_ids` likewise (the prompt's
/// token ids, passed to the prefix probe). Both are only read during the call.
///
/// `timeout_ms < 0` waits without limit; `0` makes one pass through the
/// decision table and fails with `KVGATE_TIMED_OUT` instead of waiting;
/// `> 0` gives up after that many milliseconds. A probe answer that admits
/// is honoured even if it arrives after the deadline.
///
/// Returns `KVGATE_OK` with `*out` written, or (nothing written):
/// `KVGATE_PREEMPTED` (a newer `kvgate_acquire` of the same session began),
/// `KVGATE_TIMED_OUT`, `KVGATE_CANCELLED` (`kvgate_cancel_session`),
/// `KVGATE_CLOSED` (`kvgate_close` or `kvgate_free`), or
/// `KVGATE_INVALID_ARGUMENT` (NULL `gate` or `out`, NULL array with a
/// non-zero length, misaligned `prompt_ids`), checked before anything else.
///
/// Thread-safe; blocks the calling thread, which also runs the probes.
///
/// # Safety
/// `gate` is NULL or a live gate (see `kvgate_free`); non-NULL arrays hold
/// their stated number of elements; `out` is NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kvgate_acquire(
    gate: *mut kvgate_gate,
    session_id: *const u8,
    session_id_len: usize,
    prompt_ids: *const u32,
    prompt_len: usize,
    timeout_ms: i64,
    out: *mut kvgate_admission,
) -> kvgate_status {
    ffi_status("kvgate_acquire", || {
        // Taken as a counted reference: `kvgate_free` may begin while this
        // call sleeps, and the memory must outlive the call.
        // SAFETY: pointer contracts forwarded (caller).
        let handle = unsafe { handles::gate_clone(gate, "gate") }?;
        // SAFETY: as above.
        let (session, prompt, out) = unsafe {
            (
                handles::session_arg(session_id, session_id_len)?,
                handles::slice_arg(prompt_ids, prompt_len, "prompt_ids", "prompt_len")?,
                handles::out_arg(out, "out")?,
            )
        };
        out.write(acquire(
            &handle,
            gate as usize,
            session,
            prompt,
            timeout_ms,
        )?);
        Ok(())
    })
}

fn acquire(
    handle: &GateHandle,
    key: usize,
    session: &[u8],
    prompt: &[u32],
    timeout_ms: i64,
) -> Result<kvgate_admission, Failure> {
    let _call = handle.enter_acquire(key);
    let timeout = u64::try_from(timeout_ms).ok().map(Duration::from_millis);
    let token = handle
        .gate
        .acquire_token(session, prompt, timeout)
        .map_err(|err| acquire_failure(err, session, timeout_ms))?;
    register_lease(handle, session, token)
}

/// Files an admitted token in the lease registry under its handle, so the
/// host can release it by `kvgate_release`; if the gate was freed
/// meanwhile, releases it (nobody could ever release it again) and fails
/// with `KVGATE_CLOSED`.
pub(crate) fn register_lease(
    handle: &GateHandle,
    session: &[u8],
    token: LeaseToken,
) -> Result<kvgate_admission, Failure> {
    let admission = kvgate_admission::from(token.admission());
    debug_assert_ne!(admission.lease, KVGATE_NO_LEASE);
    handle
        .leases
        .insert(admission.lease, token)
        .map_err(|token| {
            handle.gate.release_token(token, TurnReport::default());
            Failure::new(
                kvgate_status::KVGATE_CLOSED,
                format!(
                    "the gate was freed while session {} was being admitted",
                    SessionName(session)
                ),
            )
        })?;
    Ok(admission)
}

pub(crate) fn acquire_failure(err: AcquireError, session: &[u8], timeout_ms: i64) -> Failure {
    let session = SessionName(session);
    let message = match err {
        AcquireError::Preempted => {
            format!("session {session}: preempted by a newer attempt of the same session")
        }
        AcquireError::TimedOut => {
            format!("session {session}: not admitted within timeout_ms = {timeout_ms}")
        }
        AcquireError::Cancelled => {
            format!("session {session}: cancelled by kvgate_cancel_session")
        }
        AcquireError::Closed => format!("session {session}: the gate is closed"),
        AcquireError::Released => format!(
            "session {session}: released to another replica by kvgate_release_elsewhere \
             (its cache is gone here)"
        ),
    };
    Failure::new(err.into(), message)
}

/// Releases a lease: the session's reservation (if the lease retained it)
/// turns into its idle grace window and a waiting attempt is woken. Call it
/// as soon as the engine is done with the turn (or failed), exactly once per
/// lease. Leases stay valid after `kvgate_close`.
///
/// Returns `KVGATE_UNKNOWN_LEASE` for a handle that is not outstanding
/// (already released, `KVGATE_NO_LEASE`, never issued by this gate):
/// nothing happens, so a double release is harmless. Returns
/// `KVGATE_INVALID_ARGUMENT` for a NULL `gate`. Thread-safe: a lease may be
/// released on another thread than the one that acquired it.
///
/// # Safety
/// `gate` is NULL or a live gate (see `kvgate_free`).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kvgate_release(gate: *mut kvgate_gate, lease: u64) -> kvgate_status {
    // SAFETY: forwarded (caller).
    unsafe { release_reporting("kvgate_release", gate, lease, TurnReport::default()) }
}

/// `kvgate_release` with what the engine reported of the turn: the prompt
/// tokens it served from its prefix cache (vLLM's `num_cached_tokens`) and
/// the tokens the turn generated; a negative value means unknown. Working-set
/// admission learns the shared prefix, the turns' output and the engine's
/// prefill rate from these; reference mode ignores them. Same statuses and
/// thread-safety as `kvgate_release`.
///
/// # Safety
/// `gate` is NULL or a live gate (see `kvgate_free`).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kvgate_release_with_report(
    gate: *mut kvgate_gate,
    lease: u64,
    cached_tokens: i64,
    output_tokens: i64,
) -> kvgate_status {
    let known = |n: i64| u64::try_from(n).ok();
    let report = TurnReport::new(known(cached_tokens), known(output_tokens));
    // SAFETY: forwarded (caller).
    unsafe { release_reporting("kvgate_release_with_report", gate, lease, report) }
}

/// `kvgate_release_with_report` with, of the turn's `cached_tokens`, those
/// the engine copied back from its host tier (`tier_cached_tokens`; the
/// rest came from GPU memory). Negative means unknown, as for the other
/// two figures.
///
/// A report that contradicts itself is refused before anything else:
/// `tier_cached_tokens` greater than `cached_tokens`, or tier hits
/// (`tier_cached_tokens >= 0`) with `cached_tokens` unknown (negative).
/// Then it returns `KVGATE_INVALID_ARGUMENT`, `kvgate_last_error` says
/// why, and nothing changes: the lease is still held and valid, and the
/// host releases it again (with a consistent report, or plain
/// `kvgate_release`). The refusal is counted in
/// `kvgate_stats.working_set_refused_answers` (working-set mode). Other
/// statuses and thread-safety as `kvgate_release`.
///
/// # Safety
/// `gate` is NULL or a live gate (see `kvgate_free`).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kvgate_release_with_tier_report(
    gate: *mut kvgate_gate,
    lease: u64,
    cached_tokens: i64,
    output_tokens: i64,
    tier_cached_tokens: i64,
) -> kvgate_status {
    let function = "kvgate_release_with_tier_report";
    let known = |n: i64| u64::try_from(n).ok();
    let report = TurnReport::new(known(cached_tokens), known(output_tokens));
    let report = match known(tier_cached_tokens) {
        None => Ok(report),
        Some(tier) => report.with_tier_cached(tier),
    };
    match report {
        // SAFETY: forwarded (caller).
        Ok(report) => unsafe { release_reporting(function, gate, lease, report) },
        Err(err) => ffi_status(function, || {
            // SAFETY: forwarded (caller).
            let handle = unsafe { handles::gate_ref(gate, "gate") }?;
            handle.gate.count_refused_report();
            Err(Failure::invalid(err.to_string()))
        }),
    }
}

/// # Safety
/// `gate` is NULL or a live gate (see `kvgate_free`).
unsafe fn release_reporting(
    function: &'static str,
    gate: *mut kvgate_gate,
    lease: u64,
    report: TurnReport,
) -> kvgate_status {
    ffi_status(function, || {
        // SAFETY: forwarded (caller).
        let handle = unsafe { handles::gate_ref(gate, "gate") }?;
        let lease = handle.leases.remove(lease).ok_or_else(|| {
            Failure::new(
                kvgate_status::KVGATE_UNKNOWN_LEASE,
                format!(
                    "lease {lease} is not outstanding (already released, \
                     or never issued by this gate)"
                ),
            )
        })?;
        handle.gate.release_token(lease, report); // outside the registry's lock
        Ok(())
    })
}

/// Ends the session's ownership window (its reservation), wakes a waiting
/// attempt, and forgets the session once it holds no lease and no attempt.
/// An attempt of the session that is still waiting is not cancelled (see
/// `kvgate_cancel_session`).
///
/// If `out_final` is not NULL, the session's final figures are written to it
/// (taken atomically with the finish), at most `out_final_size` bytes as
/// `kvgate_get_session_stats` does (pass `sizeof *out_final`). Returns `KVGATE_NOT_FOUND` if the
/// session is not tracked (never seen, already finished, or retired).
/// Thread-safe.
///
/// # Safety
/// `gate` is NULL or a live gate (see `kvgate_free`); `session_id` holds
/// `session_id_len` bytes if not NULL; `out_final` is NULL or has
/// `out_final_size` writable bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kvgate_finish_session(
    gate: *mut kvgate_gate,
    session_id: *const u8,
    session_id_len: usize,
    out_final: *mut kvgate_session_stats,
    out_final_size: usize,
) -> kvgate_status {
    ffi_status("kvgate_finish_session", || {
        // SAFETY: pointer contracts forwarded (caller).
        let (handle, session) = unsafe {
            (
                handles::gate_ref(gate, "gate")?,
                handles::session_arg(session_id, session_id_len)?,
            )
        };
        if !out_final.is_null() && (!out_final.is_aligned() || out_final_size < size_of::<usize>())
        {
            // Refused before the finish, which cannot be undone.
            return Err(Failure::invalid(format!(
                "out_final is misaligned or out_final_size ({out_final_size}) is too small"
            )));
        }
        let last = handle
            .gate
            .finish_session(session)
            .ok_or_else(|| Failure::not_tracked(session))?;
        if !out_final.is_null() {
            let last = kvgate_session_stats::from(&last);
            // SAFETY: checked above; `out_final_size` writable bytes (caller).
            unsafe {
                handles::write_sized(
                    out_final,
                    out_final_size,
                    last,
                    "out_final",
                    "out_final_size",
                )
            }?;
        }
        Ok(())
    })
}

/// Releases the session's turn waiting for admission to another replica,
/// where this gate counts its cache gone (a new session, or one parked or
/// out since its window ended: its next turn costs a full prefill wherever
/// it runs): its `kvgate_acquire` returns `KVGATE_RELEASED` promptly and it
/// leaves the queue. Send the turn to a replica with room.
///
/// Returns `KVGATE_CACHE_HOT` if the gate holds the session's cache hot (a
/// member, or parked in the host tier): nothing changes, the turn keeps its
/// place; `KVGATE_NOT_FOUND` if no turn of the session waits here;
/// `KVGATE_INVALID_ARGUMENT` for a NULL `gate`, a NULL `session_id` with
/// a non-zero length, or a gate without working-set admission (it cannot
/// tell). Thread-safe.
///
/// # Safety
/// `gate` is NULL or a live gate (see `kvgate_free`); `session_id` holds
/// `session_id_len` bytes if not NULL.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kvgate_release_elsewhere(
    gate: *mut kvgate_gate,
    session_id: *const u8,
    session_id_len: usize,
) -> kvgate_status {
    ffi_status("kvgate_release_elsewhere", || {
        // SAFETY: pointer contracts forwarded (caller).
        let (handle, session) = unsafe {
            (
                handles::gate_ref(gate, "gate")?,
                handles::session_arg(session_id, session_id_len)?,
            )
        };
        let Err(err) = handle.gate.release_elsewhere(session) else {
            return Ok(());
        };
        let status = match err {
            ReleaseError::CacheHot => kvgate_status::KVGATE_CACHE_HOT,
            ReleaseError::NotWaiting => kvgate_status::KVGATE_NOT_FOUND,
            ReleaseError::NoWorkingSet => kvgate_status::KVGATE_INVALID_ARGUMENT,
        };
        Err(Failure::new(
            status,
            format!("session {}: {err}", SessionName(session)),
        ))
    })
}

/// Cancels the session's attempt that is waiting for admission (a session
/// has at most one): its `kvgate_acquire` returns `KVGATE_CANCELLED`
/// promptly. Use it when the host gives up on a turn (e.g. the client
/// disconnected).
///
/// Returns `KVGATE_NOT_FOUND` if no attempt of the session is waiting
/// (it may just have been admitted: release that lease as usual).
/// Thread-safe.
///
/// # Safety
/// `gate` is NULL or a live gate (see `kvgate_free`); `session_id` holds
/// `session_id_len` bytes if not NULL.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kvgate_cancel_session(
    gate: *mut kvgate_gate,
    session_id: *const u8,
    session_id_len: usize,
) -> kvgate_status {
    ffi_status("kvgate_cancel_session", || {
        // SAFETY: pointer contracts forwarded (caller).
        let (handle, session) = unsafe {
            (
                handles::gate_ref(gate, "gate")?,
                handles::session_arg(session_id, session_id_len)?,
            )
        };
        if handle.gate.cancel_session(session) {
            Ok(())
        } else {
            Err(Failure::new(
                kvgate_status::KVGATE_NOT_FOUND,
                format!(
                    "session {} has no attempt waiting for admission",
                    SessionName(session)
                ),
            ))
        }
    })
}
