"""Reference mode (the seed's decision table) through the asyncio driver."""

from __future__ import annotations

import asyncio
import gc
import math
import warnings

import pytest

import kvgate
from kvgate import Reason

from conftest import PRESSURE, run, until


def test_open_admission_and_release(reference_gate, engine):
    async def main():
        async with reference_gate.acquire("agent-0", [1, 2, 3]) as lease:
            assert lease.reason is Reason.OPEN and not lease.waited
            assert math.isnan(lease.hit_ratio) and lease.usage == 0.0
            assert reference_gate.stats().active_leases == 1
        assert lease.released
        assert not lease.release(), "a second release is a no-op"
        s = reference_gate.stats()
        assert (s.admissions, s.admissions_open, s.releases, s.active_leases) == (1, 1, 1, 0)
        assert engine.usage_calls == 1 and engine.prefix_calls == 0

    run(main())


def test_resident_prefix_under_pressure(reference_gate, engine):
    engine.usage_value = PRESSURE
    engine.resident[b"hot"] = 0.9

    async def main():
        lease = await reference_gate.acquire("hot", [7] * 100)
        assert lease.reason is Reason.RESIDENT_PREFIX and lease.retain_session and lease.hit_ratio == 0.9
        lease.release(cached_tokens=90, output_tokens=5)
        # The session owns its reservation for idle_grace_sec: admitted again at once.
        again = await reference_gate.acquire("hot", [7] * 120)
        assert again.reason is Reason.RESERVED_SESSION
        again.release()
        s = reference_gate.session_stats("hot")
        assert s.reserved and s.in_grace and s.admissions == 2

    run(main())


def test_prompt_length_only_answers_prefix_unavailable(reference_gate, engine):
    engine.usage_value = PRESSURE

    async def main():
        async with reference_gate.acquire("len-only", 100) as lease:
            assert lease.reason is Reason.PREFIX_PROBE_UNAVAILABLE
        assert engine.prefix_calls == 0

    run(main())


def test_a_waiter_is_woken_by_a_release(reference_gate, engine):
    engine.usage_value = PRESSURE
    engine.resident[b"hot"] = 1.0

    async def main():
        holder = await reference_gate.acquire("hot", [7] * 100)
        cold = asyncio.create_task(reference_gate.acquire("cold", [7] * 100))
        await until("the cold turn sleeps", lambda: reference_gate.stats().waiting_attempts == 1)
        calls = engine.usage_calls
        await asyncio.sleep(0.05)
        assert not cold.done() and engine.usage_calls == calls, "a sleeping attempt does not poll"
        engine.usage_value = 0.1
        holder.release()  # wait_poll_sec is 30: only the release can wake it in time
        lease = await asyncio.wait_for(cold, 5)
        assert lease.waited and lease.reason is Reason.OPEN and lease.wait_sec > 0.04
        lease.release()

    run(main())


def test_preemption_by_a_newer_attempt(reference_gate, engine):
    engine.usage_value = PRESSURE

    async def main():
        older = asyncio.create_task(reference_gate.acquire("retry", [7] * 10))
        await until("the older attempt sleeps", lambda: reference_gate.stats().waiting_attempts == 1)
        newer = asyncio.create_task(reference_gate.acquire("retry", [7] * 10, timeout=0.05))
        with pytest.raises(kvgate.Preempted) as e:
            await older
        assert e.value.code is kvgate.Status.PREEMPTED and "preempted" in e.value.message
        with pytest.raises(kvgate.TimedOut):
            await newer
        s = reference_gate.session_stats("retry")
        assert s.num_preempted == 1 and s.timed_out == 1 and s.active_leases == 0

    run(main())


def test_timeout(reference_gate, engine):
    engine.usage_value = PRESSURE

    async def main():
        loop = asyncio.get_running_loop()
        with pytest.raises(kvgate.TimedOut) as e:
            await reference_gate.acquire("cold", [1], timeout=0)
        assert "timeout_ms = 0" in e.value.message
        start = loop.time()
        with pytest.raises(kvgate.TimedOut):
            await reference_gate.acquire("cold", [1], timeout=0.2)
        assert 0.19 <= loop.time() - start < 2.0
        assert reference_gate.stats().timed_out == 2

    run(main())


def test_cancelling_the_awaiting_task_cancels_the_attempt(reference_gate, engine):
    engine.usage_value = PRESSURE

    async def main():
        doomed = asyncio.create_task(reference_gate.acquire("gone", [7] * 10))
        await until("the attempt sleeps", lambda: reference_gate.stats().waiting_attempts == 1)
        doomed.cancel()
        with pytest.raises(asyncio.CancelledError):
            await doomed
        s = reference_gate.session_stats("gone")
        assert s.cancelled == 1 and not s.attempt_pending and s.active_leases == 0
        g = reference_gate.stats()
        assert (g.cancelled, g.pending_attempts, g.waiting_attempts, g.active_leases) == (1, 0, 0, 0)

    run(main())


def test_cancel_session_raises_cancelled(reference_gate, engine):
    engine.usage_value = PRESSURE

    async def main():
        waiting = asyncio.create_task(reference_gate.acquire("s", [7]))
        await until("the attempt sleeps", lambda: reference_gate.stats().waiting_attempts == 1)
        assert reference_gate.cancel_session("s")
        with pytest.raises(kvgate.Cancelled):
            await waiting
        assert not reference_gate.cancel_session("s"), "nothing waits any more"

    run(main())


def test_lease_released_on_exception_and_on_cancellation_in_the_body(reference_gate):
    async def main():
        with pytest.raises(ZeroDivisionError):
            async with reference_gate.acquire("a", [1]):
                1 / 0
        assert reference_gate.stats().active_leases == 0

        entered = asyncio.Event()

        async def body():
            async with reference_gate.acquire("b", [1]):
                entered.set()
                await asyncio.sleep(3600)

        task = asyncio.create_task(body())
        await entered.wait()
        assert reference_gate.stats().active_leases == 1
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        s = reference_gate.stats()
        assert s.active_leases == 0 and s.releases == 2

    run(main())


def test_an_unreleased_lease_is_released_by_the_garbage_collector(reference_gate):
    async def main():
        lease = await reference_gate.acquire("leaky", [1])
        assert reference_gate.stats().active_leases == 1
        return lease.handle

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        run(main())  # the lease dies with main's frame (or at the collection)
        gc.collect()
    assert any(issubclass(w.category, ResourceWarning) and "never released" in str(w.message) for w in caught)
    assert reference_gate.stats().active_leases == 0


def test_finish_session_stats_and_metrics(reference_gate):
    async def main():
        async with reference_gate.acquire("done", [1, 2]):
            pass
        final = reference_gate.finish_session("done")
        assert isinstance(final, kvgate.SessionStats) and final.admissions == 1
        assert final.last_admitted_prompt_len == 2
        assert reference_gate.finish_session("done") is None
        assert reference_gate.session_stats("never-seen") is None
        text = reference_gate.metrics_text()
        assert 'kvgate_admissions_total{reason="open"} 1\n' in text
        assert reference_gate.stats().sessions_finished == 1

    run(main())


def test_close_wakes_waiters_with_closed_and_refuses_new_ones(engine):
    engine.usage_value = PRESSURE
    gate = kvgate.Gate(kvgate.Config(admission_mode="reference", wait_poll_sec=30), engine.probes())

    async def main():
        waiting = asyncio.create_task(gate.acquire("w", [1]))
        await until("the attempt sleeps", lambda: gate.stats().waiting_attempts == 1)
        gate.close()
        with pytest.raises(kvgate.Closed):
            await waiting
        with pytest.raises(kvgate.Closed):
            await gate.acquire("late", [1])
        with pytest.raises(kvgate.Closed):
            gate.stats()

    run(main())
    gate.close()  # idempotent


def test_one_gate_across_event_loops_and_a_close_from_another_thread(engine):
    """Each loop gets its own waker; a loop that ended leaves nothing behind;
    close() from a thread that is not the loop's reaches the loop's waiters."""
    import threading

    gate = kvgate.Gate(kvgate.Config(admission_mode="reference", wait_poll_sec=30), engine.probes())

    async def one_turn():
        async with gate.acquire("s", [1]) as lease:
            return lease.reason

    assert run(one_turn()) is Reason.OPEN
    assert run(one_turn()) is Reason.OPEN  # a second asyncio.run: a new loop, a new driver
    assert len(gate._drivers) == 1, "the first loop's driver was dropped"

    engine.usage_value = PRESSURE

    async def closed_from_a_thread():
        waiting = asyncio.create_task(gate.acquire("w", [1]))
        await until("the attempt sleeps", lambda: gate.stats().waiting_attempts == 1)
        closer = threading.Thread(target=gate.close)
        closer.start()
        with pytest.raises(kvgate.Closed):
            await asyncio.wait_for(waiting, 5)
        closer.join()

    run(closed_from_a_thread())
    assert gate.closed
