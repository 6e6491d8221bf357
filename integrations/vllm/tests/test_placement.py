"""A proxy that places sessions itself (`kvgate.Placement` over
`kvgate_vllm.placement.MetricsRooms`) in front of three gated `vllm serve`
replicas in refusal mode (KVGATE_VLLM_REFUSE_NEW=1), one `openai` client per
replica, on the real engine: a skewed start sends new sessions to the replica
whose gate has room, later turns stay where a session began, and a replica
that answers 429 has the session placed elsewhere, never dropped. Where each
turn ran is read from the replicas' own /metrics. Nothing mocked."""

from __future__ import annotations

import asyncio
import random
from typing import Any, Callable, Iterator

import pytest

from kvgate_vllm.placement import room_of
from support.engine import random_prompt
from support.launcher import Server, metric
from support.placing_proxy import PlacingProxy

from test_serve import PATIENCE_SEC

REPLICAS = 3
CAPACITY = 400 * 32  # the launcher's engine, per replica
LONG_PROMPT, LONG_OUTPUT = 7000, 1000  # in flight: 8,000 of 12,800 tokens held


@pytest.fixture(scope="module")
def replicas(tmp_path_factory: Any) -> Iterator[list[Server]]:
    logs = tmp_path_factory.mktemp("placement")
    started: list[Server] = []
    try:
        for i in range(REPLICAS):  # all start at once; each has its own engine and gate
            started.append(Server(gate=True, env={"KVGATE_VLLM_REFUSE_NEW": "1"}, log_path=str(logs / f"replica{i}.log")))
        for srv in started:
            srv.wait_ready()
        yield started
    finally:
        for srv in started:
            srv.stop()


def counter(srv: Server, name: str) -> float:
    try:
        return metric(srv.metrics(), name)
    except KeyError:  # no gate yet
        return 0.0


async def until(what: str, cond: Callable[[], bool]) -> None:
    deadline = asyncio.get_running_loop().time() + PATIENCE_SEC
    while not await asyncio.to_thread(cond):
        assert asyncio.get_running_loop().time() < deadline, f"gave up waiting until {what}"
        await asyncio.sleep(0.2)


def settle(servers: list[Server]) -> None:
    """Every replica idle, its working set empty (each test's sessions end
    with a final turn, so the next test starts from empty gates)."""

    def idle() -> bool:
        rooms = [room_of(srv.metrics()) for srv in servers]
        return all(r.sessions == 0 and r.waiting_sessions == 0 and r.tokens == 0 for r in rooms) and all(
            counter(srv, "kvgate_active_leases") == 0 for srv in servers
        )

    asyncio.run(until("every replica's working set is empty", idle))


def test_a_skewed_start_sends_new_sessions_where_a_gate_has_room_and_turns_stay(replicas: list[Server]) -> None:
    settle(replicas)
    rng = random.Random(41)
    before = [counter(srv, "kvgate_admissions_all_total") for srv in replicas]

    async def main() -> dict[str, str]:
        # Fresh figures for every placement.
        proxy = PlacingProxy([srv.url for srv in replicas], replicas[0].model, max_age_sec=0.0, timeout_sec=PATIENCE_SEC)
        try:
            # Two long sessions first: the first gate holds 8,000 of 12,800
            # tokens once its turn runs, so the second goes to an untouched one.
            longs = {name: random_prompt(rng, LONG_PROMPT) for name in ("long-0", "long-1")}
            running = []
            for i, (name, prompt) in enumerate(longs.items()):
                running.append(asyncio.ensure_future(proxy.turn(name, prompt, LONG_OUTPUT)))
                srv = replicas[i]
                await until(f"{name} runs on {srv.url}", lambda srv=srv: counter(srv, "kvgate_active_leases") == 1)
            # Then short sessions, one after another: each goes to the replica with the most room.
            shorts = {f"short-{i}": random_prompt(rng, rng.randrange(500, 800)) for i in range(4)}
            for name, prompt in shorts.items():
                out = await proxy.turn(name, prompt, 8)
                shorts[name] = prompt + list(out.choices[0].token_ids) + random_prompt(rng, 50)
            where = {name: proxy.placement.replica_of(name) for name in [*longs, *shorts]}
            for (name, prompt), out in zip(longs.items(), await asyncio.gather(*running)):
                assert len(out.choices[0].token_ids) == LONG_OUTPUT
                longs[name] = prompt + list(out.choices[0].token_ids) + random_prompt(rng, 50)
            # Later turns, side by side, the last one final: every one stays on its session's replica.

            async def rest(name: str, prompt: list[int], n: int) -> None:
                for t in range(2):
                    out = await proxy.turn(name, prompt, n, final=t == 1)
                    prompt = prompt + list(out.choices[0].token_ids) + random_prompt(rng, 50)

            await asyncio.gather(*(rest(n, p, 8) for n, p in [*shorts.items(), *longs.items()]))
            return where  # type: ignore[return-value]
        finally:
            await proxy.close()

    where = asyncio.run(main())
    urls = [srv.url for srv in replicas]
    assert where["long-0"] == urls[0] and where["long-1"] == urls[1], where
    assert all(where[f"short-{i}"] == urls[2] for i in range(4)), where  # the room, not a hash or a count
    after = [counter(srv, "kvgate_admissions_all_total") for srv in replicas]
    # Each replica admitted exactly its own sessions' turns: 3 per session.
    assert [a - b for a, b in zip(after, before)] == [3, 3, 12]
    for srv in replicas:
        assert counter(srv, "kvgate_refused_total") == 0  # nobody was placed where it would wait


def test_a_replica_that_refuses_has_the_session_placed_elsewhere(replicas: list[Server]) -> None:
    settle(replicas)
    rng = random.Random(42)
    refused_before = [counter(srv, "kvgate_refused_total") for srv in replicas]
    admitted_before = [counter(srv, "kvgate_admissions_all_total") for srv in replicas]

    async def main() -> str:
        # Figures read once and kept: the placement will not see the replica fill.
        proxy = PlacingProxy([srv.url for srv in replicas], replicas[0].model, max_age_sec=3600.0, timeout_sec=PATIENCE_SEC)
        try:
            figures = await proxy.rooms(True)
            assert all(f is not None and f.free_tokens == CAPACITY for f in figures.values()), figures
            # Behind the proxy's back, the replica it would pick fills: a long turn sent to it directly.
            full = replicas[0]
            filler = asyncio.ensure_future(proxy.send(full.url, "filler", random_prompt(rng, LONG_PROMPT), LONG_OUTPUT, final=True))
            await until("the filler runs", lambda: counter(full, "kvgate_active_leases") == 1)
            prompt = random_prompt(rng, 6000)
            out = await proxy.turn("newcomer", prompt, 8)  # first to replica 0 (its old figure), 429, then elsewhere
            assert len(out.choices[0].token_ids) == 8
            moved_to = proxy.placement.replica_of("newcomer")
            prompt = prompt + list(out.choices[0].token_ids) + random_prompt(rng, 50)
            await proxy.turn("newcomer", prompt, 8, final=True)  # its later turn goes where it was moved
            await filler
            assert moved_to is not None
            return moved_to
        finally:
            await proxy.close()

    moved_to = asyncio.run(main())
    urls = [srv.url for srv in replicas]
    assert moved_to == urls[1], moved_to  # the first replica with room on fresh figures
    refused = [counter(srv, "kvgate_refused_total") - b for srv, b in zip(replicas, refused_before)]
    admitted = [counter(srv, "kvgate_admissions_all_total") - b for srv, b in zip(replicas, admitted_before)]
    assert refused == [1, 0, 0], refused  # refused once, where it was first placed
    assert admitted == [1, 2, 0], admitted  # the filler there; both of the newcomer's turns where it moved
