"""The kvgate admission gate inside `vllm serve` (enabled by KVGATE_VLLM_GATE=1).

In the API server process, `install()` wraps `AsyncLLM.generate` (the one call
every OpenAI endpoint makes per request) and adds a small ASGI middleware:

- A request with a session id is admitted by kvgate before it reaches the engine
  (`kvgate_acquire` in a thread; the probes are UTILITY calls to the engine that
  will serve it) and its lease is released when the generator ends: finished,
  failed, or aborted (a client disconnect cancels the generator: the waiting
  acquire is cancelled with `kvgate_cancel_session`, an admitted lease released).
  A request without a session id passes untouched.
- Session id, first found: vLLM's own (`session_id` request field, `X-Session-ID`
  header, `vllm_xargs.session_id`), then the headers in SESSION_HEADERS
  (override with KVGATE_VLLM_SESSION_HEADERS, comma-separated).
- Session end: a final-turn header (FINAL_HEADERS, value true/1/yes) calls
  `kvgate_finish_session` when that turn's lease is released; otherwise kvgate's
  idle retention (`session_retention_sec`) forgets the session.
- A second concurrent request of one session: kvgate keeps one waiting attempt
  per session; a newer attempt supersedes a waiting older one, which is answered
  HTTP 409 (a client that retried gets only its newest turn admitted). If the
  older turn is already running, the newer one is admitted by the decision table
  on its own (normally `reserved_session`: the session owns its window).
- Data parallel (internal load balancer): one gate per engine. A session is
  pinned to an engine (the request's own `data_parallel_rank` if it has one,
  else a stable hash of the session id), the request is sent there, and its
  probes are targeted at that engine (`_call_utility_async(..., engine=)`), so no
  answer ever comes from a replica the turn will not run on.
- kvgate's Prometheus families (`kvgate_*`, label `engine`) are added to vLLM's
  `/metrics` registry.
- Knobs: KVGATE_VLLM_CONFIG="high_watermark=0.2,idle_grace_sec=1" (any
  kvgate_config_set_<knob>); unset knobs keep the library's defaults.
"""

from __future__ import annotations

import asyncio
import contextvars
import hashlib
import logging
import os
import threading
from typing import Any, AsyncGenerator, Optional

from . import feedback, ffi

logger = logging.getLogger("kvgate_vllm.serve")

SESSION_HEADERS = (
    "x-session-id",  # vLLM's own (also read by vLLM itself)
    "x-dynamo-session-id",  # NVIDIA Dynamo
    "x-claude-code-session-id",  # Claude Code
    "session_id",  # OpenAI Codex CLI
    "session-id",
    "x-opencode-session",  # OpenCode
    "x-agent-session-id",
)
FINAL_HEADERS = ("x-dynamo-session-final", "x-session-final")
PROBE_TIMEOUT_SEC = 30.0

_headers: contextvars.ContextVar[Optional[dict[str, str]]] = contextvars.ContextVar("kvgate_headers", default=None)
_installed = False


def session_headers() -> tuple[str, ...]:
    env = os.environ.get("KVGATE_VLLM_SESSION_HEADERS")
    if env:
        return tuple(h.strip().lower() for h in env.split(",") if h.strip())
    return SESSION_HEADERS


def parse_config(spec: str) -> dict[str, float | str]:
    knobs: dict[str, float | str] = {}
    for item in filter(None, (x.strip() for x in spec.split(","))):
        name, sep, value = item.partition("=")
        if not sep:
            raise ValueError(f"KVGATE_VLLM_CONFIG: {item!r} is not knob=value")
        try:
            knobs[name.strip()] = float(value)
        except ValueError:
            knobs[name.strip()] = value.strip()
    return knobs


class HeaderMiddleware:
    """Pure ASGI middleware: keeps the request's headers in a context variable
    (read by the generate wrapper, which runs in the same task)."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope.get("type") == "http":
            headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
            token = _headers.set(headers)
            try:
                await self.app(scope, receive, send)
            finally:
                _headers.reset(token)
        else:
            await self.app(scope, receive, send)


def session_of(explicit: Optional[str]) -> tuple[Optional[str], bool]:
    """(session id or None, final-turn flag) for the current request."""
    headers = _headers.get() or {}
    sid = explicit
    if not sid:
        for name in session_headers():
            if headers.get(name):
                sid = headers[name]
                break
    final = any(headers.get(h, "").strip().lower() in ("1", "true", "yes") for h in FINAL_HEADERS)
    return sid, final


def prompt_ids(prompt: Any) -> list[int]:
    ids = prompt.get("prompt_token_ids") if isinstance(prompt, dict) else getattr(prompt, "prompt_token_ids", None)
    return list(ids) if ids else []


def engine_for(session: str, dp_size: int) -> int:
    digest = hashlib.blake2b(session.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") % dp_size


class Gates:
    """One kvgate gate per data-parallel engine, made on first use."""

    def __init__(self, llm: Any, loop: asyncio.AbstractEventLoop, knobs: Optional[dict[str, float | str]] = None) -> None:
        """`llm`: an AsyncLLM (anything with `.engine_core`, a vLLM engine-core client);
        `loop`: the event loop that client runs on; `knobs`: kvgate config (default:
        KVGATE_VLLM_CONFIG)."""
        self.llm = llm
        self.loop = loop
        self.knobs = parse_config(os.environ.get("KVGATE_VLLM_CONFIG", "")) if knobs is None else knobs
        client = llm.engine_core
        self.engines = list(getattr(client, "core_engines", None) or [None])
        self.gates: dict[int, ffi.AsyncGate] = {}
        # The LoRA / cache_salt of each session's turn being admitted, for its prefix
        # probe (kvgate keeps at most one waiting attempt per session).
        self.keys: dict[bytes, tuple[Optional[list], Optional[str]]] = {}
        self.lock = threading.Lock()

    @property
    def dp_size(self) -> int:
        return len(self.engines)

    def _utility(self, rank: int, method: str, *args: Any) -> Any:
        client = self.llm.engine_core
        engine = self.engines[rank]
        if engine is None or not hasattr(client, "_call_utility_async"):
            coro = client.call_utility_async(method, *args)
        else:
            coro = client._call_utility_async(method, *args, engine=engine)
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(PROBE_TIMEOUT_SEC)

    def gate(self, rank: int) -> ffi.AsyncGate:
        with self.lock:
            if rank not in self.gates:
                g = ffi.Gate(
                    self.knobs,
                    usage=lambda sid, r=rank: self._utility(r, "kvgate_usage"),
                    prefix=lambda sid, ids, r=rank: self._prefix(r, sid, ids),
                )
                self.gates[rank] = ffi.AsyncGate(g)
            return self.gates[rank]

    def _prefix(self, rank: int, sid: bytes, ids: list[int]) -> Optional[float]:
        lora, salt = self.keys.get(sid, (None, None))
        hit, n = self._utility(rank, "kvgate_prefix", ids, lora, salt, sid.decode("utf-8", "replace"))
        return hit / n if n else None

    async def report_capacity(self, rank: int) -> None:
        client = self.llm.engine_core
        engine = self.engines[rank]
        cap = await (client._call_utility_async("kvgate_capacity", engine=engine) if engine is not None else client.call_utility_async("kvgate_capacity"))
        feedback.report_capacity(self.gates[rank].gate, cap)

    def metrics_text(self) -> list[tuple[int, str]]:
        with self.lock:
            gates = list(self.gates.items())
        return [(rank, g.gate.metrics_text()) for rank, g in gates]


_gates: Optional[Gates] = None
_gates_lock = threading.Lock()


def gates_for(llm: Any) -> Gates:
    global _gates
    with _gates_lock:
        if _gates is None:
            _gates = Gates(llm, asyncio.get_running_loop())
        return _gates


class Superseded(Exception):
    pass


def _superseded_error(message: str) -> Exception:
    from http import HTTPStatus

    try:
        from vllm.exceptions import GracefulHTTPError

        return GracefulHTTPError(message, HTTPStatus.CONFLICT)
    except ImportError:  # older vLLM
        return Superseded(message)


def _wrap_generate(original: Any) -> Any:
    async def generate(self: Any, prompt: Any, sampling_params: Any, request_id: str, *args: Any, **kwargs: Any) -> AsyncGenerator[Any, None]:
        sid, final = session_of(kwargs.get("session_id"))
        if not sid:
            async for out in original(self, prompt, sampling_params, request_id, *args, **kwargs):
                yield out
            return
        gates = gates_for(self)
        rank = kwargs.get("data_parallel_rank")
        if rank is None:
            rank = engine_for(sid, gates.dp_size) if gates.dp_size > 1 else 0
            if gates.dp_size > 1:
                kwargs["data_parallel_rank"] = rank
        new_gate = rank not in gates.gates
        agate = gates.gate(rank)
        if new_gate:
            await gates.report_capacity(rank)
        lora = kwargs.get("lora_request")
        salt = prompt.get("cache_salt") if isinstance(prompt, dict) else getattr(prompt, "cache_salt", None)
        session = sid.encode()
        gates.keys[session] = ([lora.lora_name, lora.lora_int_id, lora.lora_path] if lora else None, salt)
        try:
            admission = await agate.acquire(session, prompt_ids(prompt))
        except ffi.NotAdmitted as e:
            if e.status == ffi.Status.PREEMPTED:
                raise _superseded_error(f"kvgate: turn superseded by a newer request of session {sid!r}") from e
            raise
        finally:
            gates.keys.pop(session, None)
        figures: Optional[feedback.TurnFigures] = None
        try:
            async for out in original(self, prompt, sampling_params, request_id, *args, **kwargs):
                if getattr(out, "finished", False):
                    figures = feedback.figures_of(out)
                yield out
        finally:
            feedback.release(agate.gate, admission.lease, figures)
            if final:
                agate.gate.finish_session(session)

    generate.__wrapped__ = original  # type: ignore[attr-defined]
    generate._kvgate = True  # type: ignore[attr-defined]
    return generate


class KvgateCollector:
    """kvgate's figures on vLLM's Prometheus registry (`/metrics`), label `engine`."""

    def collect(self) -> Any:
        from prometheus_client.parser import text_string_to_metric_families

        if _gates is None:
            return
        merged: dict[str, Any] = {}
        for rank, text in _gates.metrics_text():
            for fam in text_string_to_metric_families(text):
                target = merged.setdefault(fam.name, fam)
                samples = [s._replace(labels={**s.labels, "engine": str(rank)}) for s in fam.samples]
                if target is fam:
                    fam.samples = samples
                else:
                    target.samples.extend(samples)
        yield from merged.values()


def install() -> None:
    """Patches the front-end (idempotent). Runs in every vLLM process; only the
    API server process uses what it patches."""
    global _installed
    if _installed:
        return
    _installed = True
    from vllm.v1.engine.async_llm import AsyncLLM

    if not getattr(AsyncLLM.generate, "_kvgate", False):
        AsyncLLM.generate = _wrap_generate(AsyncLLM.generate)
    try:
        import vllm.entrypoints.launchers.app as app_module

        original_init = app_module.init_entrypoints_middleware

        def init_entrypoints_middleware(args: Any, app: Any, *rest: Any, **kw: Any) -> Any:
            result = original_init(args, app, *rest, **kw)
            app.add_middleware(HeaderMiddleware)
            return result

        if not getattr(original_init, "_kvgate", False):
            init_entrypoints_middleware._kvgate = True  # type: ignore[attr-defined]
            app_module.init_entrypoints_middleware = init_entrypoints_middleware
    except (ImportError, AttributeError) as e:  # the session headers beyond vLLM's own need it
        logger.warning("kvgate: no header middleware (%s): only vLLM's session_id is read", e)
    from prometheus_client import REGISTRY

    REGISTRY.register(KvgateCollector())  # type: ignore[arg-type]
    logger.info("kvgate: admission gate enabled for requests with a session id")
