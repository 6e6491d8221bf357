"""The §1 agent workload through `vllm serve` with the official `openai` client,
plugin off and on: wall time and vLLM's own /metrics hit rate.

    python integrations/vllm/bench/serve_sessions.py [--model tiny] [--config high_watermark=0.2,idle_grace_sec=1]

Each session is an asyncio task sending its turns with `X-Session-ID` (its last
turn with `X-Dynamo-Session-Final: true`); tool calls are sleeps.
"""

from __future__ import annotations

import argparse
import asyncio
import pathlib
import sys

import kvgate

# The fixtures (model maker, engine, launcher, workload) live with the tests,
# outside the runtime package: integrations/vllm/tests/support.
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "tests"))

from support.launcher import Server, metric, metric_or_zero
from support.openai_sessions import run_sessions
from support.workload import Workload


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
            wall = asyncio.run(run_sessions(srv.url, srv.model, w))
            after = srv.metrics()
            q = metric(after, "vllm:prefix_cache_queries_total") - metric(before, "vllm:prefix_cache_queries_total")
            h = metric(after, "vllm:prefix_cache_hits_total") - metric(before, "vllm:prefix_cache_hits_total")
            adm = "—"
            if gate:
                reasons = {
                    r: int(metric_or_zero(after, "kvgate_admissions_total", reason=r))
                    for r in (reason.name.lower() for reason in kvgate.Reason)
                }
                adm = ", ".join(f"{v} {k}" for k, v in reasons.items() if v)
            label = f"plugin on ({args.config or 'defaults'})" if gate else "plugin off"
            print(f"| {label} | {wall:.1f} s | {100 * h / q:.1f}% | {adm} |", flush=True)
        finally:
            srv.stop()


if __name__ == "__main__":
    main()
