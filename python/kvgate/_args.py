"""The caller's arguments as the C ABI takes them: session ids, prompts, timeouts."""

from __future__ import annotations

import array
import ctypes
import math
from typing import Optional, Sequence, Tuple, Union

Session = Union[str, bytes]
Prompt = Union[Sequence[int], int]


def _session_bytes(session: Session) -> bytes:
    if isinstance(session, str):
        return session.encode("utf-8")
    if isinstance(session, (bytes, bytearray, memoryview)):
        return bytes(session)
    raise TypeError(f"session must be str or bytes, not {type(session).__name__}")


def _token_array(ids: Sequence[int]) -> "Optional[ctypes.Array[ctypes.c_uint32]]":
    """The ids as a ``uint32_t`` array for the C call (None when empty: the
    ABI takes NULL with a zero length). ``array('I')`` converts a list of
    32k ids in about 0.2 ms, ctypes' own constructor in about 5 ms."""
    if len(ids) == 0:
        return None
    buf = ids if isinstance(ids, array.array) and ids.typecode == "I" else array.array("I", ids)
    return (ctypes.c_uint32 * len(buf)).from_buffer(buf)


def _prompt(prompt: Prompt) -> Tuple[Optional[Sequence[int]], int]:
    if isinstance(prompt, int):
        if prompt < 0:
            raise ValueError(f"prompt length {prompt} is negative")
        return None, prompt
    return prompt, len(prompt)


def _timeout_ms(timeout: Optional[float]) -> int:
    """None: no limit (-1); 0 or less: one pass (0); else milliseconds, rounded up."""
    if timeout is None:
        return -1
    if timeout != timeout:  # NaN
        raise ValueError("timeout is NaN")
    if timeout <= 0:
        return 0
    return max(1, math.ceil(timeout * 1000))


def checked_count(name: str, value: object, most: int = 2**63 - 1) -> int:
    """A figure the host tells (a budget, ``max_model_len``) as the C ABI
    takes it: a whole number > 0 and at most ``most``. Anything else
    (0, negative, NaN, infinite, fractional, not a number) raises
    ValueError naming ``name``; nothing is told then."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{name} must be a whole number > 0, not {value!r}")
    if isinstance(value, float) and not (math.isfinite(value) and value.is_integer()):
        raise ValueError(f"{name} must be a whole number > 0, not {value!r}")
    count = int(value)
    if count <= 0 or count > most:
        raise ValueError(f"{name} must be a whole number in 1..{most}, not {value!r}")
    return count
