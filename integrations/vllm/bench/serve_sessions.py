"""The §1 agent workload through `vllm serve` with the official `openai` client,
plugin off and on: wall time and vLLM's own /metrics hit rate.

    python integrations/vllm/bench/serve_sessions.py [--model small] [--policies off,cap-3,cap-4,on] [--rounds 2]

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
    ap.add_argument(
        "--policies",
        default="off,on",
        help="comma-separated, run in this order each round: off (plugin off), on (plugin on), "
        "cap-K (plugin off, at most K sessions at once in the client)",
    )
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--log-dir", default=None)
    args = ap.parse_args()
    w = Workload(sessions=args.sessions, turns=args.turns)
    policies = [p.strip() for p in args.policies.split(",") if p.strip()]
    for p in policies:
        if p not in ("off", "on") and not (p.startswith("cap-") and p[4:].isdigit() and int(p[4:]) > 0):
            ap.error(f"--policies: {p!r} is not off, on or cap-K")
    print("| round | vllm serve | wall time | hit rate (/metrics) | kvgate admissions |")
    print("|---|---|---|---|---|")
    for r in range(1, args.rounds + 1):
        for policy in policies:
            gate = policy == "on"
            cap = int(policy[4:]) if policy.startswith("cap-") else None
            log = f"{args.log_dir}/serve-{policy}-{r}.log" if args.log_dir else None
            srv = Server(gate=gate, size=args.model, config=args.config if gate else "", log_path=log)
            try:
                srv.wait_ready()
                before = srv.metrics()
                wall = asyncio.run(run_sessions(srv.url, srv.model, w, cap=cap))
                after = srv.metrics()
                q = metric(after, "vllm:prefix_cache_queries_total") - metric(before, "vllm:prefix_cache_queries_total")
                h = metric(after, "vllm:prefix_cache_hits_total") - metric(before, "vllm:prefix_cache_hits_total")
                adm = "—"
                if gate:
                    reasons = {
                        name: int(metric_or_zero(after, "kvgate_admissions_total", reason=name))
                        for name in (reason.name.lower() for reason in kvgate.Reason)
                    }
                    adm = ", ".join(f"{v} {k}" for k, v in reasons.items() if v)
                label = {"on": f"plugin on ({args.config or 'defaults'})", "off": "plugin off"}.get(
                    policy, f"plugin off, client {policy}"
                )
                print(f"| {r} | {label} | {wall:.1f} s | {100 * h / q:.1f}% | {adm} |", flush=True)
            finally:
                srv.stop()


if __name__ == "__main__":
    main()
