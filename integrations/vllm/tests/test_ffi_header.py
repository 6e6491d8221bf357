"""The ctypes binding (kvgate_vllm.ffi) against include/kvgate.h: every function
it calls, every struct and callback type it declares, parsed from the header.
No engine needed; fails when the header drifts from the binding."""

from __future__ import annotations

import ctypes
import re

import pytest

from kvgate_vllm import ffi

HEADER = (ffi.REPO / "include" / "kvgate.h").read_text()
CODE = re.sub(r"/\*.*?\*/", "", HEADER, flags=re.S)
CODE = re.sub(r"//[^\n]*", "", CODE)

OPAQUE = object()  # a pointer the binding passes through without reading

C_TYPES: dict[str, object] = {
    "void": None,
    "const char *": ctypes.c_char_p,
    "char *": ctypes.c_char_p,
    "bool": ctypes.c_bool,
    "double": ctypes.c_double,
    "size_t": ctypes.c_size_t,
    "uint32_t": ctypes.c_uint32,
    "uint64_t": ctypes.c_uint64,
    "int64_t": ctypes.c_int64,
    "kvgate_status": ctypes.c_uint32,
    "kvgate_reason": ctypes.c_uint32,
    "void *": ctypes.c_void_p,
    "size_t *": ctypes.POINTER(ctypes.c_size_t),
    "double *": ctypes.POINTER(ctypes.c_double),
    "const uint8_t *": ctypes.POINTER(ctypes.c_uint8),
    "const uint32_t *": ctypes.POINTER(ctypes.c_uint32),
    "struct kvgate_config *": ctypes.c_void_p,
    "const struct kvgate_config *": ctypes.c_void_p,
    "struct kvgate_gate *": ctypes.c_void_p,
    "struct kvgate_gate **": ctypes.POINTER(ctypes.c_void_p),
    "kvgate_usage_fn": ffi.USAGE_FN,
    "kvgate_prefix_fn": ffi.PREFIX_FN,
    "kvgate_capacity_fn": ffi.CAPACITY_FN,
    "uint64_t *": ctypes.POINTER(ctypes.c_uint64),
    "uint32_t *": ctypes.POINTER(ctypes.c_uint32),
    "struct kvgate_admission *": ctypes.POINTER(ffi.Admission),
    "struct kvgate_session_stats *": OPAQUE,  # always passed as NULL
}


def _norm(c_type: str) -> str:
    return re.sub(r"\s*\*", " *", " ".join(c_type.split())).replace("* *", "**")


def declarations() -> dict[str, tuple[str, list[str]]]:
    """name -> (return type, [parameter types]) for every kvgate_* function."""
    out = {}
    for ret, name, params in re.findall(r"^([\w ]+?\**)\s*\b(kvgate_\w+)\(([^)]*)\);", CODE, re.M):
        types = []
        for param in params.split(","):
            param = param.strip()
            if param in ("void", ""):
                continue
            types.append(_norm(re.sub(r"\b\w+$", "", param)))
        out[name] = (_norm(ret), types)
    return out


DECLS = declarations()


def _same(c_type: str, ours: object) -> bool:
    theirs = C_TYPES[c_type]
    if theirs is OPAQUE:
        return ours is ctypes.c_void_p
    return theirs is ours or (theirs is not None and ours is not None and ctypes.sizeof(theirs) == ctypes.sizeof(ours) and getattr(theirs, "_type_", None) == getattr(ours, "_type_", None) and theirs.__name__ == ours.__name__)


def test_parser_sees_the_header() -> None:
    assert len(DECLS) >= len(ffi.SIGNATURES), sorted(DECLS)


@pytest.mark.parametrize("name", sorted(ffi.SIGNATURES))
def test_function_signature(name: str) -> None:
    assert name in DECLS, f"{name} is no longer declared in include/kvgate.h"
    ret, params = DECLS[name]
    restype, argtypes = ffi.SIGNATURES[name]
    assert ret in C_TYPES, f"{name}: unmapped return type {ret!r}"
    assert _same(ret, restype), f"{name}: returns {ret}, binding says {restype}"
    assert len(params) == len(argtypes), f"{name}: header {params}, binding {argtypes}"
    for i, (c_type, ours) in enumerate(zip(params, argtypes)):
        assert c_type in C_TYPES, f"{name}: unmapped parameter type {c_type!r}"
        assert _same(c_type, ours), f"{name} arg {i}: header {c_type}, binding {ours}"


#: Setters that are not knobs: the binding calls them itself.
PROBE_SETTERS = {"kvgate_config_set_probes", "kvgate_config_set_capacity_probe"}


def test_every_config_knob_takes_a_double_or_a_named_value() -> None:
    """The policy spec passes knobs as kvgate_config_set_<knob>(config, double),
    or a name as the header constant KVGATE_<KNOB>_<NAME> (uint32_t)."""
    setters = {n: d for n, d in DECLS.items() if n.startswith("kvgate_config_set_") and n not in PROBE_SETTERS}
    assert setters, "no kvgate_config_set_* in the header"
    restype, argtypes = ffi.SETTER_SIGNATURE
    for name, (ret, params) in setters.items():
        assert _same(ret, restype) and len(params) == 2, f"{name}: {ret} {params}"
        assert _same(params[0], argtypes[0]), f"{name}: {params}"
        assert params[1] in ("double", "uint32_t"), f"{name}: {params} is not (config, double | uint32_t)"


def _struct_fields(c_name: str) -> list[tuple[str, str]]:
    body = re.search(rf"typedef struct {c_name} \{{(.*?)\}} {c_name};", CODE, re.S)
    assert body, f"struct {c_name} not found"
    return [(n, _norm(t)) for t, n in re.findall(r"^\s*([\w ]+?\**)\s*(\w+);", body.group(1), re.M)]


def test_admission_struct() -> None:
    fields = _struct_fields("kvgate_admission")
    assert [n for n, _ in fields] == [n for n, _ in ffi.Admission._fields_]
    for (name, c_type), (_, ours) in zip(fields, ffi.Admission._fields_):
        assert _same(c_type, ours), f"kvgate_admission.{name}: {c_type} vs {ours}"


def test_callbacks() -> None:
    for typedef, ours in (
        ("kvgate_usage_fn", ffi.USAGE_FN),
        ("kvgate_prefix_fn", ffi.PREFIX_FN),
        ("kvgate_capacity_fn", ffi.CAPACITY_FN),
    ):
        m = re.search(rf"typedef (\w+) \(\*{typedef}\)\(([^)]*)\);", CODE, re.S)
        assert m, typedef
        params = [_norm(re.sub(r"\b\w+$", "", p.strip())) for p in m.group(2).split(",")]
        assert _same(m.group(1), ours._restype_)
        assert len(params) == len(ours._argtypes_), f"{typedef}: {params}"
        for c_type, py in zip(params, ours._argtypes_):
            assert _same(c_type, py), f"{typedef}: {c_type} vs {py}"


def test_enum_values() -> None:
    for enum, prefix in ((ffi.Status, "KVGATE_"), (ffi.Reason, "KVGATE_REASON_")):
        for member in enum:
            m = re.search(rf"\b{prefix}{member.name} = (\d+),", CODE)
            assert m and int(m.group(1)) == member.value, f"{prefix}{member.name}"


def test_the_library_loads_and_answers() -> None:
    assert ffi.version().startswith("0.")
    gate = ffi.Gate({"admission_mode": "reference", "high_watermark": 0.5}, usage=lambda s: 0.1, prefix=None)
    try:
        adm = gate.acquire(b"s", [1, 2, 3])
        assert adm.lease != 0 and ffi.Reason(adm.reason) == ffi.Reason.OPEN
        assert gate.release(adm.lease) and not gate.release(adm.lease)
        assert "kvgate_" in gate.metrics_text()
        assert gate.finish_session(b"s")
    finally:
        gate.free()
    # The default, working-set admission, with the capacity the binding answers.
    gate = ffi.Gate({}, usage=lambda s: 0.1, prefix=None)
    try:
        gate.set_capacity(4, 1)
        first = gate.acquire(b"a", [1, 2, 3])
        assert ffi.Reason(first.reason) == ffi.Reason.EMPTY_WORKING_SET
        with pytest.raises(ffi.NotAdmitted, match="TIMED_OUT"):
            gate.acquire(b"b", [1, 2, 3], timeout=0.0)  # 3 + 3 tokens do not fit in 4
        assert gate.release_with_report(first.lease, 0, 1)
        assert "kvgate_working_set_capacity_tokens 4" in gate.metrics_text()
    finally:
        gate.free()
    with pytest.raises(ffi.KvgateError, match="unknown kvgate knob"):
        ffi.make_config({"no_such_knob": 1.0})
