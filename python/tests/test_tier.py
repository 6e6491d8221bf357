"""The engine's host tier of KV: told with the capacity answer
(Capacity.tier_tokens, reload_tokens_per_sec), reported per turn
(Lease.release(tier_cached_tokens=...)), counted in Stats. Every refusal
raises ValueError with the library's message and changes nothing: an
acquire refused is abandoned cleanly (the gate stays usable), a release
refused keeps the lease held."""

from __future__ import annotations

import asyncio

import pytest

import kvgate

from conftest import run

TIERED = kvgate.Capacity(1000, 16, 4000.0, tier_tokens=4000, reload_tokens_per_sec=1e5)
PLAIN = kvgate.Capacity(1000, 16, 4000.0)

#: Capacities the gate refuses once TIERED was told, and why.
REFUSED = [
    (kvgate.Capacity(1000, 16, 4000.0, 500, 1e5), "smaller than the GPU cache"),
    (kvgate.Capacity(8000, 16, 4000.0, 6000, 1e5), "smaller than the GPU cache (8000"),
    (kvgate.Capacity(1000, 16, 4000.0, 4000, float("nan")), "reload rate"),
    (kvgate.Capacity(1000, 16, 4000.0, 4000, 0.0), "reload rate"),
    (kvgate.Capacity(1000, 16, 4000.0, 4000, -1.0), "reload rate"),
    (PLAIN, "told a KV tier before and none now"),
]


def tier_figures(gate):
    s = gate.stats()
    return s.working_set_tier_tokens, s.working_set_refused_answers, s.working_set_tier_cached_tokens


def tiered_gate(engine):
    engine.capacity_value = TIERED
    engine.usage_value = 0.0
    gate = kvgate.Gate(kvgate.Config(wait_poll_sec=30), engine.probes())
    gate.acquire_sync("first", 100).release()
    assert tier_figures(gate) == (4000, 0, 0)
    return gate


def test_capacity_keeps_its_old_shape():
    # Positional answers of three or five figures still build it; each
    # figure added since (the tier, max_model_len) defaults to "not told".
    assert kvgate.Capacity(1, 2, 3.0) == (1, 2, 3.0, 0, 0.0, None)
    assert kvgate.Capacity(1, 2, 3.0, 4, 5.0)[:5] == (1, 2, 3.0, 4, 5.0)
    assert kvgate.Capacity(1, 2, 3.0).tier_tokens == 0


def test_a_tier_shows_in_the_stats_and_the_metrics(engine):
    gate = tiered_gate(engine)
    text = gate.metrics_text()
    assert "\nkvgate_working_set_tier_tokens 4000\n" in text
    assert "\nkvgate_refused_answers_total 0\n" in text
    assert "\nkvgate_tier_cached_tokens_total 0\n" in text
    # A tier given as a plain tuple from the probe works too.
    engine.capacity_value = (1000, 16, 4000.0, 8000, 1e5)
    gate.acquire_sync("b", 100).release()
    assert tier_figures(gate) == (8000, 0, 0)
    gate.close()


@pytest.mark.parametrize("capacity,why", REFUSED)
def test_a_refused_tier_raises_from_the_sync_acquire_and_the_gate_stays_usable(engine, capacity, why):
    gate = tiered_gate(engine)
    engine.capacity_value = capacity
    with pytest.raises(ValueError, match="kvgate_attempt_answer_usage_tiered: .*" + why.replace("(", r"\(")):
        gate.acquire_sync("s", 100)
    s = gate.stats()
    # Abandoned cleanly: no attempt or lease left, the refusal counted,
    # the tier and capacity the gate knew kept.
    assert (s.pending_attempts, s.active_leases, s.cancelled) == (0, 0, 1)
    assert tier_figures(gate) == (4000, 1, 0)
    assert s.working_set_capacity_tokens == 1000
    engine.capacity_value = TIERED
    with gate.acquire_sync("s", 100):
        pass
    gate.close()


@pytest.mark.parametrize("capacity,why", REFUSED)
def test_a_refused_tier_raises_from_the_async_acquire_and_the_gate_stays_usable(engine, capacity, why):
    gate = tiered_gate(engine)
    engine.capacity_value = capacity

    async def main():
        with pytest.raises(ValueError, match=why.replace("(", r"\(")):
            async with gate.acquire("s", 100):
                raise AssertionError("admitted on a refused answer")
        with pytest.raises(ValueError):
            await asyncio.create_task(gate.acquire("s", 100))
        s = gate.stats()
        assert (s.pending_attempts, s.active_leases, s.cancelled) == (0, 0, 2)
        assert tier_figures(gate) == (4000, 2, 0)
        engine.capacity_value = TIERED
        async with gate.acquire("s", 100):
            pass

    run(main())
    gate.close()


def test_an_engine_that_cannot_say_keeps_the_tier(engine):
    gate = tiered_gate(engine)
    for answer in (None, kvgate.Capacity()):
        engine.capacity_value = answer
        gate.acquire_sync("s", 100).release()
    assert tier_figures(gate) == (4000, 0, 0)
    gate.close()


def test_negative_figures_are_refused_before_the_library(engine):
    gate = tiered_gate(engine)
    engine.capacity_value = kvgate.Capacity(1000, 16, 0.0, -1, 1e5)
    with pytest.raises(ValueError, match="tier_tokens is negative"):
        gate.acquire_sync("s", 100)
    assert gate.stats().pending_attempts == 0
    gate.close()


def test_the_attempt_answers_again_after_a_refusal(engine):
    gate = tiered_gate(engine)
    waker = kvgate.Waker()
    attempt = kvgate.Attempt(gate, b"s", 100, -1, waker, 1)
    assert attempt.kind is kvgate.StepKind.PROBE_USAGE
    with pytest.raises(ValueError, match="none now"):
        attempt.answer_usage(0.0, PLAIN)
    assert attempt.kind is kvgate.StepKind.PROBE_USAGE
    assert attempt.answer_usage(0.0, TIERED) is kvgate.StepKind.ADMITTED
    attempt.lease().release()
    attempt.close()
    waker.close()
    gate.close()


def test_a_refused_tier_report_keeps_the_lease_held(engine):
    gate = tiered_gate(engine)
    lease = gate.acquire_sync("s", 100)
    with pytest.raises(ValueError, match=r"tier hits \(101 tokens\) exceed its cached tokens \(100\)"):
        lease.release(cached_tokens=100, output_tokens=5, tier_cached_tokens=101)
    with pytest.raises(ValueError, match=r"exceed its cached tokens \(0\)"):
        lease.release(tier_cached_tokens=1)
    assert not lease.released
    s = gate.stats()
    assert s.active_leases == 1 and s.working_set_refused_answers == 2
    # A second, correct release works, once.
    assert lease.release(cached_tokens=100, output_tokens=5, tier_cached_tokens=60) is True
    assert lease.released and lease.release() is False
    assert tier_figures(gate) == (4000, 2, 60)
    assert "\nkvgate_tier_cached_tokens_total 60\n" in gate.metrics_text()
    gate.close()


def test_a_refused_tier_report_in_a_context_manager_still_releases_on_exit(engine):
    gate = tiered_gate(engine)
    with pytest.raises(ValueError):
        with gate.acquire_sync("s", 100) as lease:
            lease.release(cached_tokens=1, tier_cached_tokens=2)
    assert gate.stats().active_leases == 0
    gate.close()


def test_reference_mode_takes_a_tier_and_reports_nothing(engine):
    engine.capacity_value = TIERED
    gate = kvgate.Gate(kvgate.Config(admission_mode="reference"), engine.probes())
    lease = gate.acquire_sync("s", [1, 2, 3])
    with pytest.raises(ValueError):
        lease.release(cached_tokens=1, tier_cached_tokens=2)
    lease.release(cached_tokens=2, tier_cached_tokens=1)
    assert tier_figures(gate) == (0, 0, 0)
    gate.close()
