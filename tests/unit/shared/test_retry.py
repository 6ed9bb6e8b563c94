"""The one retry policy: what is retried, when it stops, and that a shutdown interrupts a wait."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from shared.retry import Backoff, call, retrying, retrying_async


class Flaky:
    def __init__(self, fail: int, exc: type[BaseException] = ConnectionError) -> None:
        self.fail, self.exc, self.calls = fail, exc, 0

    def __call__(self) -> str:
        self.calls += 1
        if self.calls <= self.fail:
            raise self.exc("down")
        return "ok"


def test_retries_until_success_within_attempts() -> None:
    op = Flaky(2)
    assert call(op, retry_on=ConnectionError, what="op", attempts=3, first_s=0.001, max_s=0.002) == "ok"
    assert op.calls == 3


def test_reraises_the_last_error_when_attempts_run_out() -> None:
    op = Flaky(5)
    with pytest.raises(ConnectionError):
        call(op, retry_on=ConnectionError, what="op", attempts=3, first_s=0.001, max_s=0.002)
    assert op.calls == 3


def test_no_attempt_starts_past_the_deadline() -> None:
    op = Flaky(100)
    t0 = time.monotonic()
    with pytest.raises(ConnectionError):
        call(op, retry_on=ConnectionError, what="op", attempts=None, deadline_s=0.5, first_s=0.3, max_s=0.3)
    assert op.calls == 2                 # at 0 s and 0.3 s; a third would start at 0.6 s, past the deadline
    assert time.monotonic() - t0 < 0.55


def test_a_zero_deadline_never_retries_and_zero_waits_do_not_sleep() -> None:
    op = Flaky(1)
    with pytest.raises(ConnectionError):
        call(op, retry_on=ConnectionError, what="op", attempts=None, deadline_s=0.0)
    assert op.calls == 1
    op = Flaky(2)
    t0 = time.monotonic()
    assert call(op, retry_on=ConnectionError, what="op", attempts=3, first_s=0.0, max_s=0.0) == "ok"
    assert time.monotonic() - t0 < 0.1


def test_an_error_not_named_is_not_retried() -> None:
    op = Flaky(1, ValueError)
    with pytest.raises(ValueError):
        call(op, retry_on=ConnectionError, what="op", attempts=5, first_s=0.001)
    assert op.calls == 1


def test_predicate_decides() -> None:
    op = Flaky(1, RuntimeError)
    assert call(op, retry_on=lambda e: "down" in str(e), what="op", first_s=0.001) == "ok"


def test_a_set_stop_event_ends_the_wait_and_the_retries() -> None:
    stop = threading.Event()
    op = Flaky(100)
    threading.Timer(0.2, stop.set).start()
    t0 = time.monotonic()
    with pytest.raises(ConnectionError):
        for attempt in retrying(retry_on=ConnectionError, what="op", attempts=None, first_s=30.0, max_s=30.0,
                                stop=stop):
            with attempt:
                op()
    assert time.monotonic() - t0 < 10.0   # not the 30 s wait
    assert op.calls == 1


def test_async_form() -> None:
    op = Flaky(2)

    async def run() -> str:
        async for attempt in retrying_async(retry_on=ConnectionError, what="op", first_s=0.001, max_s=0.002):
            with attempt:
                return op()
        raise AssertionError("unreachable")

    assert asyncio.run(run()) == "ok"
    assert op.calls == 3


def test_backoff_schedule_doubles_to_the_cap_and_resets() -> None:
    b = Backoff(1.0, 30.0, jitter=False)
    assert [b.next() for _ in range(7)] == [1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0]
    b.reset()
    assert b.next() == 1.0
