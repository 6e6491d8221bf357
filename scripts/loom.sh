#!/usr/bin/env bash
# Runs every loom model (tests/loom_*.rs) against the real code compiled
# with its loom twins (src/sync/). Bounds, and why they suffice, are in
# the header of each model file; override any LOOM_* variable to explore
# further, e.g. LOOM_MAX_PREEMPTIONS=3 ./scripts/loom.sh.
set -euo pipefail
cd "$(dirname "$0")/.."

export RUSTFLAGS="--cfg loom -C debug-assertions=on ${RUSTFLAGS:-}"
export LOOM_MAX_PREEMPTIONS="${LOOM_MAX_PREEMPTIONS:-2}"
export LOOM_MAX_BRANCHES="${LOOM_MAX_BRANCHES:-10000}"
target=(--release --target-dir target-loom)

# The library itself must build with its loom twins.
cargo check --lib "${target[@]}"
cargo test "${target[@]}" --no-fail-fast --test 'loom_*' -- --nocapture --test-threads=2 "$@"
