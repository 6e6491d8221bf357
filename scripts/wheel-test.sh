#!/usr/bin/env bash
# The packages as a GPU box gets them: builds dist/ (scripts/build-wheels.sh),
# then installs the built wheels into a fresh venv in a temporary folder, in
# an environment with no Rust toolchain (a PATH of the venv, /usr/bin and
# /bin, checked to hold no cargo or rustc; HOME a new empty folder, so no
# ~/.cargo; nothing else from the caller's environment), with pip refusing
# anything but wheels and any index. It installs the plugin by name
# (`pip install kvgate-vllm==<v> --find-links dist/`): pip resolves kvgate
# from the plugin's Requires-Dist to the built manylinux wheel. There it
# runs the README's Python snippet and the drop-in's tests
# (python/tests/test_session_scheduler.py, test_proxy_http.py with their
# conftest.py) against the installed wheel, and checks the plugin wheel's
# vLLM entry point and its Requires-Dist. Called by scripts/test.sh.
#
# pytest, aiohttp and what they pull in come from a wheelhouse under
# ~/.cache/kvgate/wheelhouse (the pins of python/requirements-dev.txt but
# the build backend's), filled once per content of that file: later runs
# need no network.
set -euo pipefail
cd "$(dirname "$0")/.."
root="$(pwd)"

step() { printf '\n--> %s\n' "$*"; }
fail() { printf 'wheel-test: %s\n' "$*" >&2; exit 1; }

./scripts/build-wheels.sh

version=$(sed -n 's/^version = "\(.*\)"$/\1/p' Cargo.toml | head -1)
shopt -s nullglob
wheels=(dist/kvgate-"$version"-py3-none-manylinux*_x86_64.whl)
plugin=(dist/kvgate_vllm-"$version"-py3-none-any.whl)
shopt -u nullglob
((${#wheels[@]} == 1)) || fail "expected one manylinux kvgate wheel in dist/, found ${#wheels[@]}"
((${#plugin[@]} == 1)) || fail "expected the kvgate_vllm wheel in dist/"

# The interpreter itself, not a shim that needs the caller's environment.
python=$("${PYTHON:-python3}" -c 'import sys; print(sys.executable)')

wheelhouse="${KVGATE_WHEELHOUSE:-$HOME/.cache/kvgate/wheelhouse}"
stamp="$wheelhouse/.kvgate-requirements"
if ! cmp -s python/requirements-dev.txt "$stamp"; then
    step "the tests' wheels into $wheelhouse (the pins of python/requirements-dev.txt)"
    mkdir -p "$wheelhouse"
    pins=$(grep -E '^[A-Za-z]' python/requirements-dev.txt |
        grep -vE '^(hatchling|pathspec|tomlkit|trove-classifiers)==')
    # shellcheck disable=SC2086
    "$python" -m pip download --quiet --only-binary :all: --no-deps -d "$wheelhouse" $pins
    cp python/requirements-dev.txt "$stamp"
fi

tmp=$(mktemp -d "${TMPDIR:-/tmp}/kvgate-wheel-test.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/home" "$tmp/tests"
"$python" -m venv "$tmp/venv"
clean=(env -i "PATH=$tmp/venv/bin:/usr/bin:/bin" "HOME=$tmp/home" "TMPDIR=$tmp" PYTHONDONTWRITEBYTECODE=1
    PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_INDEX=1 PIP_CONFIG_FILE=/dev/null)

step "no Rust toolchain in the install environment"
if "${clean[@]}" sh -c 'command -v cargo || command -v rustc'; then
    fail "cargo or rustc is on the clean PATH: this test would not show the wheel needs none"
fi
echo "PATH=$tmp/venv/bin:/usr/bin:/bin: no cargo, no rustc; HOME empty"

step "pip install kvgate-vllm==$version --find-links dist/ (--no-index --only-binary :all:)"
(cd "$tmp" && "${clean[@]}" python -m pip install --quiet --only-binary :all: --find-links "$root/dist" \
    --find-links "$wheelhouse" "kvgate-vllm==$version" pytest aiohttp)
"${clean[@]}" python - "$tmp/venv" "$version" "${wheels[0]##*/}" <<'PY'
import importlib.metadata as md, os, sys
import kvgate
venv, version, wheel = sys.argv[1:]
requires = md.requires("kvgate-vllm")
major, minor, _ = version.split(".")
assert len(requires) == 1 and requires[0].startswith("kvgate") and set(requires[0][len("kvgate"):].split(",")) == {
    f">={version}", f"<{major}.{int(minor) + 1}"}, requires
# Resolved (no direct URL: pip found it by name), and the wheel built here (its tags).
dist = md.distribution("kvgate")
assert dist.read_text("direct_url.json") is None, dist.read_text("direct_url.json")
tags = {line.split(": ", 1)[1] for line in dist.read_text("WHEEL").splitlines() if line.startswith("Tag: ")}
assert tags == {f"py3-none-{t}" for t in wheel[:-len(".whl")].split("-")[-1].split(".")}, (tags, wheel)
assert kvgate.__file__.startswith(venv), f"kvgate imported from {kvgate.__file__}, not the fresh venv"
assert "KVGATE_LIBRARY" not in os.environ
assert kvgate.version() == kvgate.__version__ == version, (kvgate.version(), kvgate.__version__, version)
assert str(kvgate.library_path()).startswith(venv), kvgate.library_path()
plugins = {e.name: e.value for e in md.entry_points(group="vllm.general_plugins")}
assert plugins.get("kvgate") == "kvgate_vllm.plugin:register", plugins
print("kvgate", kvgate.version(), "from", kvgate.library_path(), "| vllm plugin entry point:", plugins["kvgate"])
print("kvgate-vllm requires", requires[0], "| kvgate resolved to", wheel)
PY

step "the README's Python snippet, against the installed wheel"
awk '
    index($0, "<!-- readme-python-snippet") == 1 { marked = 1; next }
    marked && $0 == "```python" { inside = 1; next }
    inside && /^```$/ { exit }
    inside { print }' README.md >"$tmp/readme_snippet.py"
[[ -s "$tmp/readme_snippet.py" ]] || fail "the README's Python block (after its readme-python-snippet marker) is empty"
out=$(cd "$tmp" && "${clean[@]}" python -W error::ResourceWarning readme_snippet.py)
echo "$out"
grep -q '^admitted: ' <<<"$out" || fail "the README snippet printed no admission"

step "the drop-in's tests (python/tests/test_session_scheduler.py, test_proxy_http.py), against the installed wheel"
cp python/tests/conftest.py python/tests/test_session_scheduler.py python/tests/test_proxy_http.py "$tmp/tests/"
(cd "$tmp/tests" && "${clean[@]}" python -m pytest -q -p no:cacheprovider test_session_scheduler.py test_proxy_http.py)

step "wheel test passed: ${wheels[0]##*/}, ${plugin[0]##*/}"
