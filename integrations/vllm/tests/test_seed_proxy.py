"""kvgate.SessionLevelScheduler, the drop-in for the seed proxy's scheduler,
over a real engine: examples/seed_proxy.py runs 8 agent sessions x 4 turns
on a 64-block vLLM CPU engine (an AsyncLLM, its probes UTILITY calls answered
by kvgate_vllm), once at the drop-in's defaults (working-set admission) and
once with the seed's table, and reports what the gate holds at the end."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

EXAMPLE = pathlib.Path(__file__).resolve().parents[1] / "examples" / "seed_proxy.py"
WORKING_SET_REASONS = {
    "empty_working_set", "fits_working_set", "reserved_session", "wait_bound", "running_cold_pays",
}
SEED_REASONS = {"open", "reserved_session", "prefix_probe_unavailable", "resident_prefix"}


def test_a_multi_turn_workload_runs_to_completion_with_no_lease_left() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HARBOR_SESSION_")}
    env.pop("VLLM_ENABLE_V1_MULTIPROCESSING", None)  # an AsyncLLM: engine core in its own process
    run = subprocess.run(
        [sys.executable, str(EXAMPLE), "working_set", "reference"],
        capture_output=True, text=True, timeout=900, env=env,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    rounds = {r["round"]: r for r in (json.loads(line) for line in run.stdout.splitlines() if line.startswith("{"))}
    assert set(rounds) == {"working_set", "reference"}, run.stdout[-3000:]
    for label, r in rounds.items():
        assert r["turns"] == 8 * 4, r
        assert sum(r["reasons"].values()) == 8 * 4, r
        # Every lease released, no attempt left, every session finished.
        assert (r["active_leases"], r["pending_attempts"], r["reserved"], r["working_set_sessions"]) == (0, 0, 0, 0), r
        assert r["probe_calls"]["kvgate_usage"] >= 8 * 4, r  # one usage probe per turn at least

    ws = rounds["working_set"]
    assert ws["mode"] == "working_set"
    assert set(ws["reasons"]) <= WORKING_SET_REASONS, ws
    # The capacity comes from the server manager's probe; the prefix probe is the seed table's alone.
    assert ws["probe_calls"]["kvgate_capacity"] >= 1 and "kvgate_prefix" not in ws["probe_calls"], ws
    assert ws["cached_tokens"] > 0, ws  # later turns reuse their sessions' prefixes

    ref = rounds["reference"]
    assert ref["mode"] == "reference"
    assert set(ref["reasons"]) <= SEED_REASONS, ref
    assert "kvgate_capacity" not in ref["probe_calls"], ref
