"""kvgate: a session-level admission gate for an LLM engine's turns.

    import kvgate

    gate = kvgate.Gate(kvgate.Config(admission_mode="working_set"),
                       kvgate.Probes(usage=engine_usage, capacity=engine_capacity))
    async with gate.acquire(session_id, prompt_ids) as lease:
        result = await engine.generate(prompt_ids)
        lease.release(cached_tokens=result.num_cached_tokens,
                      output_tokens=len(result.output_ids))

The library is the Rust crate's C ABI (libkvgate.so, bundled; or the one
named by KVGATE_LIBRARY), reached through ctypes and checked against the
shipped header kvgate/kvgate.h.
"""

from ._errors import (
    AdmissionError,
    BufferTooSmall,
    CacheHot,
    Cancelled,
    Closed,
    InvalidArgument,
    KvgateError,
    NotFound,
    OsError,
    OutOfOrder,
    Panic,
    Preempted,
    Released,
    TimedOut,
    UnknownLease,
)
from ._ffi import NO_LEASE, AdmissionMode, Reason, Status, StepKind, last_error, library_path, load, loaded_path
from ._attempt import Attempt, Waker
from ._config import Capacity, Config, Probes
from ._figures import SessionStats, Stats
from ._gate import Gate, version
from ._lease import Lease
from ._placement import UNTOUCHED, Placement, PlacementChoice, PlacementCounts, Refused, ReplicaRoom, Unreachable
from ._session_scheduler import AdmissionPreempted, DisabledLease, SessionAdmissionLease, SessionLevelScheduler

__version__ = "0.2.0"

__all__ = [
    "CacheHot", "Released",
    "AdmissionError", "AdmissionMode", "AdmissionPreempted", "Attempt", "BufferTooSmall", "Cancelled", "Capacity",
    "Closed", "Config", "DisabledLease", "Gate", "InvalidArgument", "KvgateError", "Lease", "NO_LEASE",
    "NotFound", "OsError", "OutOfOrder", "Panic", "Placement", "PlacementChoice", "Preempted", "Probes", "Reason", "Refused",
    "PlacementCounts", "ReplicaRoom", "UNTOUCHED", "Unreachable",
    "SessionAdmissionLease", "SessionLevelScheduler", "SessionStats", "Stats", "Status", "StepKind", "TimedOut", "UnknownLease", "Waker",
    "last_error", "library_path", "load", "loaded_path", "version",
]
