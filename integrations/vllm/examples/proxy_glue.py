"""A proxy that keeps its own vLLM engine client and gates each turn with kvgate.

The reference design: the proxy owns an `AsyncLLM` (engine core in its own
process), the probes are UTILITY calls through `engine_core.call_utility_async`
(kvgate_vllm.serve.Gates does that, one gate per data-parallel engine), and
each turn is acquire -> generate -> release with the engine's figures.

    python integrations/vllm/examples/proxy_glue.py     # prints one line per turn
"""

from __future__ import annotations

import asyncio
import random

from vllm import AsyncEngineArgs
from vllm.v1.engine.async_llm import AsyncLLM

from kvgate_vllm import feedback, ffi, models, probes
from kvgate_vllm.engine import random_prompt, sampling
from kvgate_vllm.serve import Gates


async def main() -> None:
    probes.install()  # the engine-core process gets them from the plugin entry point too
    args = AsyncEngineArgs(
        model=str(models.make_model("tiny")), skip_tokenizer_init=True, enable_prefix_caching=True,
        block_size=32, num_gpu_blocks_override=400, max_model_len=8192, gpu_memory_utilization=0.3, enforce_eager=True,
    )  # fmt: skip
    llm = AsyncLLM.from_engine_args(args)
    gates = Gates(llm, asyncio.get_running_loop(), knobs={"high_watermark": 0.2, "idle_grace_sec": 1.0})
    try:

        async def session(name: str, seed: int) -> None:
            rng = random.Random(seed)
            prompt = random_prompt(rng, 300)
            gate = gates.gate(0)
            for turn in range(3):
                admission = await gate.acquire(name.encode(), prompt)  # cancellable; never leaks a lease
                figures = None
                try:
                    async for out in llm.generate({"prompt_token_ids": prompt}, sampling(16), f"{name}-{turn}"):
                        if out.finished:
                            figures = feedback.figures_of(out)
                finally:
                    feedback.release(gate.gate, admission.lease, figures)
                assert figures is not None
                print(f"{name} turn {turn}: {ffi.reason_name(admission.reason)}, {figures.cached_tokens}/{figures.prompt_tokens} cached")
                prompt = prompt + list(out.outputs[0].token_ids) + random_prompt(rng, 100)
            gate.gate.finish_session(name.encode())

        await asyncio.gather(session("agent-1", 1), session("agent-2", 2))
        print(gates.metrics_text()[0][1].splitlines()[0])
    finally:
        llm.shutdown()


if __name__ == "__main__":
    asyncio.run(main())
