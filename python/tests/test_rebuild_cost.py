"""The engine's rebuild cost (Gate.set_rebuild_cost): what re-prefilling a
history costs, per prefilled token and per attended query-key pair. The cost
in force shows in the metrics text; a term out of range raises
InvalidArgument naming it, and the cost the gate had is kept."""

from __future__ import annotations

import math

import pytest

import kvgate

PER_TOKEN = "kvgate_working_set_rebuild_seconds_per_token"
PER_PAIR = "kvgate_working_set_rebuild_seconds_per_pair"


def gauge(gate: kvgate.Gate, name: str) -> float:
    for line in gate.metrics_text().splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise AssertionError(f"no {name} in the metrics text")


def test_a_cost_told_is_the_cost_in_force(engine):
    gate = kvgate.Gate(kvgate.Config(), engine.probes())
    assert gauge(gate, PER_TOKEN) == 0.0
    gate.set_rebuild_cost(2.5e-5, 1.5e-9)
    assert gauge(gate, PER_TOKEN) == 2.5e-5
    assert gauge(gate, PER_PAIR) == 1.5e-9
    gate.close()


@pytest.mark.parametrize(
    "per_token, per_pair, named",
    [
        (0.0, 1e-9, "per prefilled token"),
        (-1e-5, 1e-9, "per prefilled token"),
        (math.nan, 1e-9, "per prefilled token"),
        (1e-5, -1e-9, "per attended pair"),
        (1e-5, math.inf, "per attended pair"),
    ],
)
def test_a_term_out_of_range_is_refused_and_the_cost_kept(engine, per_token, per_pair, named):
    gate = kvgate.Gate(kvgate.Config(), engine.probes())
    gate.set_rebuild_cost(2.5e-5, 1.5e-9)
    with pytest.raises(kvgate.InvalidArgument, match=named):
        gate.set_rebuild_cost(per_token, per_pair)
    assert gauge(gate, PER_TOKEN) == 2.5e-5
    assert gauge(gate, PER_PAIR) == 1.5e-9
    gate.close()


def test_reference_mode_ignores_a_cost(engine):
    gate = kvgate.Gate(kvgate.Config(admission_mode="reference"), engine.probes())
    gate.set_rebuild_cost(2.5e-5, 1.5e-9)
    with pytest.raises(kvgate.InvalidArgument):
        gate.set_rebuild_cost(-1.0, 0.0)
    gate.close()
