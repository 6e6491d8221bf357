"""Waker and Attempt: thin typed objects over the C handles of the
event-loop API (``kvgate_waker_*``, ``kvgate_attempt_*``)."""

from __future__ import annotations

import math
from ctypes import byref, c_int32, c_size_t, c_uint64
from typing import List, Optional, Sequence

from . import _ffi
from ._args import _token_array, checked_count
from ._config import Capacity
from ._errors import check, error_for
from ._ffi import AdmissionMode, Status, StepKind
from ._handle import GateHandle
from ._lease import Lease



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
        gate: GateHandle,
        session: bytes,
        prompt_len: int,
        timeout_ms: int,
        waker: Waker,
        tag: int,
        ids: Optional[Sequence[int]] = None,
    ) -> None:
        """``ids``, when given, are the prompt's token ids (``prompt_len``
        of them): in working-set mode the gate sketches them, and compares
        sessions' first prompts to learn the prefix they share when the
        engine reports no cached tokens."""
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
        """Answers PROBE_USAGE with the usage (None: unavailable) and the
        capacity, host tier included (``kvgate_attempt_answer_usage_tiered``;
        None: the engine cannot say). A capacity the gate refuses (a tier
        smaller than the GPU capacity, a reload rate that is not finite and
        > 0, no tier after a tier was told, a negative figure) raises
        ValueError with the library's message; nothing changed then, and the
        attempt still waits for its usage answer."""
        cap = capacity or Capacity()
        for name in ("tokens", "block_tokens", "tier_tokens"):
            if int(getattr(cap, name)) < 0:
                raise ValueError(f"Capacity.{name} is negative: {getattr(cap, name)}")
        if cap.max_model_len is not None:
            # A figure the engine fixes at start, told apart from the answer
            # (the C answer functions' signatures never change).
            with self.gate._use() as g:
                status = self._lib.kvgate_set_max_model_len(g, checked_count("Capacity.max_model_len", cap.max_model_len))
            if status == Status.INVALID_ARGUMENT:
                raise ValueError(_ffi.last_error())
            check(status)
        status = self._lib.kvgate_attempt_answer_usage_tiered(
            self._live(), math.nan if usage is None else float(usage),
            int(cap.tokens), int(cap.block_tokens), float(cap.prefill_tokens_per_sec),
            int(cap.tier_tokens), float(cap.reload_tokens_per_sec),
            byref(self._step),
        )
        if status == Status.INVALID_ARGUMENT:
            raise ValueError(_ffi.last_error())
        check(status)
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

    def end(self, status: Status) -> None:
        """Ends the attempt, which has not ended (it waits on a probe answer
        or sleeps), with the outcome its host saw (``kvgate_attempt_end``):
        ``Status.PREEMPTED`` (a newer retry of the session won; counted as
        preempted, in the session's ``num_preempted`` too) or
        ``Status.TIMED_OUT`` (a probe hung past the timeout; counted as
        timed out). It leaves the queue and hands over as :meth:`cancel`
        does; the step becomes FAILED with that status (:meth:`failure`).
        Raises :class:`InvalidArgument` for any other status and
        :class:`OutOfOrder` once the attempt has ended; nothing changes then."""
        check(self._lib.kvgate_attempt_end(self._live(), int(status)))
        self._step.kind = int(StepKind.FAILED)
        self._step.status = int(status)

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
            Status.RELEASED: "released to another replica (its cache is gone here)",
        }.get(status, _status_name(status))
        return error_for(status, f"session {who!r}: {what}")

    def lease(self) -> "Lease":
        """The lease of an ADMITTED step."""
        return Lease(self.gate, self.session, self._step.admission)


def _status_name(status: int) -> str:
    return _ffi.load().kvgate_status_str(status).decode()
