"""`wait_for`: the suite's one way to wait for something to happen (never a fixed sleep).

A fixed budget is either too short on a loaded machine or far too long when something is stuck. So a
wait may follow progress instead: `progress()` returns anything comparable (records consumed, a log
file's size, offsets, a count of answers); each time its value changes the deadline moves `stall_s`
seconds further, and the wait fails only after `stall_s` seconds *without progress*. Without `progress`
the wait is a plain timeout of `stall_s` seconds. Either way the failure says what was awaited, for how
long, the last progress and the last value the condition returned.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Literal, TypeVar

T = TypeVar("T")

_SHOWN = 400


def _short(value: object) -> str:
    text = repr(value)
    return text if len(text) <= _SHOWN else text[:_SHOWN] + "..."


def wait_for(cond: Callable[[], T | Literal[False] | None], *, what: str, stall_s: float = 60.0,
             progress: Callable[[], object] | None = None, every: float = 0.05,
             ignore: tuple[type[BaseException], ...] = (), detail: Callable[[], str] | None = None,
             max_s: float | None = None) -> T:
    """Poll `cond` every `every` seconds until it returns something truthy, and return that.

    `progress`: while its value keeps changing the wait goes on; it fails after `stall_s` seconds in
    which neither the condition held nor the progress value changed. `ignore`: exceptions `cond` may
    raise while the awaited thing is not ready yet (a page still loading); any other exception, an
    AssertionError included, ends the wait at once (a probe that sees a crashed process raises).
    `detail`: text appended to the failure (a log's tail). `max_s`: a ceiling on the whole wait even
    while progress goes on (a process that keeps logging without ever getting there)."""
    start = time.monotonic()
    deadline = start + stall_s
    seen = progress() if progress is not None else None
    last: object = None
    while True:
        try:
            value = cond()
        except ignore as e:
            last = e
        else:
            if value:
                return value
            last = value
        now = time.monotonic()
        if progress is not None:
            current = progress()
            if current != seen:
                seen, deadline = current, now + stall_s
        if max_s is not None:
            deadline = min(deadline, start + max_s)
        if now >= deadline:
            break
        time.sleep(min(every, max(0.0, deadline - now)))
    waited = time.monotonic() - start
    if max_s is not None and waited >= max_s and progress is not None:
        how = f"not reached in {max_s:.0f}s although it kept making progress (last progress {_short(seen)})"
    else:
        how = (f"no progress for {stall_s:.0f}s (waited {waited:.0f}s in all; progress stopped at {_short(seen)})"
               if progress is not None else f"timed out after {stall_s:.0f}s")
    extra = f"\n{detail()}" if detail is not None else ""
    raise AssertionError(f"waiting for {what}: {how}; last: {_short(last)}{extra}")
