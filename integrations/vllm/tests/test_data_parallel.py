"""`vllm serve --data-parallel-size 2` on the CPU build, gate on: one gate per
engine, each session pinned to one engine (kvgate_vllm.serve.engine_for), its
turns admitted by that engine's gate and its probes sent there. Nothing
mocked."""

from __future__ import annotations

import random
from typing import Any, Iterator

import pytest

from kvgate_vllm import serve
from support.engine import random_prompt
from support.launcher import Server, metric

from test_serve import _running, complete, wait_for

CAPACITY = 400 * 32  # per engine (--num-gpu-blocks-override applies to each)


@pytest.fixture(scope="module")
def dp2(tmp_path_factory: Any) -> Iterator[Server]:
    yield from _running(tmp_path_factory, "dp2", gate=True, extra_args=["--data-parallel-size", "2"])


def test_each_engine_has_its_own_gate_and_a_session_stays_on_one(dp2: Server) -> None:
    rng = random.Random(41)
    names = [f"agent-dp-{i}" for i in range(8)]
    expected = [0, 0]
    for name in names:
        expected[serve.engine_for(name, 2)] += 2
    assert min(expected) > 0, expected  # both engines get sessions (fixed names, a stable hash)
    for name in names:
        prompt = random_prompt(rng, 400)
        for _ in range(2):
            out = complete(dp2, prompt, 8, {"X-Session-ID": name})
            prompt = prompt + list(out.choices[0].token_ids) + random_prompt(rng, 100)
    text = dp2.metrics()
    for engine in (0, 1):
        e = str(engine)
        assert metric(text, "kvgate_admissions_all_total", engine=e) == expected[engine]
        # each gate learned its own engine's capacity (its probe went to that engine)
        assert metric(text, "kvgate_working_set_capacity_tokens", engine=e) == CAPACITY
    wait_for("no lease is left", lambda: metric(dp2.metrics(), "kvgate_active_leases") == 0)
    text = dp2.metrics()
    assert metric(text, "kvgate_waiting_attempts") == metric(text, "kvgate_pending_attempts") == 0
    # the second turns hit the cache their first turns left on the same engine
    assert metric(text, "vllm:prefix_cache_hits_total") >= len(names) * 384
