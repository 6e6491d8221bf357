"""The probes against the real vLLM engine (CPU build, tiny random Llama).

Each check compares what a probe says with what the engine then does: the
`num_cached_tokens` of the next identical request and vLLM's own prefix-cache
counters (`vllm:prefix_cache_queries` / `_hits`), the engine's usage gauge and
its `vllm:cache_config_info`. No mock of vLLM anywhere."""

from __future__ import annotations

import random
import statistics
import time
from types import SimpleNamespace
from typing import Any

import prometheus_client
import pytest

from kvgate_vllm import prefill_rate
from support.engine import core_of, random_prompt, run_to_completion, sampling



_ids = iter(range(10**9))


def run(engine: Any, prompt: list[int], max_tokens: int = 4, cache_salt: str | None = None) -> Any:
    rid = f"t{next(_ids)}"
    inputs: dict[str, Any] = {"prompt_token_ids": prompt}
    if cache_salt is not None:
        inputs["cache_salt"] = cache_salt
    engine.add_request(rid, inputs, sampling(max_tokens))
    return run_to_completion(engine, {rid})[rid]


def counters() -> tuple[float, float]:
    q = h = 0.0
    for fam in prometheus_client.REGISTRY.collect():
        for s in fam.samples:
            if s.name == "vllm:prefix_cache_queries_total":
                q += s.value
            elif s.name == "vllm:prefix_cache_hits_total":
                h += s.value
    return q, h


def gauge(name: str) -> Any:
    for fam in prometheus_client.REGISTRY.collect():
        for s in fam.samples:
            if s.name == name:
                return s
    raise AssertionError(f"{name} not exported")


@pytest.mark.parametrize("length", [40, 287, 288, 300, 320, 1000])
def test_a_prompt_that_ran_reports_the_hit_the_engine_then_gives(engine: Any, length: int) -> None:
    core = core_of(engine)
    rng = random.Random(length)
    prompt = random_prompt(rng, length)
    assert core.kvgate_prefix(prompt) == [0, length]  # never seen: nothing resident
    first = run(engine, prompt)
    assert first.num_cached_tokens == 0
    hit, n = core.kvgate_prefix(prompt)
    assert n == length
    # block-aligned, never the whole prompt (the engine recomputes at least the last token)
    assert hit == ((length - 1) // 32) * 32
    q0, h0 = counters()
    second = run(engine, prompt)
    q1, h1 = counters()
    assert second.num_cached_tokens == hit
    assert (q1 - q0, h1 - h0) == (length, hit)


def test_a_longer_turn_of_the_same_session_hits_its_previous_prompt(engine: Any) -> None:
    core = core_of(engine)
    rng = random.Random(7)
    prompt = random_prompt(rng, 200)
    out = run(engine, prompt, max_tokens=20)
    turn2 = prompt + list(out.outputs[0].token_ids) + random_prompt(rng, 150)
    for session in (None, "agent-1", "agent-1"):  # cold chain, then the cached chain
        hit, n = core.kvgate_prefix(turn2, session=session)
        assert (hit, n) == (192, len(turn2))  # 200 prompt + 19 computed outputs -> 6 full blocks
    again = run(engine, turn2)
    assert again.num_cached_tokens == 192


def test_cache_salt_is_keyed_like_the_engine(engine: Any) -> None:
    core = core_of(engine)
    prompt = random_prompt(random.Random(11), 256)
    run(engine, prompt, cache_salt="tenant-a")
    assert core.kvgate_prefix(prompt, cache_salt="tenant-a")[0] == 224
    assert core.kvgate_prefix(prompt, cache_salt="tenant-b")[0] == 0
    assert core.kvgate_prefix(prompt)[0] == 0
    assert core.kvgate_prefix(prompt, session="s-salt", cache_salt="tenant-a")[0] == 224
    assert core.kvgate_prefix(prompt, session="s-salt")[0] == 0  # the chain is re-keyed, not reused
    assert run(engine, prompt, cache_salt="tenant-b").num_cached_tokens == 0
    assert run(engine, prompt).num_cached_tokens == 0
    assert run(engine, prompt, cache_salt="tenant-a").num_cached_tokens == 224


def test_an_evicted_prompt_reports_a_low_ratio(engine: Any) -> None:
    core = core_of(engine)
    rng = random.Random(3)
    victim = random_prompt(rng, 640)  # 20 of the 63 usable blocks
    run(engine, victim)
    assert core.kvgate_prefix(victim)[0] == 608
    for _ in range(4):  # 4 x 1000 fresh tokens through a 2,016-token cache
        run(engine, random_prompt(rng, 1000))
    hit, n = core.kvgate_prefix(victim)
    assert hit / n < 0.2
    assert run(engine, victim).num_cached_tokens == hit


def test_usage_and_capacity_match_the_engine(engine: Any) -> None:
    core = core_of(engine)
    cap = core.kvgate_capacity()
    info = gauge("vllm:cache_config_info").labels
    assert cap["num_gpu_blocks"] == int(info["num_gpu_blocks"]) == 64
    assert cap["block_size"] == int(info["block_size"]) == 32
    assert cap["capacity_tokens"] == int(info["kv_cache_size_tokens"]) == 2048
    assert cap["usable_tokens"] == 63 * 32
    assert core.kvgate_usage() == 0.0  # nothing running: cached blocks are free
    rng = random.Random(5)
    engine.add_request("usage-1", {"prompt_token_ids": random_prompt(rng, 500)}, sampling(200))
    engine.add_request("usage-2", {"prompt_token_ids": random_prompt(rng, 300)}, sampling(200))
    seen = []
    while engine.has_unfinished_requests():
        engine.step()
        pool = core.scheduler.kv_cache_manager.block_pool
        held = sum(1 for b in pool.blocks[1:] if b.ref_cnt > 0)
        usage = core.kvgate_usage()
        assert usage == pytest.approx(held / 63)
        assert usage == pytest.approx(gauge("vllm:kv_cache_usage_perc").value)  # the engine's own figure
        seen.append(usage)
    assert max(seen) > 0.4 and core.kvgate_usage() == 0.0


def test_the_capacity_probe_answers_the_prefill_rate_the_steps_showed(engine: Any) -> None:
    """The rate is the median of recent prefill-heavy steps' rates, measured
    only from steps that prefilled at least a quarter of the token budget
    (2,048 here)."""
    core = core_of(engine)
    budget = core.vllm_config.scheduler_config.max_num_batched_tokens
    rng = random.Random(11)
    rates = []
    for _ in range(3):
        # Two 900-token prompts at once: one step prefills 1,800 tokens.
        rids = [f"rate-{next(_ids)}" for _ in range(2)]
        for rid in rids:
            engine.add_request(rid, {"prompt_token_ids": random_prompt(rng, 900)}, sampling(2))
        started = time.perf_counter()
        engine.step()
        first_step = time.perf_counter() - started
        run_to_completion(engine, set(rids))
        rates.append(core.kvgate_capacity()["prefill_tokens_per_sec"])
        # This step prefilled 1,800 tokens in `first_step` (plus the wrapper's
        # own time): the step's own rate, at least that, is among the
        # recent rates, and the answer is their median.
        recent = list(core.__dict__["_kvgate_prefill_rates"])
        assert recent[-1] >= 1800 / first_step * 0.99
        assert rates[-1] == statistics.median_high(recent)
    assert all(r > 0 for r in rates), rates
    # What counts: requests scheduled for more than one token (decode is one).
    assert prefill_rate.prefill_tokens(_Scheduled({"a": 1, "b": 700, "c": 1, "d": 2})) == 702
    # A step below a quarter of the budget says more about the step's fixed
    # cost than about the rate: not sampled.
    config = SimpleNamespace(scheduler_config=SimpleNamespace(max_num_batched_tokens=budget))
    fake = SimpleNamespace(vllm_config=config)
    prefill_rate._record(fake, _Scheduled({"a": budget // 4 - 1}), 0.001)
    assert prefill_rate.typical_rate(fake) == 0.0
    prefill_rate._record(fake, _Scheduled({"a": budget // 4}), 0.001)
    assert prefill_rate.typical_rate(fake) == pytest.approx(budget // 4 / 0.001)
    # The median of the recent steps: one lucky step does not set it.
    for seconds in (0.002, 0.0015, 0.0001):
        prefill_rate._record(fake, _Scheduled({"a": budget // 4}), seconds)
    assert prefill_rate.typical_rate(fake) == pytest.approx(budget // 4 / 0.001)
    # Only the last RECENT_STEPS steps count.
    for _ in range(prefill_rate.RECENT_STEPS):
        prefill_rate._record(fake, _Scheduled({"a": budget // 4}), 0.004)
    assert prefill_rate.typical_rate(fake) == pytest.approx(budget // 4 / 0.004)


class _Scheduled:
    def __init__(self, counts: dict[str, int]) -> None:
        self.num_scheduled_tokens = counts


def snapshot(engine: Any) -> dict[str, Any]:
    core = core_of(engine)
    mgr = core.scheduler.kv_cache_manager
    pool = mgr.block_pool
    stats = mgr.prefix_cache_stats
    return {
        "free_order": [b.block_id for b in pool.free_block_queue.get_all_free_blocks()],
        "ref_cnt": [b.ref_cnt for b in pool.blocks],
        "block_hashes": [b.block_hash for b in pool.blocks],
        "num_cached": len(pool.cached_block_hash_to_block),
        "stats": None if stats is None else (stats.requests, stats.queries, stats.hits),
        "counters": counters(),
        "waiting": [r.request_id for r in core.scheduler.waiting],
        "running": [r.request_id for r in core.scheduler.running],
        "requests": sorted(core.scheduler.requests),
        "kv_events": len(getattr(pool, "kv_event_queue", []) or []),
    }


def test_thousands_of_probes_change_nothing(engine: Any) -> None:
    core = core_of(engine)
    rng = random.Random(9)
    prompts = [random_prompt(rng, n) for n in (100, 400, 700)]
    for p in prompts:
        run(engine, p)
    # one request waiting in the scheduler, one running, while the probes run
    engine.add_request("probe-bg-1", {"prompt_token_ids": prompts[0] + random_prompt(rng, 100)}, sampling(50))
    engine.step()
    engine.add_request("probe-bg-2", {"prompt_token_ids": random_prompt(rng, 64)}, sampling(5))
    before = snapshot(engine)
    assert before["running"] and before["requests"]
    for i in range(3000):
        p = prompts[i % 3] if i % 2 else prompts[i % 3][: 1 + (i * 37) % 700] + random_prompt(rng, i % 50)
        salt = "x" if i % 7 == 0 else None
        core.kvgate_prefix(p, None, salt, f"s{i % 40}" if i % 3 else None)
        core.kvgate_usage()
        if i % 100 == 0:
            core.kvgate_capacity()
    assert snapshot(engine) == before
    run_to_completion(engine)
