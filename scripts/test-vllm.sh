#!/usr/bin/env bash
# The second test command (docs/vllm.md, "Tests"): the real-engine tests.
# Builds libkvgate.so, installs the pinned vLLM CPU engine into a venv outside
# the repo together with the `kvgate` Python package from this checkout
# (scripts/install-vllm.sh; KVGATE_VLLM_VENV overrides where), and runs
# integrations/vllm/tests with pytest on the real engine: the package in the
# venv is this checkout's (modules, header, library; its drift check against
# include/kvgate.h), the probes (tiny random Llama, LoRA, cache_salt, no side
# effects) and `vllm serve` end to end (plugin on and off), and two gated
# replicas behind vLLM's router (scripts/install-router.sh installs it into its
# own venv; KVGATE_ROUTER_VENV overrides where).
#
# The tests use the library the package bundles (the wheel's build hook copies
# target/release/libkvgate.so); KVGATE_LIBRARY is left unset on purpose.
#
# A run that collects no test (pytest exit 5) fails, and so does any skipped
# test: nothing here may pass by not running.
set -euo pipefail
cd "$(dirname "$0")/.."

venv=${KVGATE_VLLM_VENV:-$HOME/.cache/kvgate/vllm-venv}
step() { printf '\n==> %s\n' "$*"; }

if ! command -v cargo >/dev/null 2>&1; then
    export PATH="$HOME/.cargo/bin:$PATH"
fi
# First, so the package's build hook (its own `cargo build --release --lib`)
# finds it built and bundles exactly target/release/libkvgate.so.
step "cargo build --release (libkvgate.so)"
cargo build --release

step "scripts/install-vllm.sh (engine, plugin, kvgate package)"
./scripts/install-vllm.sh
unset KVGATE_LIBRARY

step "scripts/install-router.sh (the scale-out tests' router)"
./scripts/install-router.sh

step "pytest integrations/vllm/tests (real engine)"
report=$(mktemp)
trap 'rm -f "$report"' EXIT
set +e
(cd integrations/vllm && PYTHONDONTWRITEBYTECODE=1 "$venv/bin/python" -m pytest -p no:cacheprovider -rsfE \
    --junitxml="$report" tests "$@")
rc=$?
set -e
if ((rc == 5)); then
    echo "test-vllm: pytest collected no test (exit 5): failing" >&2
    exit 1
fi
if ((rc != 0)); then
    echo "test-vllm: pytest failed (exit $rc)" >&2
    exit "$rc"
fi
read -r tests skipped < <("$venv/bin/python" - "$report" <<'PY'
import sys, xml.etree.ElementTree as ET
root = ET.parse(sys.argv[1]).getroot()
suites = [root] if root.tag == "testsuite" else list(root)
print(sum(int(s.get("tests", 0)) for s in suites), sum(int(s.get("skipped", 0)) for s in suites))
PY
)
if ((tests == 0 || skipped != 0)); then
    echo "test-vllm: $tests tests, $skipped skipped: a skipped real-engine test is not a pass" >&2
    exit 1
fi
step "real-engine tests: $tests passed, 0 skipped"
