"""kvgate's knobs as the vLLM side spells them: `name=value,...` (the
KVGATE_VLLM_CONFIG variable of `vllm serve`, the `kvgate:...` policies of
bench/real_engine.py), mapped onto the package's `kvgate.Config` fields.

    admission_mode=reference,high_watermark=0.2,idle_grace_sec=1

Each name is a `kvgate.Config` field (one `kvgate_config_set_<name>` of the C
ABI); `admission_mode` takes a name (`working_set`, the default, or
`reference`), the others a number. Unset knobs keep the library's defaults.
"""

from __future__ import annotations

import dataclasses
from typing import Union

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
