"""The engine's step costs, fitted from its own steps, and the rebuild cost
they give the gate.

A step's duration is modelled as the simulator models it
(sim/src/engine/step_time.rs, fitted offline by `kvgate-sim --fit-steps`):

    t = b0 + b1*prefill + b2*decode + b3*context + b4*attn_pairs

`prefill`: tokens scheduled for requests in their prompt; `decode`: the
others (one per decoding sequence); `context`: the tokens the scheduled
requests attend over (their computed tokens after the step); `attn_pairs`:
query-key pairs attended (n new tokens after c cached attend
n*c + n*(n+1)/2). `step_load` computes them; bench/real_engine.py's step
rows (`--steps-csv`) use the same function.

From the fit, re-prefilling an L-token history after a cached prefix p, in
full chunks of N = max_num_batched_tokens tokens, costs
`secs_per_token*L + secs_per_pair*(L*p + L(L+1)/2)` with

    secs_per_token = b1 + b3/2 + b0/N,   secs_per_pair = b4 + b3/N

(the simulator's `rebuild_cost`, sim/src/simulation.rs), which the capacity
answer carries (`rebuild_secs_per_token`, `rebuild_secs_per_pair`) and the
serving side tells the gate (`kvgate.Gate.set_rebuild_cost`).

What is kept (`StepCosts`, on the engine core): the regressors and duration
of the last KEEP_STEPS steps, half of them steps that prefilled, half steps
that did not. Split so, a long stretch of decode-only steps cannot flush the
steps that tell the prefill and attention terms apart. Choosing steps by what
they scheduled (not by how long they took) leaves least squares unbiased.
256 steps: the fit has 5 terms, and on the CPU engine one run's residual is
about 5 ms rms against steps of 10-300 ms, so a few hundred steps pin the
terms to a few percent; 128 prefill steps are seconds of a busy GPU's time
and ~20 s of the CPU engine's, so a change of load shows within that.

The refit: every REFIT_STEPS steps, least squares with every term
non-negative (Lawson-Hanson active set on the 5x5 normal equations, columns
scaled to a unit maximum as the simulator's fit does: attention pairs run
to 1e9 where the constant is 1). Non-negative because a negative term is not
a cost: on a noisy machine an unconstrained fit gave a negative b0
(sim/profiles/cpu-small.toml), and a negative term could price a long
rebuild below a short one. numpy (in every vLLM environment) builds the
normal equations in one product over the kept rows; the active set is at
most 5 columns, so the refit is a few small solves, bounded (MAX_ITER), on
the engine thread between steps: 0.4 ms (median; 4.7 ms at worst) for 256
kept steps on a loaded 2-core VM, once every REFIT_STEPS steps.

A co-tenant's load is fitted as the engine's own cost. On the 2-core VM at
a load average of 7-12 (other jobs compiling and simulating), one
`bench/real_engine.py --policies kvgate --sessions 12 --turns 8` run's
steps took a median 10.7x what sim/profiles/cpu-small.toml predicts for
them, and the engine published 215 us/token and 172 ns/pair against the
profile's 62 us and 59 ns (b0 210 ms against 5.2 ms); unconstrained least
squares over the same 626 steps gave b3 = -9.4 us per context token.

Published: the rebuild cost of the last refit, or (0, 0) while it is
unusable: fewer than MIN_STEPS steps kept, fewer than MIN_PREFILL_STEPS of
them prefilled (the prefill and attention terms are then not determined), or
a per-token cost that is not > 0.

Cost per step, on top of the prefill rate's timing: one pass over the step's
scheduled requests (a dict lookup and a few integer operations each: about
0.3 us a request, 75 us for a step of 256 decoding sequences, on the same
VM) and a deque append.
"""

from __future__ import annotations

import logging
import math
from collections import deque
from typing import Any, Mapping, NamedTuple, Optional, Sequence

#: Steps kept for the fit: KEEP_STEPS // 2 that prefilled, as many that did not.
KEEP_STEPS = 256
#: A refit every this many recorded steps.
REFIT_STEPS = 32
#: A fit on fewer kept steps is not published.
MIN_STEPS = 32
#: ... nor one with fewer steps that prefilled.
MIN_PREFILL_STEPS = 8
#: Active-set iterations at most (each adds or drops a column; 5 columns).
MAX_ITER = 30

#: The model's terms, in order: the constant, then the regressors.
TERMS = ("b0", "b1_prefill", "b2_decode", "b3_context", "b4_attn_pairs")

_COSTS = "_kvgate_step_costs"
_BROKEN = "_kvgate_step_costs_broken"

logger = logging.getLogger("kvgate_vllm.step_cost")


class StepLoad(NamedTuple):
    """What one step scheduled, as the step-time model reads it."""

    prefill_tokens: int
    decode_tokens: int
    prefill_reqs: int
    decode_reqs: int
    context_tokens: int
    attn_pairs: int


def step_load(scheduler_output: Any, requests: Mapping[str, Any]) -> StepLoad:
    """The step's scheduled tokens split into prompt (prefill) and decode, per
    request; the context they attend over (each scheduled request's computed
    tokens, read after the step) and the query-key pairs attended
    (sim/src/engine/step_time.rs). `requests`: the scheduler's requests by id
    (a request finished by the step is gone from it: its tokens count as
    decode, attending over themselves)."""
    if scheduler_output is None:
        return StepLoad(0, 0, 0, 0, 0, 0)
    pf = dc = npf = ndc = ctx = pairs = 0
    get = requests.get
    for rid, n in scheduler_output.num_scheduled_tokens.items():
        req = get(rid)
        if req is None:
            after, prompt_len = n, 0
        else:
            after, prompt_len = req.num_computed_tokens, req.num_prompt_tokens
        ctx += after
        if n == 1 and prompt_len < after:  # a decode step: one token after after - 1
            dc += 1
            ndc += 1
            pairs += after
            continue
        before = after - n
        p = max(0, min(after, prompt_len) - before)
        pf, dc = pf + p, dc + (n - p)
        npf, ndc = npf + (p > 0), ndc + (p == 0)
        pairs += n * before + n * (n + 1) // 2
    return StepLoad(pf, dc, npf, ndc, ctx, pairs)


class Fit(NamedTuple):
    """A fit of the step-time model: coefficients in seconds per unit."""

    coef: tuple[float, float, float, float, float]  # b0..b4, all >= 0
    steps: int
    prefill_steps: int
    rms_sec: float


def nnls(gram: Any, rhs: Any, max_iter: int = MAX_ITER) -> Any:
    """argmin |Ax - y| subject to x >= 0, from the normal equations
    (gram = A'A, rhs = A'y): Lawson and Hanson's active-set method. Each
    iteration frees the column with the largest gradient and solves on the
    free columns, stepping back to the boundary where a free term would go
    negative. Bounded by `max_iter` column moves."""
    import numpy as np

    n = len(rhs)
    x = np.zeros(n)
    free = np.zeros(n, dtype=bool)
    tol = 1e-12 * max(1.0, float(np.abs(rhs).max()))
    moves = 0
    while moves < max_iter:
        grad = rhs - gram @ x
        grad[free] = -np.inf
        j = int(np.argmax(grad))
        if grad[j] <= tol:
            break
        free[j] = True
        moves += 1
        while moves < max_iter:
            idx = np.flatnonzero(free)
            z = np.zeros(n)
            z[idx] = np.linalg.lstsq(gram[np.ix_(idx, idx)], rhs[idx], rcond=None)[0]
            if (z[idx] > 0).all():
                x = z
                break
            bad = idx[z[idx] <= 0]
            gap = x[bad] - z[bad]  # >= 0: x >= 0 >= z there
            step = float(np.min(np.where(gap > 0, x[bad] / np.where(gap > 0, gap, 1.0), 0.0)))
            x = x + step * (z - x)
            free &= x > 0
            x[~free] = 0.0
            moves += 1
    return x


def fit(rows: Sequence[tuple[float, float, float, float, float]]) -> Optional[Fit]:
    """The non-negative least-squares fit of rows (prefill, decode, context,
    attn_pairs, seconds); None without rows."""
    import numpy as np

    if not rows:
        return None
    data = np.asarray(rows, dtype=float)
    design = np.empty((len(data), 5))
    design[:, 0] = 1.0
    design[:, 1:] = data[:, :4]
    y = data[:, 4]
    scale = np.abs(design).max(axis=0)
    scale[scale == 0.0] = 1.0  # a column of zeros stays 0 (never freed: no gradient)
    a = design / scale
    x = nnls(a.T @ a, a.T @ y) / scale
    resid = y - design @ x
    coef = tuple(float(v) for v in x)
    return Fit(coef, len(data), int(np.count_nonzero(data[:, 0] > 0)), float(math.sqrt(float(resid @ resid) / len(data))))  # type: ignore[arg-type]


def rebuild_cost(coef: Sequence[float], chunk_tokens: int) -> tuple[float, float]:
    """(secs_per_token, secs_per_pair) of a rebuild in chunks of `chunk_tokens`
    (the simulator's `rebuild_cost`, sim/src/simulation.rs)."""
    b0, b1, _b2, b3, b4 = coef
    n = float(max(1, chunk_tokens))
    return b1 + b3 / 2.0 + b0 / n, b4 + b3 / n


def usable(f: Optional[Fit], chunk_tokens: int) -> tuple[float, float]:
    """The rebuild cost a fit gives, or (0, 0) when it is unusable (too few
    steps, too few that prefilled, a per-token cost not > 0)."""
    if f is None or f.steps < MIN_STEPS or f.prefill_steps < MIN_PREFILL_STEPS:
        return 0.0, 0.0
    per_token, per_pair = rebuild_cost(f.coef, chunk_tokens)
    if not (per_token > 0.0 and math.isfinite(per_token) and per_pair >= 0.0 and math.isfinite(per_pair)):
        return 0.0, 0.0
    return per_token, per_pair


class StepCosts:
    """The kept steps of one engine and the rebuild cost of their last fit."""

    def __init__(self, chunk_tokens: int, keep: int = KEEP_STEPS, refit_every: int = REFIT_STEPS) -> None:
        self.chunk_tokens = int(chunk_tokens)
        self.prefill: deque = deque(maxlen=keep // 2)
        self.other: deque = deque(maxlen=keep - keep // 2)
        self.refit_every = refit_every
        self.since_fit = 0
        self.last_fit: Optional[Fit] = None
        # Read by other threads (the bench's probes) as one attribute: a tuple,
        # replaced whole.
        self.cost: tuple[float, float] = (0.0, 0.0)

    def record(self, load: StepLoad, seconds: float) -> None:
        """Keeps a step (one that scheduled nothing is not one) and refits
        every `refit_every` steps."""
        if seconds <= 0.0 or not (load.prefill_tokens or load.decode_tokens):
            return
        row = (load.prefill_tokens, load.decode_tokens, load.context_tokens, load.attn_pairs, seconds)
        (self.prefill if load.prefill_tokens else self.other).append(row)
        self.since_fit += 1
        if self.since_fit >= self.refit_every:
            self.refit()

    def refit(self) -> tuple[float, float]:
        self.since_fit = 0
        self.last_fit = fit([*self.prefill, *self.other])
        self.cost = usable(self.last_fit, self.chunk_tokens)
        return self.cost


def of(core: Any) -> StepCosts:
    """The engine core's StepCosts (made on first use)."""
    costs = core.__dict__.get(_COSTS)
    if costs is None:
        chunk = int(core.vllm_config.scheduler_config.max_num_batched_tokens)
        costs = core.__dict__[_COSTS] = StepCosts(chunk)
    return costs


def published(core: Any) -> tuple[float, float]:
    """(secs_per_token, secs_per_pair) the engine's last usable fit gives,
    (0, 0) before one: one dict lookup and an attribute read, safe from any
    thread."""
    costs = core.__dict__.get(_COSTS)
    return costs.cost if costs is not None else (0.0, 0.0)


def record(core: Any, scheduler_output: Any, seconds: float) -> None:
    """Keeps one timed step of the engine core (kvgate_vllm.prefill_rate).
    A measurement never fails the engine's step: an error (a vLLM whose
    scheduler or requests look otherwise, a failed solve) is logged once,
    and the engine's steps are no longer fitted (its cost stays what it was
    published; 0 before a fit)."""
    if core.__dict__.get(_BROKEN):
        return
    try:
        of(core).record(step_load(scheduler_output, core.scheduler.requests), seconds)
    except Exception as e:  # noqa: BLE001 - the engine's step must go on
        core.__dict__[_BROKEN] = True
        logger.warning("kvgate: the engine's step costs are no longer fitted (%s: %s)", type(e).__name__, e)
