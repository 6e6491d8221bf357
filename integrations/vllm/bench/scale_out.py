"""Scale-out: the agent workload over N `vllm serve` replicas, gate off on
every replica and gate on every replica (one gate each): wall time,
prefix-cache hit rate summed over the replicas' own /metrics, and where each
replica's admissions went.

    python integrations/vllm/bench/scale_out.py [--replicas 2] [--sessions 48] [--turns 10] [--blocks 400] \
        [--config ''] [--config admission_mode=reference,high_watermark=0.2,idle_grace_sec=1,wait_poll_sec=1] \
        [--placement hash --placement sticky --placement room --placement room-refuse] \
        [--long-sessions 6 --long-task-tokens 2048 --arrival-sec 0.5] [--rounds 2]

Each --config is one gated row (KVGATE_VLLM_CONFIG; '' = the library's
defaults) per --placement; the ungated row comes first. Placements: `hash`
(vLLM's router, consistent hash on `X-Session-ID`; the default), `sticky`
(vLLM's router, `sticky_least_loaded`: the fewest sessions), `room` (no
router: a proxy with one client per replica places each new session by the
gates' room, `kvgate.Placement`), `room-refuse` (the same with every replica
in refusal mode, KVGATE_VLLM_REFUSE_NEW=1: a turn that would wait is answered
429 and the proxy places the session where there is room, or retries after
Retry-After). --rounds repeats the whole set of rows (paired rounds). Every row's replicas listen on the same
ports, so the router's hash ring (it hashes the worker URLs) and with it every
session's replica are the same in every row. The router comes from
scripts/install-router.sh. Each session is an asyncio task (tool calls are
sleeps), as in serve_sessions.py.
"""

from __future__ import annotations

import argparse
import asyncio
import pathlib
import sys
from typing import Optional

import kvgate

# The fixtures (model maker, engine, launcher, workload) live with the tests,
# outside the runtime package: integrations/vllm/tests/support.
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "tests"))

from support.launcher import Server, free_port, metric_or_zero
from support.openai_sessions import run_sessions
from support.placing_proxy import PlacingProxy
from support.router import Router

PLACEMENTS = ("hash", "sticky", "room", "room-refuse")
from support.workload import Workload


async def through_proxy(replicas: list[Server], w: Workload) -> float:
    proxy = PlacingProxy([srv.url for srv in replicas], replicas[0].model)
    try:
        return await run_sessions("", replicas[0].model, w, turn=proxy.turn)
    finally:
        await proxy.close()


def run(gate: bool, config: str, placement: str, ports: list[int], args: argparse.Namespace, w: Workload) -> str:
    replicas: list[Server] = []
    router: Optional[Router] = None
    tag = f"on-{config or 'defaults'}-{placement}" if gate else "off"
    env = {"KVGATE_VLLM_REFUSE_NEW": "1"} if placement == "room-refuse" else {}
    try:
        for i in range(args.replicas):
            log = f"{args.log_dir}/replica{i}-{tag}.log" if args.log_dir else None
            replicas.append(
                Server(gate=gate, size=args.model, num_blocks=args.blocks, config=config, log_path=log, port=ports[i], env=env)
            )
        for srv in replicas:
            srv.wait_ready()
        before = [srv.metrics() for srv in replicas]
        if placement in ("hash", "sticky"):
            policy = "consistent_hash" if placement == "hash" else "sticky_least_loaded"
            router = Router(
                [srv.url for srv in replicas], log_path=f"{args.log_dir}/router-{tag}.log" if args.log_dir else None, policy=policy
            )
            router.wait_ready()
            wall = asyncio.run(run_sessions(router.url, replicas[0].model, w))
        else:
            wall = asyncio.run(through_proxy(replicas, w))
        after = [srv.metrics() for srv in replicas]
        q = sum(metric_or_zero(a, "vllm:prefix_cache_queries_total") - metric_or_zero(b, "vllm:prefix_cache_queries_total") for a, b in zip(after, before))
        h = sum(metric_or_zero(a, "vllm:prefix_cache_hits_total") - metric_or_zero(b, "vllm:prefix_cache_hits_total") for a, b in zip(after, before))
        turns = [int(metric_or_zero(a, "vllm:request_success_total") - metric_or_zero(b, "vllm:request_success_total")) for a, b in zip(after, before)]
        adm = "—"
        if gate:
            parts = []
            for a in after:
                reasons = {r.name.lower(): int(metric_or_zero(a, "kvgate_admissions_total", reason=r.name.lower())) for r in kvgate.Reason}
                parts.append(", ".join(f"{v} {k}" for k, v in reasons.items() if v))
            adm = " / ".join(parts)
        refused = sum(int(metric_or_zero(a, "kvgate_refused_total")) for a in after)
        label = f"gate on, one per replica ({config or 'defaults'}), {placement}" if gate else "gate off, hash"
        return f"| {label} | {wall:.1f} s | {100 * h / q:.1f}% | {' / '.join(map(str, turns))} | {adm} | {refused} |"
    finally:
        if router is not None:
            router.stop()
        for srv in replicas:
            srv.stop()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="tiny", choices=["tiny", "small"])
    ap.add_argument("--replicas", type=int, default=2)
    ap.add_argument("--sessions", type=int, default=48)
    ap.add_argument("--turns", type=int, default=10)
    ap.add_argument("--blocks", type=int, default=400, help="KV blocks of 32 tokens per replica")
    ap.add_argument(
        "--config", action="append", help="KVGATE_VLLM_CONFIG of one gated row ('' = library defaults; repeatable; default: one row of defaults)"
    )
    ap.add_argument("--placement", action="append", choices=PLACEMENTS, help="placement of the gated rows (repeatable; default: hash)")
    ap.add_argument("--long-sessions", type=int, default=0, help="the first N sessions carry a long task")
    ap.add_argument("--long-task-tokens", type=int, default=2048)
    ap.add_argument("--arrival-sec", type=float, default=0.0, help="session s starts s x this after the first")
    ap.add_argument("--rounds", type=int, default=1, help="repeat every row (paired rounds)")
    ap.add_argument("--log-dir", default=None)
    args = ap.parse_args()
    w = Workload(
        sessions=args.sessions, turns=args.turns, long_sessions=args.long_sessions,
        long_task_tokens=args.long_task_tokens, arrival_sec=args.arrival_sec,
    )  # fmt: skip
    print(
        f"{args.replicas} replicas x {args.blocks} blocks, {args.sessions} sessions x {args.turns} turns, "
        f"{args.long_sessions} long ({args.long_task_tokens}-token task), arrivals every {args.arrival_sec} s"
    )
    print("| replicas | wall time | hit rate (sum of /metrics) | turns per replica | kvgate admissions per replica | refused |")
    print("|---|---|---|---|---|---|")
    ports = [free_port() for _ in range(args.replicas)]
    for _ in range(args.rounds):
        print(run(False, "", "hash", ports, args, w), flush=True)
        for config in args.config or [""]:
            for placement in args.placement or ["hash"]:
                print(run(True, config, placement, ports, args, w), flush=True)


if __name__ == "__main__":
    main()
