//! What the host knows and may tell the gate (issue 51): the engine's
//! `max_model_len`, a session's budget, and a saved summary of what the
//! gate learned. New exports: the probe callbacks' signatures and the
//! ABI's structs never change.

use super::error::Failure;
use super::handles::{self, kvgate_gate};
use super::panic::ffi_status;
use super::status::kvgate_status;
use crate::{Budget, HintError};

/// Which C argument a refused figure came in, for `kvgate_last_error`.
fn hint_failure(err: HintError) -> Failure {
    let arg = match err {
        HintError::MaxModelLen => "max_model_len",
        HintError::BudgetTurns => "turns",
        _ => "tokens",
    };
    Failure::invalid(format!("{arg}: {err}"))
}

/// Tells the gate the engine's longest sequence in tokens (vLLM's
/// `model_config.max_model_len`): no session's history outgrows it. A
/// figure the engine fixes at start, so a host tells it once, before or
/// after its first acquire; a later call replaces it.
///
/// Returns `KVGATE_INVALID_ARGUMENT` (and `kvgate_last_error` names
/// `max_model_len`) for 0; the gate then keeps the figure it had. Stored
/// nowhere in reference mode (still checked). Thread-safe.
///
/// # Safety
/// `gate` is NULL or a live gate (see `kvgate_free`).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kvgate_set_max_model_len(
    gate: *mut kvgate_gate,
    max_model_len: u64,
) -> kvgate_status {
    ffi_status("kvgate_set_max_model_len", || {
        // SAFETY: pointer contract forwarded (caller).
        let handle = unsafe { handles::gate_ref(gate, "gate")? };
        handle
            .gate
            .set_max_model_len(max_model_len)
            .map_err(hint_failure)
    })
}

/// Tells how far a session may run, when the host knows (an RL rollout's
/// most `turns` and most `tokens` of history); 0 for a figure it does not
/// know. Call it before or at the session's first acquire: a session not
/// seen yet gets a record, forgotten with the session
/// (`kvgate_finish_session` forgets one that never acquired). A later
/// call replaces the budget.
///
/// Returns `KVGATE_INVALID_ARGUMENT` (and `kvgate_last_error` names `turns`
/// or `tokens`) for a negative figure, `turns` above `UINT32_MAX`, or
/// `tokens` above the engine's `max_model_len` when that is known; the
/// gate then keeps the budget it had. Stored nowhere in reference mode
/// (still checked). Thread-safe.
///
/// # Safety
/// `gate` is NULL or a live gate (see `kvgate_free`); `session_id` holds
/// `session_id_len` bytes if not NULL.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kvgate_session_set_budget(
    gate: *mut kvgate_gate,
    session_id: *const u8,
    session_id_len: usize,
    turns: i64,
    tokens: i64,
) -> kvgate_status {
    ffi_status("kvgate_session_set_budget", || {
        // SAFETY: pointer contracts forwarded (caller).
        let (handle, session) = unsafe {
            (
                handles::gate_ref(gate, "gate")?,
                handles::session_arg(session_id, session_id_len)?,
            )
        };
        let turns = match u32::try_from(turns) {
            Ok(0) => None,
            Ok(t) => Some(t),
            Err(_) => {
                return Err(Failure::invalid(format!(
                    "turns: {turns} is negative or above UINT32_MAX (0: not known)"
                )))
            }
        };
        let tokens = match u64::try_from(tokens) {
            Ok(0) => None,
            Ok(t) => Some(t),
            Err(_) => {
                return Err(Failure::invalid(format!(
                    "tokens: {tokens} is negative (0: not known)"
                )))
            }
        };
        handle
            .gate
            .set_session_budget(session, Budget::new(turns, tokens))
            .map_err(hint_failure)
    })
}

/// Writes a summary of what the gate learned (its means, the finished
/// sessions' turn counts, the prefill figures it measured, and its
/// engine's identity) into `buf`, for `kvgate_summary_load` after a
/// restart. A few hundred bytes.
///
/// `*len` is always set (on `KVGATE_OK` and `KVGATE_BUFFER_TOO_SMALL`) to
/// the summary's size. If `cap` is smaller, returns
/// `KVGATE_BUFFER_TOO_SMALL` and leaves `buf` untouched: allocate `*len`
/// bytes (a little more, since the gate may learn between calls) and call
/// again. `buf` may be NULL when `cap` is 0, to ask for the size. Returns
/// `KVGATE_INVALID_ARGUMENT` for a NULL `gate` or `len`, or a NULL `buf`
/// with a non-zero `cap`. Thread-safe.
///
/// # Safety
/// `gate` is NULL or a live gate (see `kvgate_free`); `buf` is NULL or has
/// `cap` writable bytes; `len` is NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kvgate_summary_save(
    gate: *mut kvgate_gate,
    buf: *mut u8,
    cap: usize,
    len: *mut usize,
) -> kvgate_status {
    ffi_status("kvgate_summary_save", || {
        // SAFETY: pointer contracts forwarded (caller).
        let (handle, buf, len) = unsafe {
            (
                handles::gate_ref(gate, "gate")?,
                handles::buffer_arg(buf, cap, "buf", "cap")?,
                handles::out_arg(len, "len")?,
            )
        };
        let summary = handle.gate.save_summary();
        len.write(summary.len());
        if buf.len() < summary.len() {
            return Err(Failure::new(
                kvgate_status::KVGATE_BUFFER_TOO_SMALL,
                format!("cap is {cap} bytes but the summary needs {}", summary.len()),
            ));
        }
        for (slot, byte) in buf.iter_mut().zip(summary) {
            slot.write(byte);
        }
        Ok(())
    })
}

/// Adopts a summary `kvgate_summary_save` wrote (`len` bytes at `buf`),
/// replacing what the gate learned, whole or not at all.
///
/// Returns `KVGATE_INVALID_ARGUMENT` (and `kvgate_last_error` says why:
/// truncated, not a summary, another version, corrupted, another engine)
/// for a summary it refuses; the gate then goes on as if none were given.
/// Before the engine's first capacity answer the summary is kept, and
/// adopted at that answer only if the engine matches (otherwise dropped,
/// and counted in the Rust and Python stats' `summaries_dropped`).
/// Thread-safe.
///
/// # Safety
/// `gate` is NULL or a live gate (see `kvgate_free`); `buf` holds `len`
/// bytes if not NULL.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kvgate_summary_load(
    gate: *mut kvgate_gate,
    buf: *const u8,
    len: usize,
) -> kvgate_status {
    ffi_status("kvgate_summary_load", || {
        // SAFETY: pointer contracts forwarded (caller).
        let (handle, bytes) = unsafe {
            (
                handles::gate_ref(gate, "gate")?,
                handles::slice_arg(buf, len, "buf", "len")?,
            )
        };
        handle
            .gate
            .load_summary(bytes)
            .map_err(|e| Failure::invalid(format!("buf: {e}")))
    })
}
