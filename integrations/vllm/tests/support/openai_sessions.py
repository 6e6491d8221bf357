"""The agent workload driven through an OpenAI-compatible server with the
official `openai` client: each session an asyncio task sending its turns with
`X-Session-ID` (its last turn with `X-Dynamo-Session-Final: true`), tool calls
as sleeps. Used by the benchmarks that go through `vllm serve`."""

from __future__ import annotations

import asyncio
import time
from typing import Any, Awaitable, Callable, Optional

import openai

from support.workload import Workload

#: One turn: (session id, prompt, output tokens, final) -> the completion.
Turn = Callable[[str, list, int, bool], Awaitable[Any]]


def client_turn(client: openai.AsyncOpenAI, model: str) -> Turn:
    """A turn sent with `client` (a server or a router): `X-Session-ID`, and
    `X-Dynamo-Session-Final` on the last turn."""

    async def turn(session: str, prompt: list, n: int, final: bool) -> Any:
        headers = {"X-Session-ID": session}
        if final:
            headers["X-Dynamo-Session-Final"] = "true"
        return await client.completions.create(
            model=model, prompt=prompt, max_tokens=n, temperature=0.0, extra_headers=headers,
            extra_body={"ignore_eos": True, "min_tokens": n, "return_token_ids": True},
        )  # fmt: skip

    return turn


async def run_sessions(
    url: str, model: str, w: Workload, turn: Optional[Turn] = None, cap: Optional[int] = None
) -> float:
    """Runs every session of `w` against the server at `url` (or through
    `turn`, e.g. a proxy that places sessions itself); returns the wall time,
    seconds. With `cap`, at most that many sessions run at once, each from
    its first turn to its last (a fixed cap, as the simulator's `cap-K`)."""
    if turn is None:
        async with openai.AsyncOpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=3600) as client:
            return await run_sessions(url, model, w, client_turn(client, model), cap)
    slots = asyncio.Semaphore(cap) if cap else None

    async def session(s: int) -> None:
        if slots is None:
            return await session_turns(s)
        async with slots:
            return await session_turns(s)

    async def session_turns(s: int) -> None:
        script = w.session(s)
        await asyncio.sleep(script.start_sec)
        prompt = list(script.first_prompt)
        for t in range(w.turns):
            n = script.output_tokens()
            out = await turn(f"agent-{s}", prompt, n, t + 1 == w.turns)
            if t + 1 < w.turns:
                sec, result = script.tool_call()
                await asyncio.sleep(sec)
                prompt = prompt + list(out.choices[0].token_ids) + result

    start = time.perf_counter()
    await asyncio.gather(*(session(s) for s in range(w.sessions)))
    return time.perf_counter() - start
