"""A proxy that keeps its own vLLM engine client and gates each turn with kvgate.

The reference design: the proxy owns an `AsyncLLM` (engine core in its own
process), the probes are `async def`s awaiting UTILITY calls through the
engine-core client (kvgate_vllm.serve.Gates does that, one `kvgate.Gate` per
data-parallel engine), and each turn is `async with gate.acquire(...)` ->
generate -> release with the engine's figures, all in one event loop.

    python integrations/vllm/examples/proxy_glue.py     # prints one line per turn
"""

from __future__ import annotations

import asyncio
import pathlib
import random
import sys

from vllm import AsyncEngineArgs
from vllm.v1.engine.async_llm import AsyncLLM

from kvgate_vllm import feedback, probes
from kvgate_vllm.serve import Gates

# The fixtures (model maker, engine, launcher, workload) live with the tests,
# outside the runtime package: integrations/vllm/tests/support.
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "tests"))

from support import models
from support.engine import random_prompt, sampling


async def main() -> None:
    probes.install()  # the engine-core process gets them from the plugin entry point too
    args = AsyncEngineArgs(
        model=str(models.make_model("tiny")), skip_tokenizer_init=True, enable_prefix_caching=True,
        block_size=32, num_gpu_blocks_override=400, max_model_len=8192, gpu_memory_utilization=0.3, enforce_eager=True,
    )  # fmt: skip
    llm = AsyncLLM.from_engine_args(args)
    # The library's defaults (working-set admission: the capacity probe asks
    # the engine's kvgate_capacity once). E.g. {"admission_mode": "reference",
    # "high_watermark": 0.2} for the seed's table.
    gates = Gates(llm, knobs={})
    try:

        async def session(name: str, seed: int) -> None:
            rng = random.Random(seed)
            prompt = random_prompt(rng, 300)
            gate = gates.gate(0)
            for turn in range(3):
                figures = None
                # Cancelling this task cancels a waiting attempt; the lease is
                # released on every exit path (the `async with`), with the
                # engine's figures when the turn finished.
                async with gate.acquire(name, prompt) as lease:
                    async for out in llm.generate({"prompt_token_ids": prompt}, sampling(16), f"{name}-{turn}"):
                        if out.finished:
                            figures = feedback.figures_of(out)
                    feedback.release(lease, figures)
                assert figures is not None and lease.released
                print(f"{name} turn {turn}: {lease.reason.name.lower()}, {figures.cached_tokens}/{figures.prompt_tokens} cached")
                prompt = prompt + list(out.outputs[0].token_ids) + random_prompt(rng, 100)
            gate.finish_session(name)

        await asyncio.gather(session("agent-1", 1), session("agent-2", 2))
        print(gates.metrics_text()[0][1].splitlines()[0])
    finally:
        llm.shutdown()


if __name__ == "__main__":
    asyncio.run(main())
