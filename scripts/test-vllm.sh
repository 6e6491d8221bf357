#!/usr/bin/env bash
# The second test command (README "kvgate in vLLM"): the real-engine tests.
# Installs the pinned vLLM CPU engine into a venv outside the repo
# (scripts/install-vllm.sh; KVGATE_VLLM_VENV overrides where), builds
# libkvgate.so, and runs integrations/vllm/tests with pytest on the real engine:
# the header check of the ctypes binding, the probes (tiny random Llama, LoRA,
# cache_salt, no side effects) and `vllm serve` end to end (plugin on and off).
#
# A run that collects no test (pytest exit 5) fails, and so does any skipped
# test: nothing here may pass by not running.
set -euo pipefail
cd "$(dirname "$0")/.."

venv=${KVGATE_VLLM_VENV:-$HOME/.cache/kvgate/vllm-venv}
step() { printf '\n==> %s\n' "$*"; }

step "scripts/install-vllm.sh"
./scripts/install-vllm.sh

step "cargo build --release (libkvgate.so)"
cargo build --release
export KVGATE_LIB=$PWD/target/release/libkvgate.so

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
