"""The binding (kvgate/_ffi.py) against the header the package ships
(kvgate/kvgate.h): every enum value, #define, struct layout, callback type
and function signature the binding declares is compared with the header's,
and every function and callback of the header must be declared. The header
is parsed here, with no C compiler."""

from __future__ import annotations

import ctypes
import dataclasses
import re
from typing import Dict, List, Tuple

import pytest

import kvgate
from kvgate import _ffi

from conftest import REPO

HEADER = _ffi.HEADER.read_text()


def strip_comments(text: str) -> str:
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    return re.sub(r"//[^\n]*", "", text)


CODE = strip_comments(HEADER)

SCALARS = {
    "uint8_t": ctypes.c_uint8,
    "uint32_t": ctypes.c_uint32,
    "uint64_t": ctypes.c_uint64,
    "int32_t": ctypes.c_int32,
    "int64_t": ctypes.c_int64,
    "size_t": ctypes.c_size_t,
    "double": ctypes.c_double,
    "bool": ctypes.c_bool,
    "kvgate_status": ctypes.c_uint32,
    "kvgate_reason": ctypes.c_uint32,
    "kvgate_step_kind": ctypes.c_uint32,
    "kvgate_admission_mode": ctypes.c_uint32,
}


def c_type(decl: str):
    """The ctypes twin of a C type as the header spells it."""
    decl = " ".join(decl.replace("*", " * ").split())
    const = decl.startswith("const ")
    decl = decl.removeprefix("const ").removeprefix("struct ")
    stars = decl.count("*")
    base = decl.replace("*", "").strip()
    if base == "void" and stars == 0:
        return None
    if base == "void" and stars == 1:
        return ctypes.c_void_p
    if base == "char" and stars == 1:
        return ctypes.c_char_p
    if base == "uint8_t" and stars == 1 and const:
        return _ffi.u8_buf  # a byte buffer with its length beside it
    if base in SCALARS:
        t = SCALARS[base]
    elif base in _ffi.STRUCTS:
        t = _ffi.STRUCTS[base]
    elif base in _ffi.CALLBACKS:
        t = _ffi.CALLBACKS[base]
    elif hasattr(_ffi, base):  # an opaque handle
        t = getattr(_ffi, base)
    else:
        raise AssertionError(f"no ctypes twin for C type {decl!r}")
    for _ in range(stars):
        t = ctypes.POINTER(t)
    return t


def split_params(params: str) -> List[str]:
    params = " ".join(params.split())
    if params in ("", "void"):
        return []
    types = []
    for p in params.split(","):
        p = p.strip()
        name = re.search(r"(\w+)$", p).group(1)
        types.append(p[: -len(name)].strip())
    return types


def header_enums() -> Dict[str, Dict[str, int]]:
    enums = {}
    for name, body in re.findall(r"enum (kvgate_\w+)\s*(?:#if.*?#endif)?\s*\{(.*?)\};", CODE, re.S):
        enums[name] = {k: int(v) for k, v in re.findall(r"(KVGATE_\w+) = (\d+),", body)}
    return enums


def header_structs() -> Dict[str, List[Tuple[str, str]]]:
    structs = {}
    for name, body in re.findall(r"typedef struct (kvgate_\w+) \{(.*?)\} \1;", CODE, re.S):
        structs[name] = [(f, t) for t, f in re.findall(r"^\s*((?:struct )?\w+) (\w+);", body, re.M)]
    return structs


def header_callbacks() -> Dict[str, Tuple[str, List[str]]]:
    return {
        name: (ret, split_params(params))
        for ret, name, params in re.findall(r"typedef (\w+) \(\*(\w+)\)\((.*?)\);", CODE, re.S)
    }


def header_functions() -> Dict[str, Tuple[str, List[str]]]:
    body = CODE.split('extern "C" {', 1)[1]
    found = {}
    for ret, name, params in re.findall(
        r"^((?:const )?(?:struct )?\w+(?: ?\*)?)\s*(kvgate_\w+)\((.*?)\);", body, re.S | re.M
    ):
        found[name] = (ret, split_params(params))
    return found


def test_shipped_header_is_the_repository_header():
    repo_header = REPO / "include" / "kvgate.h"
    if not repo_header.exists():
        pytest.skip("not run from a repository checkout")
    assert HEADER == repo_header.read_text(), "reinstall the package: the shipped header is stale"


def test_library_version_matches_the_header():
    major, minor, patch = (
        int(re.search(rf"#define KVGATE_VERSION_{p} (\d+)", HEADER).group(1)) for p in ("MAJOR", "MINOR", "PATCH")
    )
    assert kvgate.version() == f"{major}.{minor}.{patch}"


def test_defines():
    for name, value in _ffi.DEFINES.items():
        assert int(re.search(rf"#define {name} (\d+)", HEADER).group(1)) == value, name


def test_enums():
    enums = header_enums()
    assert set(enums) == set(_ffi.ENUMS), "an enum of the header has no twin (or vice versa)"
    for c_name, (py, prefix) in _ffi.ENUMS.items():
        ours = {prefix + m.name: m.value for m in py}
        assert ours == enums[c_name], c_name


def test_struct_layouts():
    structs = header_structs()
    assert set(structs) == set(_ffi.STRUCTS)
    for c_name, py in _ffi.STRUCTS.items():
        theirs = [(field, c_type(t)) for field, t in structs[c_name]]
        ours = [(field, t) for field, t in py._fields_]
        assert ours == theirs, c_name


def test_stats_dataclasses_carry_every_field():
    for dc, struct in ((kvgate.Stats, _ffi.kvgate_stats), (kvgate.SessionStats, _ffi.kvgate_session_stats)):
        assert [f.name for f in dataclasses.fields(dc)] == [n for n, _ in struct._fields_ if n != "size"]


def test_callback_types():
    callbacks = header_callbacks()
    assert set(callbacks) == set(_ffi.CALLBACKS)
    for name, (ret, params) in callbacks.items():
        ours = _ffi.CALLBACKS[name]
        assert ours._restype_ == c_type(ret), name
        assert list(ours._argtypes_) == [c_type(p) for p in params], name


def test_functions():
    functions = header_functions()
    assert len(functions) > 30, "the parser found too few functions"
    missing = set(functions) - set(_ffi.FUNCTIONS) - _ffi.UNBOUND
    assert not missing, f"header functions the binding does not declare: {sorted(missing)}"
    extra = set(_ffi.FUNCTIONS) - set(functions)
    assert not extra, f"the binding declares functions the header does not have: {sorted(extra)}"
    for name, (ret, params) in functions.items():
        restype, argtypes = _ffi.FUNCTIONS[name]
        assert restype == c_type(ret), f"{name} returns {ret}"
        assert argtypes == [c_type(p) for p in params], f"{name}({', '.join(params)})"


def test_loaded_functions_carry_the_declared_signatures():
    lib = _ffi.load()
    for name, (restype, argtypes) in _ffi.FUNCTIONS.items():
        fn = getattr(lib, name)
        assert fn.restype == restype and list(fn.argtypes) == argtypes, name


def test_the_parser_sees_a_drift():
    """A mutated header is caught: the checks are not vacuous."""
    global CODE
    saved = CODE
    try:
        CODE = saved.replace("KVGATE_OUT_OF_ORDER = 10", "KVGATE_OUT_OF_ORDER = 12")
        with pytest.raises(AssertionError):
            test_enums()
        CODE = saved.replace("uint64_t sleep_ns;", "uint32_t sleep_ns;")
        with pytest.raises(AssertionError):
            test_struct_layouts()
        CODE = saved.replace("kvgate_status kvgate_tick(struct kvgate_gate *gate, uint64_t *out_until_ns",
                             "kvgate_status kvgate_tick(struct kvgate_gate *gate, int64_t *out_until_ns")
        with pytest.raises(AssertionError):
            test_functions()
    finally:
        CODE = saved
