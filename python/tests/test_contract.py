"""The header's probe contract, inherited by the package: a gate
closed (and so freed) from inside a probe asks no probe again; reference
mode never asks the capacity probe; cancelling a task while its probe answer
is out ends the attempt; retain_session and the session's figures agree."""

from __future__ import annotations

import asyncio

import pytest

import kvgate
from kvgate import Reason

from conftest import PRESSURE, run

MODES = ["working_set", "reference"]


class ClosingProbes:
    """Probes that close their gate from inside the usage probe, and count
    every probe call that begins after that."""

    def __init__(self, asynchronous: bool) -> None:
        self.gate: kvgate.Gate
        self.calls_after_close: list = []
        self.usage_calls = 0
        self.asynchronous = asynchronous

    def _note(self, name: str) -> None:
        if self.gate.closed:
            self.calls_after_close.append(name)

    def probes(self) -> kvgate.Probes:
        def usage(session):
            self._note("usage")
            self.usage_calls += 1
            self.gate.close()
            return PRESSURE

        def capacity(session):
            self._note("capacity")
            return kvgate.Capacity(1 << 20, 16, 10_000.0)

        def prefix(session, ids):
            self._note("prefix")
            return 0.95

        if not self.asynchronous:
            return kvgate.Probes(usage=usage, capacity=capacity, prefix=prefix)

        async def ausage(session):
            await asyncio.sleep(0)
            return usage(session)

        async def acapacity(session):
            await asyncio.sleep(0)
            return capacity(session)

        async def aprefix(session, ids):
            await asyncio.sleep(0)
            return prefix(session, ids)

        return kvgate.Probes(usage=ausage, capacity=acapacity, prefix=aprefix)


def closing_gate(mode: str, asynchronous: bool) -> ClosingProbes:
    host = ClosingProbes(asynchronous)
    host.gate = kvgate.Gate(kvgate.Config(admission_mode=mode), host.probes())
    return host


@pytest.mark.parametrize("mode", MODES)
def test_closing_the_gate_inside_an_async_usage_probe_asks_no_probe_again(mode):
    host = closing_gate(mode, asynchronous=True)

    async def main():
        with pytest.raises(kvgate.Closed):
            await host.gate.acquire("s", [1, 2, 3])

    run(main())
    assert host.usage_calls == 1
    assert host.gate._raw is None, "the close freed the library's gate"
    assert host.calls_after_close == []


@pytest.mark.parametrize("mode", MODES)
def test_closing_the_gate_inside_a_usage_probe_of_acquire_sync_asks_no_probe_again(mode):
    host = closing_gate(mode, asynchronous=False)
    with pytest.raises(kvgate.Closed):
        host.gate.acquire_sync("s", [1, 2, 3])
    assert host.usage_calls == 1
    assert host.gate._raw is None
    assert host.calls_after_close == []


def test_reference_mode_never_asks_the_capacity_probe(engine):
    asked = []
    probes = kvgate.Probes(usage=engine.usage, prefix=engine.prefix, capacity=lambda s: asked.append(s))
    gate = kvgate.Gate(kvgate.Config(admission_mode="reference"), probes)

    async def main():
        engine.usage_value = 0.1
        async with gate.acquire("a", [1]):
            pass
        engine.usage_value = PRESSURE
        engine.resident[b"b"] = 0.95
        async with gate.acquire("b", [1]):
            pass

    run(main())
    with gate.acquire_sync("b", [1]):
        pass
    gate.close()
    assert engine.usage_calls == 3 and asked == []


@pytest.mark.parametrize(
    "mode, outstanding",
    # Working-set admission never asks the prefix probe, reference mode
    # never the capacity probe.
    [("working_set", "usage"), ("working_set", "capacity"), ("reference", "usage"), ("reference", "prefix")],
)
def test_cancelling_a_task_while_its_probe_answer_is_outstanding(mode, outstanding):
    async def main():
        in_probe = asyncio.Event()

        def probe(name, answer):
            async def p(*args):
                if name == outstanding:
                    in_probe.set()
                    await asyncio.sleep(3600)
                return answer

            return p

        gate = kvgate.Gate(
            kvgate.Config(admission_mode=mode),
            kvgate.Probes(
                usage=probe("usage", PRESSURE),
                capacity=probe("capacity", kvgate.Capacity(1 << 20, 16, 0.0)),
                prefix=probe("prefix", 0.95),
            ),
        )
        task = asyncio.create_task(gate.acquire("s", [1, 2]))
        await asyncio.wait_for(in_probe.wait(), 10)
        assert gate.stats().pending_attempts == 1
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        s = gate.stats()
        assert (s.cancelled, s.pending_attempts, s.active_leases, s.admissions) == (1, 0, 0, 0)
        # The session is free to go again, and is admitted.
        gate.probes = kvgate.Probes(usage=lambda s: 0.1)
        async with gate.acquire("s", [1, 2]) as lease:
            assert lease.reason in (Reason.OPEN, Reason.EMPTY_WORKING_SET)
        gate.close()

    run(main())


@pytest.mark.parametrize("mode", MODES)
def test_retain_session_and_the_session_figures_agree(mode, engine):
    engine.usage_value = PRESSURE
    engine.resident[b"s"] = 0.95
    gate = kvgate.Gate(kvgate.Config(admission_mode=mode), engine.probes())
    with gate.acquire_sync("s", [1, 2]) as lease:
        s = gate.session_stats("s")
        assert lease.retain_session and s.active_leases == 1
        if mode == "reference":
            assert lease.reason is Reason.RESIDENT_PREFIX
            assert (s.retaining_leases, s.reserved, s.in_grace) == (1, True, False)
        else:
            assert lease.reason is Reason.EMPTY_WORKING_SET
            assert (s.retaining_leases, s.reserved, s.in_grace) == (0, False, False)
    gate.close()
