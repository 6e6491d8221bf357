"""THE single place where the vLLM side feeds measurements back into kvgate.

Working-set admission (the library default) needs, from the engine: its KV
capacity in tokens (num_gpu_blocks x block_size, the `kvgate_capacity`
utility method), which the gate's capacity probe answers (`capacity_of`), and,
for each finished turn, the engine's `num_cached_tokens` and output token
count, reported when the turn's lease is released (`release`:
`kvgate.Lease.release(cached_tokens, output_tokens)`, i.e.
`kvgate_release_with_report`). Both the benchmark harness
(bench/real_engine.py) and the in-server gate (kvgate_vllm.serve) call only
these functions.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Optional

import kvgate


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


def capacity_of(answer: Optional[dict[str, Any]]) -> Optional[kvgate.Capacity]:
    """What the capacity probe answers, from the engine's `kvgate_capacity`
    answer (None: unknown)."""
    if not answer:
        return None
    return kvgate.Capacity(
        int(answer["capacity_tokens"]), int(answer["block_size"]), float(answer.get("prefill_tokens_per_sec", 0.0))
    )


def release(lease: kvgate.Lease, turn: Optional[TurnFigures]) -> bool:
    """Releases a turn's lease, with what the engine measured when it is known
    (None: the turn never finished on the engine, e.g. aborted or failed).
    True if this call released it (a second release is a no-op)."""
    if turn is None or not turn.finished_ok:
        return lease.release()
    return lease.release(cached_tokens=turn.cached_tokens, output_tokens=turn.output_tokens)
