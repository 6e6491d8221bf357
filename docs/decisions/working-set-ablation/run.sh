#!/usr/bin/env bash
# Re-runs the working-set ablation: every rule switched off in turn, judged
# against the per-seed best fixed cap. Scratch, not part of the build.
#
#   cp -r docs/decisions/working-set-ablation /tmp/ablation-tools
#   git worktree add /tmp/ablate 12c13c0 && cd /tmp/ablate
#   git show 8e134fc:docs/decisions/working-set-ablation/switches.patch | git apply
#   cargo build --release -p kvgate-sim
#   /tmp/ablation-tools/run.sh base s15 s610        # then each rule, e.g.
#   /tmp/ablation-tools/run.sh ghosts s15 s610 vary
#   python3 /tmp/ablation-tools/compare.py          # each run against base
#
# RULE names are the switches in that patch (KVGATE_ABLATE; README.md here); "base"
# switches nothing. VARIANT: s15 s610 vary untold outonly length norate usage blind.
# CAPBEST_CACHE keeps each scenario and seed's best cap K between runs
# (the best cap does not depend on the gate), so only kvgate is re-run.
set -euo pipefail
OUT=${OUT:-/tmp/kvgate-ablation}
BIN=${BIN:-target/release/kvgate-sim}
export CAPBEST_CACHE=$OUT/capcache
mkdir -p "$CAPBEST_CACHE"
declare -A HOST=(
  [s15]="--seeds 1-5"
  [s610]="--seeds 6-10"
  [vary]="--seeds 1-3 --vary all"
  [untold]="--seeds 1-5 --host-finish untold"
  [outonly]="--seeds 1-5 --host-report output-only"
  [length]="--seeds 1-5 --host-prompt length"
  [norate]="--seeds 1-5 --capacity-probe no-rate"
  [usage]="--seeds 1-5 --capacity-probe usage-only"
  [blind]="--seeds 1-5 --host-prompt length --host-report output-only --host-finish untold"
)
rules=$1; shift
name=${NAME:-${rules//,/+}}
for v in "$@"; do
  mkdir -p "$OUT/$name/$v"
  # shellcheck disable=SC2086
  KVGATE_ABLATE=$rules "$BIN" --judge --scenario all --policies kvgate ${HOST[$v]} \
    --out "$OUT/$name/$v" > "$OUT/$name/$v/log"
done
