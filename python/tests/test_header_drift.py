"""The binding (kvgate/_ffi.py) against the header the package ships
(kvgate/kvgate.h), through kvgate._drift: every enum value, #define, struct
layout, callback type and function signature, and every function of the
header must be declared."""

from __future__ import annotations

import ctypes
import dataclasses
import re

import pytest

import kvgate
from kvgate import _drift, _ffi

from conftest import REPO

HEADER = _ffi.HEADER.read_text()


def test_the_binding_matches_the_shipped_header():
    assert _drift.mismatches(HEADER) == []


def test_shipped_header_is_the_repository_header():
    repo_header = REPO / "include" / "kvgate.h"
    if not repo_header.exists():
        pytest.skip("not run from a repository checkout")
    assert HEADER == repo_header.read_text(), "reinstall the package: the shipped header is stale"


def test_the_parser_sees_every_declaration():
    code = _drift.strip_comments(HEADER)
    assert set(_drift.functions(code)) == set(_ffi.FUNCTIONS)
    assert set(_drift.structs(code)) == set(_ffi.STRUCTS)
    assert set(_drift.enums(code)) == set(_ffi.ENUMS)
    assert set(_drift.callbacks(code)) == set(_ffi.CALLBACKS)
    assert len(_drift.structs(code)["kvgate_stats"]) == len(_ffi.kvgate_stats._fields_)


@pytest.mark.parametrize(
    "before, after, what",
    [
        ("KVGATE_OUT_OF_ORDER = 10", "KVGATE_OUT_OF_ORDER = 12", "enum kvgate_status"),
        ("uint64_t sleep_ns;", "uint32_t sleep_ns;", "struct kvgate_step"),
        ("    double idle_sec;\n} kvgate_session_stats;", "    double idle_sec;\n    uint64_t new_figure;\n} kvgate_session_stats;",
         "struct kvgate_session_stats"),
        ("kvgate_status kvgate_tick(struct kvgate_gate *gate, uint64_t *out_until_ns",
         "kvgate_status kvgate_tick(struct kvgate_gate *gate, int64_t *out_until_ns", "function kvgate_tick"),
        ("kvgate_status kvgate_now_ns(", "kvgate_status kvgate_now_ns2(", "function kvgate_now_ns"),
        ("#define KVGATE_VERSION_MINOR 2", "#define KVGATE_VERSION_MINOR 3", "#define KVGATE_VERSION_MINOR"),
        ("typedef void (*kvgate_wake_fn)(void *user_data, uint64_t tag);",
         "typedef void (*kvgate_wake_fn)(void *user_data, uint32_t tag);", "callback kvgate_wake_fn"),
    ],
)
def test_a_drift_is_reported(before, after, what):
    assert before in HEADER
    problems = _drift.mismatches(HEADER.replace(before, after))
    assert any(p.startswith(what) for p in problems), problems


def test_library_version_matches_the_header():
    parts = [int(re.search(rf"#define KVGATE_VERSION_{p} (\d+)", HEADER).group(1)) for p in ("MAJOR", "MINOR", "PATCH")]
    assert kvgate.version() == ".".join(map(str, parts))


def test_stats_dataclasses_carry_every_field():
    for dc, struct in ((kvgate.Stats, _ffi.kvgate_stats), (kvgate.SessionStats, _ffi.kvgate_session_stats)):
        assert [f.name for f in dataclasses.fields(dc)] == [n for n, _ in struct._fields_ if n != "size"]
    s = _ffi.kvgate_stats()
    assert ctypes.sizeof(s) % 8 == 0


def test_loaded_functions_carry_the_declared_signatures():
    lib = _ffi.load()
    for name, (restype, argtypes) in _ffi.FUNCTIONS.items():
        fn = getattr(lib, name)
        assert fn.restype == restype and list(fn.argtypes) == argtypes, name


def test_the_library_writes_every_stats_field():
    gate = kvgate.Gate()
    out = _ffi.kvgate_stats()
    with gate._use() as g:
        assert _ffi.load().kvgate_get_stats(g, ctypes.byref(out), ctypes.sizeof(out)) == 0
    assert out.size == ctypes.sizeof(out)
    gate.close()
