"""What the host may tell the gate (issue 51): the engine's max_model_len
with the capacity answer, a session's budget, and a saved summary of what
the gate learned. Every figure is optional; a bad one raises ValueError
naming it and the gate keeps what it had."""

from __future__ import annotations

import math

import pytest

import kvgate


def run_turn(gate: kvgate.Gate, session: str, prompt: int = 100) -> None:
    lease = gate.acquire_sync(session, prompt, timeout=5)
    lease.release(cached_tokens=0, output_tokens=20)


def test_max_model_len_rides_on_the_capacity_answer(engine):
    engine.capacity_value = kvgate.Capacity(12800, 32, 0.0, max_model_len=4096)
    gate = kvgate.Gate(kvgate.Config(), engine.probes())
    run_turn(gate, "a")
    # Known now: a budget past it is refused by name.
    with pytest.raises(ValueError, match="max_model_len"):
        gate.set_budget("b", tokens=4097)
    gate.set_budget("b", tokens=4096)
    gate.close()


@pytest.mark.parametrize("bad", [0, -1, math.nan, 1.5, "4096"])
def test_a_bad_max_model_len_is_refused_by_name(engine, bad):
    engine.capacity_value = kvgate.Capacity(12800, 32, 0.0, max_model_len=bad)
    gate = kvgate.Gate(kvgate.Config(), engine.probes())
    with pytest.raises(ValueError, match="max_model_len"):
        run_turn(gate, "a")
    gate.close()


def test_a_capacity_without_max_model_len_says_nothing_of_it(engine):
    assert kvgate.Capacity(1, 1, 0.0).max_model_len is None
    engine.capacity_value = kvgate.Capacity(12800, 32, 0.0)
    gate = kvgate.Gate(kvgate.Config(), engine.probes())
    run_turn(gate, "a")
    gate.set_budget("b", tokens=10**9)  # no max_model_len known: no bound
    gate.close()


@pytest.mark.parametrize(
    "turns, tokens, named",
    [(0, None, "turns"), (-3, None, "turns"), (math.nan, None, "turns"), (2**32, None, "turns"),
     (None, 0, "tokens"), (None, -1, "tokens"), (None, math.nan, "tokens"), (None, 2.5, "tokens")],
)
def test_a_bad_budget_is_refused_by_name(engine, turns, tokens, named):
    gate = kvgate.Gate(kvgate.Config(), engine.probes())
    gate.set_budget("s", turns=10, tokens=5000)
    with pytest.raises(ValueError, match=named):
        gate.set_budget("s", turns=turns, tokens=tokens)
    gate.close()


def test_a_budget_is_told_before_the_first_acquire_and_forgotten_with_the_session(engine):
    gate = kvgate.Gate(kvgate.Config(), engine.probes())
    gate.set_budget("s", turns=8)
    gate.set_budget("s", turns=8, tokens=3000)
    run_turn(gate, "s")
    gate.finish_session("s")
    gate.set_budget("never-acquires", tokens=10)
    gate.finish_session("never-acquires")
    gate.close()


def test_a_summary_saved_loads_into_a_fresh_gate(engine):
    engine.capacity_value = kvgate.Capacity(12800, 32, 0.0)
    gate = kvgate.Gate(kvgate.Config(), engine.probes())
    for s in ("a", "b"):
        run_turn(gate, s)
        gate.finish_session(s)
    data = gate.save_summary()
    assert isinstance(data, bytes) and data[:4] == b"KVGL"
    gate.close()
    fresh = kvgate.Gate(kvgate.Config(), engine.probes())
    run_turn(fresh, "c")  # the engine answers: a summary loaded now is adopted at once
    fresh.load_summary(data)
    assert fresh.save_summary() == data, "the same figures"
    fresh.close()
    pending = kvgate.Gate(kvgate.Config(), engine.probes())
    pending.load_summary(data)  # kept until the engine's first answer
    run_turn(pending, "d")
    pending.close()


def test_a_bad_summary_is_refused_and_the_gate_goes_on(engine):
    gate = kvgate.Gate(kvgate.Config(), engine.probes())
    data = gate.save_summary()
    with pytest.raises(ValueError, match="truncated"):
        gate.load_summary(data[:-3])
    other = bytearray(data)
    other[4] = 7
    with pytest.raises(ValueError, match="version"):
        gate.load_summary(bytes(other))
    flipped = bytearray(data)
    flipped[-5] ^= 1
    with pytest.raises(ValueError, match="checksum"):
        gate.load_summary(bytes(flipped))
    with pytest.raises(ValueError, match="not a kvgate summary"):
        gate.load_summary(b"hello world, not a summary")
    assert gate.save_summary() == data
    run_turn(gate, "a")
    gate.close()


def test_another_engines_summary_is_refused_once_the_engine_answered(engine):
    engine.capacity_value = kvgate.Capacity(12800, 32, 0.0)
    gate = kvgate.Gate(kvgate.Config(), engine.probes())
    run_turn(gate, "a")
    gate.finish_session("a")
    data = gate.save_summary()
    gate.close()
    engine.capacity_value = kvgate.Capacity(25600, 32, 0.0)
    other = kvgate.Gate(kvgate.Config(), engine.probes())
    run_turn(other, "x")
    with pytest.raises(ValueError, match="another engine"):
        other.load_summary(data)
    other.close()
