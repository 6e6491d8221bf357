"""LoRA keys the engine's block hashes by adapter name and path: the probe must too
(a real random adapter on the real engine, no mock)."""

from __future__ import annotations

import random
from typing import Any, Iterator

import pytest
from vllm.lora.request import LoRARequest

from support.engine import core_of, make_engine, random_prompt, run_to_completion, sampling
from support.models import make_lora


# Session-scoped like conftest's `engine`: an in-process engine torn down
# tears down the process's model-parallel groups, which the other engine
# (and every test after this file that steps it) still needs.
@pytest.fixture(scope="session")
def lora_engine() -> Iterator[Any]:
    yield make_engine("tiny", num_blocks=64, max_model_len=2016, enable_lora=True, max_lora_rank=8, max_loras=2)


def test_lora_requests_probe_like_the_engine_hashes(lora_engine: Any) -> None:
    path = str(make_lora("tiny"))
    core = core_of(lora_engine)
    prompt = random_prompt(random.Random(0), 300)
    adapter = LoRARequest("adapter-1", 1, path)

    def run(rid: str, lora: LoRARequest | None) -> int:
        lora_engine.add_request(rid, {"prompt_token_ids": prompt}, sampling(4), lora_request=lora)
        return run_to_completion(lora_engine, {rid})[rid].num_cached_tokens

    assert run("l1", adapter) == 0
    assert core.kvgate_prefix(prompt, ["adapter-1", 1, path]) == [288, 300]
    assert core.kvgate_prefix(prompt, ["adapter-1", 1, path], None, "lora-session") == [288, 300]
    assert core.kvgate_prefix(prompt) == [0, 300]  # the base model has not seen it
    assert core.kvgate_prefix(prompt, ["adapter-2", 2, path]) == [0, 300]  # another adapter name
    assert core.kvgate_prefix(prompt, None, None, "lora-session") == [0, 300]  # chain re-keyed
    assert run("l2", None) == 0
    assert run("l3", adapter) == 288
