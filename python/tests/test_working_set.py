"""Working-set mode (the default) through the asyncio driver: capacity from
the capacity probe, waiting for room, the gate's own timer (kvgate_tick)."""

from __future__ import annotations

import asyncio

import kvgate
from kvgate import Reason

from conftest import run, until, working_set_gate


def test_admission_and_capacity(engine):
    gate = working_set_gate(engine)

    async def main():
        async with gate.acquire("a", 600) as lease:
            assert lease.reason is Reason.EMPTY_WORKING_SET and lease.retain_session
            s = gate.stats()
            assert s.working_set_sessions == 1 and s.working_set_capacity_tokens == 1000
        # A member between turns is admitted again at once (its place is kept).
        async with gate.acquire("a", 650) as lease:
            assert lease.reason is Reason.RESERVED_SESSION

    run(main())
    gate.close()


def test_a_waiter_is_admitted_when_the_member_finishes(engine):
    gate = working_set_gate(engine)

    async def main():
        member = await gate.acquire("a", 600)
        waiter = asyncio.create_task(gate.acquire("b", 600))
        await until("b waits for room", lambda: gate.stats().working_set_waiting_sessions == 1)
        member.release(cached_tokens=0, output_tokens=10)
        assert gate.finish_session("a") is not None  # a leaves the working set
        lease = await asyncio.wait_for(waiter, 5)
        assert lease.waited and lease.reason in (Reason.EMPTY_WORKING_SET, Reason.FITS_WORKING_SET)
        lease.release()

    run(main())
    gate.close()


def test_the_gate_timer_admits_a_waiter_when_a_window_ends(engine):
    """Nobody releases or finishes anything after the member's release: the
    member's window (0.25 s) ends on the gate's timer, which the driver arms
    from kvgate_tick, and that wakes the waiter long before wait_poll_sec."""
    gate = working_set_gate(engine)

    async def main():
        loop = asyncio.get_running_loop()
        member = await gate.acquire("a", 600)
        waiter = asyncio.create_task(gate.acquire("b", 600))
        await until("b waits for room", lambda: gate.stats().working_set_waiting_sessions == 1)
        member.release(cached_tokens=0, output_tokens=10)
        released = loop.time()
        lease = await asyncio.wait_for(waiter, 10)
        waited = loop.time() - released
        assert 0.2 <= waited < 5, waited
        stats = gate.stats()
        assert stats.working_set_window_sec == 0.25
        assert stats.working_set_horizon_turns >= 1, stats
        lease.release()

    run(main())
    gate.close()


def sharing_prompt(session: int) -> list:
    """A first prompt: 300 tokens every session shares, then 60 of its own."""
    return list(range(300)) + [10_000 * (session + 1) + i for i in range(60)]


def sessions_sharing_a_prefix(gate, acquire, prompt_of) -> int:
    """Two sessions in the working set at once whose first prompts share
    their first 300 tokens, behind an engine that reports no cached
    tokens. Returns the shared prefix the working set counts."""
    leases = [acquire(f"agent-{s}", prompt_of(sharing_prompt(s))) for s in range(2)]
    shared = gate.stats().working_set_shared_prefix_tokens
    for s, lease in enumerate(leases):
        lease.release(cached_tokens=None, output_tokens=0)
        assert gate.finish_session(f"agent-{s}") is not None
    return shared


def test_token_ids_let_the_gate_learn_the_shared_prefix_without_cached_tokens(engine):
    """With the ids (asyncio and blocking drivers alike) the gate sketches
    the first prompts and counts what they share once; told only the
    lengths, it cannot."""
    gate = working_set_gate(engine)

    async def asyncio_sessions():
        leases = [await gate.acquire(f"agent-{s}", sharing_prompt(s)) for s in range(2)]
        shared = gate.stats().working_set_shared_prefix_tokens
        for s, lease in enumerate(leases):
            lease.release(cached_tokens=None, output_tokens=0)
            assert gate.finish_session(f"agent-{s}") is not None
        return shared

    assert 0 < run(asyncio_sessions()) <= 300
    gate.close()

    gate = working_set_gate(engine)
    assert 0 < sessions_sharing_a_prefix(gate, gate.acquire_sync, lambda ids: ids) <= 300
    gate.close()

    gate = working_set_gate(engine)
    assert sessions_sharing_a_prefix(gate, gate.acquire_sync, len) == 0
    gate.close()


def test_a_waiter_handed_room_is_admitted_without_asking_the_engine_again(engine):
    """The ledger holds a waiter's place and the room handed to it while it
    slept: woken, it asks the ledger only (one probe per waited admission)."""
    gate = working_set_gate(engine)

    async def main():
        member = await gate.acquire("a", 600)
        waiter = asyncio.create_task(gate.acquire("b", 600))
        await until("b waits for room", lambda: gate.stats().working_set_waiting_sessions == 1)
        calls = engine.usage_calls
        member.release(cached_tokens=0, output_tokens=10)
        assert gate.finish_session("a") is not None
        lease = await asyncio.wait_for(waiter, 5)
        assert lease.waited
        assert engine.usage_calls == calls, "the woken waiter asked the ledger only"
        lease.release()

    run(main())
    gate.close()
