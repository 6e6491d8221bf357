#!/usr/bin/env bash
# Regenerates include/kvgate.h from src/ffi/ with the cbindgen library pinned
# in Cargo.toml (the same code path as the drift test, tests/ffi_header.rs).
set -euo pipefail
cd "$(dirname "$0")/.."
KVGATE_BLESS=1 cargo test --quiet --test ffi_header committed_header_matches_the_code
git --no-pager diff --stat -- include/kvgate.h || true
