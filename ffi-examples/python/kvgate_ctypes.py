"""A ctypes binding for kvgate's C ABI (include/kvgate.h); no compiled extension.

The library is loaded from, in order: the `path` given to `load()`, the
KVGATE_LIB environment variable, or this checkout's target/release then
target/debug `libkvgate.so` (build it with `cargo build --release`).

Blocking calls (Gate.acquire) release the GIL while they wait (ctypes does
that for every foreign call), so other Python threads keep running; probe
callbacks take the GIL back while they run. An exception raised by a probe
is caught here and counts as "unavailable": nothing unwinds through C.

Outcomes of acquire that are not admissions (preempted, timed out,
cancelled, closed) raise subclasses of AdmissionError; misuse raises
KvgateError with the library's last-error message.
"""

from __future__ import annotations

import ctypes
import enum
import os
import pathlib
from ctypes import (
    CFUNCTYPE,
    POINTER,
    Structure,
    c_bool,
    c_char_p,
    c_double,
    c_int64,
    c_size_t,
    c_uint8,
    c_uint32,
    c_uint64,
    c_void_p,
)
from typing import Callable, Optional, Sequence

REPO = pathlib.Path(__file__).resolve().parents[2]


class Status(enum.IntEnum):
    """kvgate_status: values are the C ABI's and never change."""

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


class Reason(enum.IntEnum):
    """kvgate_reason."""

    OPEN = 0
    RESERVED_SESSION = 1
    PREFIX_PROBE_UNAVAILABLE = 2
    RESIDENT_PREFIX = 3


NO_LEASE = 0


class Admission(Structure):
    _fields_ = [
        ("lease", c_uint64),
        ("reason", c_uint32),
        ("wait_sec", c_double),
        ("usage", c_double),
        ("hit_ratio", c_double),
        ("retain_session", c_bool),
        ("waited", c_bool),
    ]


class SessionStats(Structure):
    """Size-prefixed: `size` is how many bytes the library wrote; fields are
    only ever appended, so an older library leaves the newer ones at zero."""

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


class Stats(Structure):
    """Size-prefixed like SessionStats."""

    _fields_ = [("size", c_size_t)] + [
        (name, c_double if name.endswith("_sec") else c_uint64)
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
            "working_set_window_sec working_set_parked"
        ).split()
    ]


USAGE_FN = CFUNCTYPE(c_bool, c_void_p, POINTER(c_uint8), c_size_t, POINTER(c_double))
PREFIX_FN = CFUNCTYPE(
    c_bool, c_void_p, POINTER(c_uint8), c_size_t, POINTER(c_uint32), c_size_t, POINTER(c_double)
)


def _declare(lib: ctypes.CDLL) -> ctypes.CDLL:
    status = c_uint32
    gate_p, config_p, u8_p, u32_p = c_void_p, c_void_p, POINTER(c_uint8), POINTER(c_uint32)
    signatures = {
        "kvgate_version": (c_char_p, []),
        "kvgate_status_str": (c_char_p, [c_uint32]),
        "kvgate_reason_str": (c_char_p, [c_uint32]),
        "kvgate_last_error": (c_char_p, []),
        "kvgate_config_new": (config_p, []),
        "kvgate_config_free": (None, [config_p]),
        "kvgate_config_set_high_watermark": (status, [config_p, c_double]),
        "kvgate_config_set_hit_threshold": (status, [config_p, c_double]),
        "kvgate_config_set_wait_poll_sec": (status, [config_p, c_double]),
        "kvgate_config_set_idle_grace_sec": (status, [config_p, c_double]),
        "kvgate_config_set_session_retention_sec": (status, [config_p, c_double]),
        "kvgate_config_set_probes": (status, [config_p, USAGE_FN, PREFIX_FN, c_void_p]),
        "kvgate_config_set_admission_mode": (status, [config_p, c_uint32]),
        "kvgate_new": (status, [config_p, POINTER(gate_p)]),
        "kvgate_free": (None, [gate_p]),
        "kvgate_close": (status, [gate_p]),
        "kvgate_acquire": (
            status,
            [gate_p, u8_p, c_size_t, u32_p, c_size_t, c_int64, POINTER(Admission)],
        ),
        "kvgate_release": (status, [gate_p, c_uint64]),
        "kvgate_finish_session": (status, [gate_p, u8_p, c_size_t, POINTER(SessionStats), c_size_t]),
        "kvgate_cancel_session": (status, [gate_p, u8_p, c_size_t]),
        "kvgate_get_stats": (status, [gate_p, POINTER(Stats), c_size_t]),
        "kvgate_get_session_stats": (status, [gate_p, u8_p, c_size_t, POINTER(SessionStats), c_size_t]),
        "kvgate_metrics_text": (status, [gate_p, ctypes.c_char_p, c_size_t, POINTER(c_size_t)]),
    }
    for name, (restype, argtypes) in signatures.items():
        fn = getattr(lib, name)
        fn.restype, fn.argtypes = restype, argtypes
    return lib


def library_path(path: Optional[str] = None) -> pathlib.Path:
    if path or os.environ.get("KVGATE_LIB"):
        return pathlib.Path(path or os.environ["KVGATE_LIB"])
    for profile in ("release", "debug"):
        candidate = REPO / "target" / profile / "libkvgate.so"
        if candidate.exists():
            return candidate
    raise FileNotFoundError("libkvgate.so not found: run `cargo build --release` or set KVGATE_LIB")


_lib: Optional[ctypes.CDLL] = None


def load(path: Optional[str] = None) -> ctypes.CDLL:
    """Loads (once) and returns the library with every signature declared."""
    global _lib
    if _lib is None:
        _lib = _declare(ctypes.CDLL(str(library_path(path))))
    return _lib


def last_error() -> str:
    return load().kvgate_last_error().decode()


class KvgateError(Exception):
    """A call refused (misuse, invalid configuration) or a kvgate panic."""

    def __init__(self, status: int, message: str):
        super().__init__(f"{Status(status).name}: {message}")
        self.status = Status(status)
        self.message = message


class AdmissionError(Exception):
    """acquire ended without a lease; `status` says why."""

    status = Status.OK

    def __init__(self, message: str):
        super().__init__(message)
        self.message = message


class Preempted(AdmissionError):
    status = Status.PREEMPTED


class TimedOut(AdmissionError):
    status = Status.TIMED_OUT


class Cancelled(AdmissionError):
    status = Status.CANCELLED


class Closed(AdmissionError):
    status = Status.CLOSED


_ADMISSION_ERRORS = {e.status: e for e in (Preempted, TimedOut, Cancelled, Closed)}


def _check(status: int) -> None:
    if status != Status.OK:
        raise KvgateError(status, last_error())


def _bytes(session: bytes) -> tuple:
    buf = (c_uint8 * len(session)).from_buffer_copy(session) if session else None
    return buf, len(session)


ADMISSION_MODES = {"working_set": 0, "reference": 1}


class Config:
    """The configuration builder (the library's defaults until set).

    `admission_mode` takes "working_set" (the default) or "reference";
    every other knob is a number of its setter's unit.
    """

    def __init__(self, **knobs: float | str):
        self._lib = load()
        self._raw = self._lib.kvgate_config_new()
        for name, value in knobs.items():
            setter = getattr(self._lib, f"kvgate_config_set_{name}", None)
            if setter is None:
                raise TypeError(f"unknown knob {name}")
            if name == "admission_mode":
                if value not in ADMISSION_MODES:
                    raise ValueError(f"admission_mode {value!r}: expected one of {sorted(ADMISSION_MODES)}")
                _check(setter(self._raw, ADMISSION_MODES[str(value)]))
            else:
                _check(setter(self._raw, float(value)))

    def __del__(self) -> None:
        if getattr(self, "_raw", None):
            self._lib.kvgate_config_free(self._raw)
            self._raw = None


UsageProbe = Callable[[bytes], Optional[float]]
PrefixProbe = Callable[[bytes, Sequence[int]], Optional[float]]


class Lease:
    """One admitted turn; release it once (a `with` block does it)."""

    def __init__(self, gate: "Gate", admission: Admission):
        self._gate = gate
        self.handle = admission.lease
        self.reason = Reason(admission.reason)
        self.wait_sec = admission.wait_sec
        self.usage = admission.usage
        self.hit_ratio = admission.hit_ratio
        self.retain_session = admission.retain_session
        self.waited = admission.waited
        self._released = False

    def release(self) -> Status:
        """Releases the lease; a second call returns UNKNOWN_LEASE (harmless)."""
        self._released = True
        return Status(self._gate._lib.kvgate_release(self._gate._raw, self.handle))

    def __enter__(self) -> "Lease":
        return self

    def __exit__(self, *exc) -> None:
        if not self._released:
            self.release()


class Gate:
    """An admission gate over C probes backed by Python callables."""

    def __init__(self, config: Config, usage: Optional[UsageProbe], prefix: Optional[PrefixProbe]):
        self._lib = load()
        self._usage, self._prefix = usage, prefix
        # The CFUNCTYPE objects must outlive the gate: they are kept here.
        self._probes = (
            USAGE_FN(self._usage_cb) if usage else USAGE_FN(),
            PREFIX_FN(self._prefix_cb) if prefix else PREFIX_FN(),
        )
        # Probes are set on the builder (a new probe is a new setter) and
        # cleared again, so the Config stays reusable without them.
        _check(self._lib.kvgate_config_set_probes(config._raw, *self._probes, None))
        raw = c_void_p()
        status = self._lib.kvgate_new(config._raw, ctypes.byref(raw))
        _check(self._lib.kvgate_config_set_probes(config._raw, USAGE_FN(), PREFIX_FN(), None))
        _check(status)
        self._raw = raw

    def _usage_cb(self, _user_data, session, session_len, out) -> bool:
        try:
            value = self._usage(ctypes.string_at(session, session_len) if session_len else b"")
        except Exception:  # noqa: BLE001 - a probe failure is "unavailable"
            return False
        if value is None:
            return False
        out[0] = float(value)
        return True

    def _prefix_cb(self, _user_data, session, session_len, prompt, prompt_len, out) -> bool:
        try:
            # A zero-copy view of the prompt, valid during the call only.
            ids = (c_uint32 * prompt_len).from_address(ctypes.addressof(prompt.contents)) if prompt_len else ()
            value = self._prefix(ctypes.string_at(session, session_len) if session_len else b"", ids)
        except Exception:  # noqa: BLE001
            return False
        if value is None:
            return False
        out[0] = float(value)
        return True

    def acquire(self, session: bytes, prompt: Sequence[int], timeout: Optional[float] = None) -> Lease:
        """Blocks (GIL released) until admitted; raises AdmissionError otherwise."""
        sid, sid_len = _bytes(session)
        ids = (c_uint32 * len(prompt))(*prompt) if prompt else None
        timeout_ms = -1 if timeout is None else max(0, int(timeout * 1000))
        out = Admission()
        status = self._lib.kvgate_acquire(
            self._raw, sid, sid_len, ids, len(prompt), timeout_ms, ctypes.byref(out)
        )
        if status == Status.OK:
            return Lease(self, out)
        if status in _ADMISSION_ERRORS:
            raise _ADMISSION_ERRORS[status](last_error())
        raise KvgateError(status, last_error())

    def release(self, handle: int) -> Status:
        return Status(self._lib.kvgate_release(self._raw, handle))

    def cancel_session(self, session: bytes) -> bool:
        sid, sid_len = _bytes(session)
        status = self._lib.kvgate_cancel_session(self._raw, sid, sid_len)
        if status == Status.NOT_FOUND:
            return False
        _check(status)
        return True

    def finish_session(self, session: bytes) -> Optional[SessionStats]:
        """Ends the session's window; its final figures, or None if not tracked."""
        return self._session_call(self._lib.kvgate_finish_session, session)

    def session_stats(self, session: bytes) -> Optional[SessionStats]:
        return self._session_call(self._lib.kvgate_get_session_stats, session)

    def _session_call(self, fn, session: bytes) -> Optional[SessionStats]:
        sid, sid_len = _bytes(session)
        out = SessionStats()
        status = fn(self._raw, sid, sid_len, ctypes.byref(out), ctypes.sizeof(out))
        if status == Status.NOT_FOUND:
            return None
        _check(status)
        return out

    def stats(self) -> Stats:
        out = Stats()
        _check(self._lib.kvgate_get_stats(self._raw, ctypes.byref(out), ctypes.sizeof(out)))
        return out

    def metrics_text(self) -> str:
        needed = c_size_t(0)
        status = self._lib.kvgate_metrics_text(self._raw, None, 0, ctypes.byref(needed))
        while status == Status.BUFFER_TOO_SMALL:
            buf = ctypes.create_string_buffer(needed.value + 64)
            status = self._lib.kvgate_metrics_text(self._raw, buf, len(buf), ctypes.byref(needed))
        _check(status)
        return buf.value.decode()

    def close(self) -> None:
        _check(self._lib.kvgate_close(self._raw))

    def __enter__(self) -> "Gate":
        return self

    def __exit__(self, *exc) -> None:
        self.free()

    def free(self) -> None:
        """Closes and frees the gate: waiting threads get Closed, and once this
        returns no probe callback runs again. Idempotent here."""
        if self._raw:
            self._lib.kvgate_free(self._raw)
            self._raw = None
