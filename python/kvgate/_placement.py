"""Which replica a session's turns go to, when a host (a proxy holding one
client per replica) places sessions itself: a new session goes where a gate
says there is room for it now, later turns stay where the first one ran, and
a replica that refuses a turn (HTTP 429, Retry-After) has it placed again.

The rule reads each replica's gate figures (`ReplicaRoom`: the working-set
gauges a gated replica exports, or `ReplicaRoom.of(gate.stats())` for a gate
in the same process). Nothing here does I/O: `Placement.turn` takes the
figures from an async source and sends the turn with a callable the host
gives.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Awaitable, Callable, Collection, Dict, Mapping, Optional, Sequence, Set, Tuple, TypeVar

from ._args import Session, _session_bytes
from ._figures import Stats

log = logging.getLogger("kvgate.placement")

T = TypeVar("T")

#: Figures per replica; None where the replica's figure is missing, stale or
#: malformed (such a replica counts as full for new sessions).
Rooms = Mapping[str, Optional["ReplicaRoom"]]
#: Reads every replica's figures. ``fresh=True`` after a refusal: a figure
#: that let the session be placed where it was refused is out of date.
RoomSource = Callable[[bool], Awaitable[Rooms]]


@dataclass(frozen=True)
class ReplicaRoom:
    """What one replica's gate tells about new sessions (the working-set
    gauges of a gated `vllm serve`: ``kvgate_working_set_*``).

    ``capacity_tokens`` is 0 while the gate has not learned its engine's
    capacity (before its first engine answer); ``tokens`` is what its members
    hold; ``sessions`` its members; ``waiting_sessions`` the sessions queued to
    join (a newcomer there waits behind them)."""

    capacity_tokens: int
    tokens: int
    sessions: int
    waiting_sessions: int

    def __post_init__(self) -> None:
        for name in ("capacity_tokens", "tokens", "sessions", "waiting_sessions"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ValueError(f"ReplicaRoom.{name} must be a non-negative int, not {value!r}")

    @classmethod
    def of(cls, stats: Stats) -> "ReplicaRoom":
        """The figures of a gate in this process (`Gate.stats()`)."""
        return cls(
            capacity_tokens=stats.working_set_capacity_tokens,
            tokens=stats.working_set_tokens,
            sessions=stats.working_set_sessions,
            waiting_sessions=stats.working_set_waiting_sessions,
        )

    @property
    def free_tokens(self) -> int:
        """Capacity less load, floored at 0 (0 while the capacity is unknown)."""
        return max(0, self.capacity_tokens - self.tokens)

    @property
    def untouched(self) -> bool:
        """No capacity learned, nobody in or waiting: a gate that has not
        admitted anything yet (or a replica that has not made its gate)."""
        return self.capacity_tokens == 0 and self.sessions == 0 and self.waiting_sessions == 0


#: The figure of a replica that answers but has made no gate yet.
UNTOUCHED = ReplicaRoom(capacity_tokens=0, tokens=0, sessions=0, waiting_sessions=0)


class Refused(Exception):
    """Raised by a host's ``send`` when the replica refused the turn (HTTP
    429 of a gated replica in refusal mode, `KVGATE_VLLM_REFUSE_NEW=1`):
    the turn did not run and nothing is held there. ``retry_after_sec`` is
    the replica's Retry-After."""

    def __init__(self, retry_after_sec: float = 1.0) -> None:
        if not retry_after_sec > 0:  # NaN, 0 and negatives alike
            retry_after_sec = 1.0
        self.retry_after_sec = float(retry_after_sec)
        super().__init__(f"refused; retry after {self.retry_after_sec:g} s")


@dataclass(frozen=True)
class PlacementChoice:
    """Where a turn goes: ``replica``, and whether that replica's figure
    says it takes the session now (``False``: every candidate looked full,
    this one least so)."""

    replica: str
    takes_now: bool


class Placement:
    """Session -> replica, for a host that places sessions itself.

    A replica takes a session now when its gate's free room, less the first
    prompts placed there that its load does not show yet, holds the prompt
    and nobody waits to join there, or when nothing is there yet. A
    session's first turn goes to the replica with the fewest sessions placed
    among those that take it now (all of them if none does); ties to the
    first listed. Later turns go to the same replica. A turn a replica
    refuses moves to the replica that takes it now with the most room (see
    `turn`). A replica whose figure is missing, stale or malformed counts as
    full. The fewest sessions, not the most room, for new sessions: room
    now says little of what a young session will hold, and in the simulator
    placing by it lost to a session count where sessions arrive over time
    (docs/scale-out.md). One instance per host; not thread-safe (one event
    loop)."""

    def __init__(self, replicas: Sequence[str], rooms: Optional[RoomSource] = None) -> None:
        names = list(replicas)
        if not names:
            raise ValueError("Placement needs at least one replica")
        if len(set(names)) != len(names):
            raise ValueError(f"replicas must be distinct: {names!r}")
        self._replicas = names
        self._rooms = rooms
        self._pins: Dict[bytes, str] = {}
        self._placed: Dict[str, int] = {r: 0 for r in names}
        # First prompts placed on a replica that its figure does not count
        # yet (a burst would otherwise all land on the replica that looked
        # roomiest before it): (replica, prompt tokens, the replica's load
        # when placed, None where its figure was missing), oldest first.
        self._unseen: Dict[bytes, Tuple[str, int, Optional[int]]] = {}

    @property
    def replicas(self) -> Sequence[str]:
        return tuple(self._replicas)

    def replica_of(self, session: Session) -> Optional[str]:
        """The replica the session's turns go to, or None for a session not
        placed (new, finished, or refused where it was)."""
        return self._pins.get(_session_bytes(session))

    def sessions_on(self, replica: str) -> int:
        """Sessions placed on ``replica`` and not finished or moved."""
        return self._placed[replica]

    def choose(self, session: Session, prompt_tokens: int, rooms: Rooms, avoid: Collection[str] = ()) -> Optional[PlacementChoice]:
        """Where the session's next turn goes: its replica if it has one not
        in ``avoid``, else a new place by the figures in ``rooms`` (the
        session is placed there). A session refused where it was (``avoid``
        not empty) goes where the most room is; a new one where the fewest
        sessions are. None when every replica is in ``avoid``."""
        if prompt_tokens < 0:
            raise ValueError(f"prompt_tokens must be >= 0, not {prompt_tokens}")
        key = _session_bytes(session)
        home = self._pins.get(key)
        if home is not None and home not in avoid:
            return PlacementChoice(home, takes_now=True)
        candidates = [r for r in self._replicas if r not in avoid]
        if not candidates:
            return None
        for r in candidates:
            self._see(r, rooms.get(r))
        free = {r: self._free(r, rooms.get(r)) for r in candidates}
        takers = [r for r in candidates if self._takes(free[r], prompt_tokens, rooms.get(r))]
        pool = takers or candidates
        if avoid:  # a refused turn moves: the most room, then the fewest sessions
            best = min(pool, key=lambda r: (-free[r], self._placed[r], self._replicas.index(r)))
        else:  # a new session: the fewest sessions
            best = min(pool, key=lambda r: (self._placed[r], self._replicas.index(r)))
        self._unpin(key)
        self._pin(key, best)
        figure = rooms.get(best)
        self._unseen[key] = (best, prompt_tokens, figure.tokens if figure is not None else None)
        return PlacementChoice(best, takes_now=bool(takers))

    def _free(self, replica: str, room: Optional[ReplicaRoom]) -> float:
        """The room a replica's figure tells, less the first prompts placed
        there that it does not count yet: -1 where it cannot tell (no figure, or a
        gate with sessions and no capacity yet), infinite where nothing is
        there yet (no gate made, nothing placed)."""
        if room is None:
            return -1.0
        if room.untouched and self._placed[replica] == 0:
            return float("inf")
        if room.capacity_tokens == 0:
            return -1.0
        unseen = sum(tokens for r, tokens, _ in self._unseen.values() if r == replica)
        return float(room.free_tokens - unseen)

    def _see(self, replica: str, room: Optional[ReplicaRoom]) -> None:
        """Drops the first prompts placed on ``replica`` that its figure
        already counts: its load has grown, since the oldest of them was
        placed, by at least their tokens, oldest first. (A gate counts a
        session once it admits it; the host hears of that only when the
        turn ends, and a long first turn runs for seconds.) Sessions that
        left meanwhile hide some growth: those prompts stay counted until
        their turns end, erring towards a fuller replica."""
        if room is None:
            return
        mine = [(k, tokens, then) for k, (r, tokens, then) in self._unseen.items() if r == replica]
        if not mine or mine[0][2] is None:
            return
        grown = room.tokens - mine[0][2]
        for key, tokens, _ in mine:
            if tokens > grown:
                break
            grown -= tokens
            del self._unseen[key]

    @staticmethod
    def _takes(free: float, prompt_tokens: int, room: Optional[ReplicaRoom]) -> bool:
        return room is not None and free >= prompt_tokens and room.waiting_sessions == 0

    def admitted(self, session: Session) -> None:
        """The session's turn ran where it was placed: that gate's figure
        counts it from now (`turn` calls it when ``send`` returns)."""
        self._forget_unseen(_session_bytes(session))

    def refused(self, session: Session, replica: str) -> None:
        """``replica`` refused the session's turn: the session is no longer
        placed there (its next choice places it again)."""
        key = _session_bytes(session)
        if self._pins.get(key) == replica:
            self._unpin(key)

    def finish(self, session: Session) -> None:
        """The session ended: its place is freed (a later turn of the same id
        is placed as new)."""
        self._unpin(_session_bytes(session))

    def _pin(self, key: bytes, replica: str) -> None:
        self._pins[key] = replica
        self._placed[replica] += 1

    def _unpin(self, key: bytes) -> None:
        old = self._pins.pop(key, None)
        if old is not None:
            self._placed[old] -= 1
        self._forget_unseen(key)

    def _forget_unseen(self, key: bytes) -> None:
        self._unseen.pop(key, None)

    async def turn(self, session: Session, prompt_tokens: int, send: Callable[[str], Awaitable[T]]) -> T:
        """Runs one turn: ``send(replica)`` where the session is placed; if
        that replica refuses (``send`` raises `Refused`), the session is
        placed again on a replica whose fresh figures take it now. If none
        does, the turn waits the shortest Retry-After heard and starts over
        (at its own replica if it had one), so a refused turn is never
        dropped; cancel the task to give up. Any other exception from
        ``send`` propagates (the session stays placed)."""
        if self._rooms is None:
            raise RuntimeError("Placement.turn needs a room source: Placement(replicas, rooms=...)")
        key = _session_bytes(session)
        home = self._pins.get(key)
        refused_at: Set[str] = set()
        retry_after: Optional[float] = None
        while True:
            if home is not None and home not in refused_at:
                replica = home
            else:
                rooms = await self._rooms(bool(refused_at))
                choice = self.choose(session, prompt_tokens, rooms, avoid=refused_at)
                if choice is None or (refused_at and not choice.takes_now):
                    # Nowhere has room now: wait for the replicas' own estimate
                    # of when room frees, then try again from the start.
                    if choice is not None:
                        self._unpin(key)
                    if home is not None and self._pins.get(key) is None:
                        self._pin(key, home)
                    log.info("kvgate placement: no replica takes session %r now; retrying in %.1f s", session, retry_after or 1.0)
                    await asyncio.sleep(retry_after or 1.0)
                    refused_at.clear()
                    retry_after = None
                    continue
                replica = choice.replica
            try:
                out = await send(replica)
            except Refused as e:
                log.info("kvgate placement: %s refused session %r (retry after %g s)", replica, session, e.retry_after_sec)
                self.refused(session, replica)
                refused_at.add(replica)
                retry_after = e.retry_after_sec if retry_after is None else min(retry_after, e.retry_after_sec)
                continue
            self.admitted(session)
            return out

