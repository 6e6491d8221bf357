"""Shared fixtures: a toy engine whose answers the tests set, and helpers to
run a coroutine with a patience bound (a bug fails a test, never hangs it)."""

from __future__ import annotations

import asyncio
import pathlib
from typing import Dict, Optional, Sequence

import pytest

import kvgate

PATIENCE = 30.0  # seconds
PRESSURE = 0.95  # above the reference mode's watermark (0.85)
REPO = pathlib.Path(__file__).resolve().parents[2]

# The tests exercise the installed package (the wheel's bundled library and
# header), not the source tree: run `pytest` (not `python -m pytest` from
# python/, which would import ./kvgate first).
if not kvgate._ffi.HEADER.exists():
    raise RuntimeError(
        f"kvgate was imported from {kvgate.__file__}, which has no bundled header: "
        "install the package (scripts/python-package.sh) and run pytest from its venv"
    )


class ToyEngine:
    """Answers the probes from what a test sets; counts the calls."""

    def __init__(self) -> None:
        self.usage_value: Optional[float] = 0.0
        self.resident: Dict[bytes, float] = {}
        self.capacity_value = kvgate.Capacity(0, 0, 0.0)
        self.usage_calls = 0
        self.prefix_calls = 0

    def usage(self, session: bytes) -> Optional[float]:
        self.usage_calls += 1
        return self.usage_value

    def prefix(self, session: bytes, prompt: Sequence[int]) -> Optional[float]:
        self.prefix_calls += 1
        return self.resident.get(session, 0.0)

    def capacity(self, session: bytes) -> kvgate.Capacity:
        return self.capacity_value

    def probes(self) -> kvgate.Probes:
        return kvgate.Probes(usage=self.usage, capacity=self.capacity, prefix=self.prefix)


@pytest.fixture
def engine() -> ToyEngine:
    return ToyEngine()


@pytest.fixture
def reference_gate(engine: ToyEngine):
    gate = kvgate.Gate(kvgate.Config(admission_mode="reference", wait_poll_sec=30, idle_grace_sec=60), engine.probes())
    yield gate
    gate.close()


#: The engine of the working-set tests: 1000 tokens in blocks of 16,
#: prefilled at 4000 tokens/s (a window of 0.25 s).
WORKING_SET_CAPACITY = kvgate.Capacity(tokens=1000, block_tokens=16, prefill_tokens_per_sec=4000.0)


def working_set_gate(engine: ToyEngine) -> kvgate.Gate:
    """A working-set gate over `engine`, told WORKING_SET_CAPACITY and 50%
    usage, polling every 30 s (a waiter wakes by hand-over, not by poll)."""
    engine.capacity_value = WORKING_SET_CAPACITY
    engine.usage_value = 0.5
    return kvgate.Gate(kvgate.Config(wait_poll_sec=30), engine.probes())


def run(coro, patience: float = PATIENCE):
    """asyncio.run with a bound: a hang fails the test."""

    async def bounded():
        return await asyncio.wait_for(coro, patience)

    return asyncio.run(bounded())


async def until(what: str, cond, patience: float = PATIENCE) -> None:
    """Yields to the loop until cond() holds."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + patience
    while not cond():
        if loop.time() > deadline:
            raise AssertionError(f"timed out waiting until {what}")
        await asyncio.sleep(0.001)
