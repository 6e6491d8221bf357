"""Hatchling build hook: builds the Rust cdylib and bundles it in the wheel,
and puts the crate in the sdist.

Wheel: runs `cargo build --release --lib --locked` on the crate (the
repository's Cargo.toml one level up; in an unpacked sdist, crate/), then
force-includes target/[<triple>/]release/libkvgate.so as kvgate/libkvgate.so
and include/kvgate.h as kvgate/kvgate.h (the header the binding's drift test
checks against), and tags the wheel py3-none-<platform>: the library does not
depend on Python's ABI. `auditwheel repair` then gives it a manylinux tag
(scripts/build-wheels.sh).

Sdist: runs `cargo package --no-verify --locked` on the repository's crate
(with --allow-dirty only when KVGATE_ALLOW_DIRTY=1) and puts the packaged
crate (its normalised Cargo.toml, Cargo.lock, src/ and include/) under
crate/, so that the sdist builds a wheel on a machine with cargo and no
checkout. Building the wheel from it is what verifies the packaged crate.

Cargo's own environment is honoured: CARGO (the cargo to run),
CARGO_TARGET_DIR, CARGO_BUILD_TARGET (a cross build: the platform tag follows
the target triple), its linker variables and its profile variables
(scripts/build-wheels.sh strips the library with CARGO_PROFILE_RELEASE_*).

KVGATE_ZIG_GLIBC=2.17 (a glibc version) builds with `cargo zigbuild --target
<triple>.2.17` instead (cargo-zigbuild and ziglang from PyPI: zig links
against that glibc's symbols), so the library needs no newer glibc than that
and `auditwheel repair` can tag the wheel for it (2.17: manylinux2014). The
triple is CARGO_BUILD_TARGET's, else this machine's.
"""

from __future__ import annotations

import os
import pathlib
import shutil
import subprocess
import sysconfig
import tarfile

from hatchling.builders.hooks.plugin.interface import BuildHookInterface

HERE = pathlib.Path(__file__).resolve().parent
REPO = HERE.parent

# Target triples a wheel is made for, and their wheel platform tags.
PLATFORMS = {
    "x86_64-unknown-linux-gnu": "linux_x86_64",
    "aarch64-unknown-linux-gnu": "linux_aarch64",
}


def _cargo() -> str:
    cargo = os.environ.get("CARGO") or shutil.which("cargo")
    if cargo is None:
        home = pathlib.Path.home() / ".cargo" / "bin" / "cargo"
        if home.exists():
            cargo = str(home)
    if cargo is None:
        raise RuntimeError("kvgate: cargo not found (install Rust, or set CARGO)")
    return cargo


class KvgateBuildHook(BuildHookInterface):
    PLUGIN_NAME = "custom"

    def initialize(self, version: str, build_data: dict) -> None:
        if self.target_name == "sdist":
            self._sdist(build_data)
            return
        if self.target_name != "wheel":
            return
        crate = _crate_root()
        manifest = crate / "Cargo.toml"
        header = crate / "include" / "kvgate.h"
        if not manifest.exists() or not header.exists():
            raise RuntimeError(
                f"kvgate: {manifest} or {header} is missing: build the wheel from the "
                "repository checkout (pip install ./python) or from the kvgate sdist"
            )
        triple = os.environ.get("CARGO_BUILD_TARGET", "")
        command = [_cargo(), "build", "--release", "--lib", "--locked", "--manifest-path", str(manifest)]
        glibc = os.environ.get("KVGATE_ZIG_GLIBC", "")
        if glibc:
            triple = triple or f"{os.uname().machine}-unknown-linux-gnu"
            command[1:2] = ["zigbuild", "--target", f"{triple}.{glibc}"]
        self.app.display_info(f"kvgate: {' '.join(command)}")
        subprocess.run(command, check=True, cwd=crate)
        target_dir = pathlib.Path(os.environ.get("CARGO_TARGET_DIR") or crate / "target")
        if not target_dir.is_absolute():
            target_dir = crate / target_dir
        library = target_dir / triple / "release" / "libkvgate.so"
        if not library.exists():
            raise RuntimeError(f"kvgate: cargo succeeded but {library} does not exist")

        build_data["force_include"][str(library)] = "kvgate/libkvgate.so"
        build_data["force_include"][str(header)] = "kvgate/kvgate.h"
        build_data["pure_python"] = False
        if triple:
            if triple not in PLATFORMS:
                raise RuntimeError(f"kvgate: no wheel platform tag known for {triple}: add it to PLATFORMS")
            platform = PLATFORMS[triple]
        else:
            platform = sysconfig.get_platform().replace("-", "_").replace(".", "_")
        build_data["tag"] = f"py3-none-{platform}"

    def _sdist(self, build_data: dict) -> None:
        manifest = REPO / "Cargo.toml"
        if not manifest.exists():
            if (HERE / "crate" / "Cargo.toml").exists():
                return  # an sdist rebuilt from an unpacked sdist: crate/ is in the tree
            raise RuntimeError(f"kvgate: {manifest} is missing: build the sdist from the repository checkout")
        command = [_cargo(), "package", "--no-verify", "--locked", "--manifest-path", str(manifest)]
        if os.environ.get("KVGATE_ALLOW_DIRTY") == "1":
            command.append("--allow-dirty")
        self.app.display_info(f"kvgate: {' '.join(command)}")
        subprocess.run(command, check=True, cwd=REPO)
        target_dir = pathlib.Path(os.environ.get("CARGO_TARGET_DIR") or REPO / "target")
        if not target_dir.is_absolute():
            target_dir = REPO / target_dir
        name = f"kvgate-{_crate_version(manifest)}"
        packaged = target_dir / "package" / f"{name}.crate"
        unpacked = target_dir / "kvgate-sdist-crate"
        shutil.rmtree(unpacked, ignore_errors=True)
        unpacked.mkdir(parents=True)
        with tarfile.open(packaged) as crate:
            try:
                crate.extractall(unpacked, filter="data")
            except TypeError:  # a Python without extraction filters; the tarball is cargo's, just made
                crate.extractall(unpacked)
        build_data["force_include"][str(unpacked / name)] = "crate"


def _crate_root() -> pathlib.Path:
    """The crate to build: the checkout's, else the one an sdist carries."""
    if (REPO / "Cargo.toml").exists():
        return REPO
    return HERE / "crate"


def _crate_version(manifest: pathlib.Path) -> str:
    try:
        import tomllib
    except ImportError:  # Python < 3.11: hatchling depends on tomli there
        import tomli as tomllib  # type: ignore[no-redef]
    return tomllib.loads(manifest.read_text())["package"]["version"]
