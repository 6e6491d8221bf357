#!/usr/bin/env bash
# Runs the simulator (README's main command) on every built-in scenario with
# a release build, and checks that each scenario
# wrote its table, data and plots. The figures themselves are asserted by
# the sim crate's tests (golden, bound and thrash-story).
set -euo pipefail
cd "$(dirname "$0")/.."

scenarios=(thrash no-pressure retry-storm long-tools multi-replica waves waves-async mixed staggered poisson h200 real-engine mid-tools heavy-tail-tools small-kv decode-heavy compacting elide reasoning single-turn swe-agent claude-code swe-long grpo swe-steps grpo-16)
out=target/kvgate-sim-smoke
rm -rf "$out"
# Release: every table sweeps caps for cap-best, too slow in a debug build.
cargo run --quiet --release -p kvgate-sim -- --scenario all --out "$out" > "$out.log"
for scenario in "${scenarios[@]}"; do
    dir="$out/$scenario"
    for f in summary.csv summary.md summary.json turns.csv hit_rate_over_time.csv \
             latency_by_turn.csv hit_rate_over_time.svg latency_by_turn.svg; do
        [ -s "$dir/$f" ] || { echo "missing or empty: $dir/$f" >&2; exit 1; }
    done
    grep -q '</svg>' "$dir/hit_rate_over_time.svg" || { echo "truncated SVG in $dir" >&2; exit 1; }
    # No run may end unfinished (a stalled policy hits the time limit).
    if grep -q ',false,' "$dir/summary.csv"; then
        echo "a policy did not finish in $scenario" >&2
        exit 1
    fi
    # Every table carries the hindsight-best cap and both peers.
    for p in 'cap-best (K=' thunderagent progress-ttl; do
        grep -qF "$p" "$dir/summary.csv" || { echo "no $p in $scenario" >&2; exit 1; }
    done
done
grep -c '^== scenario' "$out.log" | grep -qx "${#scenarios[@]}"
# Each comparison tells its story: the short table and its sentence.
grep -c '^policy  *makespan  *x best cap' "$out.log" | grep -qx "${#scenarios[@]}"
grep -c '^kvgate finished in ' "$out.log" | grep -qx "${#scenarios[@]}"
echo "kvgate-sim: ${#scenarios[@]} scenarios ran, outputs in $out/"
