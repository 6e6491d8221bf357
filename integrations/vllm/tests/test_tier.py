"""The host tier (vLLM's KV offloading): what the capacity probe reads of it,
what the plugin does with a tier answer the gate would refuse, the turns' tier
hits, and the tier figures on /metrics.

The CPU build of vLLM 0.32 cannot run native offloading (its worker side is
CUDA/XPU only; `test_the_cpu_build_cannot_run_native_offloading` pins that),
so the probe is checked on real vLLM configurations with offloading against
vLLM's own offloading spec, over the real engine's KV cache."""

from __future__ import annotations

import asyncio
import json
import logging
import math
import pathlib
import random
import subprocess
import sys
import textwrap
from types import SimpleNamespace
from typing import Any

import kvgate
import pytest

from kvgate_vllm import feedback, knobs, offload, probes, serve
from support import models
from support.engine import BLOCK_SIZE, core_of, random_prompt, run_to_completion, sampling

GPU_TOKENS = 64 * 32  # the session engine's cache (conftest)


# --- the knob -------------------------------------------------------------------------------


def test_the_reload_knob_is_a_positive_rate_and_a_typo_fails() -> None:
    assert knobs.reload_gbps({}) == 55.5
    assert knobs.reload_gbps({knobs.RELOAD_GBPS_ENV: " "}) == 55.5
    assert knobs.reload_gbps({knobs.RELOAD_GBPS_ENV: "12.5"}) == 12.5
    for bad in ("0", "-3", "inf", "nan", "fast", "55.5GB"):
        with pytest.raises(ValueError, match="KVGATE_VLLM_RELOAD_GBPS"):
            knobs.reload_gbps({knobs.RELOAD_GBPS_ENV: bad})


# --- the probe, on real vLLM configurations ------------------------------------------------


def offload_config(**kw: Any) -> Any:
    """A real VllmConfig of the session engine's model and cache, with the
    offloading arguments `kw` (what `vllm serve` makes of its flags)."""
    from vllm import EngineArgs

    args = EngineArgs(
        model=str(models.make_model("tiny")),
        skip_tokenizer_init=True,
        enable_prefix_caching=True,
        block_size=BLOCK_SIZE,
        num_gpu_blocks_override=64,
        max_model_len=2016,
        enforce_eager=True,
        **kw,
    )
    return args.create_engine_config()


def kv_bytes_per_token_of_the_model() -> int:
    """K and V, per layer, per KV head, per head dimension, 2 bytes (bf16):
    from the model's own config.json, not from vLLM."""
    cfg = json.loads((models.make_model("tiny") / "config.json").read_text())
    return 2 * cfg["num_hidden_layers"] * cfg["num_key_value_heads"] * cfg["head_dim"] * 2


def vllms_own_tier_tokens(cfg: Any, kv_cache_config: Any) -> int:
    """The tokens vLLM's own OffloadingConnector would keep in host memory:
    its CPUOffloadingSpec's chunks times the tokens of a chunk."""
    from vllm.distributed.kv_transfer.kv_connector.v1.offloading.config import build_offloading_config
    from vllm.v1.kv_offload.factory import OffloadingSpecFactory

    oc = build_offloading_config(cfg, kv_cache_config)
    spec = OffloadingSpecFactory.create_spec(oc)
    assert spec.get_manager()._num_chunks == spec.num_chunks  # the scheduler-side manager's pool
    return spec.num_chunks * spec.blocks_per_chunk * oc.groups[0].tokens_per_block


@pytest.mark.parametrize(
    "kw",
    [
        {"kv_offloading_size": 0.01},
        {"kv_offloading_size": 0.5},
        {"kv_offloading_size": 0.0123},  # not a whole number of chunks
    ],
    ids=["10MiB", "512MiB", "odd"],
)
def test_the_capacity_probe_answers_the_native_tier_vllm_would_keep(engine: Any, kw: dict) -> None:
    core = core_of(engine)
    cfg = offload_config(kv_offloading_backend="native", **kw)
    assert cfg.kv_transfer_config.kv_connector == "OffloadingConnector"
    kcc = core.scheduler.kv_cache_config
    # The probe itself, on the engine core as it would be with this config.
    proxy = SimpleNamespace(vllm_config=cfg, scheduler=core.scheduler)
    answer = probes.kvgate_capacity(proxy)
    assert answer["capacity_tokens"] == GPU_TOKENS
    assert answer["tier_backend"] == "native"
    assert answer["tier_bytes"] == int(kw["kv_offloading_size"] * (1 << 30))
    assert answer["kv_bytes_per_token"] == kv_bytes_per_token_of_the_model() == 512
    assert answer["tier_tokens"] == vllms_own_tier_tokens(cfg, kcc)
    assert answer["tier_tokens"] % BLOCK_SIZE == 0
    assert answer["tier_tokens"] == pytest.approx(answer["tier_bytes"] / 512, abs=BLOCK_SIZE)
    assert answer["reload_tokens_per_sec"] == pytest.approx(55.5e9 / 512)
    # What the gate is told of it.
    assert answer["max_model_len"] == cfg.model_config.max_model_len
    told = feedback.accept(feedback.answer_of(answer), None)
    want = feedback.EngineAnswer(
        GPU_TOKENS,
        32,
        answer["prefill_tokens_per_sec"],
        answer["tier_tokens"],
        55.5e9 / 512,
        max_model_len=cfg.model_config.max_model_len,
    )
    assert told == (want, None)


def test_chunks_of_several_blocks_and_an_explicit_transfer_config(engine: Any) -> None:
    """`--kv-transfer-config` with the connector's own keys: cpu_bytes_to_use
    and blocks_per_chunk (each chunk aligned on its own)."""
    kcc = core_of(engine).scheduler.kv_cache_config
    cfg = offload_config(
        kv_transfer_config={
            "kv_connector": "OffloadingConnector",
            "kv_role": "kv_both",
            "kv_connector_extra_config": {"cpu_bytes_to_use": 3_000_000, "blocks_per_chunk": 3},
        }
    )
    tier = offload.tier_of(cfg, kcc, env={knobs.RELOAD_GBPS_ENV: "10"})
    assert tier["tier_tokens"] == vllms_own_tier_tokens(cfg, kcc)
    # 3 blocks of 16 KiB = 48 KiB a chunk, aligned: 61 chunks of 96 tokens
    assert tier["tier_tokens"] == (3_000_000 // (3 * 16384)) * 96
    assert tier["reload_tokens_per_sec"] == pytest.approx(10e9 / 512)


def test_an_engine_without_offloading_tells_no_tier(engine: Any) -> None:
    cap = core_of(engine).kvgate_capacity()
    assert cap["tier_tokens"] == 0 and cap["reload_tokens_per_sec"] == 0.0 and cap["tier_backend"] is None
    assert feedback.answer_of(cap).has_tier is False


def flags_config(size: float, backend: str, base: Any) -> Any:
    """What vLLM's own config code (VllmConfig._post_init_kv_transfer_config)
    makes of `--kv-offloading-size size --kv-offloading-backend backend`,
    with `base`'s parallel layout. (A whole VllmConfig with an LMCache
    connector cannot be built here: vLLM imports the connector, and lmcache
    is not installed.)"""
    from vllm.config import VllmConfig

    ns = SimpleNamespace(
        cache_config=SimpleNamespace(kv_offloading_size=size, kv_offloading_backend=backend),
        kv_transfer_config=None,
        parallel_config=base.parallel_config,
    )
    VllmConfig._post_init_kv_transfer_config(ns)  # type: ignore[arg-type]
    return ns


def lmcache_config(base: Any, extra: dict) -> Any:
    from vllm.config import KVTransferConfig

    ktc = KVTransferConfig(kv_connector="LMCacheConnectorV1", kv_role="kv_both", kv_connector_extra_config=extra)
    return SimpleNamespace(kv_transfer_config=ktc, parallel_config=base.parallel_config)


def test_lmcache_tells_what_its_config_says_or_no_tier(engine: Any, caplog: pytest.LogCaptureFixture) -> None:
    kcc = core_of(engine).scheduler.kv_cache_config
    base = core_of(engine).vllm_config
    # The native flags, through the same vLLM code: the tier as above.
    native = flags_config(0.01, "native", base)
    assert native.kv_transfer_config.kv_connector == "OffloadingConnector"
    assert offload.tier_of(native, kcc, env={})["tier_tokens"] == vllms_own_tier_tokens(offload_config(kv_offloading_size=0.01), kcc)
    # --kv-offloading-backend lmcache: vLLM 0.32 starts LMCache's server
    # connector, which sizes its own cache: the size flag never reaches it.
    cfg = flags_config(1.0, "lmcache", base)
    assert cfg.kv_transfer_config.kv_connector == "LMCacheMPConnector"
    assert "cpu_bytes_to_use" not in cfg.kv_transfer_config.kv_connector_extra_config
    with caplog.at_level(logging.INFO, logger="kvgate_vllm.offload"):
        assert offload.tier_of(cfg, kcc, env={}) == offload.NO_TIER
    assert "sizes its cache" in caplog.text
    # The in-process connector: its max_local_cpu_size (GiB), from the
    # connector's extra config or LMCache's environment variable.
    tier = offload.tier_of(lmcache_config(base, {offload.LMCACHE_SIZE_KEY: 0.25}), kcc, env={})
    assert (tier["tier_backend"], tier["tier_tokens"], tier["tier_bytes"]) == ("lmcache", (1 << 28) // 512, 1 << 28)
    cfg = lmcache_config(base, {})
    assert offload.tier_of(cfg, kcc, env={offload.LMCACHE_SIZE_ENV: "0.5"})["tier_tokens"] == (1 << 29) // 512
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="kvgate_vllm.offload"):
        assert offload.tier_of(cfg, kcc, env={}) == offload.NO_TIER
        assert offload.tier_of(cfg, kcc, env={offload.LMCACHE_SIZE_ENV: "lots"}) == offload.NO_TIER
    assert "set neither" in caplog.text and "not a number" in caplog.text


def test_the_cpu_build_cannot_run_native_offloading(tmp_path: pathlib.Path) -> None:
    """The blocker, pinned: vLLM 0.32's CPUOffloadingSpec.get_worker refuses
    any platform but CUDA-alike and XPU, when the engine registers its KV
    caches with the connector. When this fails, the CPU build runs offloading:
    test the gate on it for real (docs/vllm.md, "Host tier")."""
    script = textwrap.dedent(
        f"""
        import sys, traceback
        sys.path.insert(0, {str(pathlib.Path(__file__).resolve().parent)!r})
        from support.engine import make_engine
        try:
            make_engine("tiny", num_blocks=64, max_model_len=2016,
                        kv_offloading_size=0.01, kv_offloading_backend="native")
        except Exception as e:
            traceback.print_exc()
            print("FAILED:", type(e).__name__, e)
            sys.exit(3)
        print("RAN")
        """
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert "FAILED: Exception CPU Offloading is currently only supported on CUDA-alike and XPU GPUs" in done.stdout, (
        done.stdout[-2000:] + done.stderr[-4000:]
    )
    assert done.returncode == 3
    assert 'kv_offload/cpu/spec.py", line 200, in get_worker' in done.stderr, done.stderr[-4000:]


# --- answers the gate would refuse: warned, the previous one kept ----------------------------

GOOD = {"capacity_tokens": 2048, "block_size": 32, "prefill_tokens_per_sec": 1000.0, "tier_tokens": 20480, "reload_tokens_per_sec": 1e8}
BAD = {
    "smaller than the GPU cache": {"tier_tokens": 2016},
    "rate 0": {"reload_tokens_per_sec": 0.0},
    "negative rate": {"reload_tokens_per_sec": -5.0},
    "NaN rate": {"reload_tokens_per_sec": math.nan},
    "infinite rate": {"reload_tokens_per_sec": math.inf},
    "NaN tier": {"tier_tokens": math.nan},
    "negative tier": {"tier_tokens": -1},
    "gone": {"tier_tokens": 0, "reload_tokens_per_sec": 0.0},
}
WHY = {
    "smaller than the GPU cache": "smaller than the GPU cache",
    "rate 0": "not finite and positive",
    "negative rate": "not finite and positive",
    "NaN rate": "not finite and positive",
    "infinite rate": "not finite and positive",
    "NaN tier": "not a size",
    "negative tier": "not a size",
    "gone": "is gone",
}


def gates_answering(answers: list[dict], monkeypatch: pytest.MonkeyPatch) -> tuple[serve.Gates, list[float]]:
    """Gates whose engine answers `answers` in turn, one per refresh period."""
    it = iter(answers)

    async def utility(rank: int, method: str, *args: object) -> Any:
        if method == "kvgate_usage":
            return 0.0
        assert method == "kvgate_capacity"
        return next(it)

    gates = serve.Gates(SimpleNamespace(engine_core=SimpleNamespace()), knobs={})
    gates._utility = utility  # type: ignore[method-assign]
    now = [100.0]
    monkeypatch.setattr(serve.time, "monotonic", lambda: now[0])
    return gates, now


async def ask_each(gates: serve.Gates, now: list[float], n: int) -> list[Any]:
    """The capacity the probe answers after each of n answers."""
    seen = [await gates.capacity(0)]
    for _ in range(n - 1):
        now[0] += serve.CAPACITY_REFRESH_SEC
        await gates.capacity(0)  # stale: refresh started
        for _ in range(3):
            await asyncio.sleep(0)
        seen.append(await gates.capacity(0))
    return seen


@pytest.mark.parametrize("case", list(BAD))
def test_an_answer_the_gate_would_refuse_keeps_the_previous_one(
    case: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    bad = {**GOOD, **BAD[case], "prefill_tokens_per_sec": 2000.0}
    gates, now = gates_answering([GOOD, bad, GOOD], monkeypatch)
    with caplog.at_level(logging.WARNING, logger="kvgate_vllm.feedback"):
        caps = asyncio.run(ask_each(gates, now, 3))
    good = feedback.answer_of(GOOD)
    assert caps[0] == caps[1] == caps[2] == feedback.to_capacity(good)
    assert caps[1].prefill_tokens_per_sec == 1000.0  # the whole previous answer, not a mix
    assert gates.answers[0] == good and gates.has_tier(0)
    assert gates.tier_refused == {0: 1}
    refusals = [r for r in caplog.records if "refused" in r.getMessage()]
    assert [r.levelname for r in refusals] == ["WARNING"]
    assert WHY[case] in refusals[0].getMessage() and "previous answer is kept" in refusals[0].getMessage()


@pytest.mark.parametrize("case", [c for c in BAD if c != "gone"])
def test_a_first_answer_the_gate_would_refuse_is_kept_without_its_tier(case: str, caplog: pytest.LogCaptureFixture) -> None:
    bad = feedback.answer_of({**GOOD, **BAD[case]})
    with caplog.at_level(logging.WARNING, logger="kvgate_vllm.feedback"):
        kept, why = feedback.accept(bad, None)
    assert why is not None and WHY[case] in why
    assert kept == feedback.EngineAnswer(2048, 32, 1000.0, 0, 0.0) and not kept.has_tier
    assert "without a tier" in caplog.text
    assert feedback.capacity_of({**GOOD, **BAD[case]}) == kvgate.Capacity(2048, 32, 1000.0)


def test_a_tier_may_grow_and_a_fresher_answer_replaces_the_old() -> None:
    old = feedback.answer_of(GOOD)
    bigger = feedback.answer_of({**GOOD, "tier_tokens": 40960, "reload_tokens_per_sec": 2e8, "prefill_tokens_per_sec": 3000.0})
    assert feedback.accept(bigger, old) == (bigger, None)
    assert feedback.accept(None, old) == (old, None)  # no answer: nothing changes
    no_tier = feedback.answer_of({"capacity_tokens": 2048, "block_size": 32})
    assert feedback.accept(no_tier, None) == (no_tier, None) and feedback.accept(old, no_tier) == (old, None)
    # A rate without a tier says nothing.
    assert feedback.accept(no_tier._replace(reload_tokens_per_sec=-1.0), None)[1] is None


def test_a_bad_tier_never_reaches_the_request_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """A gate whose engine turns bad after a good answer admits and releases
    its turns as before: no exception out of the acquire. (With the tier
    package, the gate itself refuses such an answer with a ValueError from
    the acquire: the plugin must never hand it one.)"""
    answers = [GOOD] + [{**GOOD, **b} for b in BAD.values()]
    gates, now = gates_answering(answers, monkeypatch)

    async def capacity(session: bytes) -> Any:
        return await gates.capacity(0)

    async def scenario() -> None:
        gate = kvgate.Gate(gates.config, kvgate.Probes(usage=lambda s: 0.0, capacity=capacity))
        try:
            for i in range(len(answers)):
                if i:  # the engine's next answer, asked and taken
                    now[0] += serve.CAPACITY_REFRESH_SEC
                    await gates.capacity(0)
                    for _ in range(3):
                        await asyncio.sleep(0)
                lease = await gate.acquire(b"s", list(range(100 + i)), timeout=5)
                feedback.release(lease, feedback.TurnFigures(100 + i, 64, 4))
            assert gate.stats().working_set_capacity_tokens == 2048
        finally:
            gate.close()

    asyncio.run(scenario())
    assert gates.tier_refused == {0: len(BAD)}
    assert gates.answers[0] == feedback.answer_of(GOOD)


# --- tier hits --------------------------------------------------------------------------------


class RecordingLease:
    """A lease that records how it was released (and can refuse the tier)."""

    def __init__(self, refuse_tier: bool = False) -> None:
        self.calls: list[dict] = []
        self.refuse_tier = refuse_tier

    def release(self, **kw: Any) -> bool:
        self.calls.append(kw)
        if self.refuse_tier and "tier_cached_tokens" in kw:
            raise ValueError("refused")
        return True


def test_tier_hits_are_released_never_above_the_cached_tokens(caplog: pytest.LogCaptureFixture) -> None:
    for hits, want in [(32, 32), (64, 64), (96, 64), (0, 0)]:
        lease = RecordingLease()
        feedback.release(lease, feedback.TurnFigures(100, 64, 5, True, hits))  # type: ignore[arg-type]
        assert lease.calls == [{"cached_tokens": 64, "output_tokens": 5, "tier_cached_tokens": want}]
    assert "96 tier-cached tokens reported of 64 cached: clamped" in caplog.text
    for figures in (feedback.TurnFigures(100, 64, 5), feedback.TurnFigures(100, 64, 5, True, -1)):
        lease = RecordingLease()
        feedback.release(lease, figures)  # type: ignore[arg-type]
        assert lease.calls == [{"cached_tokens": 64, "output_tokens": 5}]
    # Refused by the gate (the lease stays held): released without them.
    lease = RecordingLease(refuse_tier=True)
    assert feedback.release(lease, feedback.TurnFigures(100, 64, 5, True, 32)) is True  # type: ignore[arg-type]
    assert lease.calls[1] == {"cached_tokens": 64, "output_tokens": 5}


def test_the_engine_cores_connector_tokens_reach_the_request_output(engine: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """What the engine core says a request loaded through its KV connector
    (`PrefillStats.num_external_cached_tokens`, 0 without a connector) is on
    its RequestOutput, and is its tier hits when the engine has a tier."""
    core = core_of(engine)
    rng = random.Random(21)
    prompt = random_prompt(rng, 300)
    engine.add_request("tier-1", {"prompt_token_ids": prompt}, sampling(3))
    first = run_to_completion(engine, {"tier-1"})["tier-1"]
    assert getattr(first, feedback.EXTERNAL_ATTR) == 0
    assert feedback.figures_of(first, tier=True).tier_cached_tokens == 0
    assert feedback.figures_of(first).tier_cached_tokens is None  # no tier: not the tier's
    # The engine core's figure is what the output carries: make the scheduler
    # say 64 of the cached tokens came through the connector (no connector
    # runs on the CPU build).
    update = core.scheduler.update_from_output

    def saying_external(*args: Any, **kw: Any) -> Any:
        outputs = update(*args, **kw)
        for eco in outputs.values():
            for o in eco.outputs:
                if o.prefill_stats is not None:
                    o.prefill_stats.num_external_cached_tokens = 64
        return outputs

    monkeypatch.setattr(core.scheduler, "update_from_output", saying_external)
    engine.add_request("tier-2", {"prompt_token_ids": prompt}, sampling(3))
    second = run_to_completion(engine, {"tier-2"})["tier-2"]
    assert second.num_cached_tokens == 288
    assert getattr(second, feedback.EXTERNAL_ATTR) == 64
    assert feedback.figures_of(second, tier=True) == feedback.TurnFigures(300, 288, 3, True, 64)


def test_a_turn_released_with_its_tier_hits_is_counted_by_the_gate() -> None:
    cap = feedback.to_capacity(feedback.answer_of(GOOD))
    assert (cap.tier_tokens, cap.reload_tokens_per_sec) == (20480, 1e8)

    async def scenario() -> Any:
        with kvgate.Gate(kvgate.Config(), kvgate.Probes(usage=lambda s: 0.0, capacity=lambda s: cap)) as gate:
            lease = await gate.acquire(b"s", list(range(300)))
            assert feedback.release(lease, feedback.TurnFigures(300, 256, 4, True, 96))
            lease = await gate.acquire(b"s", list(range(400)))
            assert feedback.release(lease, feedback.TurnFigures(400, 288, 4, True, 1000))  # clamped to 288
            return gate.stats()

    stats = asyncio.run(scenario())
    assert stats.working_set_tier_tokens == 20480
    assert stats.working_set_tier_cached_tokens == 96 + 288
    assert stats.working_set_refused_answers == 0


# --- /metrics ---------------------------------------------------------------------------------


def test_the_tier_figures_are_on_metrics(monkeypatch: pytest.MonkeyPatch) -> None:
    from prometheus_client import CollectorRegistry, generate_latest

    gates, now = gates_answering([GOOD, {**GOOD, "tier_tokens": 1}], monkeypatch)

    async def scenario() -> None:
        gate = gates.gate(0)
        await ask_each(gates, now, 2)
        # Turns released with their figures, as the front-end releases them.
        for prompt, figures in [
            (300, feedback.TurnFigures(300, 256, 4, True, 96)),
            (400, feedback.TurnFigures(400, 64, 4, True, 100)),  # clamped: 64
            (500, feedback.TurnFigures(500, 64, 4)),  # no tier figure
        ]:
            lease = await gate.acquire(b"s", list(range(prompt)))
            assert feedback.release(lease, figures)

    asyncio.run(scenario())
    monkeypatch.setattr(serve, "_gates", gates)
    registry = CollectorRegistry()
    registry.register(serve.KvgateCollector())  # type: ignore[arg-type]
    text = generate_latest(registry).decode()
    gates.gates[0].close()

    def value(name: str) -> float:
        for line in text.splitlines():
            if line.startswith(name + "{") and 'engine="0"' in line:
                return float(line.rsplit(" ", 1)[1])
        raise AssertionError(f"{name} not on /metrics:\n{text}")

    assert value("kvgate_tier_tokens") == 20480
    assert value("kvgate_tier_reload_tokens_per_second") == 1e8
    assert value("kvgate_tier_cached_tokens_total") == 96 + 64
    assert value("kvgate_tier_refused_answers_total") == 1
