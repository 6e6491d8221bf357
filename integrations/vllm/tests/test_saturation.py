"""The saturation signal of a gated `vllm serve` replica, end to end on the real
engine: the working-set gauges on `/metrics` (members, waiting sessions, free
room) and the refusal mode (KVGATE_VLLM_REFUSE_NEW=1), in which a turn that
would wait is answered HTTP 429 with Retry-After while a member's turn is
served. Nothing mocked."""

from __future__ import annotations

import json
import math
import random
from typing import Any, Iterator

import openai
import pytest

from support.engine import random_prompt
from support.launcher import Server, metric

from test_serve import PATIENCE_SEC, _running, complete, open_stream, wait_for

# The launcher's engine: 400 blocks of 32 tokens, max_model_len 8,192. A
# member's turn of 7,000 prompt tokens in flight leaves less room than a
# newcomer's 6,000 need, so the newcomer would wait (working-set admission,
# the library default).
CAPACITY = 400 * 32
MEMBER_PROMPT, MEMBER_OUTPUT = 7000, 1000
NEWCOMER_PROMPT = 6000


@pytest.fixture(scope="module")
def refusing(tmp_path_factory: Any) -> Iterator[Server]:
    yield from _running(tmp_path_factory, "refusing", gate=True, env={"KVGATE_VLLM_REFUSE_NEW": "1"})


def gauges(srv: Server) -> dict[str, float]:
    text = srv.metrics()
    names = (
        "kvgate_working_set_sessions", "kvgate_working_set_waiting_sessions", "kvgate_working_set_tokens",
        "kvgate_working_set_capacity_tokens", "kvgate_working_set_free_tokens", "kvgate_working_set_window_seconds",
        "kvgate_refused_total", "kvgate_active_leases", "kvgate_pending_attempts", "kvgate_waiting_attempts",
    )  # fmt: skip
    return {n.removeprefix("kvgate_"): metric(text, n, engine="0") for n in names}


def assert_nothing_left(srv: Server) -> None:
    """No lease, no attempt, no session queued to join the working set."""
    wait_for("no lease is left", lambda: metric(srv.metrics(), "kvgate_active_leases") == 0)
    g = gauges(srv)
    assert g["pending_attempts"] == g["waiting_attempts"] == g["working_set_waiting_sessions"] == 0, g


def test_a_full_working_set_refuses_newcomers_with_retry_after_and_serves_members(refusing: Server) -> None:
    rng = random.Random(21)
    member_prompt = random_prompt(rng, MEMBER_PROMPT)
    # The member's turn, streamed (raw HTTP), holds its working-set place while it runs.
    a = open_stream(refusing, member_prompt, MEMBER_OUTPUT, "sat-member")
    resp = a.getresponse()
    assert resp.status == 200
    resp.fp.readline()  # the first streamed event: the member runs
    wait_for("the member holds a lease", lambda: metric(refusing.metrics(), "kvgate_active_leases") == 1)
    full = gauges(refusing)
    assert full["working_set_capacity_tokens"] == CAPACITY  # the engine's, from its kvgate_capacity
    assert full["working_set_sessions"] == 1
    assert full["working_set_tokens"] >= MEMBER_PROMPT
    assert full["working_set_free_tokens"] == max(0, CAPACITY - full["working_set_tokens"])
    assert full["working_set_free_tokens"] < NEWCOMER_PROMPT  # the newcomer does not fit
    assert full["refused_total"] == 0

    # A newcomer while the set is full: HTTP 429 at once, with the gate's Retry-After.
    client = openai.OpenAI(base_url=refusing.url + "/v1", api_key="none", max_retries=0, timeout=PATIENCE_SEC)
    newcomer = random_prompt(rng, NEWCOMER_PROMPT)
    with pytest.raises(openai.RateLimitError) as refused:
        client.completions.create(
            model=refusing.model, prompt=newcomer, max_tokens=4, extra_headers={"X-Session-ID": "sat-newcomer"}
        )
    assert refused.value.status_code == 429
    retry_after = refused.value.response.headers.get("retry-after")
    assert retry_after is not None and retry_after.isdigit(), refused.value.response.headers
    after = gauges(refusing)
    assert int(retry_after) == max(1, math.ceil(after["working_set_window_seconds"])) >= 1
    assert b"working set is full" in refused.value.response.content
    assert after["refused_total"] == 1
    # Refused, not queued: the member alone holds a lease; nothing waits.
    assert after["active_leases"] == 1
    assert after["pending_attempts"] == after["waiting_attempts"] == after["working_set_waiting_sessions"] == 0

    # A streamed turn is refused too, but vLLM has sent its 200 and headers by
    # the time the engine's generator first runs: the refusal is the stream's
    # error event (code 429, the retry hint in its message), not an HTTP 429.
    stream = open_stream(refusing, newcomer, 4, "sat-newcomer")
    streamed = stream.getresponse()
    events = [line.removeprefix(b"data: ") for line in streamed.read().splitlines() if line.startswith(b"data: {")]
    stream.close()
    assert streamed.status == 200
    errors = [json.loads(e)["error"] for e in events if b'"error"' in e]
    assert len(errors) == 1 and errors[0]["code"] == 429, events
    assert "working set is full" in errors[0]["message"]
    assert gauges(refusing)["refused_total"] == 2

    # The member's next turn, while the set is still full: served, not refused.
    before = metric(refusing.metrics(), "kvgate_admissions_total", reason="reserved_session")
    out = complete(refusing, member_prompt, 4, {"X-Session-ID": "sat-member"})
    assert len(out.choices[0].token_ids) == 4
    assert metric(refusing.metrics(), "kvgate_admissions_total", reason="reserved_session") == before + 1
    assert gauges(refusing)["refused_total"] == 2

    # Requests without a session pass ungated even now.
    complete(refusing, random_prompt(rng, 100), 4)
    assert gauges(refusing)["refused_total"] == 2

    # The member's long turn ends: the stream is read to its end.
    while resp.fp.readline():
        pass
    a.close()
    assert_nothing_left(refusing)

    # A client that honours Retry-After (the openai client's own retries do)
    # gets the newcomer in once the member's window has passed and its room freed.
    retrying = openai.OpenAI(base_url=refusing.url + "/v1", api_key="none", max_retries=8, timeout=PATIENCE_SEC)
    out = retrying.completions.create(
        model=refusing.model, prompt=newcomer, max_tokens=4,
        extra_headers={"X-Session-ID": "sat-newcomer"}, extra_body={"ignore_eos": True, "min_tokens": 4},
    )  # fmt: skip
    assert out.choices[0].finish_reason == "length"
    assert_nothing_left(refusing)
    end = gauges(refusing)
    assert end["working_set_free_tokens"] == max(0, CAPACITY - end["working_set_tokens"])
