"""Gate: the gate's handle and its life, the two drivers of the
event-loop attempt (asyncio, with ``_asyncio._LoopDriver``; and the calling
thread for the sync path), the probes' calls, and the rest of the C API.

Both drivers run the same step machine of the C ABI (``kvgate_attempt_*``):

    PROBE_USAGE  -> call the usage (and capacity) probe -> answer_usage
    PROBE_PREFIX -> call the prefix probe               -> answer_prefix
    SLEEP        -> wait for the waker's tag or sleep_ns -> wake
    ADMITTED     -> a Lease                FAILED -> an AdmissionError

so the probes are plain Python calls (or awaits) on the caller's thread, no
C callback ever runs, and the library never calls into Python.
"""

from __future__ import annotations

import asyncio
import ctypes
import inspect
import logging
import math
import select
import threading
from ctypes import byref, c_size_t, c_uint64
from typing import Any, Callable, Dict, Optional, Sequence

from . import _ffi
from ._args import Prompt, Session, _prompt, _session_bytes, _timeout_ms, checked_count
from ._asyncio import _Acquire, _AttemptRef, _await_probe, _LoopDriver, _ProbeHung
from ._attempt import Attempt, Waker
from ._config import Config, Probes, _capacity
from ._errors import CacheHot, Closed, check, error_for
from ._ffi import AdmissionMode, Status, StepKind
from ._figures import SessionStats, Stats, _from_struct
from ._lease import Lease

log = logging.getLogger("kvgate")

NO_TIMER = 2**64 - 1  # kvgate_tick's "nothing pending"


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

    def acquire(
        self,
        session: Session,
        prompt: Prompt,
        timeout: Optional[float] = None,
        *,
        release_if_cache_gone: bool = False,
    ) -> _Acquire:
        """Waits in the running asyncio loop until the turn is admitted.

        ``prompt`` is the prompt's token ids (passed to the prefix probe) or
        just its length. ``timeout`` in seconds: None waits without limit, 0
        makes one pass. Raises Preempted, TimedOut, Cancelled or Closed when
        the attempt ends without a lease; a probe still out when a timeout
        > 0 passes is cancelled and the attempt ends with TimedOut (counted
        in stats as timed out). Cancelling the awaiting task cancels the
        attempt (counted in stats as cancelled).

        ``release_if_cache_gone=True`` (working-set mode; a host that can
        place the turn on another replica): if the first pass leaves the
        turn waiting and the gate counts the session's cache gone here (new,
        parked, or a ghost: :meth:`release_elsewhere`), the attempt ends at
        once with :class:`Released`; a session whose cache the gate holds
        hot keeps waiting in its place. Asked once, right after the first
        pass, in the same step of the loop, so no admission can come
        between. A gate in reference mode raises InvalidArgument (it cannot
        tell)."""
        return self._acquire_ref(session, prompt, timeout, None, release_if_cache_gone)

    def _acquire_ref(
        self,
        session: Session,
        prompt: Prompt,
        timeout: Optional[float],
        ref: Optional[_AttemptRef],
        release_if_cache_gone: bool = False,
    ) -> _Acquire:
        """``acquire``, telling ``ref`` its attempt once begun, so that the
        caller can end it with the outcome it saw (the drop-in's abort)."""
        ids, prompt_len = _prompt(prompt)
        self._check_can_release(release_if_cache_gone)
        return _Acquire(
            self._acquire_async(
                _session_bytes(session), ids, prompt_len, _timeout_ms(timeout), ref, release_if_cache_gone
            )
        )

    def _check_can_release(self, release_if_cache_gone: bool) -> None:
        if release_if_cache_gone and self._mode is not AdmissionMode.WORKING_SET:
            raise error_for(
                Status.INVALID_ARGUMENT,
                "release_if_cache_gone needs working-set admission (a reference gate cannot tell a session's cache)",
            )

    def _released_at_first_sleep(self, attempt: Attempt) -> bool:
        """After the first pass left ``attempt`` waiting: releases its turn
        if the gate counts its cache gone, and steps it (now FAILED with
        RELEASED). False, and it keeps waiting, when the gate holds its cache
        hot or it no longer waits."""
        try:
            released = self.release_elsewhere(attempt.session)
        except CacheHot:
            return False
        if released:
            attempt.wake()
        return released

    def _driver(self, loop: asyncio.AbstractEventLoop) -> _LoopDriver:
        driver = self._drivers.get(loop)
        if driver is None:
            for old in [l for l in self._drivers if l.is_closed()]:
                self._drivers.pop(old).close()
            with self._use():
                driver = self._drivers[loop] = _LoopDriver(self, loop)
        return driver

    async def _acquire_async(
        self,
        session: bytes,
        ids: Optional[Sequence[int]],
        prompt_len: int,
        timeout_ms: int,
        ref: Optional[_AttemptRef] = None,
        release_if_cache_gone: bool = False,
    ) -> Lease:
        loop = asyncio.get_running_loop()
        driver = self._driver(loop)
        attempt = Attempt(self, session, prompt_len, timeout_ms, driver.waker, next(driver.tags), ids)
        if ref is not None:
            ref.attempt = attempt
        # A probe still out at the timeout ends the attempt then (timeout 0:
        # one pass whose probes are awaited; the gate's own clock ends a sleep).
        deadline = loop.time() + timeout_ms / 1000 if timeout_ms > 0 else None
        try:
            while True:
                kind = attempt.kind
                if kind is StepKind.SLEEP:
                    if release_if_cache_gone:
                        release_if_cache_gone = False  # asked once, after the first pass
                        if self._released_at_first_sleep(attempt):
                            continue
                    await driver.sleep(attempt)
                    attempt.wake()
                elif kind is StepKind.PROBE_USAGE:
                    usage = self._call_probe("usage", self.probes.usage, session)
                    if inspect.isawaitable(usage):
                        usage = await _await_probe("usage", usage, deadline)
                    capacity = None
                    if self._asks_capacity():
                        answer = self._call_probe("capacity", self.probes.capacity, session)
                        if inspect.isawaitable(answer):
                            answer = await _await_probe("capacity", answer, deadline)
                        capacity = _capacity(answer)
                    attempt.answer_usage(usage, capacity)
                elif kind is StepKind.PROBE_PREFIX:
                    hit = None
                    if ids is not None and self.probes.prefix is not None:
                        hit = self._call_probe("prefix", self.probes.prefix, session, ids)
                        if inspect.isawaitable(hit):
                            hit = await _await_probe("prefix", hit, deadline)
                    attempt.answer_prefix(hit)
                elif kind is StepKind.ADMITTED:
                    return attempt.lease()
                else:
                    raise attempt.failure()
        except _ProbeHung:
            attempt.end(Status.TIMED_OUT)
            raise attempt.failure() from None
        finally:
            # Cancellation (of a sleep or of an awaited probe) or any error
            # lands here too: an attempt not ended is cancelled by the free.
            attempt.close()

    # -- the calling thread ------------------------------------------------

    def acquire_sync(
        self,
        session: Session,
        prompt: Prompt,
        timeout: Optional[float] = None,
        *,
        release_if_cache_gone: bool = False,
    ) -> Lease:
        """Blocks the calling thread until the turn is admitted (probes are
        called on it; async probes are refused here: use :meth:`acquire`).
        Returns the Lease, which is also a context manager.
        ``release_if_cache_gone`` as in :meth:`acquire`."""
        ids, prompt_len = _prompt(prompt)
        self._check_can_release(release_if_cache_gone)
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
                    if release_if_cache_gone:
                        release_if_cache_gone = False  # asked once, after the first pass
                        if self._released_at_first_sleep(attempt):
                            continue
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

    def _release(self, handle: int, cached: int, output: int, tier_cached: int = -1) -> bool:
        """Releases with a report (negative figures: unknown). Raises
        ValueError, the lease still held, for a report the library refuses."""
        try:
            with self._use() as g:
                status = self._lib.kvgate_release_with_tier_report(g, handle, cached, output, tier_cached)
        except Closed:
            return False  # the close released it
        if status == Status.UNKNOWN_LEASE:
            return False
        if status == Status.INVALID_ARGUMENT:
            raise ValueError(_ffi.last_error())
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
        return self._on_waiting_turn(self._lib.kvgate_cancel_session, session)

    def release_elsewhere(self, session: Session) -> bool:
        """Releases the session's waiting turn to another replica, where the
        gate counts its cache gone (a new, parked or ghost session): its
        attempt raises Released and it leaves the queue. False if no turn
        of the session waits here. A session whose cache the gate holds hot
        raises CacheHot and keeps its place; a gate without working-set
        admission raises InvalidArgument (it cannot tell)."""
        return self._on_waiting_turn(self._lib.kvgate_release_elsewhere, session)

    def _on_waiting_turn(self, call: Callable[..., int], session: Session) -> bool:
        """Calls `call(gate, id, len)` on the session's waiting turn: False
        if none waits (NOT_FOUND), True once done; other statuses raise."""
        sid = _session_bytes(session)
        with self._use() as g:
            status = call(g, sid, len(sid))
        if status == Status.NOT_FOUND:
            return False
        check(status)
        return True

    def set_rebuild_cost(self, secs_per_token: float, secs_per_pair: float) -> None:
        """Tells the gate what the engine's prefill costs: seconds per
        prefilled token and per attended query-key pair (a host that fits its
        engine's step costs calls it again as it refits). A term that is not
        finite, a per-token term <= 0 or a negative per-pair term raises
        InvalidArgument and the gate keeps the cost it had. Ignored in
        reference mode."""
        with self._use() as g:
            check(self._lib.kvgate_set_rebuild_cost(g, float(secs_per_token), float(secs_per_pair)))

    def set_budget(self, session: Session, turns: Optional[int] = None, tokens: Optional[int] = None) -> None:
        """Tells how far ``session`` may run when the host knows it (an RL
        rollout's most turns and/or most tokens of history; None: not known),
        before or at its first acquire. A later call replaces it; ``finish_session`` forgets it.
        0, a negative, NaN or fractional figure, or tokens past the engine's
        ``max_model_len`` when that is known, raises ValueError naming the
        figure, and the gate keeps the budget it had. Checked, and stored
        nowhere, in reference mode."""
        sid = _session_bytes(session)
        t = 0 if turns is None else checked_count("turns", turns, 2**32 - 1)
        k = 0 if tokens is None else checked_count("tokens", tokens)
        with self._use() as g:
            status = self._lib.kvgate_session_set_budget(g, sid, len(sid), t, k)
        if status == Status.INVALID_ARGUMENT:
            raise ValueError(_ffi.last_error())
        check(status)

    def save_summary(self) -> bytes:
        """A summary of what the gate learned (its means, the finished
        sessions' turn counts, the prefill figures it measured) and of its
        engine, for ``load_summary`` after a restart (a few hundred bytes)."""
        needed = c_size_t(0)
        buf = (ctypes.c_uint8 * 0)()
        with self._use() as g:
            status = self._lib.kvgate_summary_save(g, None, 0, byref(needed))
            while status == Status.BUFFER_TOO_SMALL:
                # The gate may learn between the calls: ask until it fits.
                buf = (ctypes.c_uint8 * needed.value)()
                status = self._lib.kvgate_summary_save(g, buf, len(buf), byref(needed))
            check(status)
        return bytes(buf[: needed.value])

    def load_summary(self, data: bytes) -> None:
        """Adopts a summary ``save_summary`` wrote, replacing what the gate
        learned, whole or not at all. A truncated or corrupted summary, one
        of another version or of another engine raises ValueError saying
        which, and the gate goes on as if none were given. Before the
        engine's first capacity answer it is kept, and adopted then only if
        the engine matches."""
        blob = bytes(data)
        with self._use() as g:
            status = self._lib.kvgate_summary_load(g, blob, len(blob))
        if status == Status.INVALID_ARGUMENT:
            raise ValueError(_ffi.last_error())
        check(status)

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


def _not_awaitable(name: str, value: Any) -> Any:
    if inspect.isawaitable(value):
        if inspect.iscoroutine(value):
            value.close()
        raise TypeError(f"the {name} probe is async: acquire_sync calls probes in the calling thread; use Gate.acquire")
    return value


def version() -> str:
    """The loaded library's version (``kvgate_version()``)."""
    return _ffi.load().kvgate_version().decode()
