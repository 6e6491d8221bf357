"""Scale-out end to end: two gated `vllm serve` replicas (one gate each, on its
own engine) behind vLLM's router (`vllm-router`, consistent hash on
`X-Session-ID`; scripts/install-router.sh), driven by agent sessions through
the `openai` client. Each replica's own /metrics tell where every turn ran.
Nothing mocked. The last test kills a replica, so it runs last."""

from __future__ import annotations

import concurrent.futures
import random
import time
from typing import Any, Iterator

import openai
import pytest

from support.engine import random_prompt
from support.launcher import Server, metric, metric_or_zero
from support.router import Router

from test_serve import PATIENCE_SEC, wait_for

CAPACITY = 400 * 32  # the launcher's engine, per replica
SESSIONS = 12  # all on one replica by chance: 2 / 2^12


class Pair:
    def __init__(self, replicas: list[Server], router: Router) -> None:
        self.replicas, self.router = replicas, router
        self.client = openai.OpenAI(base_url=router.url + "/v1", api_key="none", max_retries=0, timeout=PATIENCE_SEC)
        self.model = replicas[0].model

    def turn(self, prompt: list[int], n: int, session: str | None) -> Any:
        headers = {"X-Session-ID": session} if session is not None else {}
        return self.client.completions.create(
            model=self.model, prompt=prompt, max_tokens=n, temperature=0.0, extra_headers=headers,
            extra_body={"ignore_eos": True, "min_tokens": n, "return_token_ids": True},
        )  # fmt: skip


@pytest.fixture(scope="module")
def pair(tmp_path_factory: Any) -> Iterator[Pair]:
    logs = tmp_path_factory.mktemp("router")
    replicas: list[Server] = []
    router = None
    try:
        for i in range(2):  # both start at once; each has its own engine and gate
            replicas.append(Server(gate=True, log_path=str(logs / f"replica{i}.log")))
        for srv in replicas:
            srv.wait_ready()
        router = Router([srv.url for srv in replicas], log_path=str(logs / "router.log"))
        router.wait_ready()
        yield Pair(replicas, router)
    finally:
        if router is not None:
            router.stop()
        for srv in replicas:
            srv.stop()


def admitted(srv: Server) -> float:
    """The replica's gate's admissions (0 before its first gated request made the gate)."""
    return metric_or_zero(srv.metrics(), "kvgate_admissions_all_total")


def gauge(srv: Server, name: str) -> float:
    return metric_or_zero(srv.metrics(), name, engine="0")  # no gate yet: nothing held, nothing waiting


def assert_nothing_left(srv: Server) -> None:
    wait_for("no lease is left", lambda: gauge(srv, "kvgate_active_leases") == 0)
    for name in ("kvgate_pending_attempts", "kvgate_waiting_attempts", "kvgate_working_set_waiting_sessions"):
        assert gauge(srv, name) == 0, name


class Session:
    def __init__(self, name: str, rng: random.Random) -> None:
        self.name, self.rng = name, rng
        self.prompt = random_prompt(rng, rng.randrange(300, 1200))

    def grow(self, out: Any) -> None:
        self.prompt = self.prompt + list(out.choices[0].token_ids) + random_prompt(self.rng, self.rng.randrange(50, 200))


def test_every_turn_of_a_session_reaches_one_replica_and_each_gate_holds_its_own(pair: Pair) -> None:
    rng = random.Random(31)
    sessions = [Session(f"agent-{i}", rng) for i in range(SESSIONS)]
    where: dict[str, set[int]] = {s.name: set() for s in sessions}
    for _ in range(3):  # turn by turn, sessions interleaved: each turn's replica from the counters
        for s in sessions:
            before = [admitted(srv) for srv in pair.replicas]
            out = pair.turn(s.prompt, 8, s.name)
            after = [admitted(srv) for srv in pair.replicas]
            moved = [i for i in range(2) if after[i] != before[i]]
            assert len(moved) == 1 and after[moved[0]] == before[moved[0]] + 1, (s.name, before, after)
            where[s.name].add(moved[0])
            s.grow(out)
            for srv in pair.replicas:
                load, cap = gauge(srv, "kvgate_working_set_tokens"), gauge(srv, "kvgate_working_set_capacity_tokens")
                assert load <= cap or cap == 0, (srv.url, load, cap)
    assert all(len(r) == 1 for r in where.values()), where  # session affinity, seen by the replicas themselves
    per_replica = [sum(1 for r in where.values() if r == {i}) for i in range(2)]
    assert min(per_replica) >= 1, per_replica  # the hash spreads sessions over both
    for i, srv in enumerate(pair.replicas):
        text = srv.metrics()
        # each gate learned its own engine's capacity, and admitted only its sessions' turns
        assert metric(text, "kvgate_working_set_capacity_tokens", engine="0") == CAPACITY
        assert metric(text, "kvgate_admissions_all_total") == 3 * per_replica[i]
        assert metric(text, "vllm:prefix_cache_hits_total") > 0
        assert_nothing_left(srv)

    # The same sessions, six at a time: the replicas' gates admit them side by side.
    before = [admitted(srv) for srv in pair.replicas]

    def run(s: Session) -> None:
        for _ in range(2):
            s.grow(pair.turn(s.prompt, 8, s.name))

    with concurrent.futures.ThreadPoolExecutor(6) as pool:
        list(pool.map(run, sessions))
    after = [admitted(srv) for srv in pair.replicas]
    assert [a - b for a, b in zip(after, before)] == [2 * n for n in per_replica]
    for srv in pair.replicas:
        assert metric(srv.metrics(), "vllm:num_preemptions_total") == 0  # admitted within the engine's room
        assert_nothing_left(srv)


def test_a_request_without_a_session_passes_ungated(pair: Pair) -> None:
    before = [admitted(srv) for srv in pair.replicas]
    out = pair.turn(random_prompt(random.Random(32), 200), 4, None)
    assert len(out.choices[0].token_ids) == 4
    assert [admitted(srv) for srv in pair.replicas] == before


def test_a_killed_replica_moves_its_sessions_and_the_survivor_admits_them(pair: Pair) -> None:
    rng = random.Random(33)
    sessions = [Session(f"agent-fault-{i}", rng) for i in range(8)]
    where: dict[str, int] = {}
    for s in sessions:
        before = [admitted(srv) for srv in pair.replicas]
        s.grow(pair.turn(s.prompt, 8, s.name))
        after = [admitted(srv) for srv in pair.replicas]
        where[s.name] = next(i for i in range(2) if after[i] != before[i])
    victim = 1 if any(r == 1 for r in where.values()) else 0
    survivor = pair.replicas[1 - victim]
    moved = [s for s in sessions if where[s.name] == victim]
    assert moved
    # A long turn of a moved session is running on the victim when it dies.
    before_kill = admitted(survivor)
    inflight = concurrent.futures.ThreadPoolExecutor(1).submit(pair.turn, moved[0].prompt, 6000, moved[0].name)
    wait_for("the victim runs a turn", lambda: gauge(pair.replicas[victim], "kvgate_active_leases") == 1)
    pair.replicas[victim].kill()
    try:
        # The router may retry it once (--disable-retries leaves one retry): on
        # the survivor once the dead replica failed its health check.
        inflight.result(PATIENCE_SEC)
        retried = 1
    except openai.APIError:
        retried = 0  # the client sees its turn fail
    assert admitted(survivor) == before_kill + retried
    before = admitted(survivor)
    joins = ("fits_working_set", "empty_working_set", "running_cold_pays", "wait_bound")
    joined_before = sum(metric(survivor.metrics(), "kvgate_admissions_total", reason=r) for r in joins)
    served = 0
    for s in sessions:  # every session's next turn, the moved ones included, through the router
        deadline = time.monotonic() + PATIENCE_SEC
        while True:
            try:
                s.grow(pair.turn(s.prompt, 8, s.name))
                served += 1
                break
            except (openai.APIConnectionError, openai.InternalServerError, openai.APIStatusError):
                # until the router's health check takes the dead replica out
                assert time.monotonic() < deadline, f"{s.name} never served after the kill"
                time.sleep(0.5)
    assert served == len(sessions)
    assert admitted(survivor) == before + len(sessions)  # the survivor's gate admitted every one
    # ... the moved sessions as newcomers joining its working set (it never saw them)
    joined = sum(metric(survivor.metrics(), "kvgate_admissions_total", reason=r) for r in joins)
    assert joined - joined_before >= len(moved)
    assert_nothing_left(survivor)  # no stuck waiter, no lease left
