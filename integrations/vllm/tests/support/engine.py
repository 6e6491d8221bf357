"""An in-process vLLM engine for tests and benchmarks, with the real-engine
benchmark's settings (prefix caching, 32-token blocks, a KV cache forced to
`num_blocks`, token-id prompts, no tokenizer)."""

from __future__ import annotations

import os
import random
from typing import Any

from kvgate_vllm import feedback, probes
from . import models

BLOCK_SIZE = 32


def make_engine(
    size: str = "tiny",
    num_blocks: int = 400,
    max_num_batched_tokens: int = 2048,
    max_num_seqs: int = 64,
    max_model_len: int = 8192,
    gpu_memory_utilization: float = 0.5,
    enable_lora: bool = False,
    **extra: Any,
) -> Any:
    """A stepped in-process `LLMEngine` (VLLM_ENABLE_V1_MULTIPROCESSING=0) with the probes installed
    and the turns' connector-loaded tokens carried onto their RequestOutputs."""
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    from vllm import EngineArgs, LLMEngine

    probes.install()
    feedback.install()
    args = EngineArgs(
        model=str(models.make_model(size)),
        skip_tokenizer_init=True,
        enable_prefix_caching=True,
        block_size=BLOCK_SIZE,
        num_gpu_blocks_override=num_blocks,
        max_num_batched_tokens=max_num_batched_tokens,
        max_num_seqs=max_num_seqs,
        max_model_len=max_model_len,
        gpu_memory_utilization=gpu_memory_utilization,
        enforce_eager=True,
        enable_lora=enable_lora,
        seed=0,
        **extra,
    )
    return LLMEngine.from_engine_args(args)


def core_of(engine: Any) -> Any:
    """The EngineCore object inside an in-process LLMEngine (probes are its methods)."""
    return engine.engine_core.engine_core


def sampling(max_tokens: int) -> Any:
    from vllm import SamplingParams

    return SamplingParams(max_tokens=max_tokens, min_tokens=max_tokens, ignore_eos=True, temperature=0.0)


def run_to_completion(engine: Any, request_ids: set[str] | None = None) -> dict[str, Any]:
    """Steps the engine until the given (or all) requests finish; their final outputs by id."""
    done: dict[str, Any] = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                done[out.request_id] = out
        if request_ids is not None and request_ids <= done.keys():
            break
    return done


def random_prompt(rng: "random.Random", n: int) -> list[int]:
    """n random token ids (3..3999: clear of the bos/eos ids of the random models)."""
    return [rng.randrange(3, 4000) for _ in range(n)]
