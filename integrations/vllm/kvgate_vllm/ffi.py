"""A minimal ctypes binding of kvgate's C ABI (include/kvgate.h) for the vLLM side.

Deliberately small: only the functions the vLLM integration needs (config new /
set / free, gate new / free, acquire, release, finish_session, cancel_session,
metrics_text, and the string helpers), so changes elsewhere in the ABI do not
touch it. tests/test_ffi_header.py checks every signature and struct used here
against the generated header, so it cannot drift silently.

This is a stop-gap until the real async-native `kvgate` Python package (issue 14)
exists; it lives inside the plugin (not as a top-level `kvgate` package) so that
package can take the name without a clash.

The library is found, in order: the `path` given to `load()`, the KVGATE_LIB
environment variable, then the repo checkout this file sits in
(target/release, then target/debug `libkvgate.so`; `cargo build --release`).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import ctypes
import enum
import math
import os
import pathlib
import threading
from ctypes import CFUNCTYPE, POINTER, Structure, c_bool, c_char_p, c_double, c_int64, c_size_t, c_uint8, c_uint32, c_uint64, c_void_p
from typing import Callable, Optional, Sequence

REPO = pathlib.Path(__file__).resolve().parents[3]


class Status(enum.IntEnum):
    """kvgate_status (values fixed by the C ABI)."""

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
    """kvgate_reason (values fixed by the C ABI)."""

    OPEN = 0
    RESERVED_SESSION = 1
    PREFIX_PROBE_UNAVAILABLE = 2
    RESIDENT_PREFIX = 3
    FITS_WORKING_SET = 4
    EMPTY_WORKING_SET = 5
    WAIT_BOUND = 6


def reason_name(value: int) -> str:
    try:
        return Reason(value).name.lower()
    except ValueError:  # a reason added after this binding: report, don't reject
        return f"reason_{value}"


class Admission(Structure):
    """struct kvgate_admission (never changes layout, per the header)."""

    _fields_ = [
        ("lease", c_uint64),
        ("reason", c_uint32),
        ("wait_sec", c_double),
        ("usage", c_double),
        ("hit_ratio", c_double),
        ("retain_session", c_bool),
        ("waited", c_bool),
    ]


USAGE_FN = CFUNCTYPE(c_bool, c_void_p, POINTER(c_uint8), c_size_t, POINTER(c_double))
PREFIX_FN = CFUNCTYPE(c_bool, c_void_p, POINTER(c_uint8), c_size_t, POINTER(c_uint32), c_size_t, POINTER(c_double))
CAPACITY_FN = CFUNCTYPE(
    c_bool, c_void_p, POINTER(c_uint8), c_size_t, POINTER(c_uint64), POINTER(c_uint32), POINTER(c_double)
)


_status = c_uint32
_u8p, _u32p = POINTER(c_uint8), POINTER(c_uint32)

#: Every function this binding calls: name -> (restype, argtypes). The header
#: test compares each with its declaration in include/kvgate.h.
SIGNATURES: dict[str, tuple[object, list[object]]] = {
    "kvgate_version": (c_char_p, []),
    "kvgate_status_str": (c_char_p, [c_uint32]),
    "kvgate_reason_str": (c_char_p, [c_uint32]),
    "kvgate_last_error": (c_char_p, []),
    "kvgate_config_new": (c_void_p, []),
    "kvgate_config_free": (None, [c_void_p]),
    "kvgate_config_set_probes": (_status, [c_void_p, USAGE_FN, PREFIX_FN, c_void_p]),
    "kvgate_config_set_capacity_probe": (_status, [c_void_p, CAPACITY_FN]),
    "kvgate_new": (_status, [c_void_p, POINTER(c_void_p)]),
    "kvgate_free": (None, [c_void_p]),
    "kvgate_acquire": (_status, [c_void_p, _u8p, c_size_t, _u32p, c_size_t, c_int64, POINTER(Admission)]),
    "kvgate_release": (_status, [c_void_p, c_uint64]),
    "kvgate_release_with_report": (_status, [c_void_p, c_uint64, c_int64, c_int64]),
    "kvgate_finish_session": (_status, [c_void_p, _u8p, c_size_t, c_void_p, c_size_t]),
    "kvgate_cancel_session": (_status, [c_void_p, _u8p, c_size_t]),
    "kvgate_metrics_text": (_status, [c_void_p, c_char_p, c_size_t, POINTER(c_size_t)]),
}
#: Config setters take (config*, double) -> status; looked up by knob name.
SETTER_SIGNATURE: tuple[object, list[object]] = (_status, [c_void_p, c_double])


class KvgateError(Exception):
    """A refused call (bad argument, unknown knob) or a kvgate panic."""

    def __init__(self, status: int, message: str) -> None:
        name = Status(status).name if status in Status._value2member_map_ else str(status)
        super().__init__(f"{name}: {message}")
        self.status = status
        self.message = message


class NotAdmitted(Exception):
    """acquire ended without a lease (preempted, timed out, cancelled, closed)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"{Status(status).name}: {message}")
        self.status = Status(status)


def library_path(path: Optional[str] = None) -> pathlib.Path:
    if path:
        return pathlib.Path(path)
    if os.environ.get("KVGATE_LIB"):
        return pathlib.Path(os.environ["KVGATE_LIB"])
    for profile in ("release", "debug"):
        candidate = REPO / "target" / profile / "libkvgate.so"
        if candidate.exists():
            return candidate
    raise FileNotFoundError(
        f"libkvgate.so not found under {REPO}/target: run `cargo build --release` or set KVGATE_LIB"
    )


_lib: Optional[ctypes.CDLL] = None
_lib_lock = threading.Lock()


def load(path: Optional[str] = None) -> ctypes.CDLL:
    """Loads the library once and declares every signature used here."""
    global _lib
    with _lib_lock:
        if _lib is None:
            lib = ctypes.CDLL(str(library_path(path)))
            for name, (restype, argtypes) in SIGNATURES.items():
                fn = getattr(lib, name)
                fn.restype, fn.argtypes = restype, argtypes
            _lib = lib
        return _lib


def last_error() -> str:
    msg = load().kvgate_last_error()
    return msg.decode() if msg else ""


def version() -> str:
    return load().kvgate_version().decode()


def _check(status: int) -> None:
    if status != Status.OK:
        raise KvgateError(status, last_error())


def _session_buf(session: bytes) -> tuple[Optional[ctypes.Array], int]:
    return ((c_uint8 * len(session)).from_buffer_copy(session) if session else None), len(session)


def _is_number(text: str) -> bool:
    try:
        float(text)
        return True
    except ValueError:
        return False


def header_constant(name: str) -> int:
    """The value of an enum constant or #define in include/kvgate.h."""
    import re

    header = (REPO / "include" / "kvgate.h").read_text()
    m = re.search(rf"\b{re.escape(name)}\s*=\s*(\d+)", header) or re.search(rf"#define {re.escape(name)} (\d+)", header)
    if not m:
        raise KvgateError(Status.INVALID_ARGUMENT, f"{name} is not in include/kvgate.h")
    return int(m.group(1))


def make_config(knobs: dict[str, float | str]) -> c_void_p:
    """A new kvgate_config with `kvgate_config_set_<knob>(value)` applied for each
    knob (a number as a double; a name as the header constant KVGATE_<KNOB>_<NAME>);
    the caller frees it with kvgate_config_free. Unknown knobs raise KvgateError."""
    lib = load()
    raw = lib.kvgate_config_new()
    try:
        for knob, value in knobs.items():
            setter = getattr(lib, f"kvgate_config_set_{knob}", None) if knob.isidentifier() else None
            if setter is None:
                raise KvgateError(Status.INVALID_ARGUMENT, f"unknown kvgate knob {knob!r} (no kvgate_config_set_{knob})")
            if isinstance(value, str) and not _is_number(value):
                # A named value: the header's constant KVGATE_<KNOB>_<VALUE>, passed as uint32.
                setter.restype, setter.argtypes = _status, [c_void_p, c_uint32]
                _check(setter(raw, header_constant(f"KVGATE_{knob}_{value}".upper())))
            else:
                setter.restype, setter.argtypes = SETTER_SIGNATURE
                _check(setter(raw, float(value)))
    except BaseException:
        lib.kvgate_config_free(raw)
        raise
    return raw


UsageProbe = Callable[[bytes], Optional[float]]
PrefixProbe = Callable[[bytes, Sequence[int]], Optional[float]]


class Gate:
    """One kvgate gate over Python probe callables (None: probe unavailable).

    Probes run on the thread inside acquire; an exception or a None answer
    counts as "unavailable" (nothing unwinds through C)."""

    def __init__(self, knobs: dict[str, float | str], usage: Optional[UsageProbe], prefix: Optional[PrefixProbe]) -> None:
        self._lib = load()
        self._usage, self._prefix = usage, prefix
        # What the engine said of its KV cache (`set_capacity`); the capacity
        # probe answers it, and "unknown" until it is set.
        self._capacity: Optional[tuple[int, int, float]] = None
        # The CFUNCTYPE objects must outlive the gate: kept on self.
        self._usage_fn = USAGE_FN(self._usage_cb) if usage else USAGE_FN()
        self._prefix_fn = PREFIX_FN(self._prefix_cb) if prefix else PREFIX_FN()
        self._capacity_fn = CAPACITY_FN(self._capacity_cb)
        config = make_config(knobs)
        try:
            _check(self._lib.kvgate_config_set_probes(config, self._usage_fn, self._prefix_fn, None))
            _check(self._lib.kvgate_config_set_capacity_probe(config, self._capacity_fn))
            raw = c_void_p()
            _check(self._lib.kvgate_new(config, ctypes.byref(raw)))
        finally:
            self._lib.kvgate_config_free(config)
        self._raw: Optional[c_void_p] = raw

    def set_capacity(self, tokens: int, block_size: int, prefill_tokens_per_sec: float = 0.0) -> None:
        """What the capacity probe answers from now on: the engine's KV
        capacity in tokens, its block size and (0: unknown) its prefill rate."""
        self._capacity = (int(tokens), int(block_size), float(prefill_tokens_per_sec))

    def _capacity_cb(self, _ud: int, _sid: object, _sid_len: int, tokens: object, block: object, rate: object) -> bool:
        known = self._capacity
        if known is None:
            return False
        tokens[0], block[0], rate[0] = known  # type: ignore[index]
        return True

    def _usage_cb(self, _ud: int, sid: object, sid_len: int, out: object) -> bool:
        try:
            value = self._usage(ctypes.string_at(sid, sid_len) if sid_len else b"")  # type: ignore[misc]
        except Exception:  # noqa: BLE001 - a failed probe is "unavailable"
            return False
        if value is None or not math.isfinite(value):
            return False
        out[0] = float(value)  # type: ignore[index]
        return True

    def _prefix_cb(self, _ud: int, sid: object, sid_len: int, ids: object, n: int, out: object) -> bool:
        try:
            prompt = ctypes.cast(ids, POINTER(c_uint32 * n)).contents[:] if n else []
            value = self._prefix(ctypes.string_at(sid, sid_len) if sid_len else b"", prompt)  # type: ignore[misc]
        except Exception:  # noqa: BLE001
            return False
        if value is None or not math.isfinite(value):
            return False
        out[0] = float(value)  # type: ignore[index]
        return True

    def acquire(self, session: bytes, prompt: Sequence[int], timeout: Optional[float] = None) -> Admission:
        """Blocks (GIL released) until admitted; raises NotAdmitted otherwise."""
        sid, sid_len = _session_buf(session)
        ids = (c_uint32 * len(prompt))(*prompt) if len(prompt) else None
        timeout_ms = -1 if timeout is None else max(0, int(timeout * 1000))
        out = Admission()
        status = self._lib.kvgate_acquire(self._raw, sid, sid_len, ids, len(prompt), timeout_ms, ctypes.byref(out))
        if status == Status.OK:
            return out
        if status in (Status.PREEMPTED, Status.TIMED_OUT, Status.CANCELLED, Status.CLOSED):
            raise NotAdmitted(status, last_error())
        raise KvgateError(status, last_error())

    def release(self, lease: int) -> bool:
        """True if the lease was outstanding (a double release returns False)."""
        status = self._lib.kvgate_release(self._raw, lease)
        if status == Status.UNKNOWN_LEASE:
            return False
        _check(status)
        return True

    def release_with_report(self, lease: int, cached_tokens: Optional[int], output_tokens: Optional[int]) -> bool:
        """`release` with what the engine measured of the turn (None: unknown)."""
        cached = -1 if cached_tokens is None else int(cached_tokens)
        output = -1 if output_tokens is None else int(output_tokens)
        status = self._lib.kvgate_release_with_report(self._raw, lease, cached, output)
        if status == Status.UNKNOWN_LEASE:
            return False
        _check(status)
        return True

    def finish_session(self, session: bytes) -> bool:
        sid, sid_len = _session_buf(session)
        status = self._lib.kvgate_finish_session(self._raw, sid, sid_len, None, 0)
        if status == Status.NOT_FOUND:
            return False
        _check(status)
        return True

    def cancel_session(self, session: bytes) -> bool:
        """True if a waiting attempt of the session was cancelled."""
        sid, sid_len = _session_buf(session)
        status = self._lib.kvgate_cancel_session(self._raw, sid, sid_len)
        if status == Status.NOT_FOUND:
            return False
        _check(status)
        return True

    def metrics_text(self) -> str:
        needed = c_size_t(0)
        status = self._lib.kvgate_metrics_text(self._raw, None, 0, ctypes.byref(needed))
        buf = ctypes.create_string_buffer(1)
        while status == Status.BUFFER_TOO_SMALL:
            buf = ctypes.create_string_buffer(needed.value + 256)
            status = self._lib.kvgate_metrics_text(self._raw, buf, len(buf), ctypes.byref(needed))
        _check(status)
        return buf.value.decode()

    def free(self) -> None:
        """Frees the gate (waiters return CLOSED; outstanding leases released). Idempotent."""
        if self._raw:
            raw, self._raw = self._raw, None
            self._lib.kvgate_free(raw)


class AsyncGate:
    """asyncio face of a Gate: the blocking acquire runs in a thread executor.

    Cancelling the awaiting task cancels the session's attempt
    (kvgate_cancel_session) until the thread returns; a lease admitted in that
    instant is released, so a cancelled acquire never leaks a lease. Assumes at
    most one waiting attempt per session (kvgate's own rule: a newer attempt
    preempts an older one).
    """

    def __init__(self, gate: Gate, executor: Optional[concurrent.futures.Executor] = None) -> None:
        self.gate = gate
        self.executor = executor or concurrent.futures.ThreadPoolExecutor(max_workers=256, thread_name_prefix="kvgate")

    async def acquire(self, session: bytes, prompt: Sequence[int], timeout: Optional[float] = None) -> Admission:
        loop = asyncio.get_running_loop()
        attempt = loop.run_in_executor(self.executor, self.gate.acquire, session, prompt, timeout)
        try:
            return await asyncio.shield(attempt)
        except asyncio.CancelledError:
            while not attempt.done():
                self.gate.cancel_session(session)
                await asyncio.wait({attempt}, timeout=0.005)
            if not attempt.cancelled() and attempt.exception() is None:
                self.gate.release(attempt.result().lease)
            raise
