"""At most one pass per key per interval, counting what was held back: how the Kafka clients' log lines
(shared/kafka/client_logs.py) and authorization refusals (shared/kafka/authorization.py) stay a few clear
lines when the same thing happens on every poll."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

INTERVAL_S = 30.0


class RateLimiter:
    """At most one pass per key per `interval_s`; counts what it held back meanwhile."""

    def __init__(self, interval_s: float = INTERVAL_S, clock: Callable[[], float] = time.monotonic) -> None:
        self.interval_s = interval_s
        self.clock = clock
        self._last: dict[str, float] = {}
        self._held: dict[str, int] = {}
        self._lock = threading.Lock()

    def allow(self, key: str) -> int | None:
        """None when `key` passed less than `interval_s` ago; else the number of calls held back since."""
        now = self.clock()
        with self._lock:
            last = self._last.get(key)
            if last is not None and now - last < self.interval_s:
                self._held[key] = self._held.get(key, 0) + 1
                return None
            self._last[key] = now
            return self._held.pop(key, 0)
