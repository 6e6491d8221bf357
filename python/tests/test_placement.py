"""kvgate.Placement: where a host places each session among replicas from
their gates' figures, keeps its later turns there, and places it again when a
replica refuses a turn. No engine: the figures and the replicas' answers are
the test's."""

from __future__ import annotations

import asyncio
import math
from typing import Dict, List, Optional

import pytest

import kvgate
from kvgate import Placement, Refused, ReplicaRoom

R = ["a", "b", "c"]


def room(free: int, capacity: int = 10_000, sessions: int = 1, waiting: int = 0) -> ReplicaRoom:
    return ReplicaRoom(capacity_tokens=capacity, tokens=capacity - free, sessions=sessions, waiting_sessions=waiting)


def test_a_new_session_goes_to_the_fewest_sessions_among_replicas_with_room_and_later_turns_stay() -> None:
    p = Placement(R)
    rooms = {"a": room(400), "b": room(6_000), "c": room(3_000)}
    # a has no room for 500 tokens; b and c have, with no session placed yet: the first listed.
    first = p.choose("s0", 500, rooms)
    assert first is not None and first.replica == "b" and first.takes_now
    # Then the fewer sessions, not the more room.
    assert [p.choose(f"s{i}", 500, rooms).replica for i in (1, 2, 3)] == ["c", "b", "c"]  # type: ignore[union-attr]
    # Later turns stay, whatever the figures say now.
    again = p.choose("s0", 9_000, {"a": room(10_000), "b": room(0), "c": None})
    assert again is not None and again.replica == "b"
    assert p.replica_of("s0") == p.replica_of(b"s0") == "b" and p.sessions_on("b") == 2 and p.sessions_on("a") == 0


def test_first_prompts_not_yet_admitted_count_against_the_room() -> None:
    p = Placement(R)
    rooms = {"a": room(4_000), "b": room(5_000), "c": room(1_000)}
    assert [p.choose(f"s{i}", 2_000, rooms).replica for i in range(3)] == ["a", "b", "a"]  # type: ignore[union-attr]
    # a's figure (unchanged here) still says 4,000 free, but 4,000 were sent there unadmitted: no room.
    assert p.choose("s3", 2_000, rooms).replica == "b"  # type: ignore[union-attr]
    # a's gate counts s0 itself now: 2,000 of the room its figure tells are free again
    # (b's 5,000 less s1 and s3 leave 1,000).
    p.admitted("s0")
    assert p.choose("s4", 2_000, rooms).replica == "a"  # type: ignore[union-attr]


def test_a_first_prompt_stops_counting_once_the_replica_load_shows_it() -> None:
    p = Placement(R)
    assert p.choose("long", 7_000, {"a": kvgate.UNTOUCHED, "b": None, "c": None}).replica == "a"  # type: ignore[union-attr]
    # Its turn runs (the host hears nothing until it ends); a's gate counts it:
    # 7,008 tokens held, 5,792 free. Were the 7,000 still counted, a would not take 600.
    busy = ReplicaRoom(capacity_tokens=12_800, tokens=7_008, sessions=1, waiting_sessions=0)
    c = p.choose("short", 600, {"a": busy, "b": None, "c": None})
    assert c is not None and c.replica == "a" and c.takes_now
    # The short one is not in a's load yet: it still counts, oldest first.
    assert not p.choose("big", 5_500, {"a": busy, "b": None, "c": None}).takes_now  # type: ignore[union-attr]


def test_a_refused_turn_moves_by_the_rule_for_new_sessions() -> None:
    p = Placement(R)
    for i in range(3):
        p.choose(f"c{i}", 10, {"a": room(0), "b": room(0), "c": room(9_000)})  # three sessions on c
    assert p.sessions_on("c") == 3
    p.choose("s", 10, {"a": room(5_000), "b": room(9_000), "c": room(9_000)})
    assert p.replica_of("s") == "a"
    p.refused("s", "a")
    # b has less room than c but fewer sessions, and room for the turn: b.
    moved = p.choose("s", 3_000, {"a": room(5_000), "b": room(4_000), "c": room(9_000)}, avoid={"a"})
    assert moved is not None and moved.replica == "b" and moved.takes_now
    p.refused("s", "b")
    # Too little room at b now: c, the one that takes it, whatever its count.
    moved = p.choose("s", 3_000, {"a": room(5_000), "b": room(2_000), "c": room(9_000)}, avoid={"a", "b"})
    assert moved is not None and moved.replica == "c" and moved.takes_now
    assert (p.counts.placed, p.counts.moved) == (4, 2) and sum(p.sessions_on(r) for r in R) == 4


def test_running_turns_expected_output_counts_against_the_room() -> None:
    p = Placement(R)
    rooms = {"a": room(3_000, sessions=0), "b": room(2_500, sessions=0), "c": None}
    assert p.expected_output_tokens == 0
    # Nothing returned yet: no output expected, a takes a 2,000-token newcomer.
    p.sent("a")
    p.sent("a")
    assert p.choose("x", 2_000, rooms).replica == "a"  # type: ignore[union-attr]
    p.admitted("x")
    p.finish("x")
    # Turns that returned wrote 400 and 600 tokens: 500 expected of each still running.
    p.sent("b")
    p.returned("b", 400)
    p.sent("b")
    p.returned("b", 600)
    assert p.expected_output_tokens == 500 and p.running_on("a") == 2 and p.running_on("b") == 0
    # a's 3,000 free less two running turns' 1,000: no room for 2,100; b takes it.
    c = p.choose("y", 2_100, rooms)
    assert c is not None and c.replica == "b" and c.takes_now
    p.returned("a")
    p.returned("a")
    assert p.running_on("a") == 0
    with pytest.raises(ValueError):
        p.returned("a", -1)


def test_turn_learns_the_output_from_what_send_returned() -> None:
    async def main() -> None:
        cl = Cluster()
        p = Placement(R, rooms=cl.read, output_tokens=lambda out: 300 if out == "a" else None)
        seen: List[int] = []

        async def send(replica: str) -> str:
            seen.append(p.running_on(replica))
            return replica

        await p.turn("s", 100, send)
        assert seen == [1] and p.running_on("a") == 0 and p.expected_output_tokens == 300

    asyncio.run(main())


def test_a_replica_without_a_figure_counts_as_full_and_one_that_made_no_gate_yet_as_empty() -> None:
    p = Placement(R)
    # a: no figure (missing, stale or malformed); b: a gate with sessions but no capacity yet; c: untouched.
    rooms = {"a": None, "b": ReplicaRoom(0, 0, 2, 0), "c": kvgate.UNTOUCHED}
    assert p.choose("s0", 100, rooms).replica == "c"  # type: ignore[union-attr]
    # Once a session is placed on it, an untouched replica is no longer known empty.
    nxt = p.choose("s1", 100, rooms)
    assert nxt is not None and not nxt.takes_now and nxt.replica == "a"  # all "full": the fewest placed, then the first
    assert p.choose("s2", 100, rooms).replica == "b"  # type: ignore[union-attr]


def test_waiters_or_too_little_room_mean_a_replica_does_not_take_a_newcomer_now() -> None:
    p = Placement(R)
    rooms = {"a": room(9_000, waiting=1), "b": room(900), "c": room(1_200)}
    c = p.choose("s", 1_000, rooms)
    assert c is not None and c.replica == "c" and c.takes_now
    none_fits = p.choose("t", 5_000, {"a": room(9_000, waiting=1), "b": room(900), "c": room(1_200)})
    assert none_fits is not None and not none_fits.takes_now
    assert none_fits.replica == "a"  # nobody takes it now: the fewest sessions of all (c has one)


def test_refused_or_finished_sessions_are_placed_again_as_new() -> None:
    p = Placement(R)
    rooms = {"a": room(5_000), "b": room(4_000), "c": room(3_000)}
    assert p.choose("s", 100, rooms).replica == "a"  # type: ignore[union-attr]
    p.refused("s", "b")  # not where it is: nothing changes
    assert p.replica_of("s") == "a"
    p.refused("s", "a")
    assert p.replica_of("s") is None and p.sessions_on("a") == 0
    assert p.choose("s", 100, rooms, avoid={"a"}).replica == "b"  # type: ignore[union-attr]
    p.finish("s")
    assert p.replica_of("s") is None and p.sessions_on("b") == 0
    assert p.choose("s", 100, rooms, avoid=set(R)) is None


def test_bad_input_is_refused_with_a_clear_error() -> None:
    with pytest.raises(ValueError):
        Placement([])
    with pytest.raises(ValueError):
        Placement(["a", "a"])
    with pytest.raises(ValueError):
        ReplicaRoom(capacity_tokens=-1, tokens=0, sessions=0, waiting_sessions=0)
    with pytest.raises(ValueError):
        ReplicaRoom(capacity_tokens=1.5, tokens=0, sessions=0, waiting_sessions=0)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        Placement(R).choose(3, 10, {})  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        Placement(R).choose("s", -1, {})
    assert Refused(math.nan).retry_after_sec == 1.0 and Refused(-2).retry_after_sec == 1.0


def test_figures_of_a_gate_in_this_process() -> None:
    gate = kvgate.Gate(kvgate.Config(admission_mode="working_set"))
    try:
        r = ReplicaRoom.of(gate.stats())
        assert r.untouched and r.free_tokens == 0
    finally:
        gate.close()


class Cluster:
    """Replicas that answer turns from a script: a replica in ``refusing``
    refuses every turn; figures are what ``rooms`` holds."""

    def __init__(self) -> None:
        self.rooms: Dict[str, Optional[ReplicaRoom]] = {"a": room(5_000), "b": room(4_000), "c": room(3_000)}
        self.refusing: set = set()
        self.ran: List[tuple] = []
        self.fresh_reads = 0

    async def read(self, fresh: bool) -> Dict[str, Optional[ReplicaRoom]]:
        self.fresh_reads += fresh
        return dict(self.rooms)

    def sender(self, session: str, turn: int):
        async def send(replica: str) -> str:
            if replica in self.refusing:
                raise Refused(0.01)
            self.ran.append((session, turn, replica))
            return replica

        return send


def test_turns_run_where_placed_and_a_refusal_moves_the_session_where_there_is_room() -> None:
    async def main() -> None:
        cl = Cluster()
        p = Placement(R, rooms=cl.read)
        assert await p.turn("s", 100, cl.sender("s", 0)) == "a"
        assert await p.turn("s", 200, cl.sender("s", 1)) == "a"
        cl.refusing = {"a"}
        cl.rooms["a"] = room(0)
        assert await p.turn("s", 300, cl.sender("s", 2)) == "b"  # refused at home, re-placed on fresh figures
        assert cl.fresh_reads == 1 and p.replica_of("s") == "b" and p.sessions_on("a") == 0
        assert cl.ran == [("s", 0, "a"), ("s", 1, "a"), ("s", 2, "b")]

    asyncio.run(main())


def test_a_refused_turn_waits_and_retries_when_no_replica_has_room_never_dropped() -> None:
    async def main() -> None:
        cl = Cluster()
        p = Placement(R, rooms=cl.read)
        await p.turn("s", 100, cl.sender("s", 0))  # on a
        cl.refusing = set(R)
        cl.rooms = {"a": room(0), "b": room(50), "c": None}
        task = asyncio.ensure_future(p.turn("s", 100, cl.sender("s", 1)))
        await asyncio.sleep(0.1)  # several rounds of refusals and waits
        assert not task.done() and p.replica_of("s") == "a"  # nowhere takes it: it stays home
        cl.refusing = set()
        assert await asyncio.wait_for(task, 5) == "a"  # retried at home once it stops refusing
        assert cl.ran[-1] == ("s", 1, "a")

    asyncio.run(main())


def test_a_new_session_refused_everywhere_is_retried_until_served() -> None:
    async def main() -> None:
        cl = Cluster()
        p = Placement(R, rooms=cl.read)
        cl.refusing = {"a", "b"}
        assert await p.turn("n", 100, cl.sender("n", 0)) == "c"  # a, then b refused; c took it
        cl.refusing = set(R)
        task = asyncio.ensure_future(p.turn("m", 100, cl.sender("m", 0)))
        await asyncio.sleep(0.1)
        assert not task.done()
        cl.refusing = {"a", "c"}
        assert await asyncio.wait_for(task, 5) == "b"
        assert p.replica_of("m") == "b" and sum(p.sessions_on(r) for r in R) == 2

    asyncio.run(main())


def test_an_error_other_than_a_refusal_propagates_and_the_session_stays_placed() -> None:
    async def main() -> None:
        p = Placement(R, rooms=Cluster().read)

        async def broken(replica: str) -> str:
            raise ConnectionError(replica)

        with pytest.raises(ConnectionError):
            await p.turn("s", 100, broken)
        assert p.replica_of("s") == "a"

    asyncio.run(main())


def test_turn_without_a_room_source_says_so() -> None:
    with pytest.raises(RuntimeError, match="room source"):
        asyncio.run(Placement(R).turn("s", 1, lambda r: asyncio.sleep(0)))


class Vanishing(Cluster):
    """A cluster whose replicas in ``gone`` refuse connections."""

    def __init__(self) -> None:
        super().__init__()
        self.gone: set = set()
        self.sends: List[str] = []

    def sender(self, session: str, turn: int):
        inner = super().sender(session, turn)

        async def send(replica: str) -> str:
            self.sends.append(replica)
            if replica in self.gone:
                raise kvgate.Unreachable(replica, "connection refused")
            return await inner(replica)

        return send


def test_a_replica_that_vanishes_sends_the_turn_to_the_next_with_room_counted_once() -> None:
    async def main() -> None:
        cl = Vanishing()
        p = Placement(R, rooms=cl.read)
        assert await p.turn("s", 100, cl.sender("s", 0)) == "a"
        assert await p.turn("t", 100, cl.sender("t", 0)) == "b"
        # a vanishes between the decision (s lives there) and the send.
        cl.gone = {"a"}
        cl.rooms["b"] = room(50)  # b has no room for 100: c, with room, takes it
        assert await p.turn("s", 100, cl.sender("s", 1)) == "c"
        assert cl.sends[-2:] == ["a", "c"]
        assert p.replica_of("s") == "c" and p.sessions_on("a") == 0 and sum(p.sessions_on(r) for r in R) == 2
        assert (p.counts.placed, p.counts.moved, p.counts.unreachable, p.counts.refused) == (2, 1, 1, 0)
        # Later turns stay where it landed.
        assert await p.turn("s", 100, cl.sender("s", 2)) == "c"
        # A new session whose first pick is gone: the next, no room needed (as new).
        cl.gone = {"a", "b"}
        cl.rooms = {"a": room(9_000), "b": room(9_000), "c": room(0)}
        assert await p.turn("n", 100, cl.sender("n", 0)) == "c"
        # Every replica gone: nothing can run it, the error says so.
        cl.gone = set(R)
        with pytest.raises(kvgate.Unreachable):
            await p.turn("m", 100, cl.sender("m", 0))
        assert cl.sends[-3:] == ["a", "b", "c"]

    asyncio.run(main())


def test_a_turn_refused_everywhere_waits_between_rounds_instead_of_bouncing() -> None:
    async def main() -> None:
        cl = Vanishing()
        p = Placement(R, rooms=cl.read)
        await p.turn("s", 100, cl.sender("s", 0))  # on a
        cl.refusing = set(R)
        cl.rooms = {r: room(9_000) for r in R}
        task = asyncio.ensure_future(p.turn("s", 100, cl.sender("s", 1)))
        await asyncio.sleep(0.035)  # Retry-After is 0.01 s: about three rounds
        cl.refusing = set()
        assert await asyncio.wait_for(task, 5) == "a"  # back home in a new round
        rounds = p.counts.waits
        assert 1 <= rounds <= 6
        # Each round tries each replica at most once.
        assert len(cl.sends) - 1 <= 3 * (rounds + 1)
        assert p.counts.refused == len(cl.sends) - 2

    asyncio.run(main())


def test_a_removed_replica_gets_nothing_and_its_sessions_move() -> None:
    async def main() -> None:
        cl = Vanishing()
        p = Placement(R, rooms=cl.read)
        assert await p.turn("s", 100, cl.sender("s", 0)) == "a"
        p.remove("a")
        assert p.replicas == ("b", "c") and p.replica_of("s") is None
        assert await p.turn("s", 100, cl.sender("s", 1)) == "b"
        assert "a" not in cl.sends[1:] and p.counts.moved == 1
        with pytest.raises(ValueError):
            p.remove("a")
        p.remove("b")
        with pytest.raises(ValueError):
            p.remove("c")

    asyncio.run(main())
