"""Lease: one admitted turn, released once."""

from __future__ import annotations

import warnings
from typing import Optional

from . import _ffi
from ._ffi import Reason
from ._handle import GateHandle



class Lease:
    """One admitted turn. Release it once when the engine is done with the
    turn: ``with``/``async with`` does it on every exit path; a lease that is
    garbage-collected unreleased is released then, with a ResourceWarning.

    ``retain_session``: whether the lease holds the session's place. In
    reference mode, its reservation (``RESERVED_SESSION`` and
    ``RESIDENT_PREFIX`` admissions; counted in
    :attr:`SessionStats.retaining_leases`); in working-set mode always True,
    its place in the working set, which is no reservation (the session's
    reservation figures read 0 / False)."""

    __slots__ = (
        "gate", "session", "handle", "reason", "wait_sec", "usage", "hit_ratio",
        "retain_session", "waited", "_released",
    )

    def __init__(self, gate: GateHandle, session: bytes, admission: _ffi.kvgate_admission) -> None:
        self.gate = gate
        self.session = session
        self.handle: int = admission.lease
        try:
            self.reason: Reason = Reason(admission.reason)
        except ValueError:  # a reason a newer library added
            self.reason = admission.reason  # type: ignore[assignment]
        self.wait_sec: float = admission.wait_sec
        self.usage: float = admission.usage
        self.hit_ratio: float = admission.hit_ratio
        self.retain_session: bool = admission.retain_session
        self.waited: bool = admission.waited
        self._released = False

    @property
    def released(self) -> bool:
        return self._released

    def release(
        self,
        cached_tokens: Optional[int] = None,
        output_tokens: Optional[int] = None,
        tier_cached_tokens: Optional[int] = None,
    ) -> bool:
        """Releases the lease with what the engine reported of the turn (the
        prompt tokens served from its prefix cache, the tokens generated,
        and of the cached ones those its host tier served; None = unknown).
        True if this call released it; False if it was released already (by
        an earlier call, or by Gate.close).

        A report that contradicts itself (``tier_cached_tokens`` above
        ``cached_tokens``, or given with ``cached_tokens`` None) raises
        ValueError with the library's message and releases nothing: the
        lease is still held, release it again."""
        if self._released:
            return False
        self._released = True
        try:
            return self.gate._release(
                self.handle,
                -1 if cached_tokens is None else int(cached_tokens),
                -1 if output_tokens is None else int(output_tokens),
                -1 if tier_cached_tokens is None else int(tier_cached_tokens),
            )
        except ValueError:
            self._released = False  # refused: still held
            raise

    def __enter__(self) -> "Lease":
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    def __del__(self) -> None:
        if getattr(self, "_released", True):
            return
        try:
            warnings.warn(
                f"kvgate lease {self.handle} of session {self.session!r} was never released: "
                "released by the garbage collector",
                ResourceWarning,
                source=self,
            )
            self.release()
        except Exception:  # noqa: BLE001 - interpreter shutdown: nothing left to release into
            pass

    def __repr__(self) -> str:
        state = "released" if self._released else "held"
        return f"<kvgate.Lease {self.handle} {self.session!r} {getattr(self.reason, 'name', self.reason)} {state}>"
