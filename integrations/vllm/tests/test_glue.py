"""The pure parts of the glue: policy specs, knob parsing, session ids, DP pinning."""

from __future__ import annotations

import importlib.util
import pathlib
import sys

from kvgate_vllm import serve

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
