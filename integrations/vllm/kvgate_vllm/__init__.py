"""kvgate for vLLM: the probes as engine-core utility methods, the gate inside
`vllm serve`, and the ctypes binding they use (see the README, "kvgate in vLLM")."""

__all__ = ["ffi", "probes", "plugin"]
