"""What a lease, an attempt and the event-loop driver need of the gate
they belong to: the loaded library, the admission mode, the raw handle
kept alive for a call, a release and a tick. A protocol, so that those
modules import nothing of ``_gate``, which imports them."""

from __future__ import annotations

from typing import Any, ContextManager, Optional, Protocol

from ._ffi import AdmissionMode


class GateHandle(Protocol):
    _lib: Any
    _mode: AdmissionMode

    def _use(self) -> ContextManager[Any]:
        """``with gate._use() as raw``: the raw gate, not freed until the
        block ends."""

    def _release(self, handle: int, cached: int, output: int, tier_cached: int = -1) -> bool:
        """Releases lease ``handle``; whether this call released it."""

    def _tick(self) -> Optional[int]:
        """Runs the gate's own deadlines; ns until the next, or None."""
