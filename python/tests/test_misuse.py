"""Misuse raises typed exceptions carrying the status and kvgate_last_error."""

from __future__ import annotations

import math

import pytest

import kvgate
from kvgate import Status, StepKind


def test_invalid_configuration():
    with pytest.raises(kvgate.InvalidArgument) as e:
        kvgate.Gate(kvgate.Config(high_watermark=math.nan))
    assert e.value.code is Status.INVALID_ARGUMENT
    assert "invalid high_watermark: NaN" in e.value.message
    assert e.value.message == kvgate.last_error()
    with pytest.raises(kvgate.InvalidArgument):
        kvgate.Gate(kvgate.Config(wait_poll_sec=0))
    with pytest.raises(ValueError, match="admission_mode"):
        kvgate.Gate(kvgate.Config(admission_mode="fastest"))


def test_out_of_order_steps(reference_gate):
    waker = kvgate.Waker()
    attempt = kvgate.Attempt(reference_gate, b"raw", 3, -1, waker, tag=7)
    assert attempt.kind is StepKind.PROBE_USAGE
    with pytest.raises(kvgate.OutOfOrder) as e:
        attempt.answer_prefix(0.5)
    assert e.value.code is Status.OUT_OF_ORDER
    assert "kvgate_attempt_answer_prefix" in e.value.message and "PROBE_USAGE" in e.value.message
    assert e.value.message == kvgate.last_error()
    with pytest.raises(kvgate.OutOfOrder):
        attempt.wake()
    assert attempt.answer_usage(0.1) is StepKind.ADMITTED
    with pytest.raises(kvgate.OutOfOrder) as e:
        attempt.answer_usage(0.1)
    assert "has ended" in e.value.message
    lease = attempt.lease()
    attempt.close()
    with pytest.raises(kvgate.OutOfOrder):
        attempt.wake()
    assert lease.release() and not lease.release()
    waker.close()


def test_wrong_types_and_values(reference_gate):
    with pytest.raises(TypeError):
        reference_gate.acquire_sync(42, [1])
    with pytest.raises(ValueError):
        reference_gate.acquire_sync("s", -1)


def test_every_failure_status_has_its_exception():
    for status in Status:
        if status is Status.OK:
            continue
        err = kvgate._errors.error_for(status, "m")
        assert err.code is status and type(err) is not kvgate.KvgateError, status
