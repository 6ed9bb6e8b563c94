"""The project's one retry policy, on tenacity: exponential back-off with jitter, capped, stoppable.

Every in-process retry of a service goes through here, so "how long does X keep trying, and how fast"
has one answer per call site and one implementation. Three shapes cover the services:

- `retrying(...)`: a blocking loop around one operation (`for attempt in retrying(...): with attempt: op()`),
  or `call(op, ...)`, for the same thing in one line.
- `retrying_async(...)`: the same for asyncio code (the faust agents).
- `Backoff`: the delay schedule alone, for loops that must not block while they wait (a capture worker
  that keeps serving, a supervisor that restarts a child later): `backoff.next()` gives the next delay,
  `backoff.reset()` starts over after a success. It uses tenacity's own wait strategy, so the schedule
  is the same as the blocking forms'.

A `stop` event (a service's shutdown flag) ends any of them early: waits return as soon as it is set
and no further attempt is made.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any, TypeVar

from tenacity import (
    AsyncRetrying,
    RetryCallState,
    Retrying,
    retry_if_exception,
    stop_after_attempt,
    stop_before_delay,
    stop_never,
    wait_exponential_jitter,
)
from tenacity.stop import stop_base

T = TypeVar("T")

RetryOn = Callable[[BaseException], bool] | tuple[type[BaseException], ...] | type[BaseException]


class _StopWhenSet(stop_base):
    """Stop once the service's shutdown event is set (tenacity's own `stop_when_event_set` is the same
    idea; spelled out so a `None` event needs no special case at the call site)."""

    def __init__(self, event: threading.Event | None) -> None:
        self.event = event

    def __call__(self, retry_state: RetryCallState) -> bool:
        return self.event is not None and self.event.is_set()


def _predicate(retry_on: RetryOn) -> Callable[[BaseException], bool]:
    if isinstance(retry_on, (type, tuple)):
        types = retry_on
        return lambda e: isinstance(e, types)
    return retry_on


def _common(*, attempts: int | None, deadline_s: float | None, first_s: float, max_s: float,
            retry_on: RetryOn, stop: threading.Event | None, log: logging.Logger | None,
            what: str) -> dict[str, Any]:
    stops: Any = _StopWhenSet(stop)
    if attempts is not None:
        stops = stops | stop_after_attempt(attempts)
    if deadline_s is not None:
        stops = stops | stop_before_delay(deadline_s)   # no attempt starts past the deadline
    if attempts is None and deadline_s is None and stop is None:
        stops = stop_never

    last: list[BaseException] = []

    def before_sleep(state: RetryCallState) -> None:
        exc = state.outcome.exception() if state.outcome is not None else None
        if exc is not None:
            last[:] = [exc]
        if log is not None:
            log.warning("%s failed, retrying in %.1f s: %s", what,
                        state.next_action.sleep if state.next_action else 0.0, exc,
                        extra={"attempt": state.attempt_number})

    kw: dict[str, Any] = {
        "stop": stops,
        "wait": wait_exponential_jitter(multiplier=first_s, max=max_s, jitter=first_s / 2),
        "retry": retry_if_exception(_predicate(retry_on)),
        "before_sleep": before_sleep,
        "reraise": True,
    }
    if stop is not None:
        def sleep(seconds: float) -> None:
            # a shutdown during the wait: no further attempt, the last error is the caller's
            if stop.wait(seconds) and last:
                raise last[0]
        kw["sleep"] = sleep
    return kw


def retrying(*, retry_on: RetryOn, what: str, attempts: int | None = 5, deadline_s: float | None = None,
             first_s: float = 0.2, max_s: float = 5.0, stop: threading.Event | None = None,
             log: logging.Logger | None = None) -> Retrying:
    """A blocking retry loop: up to `attempts` tries (None = no limit) and/or no try started later than
    `deadline_s` seconds after the first, waits growing from `first_s` to `max_s` (0 = none); only
    exceptions matching `retry_on` are retried, the last one is re-raised. A set `stop` ends a wait at once and re-raises the last error without another attempt."""
    return Retrying(**_common(attempts=attempts, deadline_s=deadline_s, first_s=first_s, max_s=max_s,
                              retry_on=retry_on, stop=stop, log=log, what=what))


def call(op: Callable[[], T], **kw: Any) -> T:
    """`op()` under `retrying(**kw)`."""
    return retrying(**kw)(op)


def retrying_async(*, retry_on: RetryOn, what: str, attempts: int | None = 5, deadline_s: float | None = None,
                   first_s: float = 0.2, max_s: float = 5.0, log: logging.Logger | None = None) -> AsyncRetrying:
    """`retrying` for asyncio code: waits are `asyncio.sleep` (a cancelled task stops retrying at once)."""
    return AsyncRetrying(**_common(attempts=attempts, deadline_s=deadline_s, first_s=first_s, max_s=max_s,
                                   retry_on=retry_on, stop=None, log=log, what=what))


class Backoff:
    """The retry delays alone, for a loop that schedules its next try instead of sleeping.

    `next()` returns the delay before the next try (growing from `first_s` to `max_s`, with jitter),
    `reset()` after a success. `jitter=False` gives the plain doubling schedule (tests, supervisors whose
    restarts an operator reads in the log)."""

    def __init__(self, first_s: float = 0.5, max_s: float = 30.0, *, jitter: bool = True) -> None:
        self._wait = wait_exponential_jitter(multiplier=first_s, max=max_s, jitter=first_s / 2 if jitter else 0.0)
        self._state = RetryCallState(retry_object=Retrying(), fn=None, args=(), kwargs={})
        self.failures = 0

    def next(self) -> float:
        self.failures += 1
        self._state.attempt_number = self.failures
        return float(self._wait(self._state))

    def reset(self) -> None:
        self.failures = 0
