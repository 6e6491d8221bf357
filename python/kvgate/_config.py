"""The gate's configuration and the host's probes: Config, Capacity, Probes."""

from __future__ import annotations

import ctypes
import dataclasses
from typing import Any, Awaitable, Callable, NamedTuple, Optional, Sequence, Union

from . import _ffi
from ._errors import check
from ._ffi import AdmissionMode, Status

MaybeAwaitable = Union[Any, Awaitable[Any]]


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
    """What the capacity probe answers (``kvgate_capacity_fn``); 0 = unknown.

    ``tier_tokens`` and ``reload_tokens_per_sec``: the engine's host tier of
    KV (``kvgate_tier_fn``: vLLM's ``--kv-offloading-size`` over the KV
    bytes per token, and the host-to-device copy rate in tokens/s);
    ``tier_tokens`` 0 means the engine has no tier. An answer whose every
    figure is 0 says the engine cannot say (a tier told earlier is kept);
    one with a figure and no tier, after a tier was told, is refused. A
    refused answer makes the acquire raise ValueError (see
    ``Attempt.answer_usage``).

    ``max_model_len``: the engine's longest sequence in tokens (vLLM's
    ``model_config.max_model_len``; ``kvgate_set_max_model_len``), None
    when unknown. 0, a negative or a non-integer figure raises ValueError
    naming it, and the gate keeps the figure it had."""

    tokens: int = 0
    block_tokens: int = 0
    prefill_tokens_per_sec: float = 0.0
    tier_tokens: int = 0
    reload_tokens_per_sec: float = 0.0
    max_model_len: Optional[int] = None


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
    - ``capacity(session) -> Capacity | (tokens, block_tokens, prefill/s
      [, tier_tokens, reload/s]) | None``: asked with every usage probe in
      working-set mode. A tier the gate refuses (smaller than the GPU
      capacity, a reload rate not finite and > 0, none after one was told)
      ends the acquire with ValueError.
    - ``prefix(session, prompt_ids) -> float | None``: resident fraction of
      the prompt (reference mode, under pressure). Not called when the turn
      was given as a prompt length only (then it is unavailable).
    """

    usage: Optional[UsageProbe] = None
    capacity: Optional[CapacityProbe] = None
    prefix: Optional[PrefixProbe] = None


def _capacity(answer: Any) -> Optional[Capacity]:
    if answer is None:
        return None
    if isinstance(answer, Capacity):
        return answer
    return Capacity(*answer)
