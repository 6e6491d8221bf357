"""THE single place where the vLLM side feeds measurements back into kvgate.

Issue 12 (working-set admission) needs, from the engine: its KV capacity in
tokens (num_gpu_blocks x block_size, the `kvgate_capacity` probe) and, for each
finished turn, the engine's `num_cached_tokens` with the prompt and output token
counts. Both the benchmark harness (bench/real_engine.py) and the in-server gate
(kvgate_vllm.serve) call only these two functions; they collect the figures
today and pass them on once the C ABI has calls for them. To wire them: replace
the two marked lines below (and add the functions to ffi.SIGNATURES so the
header test checks them).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Optional

from .ffi import Gate


@dataclasses.dataclass(frozen=True)
class TurnFigures:
    """What the engine measured for one finished turn (a RequestOutput)."""

    prompt_tokens: int
    cached_tokens: int  # RequestOutput.num_cached_tokens
    output_tokens: int
    finished_ok: bool = True  # False: failed or aborted


def figures_of(output: Any, ok: bool = True) -> TurnFigures:
    """TurnFigures from a vLLM RequestOutput."""
    prompt = len(output.prompt_token_ids or [])
    generated = sum(len(c.token_ids) for c in output.outputs)
    return TurnFigures(prompt, int(output.num_cached_tokens or 0), generated, ok)


def report_capacity(gate: Gate, capacity: dict[str, int]) -> None:
    """Called once per gate with the `kvgate_capacity` probe's answer."""
    # ISSUE-12: kvgate_config/gate call for the capacity (capacity["capacity_tokens"]) goes here.
    _ = (gate, capacity)


def release(gate: Gate, lease: int, turn: Optional[TurnFigures]) -> bool:
    """Releases a turn's lease, with what the engine measured when it is known
    (None: the turn never reached the engine, e.g. cancelled before it ran)."""
    # ISSUE-12: a release carrying `turn` (prompt, cached, output tokens) replaces this call.
    return gate.release(lease)
