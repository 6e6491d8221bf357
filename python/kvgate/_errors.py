"""Exceptions: one class per kvgate_status that is a failure.

The C status is ``code``, not ``status``: HTTP servers that map an
exception to a response by its ``status_code``, ``http_status`` or
``status`` attribute (Lego-RL's chat-completion proxy does, aiohttp-style)
would send the small C number as the HTTP status. The outcomes of an attempt
carry ``http_status`` instead (docs/python.md, "HTTP status")."""

from __future__ import annotations

from typing import Dict, Optional, Type

from ._ffi import Status, last_error, load


class KvgateError(Exception):
    """A kvgate call failed. ``code`` is the C status (a :class:`Status`);
    ``message`` is the library's ``kvgate_last_error()`` for refused calls
    (misuse), or a description of how an attempt ended. ``http_status`` is
    the HTTP status a server should answer it with, None for misuse (a bug
    of the caller: a server's own choice for an unexpected error, usually
    500)."""

    code: Status = Status.OK
    http_status: Optional[int] = None

    def __init__(self, status: int, message: str):
        try:
            self.code = Status(status)
        except ValueError:  # a status a newer library added
            self.code = status  # type: ignore[assignment]
        self.message = message
        name = self.code.name if isinstance(self.code, Status) else str(status)
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


class CacheHot(KvgateError):
    """KVGATE_CACHE_HOT: ``Gate.release_elsewhere`` was asked for a session
    whose cache the gate holds hot (a member of the working set, or parked
    in the host tier); its turn keeps its place. Nothing changed."""


class AdmissionError(KvgateError):
    """An attempt ended without a lease; ``code`` says why. ``http_status``
    503 (Service Unavailable: not admitted, try again later) unless the
    subclass says otherwise."""

    http_status: Optional[int] = 503


class Preempted(AdmissionError):
    """A newer attempt of the same session began while this one waited
    (``http_status`` 409 Conflict, as Lego-RL's proxy answers a preempted
    attempt)."""

    http_status: Optional[int] = 409


class TimedOut(AdmissionError):
    """The timeout passed before admission (``http_status`` 503)."""


class Cancelled(AdmissionError):
    """The attempt was cancelled (``Gate.cancel_session`` or the attempt's
    own cancel; ``http_status`` 503). A cancelled asyncio task raises
    ``asyncio.CancelledError`` instead, as asyncio requires."""


class Released(AdmissionError):
    """The host released the waiting turn to another replica
    (``Gate.release_elsewhere``): the gate counted its cache gone here, so
    it costs a full prefill wherever it runs. Not a refusal: send it to a
    replica with room (``http_status`` 503, retried elsewhere)."""


class Closed(AdmissionError):
    """The gate was closed before admission (``http_status`` 503)."""


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
    Status.RELEASED: Released,
    Status.CACHE_HOT: CacheHot,
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
