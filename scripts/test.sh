#!/usr/bin/env bash
# The one test command (README "Two commands"): everything, in order of cost.
# `cargo test` runs the unit and integration tests, the proptest state
# machine (tests/proptest_core.rs), the header drift check
# (tests/ffi_header.rs), the simulator's tests and the benches in test mode.
set -euo pipefail
cd "$(dirname "$0")/.."

# rustup installs into ~/.cargo/bin, which a non-login shell may not have on PATH.
if ! command -v cargo >/dev/null 2>&1; then
    export PATH="$HOME/.cargo/bin:$PATH"
fi

step() { printf '\n==> %s\n' "$*"; }

# A fresh machine: install what is missing (nothing, when all is there).
step "scripts/ensure-tools.sh"
./scripts/ensure-tools.sh

# Commit subjects made after be8dc7f: at most 72 characters (docs/README.md).
step "scripts/check-commits.sh"
./scripts/check-commits.sh

step "cargo fmt --all --check"
cargo fmt --all --check

step "cargo clippy --workspace --all-targets -- -D warnings"
cargo clippy --workspace --all-targets -- -D warnings

step "cargo test --workspace --all-targets"
cargo test --workspace --all-targets

step "cargo test --workspace --doc"
cargo test --workspace --doc

step "cargo doc --workspace --no-deps (warnings are errors)"
RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps

step "cargo run --example readme"
cargo run --example readme

# loom models (tests/loom_*.rs) of the real code on loom's twins; also checks
# that the library builds under loom. Bounds and run time: scripts/loom.sh.
step "scripts/loom.sh"
./scripts/loom.sh

# C ABI: header compiled alone, README C snippet, C (plain, valgrind,
# ASan/UBSan), C++ and Python hosts, blocking and event-loop. The header drift test is in cargo test.
step "./scripts/ffi-examples.sh"
./scripts/ffi-examples.sh

# The Python package (python/): built and installed into a venv outside the
# checkout, its tests against the installed wheel, a small benchmark run.
step "scripts/python-package.sh"
./scripts/python-package.sh

# The packages a GPU box installs: the kvgate sdist (the crate as `cargo
# package` ships it), a manylinux wheel built from that sdist (auditwheel
# repair) and the kvgate-vllm wheel, into dist/; then installed into a fresh
# venv with no Rust toolchain on PATH, where the README's Python snippet and
# the drop-in's tests run against them.
step "scripts/wheel-test.sh"
./scripts/wheel-test.sh

# The docs: every relative link in the Markdown resolves, and the README's
# Rust, C and Python snippets are the ones compiled and run (the Rust one is
# examples/readme.rs, the C one runs in ffi-examples.sh above).
step "scripts/check-docs.sh"
./scripts/check-docs.sh

# The simulator's main command on every scenario, outputs checked.
step "scripts/sim-smoke.sh"
scripts/sim-smoke.sh

# The cap-best search against the exhaustive sweep it stands in for: every K
# on four scenarios and five seeds (~1 min in release, far longer in debug,
# hence ignored by the plain `cargo test` above and run here).
step "cargo test --release -p kvgate-sim --test cap_search -- --ignored"
cargo test --release -p kvgate-sim --test cap_search -- --ignored

step "all tests passed"
