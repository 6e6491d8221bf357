"""Gated `vllm serve` replicas' room, read from their `/metrics`, for a proxy
that places sessions itself with `kvgate.Placement`:

    rooms = MetricsRooms(urls)
    placement = kvgate.Placement(urls, rooms=rooms)
    out = await placement.turn(session_id, len(prompt_ids), send)
    # send(url): one request; a 429 raises refused_of(...), a replica it
    # cannot reach kvgate.Unreachable(url): the turn goes to the next one
    ...
    placement.finish(session_id); await rooms.close()

Each replica's figure is the working-set gauges its gate exports
(`kvgate_working_set_capacity_tokens`, `_tokens`, `_sessions`,
`_waiting_sessions`, summed over its data-parallel engines). A replica that
answers `/metrics` without them has made no gate yet (no gated turn ran
there): `kvgate.UNTOUCHED`. A replica that does not answer within the
timeout, answers an error, or exports a gauge that is not a non-negative
whole number has no figure (None, logged): the placement counts it full.
Figures are read again when older than `max_age_sec`, or at once after a
refusal.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from typing import Dict, Mapping, Optional, Sequence, Tuple

import aiohttp
import kvgate
from prometheus_client.parser import text_string_to_metric_families

log = logging.getLogger("kvgate_vllm.placement")

#: The gauges a replica's figure is made of, and the ReplicaRoom field of each.
GAUGES = {
    "kvgate_working_set_capacity_tokens": "capacity_tokens",
    "kvgate_working_set_tokens": "tokens",
    "kvgate_working_set_sessions": "sessions",
    "kvgate_working_set_waiting_sessions": "waiting_sessions",
}


class Malformed(ValueError):
    """A replica's /metrics carries a kvgate gauge that is not a figure."""


def room_of(text: str) -> kvgate.ReplicaRoom:
    """The figure in a replica's /metrics text: the gauges summed over its
    engines; `kvgate.UNTOUCHED` when none is there (no gate made yet).
    Raises `Malformed` on a gauge that is not a non-negative whole number, or
    on a text that is not Prometheus's."""
    sums: Dict[str, int] = {}
    try:
        families = list(text_string_to_metric_families(text))
    except Exception as e:  # the parser raises ValueError and others on junk
        raise Malformed(f"not a Prometheus text: {e}") from e
    for family in families:
        field = GAUGES.get(family.name)
        if field is None:
            continue
        for sample in family.samples:
            if sample.name != family.name:
                continue
            value = sample.value
            if not (math.isfinite(value) and value >= 0 and value == int(value)):
                raise Malformed(f"{family.name}{sample.labels} = {value!r}")
            sums[field] = sums.get(field, 0) + int(value)
    if not sums:
        return kvgate.UNTOUCHED
    missing = [f for f in GAUGES.values() if f not in sums]
    if missing:
        raise Malformed(f"kvgate gauges missing: {missing}")
    return kvgate.ReplicaRoom(**sums)


class MetricsRooms:
    """Reads each replica's figure from its `/metrics` (a `kvgate.Placement`
    room source). One instance per proxy; `close()` it when done."""

    def __init__(self, urls: Sequence[str], max_age_sec: float = 1.0, timeout_sec: float = 2.0) -> None:
        if not (max_age_sec >= 0 and timeout_sec > 0):
            raise ValueError(f"max_age_sec must be >= 0 and timeout_sec > 0, not {max_age_sec}, {timeout_sec}")
        self.urls = list(urls)
        self.max_age_sec = max_age_sec
        self.timeout = aiohttp.ClientTimeout(total=timeout_sec)
        self._http: Optional[aiohttp.ClientSession] = None
        self._figures: Dict[str, Tuple[float, Optional[kvgate.ReplicaRoom]]] = {}

    async def __call__(self, fresh: bool = False) -> Mapping[str, Optional[kvgate.ReplicaRoom]]:
        now = time.monotonic()
        due = [u for u in self.urls if fresh or u not in self._figures or now - self._figures[u][0] > self.max_age_sec]
        if due:
            read = await asyncio.gather(*(self._read(u) for u in due))
            at = time.monotonic()
            for url, figure in zip(due, read):
                self._figures[url] = (at, figure)
        return {u: self._figures[u][1] for u in self.urls}

    async def _read(self, url: str) -> Optional[kvgate.ReplicaRoom]:
        if self._http is None:
            self._http = aiohttp.ClientSession(timeout=self.timeout)
        try:
            async with self._http.get(url.rstrip("/") + "/metrics") as r:
                if r.status != 200:
                    raise Malformed(f"HTTP {r.status}")
                return room_of(await r.text())
        except (aiohttp.ClientError, asyncio.TimeoutError, Malformed) as e:
            log.warning("kvgate placement: no figure from %s (%s: %s); counted full for new sessions", url, type(e).__name__, e)
            return None

    async def close(self) -> None:
        if self._http is not None:
            await self._http.close()
            self._http = None


def refused_of(status: int, headers: Mapping[str, str]) -> Optional[kvgate.Refused]:
    """`kvgate.Refused` for a replica's answer of HTTP 429 (its Retry-After,
    seconds; 1 s when absent or not a number), None for any other status."""
    if status != 429:
        return None
    value = next((v for k, v in headers.items() if k.lower() == "retry-after"), None)
    try:
        retry = float(value) if value is not None else 1.0
    except ValueError:
        retry = 1.0
    return kvgate.Refused(retry)
