"""`tests/helpers/waiting.wait_for`, the suite's one wait: it returns what the condition returned, goes on
while progress changes, fails after `stall_s` without progress, and says what it waited for."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from tests.helpers.waiting import wait_for


def test_returns_the_conditions_value_once_truthy() -> None:
    calls: Iterator[dict[str, int] | list[int] | None] = iter([None, [], {"a": 1}])
    assert wait_for(lambda: next(calls), what="a dict", every=0.001) == {"a": 1}


def test_without_progress_it_is_a_plain_timeout_with_a_message() -> None:
    t0 = time.monotonic()
    with pytest.raises(AssertionError, match=r"waiting for the impossible: timed out after 0s; last: False"):
        wait_for(lambda: False, what="the impossible", stall_s=0.2, every=0.01)
    assert 0.2 <= time.monotonic() - t0 < 2.0


def test_progress_extends_the_deadline_and_its_stall_fails() -> None:
    start = time.monotonic()
    moving_until = start + 0.6          # progress changes for 0.6 s, three times the stall budget

    def count() -> int:
        return int(min(time.monotonic(), moving_until) * 100)

    with pytest.raises(AssertionError, match=r"no progress for 0s \(waited \d+s in all; progress stopped at \d+\)"):
        wait_for(lambda: False, what="nothing", stall_s=0.2, progress=count, every=0.01)
    waited = time.monotonic() - start
    assert waited >= 0.7                # the 0.6 s of progress (its last change up to a poll early), then the stall


def test_progress_lets_a_slow_condition_finish() -> None:
    start = time.monotonic()
    done_at = start + 0.5
    assert wait_for(lambda: time.monotonic() >= done_at, what="slow but moving", stall_s=0.2,
                    progress=lambda: int(time.monotonic() * 50), every=0.01)


def test_ignored_errors_mean_not_yet_and_others_end_the_wait() -> None:
    attempts = iter([KeyError("loading"), KeyError("loading"), "ready"])

    def probe() -> str:
        x = next(attempts)
        if isinstance(x, Exception):
            raise x
        return str(x)

    assert wait_for(probe, what="ready", ignore=(KeyError,), every=0.001) == "ready"

    def crashed() -> bool:
        raise AssertionError("the process exited")

    t0 = time.monotonic()
    with pytest.raises(AssertionError, match="the process exited"):
        wait_for(crashed, what="never", stall_s=30, ignore=(KeyError,))
    assert time.monotonic() - t0 < 1.0


def test_detail_is_appended_to_the_failure() -> None:
    with pytest.raises(AssertionError, match="log tail: boom"):
        wait_for(lambda: None, what="x", stall_s=0.05, every=0.01, detail=lambda: "log tail: boom")


def test_max_s_ends_a_wait_whose_progress_never_stops() -> None:
    ticks = iter(range(10**9))
    with pytest.raises(AssertionError, match="not reached in 0s although it kept making progress"):
        wait_for(lambda: False, what="never", stall_s=60, progress=lambda: next(ticks), every=0.01, max_s=0.2)
