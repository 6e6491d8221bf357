#!/usr/bin/env bash
# Installs the session-affinity router of the scale-out tests
# (integrations/vllm/tests/test_router.py, docs/scale-out.md) into a venv
# OUTSIDE the repo: vLLM's Rust router (`vllm-router`, PyPI), every pin of
# integrations/vllm/router-requirements.txt with --no-deps. A venv of its own:
# its web-stack pins are not the engine's.
#
#   KVGATE_ROUTER_VENV  where the venv lives (default $HOME/.cache/kvgate/router-venv)
#   KVGATE_PYTHON       the interpreter to build it from (default python3.11)
#
# Idempotent: a stamp records the hash of the requirements; when it matches
# and the router starts (`--help`), nothing is installed (well under a second).
# The test finds the router at $KVGATE_ROUTER_VENV/bin/vllm-router.
set -euo pipefail
cd "$(dirname "$0")/.."

venv=${KVGATE_ROUTER_VENV:-$HOME/.cache/kvgate/router-venv}
reqs=integrations/vllm/router-requirements.txt
stamp="$venv/.kvgate-router-stamp"
want=$(sha256sum "$reqs" | cut -d' ' -f1)

. scripts/find-python.sh
find_python install-router

if [[ -f "$stamp" && "$(cat "$stamp")" == "$want" ]] && "$venv/bin/vllm-router" --help >/dev/null 2>&1; then
    echo "==> router already installed ($(grep -E '^vllm-router==' "$reqs"), requirements $want)"
    exit 0
fi
start=$(date +%s)
if [[ ! -x "$venv/bin/python" ]]; then
    echo "==> creating venv $venv ($("$py" --version))"
    mkdir -p "$(dirname "$venv")"
    "$py" -m venv "$venv"
fi
echo "==> installing $(grep -vcE '^(#|$)' "$reqs") pinned requirements (--no-deps)"
"$venv/bin/python" -m pip --disable-pip-version-check --no-input install --no-deps -r "$reqs"
"$venv/bin/vllm-router" --help >/dev/null
echo "$want" >"$stamp"
echo "==> install-router done in $(($(date +%s) - start)) s: $venv/bin/vllm-router"
