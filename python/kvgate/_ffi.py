"""The C ABI of include/kvgate.h, declared for ctypes: nothing else.

Every enum, struct, callback type and function here mirrors a declaration of
the header shipped beside this file (``kvgate/kvgate.h``, a copy of the
repository's ``include/kvgate.h`` made when the wheel is built), and
``tests/test_header_drift.py`` parses that header and compares every one of
them (values, field names, types and order, return and argument types), so
the binding cannot drift from the library it ships with.

The library is found, in order: the path given to :func:`load`, the
``KVGATE_LIBRARY`` environment variable (a ``libkvgate.so`` built elsewhere),
then the ``libkvgate.so`` bundled in this package by the wheel build.
"""

from __future__ import annotations

import ctypes
import enum
import os
import pathlib
import threading
from ctypes import (
    CFUNCTYPE,
    POINTER,
    Structure,
    c_bool,
    c_char_p,
    c_double,
    c_int32,
    c_int64,
    c_size_t,
    c_uint32,
    c_uint64,
    c_void_p,
)
from typing import Optional

PACKAGE_DIR = pathlib.Path(__file__).resolve().parent
#: The header this binding is checked against, shipped in the package.
HEADER = PACKAGE_DIR / "kvgate.h"
#: The library the wheel bundles.
BUNDLED_LIBRARY = PACKAGE_DIR / "libkvgate.so"
LIBRARY_ENV = "KVGATE_LIBRARY"

# ---------------------------------------------------------------------------
# Enums (C: uint32_t-sized; values are the ABI's, never reused)
# ---------------------------------------------------------------------------


class Status(enum.IntEnum):
    """``kvgate_status``."""

    OK = 0
    PREEMPTED = 1
    TIMED_OUT = 2
    CANCELLED = 3
    CLOSED = 4
    INVALID_ARGUMENT = 5
    UNKNOWN_LEASE = 6
    NOT_FOUND = 7
    PANIC = 8
    BUFFER_TOO_SMALL = 9
    OUT_OF_ORDER = 10
    OS_ERROR = 11
    RELEASED = 12
    CACHE_HOT = 13


class Reason(enum.IntEnum):
    """``kvgate_reason``: which row of the decision admitted a turn."""

    OPEN = 0
    RESERVED_SESSION = 1
    PREFIX_PROBE_UNAVAILABLE = 2
    RESIDENT_PREFIX = 3
    FITS_WORKING_SET = 4
    EMPTY_WORKING_SET = 5
    WAIT_BOUND = 6
    RUNNING_COLD_PAYS = 7


class StepKind(enum.IntEnum):
    """``kvgate_step_kind``: what an event-loop attempt asks for next."""

    PROBE_USAGE = 0
    PROBE_PREFIX = 1
    SLEEP = 2
    ADMITTED = 3
    FAILED = 4


class AdmissionMode(enum.IntEnum):
    """``kvgate_admission_mode``."""

    WORKING_SET = 0
    REFERENCE = 1


#: The C prefix of each enum's constants (for the drift test).
ENUMS = {
    "kvgate_status": (Status, "KVGATE_"),
    "kvgate_reason": (Reason, "KVGATE_REASON_"),
    "kvgate_step_kind": (StepKind, "KVGATE_STEP_"),
    "kvgate_admission_mode": (AdmissionMode, "KVGATE_ADMISSION_MODE_"),
}

#: ``#define``s of the header (checked by the drift test).
NO_LEASE = 0
VERSION = (0, 2, 0)
DEFINES = {
    "KVGATE_NO_LEASE": NO_LEASE,
    "KVGATE_VERSION_MAJOR": VERSION[0],
    "KVGATE_VERSION_MINOR": VERSION[1],
    "KVGATE_VERSION_PATCH": VERSION[2],
}

# A C enum typedef is a uint32_t in C99 (see the header's typedefs).
c_status = c_uint32
c_reason = c_uint32
c_step_kind = c_uint32

# ---------------------------------------------------------------------------
# Opaque handles
# ---------------------------------------------------------------------------


class kvgate_config(Structure):
    """Opaque."""


class kvgate_gate(Structure):
    """Opaque."""


class kvgate_waker(Structure):
    """Opaque."""


class kvgate_attempt(Structure):
    """Opaque."""


# ---------------------------------------------------------------------------
# Structs (never change layout; stats structs are size-prefixed, appended to)
# ---------------------------------------------------------------------------


class kvgate_admission(Structure):
    _fields_ = [
        ("lease", c_uint64),
        ("reason", c_reason),
        ("wait_sec", c_double),
        ("usage", c_double),
        ("hit_ratio", c_double),
        ("retain_session", c_bool),
        ("waited", c_bool),
    ]


class kvgate_step(Structure):
    _fields_ = [
        ("kind", c_step_kind),
        ("status", c_status),
        ("until_ns", c_uint64),
        ("sleep_ns", c_uint64),
        ("admission", kvgate_admission),
    ]


class kvgate_session_stats(Structure):
    _fields_ = [
        ("size", c_size_t),
        ("num_preempted", c_uint64),
        ("attempts", c_uint64),
        ("admissions", c_uint64),
        ("waits", c_uint64),
        ("wait_sec", c_double),
        ("timed_out", c_uint64),
        ("cancelled", c_uint64),
        ("active_leases", c_uint32),
        ("retaining_leases", c_uint32),
        ("attempt_pending", c_bool),
        ("reserved", c_bool),
        ("in_grace", c_bool),
        ("grace_remaining_sec", c_double),
        ("last_admitted_prompt_len", c_uint64),
        ("idle_sec", c_double),
    ]


class kvgate_stats(Structure):
    _fields_ = [("size", c_size_t)] + [
        (name, c_double if name.endswith(("_sec", "_share")) else c_uint64)
        for name in (
            "admissions admissions_open admissions_reserved_session "
            "admissions_prefix_probe_unavailable admissions_resident_prefix "
            "attempts waits wait_sec preempted timed_out cancelled closed "
            "usage_probe_calls usage_probe_unavailable usage_probe_invalid "
            "prefix_probe_calls prefix_probe_unavailable prefix_probe_invalid "
            "grace_expired sessions_finished sessions_retired releases active_leases "
            "pending_attempts waiting_attempts reserved_in_flight reserved_in_grace "
            "tracked_sessions admissions_fits_working_set admissions_empty_working_set "
            "admissions_wait_bound working_set_sessions working_set_waiting_sessions "
            "working_set_tokens working_set_capacity_tokens working_set_shared_prefix_tokens "
            "working_set_window_sec working_set_parked admissions_running_cold_pays "
            "working_set_holding longest_wait_sec working_set_horizon_turns "
            "working_set_tier_tokens working_set_refused_answers "
            "working_set_tier_cached_tokens"
        ).split()
    ]


STRUCTS = {
    "kvgate_admission": kvgate_admission,
    "kvgate_step": kvgate_step,
    "kvgate_session_stats": kvgate_session_stats,
    "kvgate_stats": kvgate_stats,
}

# ---------------------------------------------------------------------------
# Callback types (the package drives attempts itself and passes none of them;
# they are declared so that every header declaration has its twin)
# ---------------------------------------------------------------------------

# `const uint8_t *` buffers with a separate length are passed as bytes
# (c_char_p: a pointer to the bytes object's own buffer, no copy, no NUL
# needed since the length travels beside it).
u8_buf = c_char_p

kvgate_usage_fn = CFUNCTYPE(c_bool, c_void_p, u8_buf, c_size_t, POINTER(c_double))
kvgate_prefix_fn = CFUNCTYPE(
    c_bool, c_void_p, u8_buf, c_size_t, POINTER(c_uint32), c_size_t, POINTER(c_double)
)
kvgate_capacity_fn = CFUNCTYPE(
    c_bool, c_void_p, u8_buf, c_size_t, POINTER(c_uint64), POINTER(c_uint32), POINTER(c_double)
)
kvgate_tier_fn = CFUNCTYPE(c_bool, c_void_p, u8_buf, c_size_t, POINTER(c_uint64), POINTER(c_double))
kvgate_wake_fn = CFUNCTYPE(None, c_void_p, c_uint64)

CALLBACKS = {
    "kvgate_usage_fn": kvgate_usage_fn,
    "kvgate_prefix_fn": kvgate_prefix_fn,
    "kvgate_capacity_fn": kvgate_capacity_fn,
    "kvgate_tier_fn": kvgate_tier_fn,
    "kvgate_wake_fn": kvgate_wake_fn,
}

# ---------------------------------------------------------------------------
# Functions: name -> (restype, argtypes), in the header's order
# ---------------------------------------------------------------------------

config_p = POINTER(kvgate_config)
gate_p = POINTER(kvgate_gate)
waker_p = POINTER(kvgate_waker)
attempt_p = POINTER(kvgate_attempt)
step_p = POINTER(kvgate_step)

FUNCTIONS = {
    "kvgate_version": (c_char_p, []),
    "kvgate_status_str": (c_char_p, [c_uint32]),
    "kvgate_reason_str": (c_char_p, [c_uint32]),
    "kvgate_last_error": (c_char_p, []),
    "kvgate_config_new": (config_p, []),
    "kvgate_config_free": (None, [config_p]),
    "kvgate_config_set_high_watermark": (c_status, [config_p, c_double]),
    "kvgate_config_set_hit_threshold": (c_status, [config_p, c_double]),
    "kvgate_config_set_wait_poll_sec": (c_status, [config_p, c_double]),
    "kvgate_config_set_idle_grace_sec": (c_status, [config_p, c_double]),
    "kvgate_config_set_session_retention_sec": (c_status, [config_p, c_double]),
    "kvgate_config_set_probes": (c_status, [config_p, kvgate_usage_fn, kvgate_prefix_fn, c_void_p]),
    "kvgate_config_set_capacity_probe": (c_status, [config_p, kvgate_capacity_fn]),
    "kvgate_config_set_tier_probe": (c_status, [config_p, kvgate_tier_fn]),
    "kvgate_config_set_admission_mode": (c_status, [config_p, c_uint32]),
    "kvgate_new": (c_status, [config_p, POINTER(gate_p)]),
    "kvgate_free": (None, [gate_p]),
    "kvgate_close": (c_status, [gate_p]),
    "kvgate_acquire": (
        c_status,
        [gate_p, u8_buf, c_size_t, POINTER(c_uint32), c_size_t, c_int64, POINTER(kvgate_admission)],
    ),
    "kvgate_release": (c_status, [gate_p, c_uint64]),
    "kvgate_release_with_report": (c_status, [gate_p, c_uint64, c_int64, c_int64]),
    "kvgate_release_with_tier_report": (c_status, [gate_p, c_uint64, c_int64, c_int64, c_int64]),
    "kvgate_finish_session": (
        c_status,
        [gate_p, u8_buf, c_size_t, POINTER(kvgate_session_stats), c_size_t],
    ),
    "kvgate_cancel_session": (c_status, [gate_p, u8_buf, c_size_t]),
    "kvgate_release_elsewhere": (c_status, [gate_p, u8_buf, c_size_t]),
    "kvgate_set_rebuild_cost": (c_status, [gate_p, c_double, c_double]),
    "kvgate_set_max_model_len": (c_status, [gate_p, c_uint64]),
    "kvgate_session_set_budget": (c_status, [gate_p, u8_buf, c_size_t, c_int64, c_int64]),
    "kvgate_summary_save": (c_status, [gate_p, POINTER(ctypes.c_uint8), c_size_t, POINTER(c_size_t)]),
    "kvgate_summary_load": (c_status, [gate_p, u8_buf, c_size_t]),
    "kvgate_get_stats": (c_status, [gate_p, POINTER(kvgate_stats), c_size_t]),
    "kvgate_get_session_stats": (
        c_status,
        [gate_p, u8_buf, c_size_t, POINTER(kvgate_session_stats), c_size_t],
    ),
    "kvgate_metrics_text": (c_status, [gate_p, c_char_p, c_size_t, POINTER(c_size_t)]),
    "kvgate_waker_new": (c_status, [POINTER(waker_p)]),
    "kvgate_waker_new_callback": (c_status, [kvgate_wake_fn, c_void_p, POINTER(waker_p)]),
    "kvgate_waker_fd": (c_status, [waker_p, POINTER(c_int32)]),
    "kvgate_waker_drain": (c_status, [waker_p, POINTER(c_uint64), c_size_t, POINTER(c_size_t)]),
    "kvgate_waker_free": (None, [waker_p]),
    "kvgate_attempt_begin": (
        c_status,
        [gate_p, u8_buf, c_size_t, c_size_t, c_int64, waker_p, c_uint64, POINTER(attempt_p), step_p],
    ),
    "kvgate_attempt_begin_with_prompt": (
        c_status,
        [
            gate_p, u8_buf, c_size_t, POINTER(c_uint32), c_size_t, c_int64, waker_p, c_uint64,
            POINTER(attempt_p), step_p,
        ],
    ),
    "kvgate_attempt_answer_usage": (
        c_status,
        [attempt_p, c_double, c_uint64, c_uint32, c_double, step_p],
    ),
    "kvgate_attempt_answer_usage_tiered": (
        c_status,
        [attempt_p, c_double, c_uint64, c_uint32, c_double, c_uint64, c_double, step_p],
    ),
    "kvgate_attempt_answer_prefix": (c_status, [attempt_p, c_double, step_p]),
    "kvgate_attempt_wake": (c_status, [attempt_p, step_p]),
    "kvgate_attempt_cancel": (c_status, [attempt_p]),
    "kvgate_attempt_end": (c_status, [attempt_p, c_uint32]),
    "kvgate_attempt_free": (None, [attempt_p]),
    "kvgate_now_ns": (c_status, [gate_p, POINTER(c_uint64)]),
    "kvgate_tick": (c_status, [gate_p, POINTER(c_uint64), POINTER(c_uint64)]),
}

#: The header's functions the binding deliberately leaves undeclared (none).
UNBOUND: frozenset = frozenset()


def library_path(path: Optional[os.PathLike | str] = None) -> pathlib.Path:
    """Where :func:`load` finds the library (see the module docstring)."""
    if path:
        return pathlib.Path(path)
    if os.environ.get(LIBRARY_ENV):
        return pathlib.Path(os.environ[LIBRARY_ENV])
    if BUNDLED_LIBRARY.exists():
        return BUNDLED_LIBRARY
    raise FileNotFoundError(
        f"libkvgate.so is not bundled at {BUNDLED_LIBRARY} (install the package with "
        f"`pip install ./python` from the repository) and {LIBRARY_ENV} is not set"
    )


_lib: Optional[ctypes.CDLL] = None
_lib_path: Optional[pathlib.Path] = None
_load_lock = threading.Lock()


def load(path: Optional[os.PathLike | str] = None) -> ctypes.CDLL:
    """Loads the library once, declares every function, and returns it.

    A second call with another ``path`` than the loaded one is refused: one
    process, one kvgate library.
    """
    global _lib, _lib_path
    with _load_lock:
        if _lib is not None:
            if path and pathlib.Path(path).resolve() != _lib_path:
                raise RuntimeError(f"kvgate is already loaded from {_lib_path}, not {path}")
            return _lib
        where = library_path(path).resolve()
        lib = ctypes.CDLL(str(where))
        for name, (restype, argtypes) in FUNCTIONS.items():
            fn = getattr(lib, name)
            fn.restype, fn.argtypes = restype, argtypes
        _lib, _lib_path = lib, where
        return lib


def loaded_path() -> Optional[pathlib.Path]:
    """The path of the loaded library, or None before :func:`load`."""
    return _lib_path


def last_error() -> str:
    """``kvgate_last_error()`` of the calling thread."""
    return load().kvgate_last_error().decode("utf-8", "replace")
