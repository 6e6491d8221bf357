"""1,000 turns waiting at once in one asyncio loop, with no thread at all."""

from __future__ import annotations

import asyncio
import os
import threading

import kvgate
from kvgate import Reason

from conftest import PRESSURE, run, until

N = 1000


def os_threads() -> int:
    """Threads of this process as the OS counts them (Python's and native ones)."""
    return len(os.listdir("/proc/self/task"))


def test_a_thousand_waiters_in_one_loop_without_threads(engine):
    engine.usage_value = PRESSURE
    engine.resident[b"hot"] = 1.0
    gate = kvgate.Gate(kvgate.Config(admission_mode="reference", wait_poll_sec=30), engine.probes())
    threads_before = threading.active_count()
    os_threads_before = os_threads()

    async def main():
        holder = await gate.acquire("hot", [1] * 10)
        admitted = []

        async def turn(i):
            async with gate.acquire(f"agent-{i}", [i] * 10) as lease:
                admitted.append(lease.reason)
                await asyncio.sleep(0)

        tasks = [asyncio.create_task(turn(i)) for i in range(N)]
        await until(f"{N} attempts sleep", lambda: gate.stats().waiting_attempts == N)
        assert threading.active_count() == threads_before, "no thread per waiter (nor any)"
        assert os_threads() == os_threads_before, "nor a native one"
        probes_while_waiting = engine.usage_calls
        await asyncio.sleep(0.1)
        assert engine.usage_calls == probes_while_waiting, "sleeping attempts do not poll"

        engine.usage_value = 0.1  # pressure ends ...
        holder.release()  # ... and the release wakes the waiters
        await asyncio.wait_for(asyncio.gather(*tasks), 20)
        assert len(admitted) == N and set(admitted) == {Reason.OPEN}
        assert threading.active_count() == threads_before
        s = gate.stats()
        assert (s.admissions, s.releases, s.active_leases, s.pending_attempts) == (N + 1, N + 1, 0, 0)
        # Every waiter slept through the 0.1 s above: the longest wait says so.
        assert 0.1 <= s.longest_wait_sec <= s.wait_sec, (s.longest_wait_sec, s.wait_sec)
        # Each waiter probed once to wait and about once to be admitted.
        assert engine.usage_calls <= 1 + 3 * N, engine.usage_calls

    run(main())
    gate.close()
