"""kvgate for vLLM: the probes as engine-core utility methods and the gate
inside `vllm serve`, over the `kvgate` Python package (see docs/vllm.md)."""

__all__ = ["feedback", "knobs", "offload", "placement", "probes", "plugin", "serve"]
