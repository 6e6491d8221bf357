"""The typed API: Config, Probes, Gate, Lease, and the two drivers of the
event-loop attempt (asyncio, and the calling thread for the sync path).

Both drivers run the same step machine of the C ABI (``kvgate_attempt_*``):

    PROBE_USAGE  -> call the usage (and capacity) probe -> answer_usage
    PROBE_PREFIX -> call the prefix probe               -> answer_prefix
    SLEEP        -> wait for the waker's tag or sleep_ns -> wake
    ADMITTED     -> a Lease                FAILED -> an AdmissionError

so the probes are plain Python calls (or awaits) on the caller's thread, no
C callback ever runs, and the library never calls into Python.
"""

from __future__ import annotations

import array
import asyncio
import collections.abc
import ctypes
import dataclasses
import inspect
import itertools
import logging
import math
import select
import threading
import warnings
from ctypes import byref, c_int32, c_size_t, c_uint64
from typing import (
    Any,
    Awaitable,
    Callable,
    Coroutine,
    Dict,
    List,
    NamedTuple,
    Optional,
    Sequence,
    Tuple,
    Union,
)

from . import _ffi
from ._errors import Closed, check, error_for
from ._ffi import AdmissionMode, Reason, Status, StepKind

log = logging.getLogger("kvgate")

Session = Union[str, bytes]
Prompt = Union[Sequence[int], int]
MaybeAwaitable = Union[Any, Awaitable[Any]]

NO_TIMER = 2**64 - 1  # kvgate_tick's "nothing pending"

# ---------------------------------------------------------------------------
# Configuration and probes
# ---------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Config:
    """The gate's knobs (``kvgate_config_set_*``); None keeps the library's
    default (see include/kvgate.h: kvgate_config_new)."""

    admission_mode: Union[AdmissionMode, str] = AdmissionMode.WORKING_SET
    #: Reference mode: KV usage at or above which the gate is under pressure.
    high_watermark: Optional[float] = None
    #: Reference mode: prefix hit ratio at or above which a prompt is resident.
    hit_threshold: Optional[float] = None
    #: Longest sleep of a waiting attempt that nobody wakes, seconds.
    wait_poll_sec: Optional[float] = None
    #: Reference mode: how long a session keeps its reservation after its
    #: last retaining lease is released, seconds (0: no window).
    idle_grace_sec: Optional[float] = None
    #: How long an idle session's record is kept without finish_session.
    session_retention_sec: Optional[float] = None

    @property
    def mode(self) -> AdmissionMode:
        mode = self.admission_mode
        if isinstance(mode, str):
            try:
                return AdmissionMode[mode.upper()]
            except KeyError:
                raise ValueError(
                    f"admission_mode {mode!r}: expected one of "
                    f"{[m.name.lower() for m in AdmissionMode]}"
                ) from None
        return AdmissionMode(mode)

    def _build(self) -> "ctypes._Pointer":
        lib = _ffi.load()
        raw = lib.kvgate_config_new()
        if not raw:
            check(Status.PANIC)
        try:
            check(lib.kvgate_config_set_admission_mode(raw, int(self.mode)))
            for field in dataclasses.fields(self):
                value = getattr(self, field.name)
                if field.name == "admission_mode" or value is None:
                    continue
                setter = getattr(lib, f"kvgate_config_set_{field.name}")
                check(setter(raw, float(value)))
        except BaseException:
            lib.kvgate_config_free(raw)
            raise
        return raw


class Capacity(NamedTuple):
    """What the capacity probe answers (``kvgate_capacity_fn``); 0 = unknown."""

    tokens: int = 0
    block_tokens: int = 0
    prefill_tokens_per_sec: float = 0.0


UsageProbe = Callable[[bytes], MaybeAwaitable]
CapacityProbe = Callable[[bytes], MaybeAwaitable]
PrefixProbe = Callable[[bytes, Sequence[int]], MaybeAwaitable]


@dataclasses.dataclass(frozen=True)
class Probes:
    """The engine's answers, asked by the attempt's steps. Each probe is a
    plain function or an ``async def``; it answers None (or NaN) when the
    engine cannot say. A probe that raises counts as unavailable (logged on
    the ``kvgate`` logger), as a C probe returning false would.

    - ``usage(session) -> float | None``: KV-cache usage in [0, 1].
    - ``capacity(session) -> Capacity | (tokens, block_tokens, prefill/s) | None``:
      asked with every usage probe in working-set mode.
    - ``prefix(session, prompt_ids) -> float | None``: resident fraction of
      the prompt (reference mode, under pressure). Not called when the turn
      was given as a prompt length only (then it is unavailable).
    """

    usage: Optional[UsageProbe] = None
    capacity: Optional[CapacityProbe] = None
    prefix: Optional[PrefixProbe] = None


# ---------------------------------------------------------------------------
# Figures
# ---------------------------------------------------------------------------


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
    working_set_prefill_share: float
    admissions_engine_idle: int
    working_set_idle_sec: float
    working_set_reprefill_sec: float


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


def _session_bytes(session: Session) -> bytes:
    if isinstance(session, str):
        return session.encode("utf-8")
    if isinstance(session, (bytes, bytearray, memoryview)):
        return bytes(session)
    raise TypeError(f"session must be str or bytes, not {type(session).__name__}")


def _token_array(ids: Sequence[int]) -> "Optional[ctypes.Array[ctypes.c_uint32]]":
    """The ids as a ``uint32_t`` array for the C call (None when empty: the
    ABI takes NULL with a zero length). ``array('I')`` converts a list of
    32k ids in about 0.2 ms, ctypes' own constructor in about 5 ms."""
    if len(ids) == 0:
        return None
    buf = ids if isinstance(ids, array.array) and ids.typecode == "I" else array.array("I", ids)
    return (ctypes.c_uint32 * len(buf)).from_buffer(buf)


def _prompt(prompt: Prompt) -> Tuple[Optional[Sequence[int]], int]:
    if isinstance(prompt, int):
        if prompt < 0:
            raise ValueError(f"prompt length {prompt} is negative")
        return None, prompt
    return prompt, len(prompt)


def _timeout_ms(timeout: Optional[float]) -> int:
    """None: no limit (-1); 0 or less: one pass (0); else milliseconds, rounded up."""
    if timeout is None:
        return -1
    if timeout != timeout:  # NaN
        raise ValueError("timeout is NaN")
    if timeout <= 0:
        return 0
    return max(1, math.ceil(timeout * 1000))


# ---------------------------------------------------------------------------
# Waker and attempt: thin typed objects over the C handles
# ---------------------------------------------------------------------------


class Waker:
    """A ``kvgate_waker`` with a descriptor: poll :attr:`fd` for
    readability, then :meth:`drain` the tags. One per event loop."""

    _DRAIN = 1024

    def __init__(self) -> None:
        self._lib = _ffi.load()
        raw = _ffi.waker_p()
        check(self._lib.kvgate_waker_new(byref(raw)))
        self._raw: Optional[_ffi.waker_p] = raw
        fd = c_int32()
        check(self._lib.kvgate_waker_fd(raw, byref(fd)))
        self.fd: int = fd.value
        self._buf = (c_uint64 * self._DRAIN)()
        self._count = c_size_t()

    def drain(self) -> List[int]:
        """Every tag delivered so far (possibly duplicated or stale)."""
        tags: List[int] = []
        while True:
            check(self._lib.kvgate_waker_drain(self._raw, self._buf, self._DRAIN, byref(self._count)))
            n = self._count.value
            tags.extend(self._buf[:n])
            if n < self._DRAIN:
                return tags

    def close(self) -> None:
        """Frees the host's reference (attempts begun with it keep it alive)."""
        if self._raw is not None:
            self._lib.kvgate_waker_free(self._raw)
            self._raw = None

    def __del__(self) -> None:
        self.close()


class Attempt:
    """A ``kvgate_attempt``, driven step by step (the low-level API the two
    drivers use; hosts with their own loop may use it directly). Each method
    performs one step and returns the next :class:`StepKind`; a call the
    attempt did not ask for raises :class:`OutOfOrder`."""

    __slots__ = ("_lib", "_raw", "_step", "gate", "session", "prompt_len", "timeout_ms", "tag", "__weakref__")

    def __init__(
        self,
        gate: "Gate",
        session: bytes,
        prompt_len: int,
        timeout_ms: int,
        waker: Waker,
        tag: int,
        ids: Optional[Sequence[int]] = None,
    ) -> None:
        """``ids``, when given, are the prompt's token ids (``prompt_len``
        of them): in working-set mode the gate sketches them, to expect a
        turn whose agent rewrote its history (compacted it, stubbed old tool
        results) to hit only what it kept."""
        self._lib = gate._lib
        self._raw: Optional[_ffi.attempt_p] = None
        self._step = _ffi.kvgate_step()
        self.gate, self.session, self.prompt_len = gate, session, prompt_len
        self.timeout_ms, self.tag = timeout_ms, tag
        raw = _ffi.attempt_p()
        sketch = ids is not None and gate._mode is AdmissionMode.WORKING_SET
        tokens = _token_array(ids) if sketch else None
        with gate._use() as g:
            if tokens is not None:
                status = self._lib.kvgate_attempt_begin_with_prompt(
                    g, session, len(session), tokens, prompt_len, timeout_ms, waker._raw, tag,
                    byref(raw), byref(self._step),
                )
            else:
                status = self._lib.kvgate_attempt_begin(
                    g, session, len(session), prompt_len, timeout_ms, waker._raw, tag,
                    byref(raw), byref(self._step),
                )
            check(status)
        self._raw = raw

    @property
    def kind(self) -> StepKind:
        return StepKind(self._step.kind)

    @property
    def step(self) -> _ffi.kvgate_step:
        """The last step (the C struct, read-only by convention)."""
        return self._step

    @property
    def sleep_ns(self) -> int:
        return self._step.sleep_ns

    @property
    def until_ns(self) -> int:
        return self._step.until_ns

    def _live(self) -> _ffi.attempt_p:
        if self._raw is None:
            raise error_for(Status.OUT_OF_ORDER, "the attempt was freed (Attempt.close)")
        return self._raw

    def answer_usage(self, usage: Optional[float], capacity: Optional[Capacity] = None) -> StepKind:
        cap = capacity or Capacity()
        check(
            self._lib.kvgate_attempt_answer_usage(
                self._live(), math.nan if usage is None else float(usage),
                int(cap.tokens), int(cap.block_tokens), float(cap.prefill_tokens_per_sec),
                byref(self._step),
            )
        )
        return StepKind(self._step.kind)

    def answer_prefix(self, hit_ratio: Optional[float]) -> StepKind:
        check(
            self._lib.kvgate_attempt_answer_prefix(
                self._live(), math.nan if hit_ratio is None else float(hit_ratio), byref(self._step)
            )
        )
        return StepKind(self._step.kind)

    def wake(self) -> StepKind:
        check(self._lib.kvgate_attempt_wake(self._live(), byref(self._step)))
        return StepKind(self._step.kind)

    def cancel(self) -> None:
        """Cancels the attempt if it has not ended (counted as cancelled)."""
        check(self._lib.kvgate_attempt_cancel(self._live()))

    def close(self) -> None:
        """Frees the attempt, cancelling it first if it has not ended."""
        if self._raw is not None:
            self._lib.kvgate_attempt_free(self._raw)
            self._raw = None

    def __del__(self) -> None:
        self.close()

    def failure(self):
        """The exception of a FAILED step."""
        status = self._step.status
        who = self.session.decode("utf-8", "replace")
        what = {
            Status.PREEMPTED: "preempted by a newer attempt of the same session",
            Status.TIMED_OUT: f"not admitted within timeout_ms = {self.timeout_ms}",
            Status.CANCELLED: "cancelled",
            Status.CLOSED: "the gate is closed",
        }.get(status, _status_name(status))
        return error_for(status, f"session {who!r}: {what}")

    def lease(self) -> "Lease":
        """The lease of an ADMITTED step."""
        return Lease(self.gate, self.session, self._step.admission)


def _status_name(status: int) -> str:
    return _ffi.load().kvgate_status_str(status).decode()


# ---------------------------------------------------------------------------
# Lease
# ---------------------------------------------------------------------------


class Lease:
    """One admitted turn. Release it once when the engine is done with the
    turn: ``with``/``async with`` does it on every exit path; a lease that is
    garbage-collected unreleased is released then, with a ResourceWarning.

    ``retain_session``: whether the lease holds the session's place. In
    reference mode, its reservation (``RESERVED_SESSION`` and
    ``RESIDENT_PREFIX`` admissions; counted in
    :attr:`SessionStats.retaining_leases`); in working-set mode always True,
    its place in the working set, which is no reservation (the session's
    reservation figures read 0 / False)."""

    __slots__ = (
        "gate", "session", "handle", "reason", "wait_sec", "usage", "hit_ratio",
        "retain_session", "waited", "_released",
    )

    def __init__(self, gate: "Gate", session: bytes, admission: _ffi.kvgate_admission) -> None:
        self.gate = gate
        self.session = session
        self.handle: int = admission.lease
        try:
            self.reason: Reason = Reason(admission.reason)
        except ValueError:  # a reason a newer library added
            self.reason = admission.reason  # type: ignore[assignment]
        self.wait_sec: float = admission.wait_sec
        self.usage: float = admission.usage
        self.hit_ratio: float = admission.hit_ratio
        self.retain_session: bool = admission.retain_session
        self.waited: bool = admission.waited
        self._released = False

    @property
    def released(self) -> bool:
        return self._released

    def release(self, cached_tokens: Optional[int] = None, output_tokens: Optional[int] = None) -> bool:
        """Releases the lease with what the engine reported of the turn (the
        prompt tokens served from its prefix cache, the tokens generated;
        None = unknown). True if this call released it; False if it was
        released already (by an earlier call, or by Gate.close)."""
        if self._released:
            return False
        self._released = True
        return self.gate._release(
            self.handle,
            -1 if cached_tokens is None else int(cached_tokens),
            -1 if output_tokens is None else int(output_tokens),
        )

    def __enter__(self) -> "Lease":
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    def __del__(self) -> None:
        if getattr(self, "_released", True):
            return
        try:
            warnings.warn(
                f"kvgate lease {self.handle} of session {self.session!r} was never released: "
                "released by the garbage collector",
                ResourceWarning,
                source=self,
            )
            self.release()
        except Exception:  # noqa: BLE001 - interpreter shutdown: nothing left to release into
            pass

    def __repr__(self) -> str:
        state = "released" if self._released else "held"
        return f"<kvgate.Lease {self.handle} {self.session!r} {getattr(self.reason, 'name', self.reason)} {state}>"


# ---------------------------------------------------------------------------
# The asyncio driver: one per gate per loop
# ---------------------------------------------------------------------------


def _set_result(fut: "asyncio.Future[None]") -> None:
    if not fut.done():
        fut.set_result(None)


class _LoopDriver:
    """One waker watched with ``loop.add_reader``, the futures of the
    attempts that sleep (by tag), and one timer for the gate's own
    deadlines (``kvgate_tick``). Runs only on its loop's thread."""

    def __init__(self, gate: "Gate", loop: asyncio.AbstractEventLoop) -> None:
        self.gate, self.loop = gate, loop
        self.waker = Waker()
        self.tags = itertools.count(1)
        self.sleeping: Dict[int, "asyncio.Future[None]"] = {}
        self.timer: Optional[asyncio.TimerHandle] = None
        self.timer_at = math.inf
        loop.add_reader(self.waker.fd, self._on_readable)

    def _on_readable(self) -> None:
        sleeping = self.sleeping
        for tag in self.waker.drain():
            fut = sleeping.get(tag)
            if fut is not None and not fut.done():
                fut.set_result(None)
        self.reschedule()

    def reschedule(self) -> None:
        """Fires the gate's due deadlines and arms the one timer for the next."""
        sleep_ns = self.gate._tick()
        if sleep_ns is None:
            if self.timer is not None:
                self.timer.cancel()
                self.timer, self.timer_at = None, math.inf
            return
        at = self.loop.time() + sleep_ns / 1e9
        if self.timer is not None:
            if abs(self.timer_at - at) < 1e-4:
                return
            self.timer.cancel()
        self.timer, self.timer_at = self.loop.call_at(at, self._on_timer), at

    def _on_timer(self) -> None:
        self.timer, self.timer_at = None, math.inf
        self.reschedule()

    async def sleep(self, attempt: Attempt) -> None:
        """Until the attempt's tag arrives or its sleep_ns pass."""
        fut = self.loop.create_future()
        self.sleeping[attempt.tag] = fut
        timer = self.loop.call_later(attempt.sleep_ns / 1e9, _set_result, fut)
        # The step may have moved the gate's next deadline (an admission
        # opened a window, say): look again before sleeping on it.
        self.reschedule()
        try:
            await fut
        finally:
            timer.cancel()
            del self.sleeping[attempt.tag]

    def close(self) -> None:
        """Wakes every sleeping attempt (they then see CLOSED) and stops
        watching the descriptor."""
        for fut in self.sleeping.values():
            _set_result(fut)
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        if not self.loop.is_closed():
            self.loop.remove_reader(self.waker.fd)
        self.waker.close()


class _Acquire(collections.abc.Coroutine):
    """What ``Gate.acquire`` returns: ``async with`` it (the lease is
    released on exit), or ``await`` it / hand it to ``asyncio.create_task``
    (a coroutine: the caller then releases the lease)."""

    __slots__ = ("_coro", "_lease")

    def __init__(self, coro: Coroutine[Any, Any, Lease]) -> None:
        self._coro, self._lease = coro, None

    def send(self, value: Any) -> Any:
        return self._coro.send(value)

    def throw(self, *args: Any) -> Any:
        return self._coro.throw(*args)

    def close(self) -> None:
        self._coro.close()

    def __await__(self):
        return self._coro.__await__()

    async def __aenter__(self) -> Lease:
        self._lease = await self._coro
        return self._lease

    async def __aexit__(self, *exc: object) -> None:
        lease, self._lease = self._lease, None
        if lease is not None:
            lease.release()


class _Use:
    """``with gate._use() as raw``: the gate handle, kept from being freed
    (by a close on another thread) until the block ends."""

    __slots__ = ("gate",)

    def __init__(self, gate: "Gate") -> None:
        self.gate = gate

    def __enter__(self) -> _ffi.gate_p:
        gate = self.gate
        with gate._lock:
            if gate._closing:
                raise error_for(Status.CLOSED, "the gate is closed (Gate.close)")
            gate._users += 1
            return gate._raw

    def __exit__(self, *exc: object) -> None:
        gate = self.gate
        with gate._lock:
            gate._users -= 1
            free = gate._closing and gate._users == 0
        if free:
            gate._free()


# ---------------------------------------------------------------------------
# Gate
# ---------------------------------------------------------------------------


class Gate:
    """An admission gate.

    ``async with gate.acquire(session, prompt) as lease:`` in asyncio code;
    ``with gate.acquire_sync(session, prompt) as lease:`` anywhere else
    (it waits in the calling thread, on the waker's descriptor). No thread
    is ever started, and no C callback ever calls into Python.
    """

    def __init__(self, config: Optional[Config] = None, probes: Optional[Probes] = None) -> None:
        self._lib = _ffi.load()
        self.config = config or Config()
        self.probes = probes or Probes()
        self._mode = self.config.mode
        self._lock = threading.Lock()
        self._users = 0
        self._closing = False
        self._raw: Optional[_ffi.gate_p] = None
        self._drivers: Dict[asyncio.AbstractEventLoop, _LoopDriver] = {}
        raw_config = self.config._build()
        try:
            raw = _ffi.gate_p()
            check(self._lib.kvgate_new(raw_config, byref(raw)))
        finally:
            self._lib.kvgate_config_free(raw_config)
        self._raw = raw

    # -- handle lifetime ---------------------------------------------------

    def _use(self) -> _Use:
        return _Use(self)

    @property
    def closed(self) -> bool:
        return self._closing

    def close(self) -> None:
        """Closes the gate: waiting attempts end with :class:`Closed` (their
        tasks or threads see it), new ones are refused, outstanding leases
        are released, and the library's gate is freed once no call on it is
        in progress. Idempotent."""
        with self._lock:
            if self._closing or self._raw is None:
                return
            self._closing = True
            self._users += 1  # the close itself
            raw = self._raw
        try:
            self._lib.kvgate_close(raw)
            for driver in list(self._drivers.values()):
                self._close_driver(driver)
            self._drivers.clear()
        finally:
            with self._lock:
                self._users -= 1
                free = self._users == 0
            if free:
                self._free()

    def _close_driver(self, driver: _LoopDriver) -> None:
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is driver.loop or driver.loop.is_closed() or not driver.loop.is_running():
            driver.close()
        else:
            driver.loop.call_soon_threadsafe(driver.close)

    def _free(self) -> None:
        with self._lock:
            raw, self._raw = self._raw, None
        if raw is not None:
            self._lib.kvgate_free(raw)

    def __enter__(self) -> "Gate":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    async def __aenter__(self) -> "Gate":
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        if getattr(self, "_raw", None) is not None:
            self.close()

    # -- asyncio -----------------------------------------------------------

    def acquire(self, session: Session, prompt: Prompt, timeout: Optional[float] = None) -> _Acquire:
        """Waits in the running asyncio loop until the turn is admitted.

        ``prompt`` is the prompt's token ids (passed to the prefix probe) or
        just its length. ``timeout`` in seconds: None waits without limit, 0
        makes one pass. Raises Preempted, TimedOut, Cancelled or Closed when
        the attempt ends without a lease. Cancelling the awaiting task
        cancels the attempt (counted in stats as cancelled)."""
        ids, prompt_len = _prompt(prompt)
        return _Acquire(self._acquire_async(_session_bytes(session), ids, prompt_len, _timeout_ms(timeout)))

    def _driver(self, loop: asyncio.AbstractEventLoop) -> _LoopDriver:
        driver = self._drivers.get(loop)
        if driver is None:
            for old in [l for l in self._drivers if l.is_closed()]:
                self._drivers.pop(old).close()
            with self._use():
                driver = self._drivers[loop] = _LoopDriver(self, loop)
        return driver

    async def _acquire_async(
        self, session: bytes, ids: Optional[Sequence[int]], prompt_len: int, timeout_ms: int
    ) -> Lease:
        driver = self._driver(asyncio.get_running_loop())
        attempt = Attempt(self, session, prompt_len, timeout_ms, driver.waker, next(driver.tags), ids)
        try:
            while True:
                kind = attempt.kind
                if kind is StepKind.SLEEP:
                    await driver.sleep(attempt)
                    attempt.wake()
                elif kind is StepKind.PROBE_USAGE:
                    usage = self._call_probe("usage", self.probes.usage, session)
                    if inspect.isawaitable(usage):
                        usage = await _await_probe("usage", usage)
                    capacity = None
                    if self._asks_capacity():
                        answer = self._call_probe("capacity", self.probes.capacity, session)
                        if inspect.isawaitable(answer):
                            answer = await _await_probe("capacity", answer)
                        capacity = _capacity(answer)
                    attempt.answer_usage(usage, capacity)
                elif kind is StepKind.PROBE_PREFIX:
                    hit = None
                    if ids is not None and self.probes.prefix is not None:
                        hit = self._call_probe("prefix", self.probes.prefix, session, ids)
                        if inspect.isawaitable(hit):
                            hit = await _await_probe("prefix", hit)
                    attempt.answer_prefix(hit)
                elif kind is StepKind.ADMITTED:
                    return attempt.lease()
                else:
                    raise attempt.failure()
        finally:
            # Cancellation (of a sleep or of an awaited probe) or any error
            # lands here too: an attempt not ended is cancelled by the free.
            attempt.close()

    # -- the calling thread ------------------------------------------------

    def acquire_sync(self, session: Session, prompt: Prompt, timeout: Optional[float] = None) -> Lease:
        """Blocks the calling thread until the turn is admitted (probes are
        called on it; async probes are refused here: use :meth:`acquire`).
        Returns the Lease, which is also a context manager."""
        ids, prompt_len = _prompt(prompt)
        session_b = _session_bytes(session)
        waker = Waker()
        attempt = None
        try:
            attempt = Attempt(self, session_b, prompt_len, _timeout_ms(timeout), waker, 1, ids)
            poller = select.poll()
            poller.register(waker.fd, select.POLLIN)
            while True:
                kind = attempt.kind
                if kind is StepKind.SLEEP:
                    self._sleep_sync(attempt, waker, poller)
                    attempt.wake()
                elif kind is StepKind.PROBE_USAGE:
                    usage = _not_awaitable("usage", self._call_probe("usage", self.probes.usage, session_b))
                    capacity = None
                    if self._asks_capacity():
                        capacity = _capacity(
                            _not_awaitable(
                                "capacity", self._call_probe("capacity", self.probes.capacity, session_b)
                            )
                        )
                    attempt.answer_usage(usage, capacity)
                elif kind is StepKind.PROBE_PREFIX:
                    hit = None
                    if ids is not None and self.probes.prefix is not None:
                        hit = _not_awaitable(
                            "prefix", self._call_probe("prefix", self.probes.prefix, session_b, ids)
                        )
                    attempt.answer_prefix(hit)
                elif kind is StepKind.ADMITTED:
                    return attempt.lease()
                else:
                    raise attempt.failure()
        finally:
            if attempt is not None:
                attempt.close()
            waker.close()

    def _sleep_sync(self, attempt: Attempt, waker: Waker, poller: "select.poll") -> None:
        """Until a tag arrives on this call's own waker or until_ns passes;
        fires the gate's deadlines (kvgate_tick) meanwhile."""
        until = attempt.until_ns
        while True:
            now = self.now_ns()
            if now is None or now >= until:
                return
            wait_ns = until - now
            gate_ns = self._tick()
            if gate_ns is not None:
                wait_ns = min(wait_ns, gate_ns)
            if poller.poll(math.ceil(wait_ns / 1e6)) and waker.drain():
                return

    # -- probes --------------------------------------------------------------

    def _asks_capacity(self) -> bool:
        """Whether the capacity probe goes with the usage answer just received:
        only in working-set mode (reference mode never asks it), and never
        once the gate is closed, e.g. by the usage probe itself: after a
        close (which frees the library's gate) no probe is called again,
        and the attempt ends with Closed on the usage answer."""
        return self._mode is AdmissionMode.WORKING_SET and self.probes.capacity is not None and not self._closing

    def _call_probe(self, name: str, probe: Optional[Callable[..., Any]], *args: Any) -> Any:
        if probe is None:
            return None
        try:
            return probe(*args)
        except Exception:  # noqa: BLE001 - a failed probe is "unavailable"
            log.warning("kvgate: the %s probe raised; answered unavailable", name, exc_info=True)
            return None

    # -- the rest of the C API -------------------------------------------------

    def _release(self, handle: int, cached: int, output: int) -> bool:
        try:
            with self._use() as g:
                status = self._lib.kvgate_release_with_report(g, handle, cached, output)
        except Closed:
            return False  # the close released it
        if status == Status.UNKNOWN_LEASE:
            return False
        check(status)
        try:
            driver = self._drivers.get(asyncio.get_running_loop())
        except RuntimeError:
            driver = None
        if driver is not None:
            driver.reschedule()
        return True

    def _tick(self) -> Optional[int]:
        """kvgate_tick: fires what is due; ns until the next call, or None."""
        until, sleep = c_uint64(), c_uint64()  # per call: threads may tick at once
        try:
            with self._use() as g:
                check(self._lib.kvgate_tick(g, byref(until), byref(sleep)))
        except Closed:
            return None
        return None if sleep.value == NO_TIMER else sleep.value

    def now_ns(self) -> Optional[int]:
        """The gate's clock (ns), or None once closed."""
        out = c_uint64()
        try:
            with self._use() as g:
                check(self._lib.kvgate_now_ns(g, byref(out)))
        except Closed:
            return None
        return out.value

    def finish_session(self, session: Session) -> Optional[SessionStats]:
        """Ends the session's ownership window; its final figures, or None if
        the session is not tracked."""
        return self._session_call(self._lib.kvgate_finish_session, session)

    def session_stats(self, session: Session) -> Optional[SessionStats]:
        """The session's figures, or None if it is not tracked."""
        return self._session_call(self._lib.kvgate_get_session_stats, session)

    def _session_call(self, fn, session: Session) -> Optional[SessionStats]:
        sid = _session_bytes(session)
        out = _ffi.kvgate_session_stats()
        with self._use() as g:
            status = fn(g, sid, len(sid), byref(out), ctypes.sizeof(out))
        if status == Status.NOT_FOUND:
            return None
        check(status)
        return _from_struct(SessionStats, out)

    def cancel_session(self, session: Session) -> bool:
        """Cancels the session's waiting attempt (it raises Cancelled); False
        if none was waiting."""
        sid = _session_bytes(session)
        with self._use() as g:
            status = self._lib.kvgate_cancel_session(g, sid, len(sid))
        if status == Status.NOT_FOUND:
            return False
        check(status)
        return True

    def stats(self) -> Stats:
        out = _ffi.kvgate_stats()
        with self._use() as g:
            check(self._lib.kvgate_get_stats(g, byref(out), ctypes.sizeof(out)))
        return _from_struct(Stats, out)

    def metrics_text(self) -> str:
        """The gate's figures in Prometheus text format (``kvgate_*``)."""
        needed = c_size_t(0)
        with self._use() as g:
            status = self._lib.kvgate_metrics_text(g, None, 0, byref(needed))
            while status == Status.BUFFER_TOO_SMALL:
                buf = ctypes.create_string_buffer(needed.value + 64)
                status = self._lib.kvgate_metrics_text(g, buf, len(buf), byref(needed))
        check(status)
        return buf.value.decode()


async def _await_probe(name: str, pending: Awaitable[Any]) -> Any:
    try:
        return await pending
    except Exception:  # noqa: BLE001 - a failed probe is "unavailable"
        log.warning("kvgate: the %s probe raised; answered unavailable", name, exc_info=True)
        return None


def _not_awaitable(name: str, value: Any) -> Any:
    if inspect.isawaitable(value):
        if inspect.iscoroutine(value):
            value.close()
        raise TypeError(f"the {name} probe is async: acquire_sync calls probes in the calling thread; use Gate.acquire")
    return value


def _capacity(answer: Any) -> Optional[Capacity]:
    if answer is None:
        return None
    if isinstance(answer, Capacity):
        return answer
    return Capacity(*answer)


def version() -> str:
    """The loaded library's version (``kvgate_version()``)."""
    return _ffi.load().kvgate_version().decode()
