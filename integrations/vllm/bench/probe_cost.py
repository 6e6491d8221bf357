"""What a prefix probe costs on the engine loop, with and without the per-session
hash-chain cache, for long prompts (the engine's real hasher and lookup).

    python integrations/vllm/bench/probe_cost.py [--lengths 2048,8192,16384,32000]

For each length L: the prompt (resident: it ran once) is probed cold (no session:
every block hashed) and as the next turn of a session whose previous prompt
was L - 500 tokens (only the new blocks hashed). Prints the median per probe.
"""

from __future__ import annotations

import argparse
import pathlib
import random
import statistics
import sys
import time

# The fixtures (model maker, engine, launcher, workload) live with the tests,
# outside the runtime package: integrations/vllm/tests/support.
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "tests"))

from support.engine import core_of, make_engine, random_prompt, run_to_completion, sampling


def median_ms(fn, reps: int) -> float:
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times) * 1e3


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--lengths", default="2048,8192,16384,32000")
    ap.add_argument("--reps", type=int, default=30)
    args = ap.parse_args()
    lengths = [int(x) for x in args.lengths.split(",")]
    top = max(lengths)
    engine = make_engine("tiny", num_blocks=top // 32 + 64, max_model_len=top + 64, max_num_batched_tokens=8192)
    core = core_of(engine)
    rng = random.Random(0)
    base = random_prompt(rng, top)
    engine.add_request("warm", {"prompt_token_ids": base}, sampling(1))
    run_to_completion(engine)
    print(f"{'tokens':>7} {'cold probe ms':>14} {'session probe ms':>17} {'speed-up':>8}  hit")
    for n in lengths:
        prompt = base[:n]
        cold = median_ms(lambda: core.kvgate_prefix(prompt), args.reps)
        prev = base[: n - 500]

        def session_turn() -> None:
            core.kvgate_prefix(prev, None, None, "bench")  # the previous turn: leaves its chain
            core.kvgate_prefix(prompt, None, None, "bench")  # this turn: hashes only the new blocks

        both = median_ms(session_turn, args.reps)
        prev_only = median_ms(lambda: core.kvgate_prefix(prev, None, None, "bench"), args.reps)
        warm = both - prev_only  # the new turn's probe alone
        hit = core.kvgate_prefix(prompt)[0]
        print(f"{n:>7} {cold:>14.2f} {warm:>17.2f} {cold / max(warm, 1e-6):>7.1f}x  {hit}/{n}")


if __name__ == "__main__":
    main()
