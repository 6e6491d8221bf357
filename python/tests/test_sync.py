"""The sync path: the same step machine driven in the calling thread."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

import kvgate
from kvgate import Reason

from conftest import PRESSURE


def test_sync_admission_and_context_manager(reference_gate, engine):
    threads = threading.active_count()
    with reference_gate.acquire_sync("a", [1, 2]) as lease:
        assert lease.reason is Reason.OPEN
    assert lease.released and reference_gate.stats().active_leases == 0
    assert threading.active_count() == threads


def test_sync_waiter_is_woken_by_a_release_on_another_thread(reference_gate, engine):
    engine.usage_value = PRESSURE
    engine.resident[b"hot"] = 1.0
    holder = reference_gate.acquire_sync("hot", [1] * 10)
    result = {}

    def waiter():
        start = time.monotonic()
        with reference_gate.acquire_sync("cold", [1] * 10, timeout=20) as lease:
            result["lease"] = lease
            result["waited"] = time.monotonic() - start

    t = threading.Thread(target=waiter)
    t.start()
    deadline = time.monotonic() + 10
    while reference_gate.stats().waiting_attempts != 1:
        assert time.monotonic() < deadline
        time.sleep(0.001)
    engine.usage_value = 0.1
    holder.release()
    t.join(10)
    assert not t.is_alive()
    assert result["lease"].waited and result["lease"].reason is Reason.OPEN
    assert result["waited"] < 5  # wait_poll_sec is 30: the release woke it


def test_sync_timeout_and_preemption(reference_gate, engine):
    engine.usage_value = PRESSURE
    with pytest.raises(kvgate.TimedOut):
        reference_gate.acquire_sync("cold", [1], timeout=0.05)
    errors = []

    def older():
        try:
            reference_gate.acquire_sync("retry", [1])
        except kvgate.AdmissionError as e:
            errors.append(e)

    t = threading.Thread(target=older)
    t.start()
    while reference_gate.stats().waiting_attempts != 1:
        time.sleep(0.001)
    with pytest.raises(kvgate.TimedOut):
        reference_gate.acquire_sync("retry", [1], timeout=0.05)
    t.join(10)
    assert isinstance(errors[0], kvgate.Preempted)


def test_sync_gate_timer_ends_a_working_set_window(engine):
    engine.usage_value = 0.5
    engine.capacity_value = kvgate.Capacity(1000, 16, 4000.0)
    gate = kvgate.Gate(kvgate.Config(wait_poll_sec=30), engine.probes())
    member = gate.acquire_sync("a", 600)
    member.release(cached_tokens=0, output_tokens=10)
    start = time.monotonic()
    with gate.acquire_sync("b", 600, timeout=10) as lease:
        assert lease.waited
    assert 0.15 <= time.monotonic() - start < 5
    gate.close()


def test_sync_path_refuses_async_probes():
    async def usage(session):
        return 0.1

    gate = kvgate.Gate(kvgate.Config(), kvgate.Probes(usage=usage))
    with pytest.raises(TypeError, match="async"):
        gate.acquire_sync("s", [1])
    s = gate.stats()
    assert s.pending_attempts == 0 and s.cancelled == 1  # the attempt was abandoned
    gate.close()
