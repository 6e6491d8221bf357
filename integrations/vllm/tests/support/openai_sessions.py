"""The agent workload driven through an OpenAI-compatible server with the
official `openai` client: each session an asyncio task sending its turns with
`X-Session-ID` (its last turn with `X-Dynamo-Session-Final: true`), tool calls
as sleeps. Used by the benchmarks that go through `vllm serve`."""

from __future__ import annotations

import asyncio
import time

import openai

from support.workload import Workload


async def run_sessions(url: str, model: str, w: Workload) -> float:
    """Runs every session of `w` against the server at `url`; returns the wall time, seconds."""
    client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=3600)

    async def session(s: int) -> None:
        script = w.session(s)
        prompt = list(script.first_prompt)
        for t in range(w.turns):
            n = script.output_tokens()
            headers = {"X-Session-ID": f"agent-{s}"}
            if t + 1 == w.turns:
                headers["X-Dynamo-Session-Final"] = "true"
            out = await client.completions.create(
                model=model, prompt=prompt, max_tokens=n, temperature=0.0, extra_headers=headers,
                extra_body={"ignore_eos": True, "min_tokens": n, "return_token_ids": True},
            )  # fmt: skip
            if t + 1 < w.turns:
                sec, result = script.tool_call()
                await asyncio.sleep(sec)
                prompt = prompt + list(out.choices[0].token_ids) + result

    start = time.perf_counter()
    await asyncio.gather(*(session(s) for s in range(w.sessions)))
    return time.perf_counter() - start
