"""The proxy-glue example runs against a real multiprocess engine and reuses the cache."""

from __future__ import annotations

import pathlib
import re
import subprocess
import sys

EXAMPLE = pathlib.Path(__file__).resolve().parents[1] / "examples" / "proxy_glue.py"


def test_proxy_glue_example() -> None:
    run = subprocess.run([sys.executable, str(EXAMPLE)], capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stderr[-3000:]
    turns = re.findall(r"^(agent-\d) turn (\d): (\w+), (\d+)/(\d+) cached$", run.stdout, re.M)
    assert len(turns) == 6, run.stdout
    later = [int(c) for _, t, _, c, _ in turns if t != "0"]
    assert all(c > 0 for c in later)  # each later turn hit its own previous prompt
    assert "# HELP kvgate_" in run.stdout
