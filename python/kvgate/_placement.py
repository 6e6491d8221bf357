"""Which replica a session's turns go to, when a host (a proxy holding one
client per replica) places sessions itself: a new session goes where a gate
says there is room for it now, later turns stay where the first one ran, and
a replica that refuses a turn (HTTP 429, Retry-After: in refusal mode only a
turn whose cache is gone there) or cannot be reached has it placed again by
the same rule; where it lands it stays.

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
from typing import Any, Awaitable, Callable, Collection, Dict, Mapping, Optional, Sequence, Set, Tuple, TypeVar

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


class Unreachable(Exception):
    """Raised by a host's ``send`` when the replica could not be reached
    (connection refused, the host gone): the turn did not run there.
    `Placement.turn` then sends it to the next replica by the same rule."""

    def __init__(self, replica: str, why: object = None) -> None:
        self.replica = replica
        super().__init__(f"replica {replica!r} unreachable" + (f": {why}" if why is not None else ""))


@dataclass
class PlacementCounts:
    """What a `Placement` did, counted once per event: ``placed`` sessions
    placed as new, ``moved`` turns placed again after a refusal or an
    unreachable replica, ``refused`` refusals heard, ``unreachable`` sends
    that found their replica gone, ``waits`` rounds that ended with no
    replica taking the turn (it waited Retry-After)."""

    placed: int = 0
    moved: int = 0
    refused: int = 0
    unreachable: int = 0
    waits: int = 0


@dataclass(frozen=True)
class PlacementChoice:
    """Where a turn goes: ``replica``, and whether that replica's figure
    says it takes the session now (``False``: every candidate looked full,
    this one least so)."""

    replica: str
    takes_now: bool


class Placement:
    """Session -> replica, for a host that places sessions itself.

    A replica takes a session now when its free room holds the prompt and
    nobody waits to join there, or when nothing is there yet. Its free room
    is its gate's (capacity less load) less the first prompts placed there
    that its load does not show yet, less what the turns sent there and not
    returned will still write: those turns times the mean output of the
    turns returned so far (a gate counts a running turn's prompt, its output
    only once it ends; nothing is counted before a turn has returned with
    its output, see ``output_tokens``). A session's first turn goes to the
    replica with the fewest sessions placed among those that take it now
    (all of them if none does); ties to the first listed. Later turns go to
    the same replica. A turn a replica refuses, or that cannot reach its
    replica, is placed again by the same rule among the others, and later
    turns stay where it lands (see `turn`). A replica whose figure is
    missing, stale or malformed counts as full. The fewest sessions, not the
    most room: room now says little of what a young session will hold, and
    in the simulator placing by it lost to a session count where sessions
    arrive over time (docs/scale-out.md). One instance per host; not
    thread-safe (one event loop).

    ``output_tokens``, when given, reads a turn's output tokens from what
    ``send`` returned (None: not known): the mean the free room counts for
    each running turn. A host that calls `choose` itself tells the same
    with `sent` and `returned`."""

    def __init__(
        self,
        replicas: Sequence[str],
        rooms: Optional[RoomSource] = None,
        output_tokens: Optional[Callable[[Any], Optional[int]]] = None,
    ) -> None:
        names = list(replicas)
        if not names:
            raise ValueError("Placement needs at least one replica")
        if len(set(names)) != len(names):
            raise ValueError(f"replicas must be distinct: {names!r}")
        self._replicas = names
        self._rooms = rooms
        self._output_of = output_tokens
        self._pins: Dict[bytes, str] = {}
        self._placed: Dict[str, int] = {r: 0 for r in names}
        # First prompts placed on a replica that its figure does not count
        # yet (a burst would otherwise all land on the replica that looked
        # roomiest before it): (replica, prompt tokens, the replica's load
        # when placed, None where its figure was missing), oldest first.
        self._unseen: Dict[bytes, Tuple[str, int, Optional[int]]] = {}
        # Turns sent to each replica and not returned, and the outputs of
        # the turns returned (sum, count).
        self._running: Dict[str, int] = {r: 0 for r in names}
        self._outputs = (0, 0)
        # Sessions refused or unreachable where they were, not placed again yet.
        self._moving: Set[bytes] = set()
        self.counts = PlacementCounts()

    @property
    def replicas(self) -> Sequence[str]:
        return tuple(self._replicas)

    @property
    def expected_output_tokens(self) -> int:
        """The mean output of the turns returned so far (0 before any)."""
        total, n = self._outputs
        return total // n if n else 0

    def replica_of(self, session: Session) -> Optional[str]:
        """The replica the session's turns go to, or None for a session not
        placed (new, finished, or refused where it was)."""
        return self._pins.get(_session_bytes(session))

    def sessions_on(self, replica: str) -> int:
        """Sessions placed on ``replica`` and not finished or moved."""
        return self._placed[replica]

    def running_on(self, replica: str) -> int:
        """Turns sent to ``replica`` and not returned."""
        return self._running[replica]

    def choose(self, session: Session, prompt_tokens: int, rooms: Rooms, avoid: Collection[str] = ()) -> Optional[PlacementChoice]:
        """Where the session's next turn goes: its replica if it has one not
        in ``avoid``, else a new place by the figures in ``rooms`` (the
        session is placed there), by the rule for new sessions among the
        replicas not in ``avoid``. None when every replica is in ``avoid``."""
        if prompt_tokens < 0:
            raise ValueError(f"prompt_tokens must be >= 0, not {prompt_tokens}")
        key = _session_bytes(session)
        home = self._pins.get(key)
        if home is not None and home not in avoid:
            return PlacementChoice(home, takes_now=True)
        choice = self._pick(prompt_tokens, rooms, avoid)
        if choice is not None:
            self._place(key, choice.replica, prompt_tokens, rooms)
        return choice

    def _pick(self, prompt_tokens: int, rooms: Rooms, avoid: Collection[str]) -> Optional[PlacementChoice]:
        """The rule for new sessions among the replicas not in ``avoid``;
        places nothing."""
        candidates = [r for r in self._replicas if r not in avoid]
        if not candidates:
            return None
        for r in candidates:
            self._see(r, rooms.get(r))
        takers = [r for r in candidates if self._takes(self._free(r, rooms.get(r)), prompt_tokens, rooms.get(r))]
        best = min(takers or candidates, key=lambda r: (self._placed[r], self._replicas.index(r)))
        return PlacementChoice(best, takes_now=bool(takers))

    def _place(self, key: bytes, replica: str, prompt_tokens: int, rooms: Rooms) -> None:
        """Places the session on ``replica``: counted as placed when new, as
        moved when it was refused or unreachable where it was."""
        if key in self._moving or key in self._pins:
            self.counts.moved += 1
        else:
            self.counts.placed += 1
        self._unpin(key)
        self._pin(key, replica)
        figure = rooms.get(replica)
        self._unseen[key] = (replica, prompt_tokens, figure.tokens if figure is not None else None)

    def _free(self, replica: str, room: Optional[ReplicaRoom]) -> float:
        """The room a replica's figure tells, less the first prompts placed
        there that it does not count yet and the expected output of the
        turns running there: -1 where it cannot tell (no figure, or a gate
        with sessions and no capacity yet), infinite where nothing is there
        yet (no gate made, nothing placed)."""
        if room is None:
            return -1.0
        if room.untouched and self._placed[replica] == 0:
            return float("inf")
        if room.capacity_tokens == 0:
            return -1.0
        unseen = sum(tokens for r, tokens, _ in self._unseen.values() if r == replica)
        writing = self._running[replica] * self.expected_output_tokens
        return float(room.free_tokens - unseen - writing)

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

    def sent(self, replica: str) -> None:
        """A turn was sent to ``replica`` (`turn` calls it): until it
        returns, its expected output counts against that replica's room."""
        self._running[replica] += 1

    def returned(self, replica: str, output_tokens: Optional[int] = None) -> None:
        """A turn sent to ``replica`` returned (ran, was refused, or failed),
        with its output tokens when it ran and they are known: the mean
        output learns from them."""
        if output_tokens is not None and output_tokens < 0:
            raise ValueError(f"output_tokens must be >= 0, not {output_tokens}")
        if self._running.get(replica, 0) > 0:
            self._running[replica] -= 1
        if output_tokens is not None:
            total, n = self._outputs
            self._outputs = (total + int(output_tokens), n + 1)

    def admitted(self, session: Session) -> None:
        """The session's turn ran where it was placed: that gate's figure
        counts it from now (`turn` calls it when ``send`` returns)."""
        self._forget_unseen(_session_bytes(session))

    def refused(self, session: Session, replica: str) -> None:
        """``replica`` refused the session's turn (or could not be reached):
        the session is no longer placed there (its next choice places it
        again, counted as a move)."""
        key = _session_bytes(session)
        if self._pins.get(key) == replica:
            self._unpin(key)
            self._moving.add(key)

    def finish(self, session: Session) -> None:
        """The session ended: its place is freed (a later turn of the same id
        is placed as new)."""
        key = _session_bytes(session)
        self._unpin(key)
        self._moving.discard(key)

    def remove(self, replica: str) -> None:
        """Takes ``replica`` out of the set (scaled in, or gone for good):
        nothing is placed there again, and its sessions are placed again at
        their next turn, counted as moves. A turn running there is the
        host's to cancel or let finish."""
        if replica not in self._placed:
            raise ValueError(f"{replica!r} is not a replica of this placement")
        if len(self._replicas) == 1:
            raise ValueError("the last replica cannot be removed")
        for key in [k for k, r in self._pins.items() if r == replica]:
            self._unpin(key)
            self._moving.add(key)
        self._replicas.remove(replica)

    def _pin(self, key: bytes, replica: str) -> None:
        self._pins[key] = replica
        self._placed[replica] += 1
        self._moving.discard(key)

    def _unpin(self, key: bytes) -> None:
        old = self._pins.pop(key, None)
        if old is not None:
            self._placed[old] -= 1
        self._forget_unseen(key)

    def _forget_unseen(self, key: bytes) -> None:
        self._unseen.pop(key, None)

    async def turn(self, session: Session, prompt_tokens: int, send: Callable[[str], Awaitable[T]]) -> T:
        """Runs one turn: ``send(replica)`` where the session is placed.

        If that replica refuses (``send`` raises `Refused`) or cannot be
        reached (``send`` raises `Unreachable`), the session is placed again
        on fresh figures by the rule for new sessions, among the replicas
        not tried yet in this round; later turns go where it lands. A round
        tries each replica at most once. A refused turn goes only to a
        replica that takes it now; where none does, the turn waits the
        shortest Retry-After heard and starts a new round (at its own
        replica if it had one and that one is reachable), so a refused turn
        never spins between replicas and is never dropped (cancel the task
        to give up). A turn whose replica was unreachable, and that no
        replica refused, goes to the next by the rule even where none takes
        it now (as a new session would); when every replica of a round was
        unreachable, the last `Unreachable` propagates: nothing can run it.
        Any other exception from ``send`` propagates (the session stays
        placed). Each refusal, unreachable send, move and wait is counted
        once in `counts`."""
        if self._rooms is None:
            raise RuntimeError("Placement.turn needs a room source: Placement(replicas, rooms=...)")
        key = _session_bytes(session)
        home = self._pins.get(key)
        tried: Set[str] = set()  # this round's replicas
        unreachable: Set[str] = set()  # this turn's
        last_unreachable: Optional[Unreachable] = None
        retry_after: Optional[float] = None  # the shortest heard this round; None: no refusal
        while True:
            if home is not None and home not in tried and self._pins.get(key) == home:
                replica = home
            else:
                rooms = await self._rooms(bool(tried))
                choice = self._pick(prompt_tokens, rooms, tried)
                if choice is None and retry_after is None and last_unreachable is not None:
                    raise last_unreachable  # every replica tried, none refused: none answers
                if choice is None or (retry_after is not None and not choice.takes_now):
                    # Refused, and nowhere takes it now: wait for the replicas'
                    # own estimate of when room frees, then a new round, at
                    # home if it has one that can be reached.
                    if home is not None and home in self._replicas and home not in unreachable and key not in self._pins:
                        self._pin(key, home)
                    wait = retry_after or 1.0
                    self.counts.waits += 1
                    log.info("kvgate placement: no replica takes session %r now; retrying in %.1f s", session, wait)
                    await asyncio.sleep(wait)
                    tried.clear()
                    retry_after = None
                    continue
                self._place(key, choice.replica, prompt_tokens, rooms)
                replica = choice.replica
            tried.add(replica)
            self.sent(replica)
            try:
                out = await send(replica)
            except Refused as e:
                self.returned(replica)
                self.counts.refused += 1
                log.info("kvgate placement: %s refused session %r (retry after %g s)", replica, session, e.retry_after_sec)
                self.refused(session, replica)
                retry_after = e.retry_after_sec if retry_after is None else min(retry_after, e.retry_after_sec)
                continue
            except Unreachable as e:
                self.returned(replica)
                self.counts.unreachable += 1
                last_unreachable = e
                unreachable.add(replica)
                log.warning("kvgate placement: %s unreachable for session %r (%s); placing it on the next", replica, session, e)
                self.refused(session, replica)
                continue
            except BaseException:
                self.returned(replica)
                raise
            self.returned(replica, self._output_tokens(out))
            self.admitted(session)
            return out

    def _output_tokens(self, out: Any) -> Optional[int]:
        if self._output_of is None:
            return None
        try:
            n = self._output_of(out)
        except Exception:  # noqa: BLE001 - a host's reader that fails tells nothing
            log.warning("kvgate placement: output_tokens raised; the turn's output is not counted", exc_info=True)
            return None
        return int(n) if n is not None and n >= 0 else None
