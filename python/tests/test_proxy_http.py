"""The drop-in behind an HTTP proxy built like Lego-RL's chat-completion
proxy, over real sockets (aiohttp server and client).

The proxy here is written from the description of the origin's, not copied:
per session key one current attempt, a newer request setting the abort event
of an attempt still waiting for admission, and an exception turned into a
response by the origin's rule: its own preemption class is 409 with
``str(exc)`` as the message; otherwise the status is the first of
``status_code``, ``http_status``, ``status`` that is set (truthy), else 500,
and 500 when ``int()`` refuses it; the message is ``exc.message``, else
``exc.detail``, else ``str(exc)``; the body ``{"error": {"message", "type":
"invalid_request"}}``. An exception whose status attribute is kvgate's C
status (2 for a timeout) would go out as ``HTTP/1.1 2``, a status line the
client refuses: every test here reads the status through the wire.

The proxy is tried both ways a user can run it: with kvgate's
AdmissionPreempted imported under the proxy's name (docs/migrating.md) and
with the proxy's own class kept."""

from __future__ import annotations

import asyncio
from typing import Any, Dict, Optional, Tuple, Type

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

import kvgate
from kvgate import Status

from conftest import run, until
from test_session_scheduler import PRESSURE, REFERENCE, FakeServerManager

SEED_MESSAGE = "Request preempted by a newer retry for session {}"


class ProxysOwnPreempted(Exception):
    """The proxy's own preemption class, when it keeps it: kvgate's
    exception is then not an instance, and is mapped by its attributes."""


def error_response(exc: BaseException, preempted: Type[BaseException]) -> web.Response:
    """The origin proxy's mapping of an exception to a response (its
    ``_proxy_error_from_exception``, from its description)."""
    if isinstance(exc, preempted):
        return _error(409, str(exc))
    status: Any = (
        getattr(exc, "status_code", None) or getattr(exc, "http_status", None) or getattr(exc, "status", None) or 500
    )
    try:
        status = int(status)
    except (TypeError, ValueError):
        status = 500
    message = getattr(exc, "message", None) or getattr(exc, "detail", None) or str(exc)
    return _error(status, str(message))


def _error(status: int, message: str) -> web.Response:
    return web.json_response({"error": {"message": message, "type": "invalid_request"}}, status=status)


class Proxy:
    """``POST /sess/{sid}/v1/chat/completions`` with ``{"prompt_ids": [...],
    "timeout": seconds or null}``: registers the attempt (aborting one of the
    same key still waiting for admission), acquires, "generates" (answers the
    lease's reason) and releases."""

    def __init__(self, scheduler: kvgate.SessionLevelScheduler, preempted: Type[BaseException]) -> None:
        self.scheduler, self.preempted = scheduler, preempted
        self.attempts: Dict[Any, Tuple[asyncio.Event, str]] = {}
        self.app = web.Application()
        self.app.router.add_post("/sess/{sid}/v1/chat/completions", self.handle)

    async def handle(self, request: web.Request) -> web.Response:
        body = await request.json()
        sid: Any = request.match_info["sid"]
        if body.get("int_session"):
            sid = int(sid)
        previous = self.attempts.get(sid)
        if previous is not None and previous[1] == "admission_wait":
            previous[0].set()
        abort = asyncio.Event()
        self.attempts[sid] = (abort, "admission_wait")
        try:
            lease = await self.scheduler.acquire(
                sid, body["prompt_ids"], abort_event=abort, timeout=body.get("timeout")
            )
        except Exception as exc:  # noqa: BLE001 - the proxy answers every error
            return error_response(exc, self.preempted)
        finally:
            if self.attempts.get(sid, (None,))[0] is abort:
                del self.attempts[sid]
        try:
            return web.json_response({"reason": lease.reason})
        finally:
            await lease.release()


async def post(client: aiohttp.ClientSession, server: TestServer, sid: str, **body: Any) -> Tuple[int, Dict[str, Any]]:
    body.setdefault("prompt_ids", [1, 2, 3])
    async with client.post(server.make_url(f"/sess/{sid}/v1/chat/completions"), json=body) as resp:
        return resp.status, await resp.json()


def serve(manager: Any, preempted: Type[BaseException], env: Optional[Dict[str, str]] = None):
    """A started proxy over a new drop-in: (scheduler, server, client)."""
    sched = kvgate.SessionLevelScheduler(manager, environ=REFERENCE if env is None else env)

    class Served:
        async def __aenter__(self):
            self.server = TestServer(Proxy(sched, preempted).app)
            await self.server.start_server()
            self.client = aiohttp.ClientSession()
            return sched, self.server, self.client

        async def __aexit__(self, *exc: object) -> None:
            await self.client.close()
            await self.server.close()
            sched.close()

    return Served()


PREEMPTED_CLASSES = [kvgate.AdmissionPreempted, ProxysOwnPreempted]
PREEMPTED_IDS = ["kvgate_class_imported", "proxys_own_class"]


@pytest.mark.parametrize("preempted", PREEMPTED_CLASSES, ids=PREEMPTED_IDS)
def test_a_retry_preempts_the_waiting_attempt_with_409_and_the_seeds_message(preempted: type) -> None:
    manager = FakeServerManager(usage=PRESSURE)  # cold prompts wait

    async def main() -> None:
        async with serve(manager, preempted) as (sched, server, client):
            first = asyncio.ensure_future(post(client, server, "s1"))
            await until("it waits", lambda: sched.gate.stats().waiting_attempts == 1)
            second = asyncio.ensure_future(post(client, server, "s1", timeout=0.2))
            status, body = await first
            assert status == 409
            assert body == {"error": {"message": SEED_MESSAGE.format("s1"), "type": "invalid_request"}}
            status, body = await second  # the retry itself waits, then times out
            assert status == 503, body

    run(main())


@pytest.mark.parametrize("preempted", PREEMPTED_CLASSES, ids=PREEMPTED_IDS)
def test_a_timeout_is_503_with_the_librarys_message(preempted: type) -> None:
    manager = FakeServerManager(usage=PRESSURE)

    async def main() -> None:
        async with serve(manager, preempted) as (sched, server, client):
            status, body = await post(client, server, "s1", timeout=0.2)
            assert status == 503
            assert "not admitted within" in body["error"]["message"]
            assert sched.gate.stats().timed_out == 1

    run(main())


@pytest.mark.parametrize("preempted", PREEMPTED_CLASSES, ids=PREEMPTED_IDS)
def test_a_probe_that_hangs_past_the_timeout_is_503(preempted: type) -> None:
    manager = FakeServerManager(usage=PRESSURE)
    manager.hang = "prefix_cache_probe"

    async def main() -> None:
        async with serve(manager, preempted) as (sched, server, client):
            status, body = await post(client, server, "s1", timeout=0.2)
            assert status == 503, body

    run(main())


@pytest.mark.parametrize("preempted", PREEMPTED_CLASSES, ids=PREEMPTED_IDS)
def test_closing_the_gate_under_a_waiting_request_is_503(preempted: type) -> None:
    manager = FakeServerManager(usage=PRESSURE)

    async def main() -> None:
        async with serve(manager, preempted) as (sched, server, client):
            waiting = asyncio.ensure_future(post(client, server, "s1"))
            await until("it waits", lambda: sched.gate.stats().waiting_attempts == 1)
            sched.close()
            status, body = await waiting
            assert status == 503
            assert "closed" in body["error"]["message"]

    run(main())


def test_a_session_id_that_is_not_a_string_with_the_scheduler_on_is_500() -> None:
    manager = FakeServerManager(usage=PRESSURE)

    async def main() -> None:
        async with serve(manager, kvgate.AdmissionPreempted) as (sched, server, client):
            status, body = await post(client, server, "4242", int_session=True)
            assert status == 500
            assert "session_id must be str or bytes" in body["error"]["message"]
            assert sched.gate.stats().attempts == 0 and manager.calls == []

    run(main())


def test_off_an_int_session_id_is_admitted_disabled() -> None:
    manager = FakeServerManager(usage=PRESSURE)

    async def main() -> None:
        async with serve(manager, kvgate.AdmissionPreempted, env={}) as (sched, server, client):
            assert await post(client, server, "4242", int_session=True) == (200, {"reason": "disabled"})
            assert manager.calls == []

    run(main())


def test_an_admitted_turn_is_200() -> None:
    manager = FakeServerManager()  # calm: open

    async def main() -> None:
        async with serve(manager, kvgate.AdmissionPreempted) as (sched, server, client):
            assert await post(client, server, "s1") == (200, {"reason": "open"})

    run(main())


class CStatusInStatus(Exception):
    """What 0.2.0 raised: the C status (2, TIMED_OUT) as ``status``."""

    status = 2


def test_the_proxy_here_refuses_a_c_status_as_the_0_2_0_exceptions_had_it() -> None:
    """The check above can fail: an exception carrying the C code as its
    status breaks the response's status line, as 0.2.0's did."""

    async def handler(request: web.Request) -> web.Response:
        return error_response(CStatusInStatus("timed out"), kvgate.AdmissionPreempted)

    async def main() -> None:
        app = web.Application()
        app.router.add_post("/x", handler)
        server = TestServer(app)
        await server.start_server()
        try:
            async with aiohttp.ClientSession() as client:
                with pytest.raises(aiohttp.ClientResponseError, match="Invalid status code"):
                    async with client.post(server.make_url("/x")) as resp:
                        await resp.read()
        finally:
            await server.close()

    run(main())


@pytest.mark.parametrize("status", [s for s in Status if s is not Status.OK], ids=lambda s: s.name)
def test_every_kvgate_exception_maps_to_a_valid_http_status(status: Status) -> None:
    err = kvgate._errors.error_for(status, "m")
    assert not hasattr(err, "status") and not hasattr(err, "status_code")
    assert err.code is status
    code = error_response(err, ProxysOwnPreempted).status
    assert 400 <= code <= 599, code
    want = {s: 503 for s in (Status.TIMED_OUT, Status.CANCELLED, Status.CLOSED, Status.RELEASED)}
    want[Status.PREEMPTED] = 409
    assert code == want.get(status, 500)
