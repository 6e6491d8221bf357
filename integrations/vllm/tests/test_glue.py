"""The pure parts of the glue: policy specs, knob parsing, session ids, DP pinning."""

from __future__ import annotations

import importlib.util
import pathlib
import sys

import kvgate
import pytest

from kvgate_vllm import knobs, serve

BENCH = pathlib.Path(__file__).resolve().parents[1] / "bench" / "real_engine.py"
spec = importlib.util.spec_from_file_location("real_engine", BENCH)
assert spec and spec.loader
real_engine = importlib.util.module_from_spec(spec)
sys.modules["real_engine"] = real_engine  # dataclasses look their module up
spec.loader.exec_module(real_engine)


def test_policy_specs_pass_knobs_through() -> None:
    got = real_engine.parse_policies("none,cap-3,kvgate:high_watermark=0.2,idle_grace_sec=1,kvgate,kvgate:mode=working_set")
    assert got == ["none", "cap-3", "kvgate:high_watermark=0.2,idle_grace_sec=1", "kvgate", "kvgate:mode=working_set"]
    assert real_engine.parse_knobs(got[2]) == {"high_watermark": 0.2, "idle_grace_sec": 1.0}
    assert real_engine.parse_knobs(got[4]) == {"mode": "working_set"}
    assert serve.parse_config("high_watermark=0.2, mode=working_set") == {"high_watermark": 0.2, "mode": "working_set"}


def test_knobs_map_onto_the_package_config() -> None:
    cfg = knobs.config(serve.parse_config("admission_mode=reference,high_watermark=0.2,idle_grace_sec=1,wait_poll_sec=60"))
    assert cfg == kvgate.Config(admission_mode="reference", high_watermark=0.2, idle_grace_sec=1.0, wait_poll_sec=60.0)
    assert cfg.mode is kvgate.AdmissionMode.REFERENCE
    assert knobs.config({}) == kvgate.Config()  # the library's defaults (working set)
    assert knobs.config({}).mode is kvgate.AdmissionMode.WORKING_SET
    for bad in ("mode=working_set", "high_watermark=high", "admission_mode=fastest", "admission_mode=1"):
        with pytest.raises(ValueError):
            knobs.config(serve.parse_config(bad))
    with pytest.raises(ValueError, match="not knob=value"):
        serve.parse_config("high_watermark")


def test_a_knob_the_library_refuses_is_refused_when_the_gate_is_made() -> None:
    with pytest.raises(kvgate.InvalidArgument):
        kvgate.Gate(knobs.config({"high_watermark": 7.0})).close()
    with kvgate.Gate(knobs.config({"admission_mode": "reference", "high_watermark": 0.5})) as gate:
        assert gate.config.mode is kvgate.AdmissionMode.REFERENCE


def test_session_ids_from_vllm_or_agent_headers() -> None:
    assert serve.session_of("from-vllm") == ("from-vllm", False)
    token = serve._headers.set({"x-dynamo-session-id": "d1", "x-dynamo-session-final": "true"})
    try:
        assert serve.session_of(None) == ("d1", True)
        assert serve.session_of("explicit") == ("explicit", True)
    finally:
        serve._headers.reset(token)
    assert serve.session_of(None) == (None, False)


def test_a_session_is_pinned_to_one_engine() -> None:
    ranks = {serve.engine_for(f"agent-{i}", 4) for i in range(200)}
    assert ranks == {0, 1, 2, 3}
    assert all(serve.engine_for("agent-7", 4) == serve.engine_for("agent-7", 4) for _ in range(10))
