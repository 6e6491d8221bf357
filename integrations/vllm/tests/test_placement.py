"""A proxy that places sessions itself (`kvgate.Placement` over
`kvgate_vllm.placement.MetricsRooms`) in front of three gated `vllm serve`
replicas in refusal mode (KVGATE_VLLM_REFUSE_NEW=1), one `openai` client per
replica, on the real engine: a skewed start sends new sessions to the replica
whose gate has room, later turns stay where a session began, and a replica
that answers 429 has the session placed elsewhere, never dropped; a replica
that vanishes (killed) has the turn sent to the next one, counted once.
Where each turn ran is read from the replicas' own /metrics. Nothing
mocked."""

from __future__ import annotations

import asyncio
import dataclasses
import random
from typing import Any, Callable, Iterator

import kvgate
import pytest

from kvgate_vllm.placement import room_of
from support.engine import random_prompt
from support.launcher import Server, metric_or_zero
from support.placing_proxy import PlacingProxy

from test_serve import PATIENCE_SEC

REPLICAS = 3
# Three engines share this machine's cores: a /metrics answer can take
# seconds, and one not read would count its replica full.
SLOW_MACHINE = {"timeout_sec": PATIENCE_SEC, "metrics_timeout_sec": 30.0}
CAPACITY = 400 * 32  # the launcher's engine, per replica
LONG_PROMPT, LONG_OUTPUT = 7000, 1000  # in flight: at least 7,000 of 12,800 tokens held


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
    return metric_or_zero(srv.metrics(), name)


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
        proxy = PlacingProxy([srv.url for srv in replicas], replicas[0].model, max_age_sec=0.0, **SLOW_MACHINE)
        try:
            # Two long sessions first, running while the others are placed:
            # the first gate then holds over 7,000 of 12,800 tokens, so the
            # second goes to an untouched replica.
            longs = {name: random_prompt(rng, LONG_PROMPT) for name in ("long-0", "long-1")}
            running = []
            for i, (name, prompt) in enumerate(longs.items()):
                running.append(asyncio.ensure_future(proxy.turn(name, prompt, LONG_OUTPUT)))
                srv = replicas[i]
                await until(f"{name} runs on {srv.url}", lambda srv=srv: counter(srv, "kvgate_active_leases") == 1)
            # Medium sessions (6,000 tokens) fit only where nothing long is:
            # both go to replica 2, though it has more sessions than the
            # others by the second. Short ones (600) fit anywhere: the fewest sessions.
            later = {}
            for name, size in (("medium-0", 6000), ("medium-1", 6000), ("short-0", 600), ("short-1", 600)):
                prompt = random_prompt(rng, size)
                out = await proxy.turn(name, prompt, 8)
                later[name] = prompt + list(out.choices[0].token_ids) + random_prompt(rng, 50)
            where = {name: proxy.placement.replica_of(name) for name in [*longs, *later]}
            for name, out in zip(longs, await asyncio.gather(*running)):
                assert len(out.choices[0].token_ids) == LONG_OUTPUT
                later[name] = longs[name] + list(out.choices[0].token_ids) + random_prompt(rng, 50)

            # Two later turns each, side by side, the last one final: each stays on its session's replica.
            async def rest(name: str, prompt: list[int]) -> None:
                for t in range(2):
                    out = await proxy.turn(name, prompt, 8, final=t == 1)
                    prompt = prompt + list(out.choices[0].token_ids) + random_prompt(rng, 50)

            await asyncio.gather(*(rest(n, p) for n, p in later.items()))
            return where  # type: ignore[return-value]
        finally:
            await proxy.close()

    where = asyncio.run(main())
    urls = [srv.url for srv in replicas]
    expected = {"long-0": 0, "long-1": 1, "medium-0": 2, "medium-1": 2, "short-0": 0, "short-1": 1}
    assert where == {name: urls[i] for name, i in expected.items()}, where
    after = [counter(srv, "kvgate_admissions_all_total") for srv in replicas]
    # Each replica admitted exactly its own sessions' turns: 3 per session, 2 sessions each.
    assert [a - b for a, b in zip(after, before)] == [6, 6, 6]
    for srv in replicas:
        assert counter(srv, "kvgate_refused_total") == 0  # nobody was placed where it would wait


def test_a_replica_that_refuses_has_the_session_placed_elsewhere(replicas: list[Server]) -> None:
    settle(replicas)
    rng = random.Random(42)
    refused_before = [counter(srv, "kvgate_refused_total") for srv in replicas]
    admitted_before = [counter(srv, "kvgate_admissions_all_total") for srv in replicas]

    async def main() -> str:
        # Figures read once and kept: the placement will not see the replica fill.
        proxy = PlacingProxy([srv.url for srv in replicas], replicas[0].model, max_age_sec=3600.0, **SLOW_MACHINE)
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


def test_a_replica_that_vanishes_has_the_turn_sent_to_the_next_counted_once(replicas: list[Server]) -> None:
    """Last in this module: it kills replica 2."""
    settle(replicas)
    rng = random.Random(43)
    urls = [srv.url for srv in replicas]
    names = ("v-0", "v-1", "v-2")
    refused_before = [counter(srv, "kvgate_refused_total") for srv in replicas[:2]]

    async def main() -> tuple[str, str, kvgate.PlacementCounts]:
        # Figures read once and kept: the placement still counts replica 2 up when it vanishes.
        proxy = PlacingProxy(urls, replicas[0].model, max_age_sec=3600.0, **SLOW_MACHINE)
        try:
            prompts = {}
            for name in names:  # one each: the fewest sessions, all with room
                prompts[name] = random_prompt(rng, 300)
                out = await proxy.turn(name, prompts[name], 8)
                prompts[name] += list(out.choices[0].token_ids) + random_prompt(rng, 50)
            before = proxy.placement.replica_of("v-2")
            replicas[2].kill()
            out = await proxy.turn("v-2", prompts["v-2"], 8)  # decided for replica 2, sent elsewhere
            assert len(out.choices[0].token_ids) == 8
            after = proxy.placement.replica_of("v-2")
            prompts["v-2"] += list(out.choices[0].token_ids) + random_prompt(rng, 50)
            await proxy.turn("v-2", prompts["v-2"], 8)  # it stays where it landed
            assert proxy.placement.replica_of("v-2") == after
            counts = dataclasses.replace(proxy.placement.counts)
            for name in names:
                await proxy.turn(name, prompts[name], 8, final=True)
            return before, after, counts  # type: ignore[return-value]
        finally:
            await proxy.close()

    before, after, counts = asyncio.run(main())
    assert before == urls[2] and after in urls[:2], (before, after)
    assert (counts.placed, counts.moved, counts.unreachable, counts.refused, counts.waits) == (3, 1, 1, 0, 0), counts
    assert [counter(srv, "kvgate_refused_total") for srv in replicas[:2]] == refused_before
