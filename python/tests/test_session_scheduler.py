"""kvgate.SessionLevelScheduler, the drop-in for the seed proxy's scheduler,
against a fake server manager that records every call.

Reference mode (any HARBOR_SESSION_SCHEDULER_* knob set) must make the
seed's decisions: its four reasons, the wait and retry, preemption by the
abort event, the grace windows and finish, and the original's edge cases
(probe answers that are not numbers, probes that raise, knobs out of range).
Working-set mode (the knobs unset) is kvgate's default admission."""

from __future__ import annotations

import asyncio
import math
import time
from typing import Any, Dict, List, Optional, Tuple

import pytest

import kvgate
from kvgate import AdmissionPreempted, SessionLevelScheduler

from conftest import run, until

ON = {"HARBOR_SESSION_LEVEL_SCHEDULER": "1"}
# The seed's table at the seed's defaults, a short grace for the tests that expire it.
REFERENCE = {**ON, "HARBOR_SESSION_SCHEDULER_HIGH_WATERMARK": "0.85"}
PRESSURE = {"kv_cache_usage": 0.9}
CALM = {"kv_cache_usage": 0.2}
HOT = {"hit_ratio": 0.9}
COLD = {"hit_ratio": 0.1}


class FakeServerManager:
    """verl's server manager as the proxy sees it: async probes answering
    what the test sets (a dict, anything else, or an exception to raise),
    every call recorded as (method, session_id, prompt_ids)."""

    def __init__(self, usage: Any = CALM, prefix: Any = COLD, capacity: Any = None) -> None:
        self.usage, self.prefix, self.capacity = usage, prefix, capacity
        self.calls: List[Tuple[str, Any, Optional[list]]] = []
        self.hang: Optional[str] = None  # a method that never returns

    def methods(self) -> List[str]:
        return [c[0] for c in self.calls]

    def count(self, method: str) -> int:
        return self.methods().count(method)

    async def _answer(self, method: str, value: Any) -> Any:
        if self.hang == method:
            await asyncio.Event().wait()  # never set: only cancellation ends it
        if isinstance(value, BaseException):
            raise value
        return value

    async def kv_cache_usage_probe(self, session_id: Any) -> Any:
        self.calls.append(("kv_cache_usage_probe", session_id, None))
        return await self._answer("kv_cache_usage_probe", self.usage)

    async def prefix_cache_probe(self, session_id: Any, *, prompt_ids: list) -> Any:
        self.calls.append(("prefix_cache_probe", session_id, prompt_ids))
        return await self._answer("prefix_cache_probe", self.prefix)


class WithCapacity(FakeServerManager):
    async def kv_cache_capacity_probe(self, session_id: Any) -> Any:
        self.calls.append(("kv_cache_capacity_probe", session_id, None))
        return self.capacity


def scheduler(env: Dict[str, str], manager: Any) -> SessionLevelScheduler:
    return SessionLevelScheduler(manager, environ=env)


# -- switch and knobs --------------------------------------------------------


@pytest.mark.parametrize("value", [None, "", "0", "false", " NO ", "Off"])
def test_off_returns_the_disabled_lease_and_probes_nothing(value: Optional[str]) -> None:
    env = {} if value is None else {"HARBOR_SESSION_LEVEL_SCHEDULER": value}
    manager = FakeServerManager(usage=PRESSURE)
    sched = scheduler(env, manager)
    assert not sched.enabled and sched.gate is None and sched.mode is None

    async def main() -> None:
        lease = await sched.acquire("s", [1, 2, 3])
        assert (lease.wait_sec, lease.reason, lease.usage, lease.prefix_hit_ratio, lease.retain_session) == (
            0.0, "disabled", None, None, False,
        )
        await lease.release()
        await lease.release(cached_tokens=3, output_tokens=1)
        await sched.finish_session("s", reason="finish_tool")

    run(main())
    assert manager.calls == []


@pytest.mark.parametrize("session_id", [4242, None, 1.5, ["s"], bytearray(b"s"), "s", b"s"])
def test_off_any_session_id_gets_the_disabled_lease_and_finish_does_nothing(session_id: Any) -> None:
    manager = FakeServerManager(usage=PRESSURE)
    sched = scheduler({}, manager)

    async def main() -> None:
        lease = await sched.acquire(session_id, [1, 2, 3], abort_event=asyncio.Event(), timeout=0.1)
        assert isinstance(lease, kvgate.DisabledLease) and lease.reason == "disabled"
        await lease.release()
        assert await sched.finish_session(session_id, reason="pop_session") is None

    run(main())
    assert manager.calls == []


@pytest.mark.parametrize("value", ["1", "2", "yes", "true", "on", "anything"])
def test_any_other_value_turns_it_on(value: str) -> None:
    sched = scheduler({"HARBOR_SESSION_LEVEL_SCHEDULER": value}, FakeServerManager())
    assert sched.enabled and sched.gate is not None
    sched.close()


def test_on_without_knobs_is_working_set_admission() -> None:
    sched = scheduler(ON, FakeServerManager())
    assert sched.mode is kvgate.AdmissionMode.WORKING_SET
    assert sched.gate.config == kvgate.Config()
    sched.close()


@pytest.mark.parametrize(
    "knob", ["HIGH_WATERMARK", "HIT_THRESHOLD", "WAIT_POLL_SEC", "IDLE_GRACE_SEC"]
)
def test_any_knob_selects_the_seed_table_with_the_seed_defaults(knob: str) -> None:
    sched = scheduler({**ON, f"HARBOR_SESSION_SCHEDULER_{knob}": "not a number"}, FakeServerManager())
    assert sched.mode is kvgate.AdmissionMode.REFERENCE
    # An unparseable value is the default, as the seed parses it.
    assert (sched.high_watermark, sched.hit_threshold, sched.wait_poll_sec, sched.idle_grace_sec) == (0.85, 0.80, 5.0, 60.0)
    assert sched.gate.config == kvgate.Config(
        admission_mode=kvgate.AdmissionMode.REFERENCE, high_watermark=0.85, hit_threshold=0.80,
        wait_poll_sec=5.0, idle_grace_sec=60.0,
    )
    sched.close()


# The knob table of docs/migrating.md ("Keeping the old table"): for each
# knob, what the seed reads from a value (float(value), the default when it
# does not parse, then its floor) and whether the value selects the table.
DEFAULTS = {"HIGH_WATERMARK": 0.85, "HIT_THRESHOLD": 0.80, "WAIT_POLL_SEC": 5.0, "IDLE_GRACE_SEC": 60.0}
KNOB_TABLE = [
    # value, selects the table, what each knob reads (None: the default)
    ("", False, {}),
    ("  ", False, {}),
    ("abc", True, {}),
    ("nan", True, {"HIGH_WATERMARK": math.nan, "HIT_THRESHOLD": math.nan, "WAIT_POLL_SEC": 5.0, "IDLE_GRACE_SEC": 0.0}),
    ("-1", True, {"HIGH_WATERMARK": -1.0, "HIT_THRESHOLD": -1.0, "WAIT_POLL_SEC": 5.0, "IDLE_GRACE_SEC": 0.0}),
]


@pytest.mark.parametrize("knob", list(DEFAULTS))
@pytest.mark.parametrize("value, selects, reads", KNOB_TABLE, ids=["empty", "blank", "not_a_number", "nan", "negative"])
def test_the_knob_table(knob: str, value: str, selects: bool, reads: Dict[str, float]) -> None:
    sched = scheduler({**ON, f"HARBOR_SESSION_SCHEDULER_{knob}": value}, FakeServerManager())
    want = {**DEFAULTS, knob: reads.get(knob, DEFAULTS[knob])}
    got = {
        "HIGH_WATERMARK": sched.high_watermark, "HIT_THRESHOLD": sched.hit_threshold,
        "WAIT_POLL_SEC": sched.wait_poll_sec, "IDLE_GRACE_SEC": sched.idle_grace_sec,
    }
    for name in DEFAULTS:
        assert got[name] == want[name] or (math.isnan(got[name]) and math.isnan(want[name])), (name, got)
    assert sched.mode is (kvgate.AdmissionMode.REFERENCE if selects else kvgate.AdmissionMode.WORKING_SET)
    sched.close()


def test_the_poll_is_at_least_5_s_and_the_grace_at_least_0() -> None:
    env = {**ON, "HARBOR_SESSION_SCHEDULER_WAIT_POLL_SEC": "0.5", "HARBOR_SESSION_SCHEDULER_IDLE_GRACE_SEC": "-3"}
    sched = scheduler(env, FakeServerManager())
    assert (sched.wait_poll_sec, sched.idle_grace_sec) == (5.0, 0.0)
    assert (sched.gate.config.wait_poll_sec, sched.gate.config.idle_grace_sec) == (5.0, 0.0)
    sched.close()
    env = {**ON, "HARBOR_SESSION_SCHEDULER_WAIT_POLL_SEC": "7.5", "HARBOR_SESSION_SCHEDULER_IDLE_GRACE_SEC": "inf"}
    sched = scheduler(env, FakeServerManager())
    assert sched.wait_poll_sec == 7.5 and sched.idle_grace_sec == math.inf
    assert sched.gate.config.idle_grace_sec == 100 * 365 * 24 * 3600  # the library's longest
    sched.close()


def test_the_environment_is_read_once_at_construction(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HARBOR_SESSION_LEVEL_SCHEDULER", "1")
    monkeypatch.setenv("HARBOR_SESSION_SCHEDULER_HIT_THRESHOLD", "0.5")
    sched = SessionLevelScheduler(FakeServerManager())
    monkeypatch.setenv("HARBOR_SESSION_SCHEDULER_HIT_THRESHOLD", "0.9")
    assert sched.hit_threshold == 0.5 and sched.mode is kvgate.AdmissionMode.REFERENCE
    sched.close()


# -- the table -----------------------------------------------------------------


@pytest.mark.parametrize(
    "answer",
    [{}, {"kv_cache_usage": None}, {"other": 0.9}, {"kv_cache_usage": "high"}, {"kv_cache_usage": [0.9]},
     [("kv_cache_usage", 0.9)], 0.9, None, RuntimeError("ray actor died"), {"kv_cache_usage": "nan"}],
)
def test_usage_unavailable_admits_open_without_the_prefix_probe(answer: Any) -> None:
    manager = FakeServerManager(usage=answer, prefix=HOT)
    sched = scheduler(REFERENCE, manager)

    async def main() -> None:
        lease = await sched.acquire("s", [1, 2])
        assert (lease.reason, lease.retain_session, lease.prefix_hit_ratio) == ("open", False, None)
        if isinstance(answer, dict) and answer.get("kv_cache_usage") == "nan":
            assert math.isnan(lease.usage)  # a number to the seed: float("nan"), never pressure
        else:
            assert lease.usage is None
        await lease.release()

    run(main())
    assert manager.methods() == ["kv_cache_usage_probe"]
    sched.close()


def test_a_server_manager_without_probes_admits_open() -> None:
    sched = scheduler(REFERENCE, object())

    async def main() -> None:
        lease = await sched.acquire("s", [1])
        assert (lease.reason, lease.usage) == ("open", None)
        await lease.release()

    run(main())
    sched.close()


def test_plain_method_probes_are_answered_too() -> None:
    class Plain:
        def kv_cache_usage_probe(self, session_id: Any) -> Any:
            return PRESSURE

        def prefix_cache_probe(self, session_id: Any, *, prompt_ids: list) -> Any:
            return HOT

    sched = scheduler(REFERENCE, Plain())

    async def main() -> None:
        lease = await sched.acquire("s", [1])
        assert (lease.reason, lease.usage, lease.prefix_hit_ratio) == ("resident_prefix", 0.9, 0.9)
        await lease.release()

    run(main())
    sched.close()


def test_below_the_watermark_is_open_and_equal_is_pressure() -> None:
    manager = FakeServerManager(usage={"kv_cache_usage": 0.8499}, prefix=HOT)
    sched = scheduler(REFERENCE, manager)

    async def main() -> None:
        lease = await sched.acquire("a", [1, 2])
        assert (lease.reason, lease.usage, lease.retain_session) == ("open", 0.8499, False)
        await lease.release()
        manager.usage = {"kv_cache_usage": 0.85}
        lease = await sched.acquire("b", [1, 2])
        assert (lease.reason, lease.usage, lease.prefix_hit_ratio) == ("resident_prefix", 0.85, 0.9)
        await lease.release()

    run(main())
    sched.close()


def test_resident_prefix_reserves_and_the_reservation_skips_the_prefix_probe() -> None:
    manager = FakeServerManager(usage=PRESSURE, prefix={"hit_ratio": 0.8})  # equality is resident
    sched = scheduler(REFERENCE, manager)

    async def main() -> None:
        lease = await sched.acquire("s", [5] * 10)
        assert (lease.reason, lease.retain_session, lease.prefix_hit_ratio, lease.usage) == ("resident_prefix", True, 0.8, 0.9)
        stats = sched.gate.session_stats("s")
        assert stats.reserved and not stats.in_grace  # in flight (the seed's +inf)
        assert manager.calls[-1] == ("prefix_cache_probe", "s", [5] * 10)
        await lease.release(cached_tokens=8, output_tokens=2)
        assert sched.gate.session_stats("s").in_grace
        manager.calls.clear()
        manager.prefix = COLD
        again = await sched.acquire("s", [5] * 12)
        assert (again.reason, again.retain_session, again.prefix_hit_ratio) == ("reserved_session", True, None)
        assert manager.methods() == ["kv_cache_usage_probe"]
        await again.release()

    run(main())
    sched.close()


@pytest.mark.parametrize(
    "answer", [{}, {"hit_ratio": None}, {"hit_ratio": "x"}, {"hits": 0.9}, "0.9", RuntimeError("boom")]
)
def test_prefix_unavailable_under_pressure_admits_without_a_reservation(answer: Any) -> None:
    manager = FakeServerManager(usage=PRESSURE, prefix=answer)
    sched = scheduler(REFERENCE, manager)

    async def main() -> None:
        lease = await sched.acquire("s", [1, 2, 3])
        assert (lease.reason, lease.retain_session, lease.prefix_hit_ratio) == ("prefix_probe_unavailable", False, None)
        assert not sched.gate.session_stats("s").reserved
        await lease.release()
        assert not sched.gate.session_stats("s").reserved

    run(main())
    assert manager.methods() == ["kv_cache_usage_probe", "prefix_cache_probe"]
    sched.close()


def test_a_cold_prompt_waits_and_a_release_lets_it_probe_again() -> None:
    manager = FakeServerManager(usage=PRESSURE, prefix=HOT)
    sched = scheduler(REFERENCE, manager)

    async def main() -> None:
        holder = await sched.acquire("hot", [1] * 10)
        assert holder.reason == "resident_prefix"
        manager.prefix = COLD
        waiter = asyncio.ensure_future(sched.acquire("cold", [2] * 10))
        await until("the cold session waits", lambda: sched.gate.stats().waiting_attempts == 1)
        assert manager.methods()[-2:] == ["kv_cache_usage_probe", "prefix_cache_probe"]
        manager.usage = CALM
        t0 = time.monotonic()
        await holder.release()  # wakes the waiter well before the 5 s poll
        lease = await waiter
        assert time.monotonic() - t0 < 2.0
        assert (lease.reason, lease.usage, lease.retain_session) == ("open", 0.2, False)
        assert lease.prefix_hit_ratio is None  # this pass did not probe the prefix
        assert lease.wait_sec > 0
        assert sched.gate.stats().waits == 1
        await lease.release()

    run(main())
    sched.close()


def test_a_finish_ends_the_reservation_and_wakes_a_waiter() -> None:
    manager = FakeServerManager(usage=PRESSURE, prefix=HOT)
    sched = scheduler(REFERENCE, manager)

    async def main() -> None:
        first = await sched.acquire("owner", [1])
        await first.release()
        assert sched.gate.session_stats("owner").in_grace
        manager.prefix = COLD
        waiter = asyncio.ensure_future(sched.acquire("cold", [2]))
        await until("the cold session waits", lambda: sched.gate.stats().waiting_attempts == 1)
        manager.prefix = HOT
        await sched.finish_session("owner", reason="finish_tool")
        lease = await asyncio.wait_for(waiter, 2.0)
        assert lease.reason == "resident_prefix"
        await lease.release()
        assert sched.gate.session_stats("owner") is None  # finished: no reservation left
        # After the finish the owner probes again, and a release after finish brings nothing back.
        manager.calls.clear()
        again = await sched.acquire("owner", [1])
        assert again.reason == "resident_prefix" and "prefix_cache_probe" in manager.methods()
        await sched.finish_session("owner")
        await again.release()
        assert sched.gate.session_stats("owner") is None  # the late release brings nothing back
        assert sched.gate.stats().reserved_in_grace == 1  # "cold" alone

    run(main())
    sched.close()


def test_with_nobody_to_wake_it_a_waiter_probes_again_after_the_poll() -> None:
    manager = FakeServerManager(usage=PRESSURE, prefix=COLD)
    sched = scheduler({**REFERENCE, "HARBOR_SESSION_SCHEDULER_WAIT_POLL_SEC": "1"}, manager)  # becomes 5

    async def main() -> None:
        t0 = time.monotonic()
        waiter = asyncio.ensure_future(sched.acquire("cold", [3] * 4))
        await until("the first pass", lambda: manager.count("prefix_cache_probe") == 1)
        manager.prefix = HOT
        lease = await asyncio.wait_for(waiter, 10.0)
        waited = time.monotonic() - t0
        assert 4.9 <= waited < 8.0, waited
        assert (lease.reason, lease.prefix_hit_ratio) == ("resident_prefix", 0.9)
        assert manager.methods() == ["kv_cache_usage_probe", "prefix_cache_probe"] * 2
        await lease.release()

    run(main())
    sched.close()


def test_the_grace_window_expires_and_then_the_session_must_probe() -> None:
    manager = FakeServerManager(usage=PRESSURE, prefix=HOT)
    sched = scheduler({**REFERENCE, "HARBOR_SESSION_SCHEDULER_IDLE_GRACE_SEC": "0.3"}, manager)

    async def main() -> None:
        lease = await sched.acquire("s", [1])
        await lease.release()
        within = await sched.acquire("s", [1, 2])
        assert within.reason == "reserved_session"
        await within.release()
        await asyncio.sleep(0.5)
        manager.calls.clear()
        after = await sched.acquire("s", [1, 2, 3])
        assert after.reason == "resident_prefix"
        assert manager.methods() == ["kv_cache_usage_probe", "prefix_cache_probe"]
        await after.release()
        assert sched.gate.stats().grace_expired >= 1

    run(main())
    sched.close()


def test_a_grace_expiry_wakes_a_waiter() -> None:
    manager = FakeServerManager(usage=PRESSURE, prefix=HOT)
    sched = scheduler({**REFERENCE, "HARBOR_SESSION_SCHEDULER_IDLE_GRACE_SEC": "0.3"}, manager)

    async def main() -> None:
        lease = await sched.acquire("owner", [1])
        await lease.release()
        manager.prefix = COLD
        waiter = asyncio.ensure_future(sched.acquire("cold", [2]))
        await until("the cold session waits", lambda: sched.gate.stats().waiting_attempts == 1)
        manager.usage = CALM
        got = await asyncio.wait_for(waiter, 2.0)  # the expiry, not the 5 s poll
        assert got.reason == "open"
        await got.release()

    run(main())
    sched.close()


def test_a_grace_of_zero_keeps_no_reservation() -> None:
    manager = FakeServerManager(usage=PRESSURE, prefix=HOT)
    sched = scheduler({**ON, "HARBOR_SESSION_SCHEDULER_IDLE_GRACE_SEC": "0"}, manager)

    async def main() -> None:
        lease = await sched.acquire("s", [1])
        assert lease.reason == "resident_prefix"
        await lease.release()
        assert not sched.gate.session_stats("s").reserved
        again = await sched.acquire("s", [1])
        assert again.reason == "resident_prefix"
        await again.release()

    run(main())
    sched.close()


def test_open_leases_leave_a_reservation_alone_and_releases_are_idempotent() -> None:
    manager = FakeServerManager(usage=PRESSURE, prefix=HOT)
    sched = scheduler(REFERENCE, manager)

    async def main() -> None:
        lease = await sched.acquire("s", [1])
        await lease.release()
        grace = sched.gate.session_stats("s").grace_remaining_sec
        manager.usage = CALM
        opened = await sched.acquire("s", [1])
        assert opened.reason == "open" and not opened.retain_session
        await opened.release()
        await opened.release()
        stats = sched.gate.session_stats("s")
        assert stats.in_grace and stats.grace_remaining_sec <= grace  # neither refreshed nor removed
        assert sched.gate.stats().releases == 2

    run(main())
    sched.close()


# -- edge cases of the original --------------------------------------------------


def test_a_nan_watermark_never_sees_pressure() -> None:
    manager = FakeServerManager(usage={"kv_cache_usage": 1.0}, prefix=COLD)
    sched = scheduler({**ON, "HARBOR_SESSION_SCHEDULER_HIGH_WATERMARK": "nan"}, manager)
    assert math.isnan(sched.high_watermark)

    async def main() -> None:
        for usage in (0.0, 0.99, 1.0, 5.0):
            manager.usage = {"kv_cache_usage": usage}
            lease = await sched.acquire("s", [1])
            assert (lease.reason, lease.usage) == ("open", usage)
            await lease.release()

    run(main())
    assert manager.count("prefix_cache_probe") == 0
    sched.close()


def test_a_negative_watermark_is_always_pressure() -> None:
    manager = FakeServerManager(usage={"kv_cache_usage": 0.0}, prefix=HOT)
    sched = scheduler({**ON, "HARBOR_SESSION_SCHEDULER_HIGH_WATERMARK": "-1"}, manager)

    async def main() -> None:
        for usage in (0.0, -0.5, 0.3):
            manager.usage = {"kv_cache_usage": usage}
            lease = await sched.acquire(f"s{usage}", [1])
            assert (lease.reason, lease.usage) == ("resident_prefix", usage)
            await lease.release()
        manager.usage = {"kv_cache_usage": -2.0}  # below even that watermark
        lease = await sched.acquire("low", [1])
        assert lease.reason == "open"
        await lease.release()

    run(main())
    sched.close()


def test_usage_above_one_is_pressure_and_a_watermark_above_one_needs_it() -> None:
    manager = FakeServerManager(usage={"kv_cache_usage": 1.2}, prefix=HOT)
    sched = scheduler(REFERENCE, manager)

    async def main() -> None:
        lease = await sched.acquire("s", [1])
        assert (lease.reason, lease.usage) == ("resident_prefix", 1.2)
        await lease.release()

    run(main())
    sched.close()
    sched = scheduler({**ON, "HARBOR_SESSION_SCHEDULER_HIGH_WATERMARK": "1.5"}, manager)

    async def above() -> None:
        for usage, reason in ((1.0, "open"), (1.2, "open"), (1.5, "resident_prefix"), (9.0, "resident_prefix")):
            manager.usage = {"kv_cache_usage": usage}
            lease = await sched.acquire(f"s{usage}", [1])
            assert lease.reason == reason, usage
            await lease.release()

    run(above())
    sched.close()


def test_a_nan_hit_ratio_is_a_number_to_the_seed_so_the_turn_waits() -> None:
    manager = FakeServerManager(usage=PRESSURE, prefix={"hit_ratio": "nan"})
    sched = scheduler(REFERENCE, manager)

    async def main() -> None:
        with pytest.raises(kvgate.TimedOut):
            await sched.acquire("s", [1], timeout=0.3)
        assert manager.count("prefix_cache_probe") == 1
        assert sched.gate.stats().admissions == 0

    run(main())
    sched.close()


@pytest.mark.parametrize("threshold", ["0", "-1"])
def test_a_threshold_at_or_below_zero_makes_every_probed_prompt_resident(threshold: str) -> None:
    manager = FakeServerManager(usage=PRESSURE, prefix={"hit_ratio": 0.0})
    sched = scheduler({**ON, "HARBOR_SESSION_SCHEDULER_HIT_THRESHOLD": threshold}, manager)

    async def main() -> None:
        lease = await sched.acquire("s", [1])
        assert (lease.reason, lease.prefix_hit_ratio) == ("resident_prefix", 0.0)
        await lease.release()
        manager.prefix = {"hit_ratio": -5.0}  # below -1 too: not resident
        with pytest.raises(kvgate.TimedOut):
            await sched.acquire("t", [1], timeout=0.3)

    run(main())
    sched.close()


def test_a_nan_threshold_is_never_reached_so_a_probed_turn_waits() -> None:
    manager = FakeServerManager(usage=PRESSURE, prefix={"hit_ratio": 1.0})
    sched = scheduler({**ON, "HARBOR_SESSION_SCHEDULER_HIT_THRESHOLD": "nan"}, manager)

    async def main() -> None:
        with pytest.raises(kvgate.TimedOut):  # 1.0 >= nan is False: not resident
            await sched.acquire("s", [1], timeout=0.3)
        manager.prefix = {}  # unavailable: admitted as the seed does
        lease = await sched.acquire("s", [1])
        assert lease.reason == "prefix_probe_unavailable"
        await lease.release()

    run(main())
    sched.close()


def test_a_threshold_above_one_is_never_reached_by_a_full_hit() -> None:
    manager = FakeServerManager(usage=PRESSURE, prefix={"hit_ratio": 1.0})
    sched = scheduler({**ON, "HARBOR_SESSION_SCHEDULER_HIT_THRESHOLD": "1.01"}, manager)

    async def main() -> None:
        with pytest.raises(kvgate.TimedOut):
            await sched.acquire("s", [1], timeout=0.3)
        manager.prefix = {"hit_ratio": True}  # float(True) == 1.0 to the seed as well
        with pytest.raises(kvgate.TimedOut):
            await sched.acquire("s", [1], timeout=0.3)

    run(main())
    sched.close()


# -- preemption --------------------------------------------------------------------


def test_an_abort_set_before_the_call_probes_nothing() -> None:
    manager = FakeServerManager(usage=PRESSURE)
    sched = scheduler(REFERENCE, manager)

    async def main() -> None:
        abort = asyncio.Event()
        abort.set()
        with pytest.raises(AdmissionPreempted) as err:
            await sched.acquire("s", [1], abort_event=abort)
        assert err.value.session_id == "s" and isinstance(err.value, kvgate.Preempted)
        # The seed's text exactly: Lego-RL's proxy sends str(exc) as its 409 body.
        assert str(err.value) == "Request preempted by a newer retry for session s"
        assert err.value.message == str(err.value) and err.value.http_status == 409

    run(main())
    assert manager.calls == [] and sched.gate.stats().attempts == 0
    sched.close()


@pytest.mark.parametrize("where", ["kv_cache_usage_probe", "prefix_cache_probe", "wait"])
def test_an_abort_ends_the_attempt_at_once_and_leaves_nothing(where: str) -> None:
    manager = FakeServerManager(usage=PRESSURE, prefix=COLD)
    if where != "wait":
        manager.hang = where
    sched = scheduler(REFERENCE, manager)

    async def main() -> None:
        abort = asyncio.Event()
        task = asyncio.ensure_future(sched.acquire("s", [1, 2], abort_event=abort))
        if where == "wait":
            await until("it waits", lambda: sched.gate.stats().waiting_attempts == 1)
        else:
            await until(f"it is in {where}", lambda: manager.count(where) == 1)
        t0 = time.monotonic()
        abort.set()
        with pytest.raises(AdmissionPreempted):
            await task
        assert time.monotonic() - t0 < 1.0  # not at the next 5 s poll
        await until("the attempt is gone", lambda: sched.gate.stats().pending_attempts == 0)
        stats = sched.gate.stats()
        assert (stats.admissions, stats.active_leases, stats.reserved_in_flight + stats.reserved_in_grace) == (0, 0, 0)
        # An abort is the proxy's preemption: counted as preempted, not cancelled.
        assert (stats.preempted, stats.cancelled, stats.timed_out) == (1, 0, 0)
        assert sched.gate.session_stats("s").num_preempted == 1
        # The session is admitted as usual afterwards.
        manager.hang, manager.usage = None, CALM
        lease = await sched.acquire("s", [1, 2])
        assert lease.reason == "open"
        await lease.release()

    run(main())
    sched.close()


def test_a_newer_attempt_of_the_session_preempts_the_waiting_one() -> None:
    manager = FakeServerManager(usage=PRESSURE, prefix=COLD)
    sched = scheduler(REFERENCE, manager)

    async def main() -> None:
        old = asyncio.ensure_future(sched.acquire("s", [1]))
        await until("it waits", lambda: sched.gate.stats().waiting_attempts == 1)
        new = asyncio.ensure_future(sched.acquire("s", [1, 2]))
        with pytest.raises(AdmissionPreempted):
            await asyncio.wait_for(old, 2.0)
        assert sched.gate.session_stats("s").num_preempted == 1
        manager.usage = CALM
        lease = await asyncio.wait_for(new, 7.0)  # at its next poll
        assert lease.reason == "open"
        await lease.release()
        assert sched.gate.stats().preempted == 1

    run(main())
    sched.close()


# -- bad input ---------------------------------------------------------------------


@pytest.mark.parametrize("bad", [7, None, 1.5, ["s"], bytearray(b"s"), ("s",)])
def test_a_session_id_that_is_not_str_or_bytes_raises_at_the_call(bad: Any) -> None:
    manager = FakeServerManager()
    sched = scheduler(REFERENCE, manager)
    with pytest.raises(TypeError, match="session_id must be str or bytes"):
        sched.acquire(bad, [1])  # no await: the call itself raises
    with pytest.raises(TypeError, match="session_id must be str or bytes"):
        sched.finish_session(bad)
    assert manager.calls == []
    assert sched.gate.stats().attempts == 0
    sched.close()


def test_bytes_session_ids_reach_the_probes_as_given() -> None:
    manager = FakeServerManager(usage=PRESSURE, prefix=HOT)
    sched = scheduler(REFERENCE, manager)

    async def main() -> None:
        lease = await sched.acquire(b"raw-id", [4])
        assert lease.reason == "resident_prefix"
        await lease.release()
        await sched.finish_session(b"raw-id")

    run(main())
    assert [c[1] for c in manager.calls] == [b"raw-id", b"raw-id"]
    sched.close()


@pytest.mark.parametrize("env", [REFERENCE, ON], ids=["reference", "working_set"])
def test_a_probe_that_never_returns_does_not_break_the_timeout(env: Dict[str, str]) -> None:
    manager = WithCapacity(usage=PRESSURE)
    manager.hang = "kv_cache_usage_probe"
    sched = scheduler(env, manager)

    async def main() -> None:
        t0 = time.monotonic()
        with pytest.raises(kvgate.TimedOut):
            await sched.acquire("s", [1], timeout=0.3)
        assert 0.3 <= time.monotonic() - t0 < 1.5
        await until("the attempt is gone", lambda: sched.gate.stats().pending_attempts == 0)
        stats = sched.gate.stats()
        assert stats.active_leases == 0
        # Counted as what the caller saw: timed out, not cancelled.
        assert (stats.timed_out, stats.cancelled, stats.preempted) == (1, 0, 0)
        assert sched.gate.session_stats("s").timed_out == 1

    run(main())
    sched.close()


def test_a_probe_that_never_returns_does_not_break_cancellation() -> None:
    manager = FakeServerManager(usage=PRESSURE)
    manager.hang = "kv_cache_usage_probe"
    sched = scheduler(REFERENCE, manager)

    async def main() -> None:
        task = asyncio.ensure_future(sched.acquire("s", [1]))
        await until("it probes", lambda: manager.count("kv_cache_usage_probe") == 1)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await until("the attempt is gone", lambda: sched.gate.stats().pending_attempts == 0)
        stats = sched.gate.stats()
        assert (stats.cancelled, stats.admissions, stats.active_leases) == (1, 0, 0)

    run(main())
    sched.close()


def test_cancelling_a_waiting_acquire_cancels_the_attempt() -> None:
    manager = FakeServerManager(usage=PRESSURE, prefix=COLD)
    sched = scheduler(REFERENCE, manager)

    async def main() -> None:
        task = asyncio.ensure_future(sched.acquire("s", [1]))
        await until("it waits", lambda: sched.gate.stats().waiting_attempts == 1)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await until("the attempt is gone", lambda: sched.gate.stats().pending_attempts == 0)
        assert sched.gate.stats().cancelled == 1

    run(main())
    sched.close()


# -- working-set mode (the default when on) ----------------------------------------------


def test_working_set_mode_asks_the_capacity_and_never_the_prefix() -> None:
    # 2,048 tokens prefilled at 100 tokens/s: a member keeps its place for a 20.48 s refill window.
    capacity = {"capacity_tokens": 64 * 32, "block_size": 32, "prefill_tokens_per_sec": 100.0, "num_gpu_blocks": 64}
    manager = WithCapacity(usage={"kv_cache_usage": 0.1}, prefix=HOT, capacity=capacity)
    sched = scheduler(ON, manager)

    async def main() -> None:
        lease = await sched.acquire("agent-1", [7] * 300)
        assert lease.reason == "empty_working_set" and lease.retain_session
        assert (lease.usage, lease.prefix_hit_ratio) == (0.1, None)
        await lease.release(cached_tokens=0, output_tokens=16)
        stats = sched.gate.stats()
        assert (stats.working_set_capacity_tokens, stats.working_set_window_sec) == (64 * 32, 20.48)
        again = await sched.acquire("agent-1", [7] * 400)
        assert again.reason == "reserved_session", again.reason  # a member goes straight back in
        async with again:
            pass
        assert again.released
        await sched.finish_session("agent-1")
        assert sched.gate.stats().active_leases == 0

    run(main())
    assert manager.count("prefix_cache_probe") == 0
    assert manager.count("kv_cache_capacity_probe") >= 1
    sched.close()


@pytest.mark.parametrize("answer", [None, {"capacity_tokens": "lots"}, {"block_size": 16}, "2048", RuntimeError("no")])
def test_a_capacity_answer_it_cannot_read_is_unknown(answer: Any) -> None:
    manager = WithCapacity(usage={"kv_cache_usage": 0.1}, capacity=answer)
    sched = scheduler(ON, manager)

    async def main() -> None:
        lease = await sched.acquire("agent-1", [7] * 300)
        assert lease.reason == "empty_working_set"
        await lease.release()

    run(main())
    assert sched.gate.stats().working_set_capacity_tokens == 0
    sched.close()
