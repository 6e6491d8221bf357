"""`vllm serve` end to end with a real HTTP client (the `openai` package and raw
HTTP), plugin on and off, on a served tiny model. Nothing mocked."""

from __future__ import annotations

import http.client
import json
import os
import random
import time
from typing import Any, Callable, Iterator

import kvgate
import openai
import pytest

from support.engine import random_prompt
from support.launcher import Server, metric

PATIENCE_SEC = 300.0  # how long a check may wait for the server to settle (not a timing target)


def wait_for(what: str, cond: Callable[[], bool]) -> None:
    deadline = time.monotonic() + PATIENCE_SEC
    while not cond():
        assert time.monotonic() < deadline, f"gave up waiting until {what}"
        time.sleep(0.2)


def _running(tmp_path_factory: Any, name: str, **server: Any) -> Iterator[Server]:
    """A `Server(**server)` for a module's tests, logging to `<name>.log`, stopped after them."""
    log = tmp_path_factory.mktemp("serve") / f"{name}.log"
    srv = Server(log_path=str(log), **server)
    try:
        srv.wait_ready()
        yield srv
    finally:
        srv.stop()


@pytest.fixture(scope="module")
def gated(tmp_path_factory: Any) -> Iterator[Server]:
    # The seed's table with a low watermark, so a cold turn waits while another
    # turn runs (for the abort check): these tests are about the plumbing.
    config = "admission_mode=reference,high_watermark=0.05,wait_poll_sec=60"
    yield from _running(tmp_path_factory, "gated", gate=True, config=config)


@pytest.fixture(scope="module")
def default(tmp_path_factory: Any) -> Iterator[Server]:
    # The library's defaults: working-set admission, which needs the engine's
    # capacity (the async capacity probe) and each turn's figures.
    yield from _running(tmp_path_factory, "default", gate=True)


@pytest.fixture(scope="module")
def plain(tmp_path_factory: Any) -> Iterator[Server]:
    yield from _running(tmp_path_factory, "plain", gate=False)


def complete(srv: Server, prompt: list[int], n: int, headers: dict[str, str] | None = None) -> Any:
    client = openai.OpenAI(base_url=srv.url + "/v1", api_key="none", max_retries=0, timeout=PATIENCE_SEC)
    return client.completions.create(
        model=srv.model, prompt=prompt, max_tokens=n, temperature=0.0,
        extra_headers=headers or {}, extra_body={"ignore_eos": True, "min_tokens": n, "return_token_ids": True},
    )  # fmt: skip


def admissions(srv: Server) -> float:
    return metric(srv.metrics(), "kvgate_admissions_all_total")


def test_session_turns_are_admitted_and_released(gated: Server) -> None:
    rng = random.Random(1)
    prompt = random_prompt(rng, 300)
    complete(gated, prompt, 8, {"X-Session-ID": "agent-a"})  # opens the gate (capacity reported)
    before = admissions(gated)
    for turn in range(3):
        out = complete(gated, prompt, 8, {"X-Session-ID": "agent-a"})
        prompt = prompt + list(out.choices[0].token_ids) + random_prompt(rng, 50)
    text = gated.metrics()
    assert metric(text, "kvgate_admissions_all_total") == before + 3
    assert metric(text, "kvgate_active_leases") == 0
    assert metric(text, "kvgate_admissions_total", engine="0") >= 4  # kvgate's figures on vLLM's /metrics ...
    assert metric(text, "vllm:prefix_cache_hits_total") > 0  # ... next to vLLM's own


def test_requests_without_a_session_pass_untouched(gated: Server) -> None:
    complete(gated, random_prompt(random.Random(2), 100), 4, {"X-Session-ID": "agent-warm"})
    before = admissions(gated)
    complete(gated, random_prompt(random.Random(3), 100), 4)
    assert admissions(gated) == before


@pytest.mark.parametrize("header", ["X-Dynamo-Session-ID", "X-Claude-Code-Session-Id", "session_id"])
def test_other_agent_session_headers_are_accepted(gated: Server, header: str) -> None:
    complete(gated, random_prompt(random.Random(4), 100), 4, {"X-Session-ID": "agent-warm"})
    before = admissions(gated)
    complete(gated, random_prompt(random.Random(5), 100), 4, {header: f"agent-{header}"})
    assert admissions(gated) == before + 1


def test_the_final_turn_header_finishes_the_session(gated: Server) -> None:
    complete(gated, random_prompt(random.Random(6), 100), 4, {"X-Session-ID": "agent-warm"})
    before = metric(gated.metrics(), "kvgate_sessions_finished_total")
    complete(gated, random_prompt(random.Random(7), 100), 4, {"X-Dynamo-Session-ID": "agent-final", "X-Dynamo-Session-Final": "true"})
    assert metric(gated.metrics(), "kvgate_sessions_finished_total") == before + 1


def open_stream(srv: Server, prompt: list[int], n: int, session: str | None) -> http.client.HTTPConnection:
    """Starts a streaming completion on a raw connection and returns it unread
    (session None: without a session id, so not gated)."""
    conn = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=PATIENCE_SEC)
    body = json.dumps({"model": srv.model, "prompt": prompt, "max_tokens": n, "min_tokens": n, "ignore_eos": True, "stream": True})
    headers = {"Content-Type": "application/json"}
    if session is not None:
        headers["X-Session-ID"] = session
    conn.request("POST", "/v1/completions", body, headers)
    return conn


def test_disconnecting_clients_leave_no_lease(gated: Server) -> None:
    rng = random.Random(8)
    # A: admitted, then the client disconnects mid-stream (the request is aborted).
    a = open_stream(gated, random_prompt(rng, 2000), 4000, "agent-disconnect-running")
    resp = a.getresponse()
    assert resp.status == 200
    resp.fp.readline()  # the first streamed event: A is running
    wait_for("A holds a lease", lambda: metric(gated.metrics(), "kvgate_active_leases") == 1)
    # B: a cold session while A runs above the watermark: it waits for admission ...
    b = open_stream(gated, random_prompt(rng, 200), 4, "agent-disconnect-waiting")
    wait_for("B waits", lambda: metric(gated.metrics(), "kvgate_waiting_attempts") == 1)
    b.close()  # ... and its client goes away before it is admitted
    a.close()
    wait_for("no attempt waits", lambda: metric(gated.metrics(), "kvgate_waiting_attempts") == 0)
    wait_for("no lease is left", lambda: metric(gated.metrics(), "kvgate_active_leases") == 0)
    text = gated.metrics()
    assert metric(text, "kvgate_attempts_failed_total", outcome="cancelled") >= 1
    wait_for("the engine runs nothing", lambda: metric(gated.metrics(), "vllm:num_requests_running") == 0)
    # the gate still admits afterwards
    before = admissions(gated)
    complete(gated, random_prompt(rng, 100), 4, {"X-Session-ID": "agent-after"})
    assert admissions(gated) == before + 1


def test_plugin_off_serves_sessions_without_a_gate(plain: Server) -> None:
    out = complete(plain, random_prompt(random.Random(9), 300), 8, {"X-Session-ID": "agent-a"})
    assert len(out.choices[0].token_ids) == 8
    text = plain.metrics()
    assert "kvgate_" not in text
    assert metric(text, "vllm:prefix_cache_queries_total") >= 300


def test_a_newer_request_of_a_session_supersedes_its_waiting_one(gated: Server) -> None:
    rng = random.Random(10)
    a = open_stream(gated, random_prompt(rng, 2000), 4000, "agent-busy")
    resp = a.getresponse()
    resp.fp.readline()  # A runs, above the watermark
    wait_for("A holds a lease", lambda: metric(gated.metrics(), "kvgate_active_leases") == 1)
    cold = random_prompt(rng, 200)
    first = http.client.HTTPConnection("127.0.0.1", gated.port, timeout=PATIENCE_SEC)
    body = json.dumps({"model": gated.model, "prompt": cold, "max_tokens": 4})
    first.request("POST", "/v1/completions", body, {"Content-Type": "application/json", "X-Session-ID": "agent-dup"})
    wait_for("the first request waits", lambda: metric(gated.metrics(), "kvgate_waiting_attempts") == 1)
    second = open_stream(gated, cold, 4, "agent-dup")  # the client retried
    answer = first.getresponse()
    assert answer.status == 409, answer.read()
    assert b"superseded" in answer.read()
    wait_for("only the newer request waits", lambda: metric(gated.metrics(), "kvgate_waiting_attempts") == 1)
    second.close()
    a.close()
    wait_for("no lease is left", lambda: metric(gated.metrics(), "kvgate_active_leases") == 0)
    wait_for("no attempt waits", lambda: metric(gated.metrics(), "kvgate_waiting_attempts") == 0)


def threads_of(srv: Server) -> int:
    return len(os.listdir(f"/proc/{srv.proc.pid}/task"))


def test_waiting_turns_cost_no_thread(gated: Server) -> None:
    # The acquire is awaited in the server's event loop (probes are awaited
    # utility calls): eight turns waiting at once add no thread to the API
    # server process (the thread-executor design added one per waiting turn).
    rng = random.Random(11)
    # Eight concurrent requests without a session first: vLLM's own lazily made
    # pools exist after them (these requests do not reach the gate, so they do
    # not warm anything of the gate's).
    warm = [open_stream(gated, random_prompt(rng, 100), 4, None) for _ in range(8)]
    for conn in warm:
        conn.getresponse().read()
        conn.close()
    a = open_stream(gated, random_prompt(rng, 2000), 4000, "agent-threads-busy")
    resp = a.getresponse()
    resp.fp.readline()  # A runs, above the watermark
    wait_for("A holds a lease", lambda: metric(gated.metrics(), "kvgate_active_leases") == 1)
    before = threads_of(gated)
    waiters = [open_stream(gated, random_prompt(rng, 200), 4, f"agent-threads-{i}") for i in range(8)]
    wait_for("eight turns wait", lambda: metric(gated.metrics(), "kvgate_waiting_attempts") == 8)
    during = threads_of(gated)
    for conn in waiters:
        conn.close()
    a.close()
    wait_for("no attempt waits", lambda: metric(gated.metrics(), "kvgate_waiting_attempts") == 0)
    wait_for("no lease is left", lambda: metric(gated.metrics(), "kvgate_active_leases") == 0)
    assert during <= before, f"{before} threads before, {during} with eight turns waiting"


# The plugin's own families beside the library's (kvgate_vllm.serve.KvgateCollector).
PLUGIN_FAMILIES = (
    "kvgate_working_set_free_tokens", "kvgate_refused_total", "kvgate_tier_tokens",
    "kvgate_tier_reload_tokens_per_second", "kvgate_tier_refused_answers_total",
)


def test_every_kvgate_family_is_on_metrics_before_the_first_gated_request(default: Server) -> None:
    """The first test on its server (file order): the gates exist from the
    start, so a dashboard or a placing host reading /metrics sees every
    family, at a new gate's figures, before any turn."""
    from prometheus_client.parser import text_string_to_metric_families

    text = default.metrics()
    assert metric(text, "kvgate_attempts_total", engine="0") == 0, "a gated request reached the server before this test"
    fresh = kvgate.Gate(kvgate.Config())  # the server's config: the library's defaults
    try:
        want = fresh.metrics_text()
    finally:
        fresh.close()
    samples = [s for fam in text_string_to_metric_families(want) for s in fam.samples]
    assert len(samples) > 40
    for s in samples:
        assert metric(text, s.name, engine="0", **s.labels) == s.value, s
    for name in PLUGIN_FAMILIES:
        assert metric(text, name, engine="0") == 0, name


def test_working_set_admission_learns_the_engines_capacity(default: Server) -> None:
    rng = random.Random(12)
    prompt = random_prompt(rng, 300)
    for turn in range(2):
        out = complete(default, prompt, 8, {"X-Session-ID": "agent-ws"})
        prompt = prompt + list(out.choices[0].token_ids) + random_prompt(rng, 50)
    text = default.metrics()
    # 400 blocks of 32 tokens (tests/support/launcher.py), from the engine's kvgate_capacity
    assert metric(text, "kvgate_working_set_capacity_tokens") == 400 * 32
    by_reason = {r.name.lower(): metric(text, "kvgate_admissions_total", reason=r.name.lower()) for r in kvgate.Reason}
    assert sum(by_reason.values()) == metric(text, "kvgate_admissions_all_total") == 2
    # the first turn joined the working set; the second came back as a member
    # (reserved_session) or joined again; the seed's rows never ran
    assert by_reason["fits_working_set"] + by_reason["empty_working_set"] >= 1, by_reason
    assert by_reason["open"] == by_reason["resident_prefix"] == by_reason["prefix_probe_unavailable"] == 0, by_reason
    assert metric(text, "kvgate_active_leases") == 0
    assert metric(text, "kvgate_working_set_tokens") > 0  # the released turns' footprints, from their reports


def test_the_working_set_gauges_move_with_members_and_waiters(default: Server) -> None:
    # Without the refusal mode a newcomer that does not fit waits: the gauges
    # show the member, the waiting session and the room left.
    rng = random.Random(13)
    cap = 400 * 32  # the launcher's engine
    # The earlier tests' sessions leave the set when their windows end.
    wait_for("the working set empties", lambda: metric(default.metrics(), "kvgate_working_set_sessions", engine="0") == 0)
    assert metric(default.metrics(), "kvgate_working_set_free_tokens", engine="0") == cap
    a = open_stream(default, random_prompt(rng, 7000), 1000, "agent-gauge-member")
    resp = a.getresponse()
    assert resp.status == 200
    resp.fp.readline()  # the member runs
    wait_for("the member holds a lease", lambda: metric(default.metrics(), "kvgate_active_leases") == 1)
    text = default.metrics()
    load = metric(text, "kvgate_working_set_tokens", engine="0")
    assert metric(text, "kvgate_working_set_sessions", engine="0") == 1
    assert metric(text, "kvgate_working_set_waiting_sessions", engine="0") == 0
    assert load >= 7000
    assert metric(text, "kvgate_working_set_free_tokens", engine="0") == max(0, cap - load) < 6000
    b = open_stream(default, random_prompt(rng, 6000), 4, "agent-gauge-newcomer")
    wait_for("the newcomer waits", lambda: metric(default.metrics(), "kvgate_working_set_waiting_sessions", engine="0") == 1)
    text = default.metrics()
    assert metric(text, "kvgate_waiting_attempts", engine="0") == 1
    assert metric(text, "kvgate_working_set_sessions", engine="0") == 1
    assert metric(text, "kvgate_refused_total", engine="0") == 0  # the refusal mode is off
    b.close()  # the newcomer's client gives up: it leaves the queue
    wait_for("nobody waits", lambda: metric(default.metrics(), "kvgate_working_set_waiting_sessions", engine="0") == 0)
    a.close()
    wait_for("no lease is left", lambda: metric(default.metrics(), "kvgate_active_leases") == 0)
    assert metric(default.metrics(), "kvgate_waiting_attempts", engine="0") == 0
