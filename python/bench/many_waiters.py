"""Benchmark (not a test): N sessions waiting at once in one asyncio loop.

Reports the memory each waiting turn costs (RSS growth / N) and the admission
latency after a release: the time from a member's release (and
finish_session, which frees its place at once) to the woken task running
with its lease, over many hand-overs while the others keep waiting.

The gate runs in working-set mode with a capacity of MEMBERS turns: MEMBERS
sessions hold leases, the other N wait. Each hand-over releases one member;
exactly one waiter then fits and is admitted (a targeted wake-up: the others
stay asleep, which the probe-call count shows). No thread is started:
`threading.active_count()` is printed before and after.

    python python/bench/many_waiters.py [--waiters 10000] [--handovers 2000]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import platform
import statistics
import sys
import threading
import time

import kvgate


def rss_bytes() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS")


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def percentile(values, p):
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(p / 100 * (len(ordered) - 1))))]


async def bench(n_waiters: int, handovers: int, members: int, prompt: int) -> None:
    probe_calls = 0

    # Capacity for `members` turns of `prompt` tokens (plus block rounding);
    # a slow prefill rate makes the windows and the wait bound long, so only
    # the hand-overs change the working set.
    capacity = kvgate.Capacity(tokens=members * prompt + prompt // 2, block_tokens=16, prefill_tokens_per_sec=1.0)

    def usage(session):
        # What the engine would say: the members' prompts, nothing shared.
        # (A gate told neither prompt ids nor cached tokens learns the
        # prefix sessions share from this answer: a made-up figure below
        # what the members hold would read as sharing and let waiters in.)
        nonlocal probe_calls
        probe_calls += 1
        return members * prompt / capacity.tokens

    gate = kvgate.Gate(kvgate.Config(wait_poll_sec=3600), kvgate.Probes(usage=usage, capacity=lambda s: capacity))
    threads_before = threading.active_count()

    held: "asyncio.Queue[tuple[kvgate.Lease, float]]" = asyncio.Queue()
    released_at: dict[bytes, float] = {}
    latencies: list[float] = []

    async def turn(i: int) -> None:
        lease = await gate.acquire(f"s{i}", prompt)
        now = time.perf_counter()
        t0 = released_at.pop(b"handover", None)
        if t0 is not None:
            latencies.append(now - t0)
        await held.put((lease, now))

    # The first members fill the working set.
    for i in range(members):
        await held.put((await gate.acquire(f"m{i}", prompt), 0.0))
    gc.collect()
    rss0 = rss_bytes()
    t_start = time.perf_counter()
    tasks = [asyncio.create_task(turn(i)) for i in range(n_waiters)]
    while gate.stats().waiting_attempts < n_waiters:
        if time.perf_counter() - t_start > 60:
            raise RuntimeError(
                f"{gate.stats().waiting_attempts} of {n_waiters} sessions waiting after 60 s: "
                "the gate let some in beside the members (see the usage probe above)"
            )
        await asyncio.sleep(0.01)
    t_parked = time.perf_counter() - t_start
    gc.collect()
    rss1 = rss_bytes()
    threads_waiting = threading.active_count()
    calls_before = probe_calls

    for _ in range(min(handovers, n_waiters)):
        lease, _ = await held.get()
        released_at[b"handover"] = time.perf_counter()
        lease.release(cached_tokens=0, output_tokens=0)
        gate.finish_session(lease.session)
        while b"handover" in released_at:  # the woken task takes the stamp
            await asyncio.sleep(0)
    calls_per_handover = (probe_calls - calls_before) / max(1, len(latencies))

    # Drain: release everyone so every task ends.
    gate.close()
    await asyncio.gather(*tasks, return_exceptions=True)
    threads_after = threading.active_count()

    per_waiter = (rss1 - rss0) / n_waiters
    us = [x * 1e6 for x in latencies]
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    print(
        f"kvgate {kvgate.version()} · Python {platform.python_version()} · {cpu_model()} · "
        f"{os.cpu_count()} cpus · load average {load} (other work on the machine shows in the p99)"
    )
    print(f"waiters: {n_waiters} sleeping in one loop (parked in {t_parked:.2f} s), working set of {members} members")
    print(f"threads: {threads_before} before, {threads_waiting} while waiting, {threads_after} after")
    print(f"memory: RSS +{(rss1 - rss0) / 2**20:.1f} MiB for {n_waiters} waiters = {per_waiter / 1024:.2f} KiB per waiter")
    print(
        f"admission latency after a release ({len(us)} hand-overs, release -> woken task running): "
        f"median {statistics.median(us):.0f} us, p99 {percentile(us, 99):.0f} us, max {max(us):.0f} us"
    )
    print(f"usage probe calls per hand-over: {calls_per_handover:.2f} (the other waiters stay asleep)")
    print(f"reproduce: {os.path.basename(sys.executable)} python/bench/many_waiters.py --waiters {n_waiters} --handovers {handovers}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--waiters", type=int, default=10_000)
    parser.add_argument("--handovers", type=int, default=2_000)
    parser.add_argument("--members", type=int, default=8)
    parser.add_argument("--prompt", type=int, default=1000)
    args = parser.parse_args()
    asyncio.run(bench(args.waiters, args.handovers, args.members, args.prompt))


if __name__ == "__main__":
    main()
