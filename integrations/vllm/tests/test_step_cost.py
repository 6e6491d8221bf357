"""The engine's step costs fitted from its own steps (kvgate_vllm.step_cost),
the rebuild cost the capacity answer carries from them, and the gate told it
(kvgate_vllm.feedback.tell_rebuild_cost, kvgate_vllm.serve.Gates).

The fit on synthetic steps recovers the coefficients that made them, refuses
to publish from too few steps, and never has a negative term; on the
in-process CPU engine a short workload is enough for the capacity answer to
carry a positive cost, and the gate's metrics show the cost told."""

from __future__ import annotations

import asyncio
import logging
import math
import random
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

import kvgate
from kvgate_vllm import feedback, probes, serve, step_cost
from support.engine import core_of, random_prompt, run_to_completion, sampling

PER_TOKEN = "kvgate_working_set_rebuild_seconds_per_token"
PER_PAIR = "kvgate_working_set_rebuild_seconds_per_pair"

#: sim/profiles/cpu-small.toml in seconds per unit: b0, b1 (prefill token),
#: b2 (decode sequence), b3 (context token), b4 (attention pair).
CPU_SMALL = (5.1928e-3, 59.508e-6, 169.46e-6, 0.12836e-6, 0.059102e-6)
CHUNK = 2048


def synthetic_steps(coef: tuple[float, ...], n: int, seed: int = 0, noise: float = 0.02) -> list[tuple[step_cost.StepLoad, float]]:
    """n steps of a chunked-prefill engine (decode sequences over long
    contexts; about half the steps also prefill one to three requests after a
    cached prefix), each timed by `coef` with multiplicative noise. The
    regressors come from `step_load` on scheduler outputs and requests shaped
    as vLLM's."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        scheduled: dict[str, int] = {}
        requests: dict[str, Any] = {}
        for d in range(rng.randrange(0, 24)):  # decoding: one token after c computed
            c = rng.randrange(200, 6000)
            rid = f"d{i}-{d}"
            scheduled[rid] = 1
            requests[rid] = SimpleNamespace(num_computed_tokens=c + 1, num_prompt_tokens=c - 50)
        budget = CHUNK - len(scheduled)
        if rng.random() < 0.5 or not scheduled:
            for p in range(rng.randrange(1, 4)):
                take = rng.randrange(16, max(17, budget // 2))
                budget -= take
                cached = rng.choice([0, rng.randrange(0, 8000)])
                rid = f"p{i}-{p}"
                scheduled[rid] = take
                requests[rid] = SimpleNamespace(num_computed_tokens=cached + take, num_prompt_tokens=cached + take + rng.choice([0, 500]))
        load = step_cost.step_load(SimpleNamespace(num_scheduled_tokens=scheduled), requests)
        b0, b1, b2, b3, b4 = coef
        t = b0 + b1 * load.prefill_tokens + b2 * load.decode_tokens + b3 * load.context_tokens + b4 * load.attn_pairs
        out.append((load, t * (1.0 + noise * rng.gauss(0.0, 1.0))))
    return out


def fed(steps: list[tuple[step_cost.StepLoad, float]], **kw: Any) -> step_cost.StepCosts:
    costs = step_cost.StepCosts(CHUNK, **kw)
    for load, t in steps:
        costs.record(load, t)
    return costs


def test_step_load_counts_as_the_simulator_charges() -> None:
    requests = {
        "fresh": SimpleNamespace(num_computed_tokens=100, num_prompt_tokens=300),  # chunk 1 of 3: 100 new
        "after-cache": SimpleNamespace(num_computed_tokens=1000 + 50, num_prompt_tokens=1050),  # 50 new after 1000
        "decode": SimpleNamespace(num_computed_tokens=401, num_prompt_tokens=300),
    }
    out = SimpleNamespace(num_scheduled_tokens={"fresh": 100, "after-cache": 50, "decode": 1, "finished": 1})
    load = step_cost.step_load(out, requests)
    assert load == step_cost.StepLoad(
        prefill_tokens=150,
        decode_tokens=2,  # the finished request (gone from the scheduler) counts as decode
        prefill_reqs=2,
        decode_reqs=2,
        context_tokens=100 + 1050 + 401 + 1,
        attn_pairs=(100 * 101 // 2) + (50 * 1000 + 50 * 51 // 2) + (400 + 1) + 1,
    )
    assert step_cost.step_load(None, requests) == step_cost.StepLoad(0, 0, 0, 0, 0, 0)


def test_the_fit_recovers_the_coefficients_that_made_the_steps() -> None:
    costs = fed(synthetic_steps(CPU_SMALL, 600))
    fit = costs.last_fit
    assert fit is not None and fit.steps == step_cost.KEEP_STEPS and fit.prefill_steps == step_cost.KEEP_STEPS // 2
    for got, want, name in zip(fit.coef, CPU_SMALL, step_cost.TERMS):
        assert got == pytest.approx(want, rel=0.15), name
    # What is published is the simulator's rebuild cost of the fitted terms.
    want = step_cost.rebuild_cost(CPU_SMALL, CHUNK)
    assert costs.cost == pytest.approx(want, rel=0.05)
    assert want[0] == pytest.approx(CPU_SMALL[1] + CPU_SMALL[3] / 2 + CPU_SMALL[0] / CHUNK)
    assert want[1] == pytest.approx(CPU_SMALL[4] + CPU_SMALL[3] / CHUNK)


def test_exact_steps_are_fitted_exactly() -> None:
    costs = fed(synthetic_steps(CPU_SMALL, 300, seed=3, noise=0.0))
    assert costs.last_fit is not None
    assert costs.last_fit.coef == pytest.approx(CPU_SMALL, rel=1e-6)
    assert costs.last_fit.rms_sec < 1e-9


def test_too_few_steps_publish_nothing() -> None:
    steps = synthetic_steps(CPU_SMALL, 200, seed=1)
    # Fewer than MIN_STEPS steps: nothing, even when refitted.
    few = fed(steps[: step_cost.MIN_STEPS - 1], refit_every=1)
    assert few.last_fit is not None and few.cost == (0.0, 0.0)
    # Many steps, but fewer than MIN_PREFILL_STEPS that prefilled: nothing.
    decode = [(load, t) for load, t in steps if load.prefill_tokens == 0]
    prefill = [(load, t) for load, t in steps if load.prefill_tokens > 0]
    assert len(decode) >= step_cost.MIN_STEPS
    short = fed(decode + prefill[: step_cost.MIN_PREFILL_STEPS - 1], refit_every=1)
    assert short.cost == (0.0, 0.0)
    # One more prefill step, and it publishes.
    enough = fed(decode + prefill[: step_cost.MIN_PREFILL_STEPS], refit_every=1)
    assert enough.cost[0] > 0.0
    # Before any step, and on an engine core that never stepped: nothing.
    assert step_cost.StepCosts(CHUNK).cost == (0.0, 0.0)
    assert step_cost.published(SimpleNamespace()) == (0.0, 0.0)


def test_a_long_decode_stretch_keeps_the_prefill_steps() -> None:
    steps = synthetic_steps(CPU_SMALL, 400, seed=2)
    costs = fed(steps)
    before = costs.cost
    decode_only = [(load, t) for load, t in synthetic_steps(CPU_SMALL, 3000, seed=4) if load.prefill_tokens == 0]
    for load, t in decode_only:
        costs.record(load, t)
    assert len(costs.prefill) == step_cost.KEEP_STEPS // 2
    assert costs.cost == pytest.approx(before, rel=0.1)


def kkt_holds(rows: list[tuple[float, ...]], coef: tuple[float, ...]) -> bool:
    """Non-negative least squares' optimality: x >= 0; the gradient of the
    residual is 0 where x > 0 and points outward (<= 0) where x = 0."""
    data = np.asarray(rows, dtype=float)
    a = np.column_stack([np.ones(len(data)), data[:, :4]])
    scale = np.abs(a).max(axis=0)
    scale[scale == 0] = 1.0
    x = np.asarray(coef) * scale
    an = a / scale
    grad = an.T @ (data[:, 4] - an @ x)
    tol = 1e-6 * max(1.0, float(np.abs(an.T @ data[:, 4]).max()))
    return bool((x >= 0).all() and (np.abs(grad[x > 0]) <= tol).all() and (grad[x == 0] <= tol).all())


def test_no_term_is_ever_negative() -> None:
    # Steps that decode faster the more they decode: least squares would
    # give a negative decode term; the fit holds it at 0.
    steps = synthetic_steps((2e-3, 50e-6, -100e-6, 0.0, 0.05e-6), 300, seed=5, noise=0.01)
    rows = [(s.prefill_tokens, s.decode_tokens, s.context_tokens, s.attn_pairs, t) for s, t in steps]
    data = np.asarray(rows)
    free = np.linalg.lstsq(np.column_stack([np.ones(len(data)), data[:, :4]]), data[:, 4], rcond=None)[0]
    assert free[2] < 0  # unconstrained, the decode term goes negative
    fit = step_cost.fit(rows)
    assert fit is not None and min(fit.coef) >= 0.0 and fit.coef[2] == 0.0
    assert kkt_holds(rows, fit.coef)
    # Random steps and durations (some negative): every term >= 0, and optimal.
    rng = random.Random(6)
    for _ in range(40):
        rows = [
            (rng.randrange(0, 2048) * rng.randrange(0, 2), rng.randrange(0, 64), rng.randrange(0, 200000),
             rng.randrange(0, 10**9), rng.uniform(-0.01, 0.2))
            for _ in range(rng.randrange(5, 80))
        ]  # fmt: skip
        fit = step_cost.fit(rows)
        assert fit is not None and min(fit.coef) >= 0.0 and all(math.isfinite(c) for c in fit.coef)
        assert kkt_holds(rows, fit.coef)
    # Durations that no non-negative cost explains: all terms 0, nothing published.
    loads = [load for load, _ in synthetic_steps(CPU_SMALL, 64, seed=7)]
    neg = step_cost.fit([(s.prefill_tokens, s.decode_tokens, s.context_tokens, s.attn_pairs, -1e-3) for s in loads])
    assert neg is not None and neg.coef == (0.0,) * 5
    assert step_cost.usable(neg, CHUNK) == (0.0, 0.0)


class _Counting:
    """A kvgate.Gate that counts the costs told to it."""

    def __init__(self, gate: kvgate.Gate) -> None:
        self.gate, self.told = gate, []

    def set_rebuild_cost(self, *cost: float) -> None:
        self.told.append(cost)
        self.gate.set_rebuild_cost(*cost)


def gauge(gate: kvgate.Gate, name: str) -> float:
    for line in gate.metrics_text().splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise AssertionError(f"no {name} in the metrics text")


def answer(per_token: float, per_pair: float) -> feedback.EngineAnswer:
    return feedback.answer_of(
        {"capacity_tokens": 2048, "block_size": 32, "prefill_tokens_per_sec": 1000.0,
         "rebuild_secs_per_token": per_token, "rebuild_secs_per_pair": per_pair}
    )  # fmt: skip


def test_the_gate_is_told_a_new_cost_once_and_keeps_its_own_on_a_refusal(caplog: pytest.LogCaptureFixture) -> None:
    real = kvgate.Gate(kvgate.Config(), kvgate.Probes(usage=lambda s: 0.0))
    gate = _Counting(real)
    seen = feedback.tell_rebuild_cost(gate, answer(0.0, 0.0), None)  # none carried: nothing told
    assert seen is None and gate.told == [] and gauge(real, PER_TOKEN) == 0.0
    seen = feedback.tell_rebuild_cost(gate, answer(6e-5, 6e-8), seen)
    seen = feedback.tell_rebuild_cost(gate, answer(6e-5, 6e-8), seen)  # the same: not told again
    assert gate.told == [(6e-5, 6e-8)]
    assert (gauge(real, PER_TOKEN), gauge(real, PER_PAIR)) == (6e-5, 6e-8)
    with caplog.at_level(logging.WARNING, logger="kvgate_vllm.feedback"):
        for bad in [(-1e-5, 6e-8), (-1e-5, 6e-8), (math.nan, 0.0), (math.nan, 0.0), (1e-5, math.inf)]:
            seen = feedback.tell_rebuild_cost(gate, answer(*bad), seen)
    refusals = [r for r in caplog.records if "refused" in r.getMessage()]
    assert len(refusals) == 3  # once per cost, NaN included
    assert all(r.levelname == "WARNING" and "keeps the cost it had" in r.getMessage() for r in refusals)
    assert (gauge(real, PER_TOKEN), gauge(real, PER_PAIR)) == (6e-5, 6e-8)
    seen = feedback.tell_rebuild_cost(gate, answer(7e-5, 0.0), seen)  # a good one after: told
    assert (gauge(real, PER_TOKEN), gauge(real, PER_PAIR)) == (7e-5, 0.0)
    real.close()


def test_the_capacity_answer_carries_no_cost_before_a_fit(engine: Any) -> None:
    core = core_of(engine)
    proxy = SimpleNamespace(vllm_config=core.vllm_config, scheduler=core.scheduler)  # never stepped
    got = probes.kvgate_capacity(proxy)
    assert (got["rebuild_secs_per_token"], got["rebuild_secs_per_pair"]) == (0.0, 0.0)
    assert feedback.answer_of(got).rebuild_cost is None


def test_the_engine_fits_its_steps_and_the_gate_is_told_the_cost(engine: Any) -> None:
    """A short workload on the in-process CPU engine (prompts of varied length,
    some after a cached prefix, a few tokens of output each): the capacity
    answer then carries a positive cost from a fit of every term >= 0, and a
    gate of the serving side, answered by this engine, shows that cost."""
    core = core_of(engine)
    rng = random.Random(11)
    shared = random_prompt(rng, 400)
    before = len(step_cost.of(core).prefill)
    for r in range(12):
        batch = {}
        for k in range(3):
            head = shared[: rng.randrange(0, 400)] if k else []
            prompt = head + random_prompt(rng, rng.randrange(60, 500))
            rid = f"step-cost-{r}-{k}"
            engine.add_request(rid, {"prompt_token_ids": prompt}, sampling(rng.randrange(4, 12)))
            batch[rid] = prompt
        run_to_completion(engine, set(batch))
    costs = step_cost.of(core)
    costs.refit()  # (the engine refits every REFIT_STEPS steps; this one is at the end of the workload)
    assert len(costs.prefill) - before >= step_cost.MIN_PREFILL_STEPS or len(costs.prefill) == step_cost.KEEP_STEPS // 2
    fit = costs.last_fit
    assert fit is not None and min(fit.coef) >= 0.0
    got = core.kvgate_capacity()
    per_token, per_pair = got["rebuild_secs_per_token"], got["rebuild_secs_per_pair"]
    assert per_token > 0.0 and per_pair >= 0.0
    assert (per_token, per_pair) == step_cost.rebuild_cost(fit.coef, core.vllm_config.scheduler_config.max_num_batched_tokens)
    print(f"fit over {fit.steps} steps ({fit.prefill_steps} prefilled), rms {fit.rms_sec * 1e3:.2f} ms: "
          + ", ".join(f"{n} {c:.4g}" for n, c in zip(step_cost.TERMS, fit.coef))
          + f"; rebuild {per_token:.4g} s/token, {per_pair:.4g} s/pair")  # fmt: skip

    # The serving side: a gate whose probes this engine answers, as vllm
    # serve's UTILITY calls would.
    async def utility(rank: int, method: str, *args: object) -> Any:
        return getattr(core, method)(*args)

    gates = serve.Gates(SimpleNamespace(engine_core=SimpleNamespace()), knobs={})
    gates._utility = utility  # type: ignore[method-assign]

    async def one_turn() -> None:
        lease = await gates.gate(0).acquire(b"agent", shared)
        lease.release()

    asyncio.run(one_turn())
    gate = gates.gate(0)
    assert gates.rebuild_seen[0] == (per_token, per_pair)
    # The gate prices the linear part at the prefill rate the engine measured,
    # when it gave one (docs/c-abi.md, "The engine's rebuild cost").
    rate = got["prefill_tokens_per_sec"]
    assert gauge(gate, PER_TOKEN) == pytest.approx(1.0 / rate if rate > 0 else per_token, rel=1e-12)
    assert gauge(gate, PER_PAIR) == pytest.approx(per_pair, rel=1e-12)
    gate.close()


def test_a_measurement_that_fails_never_fails_the_engines_step(caplog: pytest.LogCaptureFixture) -> None:
    chunk = SimpleNamespace(max_num_batched_tokens=CHUNK)
    core = SimpleNamespace(vllm_config=SimpleNamespace(scheduler_config=chunk), scheduler=SimpleNamespace())  # no `requests`
    out = SimpleNamespace(num_scheduled_tokens={"a": 5})
    with caplog.at_level(logging.WARNING, logger="kvgate_vllm.step_cost"):
        for _ in range(3):
            step_cost.record(core, out, 0.01)
    assert [r.levelname for r in caplog.records] == ["WARNING"]  # once
    assert "no longer fitted" in caplog.text
    assert step_cost.published(core) == (0.0, 0.0)
