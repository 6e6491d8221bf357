"""Where the library comes from: the bundled one, or KVGATE_LIBRARY."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import kvgate
from kvgate import _ffi


def test_the_bundled_library_is_used_by_default():
    if os.environ.get(_ffi.LIBRARY_ENV):
        return
    kvgate.version()
    assert kvgate.loaded_path() == _ffi.BUNDLED_LIBRARY.resolve()


def test_kvgate_library_names_a_library_built_elsewhere(tmp_path):
    elsewhere = tmp_path / "lib" / "libkvgate.so"
    elsewhere.parent.mkdir()
    shutil.copy(_ffi.BUNDLED_LIBRARY, elsewhere)
    code = "import kvgate; kvgate.Gate().close(); print(kvgate.loaded_path())"
    env = dict(os.environ, KVGATE_LIBRARY=str(elsewhere))
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == str(elsewhere.resolve())


def test_a_missing_library_is_a_clear_error(tmp_path):
    code = "import kvgate; kvgate.Gate()"
    env = dict(os.environ, KVGATE_LIBRARY=str(tmp_path / "nope.so"))
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.returncode != 0 and "nope.so" in out.stderr
