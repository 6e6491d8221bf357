"""kvgate's knobs as the vLLM side spells them: `name=value,...` (the
KVGATE_VLLM_CONFIG variable of `vllm serve`, the `kvgate:...` policies of
bench/real_engine.py), mapped onto the package's `kvgate.Config` fields.

    admission_mode=reference,high_watermark=0.2,idle_grace_sec=1

Each name is a `kvgate.Config` field (one `kvgate_config_set_<name>` of the C
ABI); `admission_mode` takes a name (`working_set`, the default, or
`reference`), the others a number. Unset knobs keep the library's defaults.

The plugin's own on/off knobs are environment variables read with `flag`:
KVGATE_VLLM_REFUSE_NEW (`refuse_new`) answers a turn that would wait HTTP 429
with Retry-After instead of holding it (kvgate_vllm.serve).
"""

from __future__ import annotations

import dataclasses
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


#: The opt-in refusal mode: a turn of a session outside the working set that
#: would wait is answered HTTP 429 Too Many Requests with Retry-After instead
#: (kvgate_vllm.serve); members are admitted as always.
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
