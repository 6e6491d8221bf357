"""The binding (``_ffi``) compared with a kvgate.h, declaration by
declaration, by parsing the header's text (no C compiler needed).

:func:`mismatches` returns every difference: an enum value, a ``#define``,
a struct field (name, type, order), a callback type or a function signature
(return and argument types) that the binding declares differently, and any
function or callback of the header the binding does not declare. The
package's tests run it on the shipped header (``kvgate/kvgate.h``);
``python -m kvgate._drift [path/to/kvgate.h]`` runs it on any header.
"""

from __future__ import annotations

import ctypes
import pathlib
import re
import sys
from typing import Dict, List, Tuple

from . import _ffi

SCALARS = {
    "uint8_t": ctypes.c_uint8,
    "uint32_t": ctypes.c_uint32,
    "uint64_t": ctypes.c_uint64,
    "int32_t": ctypes.c_int32,
    "int64_t": ctypes.c_int64,
    "size_t": ctypes.c_size_t,
    "double": ctypes.c_double,
    "bool": ctypes.c_bool,
    # C99 typedefs of the enums: uint32_t.
    "kvgate_status": ctypes.c_uint32,
    "kvgate_reason": ctypes.c_uint32,
    "kvgate_step_kind": ctypes.c_uint32,
    "kvgate_admission_mode": ctypes.c_uint32,
}


def strip_comments(text: str) -> str:
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    return re.sub(r"//[^\n]*", "", text)


def c_type(decl: str):
    """The ctypes twin of a C type as the header spells it."""
    decl = " ".join(decl.replace("*", " * ").split())
    const = decl.startswith("const ")
    decl = decl[len("const "):] if const else decl
    decl = decl[len("struct "):] if decl.startswith("struct ") else decl
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
    elif base.startswith("kvgate_") and isinstance(getattr(_ffi, base, None), type):
        t = getattr(_ffi, base)  # an opaque handle
    else:
        raise ValueError(f"no ctypes twin for C type {decl!r}")
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


def enums(code: str) -> Dict[str, Dict[str, int]]:
    found = {}
    for name, body in re.findall(r"enum (kvgate_\w+)\s*(?:#if.*?#endif)?\s*\{(.*?)\};", code, re.S):
        found[name] = {k: int(v) for k, v in re.findall(r"(KVGATE_\w+) = (\d+),", body)}
    return found


def defines(code: str) -> Dict[str, int]:
    return {k: int(v) for k, v in re.findall(r"^#define (KVGATE_\w+) (\d+)$", code, re.M)}


def structs(code: str) -> Dict[str, List[Tuple[str, str]]]:
    found = {}
    for name, body in re.findall(r"typedef struct (kvgate_\w+) \{(.*?)\} \1;", code, re.S):
        found[name] = [(f, t) for t, f in re.findall(r"^\s*((?:struct )?\w+) (\w+);", body, re.M)]
    return found


def callbacks(code: str) -> Dict[str, Tuple[str, List[str]]]:
    return {
        name: (ret, split_params(params))
        for ret, name, params in re.findall(r"typedef (\w+) \(\*(\w+)\)\((.*?)\);", code, re.S)
    }


def functions(code: str) -> Dict[str, Tuple[str, List[str]]]:
    body = code.split('extern "C" {', 1)[-1]
    found = {}
    for ret, name, params in re.findall(
        r"^((?:const )?(?:struct )?\w+(?: ?\*)?)\s*(kvgate_\w+)\((.*?)\);", body, re.S | re.M
    ):
        found[name] = (ret, split_params(params))
    return found


def _name(t) -> str:
    return "void" if t is None else getattr(t, "__name__", repr(t))


def mismatches(header_text: str) -> List[str]:
    """Every difference between the binding and this header ([] = none)."""
    code = strip_comments(header_text)
    out: List[str] = []

    theirs_defines = defines(code)
    for name, value in _ffi.DEFINES.items():
        if theirs_defines.get(name) != value:
            out.append(f"#define {name}: header {theirs_defines.get(name)}, binding {value}")

    theirs_enums = enums(code)
    for name in sorted(set(theirs_enums) ^ set(_ffi.ENUMS)):
        out.append(f"enum {name}: in {'the header' if name in theirs_enums else 'the binding'} only")
    for name, (py, prefix) in _ffi.ENUMS.items():
        ours = {prefix + m.name: m.value for m in py}
        if name in theirs_enums and ours != theirs_enums[name]:
            out.append(f"enum {name}: header {theirs_enums[name]}, binding {ours}")

    theirs_structs = structs(code)
    for name in sorted(set(theirs_structs) ^ set(_ffi.STRUCTS)):
        out.append(f"struct {name}: in {'the header' if name in theirs_structs else 'the binding'} only")
    for name, py in _ffi.STRUCTS.items():
        if name not in theirs_structs:
            continue
        theirs = [(f, c_type(t)) for f, t in theirs_structs[name]]
        ours = list(py._fields_)
        if ours != theirs:
            out.append(
                f"struct {name}: header {[(f, _name(t)) for f, t in theirs]}, "
                f"binding {[(f, _name(t)) for f, t in ours]}"
            )

    theirs_callbacks = callbacks(code)
    for name in sorted(set(theirs_callbacks) ^ set(_ffi.CALLBACKS)):
        out.append(f"callback {name}: in {'the header' if name in theirs_callbacks else 'the binding'} only")
    for name, (ret, params) in theirs_callbacks.items():
        ours = _ffi.CALLBACKS.get(name)
        if ours is None:
            continue
        if ours._restype_ != c_type(ret) or list(ours._argtypes_) != [c_type(p) for p in params]:
            out.append(f"callback {name}: header {ret} ({', '.join(params)}) differs from the binding")

    theirs_functions = functions(code)
    if len(theirs_functions) < 10:
        out.append(f"only {len(theirs_functions)} functions parsed: is this kvgate.h?")
    for name in sorted(set(theirs_functions) - set(_ffi.FUNCTIONS) - _ffi.UNBOUND):
        out.append(f"function {name}: in the header, not declared by the binding")
    for name in sorted(set(_ffi.FUNCTIONS) - set(theirs_functions)):
        out.append(f"function {name}: declared by the binding, not in the header")
    for name, (ret, params) in theirs_functions.items():
        if name not in _ffi.FUNCTIONS:
            continue
        restype, argtypes = _ffi.FUNCTIONS[name]
        theirs_args = [c_type(p) for p in params]
        if restype != c_type(ret) or argtypes != theirs_args:
            out.append(
                f"function {name}: header {ret} ({', '.join(params)}), binding "
                f"{_name(restype)} ({', '.join(_name(t) for t in argtypes)})"
            )
    return out


def main(argv: List[str]) -> int:
    path = pathlib.Path(argv[1]) if len(argv) > 1 else _ffi.HEADER
    problems = mismatches(path.read_text())
    for p in problems:
        print(p)
    print(f"{path}: {'binding matches' if not problems else f'{len(problems)} mismatches'}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
