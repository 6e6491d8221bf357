"""Probes: async def, failing, slow (cancelled while awaited)."""

from __future__ import annotations

import asyncio
import logging

import pytest

import kvgate
from kvgate import Reason

from conftest import PRESSURE, run, until


def test_async_probes():
    calls = []

    async def usage(session):
        await asyncio.sleep(0.01)  # an RPC to the engine
        calls.append(("usage", session))
        return PRESSURE

    async def prefix(session, prompt):
        await asyncio.sleep(0.01)
        calls.append(("prefix", session, len(prompt)))
        return 0.85

    gate = kvgate.Gate(kvgate.Config(admission_mode="reference"), kvgate.Probes(usage=usage, prefix=prefix))

    async def main():
        async with gate.acquire("s", [1] * 40) as lease:
            assert lease.reason is Reason.RESIDENT_PREFIX and lease.usage == PRESSURE
        assert calls == [("usage", b"s"), ("prefix", b"s", 40)]

    run(main())
    gate.close()


def test_async_capacity_probe_in_working_set_mode():
    async def capacity(session):
        await asyncio.sleep(0)
        return (2000, 16, 0.0)

    gate = kvgate.Gate(kvgate.Config(), kvgate.Probes(usage=lambda s: 0.1, capacity=capacity))

    async def main():
        async with gate.acquire("s", 100) as lease:
            assert lease.reason is Reason.EMPTY_WORKING_SET
        assert gate.stats().working_set_capacity_tokens == 2000

    run(main())
    gate.close()


def test_a_probe_that_raises_is_unavailable(caplog):
    async def broken(session):
        raise ConnectionError("engine down")

    gate = kvgate.Gate(kvgate.Config(admission_mode="reference"), kvgate.Probes(usage=broken))

    async def main():
        with caplog.at_level(logging.WARNING, logger="kvgate"):
            async with gate.acquire("s", [1]) as lease:
                assert lease.reason is Reason.OPEN and lease.usage != lease.usage  # NaN
        assert "usage probe raised" in caplog.text
        assert gate.stats().usage_probe_unavailable == 1

    run(main())
    gate.close()


def test_cancelling_a_task_awaiting_its_probe_cancels_the_attempt():
    started = asyncio.Event

    async def main():
        in_probe = asyncio.Event()

        async def slow_usage(session):
            in_probe.set()
            await asyncio.sleep(3600)

        gate = kvgate.Gate(kvgate.Config(admission_mode="reference"), kvgate.Probes(usage=slow_usage))
        task = asyncio.create_task(gate.acquire("s", [1]))
        await in_probe.wait()
        assert gate.stats().pending_attempts == 1
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        s = gate.stats()
        assert (s.cancelled, s.pending_attempts, s.active_leases) == (1, 0, 0)
        gate.close()

    run(main())


@pytest.mark.parametrize("probe", ["usage", "prefix"])
def test_a_probe_that_hangs_past_the_timeout_ends_the_attempt_timed_out(probe):
    async def main():
        calls = []

        async def usage(session):
            calls.append("usage")
            if probe == "usage":
                await asyncio.sleep(3600)
            return 0.99  # pressure: the prefix probe is asked

        async def prefix(session, ids):
            calls.append("prefix")
            await asyncio.sleep(3600)

        gate = kvgate.Gate(kvgate.Config(admission_mode="reference"), kvgate.Probes(usage=usage, prefix=prefix))
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        with pytest.raises(kvgate.TimedOut) as err:
            await gate.acquire("s", [1, 2], timeout=0.2)
        assert 0.2 <= loop.time() - t0 < 1.0
        assert err.value.code == kvgate.Status.TIMED_OUT and err.value.http_status == 503
        assert calls[-1] == probe
        s = gate.stats()
        assert (s.timed_out, s.cancelled, s.preempted) == (1, 0, 0)
        assert (s.pending_attempts, s.waiting_attempts, s.active_leases) == (0, 0, 0)
        assert gate.session_stats("s").timed_out == 1
        gate.close()

    run(main())


def test_without_a_timeout_a_slow_probe_is_awaited():
    async def main():
        async def usage(session):
            await asyncio.sleep(0.3)
            return 0.1

        gate = kvgate.Gate(kvgate.Config(admission_mode="reference"), kvgate.Probes(usage=usage))
        async with gate.acquire("s", [1]) as lease:
            assert lease.reason is kvgate.Reason.OPEN
        async with gate.acquire("s", [1], timeout=5.0) as lease:
            assert lease.reason is kvgate.Reason.OPEN
        assert gate.stats().timed_out == 0
        gate.close()

    run(main())
