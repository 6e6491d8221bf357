"""Shared fixtures for the real-engine tests. Nothing here is skipped: a missing
engine (vllm not importable) is an error, never a skip (scripts/test-vllm.sh)."""

from __future__ import annotations

from typing import Any, Iterator

import pytest

from support.engine import make_engine


@pytest.fixture(scope="session")
def engine() -> Iterator[Any]:
    """One tiny in-process engine: 64 blocks of 32 tokens (2,048 tokens)."""
    eng = make_engine("tiny", num_blocks=64, max_model_len=2016)
    yield eng

