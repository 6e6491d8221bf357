"""The kvgate admission gate inside `vllm serve` (enabled by KVGATE_VLLM_GATE=1).

In the API server process, `install()` wraps `AsyncLLM.generate` (the one call
every OpenAI endpoint makes per request) and adds a small ASGI middleware:

- A request with a session id is admitted by kvgate before it reaches the engine
  and its lease is released when the generator ends: finished, failed, or
  aborted. The admission is `await gate.acquire(...)` of the `kvgate` package,
  in the server's own event loop: no executor, no thread per waiting turn. Its
  probes are `async def`s awaiting the engine-core client's UTILITY calls
  (`_call_utility_async(..., engine=)`) in that loop. A client disconnect
  cancels the request's task: a waiting acquire is cancelled with it (the
  attempt leaves kvgate's queue, counted as cancelled), an admitted lease is
  released. A request without a session id passes untouched.
- Session id, first found: vLLM's own (`session_id` request field, `X-Session-ID`
  header, `vllm_xargs.session_id`), then the headers in SESSION_HEADERS
  (override with KVGATE_VLLM_SESSION_HEADERS, comma-separated).
- Session end: a final-turn header (FINAL_HEADERS, value true/1/yes) calls
  `finish_session` when that turn's lease is released; otherwise kvgate's idle
  retention (`session_retention_sec`) forgets the session, and until one end
  has been told kvgate presumes an end after a long quiet (docs/admission.md, "Ends
  presumed from silence").
- A second concurrent request of one session: kvgate keeps one waiting attempt
  per session; a newer attempt supersedes a waiting older one, which ends with
  `kvgate.Preempted` and is answered HTTP 409 (a client that retried gets only
  its newest turn admitted). If the older turn is already running, the newer one
  is admitted on its own: in working-set mode the session already holds its
  working-set place (every lease does: `Lease.retain_session` is True, and the
  session's reservation figures read 0 / False, that mode keeping none); in
  reference mode normally `reserved_session` (the session owns its window).
- Data parallel (internal load balancer): one gate per engine. A session is
  pinned to an engine (the request's own `data_parallel_rank` if it has one,
  else a stable hash of the session id), the request is sent there, and its
  probes are targeted at that engine (`_call_utility_async(..., engine=)`), so no
  answer ever comes from a replica the turn will not run on.
- Capacity (working-set admission): the gate's capacity probe answers the
  engine's `kvgate_capacity` (num_gpu_blocks x block_size), asked once per
  engine and cached (kvgate_vllm.feedback.capacity_of); a failed ask is asked
  again by the next probe.
- Host tier (an engine that offloads KV, kvgate_vllm.offload): the capacity
  answer carries the tier's size and reload rate. An answer whose tier the
  gate would refuse (smaller than the GPU cache, a rate not finite and
  positive, a tier gone after it was told) is a logged warning that keeps the
  previous answer (kvgate_vllm.feedback.accept). Each turn of an engine with a
  tier is released with the prompt tokens its connector loaded as its tier
  hits (`tier_cached_tokens`, at most its cached tokens).
- Rebuild cost: an accepted capacity answer that carries the engine's
  rebuild cost (`rebuild_secs_per_token`, `rebuild_secs_per_pair`, fitted to
  its steps: kvgate_vllm.step_cost) tells it to that engine's gate
  (`Gate.set_rebuild_cost`) when it changed; a cost the gate refuses is a
  logged warning, and the gate keeps the cost it had
  (kvgate_vllm.feedback.tell_rebuild_cost). The cost in force is the
  library's `kvgate_working_set_rebuild_seconds_per_token` / `_per_pair`.
- Refusal mode (KVGATE_VLLM_REFUSE_NEW=1, off by default): a turn that would
  wait is refused only where its session's cache is gone. The acquire asks
  `release_if_cache_gone=True`: a turn the gate admits at once runs as
  always; one that the first pass leaves waiting, of a session the gate
  counts without a cache here (new, parked, or a ghost), is released
  (`kvgate.Released`) and answered HTTP 429 Too Many Requests with a
  Retry-After header (`retry_after_sec`), so a placing host can put it on a
  replica with room (its history is prefilled again wherever it runs); a
  turn of a session whose cache the gate holds (a member, or parked in the
  host tier) keeps its place in the queue and is admitted in its order.
  The released turn leaves the queue: no lease, no attempt. A gate in
  reference mode cannot tell a session's cache: there the acquire makes one
  pass (`timeout=0`) and any turn that would wait is refused
  (`kvgate.TimedOut`, the attempt withdrawn by the library).
- kvgate's Prometheus families (`kvgate_*`, label `engine`) are added to vLLM's
  `/metrics` registry from the start: `AsyncLLM.__init__` is wrapped to build
  every engine's gate as the engine client is built, so every family is
  listed, at a new gate's figures (zero counts), before the first gated
  request. With the plugin's own: `kvgate_working_set_free_tokens`
  (capacity minus load, floored at 0: the room a new session can join),
  `kvgate_refused_total` (turns answered 429), and the host tier's
  `kvgate_tier_tokens`, `kvgate_tier_reload_tokens_per_second` and
  `kvgate_tier_refused_answers_total` (capacity answers whose tier was
  refused, the previous one kept); the library's own families include
  `kvgate_tier_cached_tokens_total` (cached tokens the tier served, as
  released to the gate). vLLM's own
  `vllm:external_prefix_cache_*` and `vllm:kv_offload_*` say the rest
  (docs/vllm.md, "Host tier").
- Knobs: KVGATE_VLLM_CONFIG="admission_mode=reference,high_watermark=0.2"
  (kvgate.Config fields; kvgate_vllm.knobs); unset knobs keep the library's
  defaults.
"""

from __future__ import annotations

import asyncio
import contextvars
import hashlib
import logging
import math
import os
import time
from http import HTTPStatus
from typing import Any, AsyncGenerator, Optional

import kvgate

from . import feedback, knobs as knobs_mod

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
#: A probe not answered within this is "unavailable" (kvgate then decides
#: without it); the utility call's late answer is dropped by vLLM.
PROBE_TIMEOUT_SEC = 30.0
#: How old a cached capacity answer may get before it is asked again (its
#: prefill rate and rebuild cost improve as the engine runs).
CAPACITY_REFRESH_SEC = 5.0

_headers: contextvars.ContextVar[Optional[dict[str, str]]] = contextvars.ContextVar("kvgate_headers", default=None)
# Headers the generate wrapper adds to this request's response (Retry-After of
# a refusal): a dict the middleware made for the request, filled in place (a
# task started under the request's context shares the dict, not a copy).
_response_headers: contextvars.ContextVar[Optional[dict[str, str]]] = contextvars.ContextVar(
    "kvgate_response_headers", default=None
)
_installed = False


def session_headers() -> tuple[str, ...]:
    env = os.environ.get("KVGATE_VLLM_SESSION_HEADERS")
    if env:
        return tuple(h.strip().lower() for h in env.split(",") if h.strip())
    return SESSION_HEADERS


parse_config = knobs_mod.parse  # KVGATE_VLLM_CONFIG's syntax


class HeaderMiddleware:
    """Pure ASGI middleware: keeps the request's headers in a context variable
    (read by the generate wrapper, which runs in the same task), and adds to a
    429 response the headers the wrapper left for it (Retry-After)."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope.get("type") != "http":
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
        extra: dict[str, str] = {}

        async def send_with_extra(message: dict) -> None:
            if message.get("type") == "http.response.start" and extra and message.get("status") == 429:
                added = [(k.encode("latin-1"), v.encode("latin-1")) for k, v in extra.items()]
                message = {**message, "headers": [*message.get("headers", []), *added]}
            await send(message)

        token = _headers.set(headers)
        out_token = _response_headers.set(extra)
        try:
            await self.app(scope, receive, send_with_extra)
        finally:
            _response_headers.reset(out_token)
            _headers.reset(token)


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


#: What a session's turn being admitted carries to its prefix probe: the
#: LoRA adapter (name, id, path) and the cache_salt (vLLM hashes both into the
#: prompt's block hashes).
CacheKey = tuple[Optional[list], Optional[str]]


class Gates:
    """One kvgate.Gate per data-parallel engine, made on first use. Used only
    from the server's event loop (the one the engine-core client runs on)."""

    def __init__(self, llm: Any, knobs: Optional[knobs_mod.Knobs] = None) -> None:
        """`llm`: an AsyncLLM (anything with `.engine_core`, a vLLM engine-core
        client); `knobs`: kvgate's knobs (default: KVGATE_VLLM_CONFIG)."""
        self.llm = llm
        self.knobs = parse_config(os.environ.get("KVGATE_VLLM_CONFIG", "")) if knobs is None else knobs
        self.config = knobs_mod.config(self.knobs)  # a bad knob fails here, at the first gated request
        client = llm.engine_core
        self.engines = list(getattr(client, "core_engines", None) or [None])
        self.gates: dict[int, kvgate.Gate] = {}
        # The LoRA / cache_salt of each session's turn being admitted, for its
        # prefix probe (kvgate keeps at most one waiting attempt per session).
        self.keys: dict[bytes, CacheKey] = {}
        # The engine's kvgate_capacity answer per engine, and when it was asked
        # (time.monotonic()): its blocks never change, its measured prefill rate
        # and rebuild cost follow the engine's recent steps, so it is asked
        # again now and then (CAPACITY_REFRESH_SEC).
        self.capacities: dict[int, tuple[kvgate.Capacity, float]] = {}
        # The answer behind each cached capacity, as accepted (its tier checked
        # against the one before), and the answers refused.
        self.answers: dict[int, feedback.EngineAnswer] = {}
        self.tier_refused: dict[int, int] = {}
        # The rebuild cost each engine's accepted answers last carried (told
        # to its gate, or refused by it: feedback.tell_rebuild_cost).
        self.rebuild_seen: dict[int, Optional[tuple[float, float]]] = {}
        self._capacity_asks: dict[int, asyncio.Future] = {}
        # Refusal mode (KVGATE_VLLM_REFUSE_NEW) and the turns refused per engine.
        self.refuse_new = knobs_mod.refuse_new()
        self.refused: dict[int, int] = {}

    @property
    def dp_size(self) -> int:
        return len(self.engines)

    async def _utility(self, rank: int, method: str, *args: Any) -> Any:
        """A UTILITY call to engine `rank`, awaited in this loop."""
        client = self.llm.engine_core
        engine = self.engines[rank]
        if engine is None or not hasattr(client, "_call_utility_async"):
            call = client.call_utility_async(method, *args)
        else:
            call = client._call_utility_async(method, *args, engine=engine)
        return await asyncio.wait_for(call, PROBE_TIMEOUT_SEC)

    def open_all(self) -> None:
        """Builds every engine's gate now, so that /metrics lists kvgate's
        families (at a new gate's figures: zero counts) before the first
        gated request."""
        for rank in range(self.dp_size):
            self.gate(rank)

    def gate(self, rank: int) -> kvgate.Gate:
        g = self.gates.get(rank)
        if g is None:
            g = self.gates[rank] = kvgate.Gate(self.config, self._probes(rank))
        return g

    def _probes(self, rank: int) -> kvgate.Probes:
        async def usage(session: bytes) -> float:
            return float(await self._utility(rank, "kvgate_usage"))

        async def capacity(session: bytes) -> Optional[kvgate.Capacity]:
            return await self.capacity(rank)

        async def prefix(session: bytes, ids: list[int]) -> Optional[float]:
            lora, salt = self.keys.get(session, (None, None))
            hit, n = await self._utility(rank, "kvgate_prefix", list(ids), lora, salt, session.decode("utf-8", "replace"))
            return hit / n if n else None

        return kvgate.Probes(usage=usage, capacity=capacity, prefix=prefix)

    async def capacity(self, rank: int) -> Optional[kvgate.Capacity]:
        """The engine's KV capacity: asked once (concurrent first probes share
        the one ask), then cached; a failed ask is asked again next time. The
        engine's prefill rate and rebuild cost are measured as it runs (the
        cost told to the gate when it changes), so a cached answer older
        than CAPACITY_REFRESH_SEC is refreshed in the background: the probe
        answers the cached one at once, and costs one UTILITY call per
        refresh period, not one per admission."""
        known = self.capacities.get(rank)
        if known is not None:
            cap, asked_at = known
            if time.monotonic() - asked_at >= CAPACITY_REFRESH_SEC:
                self._ask_capacity(rank)  # in the background (an ask still out is reused)
            return cap
        # shield: a probe cancelled with its request leaves the ask to the others.
        # The ask's own callback (registered first) has cached the answer by the
        # time this resumes.
        await asyncio.shield(self._ask_capacity(rank))
        known = self.capacities.get(rank)
        return known[0] if known is not None else None

    def _ask_capacity(self, rank: int) -> asyncio.Future:
        """The ask for engine `rank`'s capacity that is out, or a new one."""
        ask = self._capacity_asks.get(rank)
        if ask is None:
            ask = self._capacity_asks[rank] = asyncio.ensure_future(self._utility(rank, "kvgate_capacity"))
            ask.add_done_callback(_retrieved)  # a failure nobody awaits any more is not "never retrieved"
            ask.add_done_callback(lambda fut: self._capacity_answered(rank, fut))
        return ask

    def _capacity_answered(self, rank: int, ask: asyncio.Future) -> None:
        if self._capacity_asks.get(rank) is ask:
            del self._capacity_asks[rank]  # answered, failed or cancelled: the next probe asks again if need be
        if ask.cancelled() or ask.exception() is not None:
            return
        try:
            new = feedback.answer_of(ask.result())
        except (KeyError, TypeError, ValueError) as e:
            logger.warning("kvgate: engine %d's capacity answer unreadable (%s): the previous answer is kept", rank, e)
            new = None
        kept, problem = feedback.accept(new, self.answers.get(rank), rank)
        if problem is not None:
            self.tier_refused[rank] = self.tier_refused.get(rank, 0) + 1
        if kept is not None:
            self.answers[rank] = kept
            gate = self.gates.get(rank)
            if gate is not None and not gate.closed:
                self.rebuild_seen[rank] = feedback.tell_rebuild_cost(gate, kept, self.rebuild_seen.get(rank), rank)
            # Stamped now even when the previous answer is kept: asked again
            # after CAPACITY_REFRESH_SEC, not at every probe.
            self.capacities[rank] = (feedback.to_capacity(kept), time.monotonic())

    def has_tier(self, rank: int) -> bool:
        """Whether engine `rank`'s accepted answer tells a host tier."""
        answer = self.answers.get(rank)
        return answer is not None and answer.has_tier

    def tier(self) -> list[tuple[int, int, float, int]]:
        """(engine, tier tokens, reload tokens/s, answers refused) per live
        gate; 0 where no tier was told."""
        out = []
        for rank, g in list(self.gates.items()):
            if not g.closed:
                answer = self.answers.get(rank)
                tokens, rate = (int(answer.tier_tokens), answer.reload_tokens_per_sec) if answer and answer.has_tier else (0, 0.0)
                out.append((rank, tokens, rate, self.tier_refused.get(rank, 0)))
        return out

    def metrics_text(self) -> list[tuple[int, str]]:
        gates = list(self.gates.items())
        return [(rank, g.metrics_text()) for rank, g in gates if not g.closed]

    def saturation(self) -> list[tuple[int, int, int]]:
        """(engine, free working-set tokens, turns refused) per live gate."""
        out = []
        for rank, g in list(self.gates.items()):
            if not g.closed:
                out.append((rank, free_tokens(g.stats()), self.refused.get(rank, 0)))
        return out


def free_tokens(stats: kvgate.Stats) -> int:
    """The working set's free room, tokens: capacity minus load, floored at 0
    (0 too while the capacity is unknown, before the first probe answers);
    the figure a placing host reads (`kvgate.ReplicaRoom.free_tokens`)."""
    return kvgate.ReplicaRoom.of(stats).free_tokens


def retry_after_sec(stats: kvgate.Stats) -> int:
    """Retry-After of a refused turn, whole seconds, at least 1.

    The gate's refill window (`window_ns`, here `working_set_window_sec`: the
    engine's KV capacity over its prefill rate) is how long a member between
    turns keeps its place: within one window every member now between turns
    either came back (and is still a member) or left, freeing its room; it is
    also the time the engine needs to turn its whole cache over. So one window
    is the gate's own estimate of when room frees. Rounded up (Retry-After is
    whole seconds, and a client back early would only be refused again), at
    least 1 s (0 would invite a busy loop)."""
    return max(1, math.ceil(stats.working_set_window_sec))


def _retrieved(fut: asyncio.Future) -> None:
    if not fut.cancelled():
        fut.exception()


_gates: Optional[Gates] = None


def gates_for(llm: Any) -> Gates:
    global _gates
    if _gates is None:
        _gates = Gates(llm)
    return _gates


class Superseded(Exception):
    pass


class Refused(Exception):
    pass


def _http_error(message: str, status: int, fallback: type[Exception]) -> Exception:
    """The error that answers a gated request with HTTP `status`: vLLM's
    GracefulHTTPError, or `fallback` on a vLLM too old to have it."""
    try:
        from vllm.exceptions import GracefulHTTPError

        return GracefulHTTPError(message, status)
    except ImportError:  # older vLLM
        return fallback(message)


def _superseded_error(message: str) -> Exception:
    return _http_error(message, HTTPStatus.CONFLICT, Superseded)


def _refused_error(message: str) -> Exception:
    return _http_error(message, HTTPStatus.TOO_MANY_REQUESTS, Refused)


def _cache_key(prompt: Any, kwargs: dict[str, Any]) -> CacheKey:
    lora = kwargs.get("lora_request")
    salt = prompt.get("cache_salt") if isinstance(prompt, dict) else getattr(prompt, "cache_salt", None)
    return ([lora.lora_name, lora.lora_int_id, lora.lora_path] if lora else None), salt


#: How a gated turn that would wait is refused in refusal mode: not at all
#: (refusal mode off), where the gate counts its cache gone (working-set
#: admission), or any turn that would wait (reference admission, which
#: cannot tell a session's cache).
_NO_REFUSAL, _CACHE_GONE, _ONE_PASS = "wait", "cache-gone", "one-pass"


def _refusal_of(refuse_new: bool, gate: kvgate.Gate) -> str:
    if not refuse_new:
        return _NO_REFUSAL
    return _CACHE_GONE if gate.config.mode is kvgate.AdmissionMode.WORKING_SET else _ONE_PASS


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
        gate = gates.gate(rank)
        session = sid.encode()
        key = gates.keys[session] = _cache_key(prompt, kwargs)
        refusal = _refusal_of(gates.refuse_new, gate)
        try:
            # In this task, in the server's loop: a cancelled task (client gone)
            # cancels the attempt; no lease exists then. In refusal mode a turn
            # that would wait is refused only where its cache is gone (a new,
            # parked or ghost session: the gate releases it, Released); a turn
            # whose cache the gate holds keeps its place and waits. A gate in
            # reference mode cannot tell: one pass, any wait refused (TimedOut).
            lease = await gate.acquire(
                session,
                prompt_ids(prompt),
                timeout=0 if refusal == _ONE_PASS else None,
                release_if_cache_gone=refusal == _CACHE_GONE,
            )
        except kvgate.Preempted as e:
            raise _superseded_error(f"kvgate: turn superseded by a newer request of session {sid!r}") from e
        except (kvgate.Released, kvgate.TimedOut) as e:
            refused = refusal == (_CACHE_GONE if isinstance(e, kvgate.Released) else _ONE_PASS)
            if not refused:
                raise
            gates.refused[rank] = gates.refused.get(rank, 0) + 1
            retry = retry_after_sec(gate.stats())
            extra = _response_headers.get()
            if extra is not None:
                extra["retry-after"] = str(retry)
            raise _refused_error(
                f"kvgate: the working set is full and session {sid!r} has no cache here (retry after {retry} s)"
            ) from e
        finally:
            if gates.keys.get(session) is key:  # not a newer turn's key
                del gates.keys[session]
        figures: Optional[feedback.TurnFigures] = None
        try:
            async for out in original(self, prompt, sampling_params, request_id, *args, **kwargs):
                if getattr(out, "finished", False):
                    figures = feedback.figures_of(out, tier=gates.has_tier(rank))
                yield out
        finally:
            feedback.release(lease, figures)
            if final and not gate.closed:
                gate.finish_session(session)

    generate.__wrapped__ = original  # type: ignore[attr-defined]
    generate._kvgate = True  # type: ignore[attr-defined]
    return generate


def _wrap_init(original: Any) -> Any:
    """AsyncLLM.__init__, then its engines' gates: a dashboard or a placing
    host reading /metrics at start sees every kvgate family (at zero)."""

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        gates_for(self).open_all()

    __init__.__wrapped__ = original  # type: ignore[attr-defined]
    __init__._kvgate = True  # type: ignore[attr-defined]
    return __init__


class KvgateCollector:
    """kvgate's figures on vLLM's Prometheus registry (`/metrics`), label `engine`."""

    def collect(self) -> Any:
        from prometheus_client.parser import text_string_to_metric_families

        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

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
        free = GaugeMetricFamily(
            "kvgate_working_set_free_tokens",
            "Room left in the working set, tokens: capacity minus load, floored at 0 (0 while the capacity is unknown)",
            labels=["engine"],
        )
        refused = CounterMetricFamily(
            "kvgate_refused", "Turns answered HTTP 429 (KVGATE_VLLM_REFUSE_NEW=1)", labels=["engine"]
        )
        for rank, room, count in _gates.saturation():
            free.add_metric([str(rank)], room)
            refused.add_metric([str(rank)], count)
        yield free
        yield refused
        tier = _gates.tier()
        families = [
            (GaugeMetricFamily, "kvgate_tier_tokens", "The host tier the engine told, tokens of KV (0: none)", 1),
            (GaugeMetricFamily, "kvgate_tier_reload_tokens_per_second", "The host tier's reload rate the engine told, tokens/s (0: no tier)", 2),
            (CounterMetricFamily, "kvgate_tier_refused_answers", "Capacity answers whose tier was refused (the previous answer kept)", 3),
        ]
        # The tier hits released to the gate are the library's own
        # `kvgate_tier_cached_tokens_total`, above.
        for kind, name, doc, at in families:
            fam = kind(name, doc, labels=["engine"])
            for row in tier:
                fam.add_metric([str(row[0])], row[at])
            yield fam


def install() -> None:
    """Patches the front-end (idempotent). Runs in every vLLM process; only the
    API server process uses what it patches."""
    global _installed
    if _installed:
        return
    # A bad KVGATE_VLLM_CONFIG or KVGATE_VLLM_REFUSE_NEW fails at start-up, not at
    # the first gated request.
    knobs_mod.config(parse_config(os.environ.get("KVGATE_VLLM_CONFIG", "")))
    refuse = knobs_mod.refuse_new()
    knobs_mod.reload_gbps()
    _installed = True
    from vllm.v1.engine.async_llm import AsyncLLM

    feedback.install()  # the turns' tier hits onto their RequestOutputs
    if not getattr(AsyncLLM.generate, "_kvgate", False):
        AsyncLLM.generate = _wrap_generate(AsyncLLM.generate)
    if not getattr(AsyncLLM.__init__, "_kvgate", False):
        AsyncLLM.__init__ = _wrap_init(AsyncLLM.__init__)
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
    logger.info(
        "kvgate: admission gate enabled for requests with a session id%s",
        " (refusal mode: a turn that would wait, its cache gone here, gets HTTP 429)" if refuse else "",
    )
