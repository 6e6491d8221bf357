"""The vLLM general plugin (entry point group `vllm.general_plugins`, name `kvgate`).

vLLM calls `register()` in every process it starts (front-end, engine core,
workers; `VLLM_PLUGINS` filters by name). It always adds the probe methods to
EngineCore (they cost nothing until called) and carries each request's
connector-loaded tokens onto its RequestOutputs (kvgate_vllm.feedback). With
`KVGATE_VLLM_GATE=1` it also puts the admission gate in front of `vllm serve`'s
engine client (kvgate_vllm.serve).
Safe to call many times.
"""

from __future__ import annotations

import os

GATE_ENV = "KVGATE_VLLM_GATE"


def gate_enabled() -> bool:
    return os.environ.get(GATE_ENV, "").strip().lower() in ("1", "true", "yes", "on")


def register() -> None:
    from . import feedback, knobs, probes

    knobs.reload_gbps()  # a bad KVGATE_VLLM_RELOAD_GBPS fails at start-up, in every process
    probes.install()
    feedback.install()
    if gate_enabled():
        from . import serve

        serve.install()
