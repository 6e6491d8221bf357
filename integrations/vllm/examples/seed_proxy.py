"""The seed proxy's session-level scheduler swapped for kvgate's drop-in, over a real engine.

A verl-like server manager owns an `AsyncLLM` (engine core in its own
process); its `kv_cache_usage_probe`, `prefix_cache_probe` and
`kv_cache_capacity_probe` are UTILITY calls answered by kvgate_vllm's
engine-core methods (`kvgate_usage`, `kvgate_prefix`, `kvgate_capacity`).
Each agent session runs its turns as the seed proxy does: acquire with an
abort event, generate, release the lease in a `finally` (here with the
engine's figures), and finish the session at the end.

    HARBOR_SESSION_LEVEL_SCHEDULER=1 python integrations/vllm/examples/seed_proxy.py
    python integrations/vllm/examples/seed_proxy.py working_set reference

With no argument the scheduler reads the environment, as in the proxy; each
argument instead runs one round on the same engine with a preset (see
PRESETS). One JSON line per round: the turns run, the admission reasons,
the probe calls and what the gate still holds at the end.
"""

from __future__ import annotations

import asyncio
import collections
import json
import os
import pathlib
import random
import sys
import time
from typing import Any, Mapping, Optional

from vllm import AsyncEngineArgs
from vllm.v1.engine.async_llm import AsyncLLM

import kvgate
from kvgate_vllm import probes

# The fixtures (model maker, engine) live with the tests, outside the
# runtime package: integrations/vllm/tests/support.
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "tests"))

from support import models
from support.engine import random_prompt, sampling

PRESETS: dict[str, dict[str, str]] = {
    # Switched on, no knob: kvgate's working-set admission.
    "working_set": {"HARBOR_SESSION_LEVEL_SCHEDULER": "1"},
    # A knob set: the seed's table with the seed's values.
    "reference": {"HARBOR_SESSION_LEVEL_SCHEDULER": "1", "HARBOR_SESSION_SCHEDULER_HIGH_WATERMARK": "0.85"},
}
SESSIONS, TURNS = 8, 4
FIRST_PROMPT, OUTPUT, TOOL_RESULT = 256, 16, 96


class ServerManager:
    """What the proxy calls on verl's server manager, over one AsyncLLM;
    counts the probe calls."""

    def __init__(self, llm: AsyncLLM) -> None:
        self.llm = llm
        self.calls: collections.Counter[str] = collections.Counter()

    async def _utility(self, method: str, *args: Any) -> Any:
        self.calls[method] += 1
        return await self.llm.engine_core.call_utility_async(method, *args)

    async def kv_cache_usage_probe(self, request_id: str) -> dict[str, float]:
        return {"kv_cache_usage": float(await self._utility("kvgate_usage"))}

    async def prefix_cache_probe(self, request_id: str, *, prompt_ids: list[int]) -> dict[str, float]:
        hit, n = await self._utility("kvgate_prefix", prompt_ids, None, None, request_id)
        return {"hit_tokens": hit, "hit_ratio": hit / n if n else 0.0}

    async def kv_cache_capacity_probe(self, request_id: str) -> dict[str, Any]:
        return await self._utility("kvgate_capacity")

    async def generate(self, request_id: str, prompt_ids: list[int], sampling_params: Any) -> Any:
        final = None
        async for out in self.llm.generate({"prompt_token_ids": prompt_ids}, sampling_params, request_id):
            final = out
        return final


async def session(scheduler: kvgate.SessionLevelScheduler, manager: ServerManager, name: str, seed: int, tally: dict) -> None:
    rng = random.Random(seed)
    prompt = random_prompt(rng, FIRST_PROMPT)
    for turn in range(TURNS):
        abort = asyncio.Event()  # the proxy sets it when a newer retry of this session arrives
        lease = await scheduler.acquire(name, list(prompt), abort_event=abort)
        tally["reasons"][lease.reason] += 1
        out = None
        try:
            out = await manager.generate(f"{name}-{turn}", list(prompt), sampling(OUTPUT))
        finally:
            if out is None:
                await lease.release()
            else:
                await lease.release(cached_tokens=out.num_cached_tokens or 0, output_tokens=len(out.outputs[0].token_ids))
        tally["turns"] += 1
        tally["prompt_tokens"] += len(prompt)
        tally["cached_tokens"] += out.num_cached_tokens or 0
        prompt = prompt + list(out.outputs[0].token_ids) + random_prompt(rng, TOOL_RESULT)
    await scheduler.finish_session(name, reason="finish_tool")


async def round_(llm: AsyncLLM, label: str, environ: Optional[Mapping[str, str]], seed: int) -> dict[str, Any]:
    manager = ServerManager(llm)
    scheduler = kvgate.SessionLevelScheduler(manager, environ=environ)
    tally: dict[str, Any] = {"turns": 0, "prompt_tokens": 0, "cached_tokens": 0, "reasons": collections.Counter()}
    start = time.monotonic()
    try:
        await asyncio.gather(*(session(scheduler, manager, f"{label}-agent-{i}", seed + i, tally) for i in range(SESSIONS)))
        stats = scheduler.gate.stats() if scheduler.gate is not None else None
    finally:
        scheduler.close()
    return {
        "round": label,
        "mode": scheduler.mode.name.lower() if scheduler.mode is not None else "disabled",
        "turns": tally["turns"],
        "reasons": dict(tally["reasons"]),
        "prompt_tokens": tally["prompt_tokens"],
        "cached_tokens": tally["cached_tokens"],
        "probe_calls": dict(manager.calls),
        "active_leases": stats.active_leases if stats else 0,
        "pending_attempts": stats.pending_attempts if stats else 0,
        "reserved": (stats.reserved_in_flight + stats.reserved_in_grace) if stats else 0,
        "working_set_sessions": stats.working_set_sessions if stats else 0,
        "waits": stats.waits if stats else 0,
        "wall_sec": round(time.monotonic() - start, 2),
    }


async def main(presets: list[str]) -> None:
    probes.install()  # the engine-core process gets them from the plugin entry point too
    # 64 blocks of 32 tokens (2,048 tokens) for 8 sessions growing to ~600 tokens each: pressure.
    args = AsyncEngineArgs(
        model=str(models.make_model("tiny")), skip_tokenizer_init=True, enable_prefix_caching=True,
        block_size=32, num_gpu_blocks_override=64, max_model_len=2016, max_num_seqs=8,
        gpu_memory_utilization=0.3, enforce_eager=True, seed=0,
    )  # fmt: skip
    llm = AsyncLLM.from_engine_args(args)
    try:
        rounds = [(p, PRESETS[p]) for p in presets] or [("env", None)]
        for i, (label, environ) in enumerate(rounds):
            print(json.dumps(await round_(llm, label, environ, seed=100 * (i + 1))), flush=True)
    finally:
        llm.shutdown()


if __name__ == "__main__":
    unknown = [a for a in sys.argv[1:] if a not in PRESETS]
    if unknown:
        sys.exit(f"seed_proxy.py: unknown preset(s) {unknown}; known: {sorted(PRESETS)}")
    if not sys.argv[1:] and not os.environ.get("HARBOR_SESSION_LEVEL_SCHEDULER"):
        print("HARBOR_SESSION_LEVEL_SCHEDULER is not set: the scheduler is off (every lease 'disabled')", file=sys.stderr)
    asyncio.run(main(sys.argv[1:]))
