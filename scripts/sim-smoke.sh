#!/usr/bin/env bash
# Runs the simulator (README's main command) on every built-in scenario with
# the debug build the tests already compiled, and checks that each scenario
# wrote its table, data and plots. The figures themselves are asserted by
# the sim crate's tests (golden and thrash-story).
set -euo pipefail
cd "$(dirname "$0")/.."

out=target/kvgate-sim-smoke
rm -rf "$out"
cargo run --quiet -p kvgate-sim -- --scenario all --out "$out" > "$out.log"
for scenario in thrash no-pressure retry-storm long-tools multi-replica; do
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
done
grep -c '^== scenario' "$out.log" | grep -qx 5
echo "kvgate-sim: 5 scenarios ran, outputs in $out/"
