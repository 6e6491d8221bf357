"""Hatchling build hook: builds the Rust cdylib and bundles it in the wheel.

Runs `cargo build --release --lib` on the repository's Cargo.toml (one level
up), then force-includes target/[<triple>/]release/libkvgate.so as
kvgate/libkvgate.so and include/kvgate.h as kvgate/kvgate.h (the header the
binding's drift test checks against), and tags the wheel
py3-none-<platform>: the library does not depend on Python's ABI.

Cargo's own environment is honoured: CARGO (the cargo to run),
CARGO_TARGET_DIR, CARGO_BUILD_TARGET (a cross build: the platform tag follows
the target triple) and its linker variables.
"""

from __future__ import annotations

import os
import pathlib
import shutil
import subprocess
import sysconfig

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
        if self.target_name != "wheel":
            return
        manifest = REPO / "Cargo.toml"
        header = REPO / "include" / "kvgate.h"
        if not manifest.exists() or not header.exists():
            raise RuntimeError(
                f"kvgate: {manifest} or {header} is missing: build the wheel from the "
                "repository checkout (pip install ./python)"
            )
        triple = os.environ.get("CARGO_BUILD_TARGET", "")
        command = [_cargo(), "build", "--release", "--lib", "--locked", "--manifest-path", str(manifest)]
        self.app.display_info(f"kvgate: {' '.join(command)}")
        subprocess.run(command, check=True, cwd=REPO)
        target_dir = pathlib.Path(os.environ.get("CARGO_TARGET_DIR") or REPO / "target")
        if not target_dir.is_absolute():
            target_dir = REPO / target_dir
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
