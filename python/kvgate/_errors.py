"""Exceptions: one class per kvgate_status that is a failure."""

from __future__ import annotations

from typing import Dict, Type

from ._ffi import Status, last_error, load


class KvgateError(Exception):
    """A kvgate call failed. ``status`` is the C status; ``message`` is the
    library's ``kvgate_last_error()`` for refused calls (misuse), or a
    description of how an attempt ended."""

    status: Status = Status.OK

    def __init__(self, status: int, message: str):
        try:
            self.status = Status(status)
        except ValueError:  # a status a newer library added
            self.status = status  # type: ignore[assignment]
        self.message = message
        name = self.status.name if isinstance(self.status, Status) else str(status)
        super().__init__(f"{name.lower()}: {message}")


class InvalidArgument(KvgateError):
    """KVGATE_INVALID_ARGUMENT: a value was refused; nothing changed."""


class UnknownLease(KvgateError):
    """KVGATE_UNKNOWN_LEASE."""


class NotFound(KvgateError):
    """KVGATE_NOT_FOUND."""


class Panic(KvgateError):
    """KVGATE_PANIC: a bug in kvgate; the gate stays usable."""


class BufferTooSmall(KvgateError):
    """KVGATE_BUFFER_TOO_SMALL."""


class OutOfOrder(KvgateError):
    """KVGATE_OUT_OF_ORDER: an attempt was given a step it did not ask for."""


class OsError(KvgateError):
    """KVGATE_OS_ERROR: the OS refused a resource (the wake descriptor)."""


class AdmissionError(KvgateError):
    """An attempt ended without a lease; ``status`` says why."""


class Preempted(AdmissionError):
    """A newer attempt of the same session began while this one waited."""


class TimedOut(AdmissionError):
    """The timeout passed before admission."""


class Cancelled(AdmissionError):
    """The attempt was cancelled (``Gate.cancel_session`` or the attempt's
    own cancel). A cancelled asyncio task raises ``asyncio.CancelledError``
    instead, as asyncio requires."""


class Closed(AdmissionError):
    """The gate was closed before admission."""


_BY_STATUS: Dict[int, Type[KvgateError]] = {
    Status.INVALID_ARGUMENT: InvalidArgument,
    Status.UNKNOWN_LEASE: UnknownLease,
    Status.NOT_FOUND: NotFound,
    Status.PANIC: Panic,
    Status.BUFFER_TOO_SMALL: BufferTooSmall,
    Status.OUT_OF_ORDER: OutOfOrder,
    Status.OS_ERROR: OsError,
    Status.PREEMPTED: Preempted,
    Status.TIMED_OUT: TimedOut,
    Status.CANCELLED: Cancelled,
    Status.CLOSED: Closed,
}


def error_for(status: int, message: str) -> KvgateError:
    """The exception of ``status`` carrying ``message``."""
    return _BY_STATUS.get(status, KvgateError)(status, message)


def check(status: int) -> None:
    """Raises the typed exception of a failed call, with the calling
    thread's ``kvgate_last_error()`` (read right away, on the same thread)."""
    if status != Status.OK:
        raise error_for(status, last_error())


def status_str(status: int) -> str:
    return load().kvgate_status_str(status).decode()
