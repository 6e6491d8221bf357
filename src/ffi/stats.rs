//! Monitoring: gate-wide and per-session figures, and Prometheus text.

use std::ffi::c_char;

use super::error::Failure;
use super::handles::{self, kvgate_gate};
use super::panic::ffi_status;
use super::status::kvgate_status;
use crate::{GateStats, ReservationState, SessionStats};

/// Gate-wide figures (`kvgate_get_stats`). Counters only grow; gauges are
/// marked. Each figure is exact; the set is not one atomic instant.
///
/// Size-prefixed: the caller passes `sizeof(kvgate_stats)` as it knows it,
/// and the library writes that many bytes at most, `size` first. Within a
/// minor version new figures (a new admission reason's count, say) are only
/// ever appended, so a host built against an older header gets the fields
/// it knows, and one built against a newer header reads `size` to see which
/// were written. While the major version is 0 a minor release may remove a
/// figure (compare `kvgate_version()` with the header's macros).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct kvgate_stats {
    /// Bytes of this struct the library wrote (set by the library).
    pub size: usize,
    /// All admissions (the sum of the `admissions_*` per reason below).
    pub admissions: u64,
    /// Admissions `KVGATE_REASON_OPEN`.
    pub admissions_open: u64,
    /// Admissions `KVGATE_REASON_RESERVED_SESSION`.
    pub admissions_reserved_session: u64,
    /// Admissions `KVGATE_REASON_PREFIX_PROBE_UNAVAILABLE`.
    pub admissions_prefix_probe_unavailable: u64,
    /// Admissions `KVGATE_REASON_RESIDENT_PREFIX`.
    pub admissions_resident_prefix: u64,
    /// Attempts begun (every `kvgate_acquire` not refused as closed or invalid).
    pub attempts: u64,
    /// Attempts that slept at least once before they ended.
    pub waits: u64,
    /// Total seconds, start to end, of the attempts counted in `waits`.
    pub wait_sec: f64,
    /// Attempts preempted by a newer attempt of their session.
    pub preempted: u64,
    /// Attempts whose timeout passed.
    pub timed_out: u64,
    /// Attempts cancelled by the host.
    pub cancelled: u64,
    /// Attempts ended or refused because the gate was closed.
    pub closed: u64,
    /// Usage probe calls.
    pub usage_probe_calls: u64,
    /// Usage probe answers that were unavailable (invalid ones included).
    pub usage_probe_unavailable: u64,
    /// Usage probe answers that were NaN, infinite or outside [0, 1].
    pub usage_probe_invalid: u64,
    /// Prefix probe calls.
    pub prefix_probe_calls: u64,
    /// Prefix probe answers that were unavailable (invalid ones included).
    pub prefix_probe_unavailable: u64,
    /// Prefix probe answers that were NaN, infinite or outside [0, 1].
    pub prefix_probe_invalid: u64,
    /// Grace windows that ended by expiry.
    pub grace_expired: u64,
    /// `kvgate_finish_session` calls that found their session.
    pub sessions_finished: u64,
    /// Session records dropped after the retention period.
    pub sessions_retired: u64,
    /// Leases released.
    pub releases: u64,
    /// Gauge: leases held.
    pub active_leases: u64,
    /// Gauge: attempts begun and not yet ended (probing or waiting).
    pub pending_attempts: u64,
    /// Gauge: attempts asleep waiting for admission.
    pub waiting_attempts: u64,
    /// Gauge: sessions whose reservation is held by an in-flight request
    /// (reference mode; 0 in working-set mode, see `working_set_sessions`).
    pub reserved_in_flight: u64,
    /// Gauge: sessions in their idle grace window (reference mode; 0 in
    /// working-set mode).
    pub reserved_in_grace: u64,
    /// Gauge: session records kept.
    pub tracked_sessions: u64,
    /// Admissions `KVGATE_REASON_FITS_WORKING_SET`.
    pub admissions_fits_working_set: u64,
    /// Admissions `KVGATE_REASON_EMPTY_WORKING_SET`.
    pub admissions_empty_working_set: u64,
    /// Admissions `KVGATE_REASON_WAIT_BOUND`.
    pub admissions_wait_bound: u64,
    /// Gauge: sessions in the working set (0 in reference mode).
    pub working_set_sessions: u64,
    /// Gauge: sessions queued to join the working set.
    pub working_set_waiting_sessions: u64,
    /// Gauge: KV tokens the working set is counted to hold.
    pub working_set_tokens: u64,
    /// Gauge: KV capacity in force, tokens (0 while unknown).
    pub working_set_capacity_tokens: u64,
    /// Gauge: the prefixes shared by sessions (a system prompt, a group's
    /// task), each counted once while a member uses it, tokens.
    pub working_set_shared_prefix_tokens: u64,
    /// Gauge: how long a member keeps its place between turns, seconds.
    pub working_set_window_sec: f64,
    /// Members parked so far.
    pub working_set_parked: u64,
    /// Admissions `KVGATE_REASON_RUNNING_COLD_PAYS`.
    pub admissions_running_cold_pays: u64,
    /// Gauge: 1 while holding sessions out of the working set pays, 0 while
    /// running everyone with a cold cache would serve clearly more turns
    /// (nobody waits for room then, nobody is parked), as last decided; 0 in
    /// reference mode.
    pub working_set_holding: u64,
    /// Gauge: the longest time, start to end, of one attempt counted in
    /// `waits` (granted or not), since the gate was created, seconds. An
    /// attempt still waiting counts once it ends.
    pub longest_wait_sec: f64,
    /// Gauge: how many turns ahead a joining session must still fit beside
    /// the members' expected growth: the turns a session runs in one
    /// refill window; 1 while unknown, 0 in reference mode.
    pub working_set_horizon_turns: u64,
    /// Gauge: the engine's host tier of KV, tokens, as told by
    /// `kvgate_attempt_answer_usage_tiered` or the tier probe (0: none
    /// told, and in reference mode).
    pub working_set_tier_tokens: u64,
    /// Engine answers and turn reports whose tier figures the gate
    /// refused (a tier smaller than the GPU cache, a reload rate that is
    /// not finite and > 0, a tier that disappeared, tier hits over the
    /// turn's cached tokens): those a call refused with
    /// `KVGATE_INVALID_ARGUMENT` and those the tier probe answered, which
    /// were ignored. Each kept what the gate knew. 0 in reference mode.
    pub working_set_refused_answers: u64,
    /// Cached tokens that turn reports (`kvgate_release_with_tier_report`)
    /// said the host tier served, summed (0 in reference mode).
    pub working_set_tier_cached_tokens: u64,
}

impl From<&GateStats> for kvgate_stats {
    fn from(s: &GateStats) -> Self {
        let [open, reserved, unavailable, resident, fits, empty, wait_bound, running_cold] =
            s.admissions_by_reason;
        let w = &s.working_set;
        Self {
            size: std::mem::size_of::<Self>(),
            admissions: s.total_admissions(),
            admissions_open: open,
            admissions_reserved_session: reserved,
            admissions_prefix_probe_unavailable: unavailable,
            admissions_resident_prefix: resident,
            attempts: s.attempts,
            waits: s.waits,
            wait_sec: s.wait_time.as_secs_f64(),
            preempted: s.preempted,
            timed_out: s.timed_out,
            cancelled: s.cancelled,
            closed: s.closed,
            usage_probe_calls: s.usage_probe_calls,
            usage_probe_unavailable: s.usage_probe_unavailable,
            usage_probe_invalid: s.usage_probe_invalid,
            prefix_probe_calls: s.prefix_probe_calls,
            prefix_probe_unavailable: s.prefix_probe_unavailable,
            prefix_probe_invalid: s.prefix_probe_invalid,
            grace_expired: s.grace_expired,
            sessions_finished: s.sessions_finished,
            sessions_retired: s.sessions_retired,
            releases: s.releases,
            active_leases: s.active_leases,
            pending_attempts: s.pending_attempts,
            waiting_attempts: s.waiting_attempts,
            reserved_in_flight: s.reserved_in_flight,
            reserved_in_grace: s.reserved_in_grace,
            tracked_sessions: s.tracked_sessions,
            admissions_fits_working_set: fits,
            admissions_empty_working_set: empty,
            admissions_wait_bound: wait_bound,
            working_set_sessions: w.members as u64,
            working_set_waiting_sessions: w.waiting as u64,
            working_set_tokens: w.load_tokens,
            working_set_capacity_tokens: w.capacity_tokens,
            working_set_shared_prefix_tokens: w.shared_prefix_tokens,
            working_set_window_sec: w.window_ns as f64 / 1e9,
            working_set_parked: w.parked,
            admissions_running_cold_pays: running_cold,
            working_set_holding: u64::from(w.holding),
            longest_wait_sec: s.longest_wait.as_secs_f64(),
            working_set_horizon_turns: u64::from(w.horizon_turns),
            working_set_tier_tokens: w.tier_tokens,
            working_set_refused_answers: w.refused_answers,
            working_set_tier_cached_tokens: w.tier_cached_tokens,
        }
    }
}

/// One session's figures (`kvgate_get_session_stats`, `kvgate_finish_session`).
///
/// Size-prefixed like `kvgate_stats`: pass `sizeof(kvgate_session_stats)`;
/// new figures are only ever appended.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct kvgate_session_stats {
    /// Bytes of this struct the library wrote (set by the library).
    pub size: usize,
    /// Attempts of this session preempted by a newer attempt (admission
    /// preemptions only, never the engine's). High means retries, not
    /// scheduling, are the problem.
    pub num_preempted: u64,
    /// Attempts begun.
    pub attempts: u64,
    /// Attempts admitted.
    pub admissions: u64,
    /// Attempts that slept at least once.
    pub waits: u64,
    /// Total seconds in `kvgate_acquire` of the attempts counted in `waits`.
    pub wait_sec: f64,
    /// Attempts whose timeout passed.
    pub timed_out: u64,
    /// Attempts cancelled by the host.
    pub cancelled: u64,
    /// Leases of this session currently held.
    pub active_leases: u32,
    /// Of those, the leases holding the session's reservation (reference
    /// mode; always 0 in working-set mode, which keeps no reservation:
    /// there every lease holds the session's working-set place, see
    /// `kvgate_admission.retain_session`).
    pub retaining_leases: u32,
    /// Whether an attempt of this session is competing for admission now.
    pub attempt_pending: bool,
    /// Whether the session owns a reservation: held by an in-flight request
    /// or in its idle grace window (reference mode; always false in
    /// working-set mode).
    pub reserved: bool,
    /// Whether the reservation is in its idle grace window (reference
    /// mode; always false in working-set mode).
    pub in_grace: bool,
    /// Seconds left in the grace window; 0 unless `in_grace`.
    pub grace_remaining_sec: f64,
    /// Prompt length (tokens) of the newest admitted attempt.
    pub last_admitted_prompt_len: u64,
    /// Seconds since the session was last active (began, admitted, released).
    pub idle_sec: f64,
}

impl From<&SessionStats> for kvgate_session_stats {
    fn from(s: &SessionStats) -> Self {
        let (reserved, retaining_leases, in_grace, grace_remaining_sec) = match s.reservation {
            ReservationState::None => (false, 0, false, 0.0),
            ReservationState::InFlight { leases } => (true, leases, false, 0.0),
            ReservationState::Grace { remaining } => (true, 0, true, remaining.as_secs_f64()),
        };
        Self {
            size: std::mem::size_of::<Self>(),
            num_preempted: s.num_preempted,
            attempts: s.attempts,
            admissions: s.admissions,
            waits: s.waits,
            wait_sec: s.wait_time.as_secs_f64(),
            timed_out: s.timed_out,
            cancelled: s.cancelled,
            active_leases: s.active_leases,
            retaining_leases,
            attempt_pending: s.attempt_pending,
            reserved,
            in_grace,
            grace_remaining_sec,
            last_admitted_prompt_len: s.last_admitted_prompt_len as u64,
            idle_sec: s.idle_for.as_secs_f64(),
        }
    }
}

/// Writes the gate-wide figures to `*out` (due grace expiries are fired
/// first): at most `out_size` bytes, `out->size` first (see
/// `kvgate_stats`). Pass `sizeof *out`. Returns `KVGATE_INVALID_ARGUMENT`
/// for a NULL `gate` or `out`, or an `out_size` smaller than a `size_t`.
/// Thread-safe.
///
/// # Safety
/// `gate` is NULL or a live gate (see `kvgate_free`); `out` is NULL or has
/// `out_size` writable bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kvgate_get_stats(
    gate: *mut kvgate_gate,
    out: *mut kvgate_stats,
    out_size: usize,
) -> kvgate_status {
    ffi_status("kvgate_get_stats", || {
        // SAFETY: forwarded (caller).
        let handle = unsafe { handles::gate_ref(gate, "gate") }?;
        let stats = kvgate_stats::from(&handle.gate.stats());
        // SAFETY: forwarded (caller).
        unsafe { handles::write_sized(out, out_size, stats, "out", "out_size") }
    })
}

/// Writes one session's figures to `*out` (at most `out_size` bytes, as
/// `kvgate_get_stats` does; pass `sizeof *out`). Returns `KVGATE_NOT_FOUND` if the
/// session is not tracked (never seen, finished, or retired after
/// `session_retention_sec` idle), `KVGATE_INVALID_ARGUMENT` for a NULL
/// `gate` or `out` or a NULL `session_id` with a non-zero length.
/// Thread-safe.
///
/// # Safety
/// `gate` is NULL or a live gate (see `kvgate_free`); `session_id` holds
/// `session_id_len` bytes if not NULL; `out` is NULL or has `out_size`
/// writable bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kvgate_get_session_stats(
    gate: *mut kvgate_gate,
    session_id: *const u8,
    session_id_len: usize,
    out: *mut kvgate_session_stats,
    out_size: usize,
) -> kvgate_status {
    ffi_status("kvgate_get_session_stats", || {
        // SAFETY: pointer contracts forwarded (caller).
        let (handle, session) = unsafe {
            (
                handles::gate_ref(gate, "gate")?,
                handles::session_arg(session_id, session_id_len)?,
            )
        };
        if out.is_null() {
            return Err(Failure::invalid("out is NULL"));
        }
        let stats = handle
            .gate
            .session_stats(session)
            .ok_or_else(|| Failure::not_tracked(session))?;
        let stats = kvgate_session_stats::from(&stats);
        // SAFETY: forwarded (caller).
        unsafe { handles::write_sized(out, out_size, stats, "out", "out_size") }
    })
}

/// Renders the gate-wide figures in Prometheus text exposition format
/// (`kvgate_*` families) into the caller's buffer, NUL-terminated.
///
/// `*needed` is always set (on `KVGATE_OK` and `KVGATE_BUFFER_TOO_SMALL`) to
/// the size the text needs, NUL terminator included. If `cap` is smaller,
/// returns `KVGATE_BUFFER_TOO_SMALL` and leaves `buf` untouched: allocate
/// `*needed` bytes (a little more, since counters may grow a digit between
/// calls) and call again. `buf` may be NULL when `cap` is 0, to ask for the
/// size. Returns `KVGATE_INVALID_ARGUMENT` for a NULL `gate` or `needed`, or
/// a NULL `buf` with a non-zero `cap`. Thread-safe.
///
/// # Safety
/// `gate` is NULL or a live gate (see `kvgate_free`); `buf` is NULL or has
/// `cap` writable bytes; `needed` is NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kvgate_metrics_text(
    gate: *mut kvgate_gate,
    buf: *mut c_char,
    cap: usize,
    needed: *mut usize,
) -> kvgate_status {
    ffi_status("kvgate_metrics_text", || {
        // SAFETY: pointer contracts forwarded (caller).
        let (handle, buf, needed) = unsafe {
            (
                handles::gate_ref(gate, "gate")?,
                handles::buffer_arg(buf.cast::<u8>(), cap, "buf", "cap")?,
                handles::out_arg(needed, "needed")?,
            )
        };
        let text = handle.gate.metrics_text();
        let size = text.len() + 1;
        needed.write(size);
        if buf.len() < size {
            return Err(Failure::new(
                kvgate_status::KVGATE_BUFFER_TOO_SMALL,
                format!("cap is {cap} bytes but the text needs {size} (NUL included)"),
            ));
        }
        for (slot, byte) in buf.iter_mut().zip(text.bytes().chain([0])) {
            slot.write(byte);
        }
        Ok(())
    })
}
