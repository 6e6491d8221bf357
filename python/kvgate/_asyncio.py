"""The asyncio driver: one waker per gate per loop, the futures of the
sleeping attempts, one timer for the gate's deadlines; and what
``Gate.acquire`` returns."""

from __future__ import annotations

import asyncio
import collections.abc
import itertools
import logging
import math
from typing import Any, Awaitable, Coroutine, Dict, Optional

from ._attempt import Attempt, Waker
from ._errors import OutOfOrder
from ._handle import GateHandle
from ._lease import Lease


log = logging.getLogger("kvgate")


def _set_result(fut: "asyncio.Future[None]") -> None:
    if not fut.done():
        fut.set_result(None)


class _LoopDriver:
    """One waker watched with ``loop.add_reader``, the futures of the
    attempts that sleep (by tag), and one timer for the gate's own
    deadlines (``kvgate_tick``). Runs only on its loop's thread."""

    def __init__(self, gate: GateHandle, loop: asyncio.AbstractEventLoop) -> None:
        self.gate, self.loop = gate, loop
        self.waker = Waker()
        self.tags = itertools.count(1)
        self.sleeping: Dict[int, "asyncio.Future[None]"] = {}
        self.timer: Optional[asyncio.TimerHandle] = None
        self.timer_at = math.inf
        loop.add_reader(self.waker.fd, self._on_readable)

    def _on_readable(self) -> None:
        sleeping = self.sleeping
        for tag in self.waker.drain():
            fut = sleeping.get(tag)
            if fut is not None and not fut.done():
                fut.set_result(None)
        self.reschedule()

    def reschedule(self) -> None:
        """Fires the gate's due deadlines and arms the one timer for the next."""
        sleep_ns = self.gate._tick()
        if sleep_ns is None:
            if self.timer is not None:
                self.timer.cancel()
                self.timer, self.timer_at = None, math.inf
            return
        at = self.loop.time() + sleep_ns / 1e9
        if self.timer is not None:
            if abs(self.timer_at - at) < 1e-4:
                return
            self.timer.cancel()
        self.timer, self.timer_at = self.loop.call_at(at, self._on_timer), at

    def _on_timer(self) -> None:
        self.timer, self.timer_at = None, math.inf
        self.reschedule()

    async def sleep(self, attempt: Attempt) -> None:
        """Until the attempt's tag arrives or its sleep_ns pass."""
        fut = self.loop.create_future()
        self.sleeping[attempt.tag] = fut
        timer = self.loop.call_later(attempt.sleep_ns / 1e9, _set_result, fut)
        # The step may have moved the gate's next deadline (an admission
        # opened a window, say): look again before sleeping on it.
        self.reschedule()
        try:
            await fut
        finally:
            timer.cancel()
            del self.sleeping[attempt.tag]

    def close(self) -> None:
        """Wakes every sleeping attempt (they then see CLOSED) and stops
        watching the descriptor."""
        for fut in self.sleeping.values():
            _set_result(fut)
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        if not self.loop.is_closed():
            self.loop.remove_reader(self.waker.fd)
        self.waker.close()


class _Acquire(collections.abc.Coroutine):
    """What ``Gate.acquire`` returns: ``async with`` it (the lease is
    released on exit), or ``await`` it / hand it to ``asyncio.create_task``
    (a coroutine: the caller then releases the lease)."""

    __slots__ = ("_coro", "_lease")

    def __init__(self, coro: Coroutine[Any, Any, Lease]) -> None:
        self._coro, self._lease = coro, None

    def send(self, value: Any) -> Any:
        return self._coro.send(value)

    def throw(self, *args: Any) -> Any:
        return self._coro.throw(*args)

    def close(self) -> None:
        self._coro.close()

    def __await__(self):
        return self._coro.__await__()

    async def __aenter__(self) -> Lease:
        self._lease = await self._coro
        return self._lease

    async def __aexit__(self, *exc: object) -> None:
        lease, self._lease = self._lease, None
        if lease is not None:
            lease.release()


class _AttemptRef:
    """The attempt of one ``Gate.acquire`` in progress, for the code that
    awaits it to end it with the outcome it saw (the drop-in's abort:
    preempted). Runs on the loop's thread."""

    __slots__ = ("attempt",)

    def __init__(self) -> None:
        self.attempt: Optional[Attempt] = None

    def end(self, status: int) -> bool:
        """Ends the attempt as ``status`` (``Attempt.end``); False if there
        is none yet or it has ended (then nothing changed)."""
        attempt = self.attempt
        if attempt is None or attempt._raw is None:
            return False
        try:
            attempt.end(status)  # type: ignore[arg-type]
        except OutOfOrder:
            return False
        return True


class _ProbeHung(Exception):
    """A probe was still out when the attempt's timeout passed."""


async def _await_probe(name: str, pending: Awaitable[Any], deadline: Optional[float] = None) -> Any:
    """The probe's answer (None if it raised). With a ``deadline`` (the
    loop's clock), raises _ProbeHung if it has not answered by then (the
    probe is cancelled)."""
    if deadline is None:
        return await _answer(name, pending)
    loop = asyncio.get_running_loop()
    try:
        return await asyncio.wait_for(_answer(name, pending), max(0.0, deadline - loop.time()))
    except asyncio.TimeoutError:
        raise _ProbeHung(name) from None


async def _answer(name: str, pending: Awaitable[Any]) -> Any:
    try:
        return await pending
    except Exception:  # noqa: BLE001 - a failed probe is "unavailable"
        log.warning("kvgate: the %s probe raised; answered unavailable", name, exc_info=True)
        return None
