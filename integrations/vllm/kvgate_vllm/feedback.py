"""THE single place where the vLLM side feeds measurements back into kvgate.

Working-set admission (the library default) needs, from the engine: its KV
capacity in tokens (num_gpu_blocks x block_size, the `kvgate_capacity` probe),
answered by the gate's capacity probe, and, for each finished turn, the
engine's `num_cached_tokens` and output token count, reported at release
(`kvgate_release_with_report`). Both the benchmark harness
(bench/real_engine.py) and the in-server gate (kvgate_vllm.serve) call only
these two functions.
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
    gate.set_capacity(
        capacity["capacity_tokens"], capacity["block_size"], float(capacity.get("prefill_tokens_per_sec", 0.0))
    )


def release(gate: Gate, lease: int, turn: Optional[TurnFigures]) -> bool:
    """Releases a turn's lease, with what the engine measured when it is known
    (None: the turn never reached the engine, e.g. cancelled before it ran)."""
    if turn is None or not turn.finished_ok:
        return gate.release(lease)
    return gate.release_with_report(lease, turn.cached_tokens, turn.output_tokens)
