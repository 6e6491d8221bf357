"""The probes: side-effect-free engine-core utility methods.

`install()` adds these methods to vLLM's `EngineCore`, so they are reachable as
UTILITY calls (`engine_core.call_utility_async("kvgate_prefix", ...)`, served
on the engine-core busy loop between steps) and, in-process, as plain method
calls on the `EngineCore` object:

- `kvgate_usage()` -> float: the block pool's usage (`kv_cache_manager.usage`,
  the engine's own figure: blocks referenced by running requests).
- `kvgate_capacity()` -> dict: `num_gpu_blocks`, `block_size`, `capacity_tokens`
  (num_gpu_blocks x block_size), `usable_tokens` (minus the null block) and
  `prefill_tokens_per_sec` (the median prefill rate of the engine's recent
  mostly-prefill steps, 0 before any; kvgate_vllm.prefill_rate),
  `rebuild_secs_per_token` and `rebuild_secs_per_pair` (what re-prefilling a
  history costs, from the step costs fitted to the engine's recent steps, 0
  before a usable fit; kvgate_vllm.step_cost), `max_model_len` (the
  engine's longest sequence, `model_config.max_model_len`: no session's
  history outgrows it; 0 when the config does not say), and the
  host tier when the engine offloads KV (`tier_tokens`, 0 when none;
  `reload_tokens_per_sec`; `kv_bytes_per_token`, `tier_bytes`,
  `tier_backend`; kvgate_vllm.offload).
- `kvgate_prefix(prompt_ids, lora=None, cache_salt=None, session=None)` ->
  [hit_tokens, num_tokens]: the prefix the engine would reuse for this prompt
  now. Block hashes come from the engine's own `request_block_hasher` (its
  NONE_HASH seed, hash algorithm, LoRA and cache_salt extra keys) applied to a
  throwaway `Request`; the lookup is `coordinator.find_longest_cache_hit` with
  the engine's own `num_tokens - 1` limit, which touches no reference count, no
  free-queue order, no prefix-cache counter and emits no KV event. `lora` is
  `[lora_name, lora_int_id, lora_path]` (what the hasher keys on is the name and
  path). With `session` set, the session's hash chain is kept (bounded LRU) and
  only the blocks past the longest common prefix with its previous prompt are
  hashed.
- `kvgate_forget(session)`: drops a session's cached chain.

What to re-check when vLLM changes (docs/vllm.md): the Request
constructor and `request_block_hasher` (incremental over `block_hashes`),
`find_longest_cache_hit`'s return shape (3 values in 0.32, 2 before), and where
the scheduler keeps `kv_cache_manager`.
"""

from __future__ import annotations

import collections
from typing import Any, Optional, Sequence

from . import offload, prefill_rate, step_cost

#: Sessions whose hash chains are kept per engine (LRU beyond that).
MAX_CACHED_CHAINS = 4096

_PROBE_SAMPLING = None  # one SamplingParams shared by every throwaway Request


class _Chain:
    __slots__ = ("key", "tokens", "hashes")

    def __init__(self, key: tuple, tokens: list[int], hashes: list) -> None:
        self.key, self.tokens, self.hashes = key, tokens, hashes


def _sampling_params() -> Any:
    global _PROBE_SAMPLING
    if _PROBE_SAMPLING is None:
        from vllm import SamplingParams

        _PROBE_SAMPLING = SamplingParams(max_tokens=1)
    return _PROBE_SAMPLING


def _lora_request(lora: Optional[Sequence[Any]]) -> Any:
    if not lora:
        return None
    from vllm.lora.request import LoRARequest

    name, int_id, path = (list(lora) + [1, ""])[:3]
    return LoRARequest(lora_name=str(name), lora_int_id=int(int_id), lora_path=str(path))


def _common_prefix_len(a: list[int], b: list[int], limit: int) -> int:
    """Length of the common prefix of a and b, up to limit (fast path: equal slices)."""
    if a[:limit] == b[:limit]:
        return limit
    lo, hi = 0, limit
    while lo < hi:  # binary search on slice equality: O(n log n) in C, no Python loop per token
        mid = (lo + hi + 1) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


def block_hashes(core: Any, prompt: list[int], lora: Optional[Sequence[Any]], cache_salt: Optional[str], session: Optional[str]) -> list:
    """The engine's own block hashes of `prompt` (full blocks only)."""
    from vllm.v1.request import Request

    hasher = core.request_block_hasher
    if hasher is None:
        return []
    lora_req = _lora_request(lora)
    req = Request(
        request_id="kvgate-probe",
        prompt_token_ids=prompt,
        sampling_params=_sampling_params(),
        pooling_params=None,
        lora_request=lora_req,
        cache_salt=cache_salt,
        block_hasher=None,  # hashed below, possibly from a cached chain
    )
    chain: Optional[_Chain] = None
    key = (tuple(lora) if lora else None, cache_salt)
    chains: Optional[collections.OrderedDict] = None
    if session is not None:
        chains = core.__dict__.setdefault("_kvgate_chains", collections.OrderedDict())
        chain = chains.get(session)
        if chain is not None and chain.key == key:
            bs = _hash_block_size(core)
            reusable = min(len(chain.hashes), len(prompt) // bs)
            same = _common_prefix_len(chain.tokens, prompt, reusable * bs) // bs
            req.block_hashes = list(chain.hashes[:same])
    req.block_hashes.extend(hasher(req))
    if chains is not None and session is not None:
        chains[session] = _Chain(key, prompt, req.block_hashes)
        chains.move_to_end(session)
        while len(chains) > MAX_CACHED_CHAINS:
            chains.popitem(last=False)
    return req.block_hashes


def _hash_block_size(core: Any) -> int:
    return core.scheduler.kv_cache_manager.block_pool.hash_block_size


def _kv_manager(core: Any) -> Any:
    return core.scheduler.kv_cache_manager


def kvgate_usage(self: Any) -> float:
    return float(_kv_manager(self).usage)


def kvgate_capacity(self: Any) -> dict[str, Any]:
    pool = _kv_manager(self).block_pool
    block_size = int(self.vllm_config.cache_config.block_size)
    per_token, per_pair = step_cost.published(self)
    return {
        "num_gpu_blocks": int(pool.num_gpu_blocks),
        "block_size": block_size,
        "capacity_tokens": int(pool.num_gpu_blocks) * block_size,
        "usable_tokens": (int(pool.num_gpu_blocks) - 1) * block_size,
        "prefill_tokens_per_sec": prefill_rate.typical_rate(self),
        "rebuild_secs_per_token": per_token,
        "rebuild_secs_per_pair": per_pair,
        "max_model_len": _max_model_len(self),
        **offload.tier_answer(self),
    }


def _max_model_len(core: Any) -> int:
    """vLLM's `model_config.max_model_len` (0: not configured)."""
    model = getattr(core.vllm_config, "model_config", None)
    return int(getattr(model, "max_model_len", 0) or 0)


def kvgate_prefix(
    self: Any,
    prompt_ids: Sequence[int],
    lora: Optional[Sequence[Any]] = None,
    cache_salt: Optional[str] = None,
    session: Optional[str] = None,
) -> list[int]:
    prompt = list(prompt_ids)
    if not prompt:
        return [0, 0]
    manager = _kv_manager(self)
    if not manager.enable_caching:
        return [0, len(prompt)]
    hashes = block_hashes(self, prompt, lora, cache_salt, session)
    found = manager.coordinator.find_longest_cache_hit(hashes, len(prompt) - 1)
    hit_tokens = int(found[1])  # (blocks, hit_tokens, ...) since 0.32; (blocks, hit_tokens) before
    return [hit_tokens, len(prompt)]


def kvgate_forget(self: Any, session: str) -> bool:
    chains = self.__dict__.get("_kvgate_chains")
    return bool(chains) and chains.pop(session, None) is not None


PROBE_METHODS = {
    "kvgate_usage": kvgate_usage,
    "kvgate_capacity": kvgate_capacity,
    "kvgate_prefix": kvgate_prefix,
    "kvgate_forget": kvgate_forget,
}


def install() -> None:
    """Adds the probe methods to EngineCore (idempotent)."""
    from vllm.v1.engine.core import EngineCore

    for name, fn in PROBE_METHODS.items():
        if getattr(EngineCore, name, None) is not fn:
            setattr(EngineCore, name, fn)
    prefill_rate.install()


def chain_len(core: Any, session: str) -> int:
    chains = core.__dict__.get("_kvgate_chains") or {}
    chain = chains.get(session)
    return len(chain.hashes) if chain else 0

