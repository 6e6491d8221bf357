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

The rebuild cost: the capacity answer carries `rebuild_secs_per_token`
and `rebuild_secs_per_pair`, fitted to the engine's own steps
(kvgate_vllm.step_cost, 0 before a usable fit). `tell_rebuild_cost` tells
the gate each new one (`kvgate.Gate.set_rebuild_cost`); one the gate
refuses is a logged warning, and the gate keeps the cost it had.

The host tier (an engine that offloads KV to host memory, kvgate_vllm.offload):
the capacity answer carries `tier_tokens` and `reload_tokens_per_sec`, which
`accept` checks against the answer known before. The gate refuses (ValueError
from the acquire) a tier smaller than the GPU cache, a reload rate that is not
finite and positive, and a tier that is gone after it was told; here such an
answer is a logged warning that keeps the previous answer (or, with none, this
one without its tier), so nothing reaches the request path and the gate never
counts on a tier that is not there. A turn's tier hits are the tokens of its
cached prefix the engine loaded through its KV connector
(`PrefillStats.num_external_cached_tokens` of the engine-core output, which
vLLM 0.32 keeps off the RequestOutput: `install()` carries it there as
`kvgate_external_cached_tokens`), released as `tier_cached_tokens`, never more
than the cached tokens.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import math
from typing import Any, NamedTuple, Optional, Union

import kvgate

logger = logging.getLogger("kvgate_vllm.feedback")

#: The RequestOutput attribute `install()` sets: the prompt tokens the engine
#: loaded through its KV connector when the request was first scheduled.
EXTERNAL_ATTR = "kvgate_external_cached_tokens"
_STATE_ATTR = "_kvgate_external_cached_tokens"


class EngineAnswer(NamedTuple):
    """An engine's `kvgate_capacity` answer as the gate's capacity probe
    reads it. The tier figures stay as the engine sent them until `accept`
    has checked them (0: no tier)."""

    tokens: int
    block_tokens: int
    prefill_tokens_per_sec: float
    tier_tokens: float = 0
    reload_tokens_per_sec: float = 0.0
    # The engine's rebuild cost (kvgate_vllm.step_cost), as it sent it (0, 0:
    # none yet); checked by the gate when told (`tell_rebuild_cost`).
    rebuild_secs_per_token: float = 0.0
    rebuild_secs_per_pair: float = 0.0
    # vLLM's model_config.max_model_len (0: not sent, an older engine side).
    max_model_len: int = 0

    @property
    def has_tier(self) -> bool:
        return self.tier_tokens > 0

    @property
    def rebuild_cost(self) -> Optional[tuple[float, float]]:
        """(secs_per_token, secs_per_pair) when the answer carries a cost
        (either term not 0, NaN included: the gate judges it), else None."""
        cost = (self.rebuild_secs_per_token, self.rebuild_secs_per_pair)
        return None if cost == (0.0, 0.0) else cost


def answer_of(answer: Optional[dict[str, Any]]) -> Optional[EngineAnswer]:
    """The EngineAnswer of a `kvgate_capacity` answer (None: unknown)."""
    if not answer:
        return None
    return EngineAnswer(
        int(answer["capacity_tokens"]),
        int(answer["block_size"]),
        float(answer.get("prefill_tokens_per_sec", 0.0)),
        _number(answer.get("tier_tokens", 0)),
        _number(answer.get("reload_tokens_per_sec", 0.0)),
        _number(answer.get("rebuild_secs_per_token", 0.0)),
        _number(answer.get("rebuild_secs_per_pair", 0.0)),
        _count(answer.get("max_model_len", 0)),
    )


def _count(value: Any) -> int:
    """A whole number > 0 as sent, else 0 (not known: never told)."""
    try:
        count = int(value)
    except (TypeError, ValueError, OverflowError):
        return 0
    return count if count > 0 else 0


def _number(value: Any) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        return math.nan  # refused by tier_problem


def tier_problem(new: EngineAnswer, known: Optional[EngineAnswer]) -> Optional[str]:
    """Why the gate would refuse `new`'s tier after `known` (None: it would not)."""
    tier, rate = new.tier_tokens, new.reload_tokens_per_sec
    if not math.isfinite(tier) or tier < 0:
        return f"a tier of {tier!r} tokens is not a size"
    if tier > 0:
        if tier < new.tokens:
            return f"a tier of {tier:.0f} tokens is smaller than the GPU cache ({new.tokens} tokens)"
        if not math.isfinite(rate) or rate <= 0.0:
            return f"a reload rate of {rate!r} tokens/s is not finite and positive"
        return None
    if known is not None and known.has_tier:
        return f"the tier of {known.tier_tokens:.0f} tokens the engine told before is gone"
    return None


def accept(
    new: Optional[EngineAnswer], known: Optional[EngineAnswer], engine: Any = 0
) -> tuple[Optional[EngineAnswer], Optional[str]]:
    """(the answer to keep, why `new` was refused or None). A refused answer
    keeps `known`, or, when nothing is known yet, is kept without its tier:
    the gate then counts on the GPU cache alone. Logs a warning per refusal."""
    if new is None:
        return known, None
    problem = tier_problem(new, known)
    if problem is None:
        return new, None
    if known is not None:
        logger.warning("kvgate: engine %s's capacity answer refused (%s): the previous answer is kept", engine, problem)
        return known, problem
    logger.warning("kvgate: engine %s's capacity answer refused (%s): its GPU cache is kept, without a tier", engine, problem)
    return new._replace(tier_tokens=0, reload_tokens_per_sec=0.0), problem


def tell_rebuild_cost(
    gate: kvgate.Gate, answer: Optional[EngineAnswer], seen: Optional[tuple[float, float]], engine: Any = 0
) -> Optional[tuple[float, float]]:
    """Tells `gate` the rebuild cost an accepted answer carries, when it
    carries one other than `seen` (the last one this engine's answers carried,
    told or refused; None at first); returns the one seen now. A cost the gate
    refuses (kvgate.InvalidArgument: a term not finite, a per-token term not
    > 0, a negative per-pair term) is a logged warning, once per cost, and the
    gate keeps the cost it had."""
    cost = answer.rebuild_cost if answer is not None else None
    if cost is None or (seen is not None and [float(x).hex() for x in cost] == [float(x).hex() for x in seen]):
        return seen  # none carried, or the one seen (compared by bits: NaN is the same NaN)
    try:
        gate.set_rebuild_cost(*cost)
    except kvgate.InvalidArgument as e:
        logger.warning("kvgate: engine %s's rebuild cost %r refused (%s): the gate keeps the cost it had", engine, cost, e)
    return cost


def to_capacity(answer: Optional[EngineAnswer]) -> Optional[kvgate.Capacity]:
    """The kvgate.Capacity of an accepted answer (None: unknown)."""
    if answer is None:
        return None
    return kvgate.Capacity(
        tokens=answer.tokens,
        block_tokens=answer.block_tokens,
        prefill_tokens_per_sec=answer.prefill_tokens_per_sec,
        tier_tokens=int(answer.tier_tokens) if answer.has_tier else 0,
        reload_tokens_per_sec=float(answer.reload_tokens_per_sec) if answer.has_tier else 0.0,
        max_model_len=answer.max_model_len or None,
    )


def capacity_of(answer: Union[None, dict[str, Any], EngineAnswer]) -> Optional[kvgate.Capacity]:
    """What the capacity probe answers, from the engine's `kvgate_capacity`
    answer (None: unknown), with nothing known before it (`accept`)."""
    parsed = answer if isinstance(answer, EngineAnswer) else answer_of(answer)
    return to_capacity(accept(parsed, None)[0])


@dataclasses.dataclass(frozen=True)
class TurnFigures:
    """What the engine measured for one finished turn (a RequestOutput)."""

    prompt_tokens: int
    cached_tokens: int  # RequestOutput.num_cached_tokens
    output_tokens: int
    finished_ok: bool = True  # False: failed or aborted
    # Of cached_tokens, those the host tier served (None: unknown, or no tier)
    tier_cached_tokens: Optional[int] = None


def figures_of(output: Any, ok: bool = True, tier: bool = False) -> TurnFigures:
    """TurnFigures from a vLLM RequestOutput. With `tier` (the engine told a
    host tier), the tokens its connector loaded are the turn's tier hits."""
    prompt = len(output.prompt_token_ids or [])
    generated = sum(len(c.token_ids) for c in output.outputs)
    external = getattr(output, EXTERNAL_ATTR, None) if tier else None
    return TurnFigures(
        prompt, int(output.num_cached_tokens or 0), generated, ok, None if external is None else int(external)
    )


def tier_hits(turn: Optional[TurnFigures]) -> Optional[int]:
    """The turn's tier hits as released: never more than its cached tokens
    (a larger figure is clamped, with a warning), None when unknown."""
    if turn is None or not turn.finished_ok or turn.tier_cached_tokens is None:
        return None
    hits = turn.tier_cached_tokens
    if hits < 0:
        logger.warning("kvgate: %d tier-cached tokens reported: dropped", hits)
        return None
    if hits > turn.cached_tokens:
        logger.warning(
            "kvgate: %d tier-cached tokens reported of %d cached: clamped to the cached tokens", hits, turn.cached_tokens
        )
        return turn.cached_tokens
    return hits


def release(lease: kvgate.Lease, turn: Optional[TurnFigures]) -> bool:
    """Releases a turn's lease, with what the engine measured when it is known
    (None: the turn never finished on the engine, e.g. aborted or failed).
    True if this call released it (a second release is a no-op)."""
    if turn is None or not turn.finished_ok:
        return lease.release()
    hits = tier_hits(turn)
    if hits is not None:
        try:
            return lease.release(
                cached_tokens=turn.cached_tokens, output_tokens=turn.output_tokens, tier_cached_tokens=hits
            )
        except ValueError as e:  # refused: the lease is still held, released without the tier below
            logger.warning("kvgate: the gate refused the turn's tier hits (%s): released without them", e)
    return lease.release(cached_tokens=turn.cached_tokens, output_tokens=turn.output_tokens)


def _recording(process_outputs: Any) -> Any:
    if getattr(process_outputs, "_kvgate", False):
        return process_outputs

    @functools.wraps(process_outputs)
    def recording(self: Any, engine_core_outputs: Any, *args: Any, **kwargs: Any) -> Any:
        states = self.request_states
        for out in engine_core_outputs:
            stats = getattr(out, "prefill_stats", None)
            if stats is None:
                continue
            state = states.get(out.request_id)
            # As the processor takes num_cached_tokens: at the first prefill output.
            if state is not None and state.is_prefilling and _STATE_ATTR not in state.__dict__:
                state.__dict__[_STATE_ATTR] = int(stats.num_external_cached_tokens)
        return process_outputs(self, engine_core_outputs, *args, **kwargs)

    recording._kvgate = True  # type: ignore[attr-defined]
    return recording


def _carrying(make_request_output: Any) -> Any:
    if getattr(make_request_output, "_kvgate", False):
        return make_request_output

    @functools.wraps(make_request_output)
    def carrying(self: Any, *args: Any, **kwargs: Any) -> Any:
        out = make_request_output(self, *args, **kwargs)
        external = self.__dict__.get(_STATE_ATTR)
        if out is not None and external is not None:
            setattr(out, EXTERNAL_ATTR, external)
        return out

    carrying._kvgate = True  # type: ignore[attr-defined]
    return carrying


def install() -> None:
    """Carries each request's connector-loaded prompt tokens onto its
    RequestOutputs (`EXTERNAL_ATTR`), in the process whose OutputProcessor
    makes them (the API server, an in-process LLMEngine). Idempotent; a
    vLLM without the hooks leaves the tier hits unknown, with a log line."""
    try:
        from vllm.v1.engine.output_processor import OutputProcessor, RequestState
    except ImportError as e:
        logger.info("kvgate: no OutputProcessor (%s): tier hits stay unknown", e)
        return
    OutputProcessor.process_outputs = _recording(OutputProcessor.process_outputs)
    RequestState.make_request_output = _carrying(RequestState.make_request_output)
