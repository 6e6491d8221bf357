"""kvgate's knobs as the vLLM side spells them: `name=value,...` (the
KVGATE_VLLM_CONFIG variable of `vllm serve`, the `kvgate:...` policies of
bench/real_engine.py), mapped onto the package's `kvgate.Config` fields.

    admission_mode=reference,high_watermark=0.2,idle_grace_sec=1

Each name is a `kvgate.Config` field (one `kvgate_config_set_<name>` of the C
ABI); `admission_mode` takes a name (`working_set`, the default, or
`reference`), the others a number. Unset knobs keep the library's defaults.

The plugin's own on/off knobs are environment variables read with `flag`:
KVGATE_VLLM_REFUSE_NEW (`refuse_new`) answers a turn that would wait HTTP 429
with Retry-After instead of holding it, where the gate counts its session's
cache gone (kvgate_vllm.serve). The numeric ones
are read with `number`: KVGATE_VLLM_RELOAD_GBPS (`reload_gbps`), the host tier's
host-to-device copy rate the capacity probe answers (kvgate_vllm.offload).
"""

from __future__ import annotations

import dataclasses
import math
import os
from typing import Mapping, Optional, Union

import kvgate

Knobs = dict[str, Union[float, str]]

#: The knobs kvgate.Config has (admission_mode and the numeric ones).
NAMES = tuple(f.name for f in dataclasses.fields(kvgate.Config))


def parse(spec: str) -> Knobs:
    """`a=1,b=name` -> {"a": 1.0, "b": "name"} (numbers as floats)."""
    knobs: Knobs = {}
    for item in filter(None, (x.strip() for x in spec.split(","))):
        name, sep, value = item.partition("=")
        if not sep:
            raise ValueError(f"kvgate knobs: {item!r} is not knob=value")
        try:
            knobs[name.strip()] = float(value)
        except ValueError:
            knobs[name.strip()] = value.strip()
    return knobs


def config(knobs: Knobs) -> kvgate.Config:
    """The kvgate.Config of parsed knobs. An unknown knob or a name where a
    number is due raises ValueError; a value the library refuses raises
    kvgate.InvalidArgument when the gate is made."""
    fields: dict[str, Union[float, str]] = {}
    for name, value in knobs.items():
        if name not in NAMES:
            raise ValueError(f"unknown kvgate knob {name!r}: expected one of {', '.join(NAMES)}")
        if name == "admission_mode":
            if not isinstance(value, str):
                raise ValueError(f"admission_mode={value!r}: expected working_set or reference")
        elif not isinstance(value, (int, float)):
            raise ValueError(f"kvgate knob {name}={value!r}: expected a number")
        fields[name] = value
    cfg = kvgate.Config(**fields)  # type: ignore[arg-type]
    cfg.mode  # noqa: B018 - an unknown admission_mode raises ValueError here, not at first use
    return cfg


#: The opt-in refusal mode: a turn that would wait, of a session whose cache
#: the gate counts gone here (new, parked, a ghost), is answered HTTP 429 Too
#: Many Requests with Retry-After instead (kvgate_vllm.serve); members, and
#: sessions parked in the host tier, wait in their place as always.
REFUSE_NEW_ENV = "KVGATE_VLLM_REFUSE_NEW"

_ON = ("1", "true", "yes", "on")
_OFF = ("", "0", "false", "no", "off")


def flag(name: str, env: Optional[Mapping[str, str]] = None) -> bool:
    """An on/off environment knob: 1/true/yes/on or 0/false/no/off (unset:
    off). Anything else raises ValueError, so a typo fails at startup
    instead of silently leaving the mode off."""
    raw = (os.environ if env is None else env).get(name, "")
    value = raw.strip().lower()
    if value in _ON:
        return True
    if value in _OFF:
        return False
    raise ValueError(f"{name}={raw!r}: expected one of 1, true, yes, on, 0, false, no, off")


def refuse_new(env: Optional[Mapping[str, str]] = None) -> bool:
    """Whether KVGATE_VLLM_REFUSE_NEW turns the refusal mode on."""
    return flag(REFUSE_NEW_ENV, env)


#: The host tier's reload rate, GB/s (10^9 bytes), when the engine measures
#: none: the rate at which KV copied to host memory comes back to the device.
#: The capacity probe turns it into tokens/s by the model's KV bytes per token
#: (kvgate_vllm.offload). The default is the pinned-memory host-to-device
#: rate measured on an H200; on vLLM's CPU build a reload would be a memory
#: copy within host memory, so set it to that machine's copy rate there.
RELOAD_GBPS_ENV = "KVGATE_VLLM_RELOAD_GBPS"
RELOAD_GBPS_DEFAULT = 55.5


def number(name: str, default: float, env: Optional[Mapping[str, str]] = None) -> float:
    """A positive, finite number from the environment (unset or empty: the
    default). Anything else raises ValueError, so a typo fails at startup."""
    raw = (os.environ if env is None else env).get(name, "").strip()
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(f"{name}={raw!r}: expected a number") from None
    if not math.isfinite(value) or value <= 0.0:
        raise ValueError(f"{name}={raw!r}: expected a finite number above 0")
    return value


def reload_gbps(env: Optional[Mapping[str, str]] = None) -> float:
    """KVGATE_VLLM_RELOAD_GBPS: the host tier's reload rate, GB/s (default 55.5)."""
    return number(RELOAD_GBPS_ENV, RELOAD_GBPS_DEFAULT, env)
