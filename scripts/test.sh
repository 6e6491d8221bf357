#!/usr/bin/env bash
# The one test command (README "Two commands"). Later issues append steps:
# ffi examples, header drift. The proptest state machine
# (tests/proptest_core.rs) runs in `cargo test --all-targets`.
set -euo pipefail
cd "$(dirname "$0")/.."

step() { printf '\n==> %s\n' "$*"; }

step "cargo fmt --all --check"
cargo fmt --all --check

step "cargo clippy --all-targets -- -D warnings"
cargo clippy --all-targets -- -D warnings

step "cargo test --all-targets"
cargo test --all-targets

step "cargo test --doc"
cargo test --doc

step "cargo run --example readme"
cargo run --example readme

# loom models (tests/loom_*.rs) of the real code on loom's twins; also checks
# that the library builds under loom. Bounds and run time: scripts/loom.sh.
step "scripts/loom.sh"
./scripts/loom.sh

# C ABI: header compiled alone, README C snippet, C (plain, valgrind,
# ASan/UBSan), C++ and Python hosts. The header drift test is in cargo test.
step "./scripts/ffi-examples.sh"
./scripts/ffi-examples.sh

step "all tests passed"
