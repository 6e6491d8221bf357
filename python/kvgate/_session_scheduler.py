"""SessionLevelScheduler: a drop-in for the session-level scheduler of
Lego-RL's chat-completion proxy (``_SessionLevelScheduler``), backed by
:class:`kvgate.Gate`.

Same construction (a verl server manager), same environment knobs, same
calls (``await acquire(session_id, prompt_ids, abort_event=...)``,
``await lease.release()``, ``await finish_session(session_id, reason)``),
same probes (``server_manager.kv_cache_usage_probe`` /
``prefix_cache_probe``, dicts with ``kv_cache_usage`` / ``hit_ratio``; a
missing method, an exception, a non-dict, a missing key or a non-number is
"unavailable"). What decides is the gate's core, not this module: it only
translates the probes' answers and the leases (docs/migrating.md).

Modes, read once from the environment when the scheduler is built:

- ``HARBOR_SESSION_LEVEL_SCHEDULER``: off (the default) unless set to
  something other than ``""``, ``0``, ``false``, ``no`` or ``off`` (trimmed,
  any case); off, ``acquire`` returns at once with reason ``disabled`` and
  nothing is probed.
- On, with none of the four ``HARBOR_SESSION_SCHEDULER_*`` knobs set:
  kvgate's working-set admission at its defaults.
- On, with any of them set to something other than blanks: the seed's
  table (reference mode) with the seed's values, parsed as the seed parses
  them (an unparseable value, the empty one included, is the default; the
  poll interval at least 5 s, the grace at least 0 s). A knob set to ``""``
  is the seed's default, as unset, so it does not select the table.
"""

from __future__ import annotations

import asyncio
import contextvars
import inspect
import logging
import math
import os
import sys
from typing import Any, Coroutine, Mapping, Optional, Sequence, Union

from ._asyncio import _AttemptRef
from ._config import Capacity, Config, Probes
from ._errors import Preempted, TimedOut
from ._ffi import AdmissionMode, Status
from ._gate import Gate
from ._lease import Lease

log = logging.getLogger("kvgate")

ENABLE_ENV = "HARBOR_SESSION_LEVEL_SCHEDULER"
HIGH_WATERMARK_ENV = "HARBOR_SESSION_SCHEDULER_HIGH_WATERMARK"
HIT_THRESHOLD_ENV = "HARBOR_SESSION_SCHEDULER_HIT_THRESHOLD"
WAIT_POLL_ENV = "HARBOR_SESSION_SCHEDULER_WAIT_POLL_SEC"
IDLE_GRACE_ENV = "HARBOR_SESSION_SCHEDULER_IDLE_GRACE_SEC"
#: Setting any of these (to something other than blanks) selects reference mode.
REFERENCE_KNOBS = (HIGH_WATERMARK_ENV, HIT_THRESHOLD_ENV, WAIT_POLL_ENV, IDLE_GRACE_ENV)

_FALSY = ("", "0", "false", "no", "off")
_MAX_SEC = 100 * 365 * 24 * 3600  # the longest duration the library accepts
_TINY = sys.float_info.min  # the smallest positive threshold (see _Table)
#: How long after its timeout an acquire whose probe never returns ends.
PROBE_GRACE_SEC = 0.1

SessionId = Union[str, bytes]


class AdmissionPreempted(Preempted):
    """The attempt was preempted: its ``abort_event`` was set (the seed's
    ``_AdmissionPreempted``; the proxy answers it with HTTP 409, and so does
    a server that reads ``http_status``), or a newer attempt of the same
    session began in the gate. ``str()`` and ``message`` are the seed's
    text, the body of the proxy's 409."""

    def __init__(self, session_id: SessionId) -> None:
        self.session_id = session_id
        shown = session_id.decode("utf-8", "replace") if isinstance(session_id, bytes) else session_id
        super().__init__(Status.PREEMPTED, f"Request preempted by a newer retry for session {shown}")

    def __str__(self) -> str:
        return self.message


def _env_bool(environ: Mapping[str, str], name: str) -> bool:
    return environ.get(name, "0").strip().lower() not in _FALSY


def _env_set(environ: Mapping[str, str], name: str) -> bool:
    """Whether a knob is set: present and not blank (the seed parses a blank
    value as its default, the same as unset)."""
    return environ.get(name, "").strip() != ""


def _env_float(environ: Mapping[str, str], name: str, default: float) -> float:
    try:
        return float(environ.get(name, default))
    except (TypeError, ValueError):
        return default


def _number(probe: Any, key: str) -> Optional[float]:
    """The seed's reading of a probe answer: the key's value as a float, or
    None (not a dict, no such key, None, or not a number)."""
    if not isinstance(probe, dict) or not probe:
        return None
    try:
        value = probe.get(key)
        return None if value is None else float(value)
    except (TypeError, ValueError, OverflowError):
        return None


def _unit(value: float) -> float:
    """The value in [0, 1] (NaN: 1)."""
    return 1.0 if value != value else min(max(value, 0.0), 1.0)


class _Table:
    """The seed's two comparisons (``usage >= high_watermark``,
    ``hit >= hit_threshold``) on Python floats, carried into the library's
    ranges: its watermark and threshold lie in [0, 1] and an answer outside
    [0, 1] or NaN counts as unavailable, while the seed's are any float.
    Each answer keeps its value where both agree and is moved to the side of
    the library's knob that the seed's comparison picks where they do not
    (a usage of 1.2 under a 0.85 watermark is pressure: answered 1.0; a hit
    ratio of NaN is not resident: answered 0.0). The decision is the gate's."""

    def __init__(self, high_watermark: float, hit_threshold: float) -> None:
        self.high_watermark, self.hit_threshold = high_watermark, hit_threshold
        self.gate_watermark = _unit(high_watermark)
        # Above zero, so that "not resident" (0.0) stays below it.
        self.gate_threshold = max(_unit(hit_threshold), _TINY)

    def usage_answer(self, usage: Optional[float]) -> Optional[float]:
        if usage is None:
            return None
        if usage >= self.high_watermark:  # the seed's pressure (False for NaN)
            return min(max(usage, self.gate_watermark), 1.0)
        return usage if 0.0 <= usage < self.gate_watermark else None  # None: "open"

    def hit_answer(self, hit: Optional[float]) -> Optional[float]:
        if hit is None:
            return None  # prefix_probe_unavailable
        if hit >= self.hit_threshold:  # the seed's resident prefix (False for NaN)
            return min(max(hit, self.gate_threshold), 1.0)
        return hit if 0.0 <= hit < self.gate_threshold else 0.0


class _Turn:
    """What one acquire's probes answered last (the lease reports it as the
    seed does: the raw figures, None when unavailable)."""

    __slots__ = ("session_id", "usage", "hit")

    def __init__(self, session_id: SessionId) -> None:
        self.session_id = session_id
        self.usage: Optional[float] = None
        self.hit: Optional[float] = None


# The acquire in progress in this task: the probes, called by the gate in
# the task that acquires, find the caller's own session id object here.
_TURN: contextvars.ContextVar[_Turn] = contextvars.ContextVar("kvgate_session_scheduler_turn")


class SessionAdmissionLease:
    """One admitted turn: ``wait_sec``, ``reason`` (``"open"``,
    ``"reserved_session"``, ``"prefix_probe_unavailable"``,
    ``"resident_prefix"`` in reference mode; the working set's reasons,
    e.g. ``"fits_working_set"``, otherwise), ``usage`` and
    ``prefix_hit_ratio`` (what the probes answered in the admitting pass,
    None when unavailable or not asked), ``retain_session``. ``await
    release()`` once the engine is done with the turn."""

    __slots__ = ("session_id", "wait_sec", "reason", "usage", "prefix_hit_ratio", "retain_session", "lease")

    def __init__(self, session_id: SessionId, wait_sec: float, turn: _Turn, lease: Lease) -> None:
        self.session_id = session_id
        self.wait_sec = wait_sec
        self.reason: str = getattr(lease.reason, "name", str(lease.reason)).lower()
        self.usage = turn.usage
        self.prefix_hit_ratio = turn.hit
        self.retain_session: bool = lease.retain_session
        #: The underlying :class:`kvgate.Lease`.
        self.lease = lease

    @property
    def released(self) -> bool:
        return self.lease.released

    async def release(self, cached_tokens: Optional[int] = None, output_tokens: Optional[int] = None) -> None:
        """Releases the lease, with the engine's figures of the turn when
        known (the prompt tokens it served from its prefix cache, the
        tokens it generated). A second call does nothing."""
        self.lease.release(cached_tokens=cached_tokens, output_tokens=output_tokens)

    async def __aenter__(self) -> "SessionAdmissionLease":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.release()

    def __repr__(self) -> str:
        return f"<kvgate.SessionAdmissionLease {self.session_id!r} {self.reason} wait={self.wait_sec:.3f}s>"


class DisabledLease:
    """What ``acquire`` returns when the scheduler is off."""

    __slots__ = ()

    wait_sec = 0.0
    reason = "disabled"
    usage = None
    prefix_hit_ratio = None
    retain_session = False
    released = True

    async def release(self, cached_tokens: Optional[int] = None, output_tokens: Optional[int] = None) -> None:
        return None

    async def __aenter__(self) -> "DisabledLease":
        return self

    async def __aexit__(self, *exc: object) -> None:
        return None


async def _disabled() -> DisabledLease:
    return DisabledLease()


async def _nothing() -> None:
    return None


def _check_session(session_id: Any) -> None:
    if not isinstance(session_id, (str, bytes)):
        raise TypeError(f"session_id must be str or bytes, not {type(session_id).__name__}")


class SessionLevelScheduler:
    """The seed proxy's scheduler interface over a :class:`kvgate.Gate`.

    ``server_manager``: anything with (some of) ``async
    kv_cache_usage_probe(session_id) -> {"kv_cache_usage": float}``, ``async
    prefix_cache_probe(session_id, *, prompt_ids) -> {"hit_ratio": float}``
    and, read in working-set mode, ``async
    kv_cache_capacity_probe(session_id)`` answering a :class:`kvgate.Capacity`
    or a dict like kvgate_vllm's ``kvgate_capacity`` (``capacity_tokens``,
    ``block_size``, ``prefill_tokens_per_sec``); without it the gate
    estimates the capacity from the usage answers. ``environ``: where the
    knobs are read (default ``os.environ``), once, here.
    """

    def __init__(self, server_manager: Any, *, environ: Optional[Mapping[str, str]] = None) -> None:
        env = os.environ if environ is None else environ
        self._server_manager = server_manager
        self.enabled = _env_bool(env, ENABLE_ENV)
        self.high_watermark = _env_float(env, HIGH_WATERMARK_ENV, 0.85)
        self.hit_threshold = _env_float(env, HIT_THRESHOLD_ENV, 0.80)
        self.wait_poll_sec = max(5.0, _env_float(env, WAIT_POLL_ENV, 5.0))
        self.idle_grace_sec = max(0.0, _env_float(env, IDLE_GRACE_ENV, 60.0))
        self._table = _Table(self.high_watermark, self.hit_threshold)
        if any(_env_set(env, name) for name in REFERENCE_KNOBS):
            config = Config(
                admission_mode=AdmissionMode.REFERENCE,
                high_watermark=self._table.gate_watermark,
                hit_threshold=self._table.gate_threshold,
                wait_poll_sec=min(self.wait_poll_sec, _MAX_SEC),
                idle_grace_sec=min(self.idle_grace_sec, _MAX_SEC),
            )
        else:
            config = Config()  # working-set admission, the library's defaults
        #: The gate (stats, metrics_text, session_stats), or None when off.
        self.gate: Optional[Gate] = None
        if self.enabled:
            self.gate = Gate(config, Probes(usage=self._usage, capacity=self._capacity, prefix=self._prefix))

    @property
    def mode(self) -> Optional[AdmissionMode]:
        """The gate's admission mode; None when the scheduler is off."""
        return None if self.gate is None else self.gate.config.mode

    # -- the calls ---------------------------------------------------------

    def acquire(
        self,
        session_id: SessionId,
        prompt_ids: Sequence[int],
        *,
        abort_event: Optional[asyncio.Event] = None,
        timeout: Optional[float] = None,
    ) -> "Coroutine[Any, Any, Union[SessionAdmissionLease, DisabledLease]]":
        """``await`` it: the lease of the session's turn once admitted.

        A set ``abort_event`` (before the call or while the attempt probes or
        waits) ends it at once with :class:`AdmissionPreempted`. ``timeout``
        (seconds, None: no limit) ends it with :class:`kvgate.TimedOut`; a
        probe that never returns ends it so too, at most ``PROBE_GRACE_SEC``
        later (0: one pass, whose probes are awaited). Cancelling the awaiting task
        cancels the attempt. When the scheduler is on, a session id that is
        not str or bytes raises TypeError here, before anything is asked or
        queued; off, any session id gets the disabled lease, as the seed's."""
        if self.gate is None:
            return _disabled()
        _check_session(session_id)
        return self._acquire(self.gate, session_id, prompt_ids, abort_event, timeout)

    async def _acquire(
        self,
        gate: Gate,
        session_id: SessionId,
        prompt_ids: Sequence[int],
        abort_event: Optional[asyncio.Event],
        timeout: Optional[float],
    ) -> SessionAdmissionLease:
        if abort_event is not None and abort_event.is_set():
            raise AdmissionPreempted(session_id)
        loop = asyncio.get_running_loop()
        start = loop.time()
        turn = _Turn(session_id)
        token = _TURN.set(turn)
        ref = _AttemptRef()
        try:
            task = loop.create_task(gate._acquire_ref(session_id, prompt_ids, timeout, ref))
        finally:
            _TURN.reset(token)
        aborted: Optional[asyncio.Task] = None
        waiting = {task}
        if abort_event is not None:
            aborted = loop.create_task(abort_event.wait())
            waiting.add(aborted)
        # The gate's acquire ends a wait, and a probe that hangs, at the
        # timeout (counted as timed out); this guard, a little later, is a
        # last resort (a probe that blocks the loop past it).
        guard = timeout + PROBE_GRACE_SEC if timeout is not None and timeout > 0 else None
        try:
            await asyncio.wait(waiting, timeout=guard, return_when=asyncio.FIRST_COMPLETED)
        except BaseException:  # cancelled: the attempt goes with the task
            _discard(task)
            raise
        finally:
            if aborted is not None:
                aborted.cancel()
        if not task.done():
            preempted = aborted is not None and abort_event is not None and abort_event.is_set()
            # Ended as the caller sees it, so that the stats name the cause;
            # the task's cancel then only frees it.
            ref.end(Status.PREEMPTED if preempted else Status.TIMED_OUT)
            _discard(task)
            if preempted:
                raise AdmissionPreempted(session_id)
            raise TimedOut(Status.TIMED_OUT, f"session {session_id!r}: not admitted within {timeout} s")
        try:
            lease = task.result()
        except Preempted:
            raise AdmissionPreempted(session_id) from None
        return SessionAdmissionLease(session_id, loop.time() - start, turn, lease)

    def finish_session(self, session_id: SessionId, reason: str = "finished") -> Coroutine[Any, Any, None]:
        """``await`` it: ends the session's stay (its reservation in reference
        mode, its place in the working set). Does nothing when the scheduler
        is off, whatever the session id. On, a session id that is not str or
        bytes raises TypeError here."""
        if self.gate is None:
            return _nothing()
        _check_session(session_id)
        return self._finish(self.gate, session_id, reason)

    async def _finish(self, gate: Gate, session_id: SessionId, reason: str) -> None:
        if gate.finish_session(session_id) is not None:
            log.debug("kvgate: finish session=%s reason=%s", session_id, reason)

    def close(self) -> None:
        """Closes the gate (waiting attempts end with kvgate.Closed)."""
        if self.gate is not None:
            self.gate.close()

    # -- the probes, called by the gate in the acquiring task --------------

    async def _usage(self, session: bytes) -> Optional[float]:
        turn = _TURN.get()
        turn.usage = _number(await self._ask("kv_cache_usage_probe", turn.session_id), "kv_cache_usage")
        turn.hit = None  # a new pass: the lease reports this pass's figures
        return self._table.usage_answer(turn.usage)

    async def _prefix(self, session: bytes, prompt_ids: Sequence[int]) -> Optional[float]:
        turn = _TURN.get()
        turn.hit = _number(await self._ask("prefix_cache_probe", turn.session_id, prompt_ids=list(prompt_ids)), "hit_ratio")
        return self._table.hit_answer(turn.hit)

    async def _capacity(self, session: bytes) -> Optional[Capacity]:
        if getattr(self._server_manager, "kv_cache_capacity_probe", None) is None:
            return None  # the gate estimates it from the usage answers
        return _capacity_of(await self._ask("kv_cache_capacity_probe", _TURN.get().session_id))

    async def _ask(self, method: str, session_id: SessionId, **kwargs: Any) -> Any:
        fn = getattr(self._server_manager, method, None)
        if fn is None:
            return None
        try:
            answer = fn(session_id, **kwargs)
            if inspect.isawaitable(answer):
                answer = await answer
            return answer
        except Exception as exc:  # noqa: BLE001 - a failed probe is "unavailable"
            log.debug("kvgate: server_manager.%s failed session=%s: %s", method, session_id, exc)
            return None


def _capacity_of(answer: Any) -> Optional[Capacity]:
    """The GPU cache of a capacity answer (a Capacity, or a dict in
    ``kvgate_capacity``'s shape); None when it is neither or not numbers."""
    try:
        if isinstance(answer, Capacity):
            tokens, block, rate = answer.tokens, answer.block_tokens, answer.prefill_tokens_per_sec
        elif isinstance(answer, dict):
            tokens = answer["capacity_tokens"]
            block = answer["block_size"]
            rate = answer.get("prefill_tokens_per_sec", 0.0)
        else:
            return None
        tokens, block, rate = int(tokens), int(block), float(rate)
    except (KeyError, TypeError, ValueError, OverflowError):
        return None
    if tokens < 0 or block < 0 or not math.isfinite(rate) or rate < 0:
        return None
    return Capacity(tokens, block, rate)


def _discard(task: "asyncio.Task[Lease]") -> None:
    """Cancels an acquire nobody awaits any more; a lease it still produced
    is released at once."""

    def done(t: "asyncio.Task[Lease]") -> None:
        if t.cancelled():
            return
        if t.exception() is None:
            t.result().release()

    task.add_done_callback(done)
    task.cancel()
