#!/usr/bin/env bash
# The Python package (python/): a venv under ~/.cache/kvgate/py-venv with the
# pinned build backend and pytest (python/requirements-dev.txt), the package
# installed from this checkout (its build hook runs `cargo build --release
# --lib` and bundles libkvgate.so and include/kvgate.h), then its tests
# (python/tests) against the installed wheel, and a small run of the
# benchmark so it keeps working. Idempotent; needs no network once the venv
# holds the pins (pip runs with --no-index after that) and cargo's registry
# cache holds the crates. Needs python3 with venv (python3-venv on Debian:
# scripts/ensure-tools.sh installs it). Called by scripts/test.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
root="$(pwd)"

if ! command -v cargo >/dev/null 2>&1; then
    export PATH="$HOME/.cargo/bin:$PATH"
fi

python="${PYTHON:-python3}"
venv="${KVGATE_PY_VENV:-$HOME/.cache/kvgate/py-venv}"
requirements="$root/python/requirements-dev.txt"
export PYTHONDONTWRITEBYTECODE=1 PIP_DISABLE_PIP_VERSION_CHECK=1

step() { printf '\n--> %s\n' "$*"; }

. scripts/pinned-venv.sh
pinned_venv "$venv" "$requirements"

step "pip install ./python (hatchling build hook: cargo build --release --lib)"
"$venv/bin/pip" install --quiet --no-index --no-build-isolation --no-deps --force-reinstall "$root/python"
"$venv/bin/python" -c 'import kvgate; print("kvgate", kvgate.version(), "from", kvgate.loaded_path() or kvgate.library_path())'

step "pytest python/tests"
(cd "$root/python" && "$venv/bin/pytest" -q -p no:cacheprovider tests)

step "python/bench/many_waiters.py (small run: it still works)"
"$venv/bin/python" "$root/python/bench/many_waiters.py" --waiters 500 --handovers 100

step "python package passed"
