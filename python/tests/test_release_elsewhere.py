"""Issue 54: ``Gate.release_elsewhere`` releases a waiting turn whose cache
the gate counts gone (a new, parked or ghost session) to another replica;
a session the gate holds hot raises CacheHot and keeps its place."""

from __future__ import annotations

import asyncio

import pytest

import kvgate

from conftest import run, until

CAPACITY = kvgate.Capacity(tokens=1000, block_tokens=16, prefill_tokens_per_sec=4000.0)


def working_set_gate(engine):
    engine.capacity_value = CAPACITY
    engine.usage_value = 0.5
    return kvgate.Gate(kvgate.Config(wait_poll_sec=30), engine.probes())


def test_a_waiting_new_session_is_released_a_member_is_refused(engine):
    gate = working_set_gate(engine)

    async def main():
        member = await gate.acquire("a", 600)
        waiter = asyncio.create_task(gate.acquire("b", 600))
        await until("b waits for room", lambda: gate.stats().working_set_waiting_sessions == 1)
        # a runs: its cache is hot here, it keeps its lease and its place.
        with pytest.raises(kvgate.CacheHot) as hot:
            gate.release_elsewhere("a")
        assert hot.value.code is kvgate.Status.CACHE_HOT
        assert gate.release_elsewhere("nobody") is False
        # b is new here: released, its acquire says so, the queue is empty.
        assert gate.release_elsewhere("b") is True
        with pytest.raises(kvgate.Released) as released:
            await asyncio.wait_for(waiter, 5)
        assert released.value.code is kvgate.Status.RELEASED
        assert gate.stats().working_set_waiting_sessions == 0
        assert gate.stats().cancelled == 0
        assert gate.release_elsewhere("b") is False
        member.release(cached_tokens=0, output_tokens=10)

    run(main())
    gate.close()


def test_a_gate_without_a_working_set_cannot_tell(engine):
    gate = kvgate.Gate(kvgate.Config(admission_mode="reference"), engine.probes())
    with pytest.raises(kvgate.InvalidArgument):
        gate.release_elsewhere("s")
    gate.close()
