#!/usr/bin/env bash
# Installs what the test command needs and a fresh machine may lack: the
# rustfmt and clippy components, the system tools of the C ABI host
# examples (scripts/ffi-examples.sh) and python3-venv for the Python package
# (scripts/python-package.sh). Only what is missing is installed, so
# a machine that has everything needs no network. Debian/Ubuntu (apt-get);
# as root, or through sudo when it is there.
set -euo pipefail

# rustup installs into ~/.cargo/bin, which a non-login shell may not have on PATH.
if ! command -v cargo >/dev/null 2>&1; then
    export PATH="$HOME/.cargo/bin:$PATH"
fi

for component in rustfmt clippy; do
    if ! cargo "${component/rustfmt/fmt}" --version >/dev/null 2>&1; then
        echo "==> rustup component add $component"
        rustup component add "$component"
    fi
done

# command:package
tools=(cc:gcc c++:g++ make:make pkg-config:pkg-config valgrind:valgrind python3:python3)
missing=()
for entry in "${tools[@]}"; do
    command -v "${entry%%:*}" >/dev/null 2>&1 || missing+=("${entry#*:}")
done
# scripts/python-package.sh makes a venv: Debian's python3 needs python3-venv
# for that (ensurepip).
if ! command -v python3 >/dev/null 2>&1 || ! python3 -c 'import ensurepip, venv' >/dev/null 2>&1; then
    missing+=(python3-venv)
fi
if ((${#missing[@]} == 0)); then
    exit 0
fi
if [[ $(id -u) -eq 0 ]]; then
    as_root=()
elif command -v sudo >/dev/null 2>&1; then
    as_root=(sudo)
else
    echo "missing: ${missing[*]}; install them (apt-get install ${missing[*]} libc6-dev) as root" >&2
    exit 1
fi
echo "==> apt-get install ${missing[*]}"
"${as_root[@]}" apt-get update
"${as_root[@]}" env DEBIAN_FRONTEND=noninteractive \
    apt-get install -y --no-install-recommends "${missing[@]}" libc6-dev
