"""The §1 agent workload through `vllm serve` with the official `openai` client,
plugin off and on: wall time and vLLM's own /metrics hit rate.

    python integrations/vllm/bench/serve_sessions.py [--model tiny] [--config high_watermark=0.2,idle_grace_sec=1]

Each session is an asyncio task sending its turns with `X-Session-ID` (its last
turn with `X-Dynamo-Session-Final: true`); tool calls are sleeps.
"""

from __future__ import annotations

import argparse
import asyncio
import time

import kvgate
import openai

from kvgate_vllm.testing.launcher import Server, metric
from kvgate_vllm.testing.workload import Workload


async def run_sessions(srv: Server, w: Workload) -> float:
    client = openai.AsyncOpenAI(base_url=srv.url + "/v1", api_key="none", max_retries=0, timeout=3600)

    async def session(s: int) -> None:
        script = w.session(s)
        prompt = list(script.first_prompt)
        for t in range(w.turns):
            n = script.output_tokens()
            headers = {"X-Session-ID": f"agent-{s}"}
            if t + 1 == w.turns:
                headers["X-Dynamo-Session-Final"] = "true"
            out = await client.completions.create(
                model=srv.model, prompt=prompt, max_tokens=n, temperature=0.0, extra_headers=headers,
                extra_body={"ignore_eos": True, "min_tokens": n, "return_token_ids": True},
            )  # fmt: skip
            if t + 1 < w.turns:
                sec, result = script.tool_call()
                await asyncio.sleep(sec)
                prompt = prompt + list(out.choices[0].token_ids) + result

    start = time.perf_counter()
    await asyncio.gather(*(session(s) for s in range(w.sessions)))
    return time.perf_counter() - start


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="tiny", choices=["tiny", "small"])
    ap.add_argument("--sessions", type=int, default=24)
    ap.add_argument("--turns", type=int, default=10)
    ap.add_argument("--config", default="", help="KVGATE_VLLM_CONFIG for the plugin-on run (library defaults if empty)")
    ap.add_argument("--log-dir", default=None)
    args = ap.parse_args()
    w = Workload(sessions=args.sessions, turns=args.turns)
    print("| vllm serve | wall time | hit rate (/metrics) | kvgate admissions |")
    print("|---|---|---|---|")
    for gate in (False, True):
        log = f"{args.log_dir}/serve-{'on' if gate else 'off'}.log" if args.log_dir else None
        srv = Server(gate=gate, size=args.model, config=args.config if gate else "", log_path=log)
        try:
            srv.wait_ready()
            before = srv.metrics()
            wall = asyncio.run(run_sessions(srv, w))
            after = srv.metrics()
            q = metric(after, "vllm:prefix_cache_queries_total") - metric(before, "vllm:prefix_cache_queries_total")
            h = metric(after, "vllm:prefix_cache_hits_total") - metric(before, "vllm:prefix_cache_hits_total")
            adm = "—"
            if gate:
                reasons = {}
                for r in (reason.name.lower() for reason in kvgate.Reason):
                    try:
                        reasons[r] = int(metric(after, "kvgate_admissions_total", reason=r))
                    except KeyError:
                        pass
                adm = ", ".join(f"{v} {k}" for k, v in reasons.items() if v)
            label = f"plugin on ({args.config or 'defaults'})" if gate else "plugin off"
            print(f"| {label} | {wall:.1f} s | {100 * h / q:.1f}% | {adm} |", flush=True)
        finally:
            srv.stop()


if __name__ == "__main__":
    main()
