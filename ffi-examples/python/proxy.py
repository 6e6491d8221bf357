"""An asyncio proxy sketch over the ctypes binding, with checks.

The proxy sits in front of an engine and calls the gate around every turn.
kvgate_acquire blocks, so the proxy runs it in a thread executor: the event
loop stays free while a turn waits for admission (a heartbeat coroutine
proves it by ticking meanwhile), and cancelling the waiting task calls
kvgate_cancel_session so the blocked thread returns at once (a lease
admitted in that instant is released, never leaked).

Run: python3 ffi-examples/python/proxy.py [--lib path/to/libkvgate.so]
Exits non-zero on the first failed check; the last line is
"python proxy: N checks passed". Python 3.11, standard library only.
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import ctypes
import math
import re
import sys
import threading
from typing import Optional, Sequence

import kvgate_ctypes as kg

checks_passed = 0


def check(cond: bool, what: str) -> None:
    global checks_passed
    if not cond:
        print(f"CHECK failed: {what}\n  last error: {kg.last_error()}", file=sys.stderr)
        sys.exit(1)
    checks_passed += 1


PATIENCE = 60.0  # seconds; a bug hangs a check this long, not forever


# --------------------------------------------------------------------------
# A toy engine: usage from running tokens, hit ratio from cached prefixes
# --------------------------------------------------------------------------


class ToyEngine:
    def __init__(self, capacity: int):
        self.capacity = capacity
        self.running = 0
        self.resident: dict[bytes, int] = {}
        self.lock = threading.Lock()  # probes run on executor threads

    def usage(self, session: bytes) -> Optional[float]:
        with self.lock:
            return min(1.0, self.running / self.capacity)

    def prefix(self, session: bytes, prompt: Sequence[int]) -> Optional[float]:
        with self.lock:
            if not prompt:
                return None
            return min(self.resident.get(session, 0), len(prompt)) / len(prompt)

    async def run_turn(self, session: bytes, prompt_len: int) -> None:
        with self.lock:
            self.running += prompt_len
        await asyncio.sleep(0.002)  # the engine works; the loop is free
        with self.lock:
            self.running -= prompt_len
            self.resident[session] = prompt_len


# --------------------------------------------------------------------------
# The proxy's async face over the blocking gate
# --------------------------------------------------------------------------


class AsyncGate:
    def __init__(self, gate: kg.Gate, executor: concurrent.futures.Executor):
        self.gate = gate
        self.executor = executor

    async def acquire(self, session: bytes, prompt: Sequence[int], timeout: Optional[float] = None) -> kg.Lease:
        loop = asyncio.get_running_loop()
        attempt = loop.run_in_executor(self.executor, self.gate.acquire, session, prompt, timeout)
        try:
            return await asyncio.shield(attempt)
        except asyncio.CancelledError:
            # The task was cancelled while its thread is in kvgate_acquire
            # (waiting, probing, or not even started by the executor yet):
            # cancel the session's attempt until the thread has come back.
            # (One outstanding turn per session, as in an agent loop.)
            while not attempt.done():
                self.gate.cancel_session(session)
                await asyncio.wait({attempt}, timeout=0.005)
            if attempt.exception() is None:
                attempt.result().release()  # admitted just before the cancel: give it back
            raise


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

PRESSURE = 9500  # of 10000: usage 0.95 >= watermark 0.85


def binding_checks() -> None:
    lib = kg.load()
    check(lib.kvgate_version().decode() == read_header_version(), "library version matches the header")
    check_struct_layouts()
    try:
        kg.Config(high_watermark=float("nan"))
        check(False, "a NaN watermark is refused")
    except kg.KvgateError as e:
        check(e.status == kg.Status.INVALID_ARGUMENT, "config error status")
        check("invalid high_watermark: NaN" in e.message, f"config error message: {e.message}")
    engine = ToyEngine(10000)
    with kg.Gate(kg.Config(admission_mode="reference", wait_poll_sec=30), engine.usage, engine.prefix) as gate:
        lease = gate.acquire(b"agent-0", [1, 2, 3])
        check(lease.reason == kg.Reason.OPEN and math.isnan(lease.hit_ratio), "open admission")
        check(lease.release() == kg.Status.OK, "release")
        check(lease.release() == kg.Status.UNKNOWN_LEASE, "double release is refused")
        check("is not outstanding" in kg.last_error(), "double release message")
        # Misuse through the raw C entry point: a NULL out-pointer.
        status = lib.kvgate_acquire(gate._raw, None, 0, None, 0, -1, None)
        check(status == kg.Status.INVALID_ARGUMENT, "NULL out is refused")
        check(kg.last_error() == "kvgate_acquire: out is NULL", "NULL out message")
        status = lib.kvgate_acquire(gate._raw, None, 4, None, 0, -1, kg.Admission())
        check("session_id is NULL but session_id_len is 4" in kg.last_error(), "NULL id message")
        with engine.lock:
            engine.running = PRESSURE
        try:
            gate.acquire(b"agent-1", [1] * 10, timeout=0)
            check(False, "a cold session under pressure times out at once")
        except kg.TimedOut as e:
            check("timeout_ms = 0" in e.message, "timeout message")
        text = gate.metrics_text()
        check('kvgate_admissions_total{reason="open"} 1\n' in text, "metrics text")
    check(gate._raw is None, "freed")
    try:
        gate.stats()
        check(False, "a freed gate is refused")
    except kg.KvgateError as e:
        check(e.message == "kvgate_get_stats: gate is NULL", "freed gate is a NULL handle")
    print(f"binding: layouts match the header, misuse refused ({kg.last_error()!r})")


def read_header_version() -> str:
    header = (kg.REPO / "include" / "kvgate.h").read_text()
    parts = [re.search(rf"#define KVGATE_VERSION_{p} (\d+)", header).group(1) for p in ("MAJOR", "MINOR", "PATCH")]
    return ".".join(parts)


def check_struct_layouts() -> None:
    """The hand-written ctypes structs must match the generated header."""
    header = (kg.REPO / "include" / "kvgate.h").read_text()
    check("KVGATE_REASON_COUNT" not in header, "no array is sized by the reason count")
    c_types = {
        "uint64_t": ctypes.c_uint64,
        "uint32_t": ctypes.c_uint32,
        "double": ctypes.c_double,
        "bool": ctypes.c_bool,
        "kvgate_reason": ctypes.c_uint32,
        "size_t": ctypes.c_size_t,
    }
    for c_name, py in (("kvgate_admission", kg.Admission), ("kvgate_session_stats", kg.SessionStats), ("kvgate_stats", kg.Stats)):
        body = re.search(rf"typedef struct {c_name} \{{(.*?)\}} {c_name};", header, re.S).group(1)
        theirs = [(name, c_types[t], bool(array)) for t, name, array in re.findall(r"^\s+(\w+) (\w+)(\[\w+\])?;", body, re.M)]
        ours = [(name, getattr(t, "_type_", t) if hasattr(t, "_length_") else t, hasattr(t, "_length_")) for name, t in py._fields_]
        check(ours == theirs, f"{c_name} fields: {ours} != {theirs}")
        check(ctypes.sizeof(py) % 8 == 0, f"{c_name} size")


async def proxy_checks(lib_path: Optional[str]) -> None:
    engine = ToyEngine(10000)
    executor = concurrent.futures.ThreadPoolExecutor(max_workers=16)
    gate = kg.Gate(kg.Config(admission_mode="reference", wait_poll_sec=30, idle_grace_sec=60), engine.usage, engine.prefix)
    proxy = AsyncGate(gate, executor)
    heartbeat = Heartbeat()
    beating = asyncio.create_task(heartbeat.run())

    # A hot session is admitted under pressure and holds the capacity.
    with engine.lock:
        engine.running = PRESSURE
        engine.resident[b"agent-hot"] = 100
    holder = await proxy.acquire(b"agent-hot", [7] * 100)
    check(holder.reason == kg.Reason.RESIDENT_PREFIX and holder.retain_session, "hot session admitted")

    # A cold turn waits for admission in its thread; the loop keeps ticking.
    cold = asyncio.create_task(proxy.acquire(b"agent-cold", [7] * 100))
    await wait_until("the cold turn waits", lambda: gate.stats().waiting_attempts == 1)
    ticks = heartbeat.ticks
    await wait_until("the heartbeat ticks while the turn waits", lambda: heartbeat.ticks >= ticks + 20)
    check(not cold.done(), "the cold turn is still waiting")
    with engine.lock:
        engine.running = 0  # capacity frees up ...
    holder.release()  # ... and the release wakes the waiter
    lease = await asyncio.wait_for(cold, PATIENCE)
    check(lease.waited and lease.reason == kg.Reason.OPEN, "the waiting turn was admitted")
    lease.release()
    print(f"wait: heartbeat ticked {heartbeat.ticks - ticks} times while a turn waited")

    # Cancelling a waiting task ends its attempt (kvgate_cancel_session).
    with engine.lock:
        engine.running = PRESSURE
    doomed = asyncio.create_task(proxy.acquire(b"agent-gone", [7] * 100))
    await wait_until("the doomed turn waits", lambda: gate.stats().waiting_attempts == 1)
    doomed.cancel()
    try:
        await doomed
        check(False, "the cancelled task raises CancelledError")
    except asyncio.CancelledError:
        pass
    s = gate.session_stats(b"agent-gone")
    check(s.cancelled == 1 and not s.attempt_pending and s.active_leases == 0, "cancelled, nothing leaked")

    # A retry preempts the older waiting attempt of the same session.
    older = asyncio.create_task(proxy.acquire(b"agent-retry", [7] * 100))
    await wait_until("the older attempt waits", lambda: gate.stats().waiting_attempts == 1)
    newer = asyncio.create_task(proxy.acquire(b"agent-retry", [7] * 100, timeout=0.05))
    try:
        await older
        check(False, "the older attempt is preempted")
    except kg.Preempted as e:
        check("preempted" in e.message, "preempted message")
    try:
        await newer
        check(False, "the newer attempt times out (still cold)")
    except kg.TimedOut:
        pass
    check(gate.session_stats(b"agent-retry").num_preempted == 1, "num_preempted counted")
    print("retry: older attempt preempted, newer timed out; num_preempted=1")

    # Several agent sessions through the proxy at once.
    with engine.lock:
        engine.running = 0
    await agents(engine, executor)

    # Freeing the gate wakes a waiting turn with Closed.
    with engine.lock:
        engine.running = PRESSURE
    last = asyncio.create_task(proxy.acquire(b"agent-last", [7] * 100))
    await wait_until("the last turn waits", lambda: gate.stats().waiting_attempts == 1)
    await asyncio.get_running_loop().run_in_executor(None, gate.free)
    try:
        await last
        check(False, "a turn waiting in a freed gate is closed")
    except kg.Closed:
        pass
    beating.cancel()
    executor.shutdown(wait=True)
    print("free: the waiting turn returned Closed")


async def agents(engine: ToyEngine, executor: concurrent.futures.Executor) -> None:
    n_agents, n_turns = 6, 4
    small = ToyEngine(2048)
    gate = kg.Gate(kg.Config(admission_mode="reference", wait_poll_sec=0.05, idle_grace_sec=0.5), small.usage, small.prefix)
    proxy = AsyncGate(gate, executor)

    async def agent(i: int) -> int:
        session = f"agent-{i}".encode()
        for turn in range(n_turns):
            prompt = [i] * (256 * (turn + 1))
            with await proxy.acquire(session, prompt, timeout=PATIENCE):
                await small.run_turn(session, len(prompt))
            await asyncio.sleep(0.001)  # the tool call
        return n_turns

    done = await asyncio.gather(*(agent(i) for i in range(n_agents)))
    s = gate.stats()
    check(sum(done) == n_agents * n_turns == s.admissions == s.releases, "every turn admitted and released")
    check(s.active_leases == 0 and s.pending_attempts == 0, "nothing outstanding")
    check(small.running == 0, "the engine is idle")
    check(s.size == ctypes.sizeof(kg.Stats), "every figure this binding knows was written")
    reasons = {r.name.lower(): getattr(s, f"admissions_{r.name.lower()}") for r in kg.Reason}
    print(f"agents: {n_agents} sessions x {n_turns} turns; {reasons}; {s.waits} waited")
    gate.free()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lib", help="path to libkvgate.so (default: $KVGATE_LIB or target/{release,debug})")
    args = parser.parse_args()
    kg.load(args.lib)
    print(f"kvgate {kg.load().kvgate_version().decode()} from {kg.library_path(args.lib)}")
    binding_checks()
    asyncio.run(proxy_checks(args.lib))
    print(f"python proxy: {checks_passed} checks passed")


if __name__ == "__main__":
    main()
