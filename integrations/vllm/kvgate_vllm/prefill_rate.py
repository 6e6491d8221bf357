"""The engine's measured prefill rate, answered by the capacity probe.

kvgate's working-set window is the time the engine takes to prefill its whole
cache (capacity / prefill rate). Without a rate from the engine, the gate
estimates one from turn reports (uncached tokens over admission-to-release
time). A turn's duration is mostly decode, so that estimate comes out several
times too low, and the window and the wait bound come out several times too
long. In the simulator, on `mid-tools`, a host without the rate saw p99 turn
latency of 236 s and waits of 380 s, against 51 s and 48 s with it.

The engine knows better: each step schedules some prefill tokens and takes
some time. `install()` wraps `EngineCore.step` to time each step and count the
prefill tokens it scheduled: requests scheduled for more than one token
(decode schedules one). The rates of the last RECENT_STEPS steps whose prefill
is at least a quarter of the token budget are kept on the engine core, and
`kvgate_capacity` answers their median. A smaller step says more about the
fixed cost per step than about the prefill rate. This is the simulator's rule
(`sim/src/prefill_rate.rs`).

The median, not the best: on the CPU engine one run's qualifying steps ran
at 6.5k-20.5k tokens/s (median 13.6k), and the best of them set the window at
0.5 s where a typical step gives 0.9 s. Four interleaved runs each of
`bench/real_engine.py`: with the best rate kvgate ran 1.066x the best fixed
cap (68-71% hits, 39-46 parks); answering 0.6 of it, about the median, 0.996x
(77% hits, 26-30 parks).

`step_with_batch_queue` (pipeline parallelism) overlaps scheduling and
execution, so a step's time is not its work: it is not timed. With it, the
capacity probe answers no rate, and the gate falls back to the turn reports.

Each timed step is also kept for the fit of the engine's step costs
(kvgate_vllm.step_cost), which the capacity answer turns into the rebuild
cost it carries; with pipeline parallelism there is none either.

Cost per step: two `perf_counter` calls, a sum over the step's scheduled
requests, and step_cost's pass over them. The scheduler's `schedule` is
wrapped on the instance (its class varies with the configuration) to see
what the step scheduled.
"""

from __future__ import annotations

import functools
import statistics
import time
from collections import deque
from typing import Any, Callable

from . import step_cost

#: Steps whose prefill is below this fraction of the token budget are not sampled.
MIN_BUDGET_FRACTION = 0.25

#: Qualifying steps whose rates are kept: enough for a steady median, few
#: enough to follow a change of load.
RECENT_STEPS = 64

_RATE = "_kvgate_prefill_rate"
_RECENT = "_kvgate_prefill_rates"
_SCHEDULED = "_kvgate_scheduled"
_WATCHED = "_kvgate_watched_scheduler"


def typical_rate(core: Any) -> float:
    """The median prefill rate of the engine's recent qualifying steps, tokens/s
    (0 before any): kept up to date by each step, read with one dict lookup."""
    return float(core.__dict__.get(_RATE, 0.0))


def prefill_tokens(scheduler_output: Any) -> int:
    """Tokens a step scheduled for requests in prefill (more than one token each)."""
    return sum(n for n in scheduler_output.num_scheduled_tokens.values() if n > 1)


def _watch_schedules(core: Any) -> None:
    """Keeps the scheduler output of the step in progress on the engine core."""
    scheduler = core.scheduler
    if core.__dict__.get(_WATCHED) is scheduler:
        return
    schedule = scheduler.schedule

    @functools.wraps(schedule)
    def watched(*args: Any, **kwargs: Any) -> Any:
        out = schedule(*args, **kwargs)
        core.__dict__[_SCHEDULED] = out
        return out

    scheduler.schedule = watched
    core.__dict__[_WATCHED] = scheduler


def _record(core: Any, scheduler_output: Any, seconds: float) -> None:
    budget = int(core.vllm_config.scheduler_config.max_num_batched_tokens)
    tokens = prefill_tokens(scheduler_output)
    if seconds <= 0.0 or tokens < MIN_BUDGET_FRACTION * budget:
        return
    recent = core.__dict__.setdefault(_RECENT, deque(maxlen=RECENT_STEPS))
    recent.append(tokens / seconds)
    core.__dict__[_RATE] = statistics.median_high(recent)


def timed(step: Callable[..., Any]) -> Callable[..., Any]:
    """`EngineCore.step`, timed (idempotent: a timed step is returned as it is)."""
    if getattr(step, "_kvgate_timed", False):
        return step

    @functools.wraps(step)
    def timed_step(self: Any, *args: Any, **kwargs: Any) -> Any:
        _watch_schedules(self)
        self.__dict__.pop(_SCHEDULED, None)
        start = time.perf_counter()
        result = step(self, *args, **kwargs)
        seconds = time.perf_counter() - start
        scheduled = self.__dict__.pop(_SCHEDULED, None)
        if scheduled is not None:
            _record(self, scheduled, seconds)
            step_cost.record(self, scheduled, seconds)
        return result

    timed_step._kvgate_timed = True  # type: ignore[attr-defined]
    return timed_step


def install() -> None:
    """Times `EngineCore.step` (idempotent). It must run before an engine core is
    built: the core binds `step` into its busy loop's `step_fn` at construction.
    vLLM loads general plugins at the start of `EngineCore.__init__`, so the
    plugin's `register()` is early enough."""
    from vllm.v1.engine.core import EngineCore

    EngineCore.step = timed(EngineCore.step)
