"""Issue 54: ``Gate.release_elsewhere`` releases a waiting turn whose cache
the gate counts gone (a new, parked or ghost session) to another replica;
a session the gate holds hot raises CacheHot and keeps its place."""

from __future__ import annotations

import asyncio

import pytest

import kvgate

from conftest import run, until, working_set_gate


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


TIERED = kvgate.Capacity(1000, 16, 4000.0, tier_tokens=4000, reload_tokens_per_sec=1e5)


async def fill_and_park(gate):
    """a, b, c run a turn each; b grows, and a is parked to make room: a
    member (b) runs, c is a member between turns, a is parked."""
    leases = {k: await gate.acquire(k, 300) for k in "abc"}
    for lease in leases.values():
        lease.release(cached_tokens=0, output_tokens=0)
    b = await gate.acquire("b", 500)
    assert gate.stats().working_set_parked == 1
    return b


def test_acquire_releases_a_new_session_and_keeps_a_tier_parked_one_waiting(engine):
    # With a host tier, the parked session's cache comes back by a copy: the
    # gate holds it, so its turn keeps waiting and is admitted in its order.
    engine.capacity_value, engine.usage_value = TIERED, 0.5
    gate = kvgate.Gate(kvgate.Config(wait_poll_sec=30), engine.probes())

    async def main():
        b = await fill_and_park(gate)
        new = asyncio.create_task(gate.acquire("n", 300, release_if_cache_gone=True))
        with pytest.raises(kvgate.Released):
            await asyncio.wait_for(new, 5)
        parked = asyncio.create_task(gate.acquire("a", 300, release_if_cache_gone=True))
        await until("a waits", lambda: gate.stats().working_set_waiting_sessions == 1)
        assert not parked.done()
        b.release(cached_tokens=0, output_tokens=0)
        gate.finish_session("b")
        gate.finish_session("c")
        lease = await asyncio.wait_for(parked, 5)
        lease.release(cached_tokens=0, output_tokens=0)
        stats = gate.stats()
        assert (stats.cancelled, stats.timed_out, stats.working_set_waiting_sessions) == (0, 0, 0)

    run(main())
    gate.close()


def test_acquire_releases_a_parked_session_without_a_tier(engine):
    gate = working_set_gate(engine)

    async def main():
        b = await fill_and_park(gate)
        with pytest.raises(kvgate.Released):
            await asyncio.wait_for(gate.acquire("a", 300, release_if_cache_gone=True), 5)
        assert gate.stats().working_set_waiting_sessions == 0
        # Without the flag the same turn waits.
        waiter = asyncio.create_task(gate.acquire("a", 300))
        await until("a waits", lambda: gate.stats().working_set_waiting_sessions == 1)
        assert not waiter.done()
        waiter.cancel()
        b.release(cached_tokens=0, output_tokens=0)

    run(main())
    gate.close()


def test_a_turn_admitted_at_once_is_not_released(engine):
    gate = working_set_gate(engine)

    async def main():
        lease = await gate.acquire("a", 300, release_if_cache_gone=True)
        assert gate.stats().working_set_sessions == 1
        lease.release(cached_tokens=0, output_tokens=0)

    run(main())
    with gate.acquire_sync("b", 300, release_if_cache_gone=True):
        pass
    gate.close()


def test_acquire_sync_releases_a_new_session_that_would_wait(engine):
    gate = working_set_gate(engine)
    member = gate.acquire_sync("a", 600)
    with pytest.raises(kvgate.Released):
        gate.acquire_sync("b", 600, timeout=5, release_if_cache_gone=True)
    assert gate.stats().working_set_waiting_sessions == 0
    member.release(cached_tokens=0, output_tokens=0)
    gate.close()


def test_a_reference_gate_refuses_the_flag_at_once(engine):
    gate = kvgate.Gate(kvgate.Config(admission_mode="reference"), engine.probes())
    with pytest.raises(kvgate.InvalidArgument, match="working-set"):
        gate.acquire("s", 10, release_if_cache_gone=True)
    with pytest.raises(kvgate.InvalidArgument, match="working-set"):
        gate.acquire_sync("s", 10, release_if_cache_gone=True)
    gate.close()
