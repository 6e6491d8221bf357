"""An asyncio proxy sketch over the `kvgate` Python package, with checks.

The proxy sits in front of an engine and calls the gate around every turn:
`async with gate.acquire(session, prompt) as lease:`. A waiting turn costs a
sleeping attempt in the event loop, not a thread (the package drives the C
ABI's event-loop attempts and watches one wake descriptor); the probes are
`async def`s answered by the toy engine, as an RPC to a real engine would
be. A heartbeat coroutine proves the loop stays free while turns wait, and
the thread count proves no thread was started.

Run: python3 ffi-examples/python/proxy.py [--lib path/to/libkvgate.so]
Uses the installed `kvgate` package, or this checkout's python/kvgate with
the library given by --lib or KVGATE_LIBRARY. Exits non-zero on the first
failed check; the last line is "python proxy: N checks passed".
"""

from __future__ import annotations

import argparse
import asyncio
import math
import pathlib
import re
import sys
import threading
from typing import Optional, Sequence

REPO = pathlib.Path(__file__).resolve().parents[2]
try:
    import kvgate
except ImportError:  # not installed: this checkout's package (needs --lib or KVGATE_LIBRARY)
    sys.path.insert(0, str(REPO / "python"))
    import kvgate
from kvgate import _drift

checks_passed = 0


def check(cond: bool, what: str) -> None:
    global checks_passed
    if not cond:
        print(f"CHECK failed: {what}\n  last error: {kvgate.last_error()}", file=sys.stderr)
        sys.exit(1)
    checks_passed += 1


PATIENCE = 60.0  # seconds; a bug hangs a check this long, not forever
PRESSURE = 9500  # of 10000: usage 0.95 >= watermark 0.85

# --------------------------------------------------------------------------
# A toy engine: usage from running tokens, hit ratio from cached prefixes,
# answered asynchronously (as an RPC to the engine would be)
# --------------------------------------------------------------------------


class ToyEngine:
    def __init__(self, capacity: int):
        self.capacity = capacity
        self.running = 0
        self.resident: dict[bytes, int] = {}

    async def usage(self, session: bytes) -> Optional[float]:
        await asyncio.sleep(0)  # the RPC's round trip
        return min(1.0, self.running / self.capacity)

    async def prefix(self, session: bytes, prompt: Sequence[int]) -> Optional[float]:
        await asyncio.sleep(0)
        if not prompt:
            return None
        return min(self.resident.get(session, 0), len(prompt)) / len(prompt)

    def probes(self) -> kvgate.Probes:
        return kvgate.Probes(usage=self.usage, prefix=self.prefix)

    async def run_turn(self, session: bytes, prompt_len: int) -> None:
        self.running += prompt_len
        await asyncio.sleep(0.002)  # the engine works; the loop is free
        self.running -= prompt_len
        self.resident[session] = prompt_len


def reference(**knobs) -> kvgate.Config:
    return kvgate.Config(admission_mode="reference", **knobs)


async def wait_until(what: str, cond) -> None:
    async def poll() -> None:
        while not cond():
            await asyncio.sleep(0.001)

    try:
        await asyncio.wait_for(poll(), PATIENCE)
    except asyncio.TimeoutError:
        check(False, f"timed out waiting until {what}")


class Heartbeat:
    """Ticks every millisecond: proof that the event loop is not blocked."""

    def __init__(self) -> None:
        self.ticks = 0

    async def run(self) -> None:
        while True:
            await asyncio.sleep(0.001)
            self.ticks += 1


# --------------------------------------------------------------------------
# Checks
# --------------------------------------------------------------------------


def misuse_checks() -> str:
    gate = kvgate.Gate(reference(wait_poll_sec=30))
    with gate.acquire_sync("agent-0", [1, 2, 3]) as lease:
        check(lease.reason == kvgate.Reason.OPEN and math.isnan(lease.hit_ratio), "open admission (sync path)")
    check(not lease.release(), "a second release is a no-op")
    waker = kvgate.Waker()
    attempt = kvgate.Attempt(gate, b"raw", 3, -1, waker, tag=1)
    try:
        attempt.wake()
        check(False, "a wake while probing is refused")
    except kvgate.OutOfOrder as e:
        check(e.code == kvgate.Status.OUT_OF_ORDER, "out-of-order status")
        message = e.message
    attempt.close()
    waker.close()
    gate.close()
    try:
        gate.stats()
        check(False, "a closed gate is refused")
    except kvgate.Closed:
        pass
    return message


async def proxy_checks() -> None:
    threads = threading.active_count()
    engine = ToyEngine(10000)
    gate = kvgate.Gate(reference(wait_poll_sec=30, idle_grace_sec=60), engine.probes())
    heartbeat = Heartbeat()
    beating = asyncio.create_task(heartbeat.run())

    # A hot session is admitted under pressure and holds the capacity.
    engine.running = PRESSURE
    engine.resident[b"agent-hot"] = 100
    holder = await gate.acquire("agent-hot", [7] * 100)
    check(holder.reason == kvgate.Reason.RESIDENT_PREFIX and holder.retain_session, "hot session admitted")

    # A cold turn waits for admission in the loop; the loop keeps ticking.
    cold = asyncio.create_task(gate.acquire("agent-cold", [7] * 100))
    await wait_until("the cold turn waits", lambda: gate.stats().waiting_attempts == 1)
    ticks = heartbeat.ticks
    await wait_until("the heartbeat ticks while the turn waits", lambda: heartbeat.ticks >= ticks + 20)
    check(not cold.done(), "the cold turn is still waiting")
    check(threading.active_count() == threads, "no thread waits for the turn")
    engine.running = 0  # capacity frees up ...
    holder.release()  # ... and the release wakes the waiter
    lease = await asyncio.wait_for(cold, PATIENCE)
    check(lease.waited and lease.reason == kvgate.Reason.OPEN, "the waiting turn was admitted")
    lease.release()
    print(f"wait: heartbeat ticked {heartbeat.ticks - ticks} times while a turn waited")

    # Cancelling a waiting task cancels its attempt.
    engine.running = PRESSURE
    doomed = asyncio.create_task(gate.acquire("agent-gone", [7] * 100))
    await wait_until("the doomed turn waits", lambda: gate.stats().waiting_attempts == 1)
    doomed.cancel()
    try:
        await doomed
        check(False, "the cancelled task raises CancelledError")
    except asyncio.CancelledError:
        pass
    s = gate.session_stats("agent-gone")
    check(s.cancelled == 1 and not s.attempt_pending and s.active_leases == 0, "cancelled, nothing leaked")
    print("cancel: the cancelled task's attempt counted cancelled, no lease leaked")

    # A retry preempts the older waiting attempt of the same session.
    older = asyncio.create_task(gate.acquire("agent-retry", [7] * 100))
    await wait_until("the older attempt waits", lambda: gate.stats().waiting_attempts == 1)
    newer = asyncio.create_task(gate.acquire("agent-retry", [7] * 100, timeout=0.05))
    try:
        await older
        check(False, "the older attempt is preempted")
    except kvgate.Preempted as e:
        check("preempted" in e.message, "preempted message")
    try:
        await newer
        check(False, "the newer attempt times out (still cold)")
    except kvgate.TimedOut:
        pass
    check(gate.session_stats("agent-retry").num_preempted == 1, "num_preempted counted")
    print("retry: older attempt preempted, newer timed out; num_preempted=1")

    engine.running = 0
    await agents()

    # Closing the gate wakes a waiting turn with Closed.
    engine.running = PRESSURE
    last = asyncio.create_task(gate.acquire("agent-last", [7] * 100))
    await wait_until("the last turn waits", lambda: gate.stats().waiting_attempts == 1)
    gate.close()
    try:
        await last
        check(False, "a turn waiting in a closed gate is closed")
    except kvgate.Closed:
        pass
    beating.cancel()
    check(threading.active_count() == threads, "no thread was started")
    print("free: the waiting turn returned Closed")


async def agents() -> None:
    n_agents, n_turns = 6, 4
    small = ToyEngine(2048)
    gate = kvgate.Gate(reference(wait_poll_sec=0.05, idle_grace_sec=0.5), small.probes())

    async def agent(i: int) -> int:
        session = f"agent-{i}".encode()
        for turn in range(n_turns):
            prompt = [i] * (256 * (turn + 1))
            async with gate.acquire(session, prompt, timeout=PATIENCE):
                await small.run_turn(session, len(prompt))
            await asyncio.sleep(0.001)  # the tool call
        return n_turns

    done = await asyncio.gather(*(agent(i) for i in range(n_agents)))
    s = gate.stats()
    check(sum(done) == n_agents * n_turns == s.admissions == s.releases, "every turn admitted and released")
    check(s.active_leases == 0 and s.pending_attempts == 0, "nothing outstanding")
    check(small.running == 0, "the engine is idle")
    reasons = {r.name.lower(): getattr(s, f"admissions_{r.name.lower()}") for r in kvgate.Reason}
    reasons = {k: v for k, v in reasons.items() if v}
    print(f"agents: {n_agents} sessions x {n_turns} turns; {reasons}; {s.waits} waited")
    gate.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lib", help="path to libkvgate.so (default: $KVGATE_LIBRARY or the bundled one)")
    args = parser.parse_args()
    kvgate.load(args.lib)
    print(f"kvgate {kvgate.version()} from {kvgate.loaded_path()} (package {pathlib.Path(kvgate.__file__).parent})")
    binding_checks_and_misuse()
    asyncio.run(proxy_checks())
    print(f"python proxy: {checks_passed} checks passed")


def binding_checks_and_misuse() -> None:
    header = (REPO / "include" / "kvgate.h").read_text()
    version = ".".join(re.search(rf"#define KVGATE_VERSION_{p} (\d+)", header).group(1) for p in ("MAJOR", "MINOR", "PATCH"))
    check(kvgate.version() == version, "library version matches the header")
    problems = _drift.mismatches(header)
    check(problems == [], f"the package's binding matches include/kvgate.h: {problems}")
    try:
        kvgate.Gate(reference(high_watermark=float("nan")))
        check(False, "a NaN watermark is refused")
    except kvgate.InvalidArgument as e:
        check(e.code == kvgate.Status.INVALID_ARGUMENT, "config error status")
        check("invalid high_watermark: NaN" in e.message, f"config error message: {e.message}")
    message = misuse_checks()
    n = len(kvgate._ffi.FUNCTIONS)
    print(f"binding: layouts match the header ({n} functions), misuse refused ({message!r})")


if __name__ == "__main__":
    main()
