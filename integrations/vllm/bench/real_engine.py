"""The real-engine comparison: no gate, fixed caps, kvgate, on one in-process vLLM engine.

    python integrations/vllm/bench/real_engine.py \
        --policies none,cap-2,cap-3,cap-4,cap-5,cap-6,kvgate,kvgate:high_watermark=0.2,idle_grace_sec=1,wait_poll_sec=1 \
        --steps-csv /tmp/kvgate-steps.csv

Workload: tests/support/workload.py (24 sessions x 10 turns by default: a shared
256-token system prompt, a 256-token task, 16-48 output tokens, tool calls of
min(3 s, 0.1 s x lognormal(0, 0.8)) returning 200-600 tokens), the `small`
prefill-dominated model, 400 blocks of 32 tokens,
max_num_batched_tokens 2048. The engine is stepped on the main thread; probes and
requests are posted to it by one thread per session and served between steps (as
UTILITY calls are in `vllm serve`).

Policies (comma-separated; `;` also separates, so knob lists may use `,` after `kvgate:`):
- `none`: every turn goes straight to the engine.
- `cap-K`: at most K sessions active at a time: a session takes a slot before its
  first turn and frees it after its last (a session in a tool call keeps it).
- `kvgate` / `kvgate:knob=value,...`: each turn acquires a lease of the `kvgate`
  package (`Gate.acquire_sync` on the session's thread; usage and prefix probes
  served by the engine between steps), released when the turn finishes; the
  session is finished after its last turn (never, with `--untold-ends`). Each `knob=value` is a
  `kvgate.Config` field (kvgate_vllm.knobs: `admission_mode=reference`,
  `high_watermark=0.2`, ...); unset knobs are the library's defaults. Capacity
  (the capacity probe) and per-turn cached tokens go through
  kvgate_vllm.feedback (the one place that feeds the engine's figures back).

Prints per policy: makespan, hit rate (sum of num_cached_tokens / sum of prompt
tokens), hit rate over the last third of turns, prefilled tokens (uncached prompt
tokens the engine scheduled, recomputation included), first/last-turn mean latency,
p99 turn latency (wait included) and the longest wait, admissions by reason, for
kvgate the mean and max of its working-set gauges (sampled every 0.5 s; the samples
go to the JSON), the step costs the engine fitted to its last steps and the
rebuild cost they give (kvgate_vllm.step_cost; kvgate's gate is told it as
`vllm serve`'s is, through kvgate_vllm.feedback), and the best fixed cap.
`--steps-csv` writes every engine
step (duration vs scheduled prefill tokens, decode sequences, context tokens and
attention pairs) for the simulator's step-time fit (`kvgate-sim --fit-steps F`);
`--json` writes the results, with every turn (`turn_rows`: session, turn, prompt
and cached tokens, wait, admission reason, when it asked) to see
where tokens were re-prefilled (a turn's prompt less its cached tokens, beyond
what it added since its last turn).

`--repeat N` runs the policies N rounds (each round's order rotated by one) and
ends with every policy that is not a cap against the best cap *of its own round*:
the ratios, their mean with a 95% interval, and its hit rate over cap-3's. Runs on
a shared machine drift by 5-10% between rounds; a ratio within a round cancels
most of that, so claims about the gate against the caps are made from this line:

    python integrations/vllm/bench/real_engine.py --policies cap-3,cap-4,kvgate --repeat 5
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import json
import math
import pathlib
import queue
import sys
import threading
import time
from collections import Counter
from concurrent.futures import Future
from typing import Any, Callable, Optional

import kvgate

from kvgate_vllm import feedback, knobs, prefill_rate, step_cost

# The fixtures (model maker, engine, launcher, workload) live with the tests,
# outside the runtime package: integrations/vllm/tests/support.
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "tests"))

from support.engine import core_of, make_engine, sampling
from support.workload import Workload


@dataclasses.dataclass
class Turn:
    session: int
    index: int
    prompt_tokens: int
    cached_tokens: int
    output_tokens: int
    latency_sec: float  # admission wait + engine time
    wait_sec: float
    reason: str
    start_sec: float  # when the turn asked to be admitted, from the run's start


@dataclasses.dataclass
class StepRow:
    t: float
    dur_ms: float
    prefill_tokens: int
    decode_tokens: int
    prefill_reqs: int
    decode_reqs: int
    running: int
    waiting: int
    usage: float
    context_tokens: int  # KV the step's requests attend over (their computed tokens after it)
    attn_pairs: int  # query-key pairs attended: n new tokens after c attend n*c + n*(n+1)/2


def parse_policies(spec: str) -> list[str]:
    """Splits on ',' except inside a kvgate knob list (`kvgate:a=1,b=2`)."""
    out: list[str] = []
    for part in spec.replace(";", ",").split(","):
        part = part.strip()
        if not part:
            continue
        if "=" in part and ":" not in part and out and out[-1].startswith("kvgate:"):
            out[-1] += "," + part
        else:
            out.append(part)
    return out


def parse_knobs(policy: str) -> dict[str, Any]:
    if ":" not in policy:
        return {}
    knobs: dict[str, Any] = {}
    for item in policy.split(":", 1)[1].split(","):
        name, sep, value = item.partition("=")
        if not sep:
            raise SystemExit(f"bad knob {item!r} in {policy!r}: want name=value")
        try:
            knobs[name.strip()] = float(value)
        except ValueError:
            knobs[name.strip()] = value.strip()
    return knobs


class EngineLoop:
    """Owns the engine; runs on the main thread. Other threads post work with `call`."""

    def __init__(self, engine: Any, steps: list[StepRow]) -> None:
        self.engine = engine
        self.core = core_of(engine)
        self.inbox: "queue.Queue[tuple[Callable[[], Any], Future]]" = queue.Queue()
        self.pending: dict[str, Future] = {}
        self.steps = steps
        self.stop = False
        self._last_sched: Optional[Any] = None
        sched = self.core.scheduler
        original = sched.schedule

        def schedule_and_record(*a: Any, **k: Any) -> Any:
            out = original(*a, **k)
            self._last_sched = out
            return out

        sched.schedule = schedule_and_record  # instance attribute: records what each step scheduled

    def call(self, fn: Callable[[], Any]) -> Any:
        fut: Future = Future()
        self.inbox.put((fn, fut))
        return fut.result()

    def submit(self, request_id: str, prompt: list[int], max_tokens: int) -> Future:
        done: Future = Future()

        def add() -> None:
            self.pending[request_id] = done
            self.engine.add_request(request_id, {"prompt_token_ids": prompt}, sampling(max_tokens))

        self.call(add)
        return done

    def _drain(self, block: bool) -> None:
        try:
            item = self.inbox.get(timeout=0.002) if block else self.inbox.get_nowait()
        except queue.Empty:
            return
        while True:
            fn, fut = item
            try:
                fut.set_result(fn())
            except BaseException as e:  # noqa: BLE001 - handed to the caller
                fut.set_exception(e)
            try:
                item = self.inbox.get_nowait()
            except queue.Empty:
                return

    def run(self, t0: float) -> None:
        engine, sched = self.engine, self.core.scheduler
        while not self.stop:
            self._drain(block=not engine.has_unfinished_requests())
            if not engine.has_unfinished_requests():
                continue
            self._last_sched = None
            start = time.perf_counter()
            outputs = engine.step()
            dur = time.perf_counter() - start
            pf, dc, npf, ndc, ctx, pairs = step_cost.step_load(self._last_sched, sched.requests)
            if pf or dc:
                self.steps.append(
                    StepRow(start - t0, dur * 1e3, pf, dc, npf, ndc, len(sched.running), len(sched.waiting),
                            self.core.kvgate_usage(), ctx, pairs)
                )
            for out in outputs:
                if out.finished and out.request_id in self.pending:
                    self.pending.pop(out.request_id).set_result(out)


class Admission:
    """How a policy admits: `session_start`, `turn` (returns a release function), `session_end`."""

    def session_start(self, s: int) -> None: ...

    def turn(self, s: int, prompt: list[int]) -> tuple[str, float, Callable[[Any], None]]:
        return "none", 0.0, lambda out: None

    def session_end(self, s: int) -> None: ...

    def reasons(self) -> dict[str, int]:
        return {}

    def gauges(self) -> dict[str, Any]:
        return {}

    def close(self) -> None: ...


class FixedCap(Admission):
    def __init__(self, k: int) -> None:
        self.sem = threading.Semaphore(k)

    def session_start(self, s: int) -> None:
        self.sem.acquire()

    def session_end(self, s: int) -> None:
        self.sem.release()


class KvgateAdmission(Admission):
    def __init__(self, loop: EngineLoop, config: dict[str, Any], tell_ends: bool) -> None:
        # Whether kvgate is told when a session ends (`--untold-ends`: not, as
        # behind a proxy that sees only requests, e.g. `vllm serve` without
        # the final-turn header).
        self.tell_ends = tell_ends
        self.loop = loop
        core = loop.core
        answer = feedback.answer_of(core.kvgate_capacity())  # asked on the engine thread, before it runs
        capacity = feedback.capacity_of(answer)
        assert answer is not None and capacity is not None

        self._rebuild_lock = threading.Lock()
        self._rebuild_seen: Optional[tuple[float, float]] = None

        def capacity_now(sid: bytes) -> kvgate.Capacity:
            # The blocks never change; the engine's measured prefill rate and
            # fitted rebuild cost are what the engine thread last wrote, read
            # here with a dict lookup each (what its kvgate_capacity answers).
            # A new cost is told to the gate as vllm serve tells it.
            per_token, per_pair = step_cost.published(core)
            with self._rebuild_lock:
                self._rebuild_seen = feedback.tell_rebuild_cost(
                    self.gate,
                    answer._replace(rebuild_secs_per_token=per_token, rebuild_secs_per_pair=per_pair),
                    self._rebuild_seen,
                )
            return capacity._replace(prefill_tokens_per_sec=prefill_rate.typical_rate(core))

        self.gate = kvgate.Gate(
            knobs.config(config),
            kvgate.Probes(
                usage=lambda sid: loop.call(core.kvgate_usage),
                capacity=capacity_now,
                prefix=self._prefix,
            ),
        )
        self.counts: Counter[str] = Counter()
        self.lock = threading.Lock()
        # The gate's working-set gauges, sampled every 0.5 s (diagnosis: what
        # capacity and window it worked with, how many members it held).
        self.samples: list[dict[str, float]] = []
        self._sampling = threading.Event()
        self._t0 = time.perf_counter()
        self._sampler = threading.Thread(target=self._sample, daemon=True)
        self._sampler.start()

    def _sample(self) -> None:
        while not self._sampling.wait(0.5):
            row: dict[str, float] = {"t": round(time.perf_counter() - self._t0, 3)}
            for line in self.gate.metrics_text().splitlines():
                name, _, value = line.partition(" ")
                if name.startswith(("kvgate_working_set_", "kvgate_waiting_attempts", "kvgate_active_leases")):
                    row[name[len("kvgate_"):]] = float(value)
            self.samples.append(row)

    def _prefix(self, sid: bytes, prompt: list[int]) -> Optional[float]:
        hit, n = self.loop.call(lambda: self.loop.core.kvgate_prefix(prompt, None, None, sid.decode()))
        return hit / n if n else None

    def turn(self, s: int, prompt: list[int]) -> tuple[str, float, Callable[[Any], None]]:
        lease = self.gate.acquire_sync(f"agent-{s}", prompt)
        reason = getattr(lease.reason, "name", f"reason_{lease.reason}").lower()
        with self.lock:
            self.counts[reason] += 1
        return reason, lease.wait_sec, lambda out: feedback.release(lease, None if out is None else feedback.figures_of(out))

    def session_end(self, s: int) -> None:
        if self.tell_ends:
            self.gate.finish_session(f"agent-{s}")
        self.loop.call(lambda: self.loop.core.kvgate_forget(f"agent-{s}"))

    def reasons(self) -> dict[str, int]:
        return dict(self.counts)

    def gauges(self) -> dict[str, Any]:
        """Summary of the sampled gauges (mean and max of each), and the samples."""
        keys = sorted({k for row in self.samples for k in row if k != "t"})
        summary = {
            k: {"mean": sum(r.get(k, 0.0) for r in self.samples) / len(self.samples), "max": max(r.get(k, 0.0) for r in self.samples)}
            for k in keys
        } if self.samples else {}
        return {"summary": summary, "samples": self.samples}

    def close(self) -> None:
        self._sampling.set()
        self._sampler.join()
        self.gate.close()


def make_admission(policy: str, loop: EngineLoop, tell_ends: bool) -> Admission:
    if policy == "none":
        return Admission()
    if policy.startswith("cap-"):
        return FixedCap(int(policy[4:]))
    if policy == "kvgate" or policy.startswith("kvgate:"):
        return KvgateAdmission(loop, parse_knobs(policy), tell_ends)
    raise SystemExit(f"unknown policy {policy!r}: none, cap-K, kvgate[:knob=value,...]")


def run_policy(policy: str, workload: Workload, engine_kwargs: dict[str, Any], steps_out: list[StepRow],
               tell_ends: bool = True) -> dict[str, Any]:
    engine = make_engine(**engine_kwargs)
    warm = list(range(3, 3 + 600))  # warm-up (first-step costs), outside the makespan; evicted by the run
    engine.add_request("warm-up", {"prompt_token_ids": warm}, sampling(8))
    while engine.has_unfinished_requests():
        engine.step()
    engine.reset_prefix_cache()
    steps: list[StepRow] = []
    loop = EngineLoop(engine, steps)
    admission = make_admission(policy, loop, tell_ends)
    turns: list[Turn] = []
    turns_lock = threading.Lock()
    errors: list[BaseException] = []

    def session(s: int) -> None:
        try:
            script = workload.session(s)
            prompt = list(script.first_prompt)
            admission.session_start(s)
            for t in range(workload.turns):
                start = time.perf_counter()
                reason, wait, release = admission.turn(s, prompt)
                n_out = script.output_tokens()
                try:
                    out = loop.submit(f"s{s}-t{t}", prompt, n_out).result()
                except BaseException:
                    release(None)
                    raise
                release(out)
                with turns_lock:
                    turns.append(Turn(s, t, len(prompt), int(out.num_cached_tokens or 0), n_out,
                                      time.perf_counter() - start, wait, reason, start - t0))
                if t + 1 < workload.turns:
                    sec, result = script.tool_call()
                    time.sleep(sec)
                    prompt = prompt + list(out.outputs[0].token_ids) + result
            admission.session_end(s)
        except BaseException as e:  # noqa: BLE001 - reported by the main thread
            errors.append(e)

    t0 = time.perf_counter()
    threads = [threading.Thread(target=session, args=(s,), daemon=True) for s in range(workload.sessions)]
    for th in threads:
        th.start()

    def stopper() -> None:
        for th in threads:
            th.join()
        loop.stop = True
        loop.inbox.put((lambda: None, Future()))

    threading.Thread(target=stopper, daemon=True).start()
    loop.run(t0)
    makespan = time.perf_counter() - t0
    gauges = admission.gauges()
    admission.close()
    if errors:
        raise errors[0]
    costs = step_cost.of(loop.core)
    costs.refit()  # the engine's fit over its last kept steps, as the run ended
    fit, rebuild = costs.last_fit, costs.cost
    del engine
    steps_out.extend(steps)
    prompt_total = sum(t.prompt_tokens for t in turns)
    last_third = [t for t in turns if t.index >= workload.turns - max(1, workload.turns // 3)]

    def quantile(xs: list[float], q: float) -> float:
        xs = sorted(xs)
        return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else float("nan")

    def mean_latency(index: int) -> float:
        xs = [t.latency_sec for t in turns if t.index == index]
        return sum(xs) / len(xs) if xs else float("nan")

    return {
        "policy": policy,
        "makespan_sec": makespan,
        "hit_rate": sum(t.cached_tokens for t in turns) / prompt_total,
        "hit_rate_last_third": sum(t.cached_tokens for t in last_third) / max(1, sum(t.prompt_tokens for t in last_third)),
        "prompt_tokens": prompt_total,
        "prefilled_tokens": sum(s.prefill_tokens for s in steps),
        "first_turn_latency_sec": mean_latency(0),
        "last_turn_latency_sec": mean_latency(workload.turns - 1),
        "p99_turn_latency_sec": quantile([t.latency_sec for t in turns], 0.99),
        "max_wait_sec": max((t.wait_sec for t in turns), default=0.0),
        "admissions_by_reason": admission.reasons(),
        "working_set_gauges": gauges,
        "turns": len(turns),
        # The step costs the engine fitted to its own steps (kvgate_vllm.step_cost,
        # seconds per unit) and the rebuild cost they give (0, 0: no usable fit).
        "step_cost_fit": None if fit is None else {
            **dict(zip(step_cost.TERMS, fit.coef)), "steps": fit.steps, "prefill_steps": fit.prefill_steps,
            "rms_ms": fit.rms_sec * 1e3,
        },
        "rebuild_cost": {"secs_per_token": rebuild[0], "secs_per_pair": rebuild[1]},
        "steps": len(steps),
        "turn_rows": [dataclasses.asdict(t) for t in sorted(turns, key=lambda t: t.start_sec)],
    }


def print_table(results: list[dict[str, Any]], file: Any = sys.stdout) -> None:
    print("| policy | makespan | hit rate | hit rate, last third | prefilled tokens | first / last-turn latency | admissions by reason |", file=file)
    print("|---|---|---|---|---|---|---|", file=file)
    for r in results:
        reasons = ", ".join(f"{v} {k}" for k, v in sorted(r["admissions_by_reason"].items(), key=lambda kv: -kv[1])) or "—"
        print(
            f"| {r['policy']} | {r['makespan_sec']:.1f} s | {100 * r['hit_rate']:.1f}% | {100 * r['hit_rate_last_third']:.1f}% "
            f"| {r['prefilled_tokens']:,} | {r['first_turn_latency_sec']:.2f} s / {r['last_turn_latency_sec']:.2f} s | {reasons} |",
            file=file,
        )
    caps = [r for r in results if r["policy"].startswith("cap-")]
    if caps:
        best = min(caps, key=lambda r: r["makespan_sec"])
        print(f"\nbest fixed cap (hindsight): {best['policy']} at {best['makespan_sec']:.1f} s", file=file)


# Two-sided 95% quantiles of Student's t for 1..30 degrees of freedom; past
# 30 the normal's 1.96 is within 2%.
_T975 = [12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
         2.201, 2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086,
         2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042]


def paired_summary(rounds: list[list[dict[str, Any]]]) -> dict[str, dict[str, Any]]:
    """Each policy that is not a cap against the best cap *of the same round*.

    The machine drifts between rounds (other load, thermal state), and a cap's
    makespan drifts with it: a ratio taken within one round cancels most of
    that, a ratio of means over rounds does not. Per policy: the ratios, their
    mean with a 95% interval (Student's t over the rounds; none for one round),
    their geometric mean, how many rounds it was at or below the best cap, and
    its hit rate over `cap-3`'s in the same round (when `cap-3` ran). A round
    without a cap contributes nothing.
    """
    ratios: dict[str, list[float]] = {}
    hits: dict[str, list[float]] = {}
    for results in rounds:
        caps = [r for r in results if r["policy"].startswith("cap-")]
        if not caps:
            continue
        best = min(r["makespan_sec"] for r in caps)
        cap3 = next((r["hit_rate"] for r in caps if r["policy"] == "cap-3"), None)
        for r in results:
            if r["policy"].startswith("cap-"):
                continue
            ratios.setdefault(r["policy"], []).append(r["makespan_sec"] / best)
            if cap3:
                hits.setdefault(r["policy"], []).append(r["hit_rate"] / cap3)
    out: dict[str, dict[str, Any]] = {}
    for policy, xs in ratios.items():
        n = len(xs)
        mean = sum(xs) / n
        half = None
        if n > 1:
            sd = math.sqrt(sum((x - mean) ** 2 for x in xs) / (n - 1))
            half = (_T975[n - 2] if n - 1 <= len(_T975) else 1.96) * sd / math.sqrt(n)
        out[policy] = {
            "ratios": xs,
            "mean": mean,
            "ci95_half_width": half,
            "geo_mean": math.exp(sum(math.log(x) for x in xs) / n),
            "rounds_at_or_below_best_cap": sum(1 for x in xs if x <= 1.0),
            "hit_rate_over_cap3": hits.get(policy, []),
        }
    return out


def print_paired(summary: dict[str, dict[str, Any]], file: Any = sys.stdout) -> None:
    for policy, s in summary.items():
        spread = f" ± {s['ci95_half_width']:.3f} (95%)" if s["ci95_half_width"] is not None else ""
        hits = ", ".join(f"{h:.2f}" for h in s["hit_rate_over_cap3"]) or "-"
        print(f"{policy} / best cap of its round: {', '.join(f'{x:.3f}' for x in s['ratios'])}; "
              f"mean {s['mean']:.3f}{spread}, geometric mean {s['geo_mean']:.3f}, "
              f"at or below it in {s['rounds_at_or_below_best_cap']} of {len(s['ratios'])}; "
              f"hit rate over cap-3's: {hits}", file=file)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--policies", default="none,cap-2,cap-3,cap-4,cap-5,cap-6,kvgate")
    ap.add_argument("--model", default="small", choices=["tiny", "small"])
    ap.add_argument("--sessions", type=int, default=24)
    ap.add_argument("--turns", type=int, default=10)
    ap.add_argument("--blocks", type=int, default=400)
    ap.add_argument("--max-num-batched-tokens", type=int, default=2048)
    ap.add_argument("--max-model-len", type=int, default=8192,
                    help="the engine's max_model_len; vLLM refuses a cache that cannot hold one request "
                         "this long, so `--blocks 200` needs at most 6144 (default 8192)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--tool-scale", type=float, default=1.0,
                    help="multiply the tool calls' durations (median and cap) by this, as the simulator's "
                         "`--vary tools-x5` does (default 1)")
    ap.add_argument("--steps-csv", help="write every engine step: policy, time, duration vs prefill/decode tokens")
    ap.add_argument("--json", help="write the results as JSON")
    ap.add_argument("--untold-ends", action="store_true",
                    help="never call finish_session: kvgate presumes ends from silence, as behind a proxy")
    ap.add_argument("--repeat", type=int, default=1,
                    help="run the policies this many rounds, each round's order rotated by one, and print "
                         "every policy against the best cap of its own round, with a 95%% interval (default 1)")
    args = ap.parse_args()
    if not (args.tool_scale > 0 and math.isfinite(args.tool_scale)):
        ap.error("--tool-scale must be a positive number")
    if args.repeat < 1:
        ap.error("--repeat must be at least 1")
    base = Workload()
    workload = Workload(sessions=args.sessions, turns=args.turns, seed=args.seed,
                        tool_median_sec=base.tool_median_sec * args.tool_scale,
                        tool_max_sec=base.tool_max_sec * args.tool_scale)
    engine_kwargs = {"size": args.model, "num_blocks": args.blocks, "max_num_batched_tokens": args.max_num_batched_tokens,
                     "max_model_len": args.max_model_len}
    print(f"workload {workload}; engine {engine_kwargs}; kvgate {kvgate.version()} ({kvgate.loaded_path()})", flush=True)
    results: list[dict[str, Any]] = []
    rounds: list[list[dict[str, Any]]] = []
    rows: list[tuple[str, StepRow]] = []
    policies = parse_policies(args.policies)
    for round_no in range(args.repeat):
        # Rotated so that no policy always runs first (a fresh process's first
        # engine, or a machine that drifts during a round, favours nobody).
        shift = round_no % len(policies)
        order = policies[shift:] + policies[:shift]
        this_round: list[dict[str, Any]] = []
        for policy in order:
            steps: list[StepRow] = []
            r = run_policy(policy, workload, engine_kwargs, steps, tell_ends=not args.untold_ends)
            r["round"] = round_no
            rows.extend((policy, s) for s in steps)
            this_round.append(r)
            results.append(r)
            print(f"{policy}: {r['makespan_sec']:.1f} s, hit rate {100 * r['hit_rate']:.1f}%, prefilled {r['prefilled_tokens']:,}, "
                  f"p99 turn {r['p99_turn_latency_sec']:.2f} s, max wait {r['max_wait_sec']:.2f} s, "
                  f"admissions {r['admissions_by_reason'] or '-'}", flush=True)
            f = r["step_cost_fit"]
            if f is not None:
                print(f"    engine's step-cost fit over its last {f['steps']} steps ({f['prefill_steps']} prefilling): "
                      f"b0 {f['b0'] * 1e3:.4g} ms, b1 {f['b1_prefill'] * 1e6:.4g} us, b2 {f['b2_decode'] * 1e6:.4g} us, "
                      f"b3 {f['b3_context'] * 1e6:.4g} us, b4 {f['b4_attn_pairs'] * 1e6:.4g} us, rms {f['rms_ms']:.2f} ms; "
                      f"rebuild {r['rebuild_cost']['secs_per_token'] * 1e6:.4g} us/token, "
                      f"{r['rebuild_cost']['secs_per_pair'] * 1e9:.4g} ns/pair", flush=True)
            for k, v in r["working_set_gauges"].get("summary", {}).items():
                print(f"    {k}: mean {v['mean']:.4g}, max {v['max']:.4g}", flush=True)
        rounds.append(this_round)
        print()
        if args.repeat > 1:
            print(f"round {round_no + 1} of {args.repeat}:")
        print_table(sorted(this_round, key=lambda r: policies.index(r["policy"])))
        print()
    paired = paired_summary(rounds)
    print_paired(paired)
    if args.steps_csv:
        with open(args.steps_csv, "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["policy"] + [fld.name for fld in dataclasses.fields(StepRow)])
            for policy, s in rows:
                w.writerow([policy] + [round(v, 6) if isinstance(v, float) else v for v in dataclasses.astuple(s)])
        print(f"\nengine steps: {len(rows)} rows in {args.steps_csv}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"workload": dataclasses.asdict(workload), "engine": engine_kwargs, "results": results,
                       "paired": paired}, f, indent=2)


if __name__ == "__main__":
    main()
