"""The pure parts of the glue: policy specs, knob parsing, session ids, DP pinning."""

from __future__ import annotations

import dataclasses
import importlib.util
import math
import pathlib
import sys

import kvgate
import pytest

from kvgate_vllm import knobs, serve, step_cost

BENCH = pathlib.Path(__file__).resolve().parents[1] / "bench" / "real_engine.py"
spec = importlib.util.spec_from_file_location("real_engine", BENCH)
assert spec and spec.loader
real_engine = importlib.util.module_from_spec(spec)
sys.modules["real_engine"] = real_engine  # dataclasses look their module up
spec.loader.exec_module(real_engine)


def test_policy_specs_pass_knobs_through() -> None:
    got = real_engine.parse_policies("none,cap-3,kvgate:high_watermark=0.2,idle_grace_sec=1,kvgate,kvgate:mode=working_set")
    assert got == ["none", "cap-3", "kvgate:high_watermark=0.2,idle_grace_sec=1", "kvgate", "kvgate:mode=working_set"]
    assert real_engine.parse_knobs(got[2]) == {"high_watermark": 0.2, "idle_grace_sec": 1.0}
    assert real_engine.parse_knobs(got[4]) == {"mode": "working_set"}
    assert serve.parse_config("high_watermark=0.2, mode=working_set") == {"high_watermark": 0.2, "mode": "working_set"}


def test_each_step_records_the_simulator_s_regressors() -> None:
    """`--steps-csv` rows carry what `kvgate-sim --fit-steps` fits: prefill tokens,
    decode sequences, the context attention reads (computed tokens after the step)
    and the query-key pairs attended (n new tokens after c attend n*c + n*(n+1)/2)."""
    from types import SimpleNamespace as NS

    requests = {
        # a 256-token chunk after 1,024 computed prompt tokens (prompt 2,048)
        "a": NS(num_computed_tokens=1024 + 256, num_prompt_tokens=2048),
        # a decode after 600 computed tokens (prompt 500)
        "b": NS(num_computed_tokens=601, num_prompt_tokens=500),
    }
    out = NS(num_scheduled_tokens={"a": 256, "b": 1})
    # The bench's rows and the plugin's fit (kvgate_vllm.step_cost) share one computation.
    assert real_engine.step_cost.step_load is step_cost.step_load
    assert not hasattr(real_engine.EngineLoop, "_prefill_decode")
    pf, dc, npf, ndc, ctx, pairs = step_cost.step_load(out, requests)
    assert (pf, dc, npf, ndc) == (256, 1, 1, 1)
    assert ctx == 1280 + 601
    assert pairs == (256 * 1024 + 256 * 257 // 2) + 601
    assert step_cost.step_load(None, requests) == (0, 0, 0, 0, 0, 0)
    assert [f.name for f in real_engine.dataclasses.fields(real_engine.StepRow)][-2:] == ["context_tokens", "attn_pairs"]


def test_knobs_map_onto_the_package_config() -> None:
    cfg = knobs.config(serve.parse_config("admission_mode=reference,high_watermark=0.2,idle_grace_sec=1,wait_poll_sec=60"))
    assert cfg == kvgate.Config(admission_mode="reference", high_watermark=0.2, idle_grace_sec=1.0, wait_poll_sec=60.0)
    assert cfg.mode is kvgate.AdmissionMode.REFERENCE
    assert knobs.config({}) == kvgate.Config()  # the library's defaults (working set)
    assert knobs.config({}).mode is kvgate.AdmissionMode.WORKING_SET
    for bad in ("mode=working_set", "high_watermark=high", "admission_mode=fastest", "admission_mode=1"):
        with pytest.raises(ValueError):
            knobs.config(serve.parse_config(bad))
    with pytest.raises(ValueError, match="not knob=value"):
        serve.parse_config("high_watermark")


def test_the_refusal_knob_is_on_off_and_a_typo_fails() -> None:
    assert knobs.refuse_new({}) is False
    for on in ("1", "true", "Yes", " on "):
        assert knobs.refuse_new({knobs.REFUSE_NEW_ENV: on}) is True
    for off in ("", "0", "false", "NO", "off"):
        assert knobs.refuse_new({knobs.REFUSE_NEW_ENV: off}) is False
    with pytest.raises(ValueError, match="KVGATE_VLLM_REFUSE_NEW='429'"):
        knobs.refuse_new({knobs.REFUSE_NEW_ENV: "429"})


def test_retry_after_is_the_refill_window_rounded_up_to_whole_seconds() -> None:
    with kvgate.Gate(knobs.config({})) as gate:
        stats = gate.stats()
    assert serve.retry_after_sec(stats) == max(1, math.ceil(stats.working_set_window_sec))
    for window, want in ((0.0, 1), (0.2, 1), (1.0, 1), (1.01, 2), (7.5, 8)):  # never 0
        assert serve.retry_after_sec(dataclasses.replace(stats, working_set_window_sec=window)) == want
    assert serve.free_tokens(dataclasses.replace(stats, working_set_capacity_tokens=1000, working_set_tokens=300)) == 700
    assert serve.free_tokens(dataclasses.replace(stats, working_set_capacity_tokens=1000, working_set_tokens=1300)) == 0


def test_a_knob_the_library_refuses_is_refused_when_the_gate_is_made() -> None:
    with pytest.raises(kvgate.InvalidArgument):
        kvgate.Gate(knobs.config({"high_watermark": 7.0})).close()
    with kvgate.Gate(knobs.config({"admission_mode": "reference", "high_watermark": 0.5})) as gate:
        assert gate.config.mode is kvgate.AdmissionMode.REFERENCE


def test_session_ids_from_vllm_or_agent_headers() -> None:
    assert serve.session_of("from-vllm") == ("from-vllm", False)
    token = serve._headers.set({"x-dynamo-session-id": "d1", "x-dynamo-session-final": "true"})
    try:
        assert serve.session_of(None) == ("d1", True)
        assert serve.session_of("explicit") == ("explicit", True)
    finally:
        serve._headers.reset(token)
    assert serve.session_of(None) == (None, False)


def test_a_session_is_pinned_to_one_engine() -> None:
    ranks = {serve.engine_for(f"agent-{i}", 4) for i in range(200)}
    assert ranks == {0, 1, 2, 3}
    assert all(serve.engine_for("agent-7", 4) == serve.engine_for("agent-7", 4) for _ in range(10))


def test_the_capacity_answer_is_refreshed_for_the_engines_measured_rate(monkeypatch: pytest.MonkeyPatch) -> None:
    """The engine's prefill rate improves as it runs: `Gates.capacity` answers
    its cached answer at once and, once that is older than
    CAPACITY_REFRESH_SEC, asks the engine again in the background."""
    import asyncio

    answers = iter([1000.0, 5000.0, 9000.0])
    calls: list[str] = []

    async def utility(rank: int, method: str, *args: object) -> dict:
        calls.append(method)
        return {"capacity_tokens": 12800, "block_size": 32, "prefill_tokens_per_sec": next(answers)}

    gates = object.__new__(serve.Gates)
    gates.capacities, gates._capacity_asks = {}, {}
    gates.answers, gates.tier_refused = {}, {}
    gates.gates, gates.rebuild_seen = {}, {}
    gates._utility = utility  # the engine's UTILITY call (what is tested is the caching around it)
    now = [100.0]
    monkeypatch.setattr(serve.time, "monotonic", lambda: now[0])

    async def scenario() -> list[float]:
        rates = [(await gates.capacity(0)).prefill_tokens_per_sec]  # first: awaited
        rates.append((await gates.capacity(0)).prefill_tokens_per_sec)  # fresh: cached, no call
        now[0] += serve.CAPACITY_REFRESH_SEC
        rates.append((await gates.capacity(0)).prefill_tokens_per_sec)  # stale: cached, refresh started
        rates.append((await gates.capacity(0)).prefill_tokens_per_sec)  # the refresh is still out: no second ask
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        rates.append((await gates.capacity(0)).prefill_tokens_per_sec)  # refreshed
        return rates

    assert asyncio.run(scenario()) == [1000.0, 1000.0, 1000.0, 1000.0, 5000.0]
    assert calls == ["kvgate_capacity", "kvgate_capacity"]


def test_the_paired_summary_takes_each_round_against_its_own_best_cap() -> None:
    def run(policy: str, makespan: float, hits: float) -> dict:
        return {"policy": policy, "makespan_sec": makespan, "hit_rate": hits}

    rounds = [
        # A slow round: every policy slower, the ratio the same as in a fast one.
        [run("cap-3", 30.0, 0.8), run("cap-4", 25.0, 0.7), run("kvgate", 22.5, 0.72)],
        [run("kvgate", 22.0, 0.76), run("cap-3", 21.0, 0.8), run("cap-4", 20.0, 0.75)],
        # No cap ran: nothing to pair against.
        [run("kvgate", 5.0, 0.9)],
    ]
    s = real_engine.paired_summary(rounds)
    assert set(s) == {"kvgate"}
    k = s["kvgate"]
    assert k["ratios"] == pytest.approx([0.9, 1.1])
    assert k["mean"] == pytest.approx(1.0)
    # sd of (0.9, 1.1) is sqrt(0.02); t(0.975, 1 df) = 12.706.
    assert k["ci95_half_width"] == pytest.approx(12.706 * 0.02**0.5 / 2**0.5)
    assert k["geo_mean"] == pytest.approx((0.9 * 1.1) ** 0.5)
    assert k["rounds_at_or_below_best_cap"] == 1
    assert k["hit_rate_over_cap3"] == pytest.approx([0.9, 0.95])
    one = real_engine.paired_summary(rounds[:1])["kvgate"]
    assert one["ci95_half_width"] is None and one["mean"] == pytest.approx(0.9)


class _EngineCore:
    """A stand-in engine-core client: answers kvgate's UTILITY calls, logs
    them, and runs `on_call(method)` first (which may block or close)."""

    def __init__(self, on_call) -> None:
        self.calls: list[str] = []
        self.on_call = on_call

    async def call_utility_async(self, method: str, *args: object) -> object:
        self.calls.append(method)
        await self.on_call(method)
        return {
            "kvgate_usage": 0.95,
            "kvgate_capacity": {"capacity_tokens": 1 << 20, "block_size": 16, "prefill_tokens_per_sec": 0.0},
            "kvgate_prefix": (19, 20),
        }[method]


class _LLM:
    def __init__(self, core: _EngineCore) -> None:
        self.engine_core = core


@pytest.mark.parametrize("mode", ["working_set", "reference"])
def test_a_gate_closed_from_inside_its_usage_probe_asks_the_engine_nothing_more(mode: str) -> None:
    """kvgate.h: once the gate is freed no probe is called again; the plugin's
    probes are `async def`s awaiting the engine."""
    import asyncio

    gates: serve.Gates

    async def on_call(method: str) -> None:
        if method == "kvgate_usage":
            gates.gate(0).close()  # frees the library's gate: no call is in progress on it

    core = _EngineCore(on_call)
    gates = serve.Gates(_LLM(core), {"admission_mode": mode})

    async def scenario() -> None:
        with pytest.raises(kvgate.Closed):
            await gates.gate(0).acquire(b"s", [1, 2, 3])

    asyncio.run(scenario())
    assert gates.gate(0).closed and gates.gate(0)._raw is None
    assert core.calls == ["kvgate_usage"]


@pytest.mark.parametrize(
    "mode, at_engine",
    [("working_set", "kvgate_usage"), ("working_set", "kvgate_capacity"), ("reference", "kvgate_usage"), ("reference", "kvgate_prefix")],
)
def test_cancelling_a_request_while_its_probe_is_at_the_engine_cancels_the_attempt(mode: str, at_engine: str) -> None:
    """The request's task is cancelled (its client went away) while a probe's
    UTILITY call is out: the attempt ends cancelled, nothing leaks, and the
    session is admitted again at once."""
    import asyncio

    async def scenario() -> None:
        out = asyncio.Event()
        release = asyncio.Event()

        async def on_call(method: str) -> None:
            if method == at_engine and not release.is_set():
                out.set()
                await release.wait()

        core = _EngineCore(on_call)
        gates = serve.Gates(_LLM(core), {"admission_mode": mode})
        gate = gates.gate(0)
        task = asyncio.create_task(gate.acquire(b"s", [1, 2, 3]))
        await asyncio.wait_for(out.wait(), 10)
        assert gate.stats().pending_attempts == 1
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        s = gate.stats()
        assert (s.cancelled, s.pending_attempts, s.active_leases, s.admissions) == (1, 0, 0, 0)
        release.set()
        lease = await asyncio.wait_for(gate.acquire(b"s", [1, 2, 3]), 10)
        lease.release()
        gate.close()

    asyncio.run(scenario())


def test_the_capacity_answer_carries_max_model_len_when_the_engine_sends_it() -> None:
    from kvgate_vllm import feedback

    sent = {"capacity_tokens": 12800, "block_size": 32, "prefill_tokens_per_sec": 0.0, "max_model_len": 4096}
    assert feedback.capacity_of(sent).max_model_len == 4096
    # An older engine side sends none, or a figure that is not one: not told.
    for old in ({"capacity_tokens": 12800, "block_size": 32}, {**sent, "max_model_len": 0}, {**sent, "max_model_len": "x"}):
        assert feedback.capacity_of(old).max_model_len is None


def test_refusal_mode_refuses_by_cache_where_the_gate_can_tell() -> None:
    ws = kvgate.Gate(kvgate.Config(admission_mode="working_set"))
    ref = kvgate.Gate(kvgate.Config(admission_mode="reference"))
    try:
        assert serve._refusal_of(False, ws) == serve._refusal_of(False, ref) == serve._NO_REFUSAL
        # Working set: only a turn whose cache is gone is refused (Released).
        assert serve._refusal_of(True, ws) == serve._CACHE_GONE
        # Reference admission cannot tell a session's cache: one pass.
        assert serve._refusal_of(True, ref) == serve._ONE_PASS
    finally:
        ws.close()
        ref.close()
