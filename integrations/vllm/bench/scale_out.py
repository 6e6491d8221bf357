"""Scale-out: the agent workload over N `vllm serve` replicas, gate off on
every replica and gate on every replica (one gate each): wall time,
prefix-cache hit rate summed over the replicas' own /metrics, and where each
replica's admissions went.

    python integrations/vllm/bench/scale_out.py [--replicas 2] [--sessions 48] [--turns 10] [--blocks 400] \
        [--config ''] [--config admission_mode=reference,high_watermark=0.2,idle_grace_sec=1,wait_poll_sec=1] \
        [--placement hash --placement sticky --placement room --placement room-refuse] \
        [--long-sessions 6 --long-task-tokens 2048 --arrival-sec 0.5] [--rounds 2] \
        [--slow-replica 0 [--slow-cores 1] [--hogs 2]]

Each --config is one gated row (KVGATE_VLLM_CONFIG; '' = the library's
defaults) per --placement; the ungated row comes first. Placements: `hash`
(vLLM's router, consistent hash on `X-Session-ID`; the default), `sticky`
(vLLM's router, `sticky_least_loaded`: the fewest sessions), `room` (no
router: a proxy with one client per replica places each new session by the
gates' room, `kvgate.Placement`), `room-refuse` (the same with every replica
in refusal mode, KVGATE_VLLM_REFUSE_NEW=1: a turn that would wait, of a
session whose cache is gone there, is answered 429 and the proxy places it
where there is room, or retries after Retry-After; members wait in their
gate's queue). --rounds repeats the whole set of rows (paired rounds); the
end prints each round's gated rows over its gated `hash` row (wall time,
and hit rate in points). Every row's replicas listen on the same ports, so
the router's hash ring (it hashes the worker URLs) and with it every
session's replica are the same in every row. The router comes from
scripts/install-router.sh. Each session is an asyncio task (tool calls are
sleeps), as in serve_sessions.py.

A skewed start: --long-sessions N gives the first N sessions a long task
(--long-task-tokens), started first (--arrival-sec spaces the starts).
--slow-replica I slows replica I in every row: it runs pinned to
--slow-cores (default: the last CPU; `taskset`, and vLLM's OpenMP threads
bound there with VLLM_CPU_OMP_THREADS_BIND), beside --hogs busy processes
pinned to the same cores, while the other replicas are pinned to the other
CPUs. The hogs are started once the replicas are up and killed when the row
ends, whatever ends it (also on SIGTERM/SIGINT).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import pathlib
import signal
import subprocess
import sys
from dataclasses import dataclass, field
from typing import Optional, Sequence

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


@dataclass
class Row:
    label: str
    placement: str
    gate: bool
    wall: float
    hits: float
    turns: list[int]
    admissions: str
    refused: int
    moves: str = "—"
    replicas: list[str] = field(default_factory=list)

    def markdown(self) -> str:
        return (
            f"| {self.label} | {self.wall:.1f} s | {100 * self.hits:.1f}% | {' / '.join(map(str, self.turns))} "
            f"| {self.admissions} | {self.refused} | {self.moves} |"
        )


async def through_proxy(replicas: list[Server], w: Workload) -> tuple[float, kvgate.PlacementCounts]:
    proxy = PlacingProxy([srv.url for srv in replicas], replicas[0].model)
    try:
        wall = await run_sessions("", replicas[0].model, w, turn=proxy.turn)
        return wall, proxy.placement.counts
    finally:
        await proxy.close()


class Slowdown:
    """Replica `slow` pinned to `cores` beside `hogs` busy processes pinned
    there too; the other replicas pinned to the other CPUs. `env(i)` is
    replica i's extra environment (its OpenMP threads bound to its CPUs);
    `start(servers)` pins the running servers (every process and thread
    under each) and starts the hogs; `stop()` kills the hogs."""

    def __init__(self, slow: int, cores: Sequence[int], hogs: int) -> None:
        allowed = sorted(os.sched_getaffinity(0))
        if not set(cores) <= set(allowed):
            raise SystemExit(f"--slow-cores {list(cores)} not among this process's CPUs {allowed}")
        self.slow, self.cores, self.hogs = slow, list(cores), hogs
        self.others = [c for c in allowed if c not in self.cores] or allowed
        self.procs: list[subprocess.Popen] = []

    def cpus(self, replica: int) -> list[int]:
        return self.cores if replica == self.slow else self.others

    def env(self, replica: int) -> dict[str, str]:
        return {"VLLM_CPU_OMP_THREADS_BIND": ",".join(map(str, self.cpus(replica)))}

    def start(self, servers: list[Server]) -> None:
        import psutil  # a vLLM dependency

        for i, srv in enumerate(servers):
            cpus = ",".join(map(str, self.cpus(i)))
            root = psutil.Process(srv.proc.pid)
            for p in [root, *root.children(recursive=True)]:
                subprocess.run(["taskset", "-a", "-p", "-c", cpus, str(p.pid)], check=True, stdout=subprocess.DEVNULL)
        spin = "while True: pass"
        cpus = ",".join(map(str, self.cores))
        self.procs = [subprocess.Popen(["taskset", "-c", cpus, sys.executable, "-c", spin]) for _ in range(self.hogs)]

    def stop(self) -> None:
        for p in self.procs:
            p.kill()
        for p in self.procs:
            p.wait()
        self.procs = []


def run(
    gate: bool, config: str, placement: str, ports: list[int], args: argparse.Namespace, w: Workload, slow: Optional[Slowdown]
) -> Row:
    replicas: list[Server] = []
    router: Optional[Router] = None
    tag = f"on-{config or 'defaults'}-{placement}" if gate else "off"
    env = {"KVGATE_VLLM_REFUSE_NEW": "1"} if placement == "room-refuse" else {}
    counts: Optional[kvgate.PlacementCounts] = None
    try:
        for i in range(args.replicas):
            log = f"{args.log_dir}/replica{i}-{tag}.log" if args.log_dir else None
            replica_env = {**env, **(slow.env(i) if slow else {})}
            replicas.append(
                Server(gate=gate, size=args.model, num_blocks=args.blocks, config=config, log_path=log, port=ports[i], env=replica_env)
            )
        for srv in replicas:
            srv.wait_ready()
        if slow is not None:
            slow.start(replicas)
        before = [srv.metrics() for srv in replicas]
        if placement in ("hash", "sticky"):
            policy = "consistent_hash" if placement == "hash" else "sticky_least_loaded"
            router = Router(
                [srv.url for srv in replicas], log_path=f"{args.log_dir}/router-{tag}.log" if args.log_dir else None, policy=policy
            )
            router.wait_ready()
            wall = asyncio.run(run_sessions(router.url, replicas[0].model, w))
        else:
            wall, counts = asyncio.run(through_proxy(replicas, w))
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
        moves = "—" if counts is None else f"{counts.moved} moved, {counts.waits} waits, {counts.unreachable} unreachable"
        return Row(label, placement, gate, wall, h / q if q else 0.0, turns, adm, refused, moves)
    finally:
        if slow is not None:
            slow.stop()
        if router is not None:
            router.stop()
        for srv in replicas:
            srv.stop()


def paired(rounds: list[list[Row]]) -> list[str]:
    """Each round's gated rows against its gated `hash` row: wall time
    ratio (below 1: faster than hash) and hit rate difference (points)."""
    lines = ["| round | placement | wall / hash | hits − hash |", "|---|---|---|---|"]
    for i, rows in enumerate(rounds, 1):
        base = next((r for r in rows if r.gate and r.placement == "hash"), None)
        if base is None:
            return []
        for r in rows:
            if r.gate and r is not base:
                lines.append(f"| {i} | {r.label} | {r.wall / base.wall:.3f} | {100 * (r.hits - base.hits):+.1f} |")
    return lines


def _exit_on_term(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)  # runs every row's finally: hogs killed, servers stopped


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
    ap.add_argument("--slow-replica", type=int, default=None, help="slow this replica: pinned beside busy processes")
    ap.add_argument("--slow-cores", default=None, help="the slow replica's CPUs, e.g. '1' or '6,7' (default: the last CPU)")
    ap.add_argument("--hogs", type=int, default=2, help="busy processes pinned beside the slow replica")
    ap.add_argument("--log-dir", default=None, help="replica and router logs here (made if missing)")
    args = ap.parse_args()
    if args.log_dir:
        os.makedirs(args.log_dir, exist_ok=True)
    w = Workload(
        sessions=args.sessions, turns=args.turns, long_sessions=args.long_sessions,
        long_task_tokens=args.long_task_tokens, arrival_sec=args.arrival_sec,
    )  # fmt: skip
    slow: Optional[Slowdown] = None
    if args.slow_replica is not None:
        if not 0 <= args.slow_replica < args.replicas:
            ap.error(f"--slow-replica must be in 0..{args.replicas - 1}")
        cores = [int(c) for c in args.slow_cores.split(",")] if args.slow_cores else [max(os.sched_getaffinity(0))]
        slow = Slowdown(args.slow_replica, cores, args.hogs)
    signal.signal(signal.SIGTERM, _exit_on_term)
    print(
        f"{args.replicas} replicas x {args.blocks} blocks, {args.sessions} sessions x {args.turns} turns, "
        f"{args.long_sessions} long ({args.long_task_tokens}-token task), arrivals every {args.arrival_sec} s"
        + (f"; replica {slow.slow} on CPUs {slow.cores} beside {slow.hogs} busy processes, the others on {slow.others}" if slow else "")
    )
    print("| replicas | wall time | hit rate (sum of /metrics) | turns per replica | kvgate admissions per replica | refused | proxy moves |")
    print("|---|---|---|---|---|---|---|")
    ports = [free_port() for _ in range(args.replicas)]
    rounds: list[list[Row]] = []
    for _ in range(args.rounds):
        rows = [run(False, "", "hash", ports, args, w, slow)]
        print(rows[-1].markdown(), flush=True)
        for config in args.config or [""]:
            for placement in args.placement or ["hash"]:
                rows.append(run(True, config, placement, ports, args, w, slow))
                print(rows[-1].markdown(), flush=True)
        rounds.append(rows)
    summary = paired(rounds)
    if summary:
        print()
        print("\n".join(summary))


if __name__ == "__main__":
    main()
