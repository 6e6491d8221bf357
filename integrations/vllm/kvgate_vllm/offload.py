"""The engine's host tier (KV offloading), as the capacity probe answers it.

vLLM can keep a copy of KV blocks in host memory and copy them back instead of
recomputing them: `--kv-offloading-size GiB --kv-offloading-backend native`
(the OffloadingConnector with its CPUOffloadingSpec, or the
SimpleCPUOffloadConnector under VLLM_USE_SIMPLE_KV_OFFLOAD=1), `lmcache`, or an
explicit `--kv-transfer-config`. `tier_answer(core)` reads what the engine was
configured with and answers, in the `kvgate_capacity` dict:

- `tier_tokens`: the tier's size in tokens of KV, 0 when there is none (or it
  cannot be read: a log line says why). For the native connector it is the
  connector's own arithmetic (CPUOffloadingSpec, vLLM 0.32): the host bytes
  (`kv_connector_extra_config["cpu_bytes_to_use"]`, which
  `--kv-offloading-size` sets) over the bytes of one offloaded chunk
  (`blocks_per_chunk` blocks of KV of every worker, rounded up to the region's
  alignment), times the tokens of a chunk.
- `kv_bytes_per_token`: the model's KV bytes per token across all workers,
  from the engine's KV cache (its tensors' size per block, or the groups' page
  sizes), as vLLM's `build_offloading_config` derives it, never a constant.
- `reload_tokens_per_sec`: the host-to-device rate in tokens/s. vLLM 0.32
  measures its transfers only as Prometheus counters of the API server
  (`vllm:kv_offload_load_bytes`, `vllm:kv_offload_load_time`), not in the
  engine core, so the probe answers the configured KVGATE_VLLM_RELOAD_GBPS
  (default 55.5 GB/s, kvgate_vllm.knobs) over the KV bytes per token.
- `tier_bytes`, `tier_backend`: what was read, for logs and tests.

The answer is worked out once per engine core (its configuration does not
change) and kept on it. The API server checks it before the gate sees it
(kvgate_vllm.feedback.accept).

On the CPU build of vLLM 0.32 the native connector cannot run (its worker side
is CUDA/XPU only, docs/vllm.md "Host tier"); the probe still reads the
configuration, which is what the tests check against vLLM's own spec.
"""

from __future__ import annotations

import logging
import os
from typing import Any, Optional

from . import knobs

logger = logging.getLogger("kvgate_vllm.offload")

NATIVE_CONNECTOR = "OffloadingConnector"
SIMPLE_CONNECTOR = "SimpleCPUOffloadConnector"
LMCACHE_CONNECTOR = "LMCacheConnectorV1"
LMCACHE_MP_CONNECTOR = "LMCacheMPConnector"

#: LMCache's local CPU cache size, GiB (its `max_local_cpu_size`), as an
#: environment variable of the engine and as a connector extra config key.
LMCACHE_SIZE_ENV = "LMCACHE_MAX_LOCAL_CPU_SIZE"
LMCACHE_SIZE_KEY = "lmcache.max_local_cpu_size"

_ANSWER = "_kvgate_tier_answer"

NO_TIER: dict[str, Any] = {
    "tier_tokens": 0,
    "tier_bytes": 0,
    "kv_bytes_per_token": 0.0,
    "reload_tokens_per_sec": 0.0,
    "tier_backend": None,
}


def tier_answer(core: Any) -> dict[str, Any]:
    """The tier part of `kvgate_capacity`'s answer for an engine core, worked
    out on first use and kept on the core."""
    answer = core.__dict__.get(_ANSWER)
    if answer is None:
        answer = core.__dict__[_ANSWER] = tier_of(core.vllm_config, core.scheduler.kv_cache_config)
    return dict(answer)


def tier_of(vllm_config: Any, kv_cache_config: Any, env: Optional[dict[str, str]] = None) -> dict[str, Any]:
    """The host tier of an engine configured with `vllm_config`, whose KV
    cache is `kv_cache_config` (the scheduler's), as `tier_answer` answers it.
    Never raises: what cannot be read is no tier, with a log line."""
    env = dict(os.environ) if env is None else env
    try:
        return _tier_of(vllm_config, kv_cache_config, env)
    except Exception as e:  # a vLLM whose config moved: no tier, said once
        logger.warning("kvgate: the host tier could not be read (%s: %s): no tier told", type(e).__name__, e)
        return dict(NO_TIER)


def kv_block_bytes(vllm_config: Any, kv_cache_config: Any) -> tuple[int, int]:
    """(KV bytes of one block across all workers, tokens per block), as
    vLLM's `build_offloading_config` derives the per-worker figure (the
    cache tensor's size per block, else the prefix-cacheable groups' pages
    times their layers) and CPUOffloadingSpec multiplies it by the workers."""
    groups = list(kv_cache_config.kv_cache_groups)
    ids = getattr(kv_cache_config, "prefix_cacheable_group_ids", None)
    selected = [groups[i] for i in ids] if ids is not None else groups
    if not selected:
        raise ValueError("no prefix-cacheable KV cache group")
    block_sizes = {int(g.kv_cache_spec.block_size) for g in selected}
    if len(block_sizes) != 1:
        raise ValueError(f"KV cache groups of different block sizes {sorted(block_sizes)}")
    tensors = getattr(kv_cache_config, "kv_cache_tensors", None)
    if getattr(kv_cache_config, "hisparse_host_num_blocks", None) is None and kv_cache_config.num_blocks > 0 and tensors:
        worker = int(tensors[0].size) // int(kv_cache_config.num_blocks)
    else:
        worker = sum(_group_block_bytes(g) for g in selected)
    world = int(vllm_config.parallel_config.world_size)
    return worker * max(1, world), block_sizes.pop()


def _group_block_bytes(group: Any) -> int:
    spec = group.kv_cache_spec
    if type(spec).__name__ == "UniformTypeKVCacheSpecs":  # its page covers every layer already
        return int(spec.page_size_bytes)
    return int(spec.page_size_bytes) * len(group.layer_names)


def _tier_of(vllm_config: Any, kv_cache_config: Any, env: dict[str, str]) -> dict[str, Any]:
    ktc = vllm_config.kv_transfer_config
    connector = getattr(ktc, "kv_connector", None) if ktc is not None else None
    if connector is None:
        return dict(NO_TIER)
    extra = dict(getattr(ktc, "kv_connector_extra_config", None) or {})
    block_bytes, block_tokens = kv_block_bytes(vllm_config, kv_cache_config)
    if connector == NATIVE_CONNECTOR:
        backend = "native"
        tokens, tier_bytes = _native_tokens(extra, block_bytes, block_tokens)
    elif connector == SIMPLE_CONNECTOR:
        backend = "native-simple"
        tokens, tier_bytes = _simple_tokens(vllm_config, extra, block_bytes, block_tokens)
    elif connector in (LMCACHE_CONNECTOR, LMCACHE_MP_CONNECTOR):
        backend = "lmcache"
        tokens, tier_bytes = _lmcache_tokens(connector, extra, env, block_bytes, block_tokens)
    else:
        logger.info("kvgate: KV connector %s is not a host tier kvgate reads: no tier told", connector)
        return dict(NO_TIER)
    if tokens <= 0:
        return dict(NO_TIER)
    per_token = block_bytes / block_tokens
    gbps = knobs.reload_gbps(env)
    answer = {
        "tier_tokens": int(tokens),
        "tier_bytes": int(tier_bytes),
        "kv_bytes_per_token": per_token,
        "reload_tokens_per_sec": gbps * 1e9 / per_token,
        "tier_backend": backend,
    }
    logger.info(
        "kvgate: host tier (%s): %d tokens in %d bytes (%.0f KV bytes per token), reload %.3g tokens/s (%s=%g GB/s)",
        backend, answer["tier_tokens"], answer["tier_bytes"], per_token, answer["reload_tokens_per_sec"],
        knobs.RELOAD_GBPS_ENV, gbps,
    )
    return answer


def _chunk_alignment() -> int:
    try:
        from vllm.v1.kv_offload.cpu.spec import CPUOffloadingSpec

        return int(CPUOffloadingSpec.BLOCK_SIZE_ALIGNMENT)
    except (ImportError, AttributeError):  # vLLM 0.32's SharedOffloadRegion.BLOCK_SIZE_ALIGNMENT
        return 4096


def _native_tokens(extra: dict[str, Any], block_bytes: int, block_tokens: int) -> tuple[int, int]:
    spec = extra.get("spec_name", "CPUOffloadingSpec")
    if spec != "CPUOffloadingSpec":
        logger.info("kvgate: offloading spec %s is not one kvgate reads: no tier told", spec)
        return 0, 0
    cpu_bytes = extra.get("cpu_bytes_to_use")
    if not cpu_bytes:
        logger.info("kvgate: the offloading connector has no cpu_bytes_to_use: no tier told")
        return 0, 0
    blocks_per_chunk = 1
    if extra.get("blocks_per_chunk") is not None:
        blocks_per_chunk = int(extra["blocks_per_chunk"])
    elif extra.get("block_size") is not None:
        blocks_per_chunk = int(extra["block_size"]) // block_tokens
    if blocks_per_chunk <= 0:
        return 0, 0
    chunk = block_bytes * blocks_per_chunk
    align = _chunk_alignment()
    aligned = -(-chunk // align) * align
    chunks = int(cpu_bytes) // aligned
    return chunks * blocks_per_chunk * block_tokens, int(cpu_bytes)


def _simple_tokens(vllm_config: Any, extra: dict[str, Any], block_bytes: int, block_tokens: int) -> tuple[int, int]:
    if str(extra.get("kv_offload_backend", "cpu")) != "cpu":
        logger.info("kvgate: the simple offload connector stores to %s, not host memory: no tier told", extra["kv_offload_backend"])
        return 0, 0
    world = max(1, int(vllm_config.parallel_config.world_size))
    cpu_bytes = int(extra.get("cpu_bytes_to_use", 8 * (1 << 30)))  # the connector's own default, 8 GiB
    per_rank = int(extra.get("cpu_bytes_to_use_per_rank", cpu_bytes // world))
    worker_block = block_bytes // world
    if worker_block <= 0:
        return 0, 0
    return (per_rank // worker_block) * block_tokens, per_rank * world


def _lmcache_tokens(connector: str, extra: dict[str, Any], env: dict[str, str], block_bytes: int, block_tokens: int) -> tuple[int, int]:
    if connector == LMCACHE_MP_CONNECTOR:
        logger.info(
            "kvgate: LMCache runs as its own server (%s), which sizes its cache; "
            "--kv-offloading-size does not reach it: no tier told", connector,
        )
        return 0, 0
    raw = extra.get(LMCACHE_SIZE_KEY, env.get(LMCACHE_SIZE_ENV))
    if raw is None:
        logger.info(
            "kvgate: LMCache's max_local_cpu_size is set neither in kv_connector_extra_config (%s) nor in %s: no tier told",
            LMCACHE_SIZE_KEY, LMCACHE_SIZE_ENV,
        )
        return 0, 0
    try:
        gib = float(raw)
    except (TypeError, ValueError):
        logger.info("kvgate: LMCache's max_local_cpu_size %r is not a number: no tier told", raw)
        return 0, 0
    if not gib > 0.0 or gib == float("inf"):
        logger.info("kvgate: LMCache's max_local_cpu_size %r is not a size: no tier told", raw)
        return 0, 0
    tier_bytes = int(gib * (1 << 30))
    return (tier_bytes // block_bytes) * block_tokens, tier_bytes
