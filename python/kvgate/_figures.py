"""The gate's figures as typed records: Stats and SessionStats."""

from __future__ import annotations

import ctypes
import dataclasses


@dataclasses.dataclass(frozen=True)
class Stats:
    """Gate-wide figures (``kvgate_stats``; see the header for each)."""

    admissions: int
    admissions_open: int
    admissions_reserved_session: int
    admissions_prefix_probe_unavailable: int
    admissions_resident_prefix: int
    attempts: int
    waits: int
    wait_sec: float
    preempted: int
    timed_out: int
    cancelled: int
    closed: int
    usage_probe_calls: int
    usage_probe_unavailable: int
    usage_probe_invalid: int
    prefix_probe_calls: int
    prefix_probe_unavailable: int
    prefix_probe_invalid: int
    grace_expired: int
    sessions_finished: int
    sessions_retired: int
    releases: int
    active_leases: int
    pending_attempts: int
    waiting_attempts: int
    reserved_in_flight: int
    reserved_in_grace: int
    tracked_sessions: int
    admissions_fits_working_set: int
    admissions_empty_working_set: int
    admissions_wait_bound: int
    working_set_sessions: int
    working_set_waiting_sessions: int
    working_set_tokens: int
    working_set_capacity_tokens: int
    working_set_shared_prefix_tokens: int
    working_set_window_sec: float
    working_set_parked: int
    admissions_running_cold_pays: int
    working_set_holding: int
    longest_wait_sec: float
    working_set_horizon_turns: int
    #: Gauge: the engine's host tier of KV, tokens (0: none told).
    working_set_tier_tokens: int = 0
    #: Engine answers and turn reports whose tier figures were refused.
    working_set_refused_answers: int = 0
    #: Cached tokens that turn reports said the host tier served, summed.
    working_set_tier_cached_tokens: int = 0


@dataclasses.dataclass(frozen=True)
class SessionStats:
    """One session's figures (``kvgate_session_stats``).

    ``retaining_leases``, ``reserved``, ``in_grace`` and
    ``grace_remaining_sec`` describe the reference mode's reservation; in
    working-set mode they read 0 / False (a lease holds the session's
    working-set place instead: :attr:`Lease.retain_session`)."""

    num_preempted: int
    attempts: int
    admissions: int
    waits: int
    wait_sec: float
    timed_out: int
    cancelled: int
    active_leases: int
    retaining_leases: int
    attempt_pending: bool
    reserved: bool
    in_grace: bool
    grace_remaining_sec: float
    last_admitted_prompt_len: int
    idle_sec: float


def _from_struct(cls, raw: ctypes.Structure):
    return cls(**{f.name: getattr(raw, f.name) for f in dataclasses.fields(cls)})
